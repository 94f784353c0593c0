//! Each transformation's preconditions (clear errors) and regression tests for the
//! original CoCoNet's scheduling bugs.

use coconet_core::Collective;
use coconet_core::schedule::{FusionKind, Schedule, candidates};
use coconet_core::*;

fn n() -> Shape {
    Shape::new(vec![Dim::sym("N")])
}

fn bh() -> Shape {
    Shape::new(vec![Dim::sym("B"), Dim::sym("H")])
}

/// `y = all_reduce(x) + bias` with a bias broadcast along the reduce-scatter's dim.
fn bias_program() -> (Program, ValueId, ValueId) {
    let mut b = ProgramBuilder::new("bias");
    let x = b
        .tensor_input("x", DType::F32, Layout::Local, bh(), 0)
        .unwrap();
    let bias = b
        .tensor_input(
            "bias",
            DType::F32,
            Layout::Replicated,
            Shape::new(vec![Dim::sym("H")]),
            0,
        )
        .unwrap();
    let ar = b.all_reduce(ReduceOp::Sum, x).unwrap();
    b.bind(ar, "ar").unwrap();
    let y = b.binary(BinaryOp::Add, ar, bias).unwrap();
    b.bind(y, "y").unwrap();
    b.output(y).unwrap();
    (b.finish(), ar, y)
}

fn bias_args() -> Bindings {
    let x: Vec<Vec<f32>> = (0..3)
        .map(|r| (0..10).map(|i| (i * (r + 1)) as f32).collect())
        .collect();
    Bindings::new()
        .dim("B", 5)
        .dim("H", 2)
        .tensor("x", Binding::per_rank(&x))
        .tensor("bias", Binding::global(&[100.0f32, 200.0]))
}

/// Regression (original bug): `reorder` sliced every Replicated tensor, including a
/// bias broadcast along the sliced dim. Ours leaves it whole, and the values agree.
#[test]
fn reorder_keeps_broadcast_operands_whole() {
    let (p, ar, y) = bias_program();
    let mut s = Schedule::new(&p);
    let (_, ag) = s.split(ar).unwrap();
    assert_eq!(ag, ar);
    let made = s.reorder(&[y], ag).unwrap();
    let q = s.program();
    assert!(
        q.ids().all(|v| !matches!(q.node(v).op, Op::Scatter(..))),
        "the bias was sliced:\n{q}"
    );
    assert_eq!(made.gathers.len(), 1, "the output is re-gathered");
    let want = interpret(&p, 3, &bias_args())
        .unwrap()
        .logical::<f32>(y)
        .unwrap();
    let got = interpret(q, 3, &bias_args())
        .unwrap()
        .logical::<f32>(y)
        .unwrap();
    assert_eq!(got, want);
}

/// Regression: the original's split into reduce + broadcast was declared but ignored.
#[test]
fn split_into_reduce_and_broadcast() {
    let (p, ar, y) = bias_program();
    let mut s = Schedule::new(&p);
    let (red, bc) = s.split_reduce_broadcast(ar, 1).unwrap();
    assert!(matches!(
        s.program().node(red).op,
        Op::Collective(Collective::Reduce(ReduceOp::Sum, 1), _)
    ));
    assert!(matches!(
        s.program().node(bc).op,
        Op::Collective(Collective::Broadcast(1), _)
    ));
    let want = interpret(&p, 3, &bias_args())
        .unwrap()
        .logical::<f32>(y)
        .unwrap();
    let got = interpret(s.program(), 3, &bias_args())
        .unwrap()
        .logical::<f32>(y)
        .unwrap();
    assert_eq!(got, want);
}

/// Regression (original bug): the fusion cycle check could never fire.
#[test]
fn fusing_around_an_outside_stage_is_a_cycle() {
    let mut b = ProgramBuilder::new("cycle");
    let x = b
        .tensor_input("x", DType::F32, Layout::Replicated, n(), 0)
        .unwrap();
    let a = b.unary(UnaryOp::Exp, x).unwrap();
    let mid = b.unary(UnaryOp::Log, a).unwrap();
    b.bind(mid, "mid").unwrap();
    let c = b.binary(BinaryOp::Add, a, mid).unwrap();
    b.output(c).unwrap();
    let p = b.finish();
    let mut s = Schedule::new(&p);
    let e = s.fuse(&[a, c]).unwrap_err();
    assert!(
        e.message.contains("cycle") && e.message.contains("`mid`"),
        "{e}"
    );
    assert_eq!(s.fuse(&[a, mid, c]).unwrap(), 0);
    assert_eq!(s.fusions()[0].kind, FusionKind::Computation);
}

