//! The cost model against measurement: calibrates this machine, then for every shipped
//! program at three sizes and P = 2 and 4 predicts every candidate schedule's time and
//! measures it (the autotuner's interleaved rounds), and reports the error per row and
//! whether the model ranks the schedules as measurement does.
//!
//! `cargo run --release --example cost_model` (`-- --quick`: the smallest size only;
//! `-- --layers`: the Megatron layer and the pipeline boundary only;
//! `-- --calibrate`: print this machine's parameters as TOML and stop;
//! `-- --machine FILE`: use parameters from FILE instead of calibrating;
//! `-- --steps TEXT`: for the cases whose name contains TEXT, each step's predicted
//! and measured time instead of the table: where a miss comes from).

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
use coconet::runtime::Plan;
use coconet::runtime::model::{Machine, calibrate, predict};
use coconet::runtime::tune::{TuneOptions, Variant, tune};
use lamb_program::LambParams;

/// A Megatron layer's `[B, S, H]` and a pipeline boundary's `[B, H]`.
type LayerSizes = ((usize, usize, usize), (usize, usize));

/// One program at one size: its name, the program, its candidates, bindings for `ranks`.
type Case = (
    String,
    Program,
    Vec<Schedule>,
    Box<dyn Fn(usize) -> Bindings>,
);

fn optimizer_cases(n: usize) -> Vec<Case> {
    let grads = move |ranks: usize| -> Vec<Vec<f32>> {
        (0..ranks).map(|r| data::uniform_f32(r as u64, n)).collect()
    };
    let w = move || data::uniform_f32(10, n);
    let sgd = sgd_program::sgd();
    let adam = adam_program::adam();
    let lamb = lamb_program::lamb();
    vec![
        (
            format!("sgd N={n}"),
            sgd.program().clone(),
            candidates(sgd.program(), &[]),
            Box::new(move |ranks| {
                sgd_program::sgd::Args {
                    N: n,
                    g: TensorArg::PerRank(grads(ranks)),
                    w: TensorArg::Global(w()),
                    lr: 1e-3,
                }
                .into()
            }),
        ),
        (
            format!("adam N={n}"),
            adam.program().clone(),
            candidates(adam.program(), &[adam.m.id(), adam.v.id()]),
            Box::new(move |ranks| {
                let hp = AdamParams::default();
                let z = vec![0.0; n];
                adam_program::adam_args(&grads(ranks), &w(), &z, &z, hp).into()
            }),
        ),
        (
            format!("lamb N={n}"),
            lamb.program().clone(),
            candidates(lamb.program(), &[lamb.m.id(), lamb.v.id()]),
            Box::new(move |ranks| {
                let hp = LambParams::default();
                let z = vec![0.0; n];
                lamb_program::lamb_args(&grads(ranks), &w(), &z, &z, hp).into()
            }),
        ),
    ]
}

