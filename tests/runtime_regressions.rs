//! Regression tests for runtime bugs found in review: each program runs on rank threads
//! and must equal the reference interpreter (or fail with a clear error).

use coconet::core::schedule::Schedule;
use coconet::core::*;
use coconet::runtime::cpu::{Job, RunOptions};
use coconet::runtime::{JobData, Plan, RuntimeError};

fn vals(n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 + salt * 3) % 11) as f32 - 5.0)
        .collect()
}

/// Runs `s` on `ranks` threads and compares every output and updated input with the
/// interpreter (within `tol`, relative).
fn same_as_interpreter(s: &Schedule, ranks: usize, args: &Bindings, tol: f64) {
    let want = interpret(s.program(), ranks, args).unwrap();
    let plan = Plan::lower(s, ranks, args.dims()).unwrap();
    let mut job = Job::new(&plan, args, RunOptions::default()).unwrap();
    job.run().unwrap();
    let p = s.program();
    let mut ids: Vec<ValueId> = p.outputs().to_vec();
    ids.extend(p.updates().map(|(t, _)| t));
    for id in ids {
        for r in 0..ranks {
            let (g, w): (Option<Vec<f64>>, Option<Vec<f64>>) = if p.node(id).op == Op::TensorInput {
                let name = p.label(id);
                (
                    job.final_input_local(&name, r).ok(),
                    want.final_input_local(&name, r).ok(),
                )
            } else {
                (job.local(id, r), want.local(id, r))
            };
            let (g, w) = (g.unwrap(), w.unwrap());
            for (a, b) in g.iter().zip(&w) {
                assert!(
                    (a - b).abs() <= tol * b.abs().max(1.0),
                    "`{}` on rank {r}: {a} vs {b}",
                    p.label(id)
                );
            }
        }
    }
}

#[test]
fn a_later_reader_in_the_same_kernel_sees_the_original_input() {
    let mut b = ProgramBuilder::new("reader");
    let n = Shape::new(vec![Dim::sym("N")]);
    let w = b
        .tensor_input("w", DType::F32, Layout::Replicated, n.clone(), 0)
        .unwrap();
    let g = b
        .tensor_input("g", DType::F32, Layout::Replicated, n, 0)
        .unwrap();
    let a = b.binary(BinaryOp::Add, w, g).unwrap();
    let u = b.update(w, a).unwrap();
    let later = b.binary(BinaryOp::Mul, w, 3.0).unwrap();
    b.output(later).unwrap();
    let p = b.finish();
    let mut s = Schedule::new(&p);
    s.fuse(&[a, u, later]).unwrap();
    let args = Bindings::new()
        .dim("N", 9)
        .tensor("w", Binding::global(&vals(9, 1)))
        .tensor("g", Binding::global(&vals(9, 2)));
    for ranks in [1, 3] {
        same_as_interpreter(&s, ranks, &args, 0.0);
    }
}

