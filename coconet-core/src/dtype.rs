//! Element types of tensors and scalars, and rounding to them.
//!
//! The reference interpreter computes in `f64` and rounds every node's value to the node's
//! declared dtype ([`DType::round`]); that rounding is what makes fused and unfused
//! schedules agree bit for bit.

use std::fmt;

/// The element type of a tensor or scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE half precision (`half::f16`); computed in f32 by backends.
    F16,
    /// bfloat16 (`half::bf16`); computed in f32 by backends.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// 32-bit signed integer (wrapping, division truncates).
    I32,
    /// 64-bit signed integer. The interpreter holds values in f64, so it is exact for
    /// magnitudes up to 2^53.
    I64,
    /// Boolean mask (results of comparisons), stored as 0 or 1.
    Bool,
}

impl DType {
    /// All dtypes, in declaration order.
    pub const ALL: [DType; 7] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];

    /// The spelling used in `#[coconet]` signatures and printed programs (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    /// Parses the spelling returned by [`DType::name`].
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes per element when stored.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::Bool => 1,
        }
    }

    /// Floating-point types (the ones `sqrt`, `exp`, `layer_norm`, ... accept).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// Integer types.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// Types with arithmetic (everything but `bool`).
    pub fn is_numeric(self) -> bool {
        self != DType::Bool
    }

    /// Rounds an exact (f64) value to this dtype, returned as f64.
    ///
    /// Integers truncate toward zero and wrap (non-finite values become 0); booleans are
    /// `x != 0`.
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::F64 => x,
            DType::F32 => x as f32 as f64,
            DType::F16 => half::f16::from_f64(x).to_f64(),
            DType::BF16 => half::bf16::from_f64(x).to_f64(),
            DType::I32 => {
                if x.is_finite() {
                    (x.trunc() as i64) as i32 as f64
                } else {
                    0.0
                }
            }
            DType::I64 => {
                if x.is_finite() {
                    x.trunc() as i64 as f64
                } else {
                    0.0
                }
            }
            DType::Bool => {
                if x != 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust element type that can be bound to (or read from) a tensor of a given [`DType`].
///
/// Implemented for `f32`, `f64`, `half::f16`, `half::bf16`, `i32`, `i64` and `bool`.
pub trait Element: Copy + Send + Sync + 'static {
    /// The dtype this Rust type represents.
    const DTYPE: DType;
    /// Exact conversion to f64 (i64 beyond 2^53 rounds).
    fn to_f64(self) -> f64;
    /// Conversion from an f64 that was already rounded to [`Element::DTYPE`].
    fn from_f64(x: f64) -> Self;
}

macro_rules! float_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(x: f64) -> Self {
                x as $t
            }
        }
    };
}
float_element!(f32, DType::F32);
float_element!(f64, DType::F64);
float_element!(i32, DType::I32);
float_element!(i64, DType::I64);

impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        half::f16::to_f64(self)
    }
    fn from_f64(x: f64) -> Self {
        half::f16::from_f64(x)
    }
}

impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f64(self) -> f64 {
        half::bf16::to_f64(self)
    }
    fn from_f64(x: f64) -> Self {
        half::bf16::from_f64(x)
    }
}

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        if self { 1.0 } else { 0.0 }
    }
    fn from_f64(x: f64) -> Self {
        x != 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_name("u8"), None);
    }

    #[test]
    fn rounding_matches_the_storage_types() {
        let x = 0.1f64;
        assert_eq!(DType::F32.round(x), 0.1f32 as f64);
        assert_eq!(DType::F16.round(x), 0.0999755859375);
        assert_eq!(DType::BF16.round(x), half::bf16::from_f64(0.1).to_f64());
        assert_eq!(DType::I32.round(-2.7), -2.0);
        assert_eq!(DType::I32.round(2147483648.0), -2147483648.0);
        assert_eq!(DType::I64.round(f64::NAN), 0.0);
        assert_eq!(DType::Bool.round(-3.0), 1.0);
        assert_eq!(DType::F64.round(x), x);
    }
}
