//! Every example program on the reference interpreter, for many rank counts and sizes
//! that do not divide them, against its plain-Rust reference.

use coconet_example_programs::{
    adam as adam_program, data, lamb as lamb_program, megatron as megatron_program,
    pipeline as pipeline_program, sgd as sgd_program,
};

use coconet::core::{Element, ValueId};
use coconet::prelude::*;

const RANKS: [usize; 6] = [1, 2, 3, 4, 5, 8];

fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn grads(ranks: usize, n: usize) -> Vec<Vec<f32>> {
    (0..ranks)
        .map(|r| data::uniform_f32(100 + r as u64, n))
        .collect()
}

/// Replicated outputs must be bitwise identical on every rank.
fn assert_replicated<T: Element>(run: &Execution, v: impl Into<ValueId> + Copy) {
    let bits = |r: usize| -> Vec<u64> {
        let data: Vec<T> = run.local(v, r).expect("every rank holds it");
        data.into_iter().map(|x| x.to_f64().to_bits()).collect()
    };
    for r in 1..run.ranks() {
        assert_eq!(bits(r), bits(0), "rank {r} differs from rank 0");
    }
}

#[test]
fn sgd_matches_plain_rust() {
    let p = sgd_program::sgd();
    for ranks in RANKS {
        for n in [1, 7, 10, 129] {
            let g = grads(ranks, n);
            let w = data::uniform_f32(1, n);
            let args = sgd_program::sgd::Args {
                N: n,
                g: TensorArg::PerRank(g.clone()),
                w: TensorArg::Global(w.clone()),
                lr: 0.05,
            };
            let run = p.interpret(ranks, args).unwrap();
            let got: Vec<f32> = run.final_input("w").unwrap();
            let want = sgd_program::sgd_reference(&g, &w, 0.05);
            let err = data::max_rel_err(&f64s(&got), &f64s(&want));
            assert!(err <= 2e-7, "P = {ranks}, N = {n}: error {err}");
            assert_replicated::<f32>(&run, p.w1);
        }
    }
}

#[test]
fn adam_matches_plain_rust() {
    let p = adam_program::adam();
    let hp = adam_program::AdamParams {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        step: 4,
    };
    for ranks in RANKS {
        let n = 37;
        let g = grads(ranks, n);
        let (w, m) = (data::uniform_f32(2, n), data::uniform_f32(3, n));
        let v: Vec<f32> = data::uniform_f32(4, n).iter().map(|x| x * x).collect();
        let args = adam_program::adam_args(&g, &w, &m, &v, hp);
        let run = p.interpret(ranks, args).unwrap();
        let (w1, m1, v1) = adam_program::adam_reference(&g, &w, &m, &v, hp);
        for (name, want) in [("w", w1), ("m", m1), ("v", v1)] {
            let got: Vec<f32> = run.final_input(name).unwrap();
            let err = data::max_rel_err(&f64s(&got), &f64s(&want));
            assert!(err <= 1e-5, "P = {ranks}, {name}: error {err}");
        }
        assert_replicated::<f32>(&run, p.w1);
        assert_replicated::<f32>(&run, p.m1);
    }
}

#[test]
fn lamb_matches_plain_rust() {
    let p = lamb_program::lamb();
    let hp = lamb_program::LambParams {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-6,
        weight_decay: 0.01,
        step: 2,
    };
    for ranks in RANKS {
        for n in [5, 64] {
            let g = grads(ranks, n);
            let (w, m) = (data::uniform_f32(5, n), data::uniform_f32(6, n));
            let v: Vec<f32> = data::uniform_f32(7, n).iter().map(|x| x * x).collect();
            let args = lamb_program::lamb_args(&g, &w, &m, &v, hp);
            let run = p.interpret(ranks, args).unwrap();
            let (w1, _, _) = lamb_program::lamb_reference(&g, &w, &m, &v, hp);
            let got: Vec<f32> = run.final_input("w").unwrap();
            let err = data::max_rel_err(&f64s(&got), &f64s(&w1));
            assert!(err <= 1e-5, "P = {ranks}, N = {n}: error {err}");
            assert_replicated::<f32>(&run, p.w1);
        }
    }
    // A zero weight tensor takes trust ratio 1 (the select guards), not NaN.
    let n = 4;
    let args = lamb_program::lamb_args(
        &[vec![0.5; n], vec![0.5; n]],
        &[0.0; 4],
        &[0.0; 4],
        &[0.0; 4],
        lamb_program::LambParams {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-6,
            weight_decay: 0.0,
            step: 1,
        },
    );
    let got: Vec<f32> = p.interpret(2, args).unwrap().final_input("w").unwrap();
    assert!(got.iter().all(|x| x.is_finite() && *x < 0.0), "{got:?}");
}