#[test]
fn fusion_holds_one_collective() {
    let mut b = ProgramBuilder::new("two");
    let x = b
        .tensor_input("x", DType::F32, Layout::Local, n(), 0)
        .unwrap();
    let a1 = b.all_reduce(ReduceOp::Sum, x).unwrap();
    let a2 = b.all_reduce(ReduceOp::Max, x).unwrap();
    let y = b.binary(BinaryOp::Add, a1, a2).unwrap();
    b.output(y).unwrap();
    let p = b.finish();
    let mut s = Schedule::new(&p);
    let e = s.fuse(&[a1, a2, y]).unwrap_err();
    assert!(e.message.contains("one collective"), "{e}");
    assert!(s.fuse(&[a1, y]).is_ok());
    let e = s.fuse(&[a2, y]).unwrap_err();
    assert!(e.message.contains("already in fusion group 0"), "{e}");
}

#[test]
fn matmuls_overlap_instead_of_fusing() {
    let mut b = ProgramBuilder::new("mm");
    let x = b
        .tensor_input("x", DType::F32, Layout::Local, bh(), 0)
        .unwrap();
    let w = b
        .tensor_input(
            "w",
            DType::F32,
            Layout::Replicated,
            Shape::new(vec![Dim::sym("H"), Dim::sym("H")]),
            0,
        )
        .unwrap();
    let mm = b.matmul(x, w).unwrap();
    let ar = b.all_reduce(ReduceOp::Sum, mm).unwrap();
    let total = b.reduce_all(ReduceKind::Sum, ar).unwrap();
    b.output(total).unwrap();
    let p = b.finish();
    let mut s = Schedule::new(&p);
    assert!(
        s.fuse(&[mm, ar])
            .unwrap_err()
            .message
            .contains("overlap it")
    );
    // The consumer is a collective reading the matmul.
    let e = s.overlap(mm, total).unwrap_err();
    assert!(e.message.contains("must be a collective"), "{e}");
    let e = s.overlap(x, ar).unwrap_err();
    assert!(e.message.contains("producer"), "{e}");
    s.overlap(mm, ar).unwrap();
    assert!(
        s.overlap(mm, ar)
            .unwrap_err()
            .message
            .contains("already overlapped")
    );
    // A full reduction cannot run chunk by chunk.
    let mut s = Schedule::new(&p);
    s.fuse(&[ar, total]).unwrap();
    assert!(
        s.overlap(mm, ar)
            .unwrap_err()
            .message
            .contains("full reduction")
    );
}

#[test]
fn preconditions_name_what_failed() {
    let (p, ar, y) = bias_program();
    let mut s = Schedule::new(&p);
    assert!(
        s.split(y)
            .unwrap_err()
            .message
            .contains("not an all_reduce")
    );
    assert!(
        s.split_along(ar, 2)
            .unwrap_err()
            .message
            .contains("along dim 2")
    );
    assert!(
        s.reorder(&[y], ar)
            .unwrap_err()
            .message
            .contains("not an all_gather")
    );
    let (rs, ag) = s.split(ar).unwrap();
    assert!(
        s.reorder(&[], ag)
            .unwrap_err()
            .message
            .contains("no computations")
    );
    assert!(
        s.reorder(&[rs], ag)
            .unwrap_err()
            .message
            .contains("only computations")
    );
    let x = p.find("x").unwrap();
    assert!(
        s.as_slice(&[x])
            .unwrap_err()
            .message
            .contains("not a Replicated tensor input")
    );
    let bias = p.find("bias").unwrap();
    s.reorder(&[y], ag).unwrap();
    // The bias is read whole (broadcast), so it cannot be stored sliced.
    let e = s.as_slice(&[bias]).unwrap_err();
    assert!(e.message.contains("read whole"), "{e}");
    // `y` is now the all-gather of `y_slice`; leaving the slice out would be a cycle.
    assert!(s.fuse(&[rs, y]).unwrap_err().message.contains("cycle"));
    let y_slice = s.program().find("y_slice").unwrap();
    s.fuse(&[rs, y_slice, y]).unwrap();
    // Rewrites after annotations are refused.
    assert!(
        s.eliminate_dead_code()
            .unwrap_err()
            .message
            .contains("fuse and overlap")
    );
    assert!(
        s.fuse(&[ValueId(999), y])
            .unwrap_err()
            .message
            .contains("not a value")
    );
}

#[test]
fn fused_stages_must_share_a_group() {
    let mut b = ProgramBuilder::new("groups");
    b.set_groups(2).unwrap();
    let x = b
        .tensor_input("x", DType::F32, Layout::Local, n(), 0)
        .unwrap();
    let y = b
        .tensor_input("y", DType::F32, Layout::Local, n(), 1)
        .unwrap();
    let a = b.unary(UnaryOp::Neg, x).unwrap();
    let c = b.unary(UnaryOp::Neg, y).unwrap();
    b.output(a).unwrap();
    b.output(c).unwrap();
    let p = b.finish();
    let e = Schedule::new(&p).fuse(&[a, c]).unwrap_err();
    assert!(e.message.contains("different process groups"), "{e}");
}

