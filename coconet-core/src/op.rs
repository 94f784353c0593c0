//! The operations of the language and their scalar semantics.
//!
//! The `eval` functions here are the single definition of what each pointwise operation
//! computes (in f64); the reference interpreter and the macro's constant folding both use
//! them.

use std::fmt;

/// Reduction operator of a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Sum divided by the number of ranks in the group.
    Avg,
}

impl ReduceOp {
    /// All reduce ops.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
    ];

    /// Spelling in the DSL (`Sum`, `Prod`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "Sum",
            ReduceOp::Prod => "Prod",
            ReduceOp::Max => "Max",
            ReduceOp::Min => "Min",
            ReduceOp::Avg => "Avg",
        }
    }

    /// Parses [`ReduceOp::name`].
    pub fn from_name(s: &str) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|o| o.name() == s)
    }

    /// Combines two partial values (Avg combines as Sum; [`ReduceOp::finish`] divides).
    pub fn combine(self, a: f64, b: f64) -> f64 {
        match self {
            ReduceOp::Sum | ReduceOp::Avg => a + b,
            ReduceOp::Prod => a * b,
            ReduceOp::Max => a.max(b),
            ReduceOp::Min => a.min(b),
        }
    }

    /// Final step after combining the values of `ranks` ranks.
    pub fn finish(self, acc: f64, ranks: usize) -> f64 {
        match self {
            ReduceOp::Avg => acc / ranks as f64,
            _ => acc,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Elementwise unary operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// Square root.
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Hyperbolic tangent.
    Tanh,
    /// `max(x, 0)`.
    Relu,
    /// GELU, tanh approximation (as in GPT-2/Megatron).
    Gelu,
}

impl UnaryOp {
    /// All unary ops.
    pub const ALL: [UnaryOp; 9] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Tanh,
        UnaryOp::Relu,
        UnaryOp::Gelu,
    ];

    /// Spelling in the DSL.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
        }
    }

    /// Parses [`UnaryOp::name`].
    pub fn from_name(s: &str) -> Option<UnaryOp> {
        UnaryOp::ALL.into_iter().find(|o| o.name() == s)
    }

    /// Whether the op is defined only on floating-point values.
    pub fn float_only(self) -> bool {
        !matches!(self, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu)
    }

    /// The exact value.
    pub fn eval(self, x: f64) -> f64 {
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Relu => x.max(0.0),
            UnaryOp::Gelu => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
        }
    }
}

/// Elementwise binary operation (arithmetic and comparisons).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (integers truncate).
    Div,
    /// `a ^ b`.
    Pow,
    /// Elementwise minimum.
    Min,
    /// Elementwise maximum.
    Max,
    /// `a < b` (bool result).
    Lt,
    /// `a <= b` (bool result).
    Le,
    /// `a > b` (bool result).
    Gt,
    /// `a >= b` (bool result).
    Ge,
    /// `a == b` (bool result).
    Eq,
    /// `a != b` (bool result).
    Ne,
}

impl BinaryOp {
    /// Spelling in printed programs.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Min => "min",
            BinaryOp::Max => "max",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
        }
    }

    /// Comparisons produce `bool` masks.
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge | BinaryOp::Eq | BinaryOp::Ne
        )
    }

    /// The exact value; `int` selects integer division (truncation). Integer division by
    /// zero yields 0 after rounding (documented in the interpreter).
    pub fn eval(self, a: f64, b: f64, int: bool) -> f64 {
        let t = |c: bool| if c { 1.0 } else { 0.0 };
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div if int => (a / b).trunc(),
            BinaryOp::Div => a / b,
            BinaryOp::Pow => a.powf(b),
            BinaryOp::Min => a.min(b),
            BinaryOp::Max => a.max(b),
            BinaryOp::Lt => t(a < b),
            BinaryOp::Le => t(a <= b),
            BinaryOp::Gt => t(a > b),
            BinaryOp::Ge => t(a >= b),
            BinaryOp::Eq => t(a == b),
            BinaryOp::Ne => t(a != b),
        }
    }
}

/// Full reduction of a tensor to a scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    /// Sum of all elements.
    Sum,
    /// Largest element.
    Max,
    /// Smallest element.
    Min,
    /// Euclidean norm `sqrt(Σ x²)`.
    Norm2,
}

impl ReduceKind {
    /// Spelling in the DSL.
    pub fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "reduce_sum",
            ReduceKind::Max => "reduce_max",
            ReduceKind::Min => "reduce_min",
            ReduceKind::Norm2 => "norm2",
        }
    }

    /// Parses [`ReduceKind::name`].
    pub fn from_name(s: &str) -> Option<ReduceKind> {
        [
            ReduceKind::Sum,
            ReduceKind::Max,
            ReduceKind::Min,
            ReduceKind::Norm2,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }

    /// Reduces a list of exact values in the reference order (see [`ReduceAcc`]).
    pub fn eval(self, xs: &[f64]) -> f64 {
        let mut acc = ReduceAcc::new(self);
        acc.fold(0, xs);
        acc.finish()
    }
}

/// Lanes of a full sum or norm: element i is folded into lane i mod `REDUCE_LANES`, in
/// index order.
pub const REDUCE_LANES: usize = 8;

/// A full reduction in progress, in the reference order every backend follows (so full
/// reductions are bitwise equal everywhere): sums and norms fold element i into lane
/// i mod [`REDUCE_LANES`], each lane in index order from -0 (the identity of f64
/// addition), and combine the lanes as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7));
/// max and min fold in index order (they are exact, so order does not matter). Eight
/// independent lanes let a CPU use SIMD and a GPU eight threads, where one sequential
/// sum would wait on every addition.
#[derive(Debug, Clone)]
pub struct ReduceAcc {
    kind: ReduceKind,
    lanes: [f64; REDUCE_LANES],
}

