//! Views of a rank's data as strided arrays, and how a kernel operand maps onto the
//! kernel's iteration space (same shape, broadcast, or an implicitly sliced Replicated
//! operand).

use super::memory::Raw;

/// Row-major strides of a shape.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

/// A strided view of a buffer.
#[derive(Debug, Clone)]
pub struct Array {
    pub raw: Raw,
    pub base: usize,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
}

impl Array {
    /// The whole buffer as an array of `shape`.
    pub fn whole(raw: Raw, shape: Vec<usize>) -> Array {
        let strides = strides(&shape);
        Array {
            raw,
            base: 0,
            shape,
            strides,
        }
    }

    /// Rows `start..start + len` along `dim`.
    pub fn block(mut self, dim: usize, start: usize, len: usize) -> Array {
        self.base += start * self.strides[dim];
        self.shape[dim] = len;
        self
    }

    /// Every element, in row-major order.
    pub fn read(&self) -> Vec<f64> {
        let n: usize = self.shape.iter().product();
        let mut out = vec![0.0; n];
        if self.is_contiguous() {
            self.raw.load(self.base, &mut out);
        } else {
            let map = Mapping::onto(self, &self.shape);
            map.load(0, &mut out);
        }
        out
    }

    fn is_contiguous(&self) -> bool {
        let s = strides(&self.shape);
        self.shape
            .iter()
            .zip(self.strides.iter().zip(&s))
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
        let rr = out.len();
        let ro = a.shape.len();
        let mut st = vec![0usize; rr];
        for k in 0..rr {
            if let Some(ok) = (k + ro).checked_sub(rr)
                && !(a.shape[ok] == 1 && out[k] != 1)
            {
                st[k] = a.strides[ok];
            }
        }
        let dense = strides(out);
        if st.iter().zip(out).all(|(&s, &d)| s == 0 || d <= 1) && out.iter().product::<usize>() > 0
        {
            return Mapping::Splat(a.raw.get(a.base));
        }
        if st
            .iter()
            .zip(dense.iter().zip(out))
            .all(|(a, (b, &d))| d <= 1 || a == b)
        {
            return Mapping::Contiguous {
                raw: a.raw,
                base: a.base,
            };
        }
        // Broadcast over leading dims of a contiguous trailing block (a bias [H] against
        // [B, S, H]): position i is element i mod |block|.
        let trailing_dense = |k: usize| {
            st[k..]
                .iter()
                .zip(&dense[k..])
                .zip(&out[k..])
                .all(|((a, b), &d)| d <= 1 || a == b)
        };
        if let Some(lead) = (0..=rr).find(|&k| trailing_dense(k))
            && st[..lead]
                .iter()
                .zip(&out[..lead])
                .all(|(&s, &d)| s == 0 || d <= 1)
        {
            let block: usize = out[lead..].iter().product();
            let mut data = vec![0.0; block];
            a.raw.load(a.base, &mut data);
            return Mapping::Cyclic(data);
        }
        Mapping::Strided {
            raw: a.raw,
            base: a.base,
            shape: out.to_vec(),
            strides: st,
        }
    }

    /// Loads positions `start..start + out.len()`.
    #[inline]
    pub fn load(&self, start: usize, out: &mut [f64]) {
        match self {
            Mapping::Splat(x) => out.fill(*x),
            Mapping::Contiguous { raw, base } => raw.load(base + start, out),
            Mapping::Cyclic(data) => {
                let n = data.len();
                for (j, o) in out.iter_mut().enumerate() {
                    *o = data[(start + j) % n];
                }
            }
            Mapping::Strided {
                raw,
                base,
                shape,
                strides,
            } => {
                let dense = self::strides(shape);
                for (j, o) in out.iter_mut().enumerate() {
                    let mut rem = start + j;
                    let mut off = *base;
                    for k in 0..shape.len() {
                        let idx = rem / dense[k];
                        rem %= dense[k];
                        off += idx * strides[k];
                    }
                    *o = raw.get(off);
                }
            }
        }
    }
}