/// Two matmul → all-reduce layers, each fused and overlapped: each overlap waits for its
/// own chunk flags.
#[test]
fn two_overlaps_in_one_step() {
    let mut b = ProgramBuilder::new("two_layers");
    let sh = |d: &[&str]| Shape::new(d.iter().map(|x| Dim::sym(*x)).collect());
    let x = b
        .tensor_input("x", DType::F64, Layout::Sliced(1), sh(&["M", "K"]), 0)
        .unwrap();
    let w1 = b
        .tensor_input("w1", DType::F64, Layout::Sliced(0), sh(&["K", "K"]), 0)
        .unwrap();
    let w2 = b
        .tensor_input("w2", DType::F64, Layout::Sliced(0), sh(&["K", "K"]), 0)
        .unwrap();
    let mm1 = b.matmul(x, w1).unwrap();
    let ar1 = b.all_reduce(ReduceOp::Sum, mm1).unwrap();
    let h = b.unary(UnaryOp::Relu, ar1).unwrap();
    let hs = b.scatter(h, 1).unwrap();
    let mm2 = b.matmul(hs, w2).unwrap();
    let ar2 = b.all_reduce(ReduceOp::Sum, mm2).unwrap();
    let y = b.unary(UnaryOp::Tanh, ar2).unwrap();
    b.output(y).unwrap();
    let p = b.finish();
    let mut s = Schedule::new(&p);
    for ar in [ar1, ar2] {
        let (_, ag) = s.split(ar).unwrap();
        s.reorder_all(ag).unwrap();
    }
    for (mm, ar) in [(mm1, ar1), (mm2, ar2)] {
        let rs = s.program().find(&format!("{}_rs", p.label(ar))).unwrap();
        s.fuse_all_reduce(rs).unwrap();
        s.overlap(mm, rs).unwrap();
    }
    let steps = Plan::lower(
        &s,
        2,
        &[("M".into(), 6), ("K".into(), 4)].into_iter().collect(),
    )
    .unwrap()
    .steps()
    .iter()
    .filter(|st| matches!(st, coconet::runtime::PlanStep::Overlap { .. }))
    .count();
    assert_eq!(steps, 2, "both layers overlap");
    let args = Bindings::new()
        .dim("M", 6)
        .dim("K", 4)
        .tensor(
            "x",
            Binding::global(&vals(24, 1).iter().map(|&v| v as f64).collect::<Vec<_>>()),
        )
        .tensor(
            "w1",
            Binding::global(
                &vals(16, 2)
                    .iter()
                    .map(|&v| v as f64 / 4.0)
                    .collect::<Vec<_>>(),
            ),
        )
        .tensor(
            "w2",
            Binding::global(
                &vals(16, 3)
                    .iter()
                    .map(|&v| v as f64 / 4.0)
                    .collect::<Vec<_>>(),
            ),
        );
    for ranks in [2, 3] {
        same_as_interpreter(&s, ranks, &args, 1e-12);
    }
}

/// A rank whose block of the contracted dim is empty contributes zeros.
#[test]
fn matmul_with_an_empty_local_block() {
    let mut b = ProgramBuilder::new("empty_k");
    let sh = |d: &[&str]| Shape::new(d.iter().map(|x| Dim::sym(*x)).collect());
    let a = b
        .tensor_input("a", DType::F32, Layout::Sliced(1), sh(&["M", "K"]), 0)
        .unwrap();
    let w = b
        .tensor_input("w", DType::F32, Layout::Sliced(0), sh(&["K", "N"]), 0)
        .unwrap();
    let pre = b
        .tensor_input("pre", DType::F32, Layout::Local, sh(&["M", "N"]), 0)
        .unwrap();
    // A dead Local [M, N] value first, so the matmul's buffer may be a reused one.
    let junk = b.unary(UnaryOp::Exp, pre).unwrap();
    let junk2 = b.reduce_all(ReduceKind::Sum, junk).unwrap();
    let mm = b.matmul(a, w).unwrap();
    let s = b.all_reduce(ReduceOp::Sum, mm).unwrap();
    b.output(s).unwrap();
    b.output(junk2).unwrap();
    let p = b.finish();
    let args = Bindings::new()
        .dim("M", 3)
        .dim("K", 2)
        .dim("N", 2)
        .tensor("a", Binding::global(&vals(6, 1)))
        .tensor("w", Binding::global(&vals(4, 2)))
        .tensor("pre", Binding::global(&vals(6, 3)));
    same_as_interpreter(&Schedule::new(&p), 4, &args, 1e-6);
}

#[test]
fn returning_an_updated_input_is_a_clear_plan_error() {
    let mut b = ProgramBuilder::new("alias");
    let n = Shape::new(vec![Dim::sym("N")]);
    let w = b
        .tensor_input("w", DType::F32, Layout::Replicated, n, 0)
        .unwrap();
    let neg = b.unary(UnaryOp::Neg, w).unwrap();
    b.update(w, neg).unwrap();
    let view = b.scatter(w, 0).unwrap();
    b.output(view).unwrap();
    let p = b.finish();
    let err = Plan::lower(
        &Schedule::new(&p),
        2,
        &[("N".into(), 4)].into_iter().collect(),
    )
    .unwrap_err();
    assert!(
        matches!(err, RuntimeError::Plan(ref m) if m.contains("also updates")),
        "{err}"
    );
}