fn layer_cases((b, s, h): (usize, usize, usize), (pb, ph): (usize, usize)) -> Vec<Case> {
    let megatron = megatron_program::megatron();
    let pipeline = pipeline_program::pipeline();
    vec![
        (
            format!("megatron [{b},{s},{h}]"),
            megatron.program().clone(),
            candidates(megatron.program(), &[]),
            Box::new(move |_| megatron_program::megatron_args(b, s, h, 7).into()),
        ),
        (
            format!("pipeline [{pb},{ph}]"),
            pipeline.program().clone(),
            candidates(pipeline.program(), &[]),
            Box::new(move |ranks| {
                pipeline_program::pipeline::Args {
                    B: pb,
                    H: ph,
                    x: TensorArg::PerRank(
                        (0..ranks / 2)
                            .map(|i| data::uniform_f32(20 + i as u64, pb * ph))
                            .collect(),
                    ),
                    b: TensorArg::Global(data::uniform_f32(30, ph)),
                    r: TensorArg::Global(data::uniform_f32(31, pb * ph)),
                    seed: 3,
                }
                .into()
            }),
        ),
    ]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let machine = match args.iter().position(|a| a == "--machine") {
        Some(i) => Machine::from_toml(&std::fs::read_to_string(
            args.get(i + 1).ok_or("--machine needs a file")?,
        )?)?,
        None => calibrate()?,
    };
    if flag("--calibrate") {
        print!("{}", machine.to_toml());
        return Ok(());
    }
    println!("{}", machine.to_toml());
    let sizes: &[usize] = if flag("--quick") {
        &[1 << 16]
    } else {
        &[1 << 16, 1 << 20, 1 << 22]
    };
    let layers: &[LayerSizes] = if flag("--quick") {
        &[((4, 16, 128), (64, 256))]
    } else {
        &[
            ((4, 16, 128), (64, 256)),
            ((8, 64, 512), (256, 1024)),
            ((8, 128, 1024), (1024, 1024)),
        ]
    };
    let mut cases: Vec<Case> = Vec::new();
    if !flag("--layers") {
        for &n in sizes {
            cases.extend(optimizer_cases(n));
        }
    }
    for &(m, p) in layers {
        cases.extend(layer_cases(m, p));
    }
    let options = TuneOptions {
        cache: None,
        ..TuneOptions::default()
    };
    if let Some(i) = args.iter().position(|a| a == "--steps") {
        let filter = args.get(i + 1).ok_or("--steps needs a case name")?;
        for (what, _, schedules, bind) in cases.iter().filter(|c| c.0.contains(filter.as_str())) {
            for ranks in [2usize, 4] {
                for schedule in schedules {
                    steps_table(what, schedule, ranks, &bind(ranks), &machine)?;
                }
            }
        }
        return Ok(());
    }
    let variants = Variant::cpu_chunks(&[coconet::runtime::cpu::CHUNK]);
    let (mut errors, mut settings, mut same_best, mut same_order) = (Vec::new(), 0, 0, 0);
    println!(
        "| case | P | schedule | measured ms | predicted ms | error |\n|---|---|---|---|---|---|"
    );
    for (what, program, schedules, bind) in &cases {
        for ranks in [2usize, 4] {
            let bindings = bind(ranks);
            let tuning = tune(program, schedules, &variants, ranks, &bindings, &options)?;
            let mut rows = Vec::new();
            for m in &tuning.table {
                let plan = Plan::lower(&schedules[m.schedule_index], ranks, bindings.dims())?;
                let predicted = predict(&plan, &machine).total.as_secs_f64() * 1e3;
                let measured = m.median.as_secs_f64() * 1e3;
                let error = predicted / measured - 1.0;
                errors.push(error.abs());
                println!(
                    "| {what} | {ranks} | {} | {measured:.3} | {predicted:.3} | {:+.0} % |",
                    m.schedule,
                    error * 100.0
                );
                rows.push((m.schedule.clone(), measured, predicted));
            }
            settings += 1;
            let order = |key: fn(&(String, f64, f64)) -> f64| {
                let mut r = rows.clone();
                r.sort_by(|a, b| key(a).total_cmp(&key(b)));
                r.into_iter().map(|x| x.0).collect::<Vec<_>>()
            };
            let (by_measure, by_model) = (order(|r| r.1), order(|r| r.2));
            same_best += usize::from(by_measure.first() == by_model.first());
            same_order += usize::from(by_measure == by_model);
        }
    }
    errors.sort_by(f64::total_cmp);
    let within = errors.iter().filter(|&&e| e <= 0.25).count();
    println!(
        "\n{} predictions: median |error| {:.0} %, largest {:.0} %, {} within 25 %; \
         the model's fastest is the measured fastest in {same_best} of {settings} settings, \
         the whole order agrees in {same_order}",
        errors.len(),
        errors[errors.len() / 2] * 100.0,
        errors.last().copied().unwrap_or(0.0) * 100.0,
        within
    );
    if errors.iter().any(|e| !e.is_finite()) {
        return Err("a prediction is not a finite time".into());
    }
    Ok(())
}

/// Prints each step of `schedule` on `ranks` rank threads: its predicted time, and its
/// measured time (the slowest rank's span, median of 15 traced runs after 3 warm-ups).
fn steps_table(
    what: &str,
    schedule: &Schedule,
    ranks: usize,
    bindings: &Bindings,
    machine: &Machine,
) -> Result<(), Box<dyn std::error::Error>> {
    let plan = Plan::lower(schedule, ranks, bindings.dims())?;
    let prediction = predict(&plan, machine);
    let options = coconet::runtime::cpu::RunOptions::default().with_trace(true);
    let mut job = coconet::runtime::cpu::Job::new(&plan, bindings, options)?;
    let mut per_step: Vec<Vec<f64>> = vec![Vec::new(); prediction.steps.len()];
    let mut totals = Vec::new();
    for round in 0..18 {
        let start = std::time::Instant::now();
        job.run()?;
        let total = start.elapsed().as_secs_f64();
        let trace: serde_json::Value = serde_json::from_str(&job.trace_json())?;
        let mut slowest = vec![0.0f64; per_step.len()];
        let mut seen = vec![0usize; ranks];
        for e in trace["traceEvents"].as_array().into_iter().flatten() {
            let (Some(rank), Some(dur)) = (e["tid"].as_u64(), e["dur"].as_f64()) else {
                continue;
            };
            if e["ph"] != "X" {
                continue;
            }
            let i = &mut seen[rank as usize];
            if let Some(s) = slowest.get_mut(*i) {
                *s = s.max(dur / 1e3);
            }
            *i += 1;
        }
        if round >= 3 {
            totals.push(total * 1e3);
            for (all, s) in per_step.iter_mut().zip(slowest) {
                all.push(s);
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("\n{what}, P = {ranks}, {}:", schedule.name());
    println!("| step | MB | predicted ms | measured ms |\n|---|---|---|---|");
    for ((name, demand, t), all) in prediction.steps.iter().zip(&mut per_step) {
        println!(
            "| {name} | {:.1} | {:.3} | {:.3} |",
            demand.memory_bytes / 1e6,
            t.as_secs_f64() * 1e3,
            median(all)
        );
    }
    println!(
        "| whole run | | {:.3} | {:.3} |",
        prediction.total.as_secs_f64() * 1e3,
        median(&mut totals)
    );
    Ok(())
}
