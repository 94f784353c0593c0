//! Views of a rank's data as strided arrays, and how a kernel operand maps onto the
//! kernel's iteration space (same shape, broadcast, or an implicitly sliced Replicated
//! operand).

use coconet_plan::host::memory::Raw;

pub(crate) use coconet_plan::plan::dense_strides as strides;
use coconet_plan::plan::{Access, View};

/// A plan's view of a buffer, over this rank's memory.
#[derive(Debug, Clone)]
pub struct Array {
    pub raw: Raw,
    pub view: View,
}

impl Array {
    /// Every element, in row-major order.
    pub fn read(&self) -> Vec<f64> {
        let n: usize = self.view.shape.iter().product();
        let mut out = vec![0.0; n];
        if self.is_contiguous() {
            self.raw.load(self.view.base, &mut out);
        } else {
            let map = Mapping::onto(self, &self.view.shape);
            map.load(0, &mut out);
        }
        out
    }

    /// Every element as f32, where the array is a contiguous view of an f32, f16 or
    /// bf16 buffer (`dtype`, its values' dtype) — no round trip through f64.
    pub fn read_f32(&self, dtype: coconet_core::DType) -> Option<Vec<f32>> {
        use coconet_core::DType;
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) || !self.is_contiguous() {
            return None;
        }
        let n: usize = self.view.shape.iter().product();
        let mut out = vec![0f32; n];
        self.raw.load_f32(self.view.base, &mut out);
        Some(out)
    }

    fn is_contiguous(&self) -> bool {
        let s = strides(&self.view.shape);
        self.view
            .shape
            .iter()
            .zip(self.view.strides.iter().zip(&s))
            .all(|(&d, (a, b))| d <= 1 || a == b)
    }
}

/// How to fetch an operand's elements for positions of an iteration space.
#[derive(Debug, Clone)]
pub enum Mapping {
    /// The same value everywhere.
    Splat(f64),
    /// Position i is element `base + i`.
    Contiguous { raw: Raw, base: usize },
    /// Position i is `data[i % data.len()]`.
    Cyclic(Vec<f64>),
    /// Position i (a multi-index in `shape`) is `base + Σ idx·stride`.
    Strided {
        raw: Raw,
        base: usize,
        shape: Vec<usize>,
        strides: Vec<usize>,
    },
}

impl Mapping {
    /// Maps `a` onto an iteration space of shape `out` (numpy broadcasting, trailing
    /// dims aligned).
    pub fn onto(a: &Array, out: &[usize]) -> Mapping {
        match a.view.access(out) {
            Access::Splat { base } => Mapping::Splat(a.raw.get(base)),
            Access::Contiguous { base } => Mapping::Contiguous { raw: a.raw, base },
            Access::Cyclic { base, period } => {
                let mut data = vec![0.0; period];
                a.raw.load(base, &mut data);
                Mapping::Cyclic(data)
            }
            Access::Strided {
                base,
                shape,
                strides,
            } => Mapping::Strided {
                raw: a.raw,
                base,
                shape,
                strides,
            },
        }
    }

    /// Loads positions `start..start + out.len()` of an operand whose dtype is f32, f16
    /// or bf16 (so every value is an f32).
    #[inline]
    pub fn load_f32(&self, start: usize, out: &mut [f32]) {
        match self {
            Mapping::Splat(x) => out.fill(*x as f32),
            Mapping::Contiguous { raw, base } => raw.load_f32(base + start, out),
            Mapping::Cyclic(data) => cyclic(data, start, out, |o, x| *o = *x as f32),
            _ => {
                let mut wide = vec![0.0; out.len()];
                self.load(start, &mut wide);
                out.iter_mut().zip(wide).for_each(|(o, x)| *o = x as f32);
            }
        }
    }

    /// Loads positions `start..start + out.len()`.
    #[inline]
    pub fn load(&self, start: usize, out: &mut [f64]) {
        match self {
            Mapping::Splat(x) => out.fill(*x),
            Mapping::Contiguous { raw, base } => raw.load(base + start, out),
            Mapping::Cyclic(data) => cyclic(data, start, out, |o, x| *o = *x),
            Mapping::Strided {
                raw,
                base,
                shape,
                strides,
            } => {
                let dense = self::strides(shape);
                for (j, o) in out.iter_mut().enumerate() {
                    *o = raw.get(coconet_plan::plan::strided_offset(
                        *base,
                        &dense,
                        strides,
                        start + j,
                    ));
                }
            }
        }
    }
}

/// Positions `start..start + out.len()` of `data` repeated: whole runs of the period at
/// a time (no division per element), each element set by `put`.
#[inline(always)]
fn cyclic<T>(data: &[f64], start: usize, out: &mut [T], put: impl Fn(&mut T, &f64)) {
    if out.is_empty() {
        return;
    }
    let mut at = start % data.len();
    let mut rest = out;
    while !rest.is_empty() {
        let run = (data.len() - at).min(rest.len());
        let (head, tail) = rest.split_at_mut(run);
        head.iter_mut()
            .zip(&data[at..at + run])
            .for_each(|(o, x)| put(o, x));
        rest = tail;
        at = 0;
    }
}