/// A fused group whose all-gather reads a view (a scatter) runs unfused instead of
/// panicking in the fused kernel.
#[test]
fn a_gather_of_a_view_inside_a_fused_group() {
    let mut b = ProgramBuilder::new("regather");
    let n = Shape::new(vec![Dim::sym("N")]);
    let x = b
        .tensor_input("x", DType::F32, Layout::Local, n, 0)
        .unwrap();
    let rs = b.reduce_scatter(ReduceOp::Sum, x, 0).unwrap();
    let e = b.binary(BinaryOp::Mul, rs, 2.0).unwrap();
    let ag1 = b.all_gather(e).unwrap();
    let view = b.scatter(ag1, 0).unwrap();
    let ag2 = b.all_gather(view).unwrap();
    b.output(ag2).unwrap();
    let p = b.finish();
    let mut s = Schedule::new(&p);
    s.fuse(&[rs, e, ag1, view, ag2]).unwrap();
    let args = Bindings::new()
        .dim("N", 7)
        .tensor("x", Binding::global(&vals(7, 4)));
    same_as_interpreter(&s, 3, &args, 0.0);
}

/// The overlapped schedule of `op(all_reduce(x × w))`, `x` `[B, S, K]` sliced on `K`,
/// `w` `[K, N]` sliced on `K`, in `dtype`.
fn overlapped_matmul(dtype: DType, op: UnaryOp) -> Schedule {
    let mut b = ProgramBuilder::new("overlapped");
    let sh = |d: &[&str]| Shape::new(d.iter().map(|x| Dim::sym(*x)).collect());
    let x = b
        .tensor_input("x", dtype, Layout::Sliced(2), sh(&["B", "S", "K"]), 0)
        .unwrap();
    let w = b
        .tensor_input("w", dtype, Layout::Sliced(0), sh(&["K", "N"]), 0)
        .unwrap();
    let mm = b.matmul(x, w).unwrap();
    let ar = b.all_reduce(ReduceOp::Sum, mm).unwrap();
    let y = b.unary(op, ar).unwrap();
    b.output(y).unwrap();
    let p = b.finish();
    let s = coconet::core::schedule::candidates(&p, &[]).pop().unwrap();
    assert!(s.name().starts_with("ol("), "{}", s.name());
    s
}

/// An overlapped matmul whose middle dim is empty produces nothing and does not panic.
#[test]
fn an_overlapped_matmul_with_an_empty_middle_dim() {
    let s = overlapped_matmul(DType::F32, UnaryOp::Relu);
    let args = Bindings::new()
        .dim("B", 3)
        .dim("S", 0)
        .dim("K", 4)
        .dim("N", 4)
        .tensor("x", Binding::global(&[0.0f32; 0]))
        .tensor("w", Binding::global(&vals(16, 5)));
    same_as_interpreter(&s, 2, &args, 0.0);
}

/// The cost model prices an overlapped matmul with an empty first dim (no pieces) as a
/// finite time, on rank threads and on GPUs (it divided by the pieces: forever).
#[test]
fn an_overlapped_matmul_with_an_empty_first_dim_is_priced() {
    use coconet::runtime::model::{Machine, predict};
    let s = overlapped_matmul(DType::F32, UnaryOp::Relu);
    let dims = [("B", 0), ("S", 3), ("K", 4), ("N", 4)]
        .into_iter()
        .map(|(d, n)| (d.to_string(), n))
        .collect();
    let plan = Plan::lower(&s, 2, &dims).unwrap();
    let gpu = Machine::preset("dgx-h100").unwrap();
    let cpu = Machine {
        compute_overlaps_memory: false,
        links: None,
        ..gpu.clone()
    };
    for m in [gpu, cpu] {
        let t = predict(&plan, &m).total;
        assert!(t < std::time::Duration::from_secs(1), "{t:?}");
    }
}

