//! Full reductions follow one reference order (`coconet_core::ReduceAcc`: blocks of 2048,
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

fn check<B: Backend>(backend: &B, local: impl Fn(&B::Job, ValueId, usize) -> Option<Vec<f64>>) {
    let ranks = 2;
    for kind in [
        ReduceKind::Sum,
        ReduceKind::Norm2,
        ReduceKind::Max,
        ReduceKind::Min,
    ] {
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
                let exp = want.local::<f64>(y, r).unwrap();
                assert_eq!(
                    got[0].to_bits(),
                    exp[0].to_bits(),
                    "{kind:?} of {n} on rank {r}: {} vs interpreter {}",
                    got[0],
                    exp[0]
                );
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
