//! The fused all-reduce: reduce-scatter → computation → all-gather in one pass over the
//! chunks of my block. For each chunk: reduce it from every peer (rank order), run the
//! fused computation on it in registers, store the sliced results (optimizer state) in
//! my memory and write the gathered results into every peer's buffer — the optimizer
//! state never exists whole, and the update hides under communication.
//!
//! Overlapped with a matmul: the matmul runs on its own thread per rank, by blocks of its
//! first dim, raising a per-block flag stamped with a number that grows with every
//! overlap step of every run (so flags never need resetting);
//! the fused all-reduce waits for the flags of every peer covering a chunk before
//! reducing it.
//!
//! The fused all-gather is the same pass without the reduction: a kernel over my block
//! whose gathered results go into every peer's buffer chunk by chunk.

use super::collective::{reduce_chunk, reduce_chunk_f32};
use super::ctx::Ctx;
use super::folds::Folds;
use super::kernel::Kernel;
use crate::RuntimeError;
use crate::host::matmul::MatMul;
use crate::host::memory::Raw;
use crate::plan::{FusedAllGather, FusedAllReduce, Gather};
use coconet_core::numerics::tensor::numel;
use coconet_core::{Op, ValueId, block_range};

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

    // The matmul producer, on its own thread, if overlapped.
    std::thread::scope(|scope| -> Result<(), RuntimeError> {
        let producer = matmul.map(|mm| {
            let Op::MatMul(a, b) = p.node(mm).op else {
                unreachable!("overlap producers are matmuls")
            };
            let (sa, sb) = (ctx.local_shape(a, me), ctx.local_shape(b, me));
            let dtype = p.node(mm).ty.dtype;
            // f32, f16 and bf16 operands straight into f32 where they are plain buffers.
            let narrow = super::ops::narrow_matmul(ctx, a, b, dtype).map(|(m, ..)| m);
            let (av, bv) = match narrow {
                Some(_) => (Vec::new(), Vec::new()),
                None => (ctx.read(a), ctx.read(b)),
            };
            let out = ctx.raw(mm, me).expect("matmul output is a buffer");
            let world = ctx.world;
            let epoch = ctx.epoch_stamp;
            let flags_base = me * full[0];
            scope.spawn(move || {
                // Not on this rank's CPU: the matmul overlaps the collective.
                super::affinity::unbind();
                let (k, n) = (sb[0], sb[1]);
                // Rows per block of the first dim (0 if a middle dim is empty).
                let rows_per = numel(&sa[1..sa.len() - 1]);
                let product = narrow.unwrap_or_else(|| MatMul::new(dtype, &av, &bv, k, n));
                // Products of f32, f16 and bf16 run in f32: rows stored from f32.
                let (mut buf, mut buf32) = (Vec::new(), Vec::new());
                for i in 0..sa[0] {
                    let rows = i * rows_per..(i + 1) * rows_per;
                    if crate::host::matmul::in_f32(dtype) {
                        buf32.resize(rows_per * n, 0.0);
                        product.rows_f32(rows.clone(), &mut buf32);
                        out.store_f32(rows.start * n, &buf32);
                    } else {
                        buf.resize(rows_per * n, 0.0);
                        product.rows(rows.clone(), &mut buf);
                        out.store(rows.start * n, &buf);
                    }
                    world.raise(flags_base + i, epoch);
                }
            })
        });

        let result = (|| -> Result<(), RuntimeError> {
            let sources: Vec<_> = group
                .iter()
                .map(|&s| ctx.raw(x, s).expect("fused all-reduce operand is a buffer"))
                .collect();
            let shape = ctx.local_shape(rs, me);
            let mut kernel = Kernel::new(ctx, &[rs], &f.kernel, shape);
            let rs_store = ctx.store_mapping(rs, &[]);
            let sends = sends(ctx, &kernel, &f.gathers, &group);
            let mut folds = Folds::new(p, &f.reductions, &kernel);
            let mut acc = vec![0.0; kernel.step];
            let mut start = 0;
            while start < len {
                let n = kernel.step.min(len - start);
                if matmul.is_some() {
                    let first = (offset + start) / inner;
                    let last = (offset + start + n - 1) / inner;
                    for &s in &group {
                        for i in first..=last {
                            ctx.world
                                .wait_flag(me, s, s * full[0] + i, ctx.epoch_stamp, at)?;
                        }
                    }
                }
                let direct = kernel
                    .f32_register(0, n)
                    .is_some_and(|reg| reduce_chunk_f32(op, &sources, offset + start, reg));
                if !direct {
                    let acc = &mut acc[..n];
                    reduce_chunk(op, &sources, offset + start, acc);
                    kernel.set(0, acc);
                }
                if let Some(super::array::Mapping::Contiguous { raw, base }) = &rs_store {
                    kernel.store(0, n, raw, base + start);
                }
                kernel.chunk(start, n);
                folds.chunk(&kernel, n);
                send_chunk(&kernel, &sends, n, offset + start);
                start += n;
            }
            folds.finish(ctx);
            crate::host::memory::store_fence();
            Ok(())
        })();
        if let Err(e) = &result {
            ctx.world.fail(me, e.to_string());
        }
        if let Some(h) = producer
            && h.join().is_err()
        {
            ctx.world.fail(me, "the overlapped matmul panicked".into());
        }
        result
    })?;
    ctx.barrier(at)?;
    commit_gathered(ctx, &f.gathers);
    Ok(())
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
        crate::host::memory::store_fence();
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
