//! The candle trainer (feature `candle`): its step is bitwise the reference interpreter
//! running the same AdamW program on the same gradients, every replica gets the same
//! weights, and bad replicas or gradients are clear errors that leave the weights alone.
#![cfg(feature = "candle")]

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use coconet::candle::{AdamWConfig, DataParallelAdamW, TrainError, adamw_program};
use coconet::prelude::*;

fn var(values: &[f32], shape: &[usize]) -> Var {
    Var::from_tensor(&Tensor::from_slice(values, shape, &Device::Cpu).unwrap()).unwrap()
}

fn values(v: &Var) -> Vec<f32> {
    v.as_tensor().flatten_all().unwrap().to_vec1().unwrap()
}

const SHAPES: [&[usize]; 2] = [&[3, 4], &[5]];

fn init(i: usize) -> Vec<f32> {
    let n: usize = SHAPES[i].iter().product();
    (0..n)
        .map(|k| ((k * 7 + i * 3) % 11) as f32 / 10.0 - 0.5)
        .collect()
}

fn replicas(ranks: usize) -> Vec<Vec<Var>> {
    (0..ranks)
        .map(|_| (0..2).map(|i| var(&init(i), SHAPES[i])).collect())
        .collect()
}

/// Rank r's gradient of parameter i (made by backpropagating sum(w · c)).
fn coefficient(r: usize, i: usize, step: usize) -> Vec<f32> {
    let n: usize = SHAPES[i].iter().product();
    (0..n)
        .map(|k| ((k * 5 + r * 13 + i * 3 + step * 17) % 19) as f32 / 9.0 - 1.0)
        .collect()
}

fn grads(replica: &[Var], r: usize, step: usize, only: usize) -> GradStore {
    let mut loss = Tensor::zeros((), DType::F32, &Device::Cpu).unwrap();
    for (i, v) in replica.iter().enumerate().take(only) {
        let c = Tensor::from_slice(&coefficient(r, i, step), SHAPES[i], &Device::Cpu).unwrap();
        loss = (loss + (v.as_tensor() * c).unwrap().sum_all().unwrap()).unwrap();
    }
    loss.backward().unwrap()
}

#[test]
fn steps_are_bitwise_the_interpreter_and_replicas_agree() {
    let ranks = 3;
    let config = AdamWConfig {
        lr: 0.01,
        ..AdamWConfig::default()
    };
    let reps = replicas(ranks);
    let mut trainer = DataParallelAdamW::new(reps.clone(), config).unwrap();
    let mut w: Vec<f32> = (0..2).flat_map(init).collect();
    let n = w.len();
    let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
    let p = adamw_program();
    for step in 0..5 {
        let stores: Vec<GradStore> = (0..ranks).map(|r| grads(&reps[r], r, step, 2)).collect();
        trainer.step(&stores).unwrap();
        let g: Vec<Vec<f32>> = (0..ranks)
            .map(|r| (0..2).flat_map(|i| coefficient(r, i, step)).collect())
            .collect();
        let args = Bindings::new()
            .dim("N", n)
            .tensor("g", Binding::per_rank(&g))
            .tensor("w", Binding::global(&w))
            .tensor("m", Binding::global(&m))
            .tensor("v", Binding::global(&v))
            .scalar("lr", config.lr)
            .scalar("beta1", config.beta1)
            .scalar("beta2", config.beta2)
            .scalar("eps", config.eps)
            .scalar("weight_decay", config.weight_decay)
            .scalar("step", step as i32 + 1);
        let want = interpret(p.program(), ranks, &args).unwrap();
        w = want.final_input("w").unwrap();
        m = want.final_input("m").unwrap();
        v = want.final_input("v").unwrap();
        for (r, replica) in reps.iter().enumerate() {
            let got: Vec<f32> = replica.iter().flat_map(values).collect();
            let bits = |x: &[f32]| x.iter().map(|y| y.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&w), "step {step}, replica {r}");
        }
    }
    assert_eq!(trainer.steps(), 5);
    // Each rank holds 1/P of m and v.
    assert!(trainer.state_bytes_per_rank() <= 2 * 4 * n.div_ceil(ranks));
}

#[test]
fn bad_replicas_and_gradients_are_clear_errors_that_change_nothing() {
    let mismatch = |e: TrainError| match e {
        TrainError::Mismatch(m) => m,
        other => panic!("expected a mismatch, got {other}"),
    };
    let mut reps = replicas(2);
    reps[1][0] = var(&[0.0; 12], &[3, 4]);
    let e = mismatch(
        DataParallelAdamW::new(reps, AdamWConfig::default())
            .err()
            .unwrap(),
    );
    assert!(e.contains("parameter 0 of replica 1 differs"), "{e}");
    let mut reps = replicas(2);
    reps[1][1] = var(&init(1)[..4], &[4]);
    let e = mismatch(
        DataParallelAdamW::new(reps, AdamWConfig::default())
            .err()
            .unwrap(),
    );
    assert!(e.contains("parameter 1 of replica 1"), "{e}");
    let f64_var = Var::from_tensor(&Tensor::zeros(3, DType::F64, &Device::Cpu).unwrap()).unwrap();
    let e = mismatch(
        DataParallelAdamW::new(vec![vec![f64_var]], AdamWConfig::default())
            .err()
            .unwrap(),
    );
    assert!(e.contains("F64"), "{e}");

    let reps = replicas(2);
    let mut trainer = DataParallelAdamW::new(reps.clone(), AdamWConfig::default()).unwrap();
    let before: Vec<Vec<f32>> = reps.iter().flat_map(|r| r.iter().map(values)).collect();
    let unchanged = || {
        let now: Vec<Vec<f32>> = reps.iter().flat_map(|r| r.iter().map(values)).collect();
        assert_eq!(now, before);
    };
    // A gradient missing for one rank.
    let stores = vec![grads(&reps[0], 0, 0, 2), grads(&reps[1], 1, 0, 1)];
    let e = mismatch(trainer.step(&stores).unwrap_err());
    assert!(
        e.contains("no gradient for parameter 1 of replica 1"),
        "{e}"
    );
    unchanged();
    // One store for two replicas.
    let e = mismatch(trainer.step(&stores[..1]).unwrap_err());
    assert!(e.contains("1 gradient stores for 2 replicas"), "{e}");
    unchanged();
    // The trainer still works after refusing a step.
    let stores = vec![grads(&reps[0], 0, 0, 2), grads(&reps[1], 1, 0, 2)];
    trainer.step(&stores).unwrap();
    assert_eq!(trainer.steps(), 1);
}
