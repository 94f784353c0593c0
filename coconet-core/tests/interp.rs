//! The reference interpreter, op by op, on hand-computed values (including uneven slices
//! and P = 1), and its binding errors.

use coconet_core::half::f16;
use coconet_core::*;

fn dims(names: &[&str]) -> Shape {
    Shape::new(
        names
            .iter()
            .map(|d| d.parse().map(Dim::Const).unwrap_or_else(|_| Dim::sym(*d)))
            .collect(),
    )
}

/// A program with one f32 input `x` of the given layout and shape, and `f` applied to it.
fn unary_program(
    layout: Layout,
    shape: &[&str],
    f: impl FnOnce(&mut ProgramBuilder, ValueId) -> ValueId,
) -> (Program, ValueId) {
    let mut b = ProgramBuilder::new("t");
    let x = b
        .tensor_input("x", DType::F32, layout, dims(shape), 0)
        .unwrap();
    let y = f(&mut b, x);
    (b.finish(), y)
}

fn per_rank(ranks: &[&[f32]]) -> Binding {
    Binding::per_rank(&ranks.iter().map(|r| r.to_vec()).collect::<Vec<_>>())
}

#[test]
fn all_reduce_every_op() {
    let x = per_rank(&[&[1.0, -2.0], &[3.0, 4.0], &[-5.0, 6.0]]);
    let want = [
        (ReduceOp::Sum, [-1.0, 8.0]),
        (ReduceOp::Prod, [-15.0, -48.0]),
        (ReduceOp::Max, [3.0, 6.0]),
        (ReduceOp::Min, [-5.0, -2.0]),
        (ReduceOp::Avg, [-1.0 / 3.0, 8.0 / 3.0]),
    ];
    for (op, w) in want {
        let (p, y) = unary_program(Layout::Local, &["N"], |b, x| b.all_reduce(op, x).unwrap());
        let run = interpret(&p, 3, &Bindings::new().dim("N", 2).tensor("x", x.clone())).unwrap();
        let w: Vec<f32> = w.iter().map(|&v| v as f32).collect();
        for r in 0..3 {
            assert_eq!(run.local::<f32>(y, r).unwrap(), w, "{op} on rank {r}");
        }
    }
}

#[test]
fn reduce_scatter_uneven_blocks() {
    // N = 10 over P = 4: blocks of 3, 3, 2, 2.
    let (p, y) = unary_program(Layout::Local, &["N"], |b, x| {
        b.reduce_scatter(ReduceOp::Sum, x, 0).unwrap()
    });
    let data: Vec<Vec<f32>> = (0..4)
        .map(|r| (0..10).map(|i| (i * (r + 1)) as f32).collect())
        .collect();
    let args = Bindings::new()
        .dim("N", 10)
        .tensor("x", Binding::per_rank(&data));
    let run = interpret(&p, 4, &args).unwrap();
    // Sum over ranks of i*(r+1) = 10*i.
    assert_eq!(run.local::<f32>(y, 0).unwrap(), vec![0.0, 10.0, 20.0]);
    assert_eq!(run.local::<f32>(y, 1).unwrap(), vec![30.0, 40.0, 50.0]);
    assert_eq!(run.local::<f32>(y, 2).unwrap(), vec![60.0, 70.0]);
    assert_eq!(run.local::<f32>(y, 3).unwrap(), vec![80.0, 90.0]);
    let all: Vec<f32> = (0..10).map(|i| 10.0 * i as f32).collect();
    assert_eq!(run.logical::<f32>(y).unwrap(), all);
}

#[test]
fn reduce_scatter_along_dim_1_and_all_gather() {
    let (p, y) = unary_program(Layout::Local, &["2", "H"], |b, x| {
        let rs = b.reduce_scatter(ReduceOp::Max, x, 1).unwrap();
        b.all_gather(rs).unwrap()
    });
    let x = per_rank(&[
        &[1.0, 9.0, 3.0, 4.0, 5.0, 0.0],
        &[7.0, 2.0, 8.0, 0.0, 6.0, 1.0],
    ]);
    let run = interpret(&p, 2, &Bindings::new().dim("H", 3).tensor("x", x)).unwrap();
    let want = vec![7.0, 9.0, 8.0, 4.0, 6.0, 1.0];
    assert_eq!(run.local::<f32>(y, 0).unwrap(), want);
    assert_eq!(run.local::<f32>(y, 1).unwrap(), want);
}

