//! Plans the planners bench's synthetic chain at any length, with caps on its types, and
//! prints how long the exact DP took and what it proved — the issue's "10,000 layers with
//! binding caps" case:
//!
//! ```text
//! cargo run --release -p coconet-hetero --example large_chain -- 10000 0 64 64 0
//! ```
//!
//! Arguments: the number of layers, then a cap per type (cpu, t4, a100, h100; 0 for none).

use coconet_hetero::schedulers::{Dp, Optimality, Scheduler, SearchConfig};
use std::time::Instant;

use coconet_hetero::instances::chain;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("arguments are whole numbers"))
        .collect();
    let layers = args.first().copied().unwrap_or(1000);
    let caps: Vec<Option<u64>> = args.iter().skip(1).map(|&c| (c > 0).then_some(c)).collect();
    let pb = chain::problem(layers, &caps);
    let start = Instant::now();
    match Dp::default().schedule(&pb, &SearchConfig::default()) {
        Ok(out) => {
            let proved = match &out.optimality {
                Optimality::Proven => "proven optimal".to_string(),
                Optimality::NotGuaranteed(why) => format!("not guaranteed: {why}"),
                Optimality::Heuristic => "heuristic".to_string(),
            };
            println!(
                "{layers} layers, caps {caps:?}: {} stages, ${:.2}, {proved}, {:.2} s",
                out.plan.stages.len(),
                out.evaluation.cost,
                start.elapsed().as_secs_f64()
            );
        }
        Err(e) => println!(
            "{layers} layers, caps {caps:?}: {e} ({:.2} s)",
            start.elapsed().as_secs_f64()
        ),
    }
}
