//! Full reductions follow one reference order (`coconet_core::numerics::ReduceAcc`: blocks of 2048,
//! 256 lanes, a lane tree, then levels of blocks) on every backend: f64 data whose sum
//! depends on the order of additions, bitwise against the interpreter, around the block
//! boundaries, on rank threads, the CUDA kernels (emulated) and the multi-process path.

use coconet::core::*;
use coconet::runtime::{Backend, JobData, Plan};

/// Values over forty binades with alternating signs: every order of additions rounds
/// differently.
fn data(n: usize, salt: usize) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let sign = if (i + salt).is_multiple_of(3) {
                -1.0
            } else {
                1.0
            };
            sign * 2f64.powi(((i * 7 + salt) % 40) as i32) * (1.0 + (i % 97) as f64 * 1e-3)
        })
        .collect()
}

fn program(kind: ReduceKind) -> (Program, ValueId) {
    let mut b = ProgramBuilder::new("reduce");
    let x = b
        .tensor_input(
            "x",
            DType::F64,
            Layout::Local,
            Shape::new(vec![Dim::sym("N")]),
            0,
        )
        .unwrap();
    let y = b.reduce_all(kind, x).unwrap();
    b.output(y).unwrap();
    (b.finish(), y)
}

/// A reduction's result on rank `r` is the interpreter's, bit for bit.
fn same_bits(kind: ReduceKind, n: usize, r: usize, got: f64, want: f64) {
    assert_eq!(
        got.to_bits(),
        want.to_bits(),
        "{kind:?} of {n} on rank {r}: {got} vs interpreter {want}"
    );
}

/// Every kind of full reduction.
const KINDS: [ReduceKind; 4] = [
    ReduceKind::Sum,
    ReduceKind::Norm2,
    ReduceKind::Max,
    ReduceKind::Min,
];

fn check<B: Backend>(backend: &B, local: impl Fn(&B::Job, ValueId, usize) -> Option<Vec<f64>>) {
    let ranks = 2;
    for kind in KINDS {
        let (p, y) = program(kind);
        for n in [0, 1, 2047, 2049, 5000] {
            let args = Bindings::new()
                .dim("N", n)
                .tensor("x", Binding::per_rank(&[data(n, 1), data(n, 2)]));
            let want = interpret(&p, ranks, &args).unwrap();
            let plan = Plan::lower(&Schedule::new(&p), ranks, args.dims()).unwrap();
            let mut job = backend.prepare(&plan, &args).unwrap();
            backend.run(&mut job).unwrap();
            for r in 0..ranks {
                let got = local(&job, y, r).unwrap();
                same_bits(kind, n, r, got[0], want.local::<f64>(y, r).unwrap()[0]);
            }
        }
    }
}

#[test]
fn the_data_tells_orders_apart() {
    let xs = data(5000, 1);
    let sequential: f64 = xs.iter().sum();
    assert_ne!(ReduceKind::Sum.eval(&xs).to_bits(), sequential.to_bits());
}

#[test]
fn rank_threads() {
    check(&coconet::runtime::cpu::Cpu::default(), |j, v, r| {
        j.local(v, r)
    });
}

#[test]
fn cuda_kernels_emulated() {
    check(&coconet::runtime::cuda::EmulatedCuda, |j, v, r| {
        j.local(v, r)
    });
}

#[test]
fn cuda_ranks_emulated() {
    check(
        &coconet::runtime::cuda::EmulatedRanks::default(),
        |j, v, r| j.local(v, r),
    );
}

/// A full reduction of a fused all-reduce's reduced value (LAMB's norms, clipping's
/// global norm): the CUDA kernel folds it into its first level (one value per block of
/// 2048, each a 256-lane fold and tree) instead of writing every value out; bitwise
/// against the interpreter around the block boundaries (one block, several, a partial
/// last one, levels above the first), every kind, on one GPU's virtual ranks and on
/// ranks with memories of their own.
fn check_folded<B: Backend>(backend: &B) {
    let ranks = 2;
    for kind in KINDS {
        let mut b = ProgramBuilder::new("folded");
        let shape = Shape::new(vec![Dim::sym("N")]);
        let x = b
            .tensor_input("x", DType::F64, Layout::Local, shape.clone(), 0)
            .unwrap();
        let w = b
            .tensor_input("w", DType::F64, Layout::Replicated, shape, 0)
            .unwrap();
        let s = b.all_reduce(ReduceOp::Sum, x).unwrap();
        let t = b.reduce_all(kind, s).unwrap();
        let moved = b.binary(BinaryOp::Add, w, t).unwrap();
        b.update(w, moved).unwrap();
        b.output(t).unwrap();
        let p = b.finish();
        let fused = schedule::candidates(&p, &[])
            .into_iter()
            .find(|s| s.name() == "fuse(RS-C-AG)")
            .expect("a fused schedule");
        // Per rank: 1, 2047, 2049 and 2·2048 + 3 reduced values.
        for n in [2, 4094, 4098, 8198] {
            let args = Bindings::new()
                .dim("N", n)
                .tensor("x", Binding::per_rank(&[data(n, 1), data(n, 2)]))
                .tensor("w", Binding::global(&data(n, 3)));
            let want = interpret(fused.program(), ranks, &args).unwrap();
            let plan = Plan::lower(&fused, ranks, args.dims()).unwrap();
            let launches = coconet::runtime::cuda::CudaProgram::generate(&plan)
                .unwrap()
                .describe(&plan);
            assert!(
                launches
                    .lines()
                    .any(|l| l.contains("_fused[") && l.ends_with("Rows(2048)")),
                "the fused kernel folds the reduction:\n{launches}"
            );
            let mut job = backend.prepare(&plan, &args).unwrap();
            backend.run(&mut job).unwrap();
            for r in 0..ranks {
                let got = job.local::<f64>(t, r).unwrap();
                same_bits(kind, n, r, got[0], want.local::<f64>(t, r).unwrap()[0]);
                let got = job.final_input_local::<f64>("w", r).unwrap();
                let exp = want.final_input_local::<f64>("w", r).unwrap();
                assert!(
                    got.iter()
                        .zip(&exp)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{kind:?} of {n}: w on rank {r}"
                );
            }
        }
    }
}

