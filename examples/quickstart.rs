//! The README's main job: write Adam as a `#[coconet]` program, print the checked
//! program, run it on 4 simulated ranks with the reference interpreter, check the result
//! against a plain-Rust Adam, then derive CoCoNet's schedules (AR-C, RS-C-AG,
//! fuse(RS-C-AG)), check each against the program and print its per-rank memory; finally
//! run every schedule for real on 4 rank threads (the CPU runtime), check it against
//! the interpreter, and time it.
//!
//! `cargo run --release --example quickstart`

use coconet_example_programs::adam as program;
use coconet_example_programs::data;

use coconet::core::schedule::candidates;
use coconet::prelude::*;
use coconet::runtime::Plan;
use coconet::runtime::cpu::{Job, RunOptions};
use program::AdamParams;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const RANKS: usize = 4;
    let n = 1 << 14 | 3; // uneven on purpose
    let hp = AdamParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        step: 1,
    };

    // 1. The program, checked at compile time: dtype, layout and shape of every stage.
    let adam = program::adam();
    println!("{}", adam.program());
    println!(
        "(typed handles: `adam.g1` is stage {}, `adam.w1` is stage {}; \
         Graphviz: coconet::core::to_dot(adam.program()))\n",
        adam.g1.id(),
        adam.w1.id()
    );

    // 2. Run it on 4 ranks: each rank has its own gradient, all share w, m, v.
    let grads: Vec<Vec<f32>> = (0..RANKS).map(|r| data::uniform_f32(r as u64, n)).collect();
    let w = data::uniform_f32(10, n);
    let m = vec![0.0f32; n];
    let v = vec![0.0f32; n];
    let start = Instant::now();
    let run = adam.interpret(RANKS, program::adam_args(&grads, &w, &m, &v, hp))?;
    let elapsed = start.elapsed();

    // 3. Check: every rank holds bitwise the same new weights, equal to plain-Rust Adam.
    let (w_ref, _, _) = program::adam_reference(&grads, &w, &m, &v, hp);
    let w_new: Vec<f32> = run.final_input("w")?;
    for r in 1..RANKS {
        let same = run.local::<f32>(adam.w1, r) == run.local::<f32>(adam.w1, 0);
        if !same {
            return Err(format!("rank {r}'s weights differ from rank 0's").into());
        }
    }
    let f = |x: &[f32]| x.iter().map(|&a| a as f64).collect::<Vec<_>>();
    let err = data::max_rel_err(&f(&w_new), &f(&w_ref));
    println!(
        "ran adam on {RANKS} ranks (reference interpreter), N = {n}, in {:.1} ms",
        elapsed.as_secs_f64() * 1e3
    );
    println!("replicated weights identical on all ranks: yes");
    println!("max relative error vs plain-Rust Adam: {err:.2e}");
    if err > 1e-5 {
        return Err(format!("adam differs from the plain-Rust reference ({err:e})").into());
    }
    println!("check passed\n");

    // 4. Schedules: the same step, transformed. Each is checked on the interpreter
    //    against the program as written (bitwise), and its memory per rank is computed.
    let schedules = candidates(adam.program(), &[adam.m.id(), adam.v.id()]);
    let args = program::adam_args(&grads, &w, &m, &v, hp);
    let bindings: Bindings = args.into();
    let big: std::collections::BTreeMap<String, usize> = [("N".to_string(), 1 << 26)].into();
    let state = |run: &Execution| -> Result<Vec<Vec<u32>>, InterpError> {
        ["w", "m", "v"]
            .iter()
            .map(|name| Ok(bits(run.final_input(name)?)))
            .collect()
    };
    let reference = state(&interpret(adam.program(), RANKS, &bindings)?)?;
    println!("schedule          same result   memory per rank for N = 2^26 on {RANKS} ranks");
    for s in &schedules {
        let same = state(&interpret(s.program(), RANKS, &bindings)?)? == reference;
        println!(
            "{:<17} {:<13} {}",
            s.name(),
            if same { "bitwise" } else { "DIFFERS" },
            s.footprint(&big, RANKS)?
        );
        if !same {
            return Err(format!("schedule {} changed the result", s.name()).into());
        }
    }
    println!("\n{}", schedules.last().expect("three schedules"));

    // 5. The same schedules on the CPU runtime: 4 rank threads sharing memory, fused
    //    kernels and collectives. Checked bitwise against the interpreter, then timed
    //    on a larger N.
    for s in &schedules {
        let plan = Plan::lower(s, RANKS, bindings.dims())?;
        let mut job = Job::new(&plan, &bindings, RunOptions::default())?;
        job.run()?;
        let w: Vec<f32> = job.final_input("w")?;
        if bits(w) != reference[0] {
            return Err(format!(
                "runtime result of {} differs from the interpreter",
                s.name()
            )
            .into());
        }
    }
    let big_n = 1 << 22;
    let hp_big = AdamParams { step: 1, ..hp };
    let grads: Vec<Vec<f32>> = (0..RANKS)
        .map(|r| data::uniform_f32(r as u64, big_n))
        .collect();
    let zeros = vec![0.0f32; big_n];
    let big: Bindings = program::adam_args(
        &grads,
        &data::uniform_f32(10, big_n),
        &zeros,
        &zeros,
        hp_big,
    )
    .into();
    println!(
        "\nCPU runtime, {RANKS} rank threads, N = 2^22 (median of 5 steps; this machine has {} cores):",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("schedule          ms/step   speedup   runtime buffers per rank");
    let mut base = None;
    for s in &schedules {
        let plan = Plan::lower(s, RANKS, big.dims())?;
        let mut job = Job::new(&plan, &big, RunOptions::default())?;
        let mut times = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            job.run()?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        let ms = times[2];
        let base_ms = *base.get_or_insert(ms);
        println!(
            "{:<17} {:>7.1}   {:>6.2}x   {:>5} MiB",
            s.name(),
            ms,
            base_ms / ms,
            plan.slot_bytes() >> 20
        );
    }
    Ok(())
}

fn bits(v: Vec<f32>) -> Vec<u32> {
    v.into_iter().map(f32::to_bits).collect()
}
