//! The fused all-reduce: reduce-scatter → computation → all-gather in one pass over the
//! chunks of my block. For each chunk: reduce it from every peer (rank order; inside the
//! kernel's compiled code where it compiles), run the fused computation on it in
//! registers, store the sliced results (optimizer state) in my memory and write the
//! gathered results into every peer's buffer — the optimizer state never exists whole,
//! and the update hides under communication.
//!
//! Overlapped with a matmul: each rank computes its matmul by pieces of its rows in the
//! plan's order (round-robin over the ranks' blocks, see
//! [`coconet_plan::plan::PIECES_PER_BLOCK`]), on the rank's own thread between chunks of the
//! reduction, raising a per-piece flag stamped with a number that grows with every
//! overlap step of every run (so flags never need resetting); before reducing a chunk it
//! computes its next pieces until every peer's pieces covering the chunk are raised.
//! (A thread per matmul competed with the rank threads for the same cores: the
//! overlapped schedule was 1.3× fuse(RS-C-AG) after the same matmul.)
//!
//! The fused all-gather is the same pass without the reduction: a kernel over my block
//! whose gathered results go into every peer's buffer chunk by chunk.

use super::collective::{reduce_chunk, reduce_chunk_f32};
use super::folds::Folds;
use super::kernel::{Kernel, Reduction};
use super::rank_context::Ctx;
use coconet_core::numerics::tensor::numel;
use coconet_core::{DType, Op, ValueId, block_range};
use coconet_plan::RuntimeError;
use coconet_plan::host::matmul::MatMul;
use coconet_plan::host::memory::Raw;
use coconet_plan::plan::{FusedAllGather, FusedAllReduce, Gather, Pieces};

/// Runs a fused all-reduce (optionally overlapped with `matmul`) on this rank.
pub fn run(
    ctx: &Ctx,
    f: &FusedAllReduce,
    matmul: Option<ValueId>,
    at: &str,
) -> Result<(), RuntimeError> {
    let p = ctx.plan.program();
    let (rs, x, op) = (f.reduce_scatter, f.operand, f.op);
    ctx.barrier(at)?;
    let me = ctx.rank;
    if !ctx.holds(rs, me) {
        if matmul.is_some() && ctx.holds(x, me) {
            unreachable!("matmul and reduce-scatter share a group");
        }
        return ctx.barrier(at);
    }
    let full = ctx.plan.shape(x).to_vec();
    let inner = numel(&full[1..]);
    let block = block_range(full[0], ctx.q(), me % ctx.q());
    let offset = block.start * inner;
    let len = block.len() * inner;
    let group: Vec<usize> = ctx.holders(x).collect();
    // An overlapped matmul's output comes in pieces of its rows (of `columns` each).
    let pieces = ctx.plan.overlap_pieces(x);
    let columns = full.last().copied().unwrap_or(1).max(1);

    // The overlapped matmul, computed piece by piece on this thread between chunks
    // of the reduction (rank threads share the cores: a thread of its own only
    // competed with the reduction for them).
    let mut producer = matmul.map(|mm| Producer::new(ctx, mm, pieces));

    let result = (|| -> Result<(), RuntimeError> {
        let sources: Vec<_> = group
            .iter()
            .map(|&s| ctx.raw(x, s).expect("fused all-reduce operand is a buffer"))
            .collect();
        let shape = ctx.local_shape(rs, me);
        let rs_store = ctx.store_mapping(rs, &[]);
        // Compiled code reduces each chunk itself where it can (one pass over the
        // sources and the kernel's operands).
        let placed: Vec<(Raw, usize)> = sources.iter().map(|&raw| (raw, offset)).collect();
        let reduction = Reduction {
            op,
            sources: &placed,
            origin: 0,
            len,
            keep: rs_store.is_some(),
        };
        let mut kernel = Kernel::reducing(ctx, &[rs], &f.kernel, shape, Some(reduction));
        let in_code = kernel.reduces();
        let sends = sends(ctx, &kernel, &f.gathers, &group);
        let mut folds = Folds::new(p, &f.reductions, &kernel);
        // The f64 reduction's chunk, only where the code does not reduce.
        let mut acc = if in_code {
            Vec::new()
        } else {
            vec![0.0; kernel.step]
        };
        let mut start = 0;
        while start < len {
            let n = kernel.step.min(len - start);
            if let Some(producer) = &mut producer {
                let first = pieces.of_row((offset + start) / columns);
                let last = pieces.of_row((offset + start + n - 1) / columns);
                for &s in &group {
                    for piece in first..=last {
                        producer.until_ready(ctx, s, piece, at)?;
                    }
                }
            }
            let direct = in_code
                || kernel
                    .f32_register(0, n)
                    .is_some_and(|reg| reduce_chunk_f32(op, &sources, offset + start, reg));
            if !direct {
                let acc = &mut acc[..n];
                reduce_chunk(op, &sources, offset + start, acc);
                kernel.set(0, acc);
            }
            kernel.chunk(start, n);
            if let Some(super::array::Mapping::Contiguous { raw, base }) = &rs_store {
                kernel.store(0, n, raw, base + start);
            }
            folds.chunk(&kernel, n);
            send_chunk(&kernel, &sends, n, offset + start);
            start += n;
        }
        // My pieces of the other blocks (the peers wait for them).
        if let Some(producer) = &mut producer {
            producer.finish(ctx);
        }
        folds.finish(ctx);
        coconet_plan::host::memory::store_fence();
        Ok(())
    })();
    if let Err(e) = &result {
        // The peers may be waiting for my pieces: fail them rather than let them time out.
        ctx.world.fail(me, e.to_string());
    }
    result?;
    ctx.barrier(at)?;
    commit_gathered(ctx, &f.gathers);
    Ok(())
}

