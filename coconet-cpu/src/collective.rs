//! Collectives over shared memory. Every collective is bracketed by barriers, reduces in
//! rank order 0, 1, .., Q-1 in f64 and rounds once — so results are deterministic and
//! Replicated outputs bitwise identical on every rank (and equal to the reference
//! interpreter's).
//!
//! Fast paths (contiguous buffers, dim 0) work chunk by chunk on typed memory: an
//! all-reduce is a reduce-scatter of my block from every peer followed by copying the
//! peers' blocks; other cases read whole arrays (correct, slower).

use super::kernel::{CHUNK, round};
use super::rank_context::Ctx;
use coconet_core::Collective;
use coconet_core::numerics::tensor::{concat_dim, numel, slice_dim};
use coconet_core::{DType, Direction, Layout, Op, ReduceOp, ValueId, block_range};
use coconet_plan::RuntimeError;

/// Runs collective `v` on this rank (all ranks call it: it holds barriers).
pub fn run(ctx: &Ctx, v: ValueId, at: &str) -> Result<(), RuntimeError> {
    let p = ctx.plan.program();
    let node = p.node(v);
    ctx.barrier(at)?;
    let me = ctx.rank;
    let holds = ctx.holds(v, me);
    match node.op {
        Op::Collective(Collective::AllReduce(op), x) if fast(ctx, x, v) => {
            let g = ctx.holders(x);
            if holds {
                let n = numel(&ctx.local_shape(x, me));
                let b = block_range(n, ctx.q(), me % ctx.q());
                reduce_into(ctx, op, x, v, b.start..b.end, 0, node.ty.dtype);
            }
            ctx.barrier(at)?;
            if holds {
                let n = numel(&ctx.local_shape(x, me));
                let out = ctx.raw(v, me).expect("fast");
                for s in g.filter(|&s| s != me) {
                    let b = block_range(n, ctx.q(), s % ctx.q());
                    out.copy_from(b.start, &ctx.raw(v, s).expect("fast"), b.start, b.len());
                }
            }
        }
        Op::Collective(Collective::ReduceScatter(op, 0), x) if fast(ctx, x, v) => {
            if holds {
                let shape = ctx.plan.shape(x);
                let inner = numel(&shape[1..]);
                let b = block_range(shape[0], ctx.q(), me % ctx.q());
                reduce_into(
                    ctx,
                    op,
                    x,
                    v,
                    b.start * inner..b.end * inner,
                    b.start * inner,
                    node.ty.dtype,
                );
            }
        }
        Op::Collective(Collective::AllGather, x)
            if fast(ctx, x, v) && p.node(x).ty.layout == Layout::Sliced(0) =>
        {
            if holds {
                let shape = ctx.plan.shape(v);
                let inner = numel(&shape[1..]);
                let out = ctx.raw(v, me).expect("fast");
                for s in ctx.holders(x) {
                    let b = block_range(shape[0], ctx.q(), s % ctx.q());
                    out.copy_from(
                        b.start * inner,
                        &ctx.raw(x, s).expect("fast"),
                        0,
                        b.len() * inner,
                    );
                }
            }
        }
        _ => {
            if holds
                && let Op::Collective(Collective::Send(dir), x) = node.op
                && let Some((src, out)) = send_buffers(ctx, x, v, dir)
            {
                // A plain copy of my peer's buffer (no f64 round trip, no whole-array
                // allocation per run).
                out.copy_from(0, &src, 0, out.len());
            } else if holds {
                let mut out = general(ctx, v, &|x, s| ctx.read_rank(x, s))?;
                round(node.ty.dtype, &mut out);
                ctx.write(v, &out);
            }
        }
    }
    ctx.barrier(at)
}

