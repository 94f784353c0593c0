//! The autotuner on every shipped program: each candidate schedule × kernel chunk
//! length is checked against the reference interpreter, timed in interleaved rounds on
//! 4 rank threads, and the fastest is chosen and cached; a second call must come from
//! the cache, with the same choice.
//!
//! `cargo run --release --example tune` (`-- --big` for the optimizers at N = 2^24,
//! `-- --cache PATH` to keep the choices in PATH instead of a temporary file).

use coconet_example_programs::adam as adam_program;
use coconet_example_programs::data;
use coconet_example_programs::lamb as lamb_program;
use coconet_example_programs::megatron as megatron_program;
use coconet_example_programs::pipeline as pipeline_program;
use coconet_example_programs::sgd as sgd_program;

use adam_program::AdamParams;
use coconet::core::Schedule;
use coconet::core::schedule::candidates;
use coconet::prelude::*;
use coconet::runtime::cuda::{AccessChoice, MultiGpu};
use coconet::runtime::tune::{TuneOptions, Variant, tune};
use lamb_program::LambParams;

const RANKS: usize = 4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let big = args.iter().any(|a| a == "--big");
    let cache = match args.iter().position(|a| a == "--cache") {
        Some(i) => args.get(i + 1).ok_or("--cache needs a path")?.into(),
        None => std::env::temp_dir().join(format!("coconet-tune-{}.json", std::process::id())),
    };
    let n = if big { 1 << 24 } else { 1 << 20 };
    let options = TuneOptions {
        cache: Some(cache.clone()),
        ..TuneOptions::default()
    };
    println!("machine: {}; {RANKS} rank threads", options.machine);
    let variants = Variant::cpu_chunks(&[1024, 4096, 16384]);

    let grads: Vec<Vec<f32>> = (0..RANKS).map(|r| data::uniform_f32(r as u64, n)).collect();
    let w = data::uniform_f32(10, n);
    let zeros = vec![0.0f32; n];

    let sgd = sgd_program::sgd();
    let sgd_args: Bindings = sgd_program::sgd::Args {
        N: n,
        g: TensorArg::PerRank(grads.clone()),
        w: TensorArg::Global(w.clone()),
        lr: 1e-3,
    }
    .into();
    let adam = adam_program::adam();
    let hp = AdamParams::default();
    let adam_args: Bindings = adam_program::adam_args(&grads, &w, &zeros, &zeros, hp).into();
    let lamb = lamb_program::lamb();
    let lhp = LambParams::default();
    let lamb_args: Bindings = lamb_program::lamb_args(&grads, &w, &zeros, &zeros, lhp).into();
    let megatron = megatron_program::megatron();
    let (b, s, h) = (8, 64, 512);
    let megatron_args: Bindings = megatron_program::megatron_args(b, s, h, 7).into();
    let pipeline = pipeline_program::pipeline();
    let (pb, ph) = (256, 1024);
    let pipeline_args: Bindings = pipeline_program::pipeline::Args {
        B: pb,
        H: ph,
        x: TensorArg::PerRank(
            (0..RANKS / 2)
                .map(|i| data::uniform_f32(20 + i as u64, pb * ph))
                .collect(),
        ),
        b: TensorArg::Global(data::uniform_f32(30, ph)),
        r: TensorArg::Global(data::uniform_f32(31, pb * ph)),
        seed: 3,
    }
    .into();

    let cases: Vec<(String, &Program, Vec<Schedule>, &Bindings)> = vec![
        (
            format!("sgd, N = {n}"),
            sgd.program(),
            candidates(sgd.program(), &[]),
            &sgd_args,
        ),
        (
            format!("adam, N = {n}"),
            adam.program(),
            candidates(adam.program(), &[adam.m.id(), adam.v.id()]),
            &adam_args,
        ),
        (
            format!("lamb, N = {n}"),
            lamb.program(),
            candidates(lamb.program(), &[lamb.m.id(), lamb.v.id()]),
            &lamb_args,
        ),
        (
            format!("megatron, [{b}, {s}, {h}] f16"),
            megatron.program(),
            candidates(megatron.program(), &[]),
            &megatron_args,
        ),
        (
            format!("pipeline, [{pb}, {ph}]"),
            pipeline.program(),
            candidates(pipeline.program(), &[]),
            &pipeline_args,
        ),
    ];
    for (what, program, schedules, bindings) in &cases {
        let tuning = tune(program, schedules, &variants, RANKS, bindings, &options)?;
        println!("\n{what}:\n{tuning}");
        let fastest = tuning
            .table
            .iter()
            .min_by_key(|m| m.median)
            .ok_or("empty table")?;
        if tuning.best != *fastest || tuning.schedule(schedules).is_none() {
            return Err(format!("{what}: the choice is not the fastest contender").into());
        }
        if !tuning.rejected.is_empty() {
            return Err(format!(
                "{what}: a shipped candidate was rejected: {:?}",
                tuning.rejected
            )
            .into());
        }
        // The next run of the script skips tuning.
        let again = tune(program, schedules, &variants, RANKS, bindings, &options)?;
        if !again.from_cache || again.best != tuning.best {
            return Err(format!("{what}: the cached choice was not reused").into());
        }
    }
    tune_gpu_access(n, &options)?;
    println!("\nchoices cached in {}", cache.display());
    if !args.iter().any(|a| a == "--cache") {
        std::fs::remove_file(&cache)?;
    }
    Ok(())
}

/// Adam's schedules × the CUDA backend's peer access (mapped memory, or exchanges
/// unpipelined and in chunks of 1, 4 and 16 MiB) on every GPU, where this machine has
/// two or more (a build with the `cuda` feature).
fn tune_gpu_access(n: usize, options: &TuneOptions) -> Result<(), Box<dyn std::error::Error>> {
    let gpus = match MultiGpu::every_gpu() {
        Ok(gpus) if gpus.ordinals().len() >= 2 => gpus,
        Ok(_) => {
            println!("\none GPU: no peer access to tune");
            return Ok(());
        }
        Err(e) => {
            println!("\nthe CUDA peer access is not tuned here: {e}");
            return Ok(());
        }
    };
    let ranks = gpus.ordinals().len();
    let grads: Vec<Vec<f32>> = (0..ranks).map(|r| data::uniform_f32(r as u64, n)).collect();
    let w = data::uniform_f32(10, n);
    let zeros = vec![0.0f32; n];
    let adam = adam_program::adam();
    let args: Bindings =
        adam_program::adam_args(&grads, &w, &zeros, &zeros, AdamParams::default()).into();
    let schedules = candidates(adam.program(), &[adam.m.id(), adam.v.id()]);
    let variants = Variant::cuda_access(&gpus, &gpus.access_choices());
    // One contender's GPU memory at a time (the budget counts host memory): timed one
    // after the other rather than interleaved.
    let options = TuneOptions {
        backend: "cuda".into(),
        memory_budget: 0,
        ..options.clone()
    };
    let tuning = tune(
        adam.program(),
        &schedules,
        &variants,
        ranks,
        &args,
        &options,
    )?;
    println!("\nadam on {ranks} GPUs, N = {n}:\n{tuning}");
    if !tuning.rejected.is_empty() {
        return Err(format!("a GPU contender was rejected: {:?}", tuning.rejected).into());
    }
    Ok(())
}
