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
            DType::F16 | DType::BF16 => self.round_f32(round_to_odd_f32(x)) as f64,
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

impl DType {
    /// Rounds an f32 value to this dtype (f16, bf16 or f32), returned as f32: the fast
    /// path of [`DType::round`] for values that are already f32 (hardware conversions).
    #[inline]
    pub fn round_f32(self, x: f32) -> f32 {
        match self {
            DType::F16 => half::f16::from_f32(x).to_f32(),
            DType::BF16 => half::bf16::from_f32(x).to_f32(),
            DType::F32 => x,
            d => d.round(x as f64) as f32,
        }
    }
}

impl DType {
    /// Rounds every value (exact, as f64) to this dtype in place: [`DType::round`] on a
    /// slice, with f16/bf16 going through f32 by round-to-odd and the hardware slice
    /// conversions (F16C when present), many times faster than element by element.
    pub fn round_slice(self, xs: &mut [f64]) {
        match self {
            DType::F64 => {}
            DType::F32 => xs.iter_mut().for_each(|x| *x = *x as f32 as f64),
            DType::F16 | DType::BF16 => {
                let mut f = [0f32; 256];
                for chunk in xs.chunks_mut(256) {
                    let f = &mut f[..chunk.len()];
                    f.iter_mut()
                        .zip(&*chunk)
                        .for_each(|(f, x)| *f = round_to_odd_f32(*x));
                    self.round_f32_slice(f);
                    chunk.iter_mut().zip(&*f).for_each(|(x, f)| *x = *f as f64);
                }
            }
            d => xs.iter_mut().for_each(|x| *x = d.round(*x)),
        }
    }

    /// Rounds f32 values to this dtype (f16, bf16 or f32) in place, by slice
    /// conversions.
    pub fn round_f32_slice(self, xs: &mut [f32]) {
        match self {
            DType::F32 => {}
            DType::F16 => round_through::<half::f16>(xs),
            DType::BF16 => round_through::<half::bf16>(xs),
            d => xs.iter_mut().for_each(|x| *x = d.round_f32(*x)),
        }
    }
}

/// Rounds f32 values to the half type `H` and back, in place, 256 at a time.
fn round_through<H: Copy + Default>(xs: &mut [f32])
where
    [H]: half::slice::HalfFloatSliceExt,
{
    use half::slice::HalfFloatSliceExt;
    let mut h = [H::default(); 256];
    for chunk in xs.chunks_mut(256) {
        let h = &mut h[..chunk.len()];
        h.convert_from_f32_slice(chunk);
        h.convert_to_f32_slice(chunk);
    }
}

