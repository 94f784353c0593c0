//! Rank-local operations that are not pointwise: matmul (gemm), full reductions, layer
//! normalisation. Computed in f64 and rounded to the result's dtype.

use super::exec::Ctx;
use super::kernel::round;
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
            matmul_rows(&ctx.read(a), &ctx.read(b), &mut out, k, n, 0..m);
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

/// `out[rows, ..] = a[rows, ..] × b` for row-major `a` `[M, K]`, `b` `[K, N]`, `out`
/// `[M, N]` (gemm, single-threaded: the ranks are the parallelism).
pub fn matmul_rows(
    a: &[f64],
    b: &[f64],
    out: &mut [f64],
    k: usize,
    n: usize,
    rows: std::ops::Range<usize>,
) {
    let m = rows.len();
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out[rows.start * n..rows.end * n].fill(0.0);
        return;
    }
    assert!(a.len() >= rows.end * k && b.len() >= k * n && out.len() >= rows.end * n);
    // SAFETY: the slices are in bounds (asserted) and row-major with the strides given.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr().add(rows.start * n),
            1,
            n as isize,
            false,
            a.as_ptr().add(rows.start * k),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}