impl ReduceAcc {
    /// An empty reduction (empty sums and norms are -0, max -∞, min +∞).
    pub fn new(kind: ReduceKind) -> ReduceAcc {
        let start = match kind {
            ReduceKind::Sum | ReduceKind::Norm2 => -0.0,
            ReduceKind::Max => f64::NEG_INFINITY,
            ReduceKind::Min => f64::INFINITY,
        };
        ReduceAcc {
            kind,
            lanes: [start; REDUCE_LANES],
        }
    }

    /// Folds `xs`, the elements with indices `first..first + xs.len()`, in (chunks may
    /// come one after the other, in index order).
    pub fn fold(&mut self, first: usize, xs: &[f64]) {
        match self.kind {
            ReduceKind::Sum => self.fold_lanes(first, xs, |x| x),
            ReduceKind::Norm2 => self.fold_lanes(first, xs, |x| x * x),
            ReduceKind::Max => self.lanes[0] = xs.iter().fold(self.lanes[0], |a, &x| a.max(x)),
            ReduceKind::Min => self.lanes[0] = xs.iter().fold(self.lanes[0], |a, &x| a.min(x)),
        }
    }

    #[inline(always)]
    fn fold_lanes(&mut self, first: usize, xs: &[f64], f: impl Fn(f64) -> f64) {
        const L: usize = REDUCE_LANES;
        // Up to the next multiple of L element by element, then whole rows of L lanes.
        let head = ((L - first % L) % L).min(xs.len());
        for (j, &x) in xs[..head].iter().enumerate() {
            self.lanes[(first + j) % L] += f(x);
        }
        let mut lanes = self.lanes;
        let rows = xs[head..].chunks_exact(L);
        let tail = rows.remainder();
        for row in rows {
            for l in 0..L {
                lanes[l] += f(row[l]);
            }
        }
        self.lanes = lanes;
        for (l, &x) in tail.iter().enumerate() {
            self.lanes[l] += f(x);
        }
    }

    /// The result.
    pub fn finish(&self) -> f64 {
        let l = &self.lanes;
        match self.kind {
            ReduceKind::Sum => ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])),
            ReduceKind::Norm2 => {
                (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))).sqrt()
            }
            ReduceKind::Max | ReduceKind::Min => l[0],
        }
    }
}

/// Direction of a point-to-point transfer between pipeline groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From group g to group g + 1 (activations going forward).
    Next,
    /// From group g to group g - 1 (gradients going backward).
    Prev,
}

impl Direction {
    /// Spelling in the DSL.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Next => "Next",
            Direction::Prev => "Prev",
        }
    }
}

/// Layer normalisation of one row: `(x - mean) / sqrt(var + eps) * gamma + beta`, with
/// the biased variance. `gamma` and `beta` are indexed like `row` (the single definition
/// shared by the interpreter and the backends).
pub fn layer_norm_row(row: &[f64], gamma: &[f64], beta: &[f64], eps: f64, out: &mut [f64]) {
    let h = row.len() as f64;
    let mean = row.iter().sum::<f64>() / h;
    let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / h;
    let inv = 1.0 / (var + eps).sqrt();
    for (i, (o, v)) in out.iter_mut().zip(row).enumerate() {
        *o = (v - mean) * inv * gamma[i] + beta[i];
    }
}

#[cfg(test)]
mod reduce_order_tests {
    use super::*;

    /// The reference order, written out: lanes by index mod 8, then the fixed tree; any
    /// split into chunks folds to the same bits; empty reductions.
    #[test]
    fn full_reductions_follow_the_lane_order_in_any_chunking() {
        let xs: Vec<f64> = (0..1003)
            .map(|i| ((i * 37 % 101) as f64 - 50.0) / 7.0 * 1.0001f64.powi(i))
            .collect();
        let mut lanes = [-0.0f64; 8];
        for (i, x) in xs.iter().enumerate() {
            lanes[i % 8] += x;
        }
        let l = lanes;
        let want = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
        assert_eq!(ReduceKind::Sum.eval(&xs).to_bits(), want.to_bits());
        for kind in [
            ReduceKind::Sum,
            ReduceKind::Norm2,
            ReduceKind::Max,
            ReduceKind::Min,
        ] {
            let whole = kind.eval(&xs);
            for cuts in [vec![1, 2, 3], vec![7, 500], vec![8, 16, 1000], vec![999]] {
                let mut acc = ReduceAcc::new(kind);
                let mut at = 0;
                for c in cuts.into_iter().chain([xs.len()]) {
                    acc.fold(at, &xs[at..c]);
                    at = c;
                }
                assert_eq!(acc.finish().to_bits(), whole.to_bits(), "{kind:?}");
            }
        }
        let exact: f64 = xs.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((ReduceKind::Norm2.eval(&xs) - exact).abs() <= 1e-12 * exact);
        assert_eq!(ReduceKind::Sum.eval(&[]).to_bits(), (-0.0f64).to_bits());
        assert_eq!(ReduceKind::Norm2.eval(&[]).to_bits(), (-0.0f64).to_bits());
        assert_eq!(ReduceKind::Max.eval(&[]), f64::NEG_INFINITY);
        assert_eq!(ReduceKind::Min.eval(&[]), f64::INFINITY);
    }
}
