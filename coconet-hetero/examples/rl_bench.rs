//! The RL scheduler against the exact DP on every case of `benchmark_table`, per seed:
//! the evidence behind BENCHMARKS.md's RL column (median over seeds), with the genetic
//! scheduler alongside as the bar RL must clear.
//!
//! `cargo run --release -p coconet-hetero --features rl --example rl_bench -- [seeds] [schedulers] [models]`
//!
//! `seeds` is a count (default 5: seeds 1..=5), `schedulers` a comma-separated list of
//! names (default `rl,genetic`; `rl:key=value;...` sets [`Reinforce`]'s fields, for
//! tuning; `rl:pretrained=PATH` starts from `rl_pretrain`'s weights), `models` a comma-separated filter on the model names. Environment:
//! `RL_BENCH_LEVEL` keeps one throughput, `RL_BENCH_BUDGET` replaces the budget of
//! 2,000 evaluations, `RL_BENCH_PLANS` prints every plan found.

use std::time::Instant;

use coconet_hetero::Constraint;
use coconet_hetero::schedulers::{self, Dp, Reinforce, Scheduler, SearchConfig};

use cases::CASES;
use coconet_hetero::instances::cases;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A scheduler by name; `rl:key=value;...` sets [`Reinforce`]'s fields (for tuning).
fn scheduler(name: &str) -> Result<Box<dyn Scheduler>, Box<dyn std::error::Error>> {
    let Some(settings) = name.strip_prefix("rl:") else {
        return Ok(schedulers::named(name)?);
    };
    let mut r = Reinforce::default();
    for kv in settings.split(';') {
        let (k, v) = kv.split_once('=').ok_or("rl settings are key=value")?;
        match k {
            "hidden" => r.hidden = v.parse()?,
            "episodes" => r.episodes_per_update = v.parse()?,
            "updates" => r.max_updates = v.parse()?,
            "patience" => r.patience = v.parse()?,
            "gain" => r.min_gain = v.parse()?,
            "lr" => r.learning_rate = v.parse()?,
            "entropy" => r.entropy = v.parse()?,
            "cuts" => r.prior_cuts = v.parse()?,
            "same" => r.prior_same_type = v.parse()?,
            "grow" => r.prior_grow = v.parse()?,
            "full" => r.prior_same_type_full = v.parse()?,
            "eff" => r.prior_efficiency = v.parse()?,
            "restarts" => r.restarts = v.parse()?,
            "prior_only" => r.prior_only_runs = v.parse()?,
            "pretrained" => {
                r.pretrained = Some(std::sync::Arc::new(
                    coconet_hetero::schedulers::PolicyWeights::load(v)?,
                ));
            }
            _ => return Err(format!("unknown rl setting {k}").into()),
        }
    }
    Ok(Box::new(r))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seeds: u64 = args.first().map_or(Ok(5), |s| s.parse())?;
    let names: Vec<String> = args
        .get(1)
        .map_or("rl,genetic", String::as_str)
        .split(',')
        .map(str::to_string)
        .collect();
    let filter: Option<Vec<&str>> = args.get(2).map(|s| s.split(',').collect());
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/data");
    // Per scheduler: the median gaps (%) of every case, and planning times (s).
    let mut medians: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for (model, levels) in CASES {
        if filter.as_ref().is_some_and(|f| !f.contains(&model)) {
            continue;
        }
        let base = coconet_hetero::load(
            format!("{dir}/{model}.toml"),
            format!("{dir}/catalog.toml"),
            None,
        )?;
        for x in levels {
            if std::env::var("RL_BENCH_LEVEL").is_ok_and(|v| v.parse() != Ok(x)) {
                continue;
            }
            let pb = base.with_constraint(Constraint::new(x, base.constraint.samples)?);
            let opt = Dp::default().schedule(&pb, &SearchConfig::default())?;
            println!(
                "{model} {x:e}: optimum {:.2} [{}]",
                opt.evaluation.cost,
                opt.evaluation.stage_summary(&pb.catalog)
            );
            for (i, name) in names.iter().enumerate() {
                let s = scheduler(name)?;
                let mut gaps = Vec::new();
                let mut line = String::new();
                for seed in 1..=seeds {
                    let cfg = SearchConfig {
                        seed,
                        budget: std::env::var("RL_BENCH_BUDGET")
                            .ok()
                            .and_then(|b| b.parse().ok())
                            .unwrap_or(2000),
                        ..SearchConfig::default()
                    };
                    let start = Instant::now();
                    let r = s.schedule(&pb, &cfg);
                    let secs = start.elapsed().as_secs_f64();
                    times[i].push(secs);
                    let gap = r.as_ref().map_or(f64::INFINITY, |o| {
                        (o.evaluation.cost / opt.evaluation.cost - 1.0) * 100.0
                    });
                    let evals = r.as_ref().map_or(0, |o| o.evaluations);
                    if std::env::var_os("RL_BENCH_PLANS").is_some()
                        && let Ok(o) = &r
                    {
                        println!(
                            "    seed {seed}: {}",
                            o.evaluation.stage_summary(&pb.catalog)
                        );
                    }
                    line += &format!(" {gap:.1}%({evals}ev,{secs:.2}s)");
                    gaps.push(gap);
                }
                let m = median(&mut gaps);
                medians[i].push(m);
                println!("  {name:8} median {m:6.1}% |{line}");
            }
        }
    }
    for (i, name) in names.iter().enumerate() {
        let finite: Vec<f64> = medians[i]
            .iter()
            .copied()
            .filter(|g| g.is_finite())
            .collect();
        println!(
            "{name}: mean median gap {:.1}% over {} finite of {} cases, worst {:.1}%, mean time {:.2}s, max {:.2}s",
            finite.iter().sum::<f64>() / finite.len().max(1) as f64,
            finite.len(),
            medians[i].len(),
            medians[i].iter().copied().fold(0.0, f64::max),
            times[i].iter().sum::<f64>() / times[i].len().max(1) as f64,
            times[i].iter().copied().fold(0.0, f64::max),
        );
    }
    Ok(())
}