/// An overlapped matmul handed over in pieces smaller than a first-dim index, to
/// blocks of unequal length (5 indices over 3 and 4 ranks; 3 over 2; 1 over 4): each
/// rank computes its pieces between its own chunks, and the result is the
/// interpreter's.
#[test]
fn an_overlapped_matmul_in_pieces_over_uneven_blocks() {
    let s = overlapped_matmul(DType::F64, UnaryOp::Tanh);
    let f64s =
        |n: usize, seed: usize| -> Vec<f64> { vals(n, seed).iter().map(|&v| v as f64).collect() };
    for (batch, ranks) in [(5, 3), (5, 4), (3, 2), (1, 4)] {
        let (seq, k, n) = (7, 12, 9);
        let args = Bindings::new()
            .dim("B", batch)
            .dim("S", seq)
            .dim("K", k)
            .dim("N", n)
            .tensor("x", Binding::global(&f64s(batch * seq * k, 3)))
            .tensor("w", Binding::global(&f64s(k * n, 4)));
        same_as_interpreter(&s, ranks, &args, 1e-12);
    }
}

/// `a = x * 2; b = exp(a); c = b * 3`: `c` takes over `a`'s memory, so reading `a`
/// after a run returned `c`'s values. Now the read is refused (naming `c`), and a plan
/// lowered to observe `a` keeps it.
#[test]
fn an_intermediate_whose_memory_was_reused_is_not_read_as_another_value() {
    let mut b = ProgramBuilder::new("chain");
    let n = Shape::new(vec![Dim::sym("N")]);
    let x = b
        .tensor_input("x", DType::F32, Layout::Replicated, n, 0)
        .unwrap();
    let a = b.binary(BinaryOp::Mul, x, 2.0).unwrap();
    b.bind(a, "a").unwrap();
    let e = b.unary(UnaryOp::Exp, a).unwrap();
    let c = b.binary(BinaryOp::Mul, e, 3.0).unwrap();
    b.bind(c, "c").unwrap();
    b.output(c).unwrap();
    let p = b.finish();
    let args = Bindings::new().dim("N", 5).tensor(
        "x",
        Binding::global(&vals(5, 1).iter().map(|v| v / 8.0).collect::<Vec<_>>()),
    );
    let s = Schedule::new(&p);
    let want = interpret(&p, 2, &args).unwrap();
    let plan = Plan::lower(&s, 2, args.dims()).unwrap();
    let mut job = Job::new(&plan, &args, RunOptions::default()).unwrap();
    job.run().unwrap();
    assert_eq!(
        job.logical::<f32>(c).unwrap(),
        want.logical::<f32>(c).unwrap()
    );
    match job.logical::<f32>(a) {
        Ok(got) => assert_eq!(
            got,
            want.logical::<f32>(a).unwrap(),
            "`a` read as another value"
        ),
        Err(e) => assert!(e.to_string().contains("`a`"), "{e}"),
    }
    assert!(plan.unreadable(a).is_some() || job.logical::<f32>(a).is_ok());
    let kept = Plan::lower_observing(&s, 2, args.dims(), &[a]).unwrap();
    assert_eq!(kept.unreadable(a), None);
    let mut job = Job::new(&kept, &args, RunOptions::default()).unwrap();
    job.run().unwrap();
    assert_eq!(
        job.logical::<f32>(a).unwrap(),
        want.logical::<f32>(a).unwrap()
    );
    assert_eq!(
        job.logical::<f32>(c).unwrap(),
        want.logical::<f32>(c).unwrap()
    );
}

