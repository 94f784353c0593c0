//! Failure behaviour of the CPU runtime: a rank that panics, a rank that disappears, bad
//! bindings — each gives an error naming the culprit, and nothing hangs.

use coconet_example_programs::adam as adam_program;
use coconet_example_programs::data;

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
    RunOptions::default()
        .with_timeout(Duration::from_secs(2))
        .with_fault(fault)
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

/// A rank that stops without an error — before a collective, between two, or after the
/// last one (where its peers finish and nothing used to notice: `run()` returned `Ok`
/// with Replicated `w` different on different ranks) — fails the run with its own
/// report, naming it;
/// and after any failed run the job hands out none of its (possibly torn) state. The
/// guarantee: a failed step makes every read and run of the job an error; the caller
/// prepares a new job from its own copy of the state.
#[test]
fn a_rank_that_fails_or_vanishes_at_any_step_fails_the_run_and_seals_the_job() {
    let (p, args) = setup(100);
    for s in candidates(p.program(), &[p.m.id(), p.v.id()]) {
        let plan = Plan::lower(&s, RANKS, args.dims()).unwrap();
        for step in 0..plan.steps().len() {
            for fault in [
                Fault::Vanish { rank: 1, step },
                Fault::Panic { rank: 1, step },
            ] {
                let what = format!("{} {fault:?}", s.name());
                let mut job = Job::new(&plan, &args, options(Some(fault))).unwrap();
                // The failure is rank 1's own report, which reaches its peers at once —
                // not a peer's timeout waiting for it.
                let own = match fault {
                    Fault::Vanish { .. } => "stopped after",
                    _ => "panicked",
                };
                match job.run() {
                    Err(RuntimeError::RankFailed { rank: 1, message })
                        if message.contains(own) && !message.contains("never arrived") => {}
                    other => panic!("{what}: expected rank 1's own failure, got {other:?}"),
                }
                for name in ["w", "m", "v"] {
                    assert!(
                        job.final_input::<f32>(name).is_err(),
                        "{what}: `{name}` readable"
                    );
                }
                assert!(job.input::<f32>("w", 0).is_err(), "{what}");
                assert!(job.local::<f32>(p.w1, 0).is_none(), "{what}");
                assert!(job.run().is_err(), "{what}");
            }
        }
    }
}

/// A rank that never arrives is named as the culprit (the error's rank), not the rank
/// that gave up waiting for it; a timeout too long to add to a clock means no deadline
/// (`Duration::MAX` used to overflow and panic).
#[test]
fn a_stuck_rank_is_the_one_named() {
    let (p, args) = setup(100);
    let s = &candidates(p.program(), &[p.m.id(), p.v.id()])[2];
    let plan = Plan::lower(s, RANKS, args.dims()).unwrap();
    let stuck =
        options(Some(Fault::Stall { rank: 3, step: 1 })).with_timeout(Duration::from_millis(200));
    let mut job = Job::new(&plan, &args, stuck).unwrap();
    match job.run() {
        Err(RuntimeError::RankFailed { rank: 3, message }) => {
            assert!(message.contains("[3] never arrived"), "{message}")
        }
        other => panic!("expected rank 3 named, got {other:?}"),
    }
    let forever = options(None).with_timeout(Duration::MAX);
    let mut job = Job::new(&plan, &args, forever).unwrap();
    job.run().unwrap();
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
    let mut job = Job::new(&plan, &args, RunOptions::default().with_trace(true)).unwrap();
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
