//! The checker's typing and layout rules (DESIGN.md), including regression tests for the
//! original CoCoNet's mistakes.

use coconet_core::*;

fn shape(dims: &[&str]) -> Shape {
    Shape::new(
        dims.iter()
            .map(|d| d.parse().map(Dim::Const).unwrap_or_else(|_| Dim::sym(*d)))
            .collect(),
    )
}

fn input(b: &mut ProgramBuilder, name: &str, layout: Layout, dims: &[&str]) -> ValueId {
    b.tensor_input(name, DType::F32, layout, shape(dims), 0)
        .unwrap()
}

fn add(b: &mut ProgramBuilder, x: ValueId, y: ValueId) -> Result<ValueId, CheckError> {
    b.binary(BinaryOp::Add, x, y)
}

#[test]
fn pointwise_layout_algebra() {
    use Layout::*;
    let cases = [
        (Replicated, Replicated, Some(Replicated)),
        (Local, Local, Some(Local)),
        (Replicated, Local, Some(Local)),
        (Local, Replicated, Some(Local)),
        (Sliced(0), Sliced(0), Some(Sliced(0))),
        (Sliced(0), Replicated, Some(Sliced(0))),
        (Replicated, Sliced(1), Some(Sliced(1))),
        (Sliced(0), Local, None),
        (Local, Sliced(0), None),
        (Sliced(0), Sliced(1), None),
    ];
    for (la, lb, want) in cases {
        let mut b = ProgramBuilder::new("t");
        let x = input(&mut b, "x", la, &["B", "H"]);
        let y = input(&mut b, "y", lb, &["B", "H"]);
        let got = add(&mut b, x, y);
        match want {
            Some(l) => assert_eq!(b.ty(got.unwrap()).layout, l, "{la} + {lb}"),
            None => assert_eq!(got.unwrap_err().kind, ErrorKind::Layout, "{la} + {lb}"),
        }
    }
}

/// Regression (original bug): a bias broadcast along the sliced dim is not sliced.
#[test]
fn bias_broadcast_under_a_sliced_tensor_stays_whole() {
    let mut b = ProgramBuilder::new("bias");
    let x = input(&mut b, "x", Layout::Sliced(0), &["B", "H"]);
    let bias = input(&mut b, "bias", Layout::Replicated, &["H"]);
    let y = add(&mut b, x, bias).unwrap();
    assert_eq!(b.ty(y).layout, Layout::Sliced(0));
    let p = b.finish();
    // B = 3 rows over P = 2 ranks: rank 0 has rows 0..2, rank 1 row 2; each row + whole bias.
    let xs: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let args = Bindings::new()
        .dim("B", 3)
        .dim("H", 2)
        .tensor("x", Binding::global(&xs))
        .tensor("bias", Binding::global(&[10.0f32, 20.0]));
    let run = interpret(&p, 2, &args).unwrap();
    assert_eq!(
        run.local::<f32>(y, 0).unwrap(),
        vec![10.0, 21.0, 12.0, 23.0]
    );
    assert_eq!(run.local::<f32>(y, 1).unwrap(), vec![14.0, 25.0]);
    assert_eq!(
        run.logical::<f32>(y).unwrap(),
        vec![10.0, 21.0, 12.0, 23.0, 14.0, 25.0]
    );
}

/// A Replicated operand that spans the sliced dim is sliced implicitly.
#[test]
fn replicated_operand_spanning_the_sliced_dim_is_sliced() {
    let mut b = ProgramBuilder::new("t");
    let s = input(&mut b, "s", Layout::Sliced(0), &["H"]);
    let r = input(&mut b, "r", Layout::Replicated, &["B", "H"]);
    let y = add(&mut b, s, r).unwrap();
    // [H] sliced on its dim 0 is the result's dim 1.
    assert_eq!(b.ty(y).layout, Layout::Sliced(1));
    let p = b.finish();
    let args = Bindings::new()
        .dim("B", 2)
        .dim("H", 3)
        .tensor("s", Binding::global(&[1.0f32, 2.0, 3.0]))
        .tensor(
            "r",
            Binding::global(&[10.0f32, 20.0, 30.0, 40.0, 50.0, 60.0]),
        );
    let run = interpret(&p, 2, &args).unwrap();
    assert_eq!(
        run.local::<f32>(y, 0).unwrap(),
        vec![11.0, 22.0, 41.0, 52.0]
    );
    assert_eq!(run.local::<f32>(y, 1).unwrap(), vec![33.0, 63.0]);
}