/// The buffers a send copies between, where both are plain buffers of one length: my
/// peer's operand (the rank one group before or after me) and my result.
fn send_buffers(
    ctx: &Ctx,
    x: ValueId,
    v: ValueId,
    dir: Direction,
) -> Option<(
    coconet_plan::host::memory::Raw,
    coconet_plan::host::memory::Raw,
)> {
    let src = match dir {
        Direction::Next => ctx.rank.checked_sub(ctx.q())?,
        Direction::Prev => ctx.rank + ctx.q(),
    };
    let (from, to) = (ctx.raw(x, src)?, ctx.raw(v, ctx.rank)?);
    let scalar = ctx.plan.program().node(x).ty.is_scalar();
    (!scalar && from.len() == to.len()).then_some((from, to))
}

/// Whether operand and result are plain buffers on every rank (no views or scalars).
fn fast(ctx: &Ctx, x: ValueId, v: ValueId) -> bool {
    ctx.holders(x)
        .all(|s| ctx.raw(x, s).is_some() && ctx.raw(v, s).is_some())
        && !ctx.plan.program().node(x).ty.is_scalar()
}

/// Reduces `x[range]` over the group (rank order) and stores it at `range - shift` of `v`.
fn reduce_into(
    ctx: &Ctx,
    op: ReduceOp,
    x: ValueId,
    v: ValueId,
    range: std::ops::Range<usize>,
    shift: usize,
    dtype: coconet_core::DType,
) {
    let group: Vec<_> = ctx
        .holders(x)
        .map(|s| ctx.raw(x, s).expect("fast"))
        .collect();
    let out = ctx.raw(v, ctx.rank).expect("fast");
    let mut acc = vec![0.0; CHUNK];
    // f32 results: reduced straight to f32 where the sources allow (the same bits).
    let mut acc32 = vec![0f32; if dtype == DType::F32 { CHUNK } else { 0 }];
    let mut start = range.start;
    while start < range.end {
        let n = CHUNK.min(range.end - start);
        if dtype == DType::F32 && reduce_chunk_f32(op, &group, start, &mut acc32[..n]) {
            out.store_f32(start - shift, &acc32[..n]);
        } else {
            reduce_chunk(op, &group, start, &mut acc[..n]);
            round(dtype, &mut acc[..n]);
            out.store(start - shift, &acc[..n]);
        }
        start += n;
    }
}

/// `acc = op-reduction over the group of element chunk starting at `start``.
pub fn reduce_chunk(
    op: ReduceOp,
    group: &[coconet_plan::host::memory::Raw],
    start: usize,
    acc: &mut [f64],
) {
    group[0].load(start, acc);
    for raw in &group[1..] {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => raw.combine_into(start, acc, |a, t| a + t),
            op => raw.combine_into(start, acc, |a, t| op.combine(a, t)),
        }
    }
    if op == ReduceOp::Avg {
        let q = group.len() as f64;
        acc.iter_mut().for_each(|a| *a /= q);
    }
}

/// [`reduce_chunk`] straight into f32 results, for plain f32 sources and a sum or mean:
/// the same f64 sums in rank order, each rounded once to f32 (bitwise what
/// `reduce_chunk` then rounding gives), in one pass over the sources by blocks that stay
/// in L1, compiled for AVX2 where the CPU has it. Returns `false` (nothing written) for
/// any other case.
pub fn reduce_chunk_f32(
    op: ReduceOp,
    group: &[coconet_plan::host::memory::Raw],
    start: usize,
    out: &mut [f32],
) -> bool {
    group
        .iter()
        .map(|raw| raw.f32_slice(start, out.len()))
        .collect::<Option<Vec<&[f32]>>>()
        .is_some_and(|srcs| reduce_f32_slices(op, &srcs, out))
}

/// [`reduce_chunk_f32`] over slices (the blocks of a receive buffer, say), in order.
pub fn reduce_f32_slices(op: ReduceOp, srcs: &[&[f32]], out: &mut [f32]) -> bool {
    if !matches!(op, ReduceOp::Sum | ReduceOp::Avg)
        || srcs.is_empty()
        || srcs.iter().any(|s| s.len() < out.len())
    {
        return false;
    }
    let mean = (op == ReduceOp::Avg).then_some(srcs.len() as f64);
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { sum_f32_avx2(srcs, out, mean) };
        return true;
    }
    sum_f32(srcs, out, mean);
    true
}