/// `select(a > 0, b, c)` broadcast from `[X,1,1]`, `[1,Y,1]`, `[Z]`: at X = Y = Z = 2^21
/// the result's byte size wrapped around (a segfault in a kernel's copy), at 2^22 its
/// element count did (a silent `-0.0`). Both are errors at lowering and interpretation.
#[test]
fn shapes_whose_size_overflows_are_errors_not_wrapped_buffers() {
    let mut b = ProgramBuilder::new("outer");
    let sym = |s: &str| Dim::sym(s);
    let a = b
        .tensor_input(
            "a",
            DType::F32,
            Layout::Replicated,
            Shape::new(vec![sym("X"), Dim::Const(1), Dim::Const(1)]),
            0,
        )
        .unwrap();
    let bb = b
        .tensor_input(
            "b",
            DType::F32,
            Layout::Replicated,
            Shape::new(vec![Dim::Const(1), sym("Y"), Dim::Const(1)]),
            0,
        )
        .unwrap();
    let c = b
        .tensor_input(
            "c",
            DType::F32,
            Layout::Replicated,
            Shape::new(vec![sym("Z")]),
            0,
        )
        .unwrap();
    let pos = b.binary(BinaryOp::Gt, a, 0.0).unwrap();
    let s = b.select(pos, bb, c).unwrap();
    b.output(s).unwrap();
    let p = b.finish();
    for k in [21, 22] {
        let n = 1usize << k;
        let args = Bindings::new()
            .dim("X", n)
            .dim("Y", n)
            .dim("Z", n)
            .tensor("a", Binding::global(&vec![1.0f32; n]))
            .tensor("b", Binding::global(&vec![2.0f32; n]))
            .tensor("c", Binding::global(&vec![3.0f32; n]));
        let e = Plan::lower(&Schedule::new(&p), 1, args.dims()).unwrap_err();
        assert!(
            matches!(e, RuntimeError::Binding(InterpError::TooLarge { .. })),
            "2^{k}: {e}"
        );
        assert!(e.to_string().contains("select"), "{e}");
        let e = interpret(&p, 1, &args).unwrap_err();
        assert!(matches!(e, InterpError::TooLarge { .. }), "2^{k}: {e}");
    }
}

/// A 2^40-element intermediate aborted the process ("memory allocation failed") in both
/// `Job::new` and `interpret`; it is an out-of-memory error naming the value.
#[test]
fn an_intermediate_too_large_for_memory_is_an_error_not_an_abort() {
    let mut b = ProgramBuilder::new("huge");
    let x = b
        .tensor_input(
            "x",
            DType::F32,
            Layout::Replicated,
            Shape::new(vec![Dim::sym("X"), Dim::Const(1)]),
            0,
        )
        .unwrap();
    let y = b
        .tensor_input(
            "y",
            DType::F32,
            Layout::Replicated,
            Shape::new(vec![Dim::sym("Y")]),
            0,
        )
        .unwrap();
    let outer = b.binary(BinaryOp::Mul, x, y).unwrap();
    b.bind(outer, "outer").unwrap();
    b.output(outer).unwrap();
    let p = b.finish();
    let n = 1usize << 20;
    let args = Bindings::new()
        .dim("X", n)
        .dim("Y", n)
        .tensor("x", Binding::global(&vec![1.0f32; n]))
        .tensor("y", Binding::global(&vec![2.0f32; n]));
    let plan = Plan::lower(&Schedule::new(&p), 2, args.dims()).unwrap();
    let e = Job::new(&plan, &args, RunOptions::default()).unwrap_err();
    assert!(
        matches!(e, RuntimeError::Binding(InterpError::OutOfMemory { .. })),
        "{e}"
    );
    let e = interpret(&p, 2, &args).unwrap_err();
    assert!(matches!(e, InterpError::OutOfMemory { .. }), "{e}");
    assert!(e.to_string().contains("outer"), "{e}");
}