/// `x` rounded to f32 by round-to-odd (truncate, then set the last bit if inexact). A
/// value rounded to odd on p ≥ q + 2 bits and then to nearest on q bits equals `x`
/// rounded to nearest on q bits, so f64 → f16/bf16 can go through f32 and its hardware
/// conversions while staying correctly rounded. NaN and overflow go straight through
/// (f16 and bf16 overflow at or before f32 does).
#[inline]
fn round_to_odd_f32(x: f64) -> f32 {
    let f = x as f32;
    let back = f as f64;
    if back == x || x.is_nan() || f.is_infinite() {
        return f;
    }
    let mut bits = f.to_bits();
    if back.abs() > x.abs() {
        bits -= 1; // one step toward zero: the truncation of x
    }
    f32::from_bits(bits | 1)
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust element type that can be bound to (or read from) a tensor of a given [`DType`].
///
/// Implemented for `f32`, `f64`, `half::f16`, `half::bf16`, `i32`, `i64` and `bool`.
pub trait Element: Copy + Send + Sync + 'static + crate::host_data::HostElement {
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

    /// Narrow rounding is correct rounding (nearest, ties to even), checked as a
    /// property: the result is a value of the dtype, no neighbour of it is nearer to x,
    /// and a tie goes to the even one. (half's own f64 conversions ignore the low 32
    /// bits of the double and so misround some near-ties: bf16 of
    /// -3.452994922415907e25 gives -3.4454e25 instead of -3.4606e25.)
    #[test]
    fn narrow_rounding_is_correct_rounding() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut xs: Vec<f64> = (0..200_000).map(|_| f64::from_bits(next())).collect();
        // Magnitudes where f16/bf16 live (subnormals included), random low bits.
        xs.extend((0..200_000).map(|_| {
            let e = (next() % 180) as i32 - 140;
            let m = 1.0 + (next() >> 11) as f64 / (1u64 << 53) as f64;
            m * 2f64.powi(e) * if next() & 1 == 0 { 1.0 } else { -1.0 }
        }));
        // Exact ties of f16 and bf16 (halfway between neighbours), and one f64 ulp off.
        let f16_at = |b: u16| half::f16::from_bits(b).to_f64();
        let bf16_at = |b: u16| half::bf16::from_bits(b).to_f64();
        for bits in (0..0x7bffu16).step_by(3) {
            for (lo, hi) in [
                (f16_at(bits), f16_at(bits + 1)),
                (bf16_at(bits), bf16_at(bits + 1)),
            ] {
                let mid = (lo + hi) / 2.0;
                xs.extend([mid, mid.next_up(), mid.next_down(), -mid]);
            }
        }
        for d in [DType::F16, DType::BF16] {
            type Conv = (fn(f64) -> u16, fn(u16) -> f64);
            let (to_bits, from_bits): Conv = match d {
                DType::F16 => (|x| half::f16::from_f64(x).to_bits(), f16_at),
                _ => (|x| half::bf16::from_f64(x).to_bits(), bf16_at),
            };
            for &x in &xs {
                let r = d.round(x);
                if x.is_nan() {
                    assert!(r.is_nan());
                    continue;
                }
                assert_eq!(d.round(r), r, "{d:?}: {x:e} -> {r:e} is not a {d:?} value");
                if r.is_infinite() {
                    let max = from_bits(to_bits(f64::MAX) - 1);
                    let ulp = max - from_bits(to_bits(f64::MAX) - 2);
                    assert!(x.abs() >= max + ulp / 2.0, "{d:?}: {x:e} overflowed");
                    continue;
                }
                let b = to_bits(r);
                let dist = (x - r).abs();
                for nb in [b.wrapping_add(1), b.wrapping_sub(1), b ^ 0x8000] {
                    let n = from_bits(nb);
                    if n.is_finite() && (n - r).abs() > 0.0 {
                        let other = (x - n).abs();
                        assert!(
                            dist < other || (dist == other && b & 1 == 0),
                            "{d:?}: {x:e} ({:#x}) -> {r:e}, but {n:e} is as near or nearer",
                            x.to_bits()
                        );
                    }
                }
            }
        }
    }

    /// The slice roundings equal the scalar ones.
    #[test]
    fn slice_rounding_equals_scalar_rounding() {
        let xs: Vec<f64> = (0..3000)
            .map(|i| ((i as f64) * 0.7310585786).sin() * 10f64.powi(i % 60 - 30))
            .chain([f64::NAN, f64::INFINITY, -0.0, 1e300])
            .collect();
        for d in DType::ALL {
            let mut got = xs.clone();
            d.round_slice(&mut got);
            for (g, x) in got.iter().zip(&xs) {
                let want = d.round(*x);
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "{d:?} {x:e}"
                );
            }
            if matches!(d, DType::F16 | DType::BF16 | DType::F32) {
                let mut f: Vec<f32> = xs.iter().map(|&x| x as f32).collect();
                let want: Vec<f32> = f.iter().map(|&x| d.round_f32(x)).collect();
                d.round_f32_slice(&mut f);
                for (g, w) in f.iter().zip(&want) {
                    assert!(
                        g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                        "{d:?} {w:e}"
                    );
                }
            }
        }
    }

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
