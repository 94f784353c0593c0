//! Rank-local operations that are not pointwise: matmul (faer), full reductions, layer
//! normalisation. Reductions and layer norm compute in f64 and round to the result's
//! dtype, as the interpreter does; matmul runs in the dtype's working precision (see
//! [`coconet_plan::host::matmul`]).

use super::array::Mapping;
use super::kernel::{CHUNK, round};
use super::rank_context::Ctx;
use coconet_core::numerics::ReduceAcc;
use coconet_core::{DType, Op, ReduceKind, ValueId};
use coconet_plan::host::matmul::{self, MatMul};

/// Runs one rank-local operation of this rank.
pub fn run(ctx: &Ctx, v: ValueId) {
    let p = ctx.plan.program();
    let node = p.node(v);
    if let Op::MatMul(a, b) = node.op
        && let Some(out) = ctx.raw(v, ctx.rank)
        && let Some((product, m, n)) = narrow_matmul(ctx, a, b, node.ty.dtype)
    {
        let mut o = vec![0f32; m * n];
        product.rows_f32(0..m, &mut o);
        out.store_f32(0, &o);
        return;
    }
    let mut out = match node.op {
        Op::MatMul(a, b) => {
            let (sa, sb) = (ctx.local_shape(a, ctx.rank), ctx.local_shape(b, ctx.rank));
            let (k, n) = (sb[0], sb[1]);
            let m = sa[..sa.len() - 1].iter().product::<usize>();
            let mut out = vec![0.0; m * n];
            MatMul::new(node.ty.dtype, &ctx.read(a), &ctx.read(b), k, n).rows(0..m, &mut out);
            out
        }
        Op::ReduceAll(kind, x) => vec![reduce_all(ctx, kind, x)],
        Op::LayerNorm {
            x,
            gamma,
            beta,
            eps,
        } => {
            let h = *ctx.plan.shape(x).last().expect("rank >= 1");
            let (g, b, e) = (ctx.read(gamma), ctx.read(beta), ctx.read(eps)[0]);
            let data = ctx.read(x);
            let mut y = vec![0.0; data.len()];
            for (row, out) in data.chunks(h.max(1)).zip(y.chunks_mut(h.max(1))) {
                coconet_core::numerics::layer_norm_row(row, &g, &b, e, out);
            }
            y
        }
        ref op => unreachable!("{} is not a rank-local operation", op.name()),
    };
    round(node.ty.dtype, &mut out);
    ctx.write(v, &out);
}

/// This rank's product `a × b` (result dtype `dtype`) with f32, f16 or bf16 operands
/// read straight into f32, where both are contiguous buffers; with its row and column
/// counts. `None` otherwise (the f64 path reads them).
pub(crate) fn narrow_matmul(
    ctx: &Ctx,
    a: ValueId,
    b: ValueId,
    dtype: DType,
) -> Option<(MatMul, usize, usize)> {
    if !matmul::in_f32(dtype) {
        return None;
    }
    let (p, me) = (ctx.plan.program(), ctx.rank);
    let (sa, sb) = (ctx.local_shape(a, me), ctx.local_shape(b, me));
    let (k, n) = (sb[0], sb[1]);
    let m = sa[..sa.len() - 1].iter().product::<usize>();
    let av = ctx.array(a, me)?.read_f32(p.node(a).ty.dtype)?;
    let bv = ctx.array(b, me)?.read_f32(p.node(b).ty.dtype)?;
    Some((MatMul::narrow(dtype, av, bv, k, n), m, n))
}

/// A full reduction of my data of `x`, streamed in chunks (no copy of the whole array),
/// in the reference order ([`ReduceAcc`]: rows of 256 lanes the compiler vectorises).
fn reduce_all(ctx: &Ctx, kind: ReduceKind, x: ValueId) -> f64 {
    let Some(array) = ctx.array(x, ctx.rank) else {
        return kind.eval(&ctx.read(x)); // a uniform scalar
    };
    let map = Mapping::onto(&array, &array.view.shape);
    let len: usize = array.view.shape.iter().product();
    let mut acc = ReduceAcc::new(kind);
    if matches!(array.raw.dtype, DType::F32 | DType::F16 | DType::BF16) {
        // Every value is an f32: folded as such (exactly widened), half the bytes.
        in_chunks(len, |at, buf| {
            map.load_f32(at, buf);
            acc.fold_f32(at, buf);
        });
    } else {
        in_chunks(len, |at, buf| {
            map.load(at, buf);
            acc.fold(at, buf);
        });
    }
    acc.finish()
}

/// Calls `f(start, chunk)` for positions `0..len` in chunks of [`CHUNK`], one buffer
/// reused for all.
fn in_chunks<T: Copy + Default>(len: usize, mut f: impl FnMut(usize, &mut [T])) {
    let mut buf = vec![T::default(); CHUNK.min(len)];
    let mut start = 0;
    while start < len {
        let n = CHUNK.min(len - start);
        f(start, &mut buf[..n]);
        start += n;
    }
}
