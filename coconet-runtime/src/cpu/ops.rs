//! Rank-local operations that are not pointwise: matmul (gemm), full reductions, layer
//! normalisation. Reductions and layer norm compute in f64 and round to the result's
//! dtype, as the interpreter does; matmul runs in the dtype's working precision (see
//! [`super::matmul`]).

use super::exec::Ctx;
use super::kernel::round;
use super::matmul::MatMul;
use coconet_core::{Op, ValueId};

/// Runs one rank-local operation of this rank.
pub fn run(ctx: &Ctx, v: ValueId) {
    let p = ctx.plan.program();
    let node = p.node(v);
    let mut out = match node.op {
        Op::MatMul(a, b) => {
            let (sa, sb) = (ctx.local_shape(a, ctx.rank), ctx.local_shape(b, ctx.rank));
            let (k, n) = (sb[0], sb[1]);
            let m = sa[..sa.len() - 1].iter().product::<usize>();
            let mut out = vec![0.0; m * n];
            MatMul::new(node.ty.dtype, &ctx.read(a), &ctx.read(b), k, n).rows(0..m, &mut out);
            out
        }
        Op::ReduceAll(kind, x) => vec![kind.eval(&ctx.read(x))],
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
                coconet_core::layer_norm_row(row, &g, &b, e, out);
            }
            y
        }
        ref op => unreachable!("{} is not a rank-local operation", op.name()),
    };
    round(node.ty.dtype, &mut out);
    ctx.write(v, &out);
}
