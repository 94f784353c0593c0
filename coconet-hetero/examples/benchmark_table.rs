//! Prints the BENCHMARKS.md table: cost per scheduler and gap to the optimum on every
//! shipped model at three throughput levels, at an equal evaluation budget.
//!
//! `cargo run --release -p coconet-hetero --features rl --example benchmark_table`

use std::time::Instant;

use coconet_hetero::Constraint;
use coconet_hetero::schedulers::{self, SearchConfig};

use cases::CASES;
use coconet_hetero::instances::cases;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/data");
    let budget = 2000;
    let names = schedulers::names();
    println!(
        "| model | X_req (samples/s) | optimum $ | {} |",
        names
            .iter()
            .map(|n| format!("{n} gap %"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|---|---|{}", "---|".repeat(names.len()));
    let mut times: Vec<(String, String, f64)> = Vec::new();
    for (model, levels) in CASES {
        let base = coconet_hetero::load(
            format!("{dir}/{model}.toml"),
            format!("{dir}/catalog.toml"),
            None,
        )?;
        for x in levels {
            let pb = base.with_constraint(Constraint::new(x, base.constraint.samples)?);
            let cfg = SearchConfig {
                seed: 1,
                budget,
                ..SearchConfig::default()
            };
            let mut cells = Vec::new();
            let mut optimum = None;
            for s in schedulers::all() {
                let start = Instant::now();
                let r = s.schedule(&pb, &cfg);
                let secs = start.elapsed().as_secs_f64();
                times.push((model.to_string(), s.name().to_string(), secs));
                match r {
                    Ok(o) => {
                        let c = o.evaluation.cost;
                        let opt = *optimum.get_or_insert(c);
                        cells.push(format!("{:.1}", (c / opt - 1.0) * 100.0));
                    }
                    Err(coconet_hetero::PlanError::TooLarge { .. }) => cells.push("n/a".into()),
                    Err(_) => cells.push("none found".into()),
                }
            }
            println!(
                "| {model} | {x:e} | {} | {} |",
                optimum.map_or("infeasible".to_string(), |o| format!("{o:.2}")),
                cells.join(" | ")
            );
        }
    }
    println!("\nMean planning time per run (ms), over the three throughput levels:\n");
    println!("| model | {} |", names.join(" | "));
    println!("|---|{}", "---|".repeat(names.len()));
    for (model, _) in CASES {
        let cells: Vec<String> = names
            .iter()
            .map(|n| {
                let v: Vec<f64> = times
                    .iter()
                    .filter(|t| t.0 == model && &t.1 == n)
                    .map(|t| t.2)
                    .collect();
                format!("{:.1}", v.iter().sum::<f64>() / v.len() as f64 * 1e3)
            })
            .collect();
        println!("| {model} | {} |", cells.join(" | "));
    }
    Ok(())
}
