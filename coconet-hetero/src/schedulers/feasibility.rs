//! Whether any plan keeps every limit: a proof that none does, or weights that prune the
//! label search's partial plans that cannot keep them.
//!
//! Give each limit `l` a share `y_l ≥ 0`, the shares summing to 1. A plan within every
//! limit draws `d_l ≤ cap_l`, so `Σ y_l · d_l / cap_l ≤ 1`. The least of that sum over
//! all plans, `V(y)`, is one DP pass with each unit of type `t` priced
//! `Σ_l y_l · per_unit_l[t] / cap_l` — so `V(y) > 1` proves that no plan keeps the
//! limits, at any price. Without it, the label search (which has no incumbent to prune
//! with when no heuristic found a plan) can only stop at its budget where the caps are
//! out of reach: the 98-layer GPT at 200 sequences/s and more.
//!
//! The shares are searched by cutting planes (Kelley's method): each DP pass at shares
//! `y` returns the plan `p` that draws least, and `V(y') ≤ Σ_l y'_l · d_{p,l} / cap_l`
//! for every `y'`. The next shares maximise the least of those planes over the plans
//! seen, a linear program of one variable per limit (`microlp`); its optimum bounds
//! every `V` from above, so when it is at most 1 no shares can prove anything and the
//! search stops. The best shares found also bound partial plans: one that drew `u_s` on
//! the tracked limits and whose cheapest completion at those prices is `C` cannot keep
//! the limits when `Σ_s y_s · u_s / cap_s + C > 1`.

use crate::limit::Limit;
use crate::plan::SchedulingPlan;

use super::completion::{Completion, Pruning, SLACK};
use super::stage_units::StageUnits;

/// Most DP passes of the search (one per plane).
const ROUNDS: usize = 40;

/// How many of the best share vectors prune partial plans (each costs one backward DP).
const KEPT: usize = 3;

/// The outcome of the search for shares.
pub(crate) enum Feasibility {
    /// No plan keeps the limits: the shares that prove it and the least weighted draw.
    Impossible { shares: Vec<f64>, least: f64 },
    /// No proof: completions at the best shares found, to prune partial plans with.
    Unknown(Pruning),
}

/// The per-unit prices of share vector `shares`: `Σ_l y_l · per_unit_l[t] / cap_l`, and
/// the weight per unit drawn of each limit, `y_l / cap_l` (a cap of 0 weighs its draws
/// as if it were 1: any draw breaks it).
fn share_prices(limits: &[Limit], shares: &[f64], types: usize) -> (Vec<f64>, Vec<f64>) {
    let weight: Vec<f64> = limits
        .iter()
        .zip(shares)
        .map(|(l, y)| y / (l.cap.max(1) as f64))
        .collect();
    let prices = (0..types)
        .map(|t| {
            limits
                .iter()
                .zip(&weight)
                .map(|(l, w)| w * l.per_unit[t] as f64)
                .sum()
        })
        .collect();
    (prices, weight)
}

/// Searches shares for `units`' problem. `cheapest(prices)` is one DP pass without
/// limits: its plan (if any covers the layers), that plan's value at `prices`, and the
/// stage evaluations it made; `drawn(plan)` what a plan draws on each limit. Returns the
/// outcome and the stage evaluations spent.
pub(crate) fn search(
    units: &StageUnits,
    mut cheapest: impl FnMut(&[f64]) -> (Option<SchedulingPlan>, f64, usize),
    drawn: impl Fn(&SchedulingPlan) -> Option<Vec<u64>>,
) -> (Feasibility, usize) {
    let pb = units.problem();
    let limits = pb.limits();
    let types = pb.num_types();
    let mut segments = 0;
    if limits.is_empty() {
        return (Feasibility::Unknown(Pruning::none()), segments);
    }
    let mut shares = vec![1.0 / limits.len() as f64; limits.len()];
    // The best share vectors seen, by their least weighted draw; and the planes: each
    // plan's draws relative to the caps.
    let mut best: Vec<(f64, Vec<f64>)> = Vec::new();
    let mut planes: Vec<Vec<f64>> = Vec::new();
    for _ in 0..ROUNDS {
        let (prices, _) = share_prices(&limits, &shares, types);
        let (plan, least, s) = cheapest(&prices);
        segments += s;
        if least > 1.0 + SLACK {
            return (Feasibility::Impossible { shares, least }, segments);
        }
        let Some(draws) = plan.as_ref().and_then(&drawn) else {
            break;
        };
        if !best.iter().any(|(_, y)| y == &shares) {
            best.push((least, shares.clone()));
            best.sort_by(|a, b| b.0.total_cmp(&a.0));
            best.truncate(KEPT);
        }
        planes.push(
            draws
                .iter()
                .zip(&limits)
                .map(|(&d, l)| d as f64 / l.cap.max(1) as f64)
                .collect(),
        );
        // The shares the planes rate highest, and how high: no shares do better.
        let Some((next, ceiling)) = highest(&planes) else {
            break;
        };
        if ceiling <= 1.0 + SLACK || ceiling - least <= SLACK || next == shares {
            break;
        }
        shares = next;
    }
    let checks = best
        .into_iter()
        .map(|(_, shares)| {
            let (prices, weight) = share_prices(&limits, &shares, types);
            (Completion::new(units, &prices), weight)
        })
        .collect();
    (Feasibility::Unknown(Pruning::new(checks)), segments)
}

/// The shares `y` (on the simplex) maximising `min_p Σ_l y_l · planes[p][l]`, and that
/// maximum; `None` if the linear program fails.
fn highest(planes: &[Vec<f64>]) -> Option<(Vec<f64>, f64)> {
    use microlp::{ComparisonOp, OptimizationDirection, Problem};
    let n = planes.first()?.len();
    let mut lp = Problem::new(OptimizationDirection::Maximize);
    let z = lp.add_var(1.0, (f64::NEG_INFINITY, f64::INFINITY));
    let y: Vec<_> = (0..n).map(|_| lp.add_var(0.0, (0.0, 1.0))).collect();
    lp.add_constraint(
        y.iter().map(|&v| (v, 1.0)).collect::<Vec<_>>(),
        ComparisonOp::Eq,
        1.0,
    );
    for plane in planes {
        // z ≤ Σ y_l · plane_l (draws of many times a cap are capped: the plane still
        // holds with the larger coefficient, and the program stays well conditioned).
        let mut row: Vec<_> = y
            .iter()
            .zip(plane)
            .map(|(&v, &c)| (v, -c.min(1e3)))
            .collect();
        row.push((z, 1.0));
        lp.add_constraint(row, ComparisonOp::Le, 0.0);
    }
    let solution = lp.solve().ok()?.into_solution().ok()?;
    let shares: Vec<f64> = y.iter().map(|&v| solution.var_value(v).max(0.0)).collect();
    let total: f64 = shares.iter().sum();
    (total > 0.0).then(|| {
        (
            shares.iter().map(|s| s / total).collect(),
            solution.objective(),
        )
    })
}
