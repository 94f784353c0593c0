//! HeterPS's stage synchronisation priced by coconet: the traffic of each of coconet's
//! schedules of the data-parallel AdamW step (all-reduce + update), counted by the cost
//! model ([`coconet_runtime::model`]) from the schedules' own plans, handed to the
//! planner as a [`SyncModel::Schedules`](coconet_hetero::SyncModel::Schedules).
//!
//! Each step of a plan moves, per replica, bytes of the form `fixed + per_replica/k`
//! (a ring's `2(k−1)/k`, an update on a `1/k` shard); two lowerings (`k` = 2 and 4)
//! determine both coefficients exactly, and the planner evaluates them at any `k ≥ 2`
//! without lowering again. A third lowering, on one rank, gives a lone replica's
//! traffic (the update; nothing to all-reduce). What the planner's catalogue does not describe is left out:
//! latencies and per-step fixed costs (as in the paper's ring formula), and the
//! update's arithmetic (memory-bound on every catalogue type).

use coconet_core::Bindings;
use coconet_core::schedule::candidates;
use coconet_hetero::{SyncModel, SyncSchedule, SyncStep, Traffic};
use coconet_runtime::Plan;
use coconet_runtime::model::Demand;

/// Parameters the coefficients are counted at: divisible by every replica count used.
const N: usize = 15 * 1024;

/// coconet's schedules of AdamW over f32 parameters (`AR-C`, `RS-C-AG`,
/// `fuse(RS-C-AG)`), as the planner's synchronisation model: at every replica count it
/// takes the cheapest.
pub fn coconet_schedules() -> Result<SyncModel, coconet_runtime::RuntimeError> {
    let adamw = coconet_programs::adamw();
    let program = adamw.program();
    let schedules = candidates(program, &[adamw.m.id(), adamw.v.id()]);
    let mut out = Vec::new();
    for s in &schedules {
        let at = |k: usize| -> Result<Vec<(f64, f64)>, coconet_runtime::RuntimeError> {
            Ok(per_byte(
                &Plan::lower(s, k, Bindings::new().dim("N", N).dims())?,
                k,
            ))
        };
        let (one, two, four) = (at(1)?, at(2)?, at(4)?);
        if two.len() != four.len() {
            return Err(coconet_runtime::RuntimeError::Plan(format!(
                "{}: {} steps at 2 ranks, {} at 4",
                s.name(),
                two.len(),
                four.len()
            )));
        }
        let traffic = |t2: f64, t4: f64| {
            // t(k) = fixed + per_replica/k through k = 2 and k = 4.
            let per_replica = 4.0 * (t2 - t4);
            Traffic {
                fixed: t2 - per_replica / 2.0,
                per_replica,
            }
        };
        let steps = two
            .iter()
            .zip(&four)
            .map(|(&(m2, n2), &(m4, n4))| SyncStep {
                memory: traffic(m2, m4),
                network: traffic(n2, n4),
            })
            .filter(|s| *s != SyncStep::default())
            .collect();
        out.push(SyncSchedule {
            name: s.name().to_string(),
            steps,
            // One replica: what its plan moves through memory, the update.
            alone: one.iter().map(|&(memory, _)| memory).sum(),
        });
    }
    Ok(SyncModel::Schedules(out))
}

/// Each step's (memory bytes per replica, network bytes sent by the busiest replica),
/// per byte of parameters.
fn per_byte(plan: &Plan, k: usize) -> Vec<(f64, f64)> {
    let bytes = 4.0 * N as f64;
    coconet_runtime::model::demands(plan)
        .iter()
        .map(|d: &Demand| (d.memory_bytes / k as f64 / bytes, d.link.bytes / bytes))
        .collect()
}
