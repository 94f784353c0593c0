//! How many units a search heuristic rents for a plan: the fewest that meet `X_req`
//! (the paper's plan space) or, under [`Objective::Duration`], the counts that make the
//! plan cheapest, as the exact DP chooses them ([`Units`]).
//!
//! Under the paper's objective a plan provisioned for a throughput `X ≥ X_req` (each
//! stage at its fewest units for `X`) costs `N · P(X) / X(X)`, with `P` its price per
//! second and `X(X) ≥ X` the throughput those units reach. `P` is a step function that
//! never falls as `X` grows, so only the right ends of its steps matter: the throughputs
//! the plan's provisionings reach. [`evaluate`] walks them from `X_req` up, as the DP's
//! parametric search walks its plans' (`parametric`), and stops once no count beyond can
//! beat the best: a stage's time per batch never falls as its units grow (its
//! synchronisation only grows), so at `k ≥ k_s` units its price per sample is at least
//! `price_s · T_s(k_s) / B_s`, and the plan's cost at least `N` times the sum of those
//! (its throughput is the least of its stages', a billing minimum only adds).

use crate::constraint::Constraint;
use crate::cost::{Evaluation, Problem};
use crate::error::Infeasible;
use crate::objective::Objective;
use crate::plan::SchedulingPlan;

use super::scheduler::Units;

/// Most provisionings [`evaluate`] prices for one plan (the DP's own default of
/// throughput steps).
pub(crate) const MAX_STEPS: usize = 2000;

/// Relative tolerance of the walk: it steps to just past each reached throughput, and
/// stops where its bound is within this of the best.
const TOLERANCE: f64 = 1e-9;

/// `plan` provisioned as `units` says, and whether that choice is proven the cheapest for
/// the plan (always with [`Units::Min`] under [`Objective::RequiredRate`], where the
/// fewest units are; with [`Units::Best`] unless the walk stopped at [`MAX_STEPS`]).
///
/// # Panics
/// If the plan is not well formed for this problem (as [`Problem::evaluate`]).
pub(crate) fn evaluate(
    pb: &Problem,
    plan: &SchedulingPlan,
    units: Units,
) -> Result<(Evaluation, bool), Infeasible> {
    let first = pb.evaluate(plan)?;
    if units == Units::Min || pb.objective == Objective::RequiredRate {
        return Ok((first, pb.objective == Objective::RequiredRate));
    }
    let samples = pb.constraint.samples;
    let mut best = first;
    let mut current = best.clone();
    for _ in 0..MAX_STEPS {
        // Every provisioning from here on costs at least `bound`.
        let bound: f64 = samples
            * current
                .stages
                .iter()
                .map(|r| r.price_per_hour / 3600.0 / r.throughput)
                .sum::<f64>();
        if bound.is_nan() || bound >= best.cost * (1.0 - TOLERANCE) {
            return Ok((best, true));
        }
        // Every further plan is billed its minimum: its price never falls.
        let billing = pb.catalog.billing_minimum;
        if billing > 0.0 && samples / current.throughput <= billing {
            return Ok((best, true));
        }
        // Past this provisioning's throughput, and past every X where price · N / X is
        // at least the best.
        let x = (current.throughput * (1.0 + TOLERANCE))
            .max(current.price_per_hour / 3600.0 * samples / best.cost);
        let Ok(at) = Constraint::new(x, samples) else {
            return Ok((best, true));
        };
        match pb.with_constraint(at).evaluate(plan) {
            Ok(e) => {
                if e.cost < best.cost {
                    best = e.clone();
                }
                current = e;
            }
            // Nothing reaches more (a cap, a stage past its most units): proven.
            Err(_) => return Ok((best, true)),
        }
    }
    Ok((best, false))
}

/// [`evaluate`]'s cost in dollars, `f64::INFINITY` where the plan is infeasible.
pub(crate) fn cost(pb: &Problem, plan: &SchedulingPlan, units: Units) -> f64 {
    evaluate(pb, plan, units).map_or(f64::INFINITY, |(e, _)| e.cost)
}
