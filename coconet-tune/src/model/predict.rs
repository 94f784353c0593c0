//! A plan's time predicted from its steps' demands on a machine.

use super::machine::Machine;
use super::traffic::{self, Demand};
use coconet_plan::plan::{Plan, PlanStep};
use std::time::Duration;

/// A plan's predicted time, and each step's.
#[derive(Debug, Clone)]
pub struct Prediction {
    /// The whole run.
    pub total: Duration,
    /// Each step: its description, its demand, its predicted time.
    pub steps: Vec<(String, Demand, Duration)>,
}

/// Predicts one run of `plan` on `machine`.
pub fn predict(plan: &Plan, machine: &Machine) -> Prediction {
    let demands = traffic::demands(plan);
    let machine = &in_cache(plan, machine);
    let mut steps = Vec::new();
    let mut total = machine.run_seconds + machine.wake_seconds_per_rank * plan.ranks() as f64;
    for (step, d) in plan.steps().iter().zip(demands) {
        let t = match step {
            PlanStep::Overlap { matmul, consumer } => {
                let mm = traffic::demands_of(plan, &PlanStep::Op(*matmul));
                let rest = traffic::demands_of(plan, &PlanStep::FusedAllReduce(consumer.clone()));
                let (a, b) = (seconds(plan, machine, &mm), seconds(plan, machine, &rest));
                if machine.compute_overlaps_memory {
                    let rows = plan.shape(*matmul).first().copied().unwrap_or(1).max(1) as f64;
                    a.max(b) + a.min(b) / rows
                } else {
                    // Rank threads on shared cores: each rank computes its matmul's
                    // pieces between its chunks of the reduction, so nothing is hidden,
                    // and the last piece of each block is reduced after the matmul.
                    let pieces = plan.overlap_pieces(*matmul).per_block().max(1) as f64;
                    a + b + b / pieces
                }
            }
            _ => seconds(plan, machine, &d),
        };
        total += t;
        steps.push((plan.describe(step), d, duration(t)));
    }
    Prediction {
        total: duration(total),
        steps,
    }
}

/// `machine` as it runs `plan`: where the plan's buffers fit in the part of the
/// last-level cache a training step leaves them (see [`Machine::cache_bytes`]), their
/// bytes move at the cache's bandwidth: the memory bandwidth becomes the mix of the two
/// by the share of bytes served from the cache.
fn in_cache(plan: &Plan, machine: &Machine) -> Machine {
    let cache = machine.cache_bytes;
    if cache <= 0.0 {
        return machine.clone();
    }
    let per_memory = (machine.ranks_per_memory.max(1) as f64).min(plan.ranks() as f64);
    let memories = (plan.ranks() as f64 / per_memory).ceil();
    let footprint = traffic::footprint(plan) / memories;
    let hit = ((cache / 2.0 - footprint) / (cache / 4.0)).clamp(0.0, 1.0);
    // Seconds per byte: the cache's share at its bandwidth (free where not measured),
    // the rest at memory's.
    let from_cache = if machine.cache_bandwidth > 0.0 {
        hit / machine.cache_bandwidth
    } else {
        0.0
    };
    let per_byte = from_cache + (1.0 - hit) / machine.memory_bandwidth;
    Machine {
        memory_bandwidth: 1.0 / per_byte.max(1e-300),
        ..machine.clone()
    }
}

/// `t` seconds; beyond what a `Duration` holds (parameters not checked by
/// [`Machine::check`]), the longest one.
fn duration(t: f64) -> Duration {
    Duration::try_from_secs_f64(t).unwrap_or(Duration::MAX)
}

/// The seconds of a step asking `d` of `machine`.
fn seconds(plan: &Plan, m: &Machine, d: &Demand) -> f64 {
    let ranks = plan.ranks() as f64;
    let per_memory = (m.ranks_per_memory.max(1) as f64).min(ranks);
    let memories = (ranks / per_memory).ceil();
    let busy = d.busy_ranks.clamp(1.0, ranks);
    let parallel = busy.min(per_memory).min(m.cores.max(1.0)) * (busy / per_memory).ceil();
    let memory = d.memory_bytes / (m.memory_bandwidth * memories);
    // Rates not measured (0) fall back on the collectives' reduction rate.
    let full_reduce_seconds = if m.full_reduce_seconds > 0.0 {
        m.full_reduce_seconds
    } else {
        m.reduce_seconds
    };
    // A compiled kernel's sums are priced per element of the sum (the demand counts
    // one per source).
    let compiled_reduce = if m.compiled_reduce_seconds > 0.0 {
        d.compiled_reduced_elements / plan.group_size().max(1) as f64 * m.compiled_reduce_seconds
    } else {
        d.compiled_reduced_elements * m.reduce_seconds
    };
    // Compiled kernels' stages overlap the memory traffic; the rest adds to it.
    let compiled = (d.compiled_stage_elements * m.stage_seconds + compiled_reduce) / parallel;
    let compute = ((d.stage_elements - d.compiled_stage_elements) * m.stage_seconds
        + (d.reduced_elements - d.compiled_reduced_elements) * m.reduce_seconds
        + d.full_reduced_elements * full_reduce_seconds
        + d.half_conversions * m.half_conversion_seconds
        + d.dropout_elements * m.dropout_seconds
        + d.layer_norm_elements * m.layer_norm_seconds
        + d.flops / m.flops
        + d.half_flops / m.half_flops.unwrap_or(m.flops)
        + d.matmul_elements * m.matmul_element_seconds
        + d.half_matmul_elements * m.half_matmul_element_seconds)
        / parallel;
    let barriers = d.barriers * ranks * m.barrier_seconds_per_rank + m.step_seconds;
    let link = m.links.as_ref().map_or(0.0, |l| {
        l.seconds(plan.group_size(), plan.ranks(), &d.link).0
    });
    if m.compute_overlaps_memory {
        barriers + memory.max(compute + compiled).max(link)
    } else {
        barriers + memory.max(compiled) + compute + link
    }
}
