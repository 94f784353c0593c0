//! One program that uses every operation, reduction, direction and operator of the
//! language at least once, with const and symbolic dims, scalars of several dtypes and
//! two process groups.

use coconet::prelude::*;

#[coconet(groups = 2)]
fn kitchen_sink(
    x: Tensor<f32, Local, (B, H)>,
    w: Tensor<f32, Replicated, (H, Const<4>)>,
    bias: Tensor<f32, Replicated, [H]>,
    gamma: Tensor<f32, Replicated, [H]>,
    beta: Tensor<f32, Replicated, [H]>,
    state: Tensor<f32, Replicated, (B, H)>,
    counts: Tensor<i64, Local, [N]>,
    mask: Tensor<bool, Replicated, ()>,
    half_in: Tensor<f16, Replicated, [H], Group<1>>,
    wide: Tensor<bf16, Replicated, [H]>,
    precise: Tensor<f64, Replicated, [H]>,
    small: Tensor<i32, Replicated, [H]>,
    lr: f32,
    seed: i64,
    step: i32,
) {
    // Collectives, with every reduction.
    let summed = all_reduce(Sum, x);
    let prod = all_reduce(Prod, x);
    let avg = all_reduce(Avg, x);
    let rs_max = reduce_scatter(Max, x, 1);
    let rs_min = reduce_scatter(Min, x);
    let gathered = all_gather(rs_max);
    let gathered_rows = all_gather(rs_min);
    let bcast = broadcast(x, 0);
    let reduced = reduce(Sum, x, 1);
    let rows = scatter(summed);
    let cols = scatter(summed, 1);
    let count_sum = all_reduce(Sum, counts);

    // Arithmetic, comparisons and unary minus.
    let arith = (summed + prod - avg * gathered) / (gathered_rows + 2.0);
    let neg = -bcast;
    let lt = summed < avg;
    let le = summed <= avg;
    let gt = summed > 0.0;
    let ge = summed >= 0.0;
    let eq = summed == avg;
    let ne = summed != avg;
    let picked = select(gt, arith, neg);
    let picked2 = select(mask, picked, 0.0);

    // Named binary ops and unary math.
    let powered = pow(summed, 2.0);
    let lo = min(powered, 1.0);
    let hi = max(lo, -1.0);
    let unary = abs(hi) + sqrt(abs(hi)) + rsqrt(abs(hi) + 1.0) + exp(hi) + log(abs(hi) + 1.0);
    let act = tanh(unary) + relu(unary) + gelu(unary);

    // Reductions to scalars.
    let total = reduce_sum(act);
    let biggest = reduce_max(act);
    let smallest = reduce_min(act);
    let norm = norm2(act);

    // Linear algebra, casts, dropout, layer norm.
    let projected = matmul(act, w);
    let as_f64 = cast::<f64>(projected);
    let step_f = cast::<f32>(step);
    let wide_f = cast::<f32>(wide) + cast::<f32>(precise) + cast::<f32>(small);
    let dropped = dropout(act + bias + wide_f, 0.1, seed);
    let normed = layer_norm(dropped, gamma, beta, 0.00001);
    let local_sum = reduced + x;
    let sliced = rows * 2.0 + summed;

    // Updates and point-to-point between groups.
    let state1 = update(state, state - lr * step_f * normed);
    let there = send(normed, Next);
    let moved = there + cast::<f32>(half_in);
    let back = send(moved, Prev);
    back
}

fn main() {
    let p = kitchen_sink();
    let prog = p.program();
    let text = prog.to_string();
    let collectives = [
        "all_reduce(Sum, x)",
        "all_reduce(Prod, x)",
        "all_reduce(Avg, x)",
        "reduce_scatter(Max, x, dim=1)",
        "reduce_scatter(Min, x, dim=0)",
        "broadcast(x, root=0)",
        "reduce(Sum, x, root=1)",
        "scatter(summed, dim=0)",
        "scatter(summed, dim=1)",
        "send(normed, Next)",
        "send(moved, Prev)",
    ];
    let others = "all_gather update matmul select cast dropout layer_norm pow min max \
                  reduce_sum reduce_max reduce_min norm2 abs sqrt rsqrt exp log tanh relu \
                  gelu add sub mul div neg lt le gt ge eq ne";
    let ops = collectives.into_iter().chain(others.split_whitespace());
    for op in ops {
        let call = if op.contains('(') {
            format!(" = {op} :")
        } else {
            format!(" = {op}(")
        };
        assert!(text.contains(&call), "`{call}` missing from\n{text}");
    }
    let ty = |name: &str| &prog.node(prog.find(name).expect(name)).ty;
    assert_eq!(ty("rs_max").layout, Layout::Sliced(1));
    assert_eq!(ty("rs_min").layout, Layout::Sliced(0));
    assert_eq!(ty("gathered").layout, Layout::Replicated);
    assert_eq!(ty("reduced").layout, Layout::Local);
    assert_eq!(ty("rows").layout, Layout::Sliced(0));
    assert_eq!(ty("cols").layout, Layout::Sliced(1));
    assert_eq!(ty("sliced").layout, Layout::Sliced(0));
    assert_eq!(ty("as_f64").dtype, DType::F64);
    assert_eq!(ty("lt").dtype, DType::Bool);
    assert_eq!(ty("projected").shape.to_string(), "[B, 4]");
    assert_eq!(ty("total").shape.rank(), 0);
    assert_eq!(prog.outputs(), &[prog.find("back").unwrap()]);
    assert_eq!(prog.updates().count(), 1);
    // Typed handles exist for every input and named stage.
    let _: coconet::core::handle::TensorInput<f16> = p.half_in;
    let _: coconet::core::handle::Stage<f32> = p.back;
}
