//! Property: for random pointwise programs over Replicated and Sliced inputs (random
//! dims, sizes that do not divide P, P in 1..=8), whatever the checker accepts, the
//! interpreter computes the same logical values as the all-Replicated program — and
//! whatever it rejects is a layout/shape error, never a panic. Integer-valued f64 data
//! keeps every sum exact, so results are compared for equality.

use coconet_core::*;
use proptest::prelude::*;

const NAMES: [&str; 3] = ["A", "B", "C"];

#[derive(Debug, Clone)]
struct Recipe {
    sizes: Vec<usize>,
    /// Per input: number of trailing dims it has, and its sliced dim (None = Replicated).
    inputs: Vec<(usize, Option<usize>)>,
    /// Binary ops folding the inputs left to right.
    ops: Vec<BinaryOp>,
    reduce: bool,
    ranks: usize,
}

fn recipe() -> impl Strategy<Value = Recipe> {
    (1usize..=3, 1usize..=8, any::<bool>())
        .prop_flat_map(|(rank, ranks, reduce)| {
            let sizes = prop::collection::vec(1usize..=7, rank);
            let input = (1..=rank).prop_flat_map(|r| (Just(r), prop::option::of(0..r)));
            let inputs = prop::collection::vec(input, 2..=4);
            let op = prop::sample::select(vec![
                BinaryOp::Add,
                BinaryOp::Sub,
                BinaryOp::Mul,
                BinaryOp::Max,
            ]);
            let ops = prop::collection::vec(op, 3);
            (sizes, inputs, ops, Just(reduce), Just(ranks))
        })
        .prop_map(|(sizes, inputs, ops, reduce, ranks)| Recipe {
            sizes,
            inputs,
            ops,
            reduce,
            ranks,
        })
}

fn input_shape(r: &Recipe, dims: usize) -> Shape {
    let rank = r.sizes.len();
    Shape::new(
        NAMES[rank - dims..rank]
            .iter()
            .map(|n| Dim::sym(*n))
            .collect(),
    )
}

/// Builds the program; `replicated` ignores the recipe's layouts.
fn build(r: &Recipe, replicated: bool) -> Result<(Program, ValueId), CheckError> {
    let mut b = ProgramBuilder::new("prop");
    let mut ids = Vec::new();
    for (i, &(dims, sliced)) in r.inputs.iter().enumerate() {
        let layout = match sliced {
            Some(d) if !replicated => Layout::Sliced(d),
            _ => Layout::Replicated,
        };
        ids.push(b.tensor_input(
            &format!("x{i}"),
            DType::F64,
            layout,
            input_shape(r, dims),
            0,
        )?);
    }
    let mut acc = ids[0];
    for (i, &x) in ids.iter().enumerate().skip(1) {
        acc = b.binary(r.ops[i - 1], acc, x)?;
    }
    if r.reduce {
        let s = b.reduce_all(ReduceKind::Sum, acc)?;
        acc = match b.ty(s).layout {
            Layout::Local => b.all_reduce(ReduceOp::Sum, s)?,
            _ => s,
        };
    }
    Ok((b.finish(), acc))
}

/// Binds the dims the program uses (binding others is an error) and the inputs' data.
fn bindings(r: &Recipe, p: &Program) -> Bindings {
    let rank = r.sizes.len();
    let mut args = Bindings::new();
    let used = p.symbols();
    for (n, s) in NAMES[..rank].iter().zip(&r.sizes) {
        if used.iter().any(|u| u == n) {
            args = args.dim(n, *s);
        }
    }
    for (i, &(dims, _)) in r.inputs.iter().enumerate() {
        let len: usize = r.sizes[rank - dims..].iter().product();
        let data: Vec<f64> = (0..len)
            .map(|k| ((k * 7 + i * 3) % 11) as f64 - 5.0)
            .collect();
        args = args.tensor(&format!("x{i}"), Binding::global(&data));
    }
    args
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn checked_layouts_compute_the_logical_values(r in recipe()) {
        let (reference, ref_out) = build(&r, true).expect("all-Replicated programs always check");
        let want: Vec<f64> = interpret(&reference, 1, &bindings(&r, &reference)).unwrap().logical(ref_out).unwrap();
        match build(&r, false) {
            Ok((p, out)) => {
                let run = interpret(&p, r.ranks, &bindings(&r, &p)).unwrap();
                let got: Vec<f64> = run.logical(out).unwrap();
                prop_assert_eq!(got, want);
            }
            Err(e) => prop_assert!(
                matches!(e.kind, ErrorKind::Layout | ErrorKind::Shape),
                "unexpected rejection: {}", e
            ),
        }
    }
}
