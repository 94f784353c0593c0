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

    /// Reduces a list of exact values in index order (empty: -0 for sums and norms, ∓∞
    /// for max/min): `finish` of the fold of `step` from `start`.
    pub fn eval(self, xs: &[f64]) -> f64 {
        self.finish(xs.iter().fold(self.start(), |a, &x| self.step(a, x)))
    }

    /// The accumulator before any element. With [`ReduceKind::step`] and
    /// [`ReduceKind::finish`] it lets a runtime reduce chunk by chunk and agree with
    /// [`ReduceKind::eval`] bit for bit.
    pub fn start(self) -> f64 {
        match self {
            // -0 is the identity of f64 addition (Rust's `Sum` starts there too).
            ReduceKind::Sum | ReduceKind::Norm2 => -0.0,
            ReduceKind::Max => f64::NEG_INFINITY,
            ReduceKind::Min => f64::INFINITY,
        }
    }

    /// Folds one more element into the accumulator.
    #[inline]
    pub fn step(self, acc: f64, x: f64) -> f64 {
        match self {
            ReduceKind::Sum => acc + x,
            ReduceKind::Norm2 => acc + x * x,
            ReduceKind::Max => acc.max(x),
            ReduceKind::Min => acc.min(x),
        }
    }

    /// The result from the accumulator.
    pub fn finish(self, acc: f64) -> f64 {
        match self {
            ReduceKind::Norm2 => acc.sqrt(),
            _ => acc,
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