/// [`sum_f32`] compiled for AVX2 (the same IEEE operations: the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_f32_avx2(srcs: &[&[f32]], out: &mut [f32], mean: Option<f64>) {
    sum_f32(srcs, out, mean);
}

/// `out[i] = (Σ_s srcs[s][i] in f64, in order) [/ mean]`, rounded to f32.
#[inline(always)]
fn sum_f32(srcs: &[&[f32]], out: &mut [f32], mean: Option<f64>) {
    const BLOCK: usize = 256;
    let mut acc = [0f64; BLOCK];
    for (b, o) in out.chunks_mut(BLOCK).enumerate() {
        let range = b * BLOCK..b * BLOCK + o.len();
        let acc = &mut acc[..o.len()];
        for (a, x) in acc.iter_mut().zip(&srcs[0][range.clone()]) {
            *a = f64::from(*x);
        }
        for src in &srcs[1..] {
            for (a, x) in acc.iter_mut().zip(&src[range.clone()]) {
                *a += f64::from(*x);
            }
        }
        match mean {
            Some(q) => o
                .iter_mut()
                .zip(&*acc)
                .for_each(|(o, a)| *o = (a / q) as f32),
            None => o.iter_mut().zip(&*acc).for_each(|(o, a)| *o = *a as f32),
        }
    }
}