/// A fused step whose update reads a scalar computed from a Local value (`lr / Σ cnt`
/// over ranks) keeps its one-pass fused all-reduce: only scalars computed from the
/// reductions a second pass exists for come into the group.
#[test]
fn a_scalar_from_a_local_value_keeps_the_fused_all_reduce_one_pass() {
    use coconet::core::schedule::candidates;
    use coconet::runtime::PlanStep;
    let mut b = ProgramBuilder::new("scaled");
    let n = || Shape::new(vec![Dim::sym("N")]);
    let g = b
        .tensor_input("g", DType::F32, Layout::Local, n(), 0)
        .unwrap();
    let cnt = b
        .tensor_input("cnt", DType::F32, Layout::Local, n(), 0)
        .unwrap();
    let w = b
        .tensor_input("w", DType::F32, Layout::Replicated, n(), 0)
        .unwrap();
    let lr = b.scalar_input("lr", DType::F32).unwrap();
    let ar = b.all_reduce(ReduceOp::Sum, g).unwrap();
    let local = b.reduce_all(ReduceKind::Sum, cnt).unwrap();
    let total = b.all_reduce(ReduceOp::Sum, local).unwrap();
    let inv = b.binary(BinaryOp::Div, lr, total).unwrap();
    let step = b.binary(BinaryOp::Mul, ar, inv).unwrap();
    let w1 = b.binary(BinaryOp::Sub, w, step).unwrap();
    b.update(w, w1).unwrap();
    let p = b.finish();
    let fused = candidates(&p, &[])
        .into_iter()
        .find(|s| s.name() == "fuse(RS-C-AG)")
        .expect("a fused schedule");
    let args = Bindings::new()
        .dim("N", 4099)
        .tensor(
            "g",
            Binding::per_rank(&[vals(4099, 1), vals(4099, 2), vals(4099, 3)]),
        )
        .tensor(
            "cnt",
            Binding::per_rank(&[vals(4099, 4), vals(4099, 5), vals(4099, 6)]),
        )
        .tensor("w", Binding::global(&vals(4099, 7)))
        .scalar("lr", 0.5f32);
    let plan = Plan::lower(&fused, 3, args.dims()).unwrap();
    let one_pass = plan
        .steps()
        .iter()
        .any(|s| matches!(s, PlanStep::FusedAllReduce(f) if !f.gathers.is_empty()));
    assert!(one_pass, "{:?}", plan.steps());
    same_as_interpreter(&fused, 3, &args, 0.0);
}

/// The trainer's clipped AdamW: the first pass reduces the gradients and folds their
/// partial norm, nothing else (the moments' `beta1 * m` would be stored and read back);
/// the second pass computes the whole update and sends it to every peer. One buffer:
/// each rank's reduced block.
#[test]
fn clipped_adamw_runs_in_two_passes_with_one_buffer() {
    use coconet::core::schedule::candidates;
    use coconet::prelude::TensorArg;
    use coconet::runtime::PlanStep;
    let p = coconet::programs::adamw_clipped();
    let fused = candidates(p.program(), &[p.m.id(), p.v.id()])
        .into_iter()
        .find(|s| s.name() == "fuse(RS-C-AG)")
        .expect("a fused schedule");
    let n = 9001;
    let args: Bindings = coconet::programs::adamw_clipped::Args {
        N: n,
        g: TensorArg::PerRank((1..4).map(|r| vals(n, r)).collect()),
        w: TensorArg::Global(vals(n, 7)),
        m: TensorArg::Global(vals(n, 8)),
        v: TensorArg::Global(vals(n, 9).iter().map(|x| x * x).collect()),
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        max_norm: 1.0,
        step: 3,
    }
    .into();
    let plan = Plan::lower(&fused, 3, args.dims()).unwrap();
    let passes: Vec<String> = plan
        .steps()
        .iter()
        .filter_map(|s| match s {
            PlanStep::FusedAllReduce(f) => Some(format!(
                "reduce {} stages {} folds {} gathers",
                f.kernel.len(),
                f.reductions.len(),
                f.gathers.len()
            )),
            PlanStep::FusedAllGather(f) => Some(format!("gather {} gathers", f.gathers.len())),
            _ => None,
        })
        .collect();
    assert_eq!(
        passes,
        ["reduce 1 stages 1 folds 0 gathers", "gather 1 gathers"],
        "{:?}",
        plan.steps()
    );
    assert_eq!(
        plan.slot_bytes(),
        n.div_ceil(3) * 4 + 2 * 4,
        "{:?}",
        plan.slots()
    );
    same_as_interpreter(&fused, 3, &args, 0.0);
}
