//! The unfused collectives between processes in the tensors' own bytes: an all-reduce
//! or reduce-scatter along dim 0 is an all-to-all of blocks into one receive buffer, my
//! block reduced in rank order (f32 sums straight to f32, as rank threads do), then an
//! all-gather for the all-reduce; an all-gather of dim-0 blocks goes from my buffer into
//! every process's result. A schedule that does not fuse its collective (AR-C, RS-C-AG)
//! pays what `MPI_Allreduce` would, not twice the bytes as f64 and whole-tensor copies.

use super::exchange::Processes;
use super::transport::check_size;
use super::transport::link::{Bytes, Parts};
use crate::RuntimeError;
use crate::cpu::collective::reduce_f32_slices;
use crate::cpu::exec::Ctx;
use crate::cpu::kernel::{CHUNK, round};
use crate::host::memory::{Buffer, Raw};
use coconet_core::numerics::tensor::numel;
use coconet_core::{DType, ReduceOp, ValueId, block_range};
use std::ops::Range;

/// What a plain collective moves: the group holding the operand and its dim-0 blocks.
struct Blocks {
    group: Vec<usize>,
    in_group: bool,
    /// Element ranges of each group position's block (dim 0, times the inner size).
    ranges: Vec<Range<usize>>,
}

impl Blocks {
    fn new(ctx: &Ctx, x: ValueId, rows: usize, inner: usize) -> Blocks {
        let group: Vec<usize> = ctx.holders(x).collect();
        let q = ctx.q();
        let ranges = (0..q)
            .map(|i| {
                let b = block_range(rows, q, i);
                b.start * inner..b.end * inner
            })
            .collect();
        Blocks {
            in_group: group.contains(&ctx.rank),
            group,
            ranges,
        }
    }

    /// Rank s's block, empty where s (or I) is outside the group: what I exchange with s.
    fn of(&self, s: usize, q: usize) -> Range<usize> {
        if self.in_group {
            self.member(s, q)
        } else {
            0..0
        }
    }

    /// Rank s's block, empty where s is outside the group: what s gathers to everyone.
    fn member(&self, s: usize, q: usize) -> Range<usize> {
        if self.group.contains(&s) {
            self.ranges[s % q].clone()
        } else {
            0..0
        }
    }
}

/// My data of `x` as one plain buffer of its dtype: its own where it is one, else a copy
/// (a value computed elsewhere, or an input bound in pieces).
fn contiguous(ctx: &Ctx, x: ValueId, dtype: DType, keep: &mut Buffer) -> Raw {
    match ctx.raw(x, ctx.rank) {
        Some(r) if !r.is_pieced() => r,
        Some(r) => {
            *keep = Buffer::zeros(dtype, r.len());
            let copy = keep.raw();
            r.copy_all_to(&copy);
            copy
        }
        None => {
            *keep = Buffer::from_f64(dtype, &ctx.read(x));
            keep.raw()
        }
    }
}

