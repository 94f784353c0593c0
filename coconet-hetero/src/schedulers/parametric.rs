//! The paper's objective ([`Objective::Duration`]: cost = price · N / X at the plan's own
//! throughput X) solved with the required-rate DP as an oracle.
//!
//! Let `D(X)` be the cheapest price per hour of any plan provisioned for throughput `X`
//! (what the DP minimises at `X_req = X`). `D` never falls as `X` grows, and the best
//! plan under the paper's objective, reaching `X*`, costs `N·D(X*)/X*` — no less, since
//! its own price is at least `D(X*)`, and no more, since the DP's plan for `X*` reaches
//! at least `X*`. So the optimum is `min over X ≥ X_req of N·D(X)/X`, and as `D` is a
//! step function, only the right ends of its steps matter: the throughputs the DP's
//! plans reach. The search runs the DP at `X_req`, notes the throughput `X₁` its plan
//! reaches (every `X` up to `X₁` has the same `D`), and starts again just above `X₁` —
//! or further: a plan reaching `X` costs at least `N·D/X`, so every `X` below
//! `N·D/best` is skipped. It stops, proven, when no plan is feasible any more (caps) or
//! when `best` reaches the floor no plan can beat (each layer on its cheapest type per
//! sample, compute only). A search that runs out of steps first states its proven gap.
//! With a billing minimum `m` the cost is `D(X) · max(N/X, m)`: the skip still holds
//! (`max(N/X, m) ≥ N/X`), and once `N/X ≤ m` every further plan costs `D · m` with `D`
//! not falling, so the search stops there, proven.

use super::{Dp, Optimality, Outcome, SearchConfig};
use std::time::Instant;

use crate::constraint::Constraint;
use crate::cost::Problem;
use crate::error::PlanError;
use crate::objective::Objective;

/// Dollars per sample no plan can beat: each layer's compute on the type that does it
/// cheapest (and holds it), no transfers, no synchronisation, no rounding of units.
pub(crate) fn floor_per_sample(pb: &Problem) -> f64 {
    (0..pb.num_layers())
        .map(|l| {
            (0..pb.num_types())
                .filter(|&t| pb.segment_memory(l, l, t) <= pb.catalog.types[t].memory_bytes)
                .map(|t| pb.price_per_second(t) * pb.segment_compute(l, l, t) / pb.batch_size(t))
                .fold(f64::INFINITY, f64::min)
        })
        .sum()
}

/// The cheapest plan under [`Objective::Duration`] (see the module docs).
pub(super) fn solve(
    dp: &Dp,
    pb: &Problem,
    config: &SearchConfig,
    deadline: Option<Instant>,
) -> Result<Outcome, PlanError> {
    let samples = pb.constraint.samples;
    let floor = samples * floor_per_sample(pb);
    let oracle = pb.clone().with_objective(Objective::RequiredRate);
    let mut x = pb.constraint.throughput;
    let mut best: Option<Outcome> = None;
    let mut doubt: Option<String> = None;
    let (mut steps, mut evaluations) = (0usize, 0usize);
    let optimality = loop {
        // Past the time limit with a plan in hand: no further throughput step (each is a
        // whole DP), the best so far with its gap to the floor.
        if let Some(best) = &best
            && deadline.is_some_and(|d| Instant::now() >= d)
        {
            break Some(format!(
                "the time limit passed after {steps} throughput steps; within {:.2} % of a \
                 lower bound",
                (best.evaluation.cost / floor - 1.0) * 100.0
            ));
        }
        let at = Constraint::new(x, samples)
            .map_err(|e| PlanError::Backend(format!("dp: internal error, {e}")))?;
        let inner = match dp.schedule_by(&oracle.with_constraint(at), config, deadline) {
            Ok(o) => o,
            // Nothing reaches `x` (proven): nothing reaches more either; the search is
            // complete.
            Err(PlanError::NoFeasiblePlan(_)) if best.is_some() => break None,
            // Undecided at `x`: the best so far, with the gap to the floor.
            Err(PlanError::Undecided { reason, .. }) if best.is_some() => {
                let best_cost = best.as_ref().map_or(f64::INFINITY, |b| b.evaluation.cost);
                break Some(format!(
                    "the DP at {} samples/s: {reason}; within {:.2} % of a lower bound",
                    crate::constraint::rate(x),
                    (best_cost / floor - 1.0) * 100.0
                ));
            }
            Err(e) => return Err(e),
        };
        evaluations += inner.evaluations;
        if let Optimality::NotGuaranteed(why) = &inner.optimality {
            doubt.get_or_insert_with(|| {
                format!("the DP at {} samples/s: {why}", crate::constraint::rate(x))
            });
        }
        let evaluation = pb
            .with_constraint(at)
            .evaluate(&inner.plan)
            .map_err(|e| PlanError::Backend(format!("dp: internal error, {e}")))?;
        let (price, reached) = (evaluation.price_per_hour, evaluation.throughput);
        if best
            .as_ref()
            .is_none_or(|b| evaluation.cost < b.evaluation.cost)
        {
            best = Some(Outcome {
                scheduler: "dp".into(),
                plan: inner.plan,
                evaluation,
                evaluations: 0,
                optimality: Optimality::Proven,
                lower_bound: None,
            });
        }
        let best_cost = best.as_ref().map_or(f64::INFINITY, |b| b.evaluation.cost);
        if best_cost <= floor * (1.0 + 1e-12) {
            break None;
        }
        // From here on every plan finishes within the billing minimum, so each costs its
        // price times the minimum, and the price D never falls as X grows.
        if pb.catalog.billing_minimum > 0.0 && samples / x <= pb.catalog.billing_minimum {
            break None;
        }
        steps += 1;
        if steps >= dp.max_throughputs {
            break Some(format!(
                "searched {steps} throughputs up to {} samples/s; within {:.2} % of a lower bound",
                crate::constraint::rate(reached),
                (best_cost / floor - 1.0) * 100.0
            ));
        }
        // Past this plan's throughput, and past every X where price·N/X ≥ best.
        x = (reached * (1.0 + 1e-9)).max(price / 3600.0 * samples / best_cost);
        if !x.is_finite() {
            break None;
        }
    };
    let mut out = best.expect("the loop returns or finds a plan first");
    out.evaluations = evaluations;
    // Short of a proof, the floor is the bound: no plan costs less.
    (out.optimality, out.lower_bound) = match (optimality, doubt) {
        (Some(why), _) | (None, Some(why)) => (
            Optimality::NotGuaranteed(why),
            Some(floor.min(out.evaluation.cost)),
        ),
        (None, None) => (Optimality::Proven, Some(out.evaluation.cost)),
    };
    Ok(out)
}