#[test]
fn sliced_operand_cannot_broadcast_along_its_sliced_dim() {
    let mut b = ProgramBuilder::new("t");
    let s = b
        .tensor_input("s", DType::F32, Layout::Sliced(0), shape(&["1", "H"]), 0)
        .unwrap();
    let r = input(&mut b, "r", Layout::Replicated, &["B", "H"]);
    let e = add(&mut b, s, r).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Layout);
    assert!(
        e.message.contains("broadcast along that dim"),
        "{}",
        e.message
    );
}

/// Regression (original bug): reducing a Sliced tensor gives a partial (Local) value.
#[test]
fn reduction_of_sliced_is_partial() {
    let mut b = ProgramBuilder::new("t");
    let s = input(&mut b, "s", Layout::Sliced(0), &["N"]);
    let total = b.reduce_all(ReduceKind::Sum, s).unwrap();
    assert_eq!(b.ty(total).layout, Layout::Local);
    let global = b.all_reduce(ReduceOp::Sum, total).unwrap();
    assert_eq!(b.ty(global).layout, Layout::Replicated);
    let norm = b.reduce_all(ReduceKind::Norm2, s).unwrap();
    assert_eq!(b.ty(norm).layout, Layout::Local);
    let p = b.finish();
    let xs: Vec<f32> = (1..=10).map(|i| i as f32).collect();
    let args = Bindings::new()
        .dim("N", 10)
        .tensor("s", Binding::global(&xs));
    let run = interpret(&p, 4, &args).unwrap();
    // Blocks of N = 10 over 4 ranks: [1,2,3] [4,5,6] [7,8] [9,10].
    let partial: Vec<f32> = (0..4)
        .map(|r| run.local::<f32>(total, r).unwrap()[0])
        .collect();
    assert_eq!(partial, vec![6.0, 15.0, 15.0, 19.0]);
    assert_eq!(run.logical::<f32>(global).unwrap(), vec![55.0]);
    assert_eq!(run.local::<f32>(norm, 2).unwrap(), vec![(113.0f32).sqrt()]);
}

#[test]
fn matmul_layout_table() {
    use Layout::*;
    // a: [B, M, K], b: [K, N]
    let cases = [
        (Replicated, Replicated, Some(Replicated)),
        (Local, Replicated, Some(Local)),
        (Replicated, Local, Some(Local)),
        (Local, Local, Some(Local)),
        (Sliced(0), Replicated, Some(Sliced(0))),
        (Sliced(1), Replicated, Some(Sliced(1))),
        (Replicated, Sliced(1), Some(Sliced(2))),
        (Sliced(2), Sliced(0), Some(Local)),
        (Sliced(2), Replicated, None),
        (Local, Sliced(1), None),
        (Sliced(0), Sliced(1), None),
    ];
    for (la, lb, want) in cases {
        let mut b = ProgramBuilder::new("t");
        let x = input(&mut b, "a", la, &["B", "M", "K"]);
        let w = input(&mut b, "w", lb, &["K", "N"]);
        let got = b.matmul(x, w);
        match want {
            Some(l) => {
                let y = got.unwrap();
                assert_eq!(b.ty(y).layout, l, "{la} × {lb}");
                assert_eq!(b.ty(y).shape, shape(&["B", "M", "N"]));
            }
            None => assert_eq!(got.unwrap_err().kind, ErrorKind::Layout, "{la} × {lb}"),
        }
    }
    let mut b = ProgramBuilder::new("t");
    let x = input(&mut b, "a", Layout::Replicated, &["M", "K"]);
    let w = input(&mut b, "w", Layout::Replicated, &["J", "N"]);
    assert_eq!(b.matmul(x, w).unwrap_err().kind, ErrorKind::Shape);
}

#[test]
fn collective_layout_rules() {
    let mut b = ProgramBuilder::new("t");
    let l = input(&mut b, "l", Layout::Local, &["N"]);
    let s = input(&mut b, "s", Layout::Sliced(0), &["N"]);
    let r = input(&mut b, "r", Layout::Replicated, &["N"]);
    assert_eq!(
        b.all_reduce(ReduceOp::Sum, s).unwrap_err().kind,
        ErrorKind::Layout
    );
    assert!(
        b.all_reduce(ReduceOp::Sum, s)
            .unwrap_err()
            .message
            .contains("all_gather")
    );
    assert_eq!(b.all_gather(l).unwrap_err().kind, ErrorKind::Layout);
    assert_eq!(b.all_gather(r).unwrap_err().kind, ErrorKind::Layout);
    assert_eq!(b.scatter(l, 0).unwrap_err().kind, ErrorKind::Layout);
    assert_eq!(
        b.reduce_scatter(ReduceOp::Sum, l, 1).unwrap_err().kind,
        ErrorKind::Shape
    );
    assert_eq!(b.broadcast(s, 0).unwrap_err().kind, ErrorKind::Layout);
    let rs = b.reduce_scatter(ReduceOp::Sum, l, 0).unwrap();
    assert_eq!(b.ty(rs).layout, Layout::Sliced(0));
    let ag = b.all_gather(rs).unwrap();
    assert_eq!(b.ty(ag).layout, Layout::Replicated);
    let red = b.reduce(ReduceOp::Max, l, 0).unwrap();
    assert_eq!(b.ty(red).layout, Layout::Local);
    let bc = b.broadcast(l, 1).unwrap();
    assert_eq!(b.ty(bc).layout, Layout::Replicated);
}

