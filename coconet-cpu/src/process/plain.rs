//! The unfused collectives between processes in the tensors' own bytes: an all-reduce
//! or reduce-scatter along dim 0 is an all-to-all of blocks into one receive buffer, my
//! block reduced in rank order (f32 sums straight to f32, as rank threads do), then an
//! all-gather for the all-reduce; an all-gather of dim-0 blocks goes from my buffer into
//! every process's result. A schedule that does not fuse its collective (AR-C, RS-C-AG)
//! pays what `MPI_Allreduce` would, not twice the bytes as f64 and whole-tensor copies.

use super::exchange::{Processes, contiguous, reduce_received};
use super::relay::Hosts;
use super::transport::check_size;
use super::transport::link::{Bytes, Parts};
use crate::collective::reduce_f32_slices;
use crate::exec::Ctx;
use crate::kernel::{CHUNK, round};
use coconet_core::numerics::tensor::numel;
use coconet_core::{DType, ReduceOp, ValueId, block_range};
use coconet_plan::RuntimeError;
use coconet_plan::host::memory::{Buffer, Raw};
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
    fn of(&self, s: usize) -> Range<usize> {
        if self.in_group { self.member(s) } else { 0..0 }
    }

    /// Rank s's block, empty where s is outside the group: what s gathers to everyone.
    fn member(&self, s: usize) -> Range<usize> {
        if self.group.contains(&s) {
            self.ranges[s % self.ranges.len()].clone()
        } else {
            0..0
        }
    }
}

/// Where a collective's result `v` lands on this process: v's own plain buffer; a
/// buffer written back into v afterwards (v bound in pieces, or computed into
/// registers); or scratch of the whole tensor where I do not hold v (every process
/// posts the same all-gather, so blocks land here all the same; none for a
/// reduce-scatter).
struct Landing {
    raw: Raw,
    /// Owns `raw` where it is not v's own buffer.
    own: Buffer,
    write_back: bool,
}

impl Landing {
    fn new(ctx: &Ctx, v: ValueId, dtype: DType, whole: usize) -> Landing {
        let me = ctx.rank;
        let holds = ctx.holds(v, me);
        match ctx.raw(v, me) {
            Some(raw) if holds && !raw.is_pieced() => Landing {
                raw,
                own: Buffer::zeros(dtype, 0),
                write_back: false,
            },
            _ => {
                let len = if holds {
                    numel(&ctx.local_shape(v, me))
                } else {
                    whole
                };
                let mut own = Buffer::zeros(dtype, len);
                Landing {
                    // SAFETY: the landing owns the buffer (its heap memory does not move
                    // with it) for as long as the view is used.
                    raw: unsafe { own.raw() },
                    own,
                    write_back: holds,
                }
            }
        }
    }