/// An overlapped matmul on one rank, computed piece by piece in the plan's order (see
/// [`coconet_plan::plan::PIECES_PER_BLOCK`]), each piece's flag raised once it is stored.
struct Producer {
    product: MatMul,
    dtype: DType,
    out: Raw,
    pieces: Pieces,
    /// Pieces still to compute, in order.
    todo: std::vec::IntoIter<usize>,
    /// Columns of the product.
    n: usize,
    buf: Vec<f64>,
    buf32: Vec<f32>,
}

impl Producer {
    fn new(ctx: &Ctx, mm: ValueId, pieces: Pieces) -> Producer {
        let p = ctx.plan.program();
        let me = ctx.rank;
        let Op::MatMul(a, b) = p.node(mm).op else {
            unreachable!("overlap producers are matmuls")
        };
        let dtype = p.node(mm).ty.dtype;
        let (k, n) = {
            let sb = ctx.local_shape(b, me);
            (sb[0], sb[1])
        };
        // f32, f16 and bf16 operands straight into f32 where they are plain buffers.
        let product = match super::local_ops::narrow_matmul(ctx, a, b, dtype) {
            Some((m, ..)) => m,
            None => MatMul::new(dtype, &ctx.read(a), &ctx.read(b), k, n),
        };
        Producer {
            product,
            dtype,
            out: ctx.raw(mm, me).expect("matmul output is a buffer"),
            pieces,
            todo: pieces.order().into_iter(),
            n,
            buf: Vec::new(),
            buf32: Vec::new(),
        }
    }

    /// Computes and stores my next piece and raises its flag; false when none is left.
    fn next(&mut self, ctx: &Ctx) -> bool {
        let Some(piece) = self.todo.next() else {
            return false;
        };
        let (rows, n) = (self.pieces.rows(piece), self.n);
        // Products of f32, f16 and bf16 run in f32: rows stored from f32.
        if coconet_plan::host::matmul::in_f32(self.dtype) {
            self.buf32.resize(rows.len() * n, 0.0);
            self.product.rows_f32(rows.clone(), &mut self.buf32);
            self.out.store_f32(rows.start * n, &self.buf32);
        } else {
            self.buf.resize(rows.len() * n, 0.0);
            self.product.rows(rows.clone(), &mut self.buf);
            self.out.store(rows.start * n, &self.buf);
        }
        let flag = ctx.rank * self.pieces.count() + piece;
        ctx.world.raise(flag, ctx.epoch_stamp);
        true
    }