#[test]
fn folded_in_the_cuda_kernels_emulated() {
    check_folded(&coconet::runtime::cuda::EmulatedCuda);
}

#[test]
fn folded_across_cuda_ranks_emulated() {
    check_folded(&coconet::runtime::cuda::EmulatedRanks::default());
}

/// Max and min propagate NaN on every backend (as torch's `all_reduce(MAX)` and `max`
/// do: a NaN gradient is not hidden): all-reduces, elementwise `max`/`min` and full
/// reductions give NaN wherever any operand is NaN, and agree with the interpreter
/// elsewhere.
fn check_nan<B: Backend>(backend: &B, local: impl Fn(&B::Job, ValueId, usize) -> Option<Vec<f64>>) {
    let ranks = 2;
    let n = 4100;
    let mut b = ProgramBuilder::new("nan");
    let shape = Shape::new(vec![Dim::sym("N")]);
    let x = b
        .tensor_input("x", DType::F32, Layout::Local, shape, 0)
        .unwrap();
    let mut outs = vec![
        b.all_reduce(ReduceOp::Max, x).unwrap(),
        b.all_reduce(ReduceOp::Min, x).unwrap(),
    ];
    let y = b.unary(UnaryOp::Neg, x).unwrap();
    outs.push(b.binary(BinaryOp::Max, x, y).unwrap());
    outs.push(b.binary(BinaryOp::Min, x, y).unwrap());
    outs.push(b.reduce_all(ReduceKind::Max, x).unwrap());
    outs.push(b.reduce_all(ReduceKind::Min, x).unwrap());
    for &o in &outs {
        b.output(o).unwrap();
    }
    let p = b.finish();
    // NaN at a few positions on rank 1 only (one in the last, partial block).
    let xs: Vec<Vec<f32>> = (0..ranks)
        .map(|r| {
            (0..n)
                .map(|i| {
                    if r == 1 && [3, 2048, 4099].contains(&i) {
                        f32::NAN
                    } else {
                        (i as f32 * 0.37 + r as f32).sin()
                    }
                })
                .collect()
        })
        .collect();
    let args = Bindings::new()
        .dim("N", n)
        .tensor("x", Binding::per_rank(&xs));
    let want = interpret(&p, ranks, &args).unwrap();
    let plan = Plan::lower(&Schedule::new(&p), ranks, args.dims()).unwrap();
    let mut job = backend.prepare(&plan, &args).unwrap();
    backend.run(&mut job).unwrap();
    for (k, &o) in outs.iter().enumerate() {
        for r in 0..ranks {
            let got = local(&job, o, r).unwrap();
            let exp = want.local::<f64>(o, r).unwrap();
            assert_eq!(got.len(), exp.len());
            for (i, (g, e)) in got.iter().zip(&exp).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "output {k}, rank {r}, element {i}"
                );
            }
            // Where a NaN entered, NaN came out.
            let nan_in = |i: usize| (k < 2 || r == 1) && [3, 2048, 4099].contains(&i);
            if k < 4 {
                assert!(
                    (0..n).all(|i| got[i].is_nan() == nan_in(i)),
                    "output {k}, rank {r}"
                );
            } else {
                assert_eq!(got[0].is_nan(), r == 1, "full reduction {k} on rank {r}");
            }
        }
    }
}

#[test]
fn nan_propagates_on_rank_threads() {
    check_nan(&coconet::runtime::cpu::Cpu::default(), |j, v, r| {
        j.local(v, r)
    });
}

#[test]
fn nan_propagates_in_the_cuda_kernels_emulated() {
    check_nan(&coconet::runtime::cuda::EmulatedCuda, |j, v, r| {
        j.local(v, r)
    });
}

#[test]
fn nan_propagates_across_cuda_ranks_emulated() {
    check_nan(
        &coconet::runtime::cuda::EmulatedRanks::default(),
        |j, v, r| j.local(v, r),
    );
}

use coconet_test_support::loopback;

#[test]
fn nan_propagates_across_processes_over_tcp() {
    check_nan(&loopback::Loopback::default(), |j, v, r| j.local(v, r));
}