/// Any collective, on whole arrays: `read(x, s)` is rank `s`'s data of `x` (through the
/// registry for rank threads, from a gather for MPI).
pub fn general(
    ctx: &Ctx,
    v: ValueId,
    read: &dyn Fn(ValueId, usize) -> Vec<f64>,
) -> Result<Vec<f64>, RuntimeError> {
    let p = ctx.plan.program();
    let me = ctx.rank;
    let group = ctx.holders(v);
    let reduce = |op: ReduceOp, x: ValueId| {
        let src = ctx.holders(x);
        let mut acc = read(x, src.start);
        for s in src.clone().skip(1) {
            for (a, b) in acc.iter_mut().zip(read(x, s)) {
                *a = op.combine(*a, b);
            }
        }
        let q = src.len();
        acc.into_iter()
            .map(|a| op.finish(a, q))
            .collect::<Vec<f64>>()
    };
    let root_of = |root: usize| -> Result<usize, RuntimeError> {
        if root >= ctx.q() {
            return Err(RuntimeError::Binding(coconet_core::InterpError::Root {
                op: p.node(v).op.name(),
                value: p.label(v),
                root,
                group_size: ctx.q(),
            }));
        }
        Ok(group.start + root)
    };
    // Only collectives come here: the executor sends what `is_communication` says.
    let Some((c, x)) = p.node(v).op.collective() else {
        return Err(RuntimeError::Plan(format!(
            "`{}` ({}) is not a collective",
            p.label(v),
            p.node(v).op.name()
        )));
    };
    Ok(match c {
        Collective::AllReduce(op) => reduce(op, x),
        Collective::ReduceScatter(op, d) => {
            let shape = ctx.plan.shape(x);
            slice_dim(
                &reduce(op, x),
                shape,
                d,
                block_range(shape[d], ctx.q(), me % ctx.q()),
            )
        }
        Collective::AllGather => {
            let Layout::Sliced(d) = p.node(x).ty.layout else {
                unreachable!("checker: all_gather of Sliced")
            };
            let blocks: Vec<(Vec<f64>, usize)> = ctx
                .holders(x)
                .map(|s| (read(x, s), ctx.local_shape(x, s)[d]))
                .collect();
            let refs: Vec<(&[f64], usize)> = blocks.iter().map(|(b, n)| (&b[..], *n)).collect();
            concat_dim(&refs, ctx.plan.shape(x), d)
        }
        Collective::Broadcast(root) => read(x, root_of(root)?),
        Collective::Reduce(op, root) => {
            if me == root_of(root)? {
                reduce(op, x)
            } else {
                read(x, me)
            }
        }
        Collective::Send(dir) => {
            let src = match dir {
                Direction::Next => me - ctx.q(),
                Direction::Prev => me + ctx.q(),
            };
            read(x, src)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use coconet_plan::host::memory::Buffer;

    /// The direct f32 reduction gives the bits of the f64 reduction rounded after, for
    /// sums and means over 1 to 5 sources, at offsets and lengths that split blocks, and
    /// declines what it does not handle.
    #[test]
    fn the_f32_reduction_rounds_like_the_f64_one() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Values of very different magnitudes, so the f64 sum matters.
            let m = (seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
            m * 10f64.powi((seed % 9) as i32 - 4)
        };
        for p in 1..=5 {
            let mut buffers: Vec<Buffer> = (0..p)
                .map(|_| {
                    let data: Vec<f64> = (0..1000).map(|_| next()).collect();
                    Buffer::from_f64(DType::F32, &data)
                })
                .collect();
            // SAFETY: `buffers` outlives `raws`; one thread uses them.
            let raws: Vec<_> = buffers.iter_mut().map(|b| unsafe { b.raw() }).collect();
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                for (start, n) in [(0, 1000), (3, 517), (700, 256), (999, 1)] {
                    let mut want = vec![0.0; n];
                    reduce_chunk(op, &raws, start, &mut want);
                    let mut got = vec![0f32; n];
                    assert!(reduce_chunk_f32(op, &raws, start, &mut got));
                    for (g, w) in got.iter().zip(&want) {
                        assert_eq!(g.to_bits(), (*w as f32).to_bits(), "{op:?} p={p}");
                    }
                }
            }
            assert!(!reduce_chunk_f32(ReduceOp::Max, &raws, 0, &mut [0.0; 4]));
        }
        let mut wide = Buffer::from_f64(DType::F64, &[1.0; 8]);
        assert!(!reduce_chunk_f32(
            ReduceOp::Sum,
            // SAFETY: `wide` outlives the view, used by this thread only.
            &[unsafe { wide.raw() }],
            0,
            &mut [0.0; 8]
        ));
    }

    #[cfg(feature = "jit")]
    /// The compiled code's sum node (`jit::Node::Sum`) computes what
    /// [`reduce_f32_slices`] does (rank order in f64, rounded once; divided by the rank
    /// count for a mean), over every tail length and floats of every kind.
    #[test]
    fn sums_reduce_like_the_collectives() {
        use crate::jit::{Graph, Node, compile};
        let ranks = 3;
        let g = Graph {
            nodes: (0..ranks)
                .map(Node::Load)
                .chain([
                    Node::Sum {
                        first: 0,
                        count: ranks,
                        mean: None,
                    },
                    Node::Sum {
                        first: 0,
                        count: ranks,
                        mean: Some(0),
                    },
                ])
                .collect(),
            inputs: ranks,
            scalars: 1,
            outputs: vec![ranks, ranks + 1],
        };
        let Some(code) = compile(&g) else {
            return;
        };
        for n in [1, 2, 5, 16, 19, 1001] {
            let inputs: Vec<Vec<f32>> = (0..ranks)
                .map(|k| crate::floats::every_kind(n, 31 + k as u64))
                .collect();
            let (mut sum, mut mean) = (vec![0f32; n], vec![0f32; n]);
            let mut pointers: Vec<*mut f32> =
                inputs.iter().map(|x| x.as_ptr().cast_mut()).collect();
            pointers.extend([sum.as_mut_ptr(), mean.as_mut_ptr()]);
            // SAFETY: every pointer holds n f32; none shared.
            unsafe { code.run(&pointers, &[ranks as f32], n) };
            let slices: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
            for (op, got) in [(ReduceOp::Sum, &sum), (ReduceOp::Avg, &mean)] {
                let mut want = vec![0f32; n];
                assert!(reduce_f32_slices(op, &slices, &mut want));
                for (i, (w, x)) in want.iter().zip(got.iter()).enumerate() {
                    assert!(
                        w.to_bits() == x.to_bits() || (w.is_nan() && x.is_nan()),
                        "{op:?}, n = {n}, element {i}: compiled {x:e}, here {w:e}"
                    );
                }
            }
        }
    }
}
