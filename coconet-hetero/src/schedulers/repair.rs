//! Repairing Lagrangian pricing's plans into a cheaper plan within the limits.
//!
//! Where many stages gain about equally from a capped type (a long model repeating
//! its layers), Lagrangian pricing flips between plans that put all of them on it
//! (over the cap) and plans that put none (far from the optimum): no price uses the
//! cap partly. Between layer boundaries where both plans cut, the over-drawing plan's
//! stages can replace the other's, window by window; taking the windows that save most
//! per unit of limit they draw (priced by the multipliers), while every limit holds,
//! fills the caps as a greedy knapsack would.

use crate::cost::Problem;
use crate::error::Infeasible;
use crate::plan::SchedulingPlan;

/// A plan's cost in the DP's units (Σ price × units, the idle units of whole instances
/// included), or why it is infeasible.
pub(crate) fn dp_cost(
    pb: &Problem,
    prices: &[f64],
    plan: &SchedulingPlan,
) -> Result<f64, Infeasible> {
    let e = pb.evaluate(plan)?;
    let stages: f64 = e
        .stages
        .iter()
        .map(|r| prices[r.stage.ty] * r.units as f64)
        .sum();
    let idle: f64 = e.rented.iter().map(|r| prices[r.ty] * r.idle as f64).sum();
    Ok(stages + idle)
}

/// What a plan's stages draw on each limit ([`Problem::limits`]) with their fewest
/// units (limits not checked), and those stages' cost at `prices`; `None` if a stage
/// cannot be provisioned or does not fit its type's memory.
pub(crate) fn drawn(
    pb: &Problem,
    prices: &[f64],
    plan: &SchedulingPlan,
) -> Option<(Vec<u64>, f64)> {
    let limits = pb.limits();
    let mut used = vec![0u64; limits.len()];
    let mut cost = 0.0;
    for r in pb.stage_reports(plan, None).ok()? {
        cost += prices[r.stage.ty] * r.units as f64;
        for (u, l) in used.iter_mut().zip(&limits) {
            *u = u.saturating_add(r.units.saturating_mul(l.per_unit[r.stage.ty]));
        }
    }
    Some((used, cost))
}

/// A plan's cost at `prices` and what its stages draw on the limits priced at `mu`.
fn priced(pb: &Problem, prices: &[f64], mu: &[f64], plan: &SchedulingPlan) -> Option<(f64, f64)> {
    let (used, cost) = drawn(pb, prices, plan)?;
    Some((cost, used.iter().zip(mu).map(|(&d, m)| m * d as f64).sum()))
}

/// The stretches of layers `[from, to)` between boundaries both plans cut at, where
/// their stages differ.
fn windows(a: &SchedulingPlan, b: &SchedulingPlan) -> Vec<(usize, usize)> {
    let (mut i, mut j) = (0, 0);
    let mut start = 0;
    let mut same = true;
    let mut out = Vec::new();
    while i < a.stages.len() && j < b.stages.len() {
        let (sa, sb) = (a.stages[i], b.stages[j]);
        same &= sa == sb;
        if sa.last == sb.last {
            if !same {
                out.push((start, sa.last + 1));
            }
            start = sa.last + 1;
            same = true;
            i += 1;
            j += 1;
        } else if sa.last < sb.last {
            same = false;
            i += 1;
        } else {
            same = false;
            j += 1;
        }
    }
    out
}

/// `base` with the layers `[from, to)` staged as in `other` (both cut at `from` and `to`).
fn splice(
    base: &SchedulingPlan,
    other: &SchedulingPlan,
    (from, to): (usize, usize),
) -> SchedulingPlan {
    let before = base.stages.iter().filter(|s| s.last < from);
    let inside = other
        .stages
        .iter()
        .filter(|s| s.first >= from && s.last < to);
    let after = base.stages.iter().filter(|s| s.first >= to);
    SchedulingPlan {
        stages: before.chain(inside).chain(after).copied().collect(),
    }
}

/// `base` (within every limit, with its cost) improved by `over`'s windows, cheapest per
/// unit of limit first, each kept only if the plan stays within every limit and gets
/// cheaper (and, unless `split_runs`, has no two consecutive stages of one type).
pub(crate) fn repair(
    pb: &Problem,
    prices: &[f64],
    mu: &[f64],
    split_runs: bool,
    base: (SchedulingPlan, f64),
    over: &SchedulingPlan,
) -> (SchedulingPlan, f64) {
    let Some((base_cost, base_drawn)) = priced(pb, prices, mu, &base.0) else {
        return base;
    };
    let mut ranked: Vec<(f64, (usize, usize))> = windows(&base.0, over)
        .into_iter()
        .filter_map(|w| {
            let (cost, drawn) = priced(pb, prices, mu, &splice(&base.0, over, w))?;
            let saving = base_cost - cost;
            let extra = drawn - base_drawn;
            (saving > 0.0).then(|| {
                let per_draw = if extra > 0.0 {
                    saving / extra
                } else {
                    f64::INFINITY
                };
                (per_draw, w)
            })
        })
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut current = base;
    for (_, w) in ranked {
        let candidate = splice(&current.0, over, w);
        if !split_runs && candidate.stages.windows(2).any(|s| s[0].ty == s[1].ty) {
            continue;
        }
        if let Ok(cost) = dp_cost(pb, prices, &candidate)
            && cost < current.1
        {
            current = (candidate, cost);
        }
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Stage;

    fn plan(stages: &[(usize, usize, usize)]) -> SchedulingPlan {
        SchedulingPlan {
            stages: stages
                .iter()
                .map(|&(first, last, ty)| Stage { first, last, ty })
                .collect(),
        }
    }

    /// Windows lie between common cuts and cover exactly where the plans differ;
    /// splicing one in keeps the plan well formed.
    #[test]
    fn windows_between_common_cuts() {
        let a = plan(&[(0, 1, 0), (2, 4, 0), (5, 5, 1), (6, 9, 0)]);
        let b = plan(&[(0, 1, 0), (2, 2, 1), (3, 5, 1), (6, 7, 2), (8, 9, 0)]);
        assert_eq!(windows(&a, &b), vec![(2, 6), (6, 10)]);
        assert_eq!(windows(&a, &a), vec![]);
        let s = splice(&a, &b, (2, 6));
        assert_eq!(s, plan(&[(0, 1, 0), (2, 2, 1), (3, 5, 1), (6, 9, 0)]));
        assert!(s.is_well_formed(10, 3));
        assert_eq!(splice(&s, &b, (6, 10)), b);
    }
}