#[test]
fn megatron_matches_plain_rust() {
    let p = megatron_program::megatron();
    for ranks in [1, 2, 3, 4, 8] {
        let (b, s, h) = (2, 2, 6);
        let half = |v: Vec<f64>| v.into_iter().map(f16::from_f64).collect::<Vec<_>>();
        let back = |v: &[f16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
        let x = half(data::uniform(11, b * s * h));
        let w = half(data::uniform(12, h * h));
        let bias = half(data::uniform(13, h));
        let r = half(data::uniform(14, b * s * h));
        let gamma = half(vec![1.0; h]);
        let beta = half(vec![0.0; h]);
        let args = megatron_program::megatron::Args {
            B: b,
            S: s,
            H: h,
            x: TensorArg::Global(x.clone()),
            w: TensorArg::Global(w.clone()),
            b: TensorArg::Global(bias.clone()),
            r: TensorArg::Global(r.clone()),
            gamma: TensorArg::Global(gamma.clone()),
            beta: TensorArg::Global(beta.clone()),
            seed: 5,
        };
        let run = p.interpret(ranks, args).unwrap();
        let got: Vec<f16> = run.logical(p.out).unwrap();
        let inputs = megatron_program::MegatronInputs {
            x: &back(&x),
            w: &back(&w),
            b: &back(&bias),
            r: &back(&r),
            gamma: &back(&gamma),
            beta: &back(&beta),
        };
        let want =
            megatron_program::megatron_reference(&inputs, b * s, h, f16::from_f64(0.1).to_f64(), 5);
        let err = back(&got)
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(err < 0.05, "P = {ranks}: error {err}");
        assert_replicated::<f16>(&run, p.out);
    }
}

#[test]
fn pipeline_matches_plain_rust() {
    let p = pipeline_program::pipeline();
    for ranks in [2, 4, 6, 8] {
        let q = ranks / 2;
        let (b, h) = (3, 5);
        let xs: Vec<Vec<f32>> = (0..q)
            .map(|i| data::uniform_f32(50 + i as u64, b * h))
            .collect();
        let bias = data::uniform_f32(60, h);
        let r = data::uniform_f32(61, b * h);
        let args = pipeline_program::pipeline::Args {
            B: b,
            H: h,
            x: TensorArg::PerRank(xs.clone()),
            b: TensorArg::Global(bias.clone()),
            r: TensorArg::Global(r.clone()),
            seed: 3,
        };
        let run = p.interpret(ranks, args).unwrap();
        let want = pipeline_program::pipeline_reference(&xs, &bias, &r, 3);
        for rank in 0..ranks {
            let got: Option<Vec<f32>> = run.local(p.out, rank);
            if rank < q {
                assert!(
                    got.is_none(),
                    "group 0 rank {rank} should not hold the sent value"
                );
            } else {
                let err = data::max_rel_err(&f64s(&got.unwrap()), &f64s(&want));
                assert!(err <= 2e-7, "P = {ranks}, rank {rank}: error {err}");
            }
        }
    }
    // A pipeline of two groups cannot run on an odd number of ranks.
    let args = pipeline_program::pipeline::Args {
        B: 1,
        H: 1,
        x: TensorArg::Global(vec![0.0]),
        b: TensorArg::Global(vec![0.0]),
        r: TensorArg::Global(vec![0.0]),
        seed: 0,
    };
    assert!(matches!(
        p.interpret(3, args),
        Err(InterpError::Ranks {
            ranks: 3,
            groups: 2,
            ..
        })
    ));
}
