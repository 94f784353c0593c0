//! Failure behaviour of the CPU runtime: a rank that panics, a rank that disappears, bad
//! bindings — each gives an error naming the culprit, and nothing hangs.

#[allow(dead_code)]
#[path = "../examples/programs/adam.rs"]
mod adam_program;
#[allow(dead_code)]
#[path = "../examples/programs/data.rs"]
mod data;

use coconet::core::schedule::candidates;
use coconet::prelude::*;
use coconet::runtime::cpu::{Fault, Job, RunOptions};
use coconet::runtime::{Plan, RuntimeError};
use std::time::Duration;

const RANKS: usize = 4;

fn setup(n: usize) -> (adam_program::adam::Program, Bindings) {
    let p = adam_program::adam();
    let hp = adam_program::AdamParams {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        step: 1,
    };
    let grads: Vec<Vec<f32>> = (0..RANKS).map(|r| data::uniform_f32(r as u64, n)).collect();
    let w = data::uniform_f32(9, n);
    let args = adam_program::adam_args(&grads, &w, &vec![0.0; n], &vec![0.0; n], hp);
    (p, args.into())
}

fn options(fault: Option<Fault>) -> RunOptions {
    RunOptions {
        timeout: Duration::from_secs(2),
        trace: false,
        fault,
    }
}

#[test]
fn a_panicking_rank_fails_every_rank_with_its_name() {
    let (p, args) = setup(1000);
    for s in candidates(p.program(), &[p.m.id(), p.v.id()]) {
        let plan = Plan::lower(&s, RANKS, args.dims()).unwrap();
        let steps = plan.steps().len();
        for step in [0, steps / 2, steps - 1] {
            let mut job =
                Job::new(&plan, &args, options(Some(Fault::Panic { rank: 2, step }))).unwrap();
            match job.run() {
                Err(RuntimeError::RankFailed { rank: 2, message }) => {
                    assert!(message.contains("panicked"), "{message}")
                }
                other => panic!(
                    "{} step {step}: expected rank 2's failure, got {other:?}",
                    s.name()
                ),
            }
            // The job is unusable afterwards, and says so.
            assert!(
                job.run()
                    .unwrap_err()
                    .to_string()
                    .contains("earlier run failed")
            );
        }
    }
}

#[test]
fn a_vanished_rank_is_named_after_the_timeout() {
    let (p, args) = setup(100);
    let s = &candidates(p.program(), &[p.m.id(), p.v.id()])[2];
    let plan = Plan::lower(s, RANKS, args.dims()).unwrap();
    let mut job = Job::new(
        &plan,
        &args,
        options(Some(Fault::Vanish { rank: 1, step: 1 })),
    )
    .unwrap();
    let err = job.run().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("[1] never arrived"), "{text}");
}

#[test]
fn bad_bindings_are_rejected_before_anything_runs() {
    let (p, args) = setup(10);
    let s = &candidates(p.program(), &[p.m.id(), p.v.id()])[2];
    let plan = Plan::lower(s, RANKS, args.dims()).unwrap();
    let short = args.clone().tensor("w", Binding::global(&[0.0f32; 9]));
    let err = Job::new(&plan, &short, RunOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "binding: input `w`: expected 10 elements for shape [10], got 9"
    );
    let mut missing = args.clone();
    missing.tensors_mut().remove("g");
    assert_eq!(
        Job::new(&plan, &missing, RunOptions::default())
            .unwrap_err()
            .to_string(),
        "binding: input `g` is not bound"
    );
    // m is stored sliced in this schedule: per-rank blocks must have the block sizes.
    let blocks = args.clone().tensor(
        "m",
        Binding::per_rank(&[vec![0.0f32; 3], vec![0.0; 3], vec![0.0; 3], vec![0.0; 3]]),
    );
    assert_eq!(
        Job::new(&plan, &blocks, RunOptions::default())
            .unwrap_err()
            .to_string(),
        "binding: input `m` on rank 2: expected 2 elements for shape [2], got 3"
    );
    let other_dims = args.clone().dim("N", 11);
    assert!(
        Job::new(&plan, &other_dims, RunOptions::default())
            .unwrap_err()
            .to_string()
            .contains("lowered for dims")
    );
    assert!(Plan::lower(s, 0, args.dims()).is_err());
    // The caller's data is untouched by a failed run: the job holds copies.
    let mut job = Job::new(
        &plan,
        &args,
        options(Some(Fault::Panic { rank: 0, step: 1 })),
    )
    .unwrap();
    assert!(job.run().is_err());
    let again = Job::new(&plan, &args, RunOptions::default()).unwrap();
    assert_eq!(
        again.final_input::<f32>("w").unwrap(),
        data::uniform_f32(9, 10)
    );
}

#[test]
fn trace_shows_every_rank() {
    let (p, args) = setup(10_000);
    let s = &candidates(p.program(), &[p.m.id(), p.v.id()])[2];
    let plan = Plan::lower(s, RANKS, args.dims()).unwrap();
    let mut job = Job::new(
        &plan,
        &args,
        RunOptions {
            trace: true,
            ..RunOptions::default()
        },
    )
    .unwrap();
    job.run().unwrap();
    let trace: serde_json::Value = serde_json::from_str(&job.trace_json()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    for r in 0..RANKS {
        assert!(
            events
                .iter()
                .any(|e| e["tid"] == r
                    && e["name"].as_str().unwrap().starts_with("fused all-reduce"))
        );
    }
}
