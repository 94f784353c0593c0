//! What a training loop pays per iteration (written up in BENCHMARKS.md).
//!
//! `cargo bench --bench training_loop` — data-parallel Adam, fuse(RS-C-AG), P = 4 rank
//! threads, at N = 2^24 and 2^16 f32 (`COCONET_BENCH_N` for one other N). Contenders, in
//! interleaved rounds (the machine is shared; medians of the rounds):
//! - `run`: `Job::run` alone on a job prepared once;
//! - `loop`: one iteration as a user writes it — set the step counter and the learning
//!   rate, run with each rank's gradient lent from the caller's memory
//!   (`Job::run_with`), read every rank's updated `w` through a borrowed view;
//! - `loop+copy`: the same plus copying each rank's gradient into the job's buffer
//!   (`input_mut(..).copy_from_slice(..)`: the gradients come from elsewhere);
//! - `rebuild`: what a loop cost before the job could be reused — build `Bindings`,
//!   `Job::new`, run, read w, m, v back as `Vec`s (`final_input`).
//!
//! Also printed once: bind, prepare, and the process's resident memory during the loop
//! (the job, the user's gradients and the first N's job included).

use coconet_example_programs::adam as adam_program;
use coconet_example_programs::data;

use coconet::core::schedule::candidates;
use coconet::prelude::*;
use coconet::runtime::Plan;
use coconet::runtime::cpu::{Job, RunOptions};
use std::hint::black_box;
use std::time::{Duration, Instant};

const RANKS: usize = 4;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Resident set of this process now (Linux), in MiB.
fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn bench(n: usize, rounds: usize) {
    let p = adam_program::adam();
    let hp = |step: i32| adam_program::AdamParams {
        step,
        ..Default::default()
    };
    let grads: Vec<Vec<f32>> = (0..RANKS).map(|r| data::uniform_f32(r as u64, n)).collect();
    let w0 = data::uniform_f32(9, n);
    let zeros = vec![0.0f32; n];
    let schedule = candidates(p.program(), &[p.m.id(), p.v.id()])
        .into_iter()
        .find(|s| s.name().starts_with("fuse"))
        .expect("the fused schedule");
    let t = Instant::now();
    let args: Bindings = adam_program::adam_args(&grads, &w0, &zeros, &zeros, hp(1)).into();
    let bind = t.elapsed();
    let plan = Plan::lower(&schedule, RANKS, args.dims()).expect("plan");
    let t = Instant::now();
    let mut job = Job::new(&plan, &args, RunOptions::default()).expect("prepare");
    let prepare = t.elapsed();
    drop(args);
    job.run().expect("warm-up");
    let resident = rss_mib();

    let mut step = 1;
    let mut iteration = |job: &mut Job, copy: bool| {
        step += 1;
        if copy {
            for (r, g) in grads.iter().enumerate() {
                job.input_mut::<f32>("g", r).expect("g").copy_from_slice(g);
            }
        }
        job.set_scalar("step", step).expect("step");
        job.set_scalar("lr", 1e-3 / (1.0 + step as f64 * 1e-3))
            .expect("lr");
        if copy {
            job.run().expect("run");
        } else {
            let lent: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
            job.run_with("g", &lent).expect("run");
        }
        for r in 0..RANKS {
            black_box(job.input::<f32>("w", r).expect("w")[n - 1]);
        }
    };
    let (mut run, mut lp, mut lp_copy, mut rebuild) = (vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        let t = Instant::now();
        job.run().expect("run");
        run.push(t.elapsed());
        let t = Instant::now();
        iteration(&mut job, false);
        lp.push(t.elapsed());
        let t = Instant::now();
        iteration(&mut job, true);
        lp_copy.push(t.elapsed());
        // The old way is slow at large N: a few rounds suffice.
        if round < rounds.min(5) {
            let t = Instant::now();
            let args: Bindings = adam_program::adam_args(&grads, &w0, &zeros, &zeros, hp(2)).into();
            let mut fresh = Job::new(&plan, &args, RunOptions::default()).expect("prepare");
            fresh.run().expect("run");
            for name in ["w", "m", "v"] {
                black_box(fresh.final_input::<f32>(name).expect("read"));
            }
            rebuild.push(t.elapsed());
        }
    }
    let (run, lp, lp_copy, rebuild) = (median(run), median(lp), median(lp_copy), median(rebuild));
    println!(
        "| 2^{} | {:.3} | {:.3} ({:.3}×) | {:.3} ({:.3}×) | {:.1} ({:.1}×) | {:.1} | {:.1} | {} |",
        n.trailing_zeros(),
        ms(run),
        ms(lp),
        ms(lp) / ms(run),
        ms(lp_copy),
        ms(lp_copy) / ms(run),
        ms(rebuild),
        ms(rebuild) / ms(run),
        ms(bind),
        ms(prepare),
        resident.map_or("?".into(), |m| format!("{m:.0}")),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let sizes: Vec<usize> = match std::env::var("COCONET_BENCH_N").ok() {
        Some(s) => vec![s.parse().expect("COCONET_BENCH_N is a number")],
        None => vec![1 << 16, 1 << 24],
    };
    println!(
        "P = {RANKS}, Adam fuse(RS-C-AG), medians of interleaved rounds, times in ms \
         (ratio to run)\n"
    );
    println!(
        "| N | run | loop | loop+copy | rebuild | bind (once) | prepare (once) | RSS in the loop, MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for n in sizes {
        let rounds = if n <= 1 << 18 { 400 } else { 15 };
        bench(n, rounds);
    }
}