    /// Returns once rank `s` has stored `piece`, computing my own pieces meanwhile;
    /// blocks only when all of mine are done (so every rank can always progress).
    fn until_ready(
        &mut self,
        ctx: &Ctx,
        s: usize,
        piece: usize,
        at: &str,
    ) -> Result<(), RuntimeError> {
        let flag = s * self.pieces.count() + piece;
        while !ctx.world.is_raised(flag, ctx.epoch_stamp) {
            // Out of pieces, or a peer failed (the wait then reports it at once).
            if ctx.world.has_failed() || !self.next(ctx) {
                return ctx.world.wait_flag(ctx.rank, s, flag, ctx.epoch_stamp, at);
            }
        }
        Ok(())
    }

    /// Computes every piece left.
    fn finish(&mut self, ctx: &Ctx) {
        while self.next(ctx) {}
    }
}

/// Runs a fused all-gather on this rank: the kernel over my block chunk by chunk, each
/// chunk's gathered stages written into every peer's buffer as they are computed.
pub fn run_gather(ctx: &Ctx, f: &FusedAllGather, at: &str) -> Result<(), RuntimeError> {
    ctx.barrier(at)?;
    let me = ctx.rank;
    let first = f.kernel[0];
    if ctx.holds(first, me) {
        let sent = f.gathers[0].sent;
        let full = ctx.plan.shape(sent);
        let block = block_range(full[0], ctx.q(), me % ctx.q());
        let offset = block.start * numel(&full[1..]);
        let group: Vec<usize> = ctx.holders(sent).collect();
        let mut kernel = Kernel::new(ctx, &[], &f.kernel, ctx.local_shape(first, me));
        let sends = sends(ctx, &kernel, &f.gathers, &group);
        let mut start = 0;
        while start < kernel.len {
            let n = kernel.step.min(kernel.len - start);
            kernel.chunk(start, n);
            send_chunk(&kernel, &sends, n, offset + start);
            start += n;
        }
        coconet_plan::host::memory::store_fence();
    }
    ctx.barrier(at)?;
    commit_gathered(ctx, &f.gathers);
    Ok(())
}

/// For each gather: the kernel register it sends, and every peer's destination.
fn sends(
    ctx: &Ctx,
    kernel: &Kernel,
    gathers: &[Gather],
    group: &[usize],
) -> Vec<(usize, Vec<Raw>)> {
    gathers
        .iter()
        .map(|g| {
            let src = kernel
                .index_of(g.sent)
                .expect("gathered values are fused stages");
            let dst = group
                .iter()
                .map(|&s| {
                    ctx.raw(g.gather, s)
                        .expect("gather destinations are buffers")
                })
                .collect();
            (src, dst)
        })
        .collect()
}

/// Writes the chunk's `n` gathered values into every peer's buffer at `at`.
fn send_chunk(kernel: &Kernel, sends: &[(usize, Vec<Raw>)], n: usize, at: usize) {
    for (src, dsts) in sends {
        for d in dsts {
            kernel.send(*src, n, d, at);
        }
    }
}

/// Updates whose gathered value lives in its own buffer copy it in, once every peer's
/// block has arrived.
pub(crate) fn commit_gathered(ctx: &Ctx, gathers: &[Gather]) {
    for g in gathers {
        if let Some(u) = g.update
            && ctx.plan.storage(u) != ctx.plan.storage(g.gather)
            && ctx.holds(u, ctx.rank)
        {
            let data = ctx.read(g.gather);
            ctx.write(u, &data);
        }
    }
}
