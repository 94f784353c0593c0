//! Where each rank's elements of a value are, independent of any backend's memory: which
//! buffer, at which offset, with which strides — and how a kernel operand's elements map
//! onto the kernel's iteration space. The CPU backend turns these into loads from its
//! buffers; the CUDA code generator turns them into index expressions and kernel
//! arguments, so both read exactly the same elements.

use super::lowered::{Plan, Storage};
use coconet_core::DType;
use coconet_core::{Dim, Layout, ValueId, block_range};

/// A buffer a rank holds: the caller's input or a runtime-allocated slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferRef {
    /// The caller's buffer of this tensor input.
    Input(ValueId),
    /// A runtime-allocated slot.
    Slot(usize),
}

/// A strided view of a buffer: element `idx` is at `base + Σ idx[k]·strides[k]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// The buffer.
    pub buffer: BufferRef,
    /// Offset of element 0, in elements.
    pub base: usize,
    /// Shape of the view.
    pub shape: Vec<usize>,
    /// Strides, in elements.
    pub strides: Vec<usize>,
}

/// How position `i` of an iteration space finds its element in a view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// The same element everywhere (at `base`).
    Splat {
        /// Offset of the element.
        base: usize,
    },
    /// Position i is element `base + i`.
    Contiguous {
        /// Offset of position 0.
        base: usize,
    },
    /// Position i is element `base + i % period` (a trailing block broadcast over
    /// leading dims, like a bias `[H]` against `[B, S, H]`).
    Cyclic {
        /// Offset of the block.
        base: usize,
        /// Elements in the block.
        period: usize,
    },
    /// Position i, as a multi-index of `shape`, is `base + Σ idx[k]·strides[k]`.
    Strided {
        /// Offset of position 0.
        base: usize,
        /// The iteration space.
        shape: Vec<usize>,
        /// Strides (0 on broadcast dims).
        strides: Vec<usize>,
    },
}

/// Row-major strides of a shape.
pub fn dense_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

/// The element offset of row-major position `i` of an array of shape `dense`-strided
/// positions laid out with `strides` from `base`.
#[inline]
pub fn strided_offset(base: usize, dense: &[usize], strides: &[usize], i: usize) -> usize {
    let mut off = base;
    let mut rem = i;
    for (d, s) in dense.iter().zip(strides) {
        off += rem / d * s;
        rem %= d;
    }
    off
}

impl View {
    /// The view's elements in row-major order, picked out of its whole buffer `all`.
    pub fn gather(&self, all: &[f64]) -> Vec<f64> {
        let dense = dense_strides(&self.shape);
        let n: usize = self.shape.iter().product();
        (0..n)
            .map(|i| all[strided_offset(self.base, &dense, &self.strides, i)])
            .collect()
    }

    /// The view's elements in row-major order as contiguous runs of its buffer,
    /// `(first element, length)`: one run for a whole buffer or a block of its first
    /// dim, one per outer index for a block of an inner dim. Reads copy run by run,
    /// in the buffer's own dtype.
    pub fn runs(&self) -> Vec<(usize, usize)> {
        let n: usize = self.shape.iter().product();
        if n == 0 {
            return Vec::new();
        }
        // The innermost dims stored densely make one run each time the outer ones move.
        let dense = dense_strides(&self.shape);
        let mut inner = self.shape.len();
        while inner > 0
            && (self.shape[inner - 1] == 1 || self.strides[inner - 1] == dense[inner - 1])
        {
            inner -= 1;
        }
        let run: usize = self.shape[inner..].iter().product();
        let mut out: Vec<(usize, usize)> = Vec::with_capacity(n / run);
        for i in (0..n).step_by(run) {
            let start = strided_offset(self.base, &dense, &self.strides, i);
            match out.last_mut() {
                Some(last) if last.0 + last.1 == start => last.1 += run,
                _ => out.push((start, run)),
            }
        }
        out
    }

    /// Rows `start..start + len` along `dim`.
    pub fn block(mut self, dim: usize, start: usize, len: usize) -> View {
        self.base += start * self.strides[dim];
        self.shape[dim] = len;
        self
    }

    /// How positions of an iteration space of shape `out` map onto this view (numpy
    /// broadcasting, trailing dims aligned).
    pub fn access(&self, out: &[usize]) -> Access {
        let rr = out.len();
        let ro = self.shape.len();
        let mut st = vec![0usize; rr];
        for k in 0..rr {
            if let Some(ok) = (k + ro).checked_sub(rr)
                && !(self.shape[ok] == 1 && out[k] != 1)
            {
                st[k] = self.strides[ok];
            }
        }
        let dense = dense_strides(out);
        let base = self.base;
        if st.iter().zip(out).all(|(&s, &d)| s == 0 || d <= 1) && out.iter().product::<usize>() > 0
        {
            return Access::Splat { base };
        }
        if st
            .iter()
            .zip(dense.iter().zip(out))
            .all(|(a, (b, &d))| d <= 1 || a == b)
        {
            return Access::Contiguous { base };
        }
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
            return Access::Cyclic {
                base,
                period: out[lead..].iter().product(),
            };
        }
        Access::Strided {
            base,
            shape: out.to_vec(),
            strides: st,
        }
    }
}