impl Processes<'_> {
    /// All-reduce (`gather`) or reduce-scatter along dim 0 of `x` into `v`, in `x`'s
    /// dtype (`v`'s is the same), over `rows` blocks of `inner` elements.
    pub(super) fn reduce_plain(
        &self,
        ctx: &Ctx,
        op: ReduceOp,
        (x, v): (ValueId, ValueId),
        (rows, inner): (usize, usize),
        gather: bool,
    ) -> Result<(), RuntimeError> {
        let p = ctx.plan.program();
        let dtype = p.node(x).ty.dtype;
        let size = dtype.size_bytes();
        let (me, q, world) = (ctx.rank, ctx.q(), self.link.size());
        let blocks = Blocks::new(ctx, x, rows, inner);
        check_size(self.link, rows.saturating_mul(inner).saturating_mul(size))?;
        let mut x_keep = Buffer::zeros(dtype, 0);
        let x_raw = if blocks.in_group {
            contiguous(ctx, x, dtype, &mut x_keep)
        } else {
            x_keep.raw()
        };
        let n = blocks.of(me, q).len();
        let mut recv = self.scratch.take(dtype, n * q);
        let recv_raw = recv.raw();
        let sc: Vec<usize> = (0..world).map(|s| blocks.of(s, q).len() * size).collect();
        let sd: Vec<usize> = (0..world).map(|s| blocks.of(s, q).start * size).collect();
        // Every member of my group sends me its data of my block.
        let rc: Vec<usize> = (0..world)
            .map(|t| {
                if blocks.in_group && blocks.group.contains(&t) {
                    n * size
                } else {
                    0
                }
            })
            .collect();
        let rd = super::transport::displs(&rc);
        // SAFETY: x is only read and `recv` only written by the exchange, which is
        // finished (dropped) before either is used again.
        unsafe {
            let send = Parts {
                ptr: x_raw.bytes(0, x_raw.len()).as_ptr().cast_mut(),
                counts: sc,
                displs: sd,
            };
            let into = Parts {
                ptr: recv_raw.bytes_mut().as_mut_ptr(),
                counts: rc,
                displs: rd,
            };
            drop(self.link.post_all_to_all(send, into));
        }
        self.check()?;
        // My block, reduced in rank order: into v itself for a reduce-scatter, into a
        // buffer to send from for an all-reduce (a send may not alias its receive).
        let holds = ctx.holds(v, me);
        let mut mine = Buffer::zeros(dtype, 0);
        let mut v_keep = Buffer::zeros(dtype, 0);
        let out = match ctx.raw(v, me) {
            Some(r) if holds && !r.is_pieced() => Some(r),
            _ if holds => {
                v_keep = Buffer::zeros(dtype, numel(&ctx.local_shape(v, me)));
                Some(v_keep.raw())
            }
            _ => None,
        };
        let (dst, at) = if gather {
            mine = self.scratch.take(dtype, n);
            (Some(mine.raw()), 0)
        } else {
            (out, 0)
        };
        if let Some(dst) = dst.filter(|_| blocks.in_group) {
            reduce_blocks_into(op, dtype, &recv_raw, q, n, &dst, at);
        }
        if gather {
            // Every group member's block lands in every process: in v where I hold it,
            // else in scratch (every process posts the same all-gather).
            let counts: Vec<usize> = (0..world)
                .map(|s| blocks.member(s, q).len() * size)
                .collect();
            let displs: Vec<usize> = (0..world)
                .map(|s| blocks.member(s, q).start * size)
                .collect();
            let mut sink = Buffer::zeros(dtype, 0);
            let target = match out {
                Some(r) => r,
                None => {
                    sink = Buffer::zeros(dtype, rows * inner);
                    sink.raw()
                }
            };
            let mine_raw = mine.raw();
            // SAFETY: `mine` is read and the target written by the all-gather only,
            // finished (dropped) here.
            unsafe {
                let send = Bytes {
                    ptr: mine_raw.bytes(0, n).as_ptr(),
                    len: n * size,
                };
                let into = Parts {
                    ptr: target.bytes_mut().as_mut_ptr(),
                    counts,
                    displs,
                };
                drop(self.link.post_all_gather(send, into));
            }
            drop(sink);
            self.check()?;
            self.scratch.keep([mine]);
        }
        if holds && v_keep.len > 0 {
            ctx.write(v, &v_keep.to_f64());
        }
        self.scratch.keep([recv]);
        Ok(())
    }

    /// All-gather of the dim-0 blocks of `x` (rows of `inner` elements) into `v`, in the
    /// tensors' dtype.
    pub(super) fn gather_plain(
        &self,
        ctx: &Ctx,
        (x, v): (ValueId, ValueId),
        (rows, inner): (usize, usize),
    ) -> Result<(), RuntimeError> {
        let p = ctx.plan.program();
        let dtype = p.node(x).ty.dtype;
        let size = dtype.size_bytes();
        let (me, q, world) = (ctx.rank, ctx.q(), self.link.size());
        let blocks = Blocks::new(ctx, x, rows, inner);
        check_size(self.link, rows.saturating_mul(inner).saturating_mul(size))?;
        let holds_x = ctx.holds(x, me);
        let mut x_keep = Buffer::zeros(dtype, 0);
        let x_raw = if holds_x {
            contiguous(ctx, x, dtype, &mut x_keep)
        } else {
            x_keep.raw()
        };
        let holds = ctx.holds(v, me);
        let mut v_keep = Buffer::zeros(dtype, 0);
        let mut sink = Buffer::zeros(dtype, 0);
        let target = match ctx.raw(v, me) {
            Some(r) if holds && !r.is_pieced() => r,
            _ if holds => {
                v_keep = Buffer::zeros(dtype, numel(&ctx.local_shape(v, me)));
                v_keep.raw()
            }
            // Every process posts the same all-gather: blocks land in scratch here.
            _ => {
                sink = Buffer::zeros(dtype, rows * inner);
                sink.raw()
            }
        };
        let counts: Vec<usize> = (0..world)
            .map(|s| blocks.member(s, q).len() * size)
            .collect();
        let displs: Vec<usize> = (0..world)
            .map(|s| blocks.member(s, q).start * size)
            .collect();
        let sent = if holds_x {
            blocks.member(me, q).len()
        } else {
            0
        };
        // SAFETY: x is only read and the target only written by the all-gather,
        // finished (dropped) here.
        unsafe {
            let send = Bytes {
                ptr: x_raw.bytes(0, sent).as_ptr(),
                len: sent * size,
            };
            let into = Parts {
                ptr: target.bytes_mut().as_mut_ptr(),
                counts,
                displs,
            };
            drop(self.link.post_all_gather(send, into));
        }
        drop(sink);
        self.check()?;
        if holds && v_keep.len > 0 {
            ctx.write(v, &v_keep.to_f64());
        }
        Ok(())
    }
}

/// `dst[at..at + n]` = the op-reduction of the `q` consecutive blocks of `n` elements in
/// `recv`, in order, rounded to `dtype` — bitwise what rank threads compute.
fn reduce_blocks_into(
    op: ReduceOp,
    dtype: DType,
    recv: &Raw,
    q: usize,
    n: usize,
    dst: &Raw,
    at: usize,
) {
    let (mut acc, mut tmp) = (vec![0.0; CHUNK], vec![0.0; CHUNK]);
    let mut acc32 = vec![0f32; if dtype == DType::F32 { CHUNK } else { 0 }];
    let mut off = 0;
    while off < n {
        let len = CHUNK.min(n - off);
        let direct = dtype == DType::F32
            && (0..q)
                .map(|t| recv.f32_slice(t * n + off, len))
                .collect::<Option<Vec<&[f32]>>>()
                .is_some_and(|srcs| reduce_f32_slices(op, &srcs, &mut acc32[..len]));
        if direct {
            dst.store_f32(at + off, &acc32[..len]);
        } else {
            let acc = &mut acc[..len];
            recv.load(off, acc);
            for t in 1..q {
                recv.load(t * n + off, &mut tmp[..len]);
                acc.iter_mut()
                    .zip(&tmp[..len])
                    .for_each(|(a, b)| *a = op.combine(*a, *b));
            }
            acc.iter_mut().for_each(|a| *a = op.finish(*a, q));
            round(dtype, acc);
            dst.store(at + off, acc);
        }
        off += len;
    }
}