#[test]
fn all_gather_of_uneven_slices_restores_the_tensor() {
    let (p, y) = unary_program(Layout::Sliced(0), &["N"], |b, x| b.all_gather(x).unwrap());
    let xs: Vec<f32> = (0..10).map(|i| i as f32 * 1.5).collect();
    for ranks in [1, 3, 4, 8, 16] {
        let args = Bindings::new()
            .dim("N", 10)
            .tensor("x", Binding::global(&xs));
        let run = interpret(&p, ranks, &args).unwrap();
        for r in 0..ranks {
            assert_eq!(run.local::<f32>(y, r).unwrap(), xs, "P = {ranks}, rank {r}");
        }
    }
}

#[test]
fn broadcast_reduce_and_scatter() {
    let x = per_rank(&[&[1.0, 2.0], &[3.0, 4.0], &[5.0, 6.0]]);
    let args = Bindings::new().dim("N", 2).tensor("x", x);
    let (p, y) = unary_program(Layout::Local, &["N"], |b, x| b.broadcast(x, 2).unwrap());
    let run = interpret(&p, 3, &args).unwrap();
    assert_eq!(run.logical::<f32>(y).unwrap(), vec![5.0, 6.0]);
    let (p, y) = unary_program(Layout::Local, &["N"], |b, x| {
        b.reduce(ReduceOp::Sum, x, 1).unwrap()
    });
    let run = interpret(&p, 3, &args).unwrap();
    assert_eq!(run.local::<f32>(y, 0).unwrap(), vec![1.0, 2.0]);
    assert_eq!(run.local::<f32>(y, 1).unwrap(), vec![9.0, 12.0]);
    assert_eq!(run.local::<f32>(y, 2).unwrap(), vec![5.0, 6.0]);
    // Root out of range is a run-time error naming the stage.
    let (p, _) = unary_program(Layout::Local, &["N"], |b, x| b.broadcast(x, 3).unwrap());
    let e = interpret(&p, 3, &args).unwrap_err();
    assert!(
        matches!(
            e,
            InterpError::Root {
                root: 3,
                group_size: 3,
                ..
            }
        ),
        "{e}"
    );

    let (p, y) = unary_program(Layout::Replicated, &["N"], |b, x| b.scatter(x, 0).unwrap());
    let args = Bindings::new()
        .dim("N", 5)
        .tensor("x", Binding::global(&[1.0f32, 2.0, 3.0, 4.0, 5.0]));
    let run = interpret(&p, 2, &args).unwrap();
    assert_eq!(run.local::<f32>(y, 0).unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(run.local::<f32>(y, 1).unwrap(), vec![4.0, 5.0]);
}

#[test]
fn send_between_groups() {
    let mut b = ProgramBuilder::new("t");
    b.set_groups(3).unwrap();
    let x = b
        .tensor_input("x", DType::F32, Layout::Local, dims(&["N"]), 1)
        .unwrap();
    let next = b.send(x, Direction::Next).unwrap();
    let prev = b.send(x, Direction::Prev).unwrap();
    let p = b.finish();
    // 6 ranks, 3 groups of 2: group 1 = ranks 2, 3.
    let args = Bindings::new()
        .dim("N", 1)
        .tensor("x", per_rank(&[&[7.0], &[8.0]]));
    let run = interpret(&p, 6, &args).unwrap();
    let at = |v, r| run.local::<f32>(v, r);
    assert_eq!(
        (at(next, 4), at(next, 5)),
        (Some(vec![7.0]), Some(vec![8.0]))
    );
    assert_eq!(
        (at(prev, 0), at(prev, 1)),
        (Some(vec![7.0]), Some(vec![8.0]))
    );
    assert_eq!((at(next, 2), at(prev, 3)), (None, None));
}

#[test]
fn pointwise_ops_broadcast_and_round() {
    let mut b = ProgramBuilder::new("t");
    let x = b
        .tensor_input("x", DType::F32, Layout::Replicated, dims(&["2", "2"]), 0)
        .unwrap();
    let v = b
        .tensor_input("v", DType::F32, Layout::Replicated, dims(&["2"]), 0)
        .unwrap();
    let i = b
        .tensor_input("i", DType::I32, Layout::Replicated, dims(&["2"]), 0)
        .unwrap();
    let h = b
        .tensor_input("h", DType::F16, Layout::Replicated, dims(&["2"]), 0)
        .unwrap();
    let ops = [
        b.binary(BinaryOp::Add, x, v).unwrap(),
        b.binary(BinaryOp::Sub, x, 1.0).unwrap(),
        b.binary(BinaryOp::Div, x, v).unwrap(),
        b.binary(BinaryOp::Pow, x, 2.0).unwrap(),
        b.binary(BinaryOp::Max, x, v).unwrap(),
        b.binary(BinaryOp::Min, x, v).unwrap(),
        b.unary(UnaryOp::Neg, x).unwrap(),
        b.unary(UnaryOp::Relu, x).unwrap(),
    ];
    let cmp = b.binary(BinaryOp::Ge, x, v).unwrap();
    let sel = b.select(cmp, x, 0.0).unwrap();
    let idiv = b.binary(BinaryOp::Div, i, 2).unwrap();
    let cast = b.cast(DType::I32, v).unwrap();
    let hsum = b.binary(BinaryOp::Add, h, 0.1).unwrap();
    let p = b.finish();
    let args = Bindings::new()
        .tensor("x", Binding::global(&[1.0f32, -2.0, 3.0, -4.0]))
        .tensor("v", Binding::global(&[2.0f32, -2.5]))
        .tensor("i", Binding::global(&[7i32, -7]))
        .tensor(
            "h",
            Binding::global(&[f16::from_f32(1.0), f16::from_f32(2048.0)]),
        );
    let run = interpret(&p, 1, &args).unwrap();
    let get = |v| run.logical::<f32>(v).unwrap();
    let want: [&[f32]; 8] = [
        &[3.0, -4.5, 5.0, -6.5],
        &[0.0, -3.0, 2.0, -5.0],
        &[0.5, 0.8, 1.5, 1.6],
        &[1.0, 4.0, 9.0, 16.0],
        &[2.0, -2.0, 3.0, -2.5],
        &[1.0, -2.5, 2.0, -4.0],
        &[-1.0, 2.0, -3.0, 4.0],
        &[1.0, 0.0, 3.0, 0.0],
    ];
    for (op, w) in ops.iter().zip(want) {
        assert_eq!(get(*op), w, "{}", p.node(*op).op.name());
    }
    assert_eq!(
        run.logical::<bool>(cmp).unwrap(),
        vec![false, true, true, false]
    );
    assert_eq!(get(sel), vec![0.0, -2.0, 3.0, 0.0]);
    assert_eq!(run.logical::<i32>(idiv).unwrap(), vec![3, -3]);
    assert_eq!(run.logical::<i32>(cast).unwrap(), vec![2, -2]);
    // f16: 1 + 0.1 rounds to 1.0996; 2048 + 0.1 rounds back to 2048 (spacing 2).
    let hs: Vec<f16> = run.logical(hsum).unwrap();
    assert_eq!(hs, vec![f16::from_f64(1.1), f16::from_f32(2048.0)]);
}

#[test]
fn unary_math() {
    use std::f32::consts::E;
    let cases: [(UnaryOp, f32, f32); 8] = [
        (UnaryOp::Abs, -3.0, 3.0),
        (UnaryOp::Sqrt, 16.0, 4.0),
        (UnaryOp::Rsqrt, 4.0, 0.5),
        (UnaryOp::Exp, 1.0, E),
        (UnaryOp::Log, E, 1.0),
        (UnaryOp::Tanh, 0.0, 0.0),
        (UnaryOp::Gelu, 0.0, 0.0),
        (UnaryOp::Gelu, 1.0, 0.841_192),
    ];
    for (op, x, want) in cases {
        let (p, y) = unary_program(Layout::Replicated, &["1"], |b, x| b.unary(op, x).unwrap());
        let run = interpret(&p, 1, &Bindings::new().tensor("x", Binding::global(&[x]))).unwrap();
        let got = run.logical::<f32>(y).unwrap()[0];
        assert!(
            (got - want).abs() < 1e-6,
            "{}({x}) = {got}, want {want}",
            op.name()
        );
    }
}

#[test]
fn matmul_and_row_parallel_partial_sums() {
    // [2, 3] × [3, 2]
    let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let w = [7.0f32, 8.0, 9.0, 10.0, 11.0, 12.0];
    let want = vec![58.0f32, 64.0, 139.0, 154.0];
    let mut b = ProgramBuilder::new("t");
    let x = b
        .tensor_input("a", DType::F32, Layout::Replicated, dims(&["M", "K"]), 0)
        .unwrap();
    let y = b
        .tensor_input("w", DType::F32, Layout::Replicated, dims(&["K", "N"]), 0)
        .unwrap();
    let full = b.matmul(x, y).unwrap();
    let xs = b.scatter(x, 1).unwrap();
    let ys = b.scatter(y, 0).unwrap();
    let partial = b.matmul(xs, ys).unwrap();
    let sum = b.all_reduce(ReduceOp::Sum, partial).unwrap();
    let p = b.finish();
    let args = Bindings::new()
        .dim("M", 2)
        .dim("K", 3)
        .dim("N", 2)
        .tensor("a", Binding::global(&a))
        .tensor("w", Binding::global(&w));
    let run = interpret(&p, 2, &args).unwrap();
    assert_eq!(run.logical::<f32>(full).unwrap(), want);
    // K = 3 over 2 ranks: rank 0 has k = 0, 1; rank 1 has k = 2.
    assert_eq!(
        run.local::<f32>(partial, 0).unwrap(),
        vec![25.0, 28.0, 73.0, 82.0]
    );
    assert_eq!(
        run.local::<f32>(partial, 1).unwrap(),
        vec![33.0, 36.0, 66.0, 72.0]
    );
    assert_eq!(run.logical::<f32>(sum).unwrap(), want);
}

#[test]
fn full_reductions() {
    let xs = [3.0f32, -4.0, 1.0];
    for (k, want) in [
        (ReduceKind::Sum, 0.0),
        (ReduceKind::Max, 3.0),
        (ReduceKind::Min, -4.0),
        (ReduceKind::Norm2, 26f32.sqrt()),
    ] {
        let (p, y) = unary_program(Layout::Replicated, &["N"], |b, x| {
            b.reduce_all(k, x).unwrap()
        });
        let run = interpret(
            &p,
            1,
            &Bindings::new()
                .dim("N", 3)
                .tensor("x", Binding::global(&xs)),
        )
        .unwrap();
        assert_eq!(run.logical::<f32>(y).unwrap(), vec![want], "{}", k.name());
    }
}

#[test]
fn layer_norm_rows() {
    let mut b = ProgramBuilder::new("t");
    let x = b
        .tensor_input("x", DType::F64, Layout::Sliced(0), dims(&["B", "H"]), 0)
        .unwrap();
    let g = b
        .tensor_input("g", DType::F64, Layout::Replicated, dims(&["H"]), 0)
        .unwrap();
    let be = b
        .tensor_input("be", DType::F64, Layout::Replicated, dims(&["H"]), 0)
        .unwrap();
    let y = b.layer_norm(x, g, be, 0.0).unwrap();
    let p = b.finish();
    let args = Bindings::new()
        .dim("B", 2)
        .dim("H", 3)
        .tensor("x", Binding::global(&[1.0f64, 2.0, 3.0, 10.0, 10.0, 40.0]))
        .tensor("g", Binding::global(&[1.0f64, 2.0, 1.0]))
        .tensor("be", Binding::global(&[0.0f64, 0.0, 5.0]));
    let run = interpret(&p, 2, &args).unwrap();
    let s = 1.5f64.sqrt(); // (x - mean) / std with std = sqrt(2/3) for row 0
    let got = run.logical::<f64>(y).unwrap();
    let want = [
        -s,
        0.0,
        s + 5.0,
        -1.0 / 2f64.sqrt(),
        -2.0 / 2f64.sqrt(),
        2f64.sqrt() + 5.0,
    ];
    for (a, b) in got.iter().zip(want) {
        assert!((a - b).abs() < 1e-12, "{got:?} vs {want:?}");
    }
}

#[test]
fn dropout_mask_is_the_same_for_every_layout() {
    let n = 1000;
    let xs: Vec<f32> = (0..n).map(|i| 1.0 + i as f32).collect();
    let mut b = ProgramBuilder::new("t");
    let x = b
        .tensor_input("x", DType::F32, Layout::Replicated, dims(&["N"]), 0)
        .unwrap();
    let seed = b.scalar_input("seed", DType::I64).unwrap();
    let whole = b.dropout(x, 0.25, seed).unwrap();
    let xs_sliced = b.scatter(x, 0).unwrap();
    let sliced = b.dropout(xs_sliced, 0.25, seed).unwrap();
    let p = b.finish();
    let args = Bindings::new()
        .dim("N", n)
        .scalar("seed", 1234i64)
        .tensor("x", Binding::global(&xs));
    let run = interpret(&p, 3, &args).unwrap();
    let a = run.logical::<f32>(whole).unwrap();
    assert_eq!(a, run.logical::<f32>(sliced).unwrap());
    let kept = a.iter().filter(|v| **v != 0.0).count();
    assert!((700..800).contains(&kept), "kept {kept} of {n}");
    for (i, v) in a.iter().enumerate() {
        assert!(*v == 0.0 || *v == xs[i] / 0.75, "element {i}: {v}");
    }
    // Another seed draws another mask.
    let other = interpret(&p, 3, &args.clone().scalar("seed", 99i64)).unwrap();
    assert_ne!(a, other.logical::<f32>(whole).unwrap());
}

#[test]
fn single_rank_world() {
    let (p, y) = unary_program(Layout::Local, &["N"], |b, x| {
        let rs = b.reduce_scatter(ReduceOp::Sum, x, 0).unwrap();
        b.all_gather(rs).unwrap()
    });
    let run = interpret(
        &p,
        1,
        &Bindings::new()
            .dim("N", 3)
            .tensor("x", per_rank(&[&[1.0, 2.0, 3.0]])),
    )
    .unwrap();
    assert_eq!(run.logical::<f32>(y).unwrap(), vec![1.0, 2.0, 3.0]);
}

#[test]
fn binding_errors_are_clear() {
    let mut b = ProgramBuilder::new("prog");
    b.set_groups(2).unwrap();
    let _x = b
        .tensor_input("x", DType::F32, Layout::Sliced(0), dims(&["N"]), 0)
        .unwrap();
    let _r = b
        .tensor_input("r", DType::F32, Layout::Replicated, dims(&["N"]), 0)
        .unwrap();
    let _lr = b.scalar_input("lr", DType::F32).unwrap();
    let p = b.finish();
    let ok = Bindings::new()
        .dim("N", 5)
        .scalar("lr", 0.5f32)
        .tensor("x", Binding::global(&[0.0f32; 5]))
        .tensor("r", Binding::global(&[0.0f32; 5]));
    assert!(interpret(&p, 4, &ok).is_ok());
    let err = |ranks, b: &Bindings| interpret(&p, ranks, b).unwrap_err().to_string();
    assert_eq!(
        err(3, &ok),
        "cannot run `prog` on 3 rank(s): it needs a positive multiple of its 2 group(s)"
    );
    assert!(err(0, &ok).contains("0 rank(s)"));
    let mut no_dim = ok.clone();
    no_dim.dims_mut().clear();
    assert_eq!(err(2, &no_dim), "dimension `N` (used by `x`) is not bound");
    let mut missing = ok.clone();
    missing.tensors_mut().remove("r");
    assert_eq!(err(2, &missing), "input `r` is not bound");
    let wrong_len = ok.clone().tensor("r", Binding::global(&[0.0f32; 4]));
    assert_eq!(
        err(2, &wrong_len),
        "input `r`: expected 5 elements for shape [5], got 4"
    );
    // Rank 1 of the group holds 2 of the 5 rows.
    let wrong_block = ok.clone().tensor("x", per_rank(&[&[0.0; 3], &[0.0; 3]]));
    assert_eq!(
        err(4, &wrong_block),
        "input `x` on rank 1: expected 2 elements for shape [2], got 3"
    );
    let wrong_count = ok.clone().tensor("x", per_rank(&[&[0.0; 5]]));
    assert_eq!(
        err(4, &wrong_count),
        "input `x`: expected one buffer per rank of its group (2), got 1"
    );
    let wrong_dtype = ok.clone().tensor("r", Binding::global(&[0.0f64; 5]));
    assert_eq!(
        err(2, &wrong_dtype),
        "input `r` is f32 but was bound to f64 data"
    );
    let wrong_scalar = ok.clone().scalar("lr", 1i32);
    assert_eq!(
        err(2, &wrong_scalar),
        "input `lr` is f32 but was bound to i32 data"
    );
    let not_replicated = ok.clone().tensor("r", per_rank(&[&[0.0; 5], &[1.0; 5]]));
    assert_eq!(
        err(4, &not_replicated),
        "input `r` is Replicated but rank 1's copy differs from rank 0's"
    );
    let typo = ok.clone().tensor("rr", Binding::global(&[0.0f32; 5]));
    assert_eq!(
        err(2, &typo),
        "`rr` is bound but `prog` has no tensor input of that name"
    );
}

/// Regression (original bug): `scalar - tensor` and `scalar / tensor` swapped operands.
#[test]
fn scalar_on_the_left_keeps_operand_order() {
    let mut b = ProgramBuilder::new("t");
    let x = b
        .tensor_input("x", DType::F32, Layout::Replicated, dims(&["N"]), 0)
        .unwrap();
    let s = b.scalar_input("s", DType::F32).unwrap();
    let sub = b.binary(BinaryOp::Sub, s, x).unwrap();
    let div = b.binary(BinaryOp::Div, s, x).unwrap();
    let lit = b.binary(BinaryOp::Sub, 1.0, x).unwrap();
    let p = b.finish();
    let args = Bindings::new()
        .dim("N", 2)
        .scalar("s", 8.0f32)
        .tensor("x", Binding::global(&[2.0f32, 4.0]));
    let run = interpret(&p, 1, &args).unwrap();
    assert_eq!(run.logical::<f32>(sub).unwrap(), vec![6.0, 4.0]);
    assert_eq!(run.logical::<f32>(div).unwrap(), vec![4.0, 2.0]);
    assert_eq!(run.logical::<f32>(lit).unwrap(), vec![-1.0, -3.0]);
}

#[test]
fn i64_elements_beyond_2_pow_53_are_refused_at_binding() {
    let mut b = ProgramBuilder::new("ids");
    let x = b
        .tensor_input("x", DType::I64, Layout::Replicated, dims(&["2"]), 0)
        .unwrap();
    let y = b.all_reduce(ReduceOp::Max, x).unwrap();
    b.output(y).unwrap();
    let p = b.finish();
    let exact = 1i64 << 53;
    let ok = Bindings::new().tensor("x", Binding::global(&[exact, -exact]));
    assert!(interpret(&p, 2, &ok).is_ok(), "±2^53 is exact");
    for data in [[exact + 1, 0], [0, -exact - 1], [i64::MIN, 0]] {
        let bad = Bindings::new().tensor("x", Binding::global(&data));
        let e = interpret(&p, 2, &bad).unwrap_err().to_string();
        assert!(
            e.contains("input `x` holds") && e.contains("beyond ±2^53"),
            "{e}"
        );
    }
}
