//! Programs the checker accepts, built and inspected as a user's crate would: one program
//! that uses every operation, reduction, direction and operator of the language (const
//! and symbolic dims, scalars of several dtypes, two process groups), `#[coconet]` inside
//! `macro_rules!`, and each example program (crate `coconet-example-programs`: its
//! collectives, updates and types). A plain test binary, not trybuild: the cases run as they are, and
//! trybuild only checks the failing cases (`tests/ui.rs`) without building code.

use coconet::core::Placement;
use coconet::prelude::*;

use coconet_example_programs::{adam, lamb, megatron, pipeline, sgd};

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

#[test]
fn every_operation_in_one_program() {
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

// `#[coconet]` inside `macro_rules!`: dtypes and shapes passed as `$t:ty` arrive in
// invisible groups, which the macro looks through.
macro_rules! scaled {
    ($name:ident, $t:ty, $shape:ty) => {
        #[coconet]
        fn $name(x: Tensor<$t, Replicated, $shape>, s: $t) {
            let y = x * s;
            let z = cast::<$t>(y);
            z
        }
    };
}

scaled!(scale32, f32, [N]);
scaled!(scale64, f64, (B, N));

#[test]
fn inside_macro_rules() {
    assert_eq!(scale32().program().name(), "scale32");
    assert_eq!(scale64().program().name(), "scale64");
}

// `#[coconet(crate = path)]`: the generated code names coconet by a path of this crate —
// a re-export, as a crate that renames or wraps coconet has — written from the item's
// module (`crate::`) and from a module below it (`self::`, `super::`). The generated code
// uses only `path::core`, so a module holding `pub use coconet_core as core;` serves a
// crate that depends on coconet-core and coconet-macros alone.
mod reexport {
    pub use coconet as renamed;

    /// Only the language, under the name `core`.
    pub mod core_only {
        pub use coconet::core;
    }
}

#[coconet(crate = crate::reexport::renamed)]
fn via_reexport(g: Tensor<f32, Local, [N]>) {
    let s = all_reduce(Sum, g);
    s
}

mod hosted {
    use coconet::prelude::coconet;

    mod cc {
        pub use coconet::core;
    }

    #[coconet(crate = self::cc, schedule(sharded = sharded_update(g1, [])))]
    pub fn via_self(g: Tensor<f32, Local, [N]>, w: Tensor<f32, Replicated, [N]>, lr: f32) {
        let g1 = all_reduce(Sum, g);
        let w1 = update(w, w - lr * g1);
    }

    #[coconet(groups = 2, crate = super::reexport::core_only)]
    pub fn via_super(x: Tensor<f32, Local, [N]>) {
        let y = send(x, Next);
        y
    }
}

// `$crate` in a `macro_rules!` that writes programs for the crates that call it.
macro_rules! hosted_by_macro {
    ($name:ident) => {
        #[coconet(crate = $crate::reexport::renamed)]
        fn $name(x: Tensor<f32, Replicated, [N]>) {
            let y = x * 2.0;
            y
        }
    };
}

mod by_macro {
    use coconet::prelude::coconet;

    hosted_by_macro!(doubled);

    #[test]
    fn dollar_crate_path() {
        assert_eq!(doubled().program().name(), "doubled");
    }
}

#[test]
fn crate_path_option() {
    let p = via_reexport();
    assert_eq!(p.program().name(), "via_reexport");
    let args = via_reexport::Args {
        N: 2,
        g: TensorArg::PerRank(vec![vec![1.0, 2.0], vec![3.0, 4.0]]),
    };
    let run = p.interpret(2, args).expect("runs");
    assert_eq!(run.local::<f32>(p.s, 1), Some(vec![4.0, 6.0]));
    let p = hosted::via_self();
    assert_eq!(p.sharded().name(), "sharded");
    let _: coconet::core::handle::TensorInput<f32> = p.w;
    assert_eq!(
        hosted::via_super().program().to_string().lines().next(),
        Some("program via_super (2 groups)")
    );
}

/// The SGD example program, and it agrees with its plain-Rust reference.
#[test]
fn sgd_program() {
    let p = sgd::sgd();
    let text = p.program().to_string();
    assert!(text.contains("g1 = all_reduce(Sum, g)"), "{text}");
    assert!(text.contains("w1 = update(w,"), "{text}");
    assert_eq!(p.program().updates().count(), 1);

    let grads = vec![vec![1.0f32, 2.0, 3.0], vec![0.5, -1.0, 4.0]];
    let w = vec![1.0f32, 1.0, 1.0];
    let run = p
        .interpret(
            2,
            sgd::sgd::Args {
                N: 3,
                g: TensorArg::PerRank(grads.clone()),
                w: TensorArg::Global(w.clone()),
                lr: 0.5,
            },
        )
        .expect("runs");
    let got: Vec<f32> = run.final_input("w").expect("w was updated");
    assert_eq!(got, sgd::sgd_reference(&grads, &w, 0.5));
}

/// Adam: its collective, the step count cast, and three updates.
#[test]
fn adam_program() {
    let p = adam::adam();
    let text = p.program().to_string();
    assert!(text.contains("g1 = all_reduce(Sum, g)"), "{text}");
    assert!(text.contains("t = cast(step)"), "{text}");
    assert!(text.contains("pow("), "{text}");
    assert!(text.contains("sqrt("), "{text}");
    assert_eq!(p.program().updates().count(), 3, "{text}");
    assert!(p.program().find("w1").is_some());
}

/// LAMB: norms, the trust-ratio selects and three updates.
#[test]
fn lamb_program() {
    let p = lamb::lamb();
    let text = p.program().to_string();
    assert!(text.contains("g1 = all_reduce(Sum, g)"), "{text}");
    assert!(text.contains("r_norm = norm2(r)"), "{text}");
    assert!(text.contains("w_norm = norm2(w)"), "{text}");
    assert!(text.contains("trust = select("), "{text}");
    assert_eq!(p.program().updates().count(), 3, "{text}");
}

/// Megatron: the matmul of two Sliced operands is a Local partial sum, and the
/// all-reduce makes it Replicated.
#[test]
fn megatron_program() {
    let p = megatron::megatron();
    let prog = p.program();
    let text = prog.to_string();
    assert!(text.contains("partial = matmul(x, w)"), "{text}");
    assert!(text.contains("sum = all_reduce(Sum, partial)"), "{text}");
    assert!(text.contains("dropout("), "{text}");
    assert!(text.contains("out = layer_norm("), "{text}");
    let ty = |name: &str| &prog.node(prog.find(name).expect(name)).ty;
    assert_eq!(ty("partial").layout, Layout::Local);
    assert_eq!(ty("sum").layout, Layout::Replicated);
    assert_eq!(ty("out").dtype, DType::F16);
    assert_eq!(prog.outputs(), &[prog.find("out").unwrap()]);
}

/// The pipeline stage has two groups; its output lives in group 1.
#[test]
fn pipeline_program() {
    let p = pipeline::pipeline();
    let prog = p.program();
    let text = prog.to_string();
    assert!(text.starts_with("program pipeline (2 groups)"), "{text}");
    assert!(text.contains("sum = all_reduce(Sum, x)"), "{text}");
    assert!(text.contains("out = send(y, Next)"), "{text}");
    let out = prog.find("out").unwrap();
    assert_eq!(prog.node(out).ty.placement, Placement::Group(1));
    assert_eq!(prog.outputs(), &[out]);
}