impl Plan {
    /// The element type of buffer `b` (the same on every rank).
    pub fn buffer_dtype(&self, b: BufferRef) -> DType {
        match b {
            BufferRef::Input(t) => self.program().node(t).ty.dtype,
            BufferRef::Slot(s) => self.slots()[s].dtype,
        }
    }

    /// The dtype and element count of rank `r`'s buffer `b`.
    pub fn buffer_extent(&self, b: BufferRef, r: usize) -> (DType, usize) {
        let n = match b {
            BufferRef::Input(t) => coconet_core::numerics::tensor::numel(&self.local_shape(t, r)),
            BufferRef::Slot(s) => self.slots()[s].elements[r],
        };
        (self.buffer_dtype(b), n)
    }

    /// The shape of `v`'s data on rank `r` (its block when Sliced).
    pub fn local_shape(&self, v: ValueId, r: usize) -> Vec<usize> {
        let mut s = self.shape(v).to_vec();
        if let Layout::Sliced(d) = self.program().node(v).ty.layout {
            s[d] = block_range(s[d], self.group_size, r % self.group_size).len();
        }
        s
    }

    /// The buffer behind `v`, if it has one of its own.
    pub fn buffer(&self, v: ValueId) -> Option<BufferRef> {
        match self.storage(v)? {
            Storage::Input(t) => Some(BufferRef::Input(t)),
            Storage::Slot(s) => Some(BufferRef::Slot(s)),
            _ => None,
        }
    }

    /// `v`'s data on rank `r` as a view (None for uniforms and registers).
    pub fn view(&self, v: ValueId, r: usize) -> Option<View> {
        match self.storage(v)? {
            Storage::Input(_) | Storage::Slot(_) => {
                let shape = self.local_shape(v, r);
                Some(View {
                    buffer: self.buffer(v)?,
                    base: 0,
                    strides: dense_strides(&shape),
                    shape,
                })
            }
            Storage::View { of, dim } => {
                let full = self.shape(of)[dim];
                let b = block_range(full, self.group_size, r % self.group_size);
                Some(self.view(of, r)?.block(dim, b.start, b.len()))
            }
            _ => None,
        }
    }

    /// The view of stage `m`'s operand `o` on rank `r`: a Replicated operand spanning
    /// the result's sliced dim is read in the rank's block.
    pub fn operand_view(&self, m: ValueId, o: ValueId, r: usize) -> Option<View> {
        let p = self.program();
        let mut a = self.view(o, r)?;
        let (mt, ot) = (&p.node(m).ty, &p.node(o).ty);
        if let (Layout::Sliced(rd), Layout::Replicated) = (mt.layout, ot.layout) {
            let (rr, ro) = (mt.shape.rank(), ot.shape.rank());
            if let Some(od) = (rd + ro).checked_sub(rr)
                && ot.shape.0[od] != Dim::Const(1)
            {
                let b = block_range(a.shape[od], self.group_size, r % self.group_size);
                a = a.block(od, b.start, b.len());
            }
        }
        Some(a)
    }

    /// Ranks per group.
    pub fn group_size(&self) -> usize {
        self.group_size
    }

    /// World ranks holding values placed like `v`.
    pub fn holders(&self, v: ValueId) -> std::ops::Range<usize> {
        let q = self.group_size;
        match self.program().node(v).ty.placement {
            coconet_core::Placement::Everywhere => 0..self.ranks,
            coconet_core::Placement::Group(g) => g * q..(g + 1) * q,
        }
    }
}

/// The origin of a value's local block in logical coordinates: (start along the sliced
/// dim, the dim, the logical shape) — what dropout's logical indices count from.
pub fn logical_origin(
    full: &[usize],
    layout: Layout,
    group_size: usize,
    rank_in_group: usize,
) -> (usize, usize, Vec<usize>) {
    match layout {
        Layout::Sliced(d) => (
            block_range(full[d], group_size, rank_in_group).start,
            d,
            full.to_vec(),
        ),
        _ => (0, 0, full.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs list a view's elements in row-major order, whatever block of whatever dim
    /// it is: checked against the element-by-element gather.
    #[test]
    fn runs_cover_a_view_in_order() {
        let full = [4usize, 3, 5];
        let all: Vec<f64> = (0..60).map(f64::from).collect();
        let whole = View {
            buffer: BufferRef::Slot(0),
            base: 0,
            shape: full.to_vec(),
            strides: dense_strides(&full),
        };
        assert_eq!(whole.runs(), vec![(0, 60)]);
        for (dim, &extent) in full.iter().enumerate() {
            for (start, len) in [(0, 1), (1, 2), (2, 1), (0, extent), (1, 0)] {
                let v = whole.clone().block(dim, start, len);
                let by_runs: Vec<f64> = v
                    .runs()
                    .iter()
                    .flat_map(|&(s, n)| all[s..s + n].to_vec())
                    .collect();
                assert_eq!(by_runs, v.gather(&all), "dim {dim}, block {start}+{len}");
            }
        }
        assert_eq!(whole.clone().block(0, 1, 2).runs(), vec![(15, 30)]);
        assert_eq!(whole.block(1, 1, 1).runs().len(), 4);
    }
}