    /// Writes what landed into v where it did not land in v's buffer.
    fn finish(self, ctx: &Ctx, v: ValueId) {
        if !self.write_back {
            return;
        }
        match ctx.raw(v, ctx.rank) {
            Some(dst) => self.raw.copy_all_to(&dst),
            None => ctx.write(v, &self.own.to_f64()),
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
        // The receive buffer holds q of the largest block: more than the tensor where
        // blocks are uneven. Alike on every process, before communicating.
        let received = blocks.ranges[0].len().saturating_mul(q);
        check_size(
            self.link,
            rows.saturating_mul(inner)
                .max(received)
                .saturating_mul(size),
        )?;
        let mut x_keep = Buffer::zeros(dtype, 0);
        let x_raw = if blocks.in_group {
            contiguous(ctx, x, dtype, &mut x_keep)
        } else {
            // SAFETY: `x_keep` lives to the end of the step, beyond every use of `x_raw`.
            unsafe { x_keep.raw() }
        };
        let n = blocks.of(me).len();
        let mut recv = self.scratch.take(dtype, n * q);
        // SAFETY: `recv` lives to the end of the step, beyond every use of `recv_raw`.
        let recv_raw = unsafe { recv.raw() };
        let sc: Vec<usize> = (0..world).map(|s| blocks.of(s).len() * size).collect();
        let sd: Vec<usize> = (0..world).map(|s| blocks.of(s).start * size).collect();
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
        let whole = if gather { rows * inner } else { 0 };
        let landing = Landing::new(ctx, v, dtype, whole);
        if gather {
            let mut mine = self.scratch.take(dtype, n);
            // SAFETY: `mine` lives to the end of this branch, beyond every use of the view.
            let mine_raw = unsafe { mine.raw() };
            if blocks.in_group {
                reduce_blocks_into(op, dtype, &recv_raw, q, n, &mine_raw);
            }
            self.gather_blocks(&blocks, size, (&mine_raw, n), &landing.raw)?;
            self.scratch.keep([mine]);
        } else if blocks.in_group && ctx.holds(v, me) {
            reduce_blocks_into(op, dtype, &recv_raw, q, n, &landing.raw);
        }
        landing.finish(ctx, v);
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
        let me = ctx.rank;
        let blocks = Blocks::new(ctx, x, rows, inner);
        check_size(self.link, rows.saturating_mul(inner).saturating_mul(size))?;
        let holds_x = ctx.holds(x, me);
        let mut x_keep = Buffer::zeros(dtype, 0);
        let x_raw = if holds_x {
            contiguous(ctx, x, dtype, &mut x_keep)
        } else {
            // SAFETY: `x_keep` lives to the end of the step, beyond every use of `x_raw`.
            unsafe { x_keep.raw() }
        };
        let landing = Landing::new(ctx, v, dtype, rows * inner);
        let sent = if holds_x { blocks.member(me).len() } else { 0 };
        self.gather_blocks(&blocks, size, (&x_raw, sent), &landing.raw)?;
        landing.finish(ctx, v);
        Ok(())
    }

    /// All-gathers `sent` elements of `from` (each group member its block) into every
    /// process's `into`, at each member's block.
    fn gather_blocks(
        &self,
        blocks: &Blocks,
        size: usize,
        (from, sent): (&Raw, usize),
        into: &Raw,
    ) -> Result<(), RuntimeError> {
        let world = self.link.size();
        if blocks.group.len() == world
            && let Some(hosts) = Hosts::of(self.link)
        {
            let me = self.link.rank();
            let at = |s: usize| {
                let b = blocks.member(s);
                b.start * size..b.end * size
            };
            // SAFETY: as below, for each of the two steps in turn.
            unsafe {
                let into = into.bytes_mut().as_mut_ptr();
                let send = (from.bytes(0, sent).as_ptr(), sent * size);
                drop(hosts.post_first(self.link, me, send, into, &at));
                self.check()?;
                for host in hosts.others(me) {
                    drop(hosts.post_second(self.link, me, host, into, &at));
                    self.check()?;
                }
            }
            return Ok(());
        }
        let counts: Vec<usize> = (0..world).map(|s| blocks.member(s).len() * size).collect();
        let displs: Vec<usize> = (0..world).map(|s| blocks.member(s).start * size).collect();
        // SAFETY: `from` is only read and `into` only written by the all-gather,
        // finished (dropped) here.
        unsafe {
            let send = Bytes {
                ptr: from.bytes(0, sent).as_ptr(),
                len: sent * size,
            };
            let into = Parts {
                ptr: into.bytes_mut().as_mut_ptr(),
                counts,
                displs,
            };
            drop(self.link.post_all_gather(send, into));
        }
        self.check()
    }
}

/// `dst[..n]` = the op-reduction of the `q` consecutive blocks of `n` elements in
/// `recv`, in order, rounded to `dtype` — bitwise what rank threads compute.
fn reduce_blocks_into(op: ReduceOp, dtype: DType, recv: &Raw, q: usize, n: usize, dst: &Raw) {
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
            dst.store_f32(off, &acc32[..len]);
        } else {
            let acc = &mut acc[..len];
            reduce_received(op, recv, (q, n), off, acc, &mut tmp[..len]);
            round(dtype, acc);
            dst.store(off, acc);
        }
        off += len;
    }
}
