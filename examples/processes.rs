//! Adam's fused step with one rank per process over TCP — what a training loop started by
//! `coconet-launch` pays per iteration — timed beside the same plan on rank threads.
//!
//! `cargo run --release --example processes -- [--ranks P] [--log2n K] [--iters I]`
//! (defaults 2, 20, 9) starts P copies of itself through the launcher (the library's
//! `launch`, as `coconet-launch --nproc-per-node P` would), each binding only its own
//! gradient (`Binding::this_rank`) and running the loop: write the gradient, set the
//! step, run, read the weights. Rank 0 prints the median iteration and the median
//! `run()` within it, and the median `run()` of the same plan on P rank threads in one
//! process, measured after the processes are done (the machine is not shared between
//! the two). The processes put the job's buffers in memory they share where they can
//! (`COCONET_TCP_DATA=single-copy` moves every byte in messages copied once, `stream`
//! through the sockets).
//!
//! Checks, and exits non-zero if one fails: every rank's weights, m and v after the
//! first iteration equal the rank-thread job's bitwise (N ≤ 2^22; above, the rank-thread
//! job's P gradients would not fit a small machine twice over).

use coconet_example_programs::adam as adam_program;
use coconet_example_programs::data;

use coconet::core::schedule::candidates;
use coconet::prelude::*;
use coconet::runtime::Plan;
use coconet::runtime::cpu::{Job, ProcessJob, RunOptions, Tcp};
use coconet::runtime::launch::{LaunchConfig, LaunchEnv, launch};
use std::time::Instant;

type Error = Box<dyn std::error::Error>;

/// The command line: ranks, log2 of the parameter count, iterations.
fn options() -> Result<(usize, usize, usize), Error> {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str, default: usize| -> Result<usize, Error> {
        match args.iter().position(|a| a == name) {
            None => Ok(default),
            Some(i) => Ok(args
                .get(i + 1)
                .ok_or(format!("{name} needs a value"))?
                .parse()
                .map_err(|e| format!("{name}: {e}"))?),
        }
    };
    let (ranks, log2n, iters) = (
        value("--ranks", 2)?,
        value("--log2n", 20)?,
        value("--iters", 9)?,
    );
    if ranks == 0 || iters == 0 || log2n > 30 {
        return Err("--ranks and --iters must be at least 1, --log2n at most 30".into());
    }
    Ok((ranks, log2n, iters))
}

fn hp(step: i32) -> adam_program::AdamParams {
    adam_program::AdamParams {
        step,
        ..Default::default()
    }
}

/// Every rank's gradient (rank r's from seed r).
fn gradient(rank: usize, n: usize) -> Vec<f32> {
    data::uniform_f32(10 + rank as u64, n)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The fused schedule's plan for `ranks` ranks and bindings with `g` bound by `grads`.
fn plan(ranks: usize, n: usize, grads: Binding) -> Result<(Plan, Bindings), Error> {
    let p = adam_program::adam();
    let zeros = vec![0.0f32; n];
    let args: Bindings =
        adam_program::adam_args(&[], &data::uniform_f32(1, n), &zeros, &zeros, hp(1)).into();
    let args = args.tensor("g", grads);
    let fused = candidates(p.program(), &[p.m.id(), p.v.id()])
        .into_iter()
        .find(|s| s.name() == "fuse(RS-C-AG)")
        .ok_or("Adam has a fused schedule")?;
    Ok((Plan::lower(&fused, ranks, args.dims())?, args))
}

/// One rank's process: the training loop over TCP; rank 0 reports.
fn rank(env: &LaunchEnv, n: usize, iters: usize) -> Result<(), Error> {
    let (rank, ranks) = (env.rank, env.world_size);
    let g = gradient(rank, n);
    let (plan, args) = plan(ranks, n, Binding::this_rank(&g))?;
    let mut job = ProcessJob::new(&plan, &args, Tcp::from_env()?)?;
    if let Ok(c) = std::env::var("ROUND_CHUNKS") {
        job.set_round_chunks(c.parse()?);
    }
    let mut times = Vec::new();
    let mut runs = Vec::new();
    for it in 0..iters {
        let t = Instant::now();
        job.input_mut::<f32>("g", rank)?.copy_from_slice(&g);
        job.set_scalar("step", it as i32 + 1)?;
        let t2 = Instant::now();
        job.run()?;
        runs.push(t2.elapsed().as_secs_f64());
        let w: &[f32] = job.input("w", rank)?;
        std::hint::black_box(w);
        times.push(t.elapsed().as_secs_f64());
        if it == 0 && n <= 1 << 22 {
            check(&job, rank, ranks, n)?;
        }
    }
    if rank == 0 {
        println!(
            "{ranks} processes over TCP, N = {n}: median iteration {:.3} ms run {:.3}",
            median(times) * 1e3,
            median(runs) * 1e3
        );
    }
    Ok(())
}

/// This rank's w, m and v after one step equal the rank-thread job's bitwise.
fn check(job: &ProcessJob, rank: usize, ranks: usize, n: usize) -> Result<(), Error> {
    let all: Vec<Vec<f32>> = (0..ranks).map(|r| gradient(r, n)).collect();
    let (plan, args) = plan(ranks, n, Binding::per_rank(&all))?;
    let mut threads = Job::new(&plan, &args, RunOptions::default())?;
    threads.run()?;
    for name in ["w", "m", "v"] {
        let (a, b): (Vec<f32>, Vec<f32>) = (
            job.final_input_local(name, rank)?,
            threads.final_input_local(name, rank)?,
        );
        if a.iter().zip(&b).any(|(x, y)| x.to_bits() != y.to_bits()) || a.len() != b.len() {
            return Err(format!("rank {rank}: `{name}` differs from the rank-thread job's").into());
        }
    }
    Ok(())
}

/// The same plan's `run()` on rank threads in this process: the median.
fn threads(ranks: usize, n: usize, iters: usize) -> Result<f64, Error> {
    let all: Vec<Vec<f32>> = (0..ranks).map(|r| gradient(r, n)).collect();
    let (plan, args) = plan(ranks, n, Binding::per_rank(&all))?;
    drop(all);
    let mut job = Job::new(&plan, &args, RunOptions::default())?;
    let mut times = Vec::new();
    for it in 0..iters {
        job.set_scalar("step", it as i32 + 1)?;
        let t = Instant::now();
        job.run()?;
        times.push(t.elapsed().as_secs_f64());
    }
    Ok(median(times))
}

fn main() -> Result<(), Error> {
    let (ranks, log2n, iters) = options()?;
    let n = 1 << log2n;
    if let Ok(env) = LaunchEnv::from_env() {
        return rank(&env, n, iters);
    }
    let mut config = LaunchConfig::new(std::env::current_exe()?, ranks);
    config.master_port = 0;
    config.args = std::env::args_os().skip(1).collect();
    launch(&config)?;
    println!(
        "{ranks} rank threads, N = {n}: median run {:.3} ms",
        threads(ranks, n, iters)? * 1e3
    );
    if n <= 1 << 22 {
        println!("checked: every process's state equals the rank-thread job's");
    }
    Ok(())
}