#[test]
fn dead_code_elimination_keeps_outputs_updates_and_inputs() {
    let mut b = ProgramBuilder::new("dce");
    let x = b
        .tensor_input("x", DType::F32, Layout::Replicated, n(), 0)
        .unwrap();
    let unused = b
        .tensor_input("unused", DType::F32, Layout::Replicated, n(), 0)
        .unwrap();
    let dead = b.unary(UnaryOp::Exp, x).unwrap();
    let _dead2 = b.unary(UnaryOp::Log, dead).unwrap();
    let y = b.unary(UnaryOp::Neg, x).unwrap();
    let u = b.update(x, y).unwrap();
    let p = b.finish();
    let mut s = Schedule::new(&p);
    assert_eq!(s.eliminate_dead_code().unwrap(), 2);
    for v in [x, unused, y, u] {
        assert!(s.program().contains(v));
    }
    assert!(!s.program().contains(dead));
    assert_eq!(s.eliminate_dead_code().unwrap(), 0);
}

/// Regression: the original "autotuner" only printed three candidates. Ours returns
/// schedules that run, with an overlap candidate when a matmul feeds the all-reduce.
#[test]
fn candidates_are_runnable_schedules() {
    let mut b = ProgramBuilder::new("layer");
    let x = b
        .tensor_input("x", DType::F32, Layout::Sliced(1), bh(), 0)
        .unwrap();
    let w = b
        .tensor_input(
            "w",
            DType::F32,
            Layout::Sliced(0),
            Shape::new(vec![Dim::sym("H"), Dim::sym("H")]),
            0,
        )
        .unwrap();
    let mm = b.matmul(x, w).unwrap();
    let ar = b.all_reduce(ReduceOp::Sum, mm).unwrap();
    let y = b.unary(UnaryOp::Relu, ar).unwrap();
    b.output(y).unwrap();
    let p = b.finish();
    let all = candidates(&p, &[]);
    let names: Vec<_> = all.iter().map(Schedule::name).collect();
    assert_eq!(
        names,
        [
            "MM-AR-C",
            "MM-RS-C-AG",
            "fuse(RS-C-AG)",
            "ol(MM, fuse(RS-C-AG))"
        ]
    );
    let xs: Vec<f32> = (0..12).map(|i| i as f32 - 5.0).collect();
    let ws: Vec<f32> = (0..9).map(|i| (i % 4) as f32 - 1.5).collect();
    let args = Bindings::new()
        .dim("B", 4)
        .dim("H", 3)
        .tensor("x", Binding::global(&xs))
        .tensor("w", Binding::global(&ws));
    let want = interpret(&p, 2, &args).unwrap().logical::<f32>(y).unwrap();
    for s in &all {
        let got = interpret(s.program(), 2, &args)
            .unwrap()
            .logical::<f32>(y)
            .unwrap();
        assert_eq!(got, want, "{}", s.name());
    }
    let text = all[3].to_string();
    assert!(text.contains("overlap:") && text.contains("[f0]"), "{text}");
    let dot = all[3].to_dot();
    assert!(dot.contains("subgraph cluster_f0") && dot.contains("style=dashed"));
}

/// `candidates(p, &[g])` with a Local gradient as "state" returned only AR-C and no
/// reason; `candidates_explained` says why the sharded schedules were left out.
#[test]
fn left_out_candidates_come_with_a_reason() {
    let mut b = ProgramBuilder::new("sgd");
    let g = b
        .tensor_input("g", DType::F32, Layout::Local, n(), 0)
        .unwrap();
    let w = b
        .tensor_input("w", DType::F32, Layout::Replicated, n(), 0)
        .unwrap();
    let g1 = b.all_reduce(ReduceOp::Sum, g).unwrap();
    b.bind(g1, "g1").unwrap();
    let step = b.binary(BinaryOp::Mul, g1, 0.1).unwrap();
    let w1 = b.binary(BinaryOp::Sub, w, step).unwrap();
    b.update(w, w1).unwrap();
    let p = b.finish();
    let (ok, skipped) = coconet_core::schedule::candidates_explained(&p, &[g]);
    assert_eq!(ok.len(), 1, "{skipped:?}");
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(
        skipped[0].contains("`g1`") && skipped[0].contains("as_slice"),
        "{skipped:?}"
    );
    let (ok, skipped) = coconet_core::schedule::candidates_explained(&p, &[]);
    assert_eq!(ok.len(), 3, "{skipped:?}");
    assert!(skipped.is_empty(), "{skipped:?}");
}

