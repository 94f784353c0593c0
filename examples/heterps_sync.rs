//! HeterPS's planner with a stage's data-parallel synchronisation priced three ways, on
//! every shipped model with the shipped catalogue at the model's own throughput:
//!
//! - `paper`: the paper's ring all-reduce, the optimizer update free;
//! - `AR-C`: the all-reduce, then the AdamW update on every replica (what a framework
//!   without coconet runs);
//! - `coconet`: the cheapest of coconet's schedules at each replica count (AR-C,
//!   RS-C-AG, fuse(RS-C-AG)), their traffic counted by coconet's cost model.
//!
//! Prints each optimal plan and its cost, and checks that pricing the synchronisation
//! by coconet's schedules changes some shipped model's optimal plan.
//!
//! `cargo run --release --features hetero --example heterps_sync`

use coconet::hetero::schedulers::{Dp, Optimality, Scheduler, SearchConfig};
use coconet::hetero::{Evaluation, Problem, SyncModel};

/// The plan as `layers type×units` per stage, with the synchronisation schedule of
/// stages with several replicas where the model names one.
fn describe(problem: &Problem, e: &Evaluation) -> String {
    e.stages
        .iter()
        .map(|s| {
            let t = &problem.catalog.types[s.stage.ty];
            let schedule =
                match problem
                    .sync
                    .seconds_per_byte(s.units, t.mem_bandwidth, t.sync_bandwidth)
                {
                    (_, Some(name)) if s.units > 1 => format!(" [{name}]"),
                    _ => String::new(),
                };
            format!(
                "{}-{} {}×{}{schedule}",
                s.stage.first, s.stage.last, t.name, s.units
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("coconet-hetero/data");
    let coconet_sync = coconet::hetero_sync::coconet_schedules()?;
    let SyncModel::Schedules(all) = &coconet_sync else {
        return Err("coconet's synchronisation is a list of schedules".into());
    };
    let arc_only = SyncModel::Schedules(all.iter().filter(|s| s.name == "AR-C").cloned().collect());
    let models = [
        "ctr-dnn",
        "word2vec-nce",
        "two-tower",
        "bert-large",
        "gpt-96",
    ];
    let mut changed = Vec::new();
    for name in models {
        let base = coconet::hetero::load(
            data.join(format!("{name}.toml")),
            data.join("catalog.toml"),
            None,
        )?;
        println!("## {name} at {} samples/s", base.constraint.throughput);
        let mut plans = Vec::new();
        for (label, sync) in [
            ("paper", SyncModel::Ring),
            ("AR-C", arc_only.clone()),
            ("coconet", coconet_sync.clone()),
        ] {
            let problem = base.clone().with_sync(sync);
            // No time limit: the checks below compare optimal plans, so every answer must
            // be proven (under load or in a debug build, 8 s can end the search early).
            let config = SearchConfig {
                time_limit: None,
                ..SearchConfig::default()
            };
            match Dp::default().schedule(&problem, &config) {
                Ok(outcome) => {
                    if outcome.optimality != Optimality::Proven {
                        return Err(format!(
                            "{name} ({label}): the plan is not proven optimal: {:?}",
                            outcome.optimality
                        )
                        .into());
                    }
                    let e = &outcome.evaluation;
                    let plan = describe(&problem, e);
                    println!(
                        "  {label:>8}: ${:.2} ({:?}) {plan}",
                        e.cost, outcome.optimality
                    );
                    let stages: Vec<_> = e
                        .stages
                        .iter()
                        .map(|s| (s.stage.first, s.stage.last, s.stage.ty, s.units))
                        .collect();
                    plans.push((label, stages, e.cost));
                }
                Err(err) => println!("  {label:>8}: {err}"),
            }
        }
        let plan_of = |l: &str| plans.iter().find(|p| p.0 == l);
        if let (Some(arc), Some(ours)) = (plan_of("AR-C"), plan_of("coconet")) {
            if arc.1 != ours.1 {
                changed.push(name);
            }
            if ours.2 > arc.2 * (1.0 + 1e-9) {
                return Err(format!(
                    "{name}: coconet's schedules include AR-C, so its plan cannot cost more"
                )
                .into());
            }
        }
        println!();
    }
    println!("optimal plans changed by coconet's schedules (against AR-C): {changed:?}");
    if changed.is_empty() {
        return Err("no shipped model's plan changes".into());
    }
    Ok(())
}
