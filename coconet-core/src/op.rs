//! The operations of the language and their scalar semantics.
//!
//! The `eval` functions here are the single definition of what each pointwise operation
//! computes (in f64); the reference interpreter and the macro's constant folding both use
//! them.

use crate::numerics::{max_exact, min_exact};
use std::fmt;

/// Reduction operator of a collective. Ranks' elements are combined in rank order
/// (rank 0's with rank 1's, the result with rank 2's, ...) in f64 and rounded once to
/// the dtype, on every backend: results do not depend on timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum. NaN propagates (as torch's `all_reduce(MAX)`): the result is NaN where
    /// any rank's element is NaN — a NaN gradient is not hidden by the others.
    Max,
    /// Minimum. NaN propagates as for [`ReduceOp::Max`].
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
            ReduceOp::Max => max_exact(a, b),
            ReduceOp::Min => min_exact(a, b),
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
            UnaryOp::Exp => crate::math::exp(x),
            UnaryOp::Log => crate::math::ln(x),
            UnaryOp::Tanh => crate::math::tanh(x),
            UnaryOp::Relu => x.max(0.0),
            UnaryOp::Gelu => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + crate::math::tanh(c * (x + 0.044715 * x * x * x)))
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
    /// All binary ops.
    pub const ALL: [BinaryOp; 13] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Min,
        BinaryOp::Max,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::Eq,
        BinaryOp::Ne,
    ];

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
            BinaryOp::Pow => crate::math::pow(a, b),
            BinaryOp::Min => min_exact(a, b),
            BinaryOp::Max => max_exact(a, b),
            BinaryOp::Lt => t(a < b),
            BinaryOp::Le => t(a <= b),
            BinaryOp::Gt => t(a > b),
            BinaryOp::Ge => t(a >= b),
            BinaryOp::Eq => t(a == b),
            BinaryOp::Ne => t(a != b),
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
    /// Both directions.
    pub const ALL: [Direction; 2] = [Direction::Next, Direction::Prev];

    /// Parses [`Direction::name`].
    pub fn from_name(s: &str) -> Option<Direction> {
        Direction::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Spelling in the DSL.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Next => "Next",
            Direction::Prev => "Prev",
        }
    }
}