#[test]
fn dtypes_are_never_promoted() {
    let mut b = ProgramBuilder::new("t");
    let x = input(&mut b, "x", Layout::Replicated, &["N"]);
    let h = b
        .tensor_input("h", DType::F16, Layout::Replicated, shape(&["N"]), 0)
        .unwrap();
    let e = add(&mut b, x, h).unwrap_err();
    assert_eq!((e.kind, e.blame), (ErrorKind::DType, Blame::Operand(1)));
    let c = b.cast(DType::F32, h).unwrap();
    assert!(add(&mut b, x, c).is_ok());
    // A literal takes the tensor's dtype.
    let y = b.binary(BinaryOp::Mul, 2.0, h).unwrap();
    assert_eq!(b.ty(y).dtype, DType::F16);
    let lt = b.binary(BinaryOp::Lt, x, 0.5).unwrap();
    assert_eq!(b.ty(lt).dtype, DType::Bool);
    assert_eq!(b.select(x, x, x).unwrap_err().kind, ErrorKind::DType);
    assert!(b.select(lt, x, 0.0).is_ok());
    assert_eq!(
        b.unary(UnaryOp::Sqrt, lt).unwrap_err().kind,
        ErrorKind::DType
    );
    let i = b
        .tensor_input("i", DType::I32, Layout::Replicated, shape(&["N"]), 0)
        .unwrap();
    assert_eq!(b.unary(UnaryOp::Exp, i).unwrap_err().kind, ErrorKind::DType);
    assert!(b.unary(UnaryOp::Abs, i).is_ok());
    assert_eq!(
        b.binary(BinaryOp::Add, 1.0, 2.0).unwrap_err().kind,
        ErrorKind::Usage
    );
}

/// A literal that the expression's dtype cannot hold is an error on the literal (it was
/// silently truncated: `step + 0.5` computed 2 for step = 2; `1e-8` became 0 in f16).
#[test]
fn literals_the_dtype_cannot_hold_are_errors() {
    let mut b = ProgramBuilder::new("t");
    let step = b.scalar_input("step", DType::I32).unwrap();
    let e = b.binary(BinaryOp::Add, step, 0.5).unwrap_err();
    assert_eq!((e.kind, e.blame), (ErrorKind::DType, Blame::Operand(1)));
    assert!(
        e.message.contains("0.5") && e.message.contains("i32"),
        "{e}"
    );
    assert!(b.binary(BinaryOp::Add, step, 2.0).is_ok());
    assert!(b.binary(BinaryOp::Add, step, 3e9).is_err());
    let h = b
        .tensor_input("h", DType::F16, Layout::Replicated, shape(&["N"]), 0)
        .unwrap();
    let e = b.binary(BinaryOp::Add, h, 1e-8).unwrap_err();
    assert_eq!((e.kind, e.blame), (ErrorKind::DType, Blame::Operand(1)));
    assert!(e.message.contains("rounds to 0 in f16"), "{e}");
    let e = b.binary(BinaryOp::Mul, 1e6, h).unwrap_err();
    assert_eq!(e.blame, Blame::Operand(0));
    assert!(e.message.contains("overflows"), "{e}");
    // Values the dtype holds (rounded to the nearest) are fine, and 0 is exact.
    assert!(b.binary(BinaryOp::Add, h, 1e-3).is_ok());
    assert!(b.binary(BinaryOp::Add, h, 0.0).is_ok());
    let x = input(&mut b, "x", Layout::Replicated, &["N"]);
    assert!(b.binary(BinaryOp::Add, x, 1e-8).is_ok());
    assert!(b.binary(BinaryOp::Add, x, 1e-50).is_err());
}

#[test]
fn symbolic_dims_compare_by_name() {
    let mut b = ProgramBuilder::new("t");
    let x = input(&mut b, "x", Layout::Replicated, &["N"]);
    let y = input(&mut b, "y", Layout::Replicated, &["M"]);
    let e = add(&mut b, x, y).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Shape);
    assert!(
        e.message.contains("[N]") && e.message.contains("[M]"),
        "{}",
        e.message
    );
}