/// `y = all_reduce(g) * norm2(w)`: `norm2(w)` of a Replicated `w` comes along when its
/// user moves before the all-gather — each rank reduces its slice of `w` and an
/// all-reduce completes it (1/P of the reads); a reduction of a Local tensor cannot.
#[test]
fn reorder_slices_a_full_reduction_of_a_replicated_tensor() {
    let program = |w_layout: Layout| {
        let mut b = ProgramBuilder::new("norms");
        let g = b
            .tensor_input("g", DType::F32, Layout::Local, n(), 0)
            .unwrap();
        let w = b.tensor_input("w", DType::F32, w_layout, n(), 0).unwrap();
        let ar = b.all_reduce(ReduceOp::Sum, g).unwrap();
        let wn = b.reduce_all(ReduceKind::Norm2, w).unwrap();
        b.bind(wn, "w_norm").unwrap();
        let y = b.binary(BinaryOp::Mul, ar, wn).unwrap();
        b.bind(y, "y").unwrap();
        b.output(y).unwrap();
        (b.finish(), ar, wn, y)
    };
    let args = |len: usize| {
        let g: Vec<Vec<f32>> = (0..3)
            .map(|r| (0..len).map(|i| (i + r) as f32 * 0.25 - 1.0).collect())
            .collect();
        let w: Vec<f32> = (0..len).map(|i| (i as f32 * 0.7).sin()).collect();
        Bindings::new()
            .dim("N", len)
            .tensor("g", Binding::per_rank(&g))
            .tensor("w", Binding::global(&w))
    };

    let (p, ar, wn, y) = program(Layout::Replicated);
    let mut s = Schedule::new(&p);
    let (_, ag) = s.split(ar).unwrap();
    let made = s.reorder(&[y, wn], ag).unwrap();
    assert_eq!(
        made.reductions.len(),
        1,
        "norm2(w) completed by one all-reduce"
    );
    let q = s.program();
    let sliced_reduction = q.ids().any(|v| {
        matches!(q.node(v).op, Op::ReduceAll(ReduceKind::Sum, x)
            if q.node(x).ty.layout == Layout::Sliced(0))
    });
    assert!(sliced_reduction, "norm2(w) is not on slices:\n{q}");
    for len in [1, 7, 4099] {
        let want = interpret(&p, 3, &args(len)).unwrap();
        let got = interpret(q, 3, &args(len)).unwrap();
        let (want_n, got_n) = (
            want.logical::<f32>(wn).unwrap()[0],
            got.logical::<f32>(q.find("w_norm").unwrap()).unwrap()[0],
        );
        assert!(
            (want_n - got_n).abs() <= 1e-6 * want_n.abs(),
            "{want_n} vs {got_n}"
        );
        let (want_y, got_y) = (
            want.logical::<f32>(y).unwrap(),
            got.logical::<f32>(q.find("y").unwrap()).unwrap(),
        );
        for (a, b) in want_y.iter().zip(&got_y) {
            assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{a} vs {b}");
        }
    }

    // The norm of a Local tensor differs per rank: slicing it would change its value.
    let (p, ar, wn, y) = program(Layout::Local);
    let mut s = Schedule::new(&p);
    let (_, ag) = s.split(ar).unwrap();
    let e = s.reorder(&[y, wn], ag).unwrap_err();
    assert!(
        e.message.contains("`w` (Local)") && e.message.contains("only a full reduction"),
        "{e}"
    );

    // A Replicated value broadcast along dim 0 has no slices: every rank would add its
    // whole copy (P times the sum).
    let mut b = ProgramBuilder::new("broadcast");
    let g = b
        .tensor_input("g", DType::F32, Layout::Local, n(), 0)
        .unwrap();
    let one = Shape::new(vec![Dim::Const(1)]);
    let row = b
        .tensor_input("row", DType::F32, Layout::Replicated, one, 0)
        .unwrap();
    let ar = b.all_reduce(ReduceOp::Sum, g).unwrap();
    let two = b.literal(2.0, DType::F32);
    let x = b.binary(BinaryOp::Mul, row, two).unwrap();
    let sum = b.reduce_all(ReduceKind::Sum, x).unwrap();
    let y = b.binary(BinaryOp::Mul, ar, sum).unwrap();
    b.output(y).unwrap();
    let p = b.finish();
    let mut s = Schedule::new(&p);
    let (_, ag) = s.split(ar).unwrap();
    let e = s.reorder(&[y, sum, x], ag).unwrap_err();
    assert!(e.message.contains("dim 0"), "{e}");
}