#[test]
fn update_rules() {
    let mut b = ProgramBuilder::new("t");
    let w = input(&mut b, "w", Layout::Replicated, &["N"]);
    let s = input(&mut b, "s", Layout::Sliced(0), &["N"]);
    let y = b.unary(UnaryOp::Neg, w).unwrap();
    assert_eq!(b.update(y, w).unwrap_err().kind, ErrorKind::Update);
    // No implicit all_gather (the original allowed Replicated <- Sliced).
    assert_eq!(b.update(w, s).unwrap_err().kind, ErrorKind::Layout);
    b.update(w, y).unwrap();
    assert_eq!(b.update(w, y).unwrap_err().kind, ErrorKind::Update);
    let lr = b.scalar_input("lr", DType::F32).unwrap();
    assert_eq!(b.update(lr, 1.0).unwrap_err().kind, ErrorKind::Update);
}

#[test]
fn groups_and_send() {
    let mut b = ProgramBuilder::new("t");
    b.set_groups(2).unwrap();
    let x = input(&mut b, "x", Layout::Local, &["N"]);
    let y = b
        .tensor_input("y", DType::F32, Layout::Local, shape(&["N"]), 1)
        .unwrap();
    assert_eq!(add(&mut b, x, y).unwrap_err().kind, ErrorKind::Group);
    let sent = b.send(x, Direction::Next).unwrap();
    assert_eq!(b.ty(sent).placement, Placement::Group(1));
    assert!(add(&mut b, sent, y).is_ok());
    assert_eq!(
        b.send(sent, Direction::Next).unwrap_err().kind,
        ErrorKind::Group
    );
    assert_eq!(
        b.send(x, Direction::Prev).unwrap_err().kind,
        ErrorKind::Group
    );
    assert_eq!(
        b.tensor_input("z", DType::F32, Layout::Local, shape(&["N"]), 2)
            .unwrap_err()
            .kind,
        ErrorKind::Group
    );
}

#[test]
fn names_are_bound_once() {
    let mut b = ProgramBuilder::new("t");
    let x = input(&mut b, "x", Layout::Replicated, &["N"]);
    assert_eq!(
        b.tensor_input("x", DType::F32, Layout::Local, shape(&["N"]), 0)
            .unwrap_err()
            .kind,
        ErrorKind::Binding
    );
    let y = b.unary(UnaryOp::Neg, x).unwrap();
    b.bind(y, "y").unwrap();
    assert_eq!(b.bind(y, "z").unwrap_err().kind, ErrorKind::Binding);
    let z = b.unary(UnaryOp::Abs, x).unwrap();
    assert_eq!(b.bind(z, "y").unwrap_err().kind, ErrorKind::Binding);
}

#[test]
fn layer_norm_needs_whole_rows() {
    let mut b = ProgramBuilder::new("t");
    let x = input(&mut b, "x", Layout::Sliced(1), &["B", "H"]);
    let g = input(&mut b, "g", Layout::Replicated, &["H"]);
    let e = b.layer_norm(x, g, g, 1e-5).unwrap_err();
    assert_eq!((e.kind, e.blame), (ErrorKind::Layout, Blame::Operand(0)));
    let x0 = input(&mut b, "x0", Layout::Sliced(0), &["B", "H"]);
    let y = b.layer_norm(x0, g, g, 1e-5).unwrap();
    assert_eq!(b.ty(y).layout, Layout::Sliced(0));
}

#[test]
fn printing_shows_types_and_dot_is_well_formed() {
    let mut b = ProgramBuilder::new("sgd");
    let g = input(&mut b, "g", Layout::Local, &["N"]);
    let w = input(&mut b, "w", Layout::Replicated, &["N"]);
    let lr = b.scalar_input("lr", DType::F32).unwrap();
    let g1 = b.all_reduce(ReduceOp::Sum, g).unwrap();
    b.bind(g1, "g1").unwrap();
    let d = b.binary(BinaryOp::Mul, lr, g1).unwrap();
    let n = b.binary(BinaryOp::Sub, w, d).unwrap();
    let w1 = b.update(w, n).unwrap();
    b.bind(w1, "w1").unwrap();
    let p = b.finish();
    let text = p.to_string();
    assert_eq!(
        text,
        "program sgd (1 group)\n  input  g: f32 Local [N]\n  input  w: f32 Replicated [N]\n  \
         scalar lr: f32\n  g1 = all_reduce(Sum, g) : f32 Replicated [N]\n  %4 = mul(lr, g1) : \
         f32 Replicated [N]\n  %5 = sub(w, %4) : f32 Replicated [N]\n  w1 = update(w, %5) : \
         f32 Replicated [N]\n"
    );
    let dot = to_dot(&p);
    assert!(dot.starts_with("digraph \"sgd\" {"));
    assert!(dot.contains("n0 -> n3;"));
    assert!(dot.contains("style=bold"));
    assert!(dot.trim_end().ends_with('}'));
}
