//! Exact dynamic programme over stage segments (goes beyond the paper).
//!
//! The cost (see [`crate::cost`]) is `W · Σ_s price(τ_s) · k_s` and `k_s` depends only
//! on the stage's layers `i..=j`, its type `t`, and its neighbours' types (through the
//! boundary transfers). So with
//! `F[j][t][u]` = cheapest price of a partition of layers `0..=j` whose last stage has
//! type `t` and will be followed by a stage of type `u` (or by nothing),
//!
//! `F[j][t][u] = min_{i ≤ j, p} F[i−1][p][t] + price(t) · k(i..=j, t, p, u)`
//!
//! with `p` = none for `i = 0`. The answer is `min_t F[L−1][t][none]`. This is
//! `O(L² · T² · (T+1))` stage evaluations — the extra factor over the `O(L²·T²)` of a
//! segment DP is the next stage's type, which the outgoing transfer needs; `T` is a
//! handful of types. Consecutive stages may share a type (cutting a run is useful when
//! the run does not fit one unit's memory) unless [`Dp::split_runs`] is false, which
//! restricts the DP to the paper's plan space (maximal runs).
//!
//! **Memory** is exact pruning: a segment whose replica does not fit is skipped, and
//! since memory only grows as a segment extends to the left the scan over `i` stops
//! there. Without tracked caps, a lower bound on a segment's units (`⌈X·C/B⌉`, compute
//! only) skips candidates that cannot improve a cell, and ends the scan over `i` early;
//! both are exact. **Caps** add the units used per capped type to the state (a knapsack
//! dimension), added lazily: the DP first solves without caps, and each time its plan
//! breaks a cap, that type's usage joins the state and it solves again (a relaxation's
//! optimum that respects every cap is optimal). While the product of `(cap_t + 1)` over
//! the tracked types is at most [`Dp::max_cap_states`] the usage is a table dimension;
//! beyond that each cell keeps the Pareto front of (cost, usage) labels instead
//! (`dp_labels`: a resource-constrained shortest path, still exact), pruned by an
//! incumbent: the cheaper of Lagrangian pricing's plan (over-used types priced up) and
//! the table DP's with usage counted in coarser units (it finds plans no price setting
//! makes cheapest). Only when the labels exceed [`Dp::max_labels`] is the incumbent
//! returned, marked [`Optimality::NotGuaranteed`] with its gap to the better of two lower
//! bounds (the Lagrangian dual and a compute-only one).
//!
//! **Limits** are the types' caps and the shared hosts' cores alike
//! ([`crate::limit`]): a host's limit draws each unit's threads. Where a host's layers
//! slow down with its load the stages' costs are coupled; the DP then solves once per
//! load (see `Dp::over_loads`).

use crate::cost::Problem;
use crate::error::PlanError;
use crate::objective::Objective;
use crate::plan::Plan;
use crate::provision::min_units;

use super::dp_labels;
use super::neighbours::Neighbours;
use super::{Optimality, Outcome, Scheduler, SearchConfig};

/// The exact segment DP.
#[derive(Debug, Clone)]
pub struct Dp {
    /// Allow several consecutive stages on the same type.
    pub split_runs: bool,
    /// Largest cap state space solved as a table dimension.
    pub max_cap_states: usize,
    /// Most labels the exact search under caps may make (and 150 times as many
    /// comparisons between them) before giving up exactness: about 5 s per 10^7 labels.
    pub max_labels: usize,
    /// Under the paper's objective, the most throughputs the search solves for (one
    /// DP each, see `parametric`) before it stops with a stated gap.
    pub max_throughputs: usize,
}

impl Default for Dp {
    fn default() -> Self {
        Dp {
            split_runs: true,
            max_cap_states: 4096,
            max_labels: 40_000_000,
            max_throughputs: 2000,
        }
    }
}

#[derive(Clone, Copy)]
struct Back {
    first: u32,
    prev: u8,
    prev_r: u32,
}

/// Result of one DP pass: plan, its cost at the pass's prices (infinite without a
/// plan), and the number of segment evaluations.
struct Solved {
    plan: Option<Plan>,
    value: f64,
    segments: usize,
}

impl Dp {
    /// One DP pass with the given per-type prices (per unit) and the limits
    /// ([`Problem::limits`]) in `tracked` as table dimensions.
    fn solve(&self, pb: &Problem, prices: &[f64], tracked: &[bool]) -> Solved {
        self.solve_quantised(pb, prices, tracked, &vec![1; pb.limits().len()])
    }

    /// [`Dp::solve`] with what a plan draws on each tracked limit counted in quanta of
    /// `quantum[l]`, a stage drawing d taking `⌈d / quantum⌉` of the `⌊cap / quantum⌋`
    /// quanta there are: with quanta above 1 the table is smaller and every plan it
    /// returns keeps every tracked limit (it over-counts usage), but it may miss the
    /// optimum.
    fn solve_quantised(
        &self,
        pb: &Problem,
        prices: &[f64],
        tracked: &[bool],
        quantum: &[usize],
    ) -> Solved {
        let l_n = pb.num_layers();
        let t_n = pb.num_types();
        let none = t_n;
        let x = pb.constraint.throughput;
        // Mixed-radix encoding of what the plan draws on each tracked limit, in quanta.
        let limits = &pb.limits();
        let mut stride = vec![0usize; limits.len()];
        let mut radix = vec![1usize; limits.len()];
        let mut states = 1usize;
        for (l, limit) in limits.iter().enumerate() {
            if tracked[l] {
                stride[l] = states;
                radix[l] = limit.cap as usize / quantum[l] + 1;
                states *= radix[l];
            }
        }
        // The tracked limits each type draws on, and how much per unit.
        let draws: Vec<Vec<(usize, usize)>> = (0..t_n)
            .map(|t| {
                (0..limits.len())
                    .filter(|&l| tracked[l] && limits[l].draws_on(t))
                    .map(|l| (l, limits[l].per_unit[t] as usize))
                    .collect()
            })
            .collect();
        let idx =
            |j: usize, t: usize, u: usize, r: usize| ((j * t_n + t) * (t_n + 1) + u) * states + r;
        let size = l_n * t_n * (t_n + 1) * states;
        let mut f = vec![f64::INFINITY; size];
        let mut back = vec![
            Back {
                first: 0,
                prev: 0,
                prev_r: 0
            };
            size
        ];
        let mut segments = 0usize;
        let mem: Vec<f64> = pb.catalog.types.iter().map(|t| t.memory_bytes).collect();
        let batch = pb.model.batch_size;
        let neighbours = Neighbours::new(pb, self.split_runs);
        let (first_stage, last_stage) = ([vec![usize::MAX]], [vec![none]]);
        for j in 0..l_n {
            let last = j + 1 == l_n;
            for t in 0..t_n {
                let after: &[Vec<usize>] = if last {
                    &last_stage
                } else {
                    &neighbours.after[t]
                };
                // The cells of next types in one group are equal: solve the first, copy.
                for next_group in after {
                    let u = next_group[0];
                    let next = (u != none).then_some(u);
                    for i in (0..=j).rev() {
                        if pb.segment_memory(i, j) > mem[t] {
                            break;
                        }
                        // Lower bound on this segment's price: T(k) ≥ compute, so
                        // k ≥ X·compute/B. It only grows as the segment extends left, so
                        // once it alone cannot improve the cell, no longer segment can.
                        let lb =
                            prices[t] * (x * pb.segment_compute(i, j, t) / batch).ceil().max(1.0);
                        if states == 1 && lb >= f[idx(j, t, u, 0)] {
                            break;
                        }
                        let before: &[Vec<usize>] = if i == 0 {
                            &first_stage
                        } else {
                            &neighbours.before[t]
                        };
                        for prev_group in before {
                            let prev = (i > 0).then_some(prev_group[0]);
                            if states == 1 && i > 0 {
                                let base = prev_group
                                    .iter()
                                    .map(|&p| f[idx(i - 1, p, t, 0)])
                                    .fold(f64::INFINITY, f64::min);
                                if base + lb >= f[idx(j, t, u, 0)] {
                                    continue;
                                }
                            }
                            segments += 1;
                            let Some(k) = min_units(&pb.stage_shape(i, j, t, prev, next), x) else {
                                continue;
                            };
                            if draws[t]
                                .iter()
                                .any(|&(l, w)| k.saturating_mul(w as u64) > limits[l].cap)
                            {
                                continue;
                            }
                            let add = prices[t] * k as f64;
                            for &p in prev_group {
                                for r_prev in 0..states {
                                    let base = if i == 0 {
                                        if r_prev != 0 {
                                            break;
                                        }
                                        0.0
                                    } else {
                                        f[idx(i - 1, p, t, r_prev)]
                                    };
                                    if !base.is_finite() {
                                        continue;
                                    }
                                    let mut r = r_prev;
                                    let mut fits = true;
                                    for &(l, w) in &draws[t] {
                                        let digit = (r_prev / stride[l]) % radix[l];
                                        let take = (k as usize * w).div_ceil(quantum[l]);
                                        if digit + take >= radix[l] {
                                            fits = false;
                                            break;
                                        }
                                        r += take * stride[l];
                                    }
                                    if !fits {
                                        continue;
                                    }
                                    let cell = idx(j, t, u, r);
                                    let v = base + add;
                                    if v < f[cell] {
                                        f[cell] = v;
                                        back[cell] = Back {
                                            first: i as u32,
                                            prev: if i == 0 { 0 } else { p as u8 },
                                            prev_r: r_prev as u32,
                                        };
                                    }
                                }
                            }
                        }
                    }
                    let solved = idx(j, t, u, 0);
                    for &v in &next_group[1..] {
                        let copy = idx(j, t, v, 0);
                        f.copy_within(solved..solved + states, copy);
                        back.copy_within(solved..solved + states, copy);
                    }
                }
            }
        }
        let mut best: Option<(usize, usize, f64)> = None;
        for t in 0..t_n {
            for r in 0..states {
                let v = f[idx(l_n - 1, t, none, r)];
                if v.is_finite() && best.is_none_or(|b| v < b.2) {
                    best = Some((t, r, v));
                }
            }
        }
        let value = best.map_or(f64::INFINITY, |b| b.2);
        let plan = best.map(|(t_end, r_end, _)| {
            dp_labels::trace_back(l_n, t_end, none, r_end, |j, t, u, r| {
                let b = back[idx(j, t, u, r)];
                (b.first as usize, b.prev as usize, b.prev_r as usize)
            })
        });
        Solved {
            plan,
            value,
            segments,
        }
    }
}

/// Most resource types the DP handles (a stage's previous type is kept in a byte).
const MAX_TYPES: usize = 256;

/// Explains why no plan exists, for the error message.
fn diagnose(pb: &Problem) -> String {
    let max_mem = pb
        .catalog
        .types
        .iter()
        .map(|t| t.memory_bytes)
        .fold(0.0, f64::max);
    for l in &pb.model.layers {
        if l.memory_bytes > max_mem {
            return format!(
                "layer `{}` needs {:.3e} bytes per replica, more than any type's memory (largest {:.3e})",
                l.name, l.memory_bytes, max_mem
            );
        }
    }
    // A layer alone, with no neighbours, is the fastest stage that can hold it: if
    // that needs more units than provisioning allows on every type it fits, no plan
    // exists, whatever the caps.
    let x = pb.constraint.throughput;
    for (l, layer) in pb.model.layers.iter().enumerate() {
        let reachable = (0..pb.num_types()).any(|t| {
            let shape = pb.stage_shape(l, l, t, None, None);
            shape.memory <= pb.catalog.types[t].memory_bytes && min_units(&shape, x).is_some()
        });
        if !reachable {
            return format!(
                "layer `{}` alone would need more than 2^40 units of every type that holds it to meet {} samples/s",
                layer.name,
                crate::constraint::rate(x)
            );
        }
    }
    let capped: Vec<String> = pb
        .limits()
        .iter()
        .map(|l| format!("{} ≤ {} {}", l.name, l.cap, l.unit))
        .collect();
    format!(
        "no partition of the layers meets {} samples/s within the memory limits and availability caps ({})",
        crate::constraint::rate(x),
        if capped.is_empty() {
            "none".to_string()
        } else {
            capped.join(", ")
        }
    )
}

impl Scheduler for Dp {
    fn name(&self) -> &str {
        "dp"
    }

    fn schedule(&self, pb: &Problem, config: &SearchConfig) -> Result<Outcome, PlanError> {
        // Every plan needs the same parameter server at this throughput.
        if let Err(e) = pb.parameter_servers() {
            return Err(PlanError::NoFeasiblePlan(e.to_string()));
        }
        if pb.objective == Objective::Duration {
            return super::parametric::solve(self, pb, config);
        }
        if pb.is_contended() {
            return self.over_loads(pb, config);
        }
        if pb.num_types() > MAX_TYPES {
            return Err(PlanError::TooLarge {
                scheduler: "dp".into(),
                reason: "more than 256 resource types".into(),
            });
        }
        let prices: Vec<f64> = pb.catalog.types.iter().map(|t| t.price_per_hour).collect();
        let outcome = |plan: Plan, segments: usize, optimality: Optimality| {
            let evaluation = pb
                .evaluate(&plan)
                .map_err(|e| PlanError::Backend(format!("dp: internal error, {e}")))?;
            Ok(Outcome {
                scheduler: "dp".into(),
                plan,
                evaluation,
                evaluations: segments,
                optimality,
            })
        };
        // Lazy cap constraints: solve with the caps tracked so far; a plan that breaks an
        // untracked cap adds that cap to the state and solves again. A relaxation's
        // optimum that respects every cap is optimal.
        let mut tracked = vec![false; pb.limits().len()];
        let mut states = 1usize;
        let mut segments = 0;
        loop {
            let s = self.solve(pb, &prices, &tracked);
            segments += s.segments;
            let Some(plan) = s.plan else {
                return Err(PlanError::NoFeasiblePlan(diagnose(pb)));
            };
            match pb.evaluate(&plan) {
                Ok(_) => return outcome(plan, segments, Optimality::Proven),
                Err(crate::error::Infeasible::Cap {
                    limit, name, cap, ..
                }) => {
                    let grown = states.saturating_mul((cap as usize).saturating_add(1));
                    if tracked[limit] {
                        return Err(PlanError::Backend(format!(
                            "dp: internal error, a plan breaks the tracked limit of {name}"
                        )));
                    }
                    if grown > self.max_cap_states {
                        break;
                    }
                    tracked[limit] = true;
                    states = grown;
                }
                Err(e) => return Err(PlanError::Backend(format!("dp: internal error, {e}"))),
            }
        }
        // Too many usage states for a table: an incumbent from Lagrangian pricing (over
        // the table's caps), then the exact label search, which prunes every partial plan
        // that cannot beat the incumbent.
        let (priced, dual, s) = self.lagrangian(pb, &prices, &tracked);
        segments += s;
        let (quantised, s) = self.quantised(pb, &prices, &tracked);
        segments += s;
        // The cheaper of the two incumbents (both keep every cap).
        let incumbent = match (priced, quantised) {
            (Some(a), Some(b)) => Some(if b.1 < a.1 { b } else { a }),
            (a, b) => a.or(b),
        };
        let bound = incumbent.as_ref().map_or(f64::INFINITY, |i| i.1);
        let lower = lower_bound_after(pb, &prices);
        let mut tracked_labels = tracked.clone();
        loop {
            let solved = dp_labels::solve(
                pb,
                &prices,
                &tracked_labels,
                self.split_runs,
                self.max_labels,
                bound,
                &lower,
            );
            match solved {
                Ok((Some(plan), s)) => {
                    segments += s;
                    match pb.evaluate(&plan) {
                        Ok(_) => return outcome(plan, segments, Optimality::Proven),
                        Err(crate::error::Infeasible::Cap { limit, name, .. }) => {
                            if tracked_labels[limit] {
                                return Err(PlanError::Backend(format!(
                                    "dp: internal error, a plan breaks the tracked limit of {name}"
                                )));
                            }
                            tracked_labels[limit] = true;
                        }
                        Err(e) => {
                            return Err(PlanError::Backend(format!("dp: internal error, {e}")));
                        }
                    }
                }
                // Nothing beats the incumbent: it is optimal (or no plan exists at all).
                Ok((None, s)) => {
                    segments += s;
                    return match incumbent {
                        Some((plan, _)) => outcome(plan, segments, Optimality::Proven),
                        None => Err(PlanError::NoFeasiblePlan(diagnose(pb))),
                    };
                }
                Err(dp_labels::OverBudget) => {
                    let root = lower[0].max(dual);
                    return match incumbent {
                        Some((plan, cost)) => outcome(
                            plan,
                            segments,
                            Optimality::NotGuaranteed(format!(
                                "binding caps needed more than {} labels; the best plan of Lagrangian pricing and of a DP over usage in coarser units, within {:.1} % of a lower bound",
                                self.max_labels,
                                100.0 * (cost - root) / cost
                            )),
                        ),
                        None => Err(PlanError::Undecided {
                            scheduler: "dp".into(),
                            reason: format!(
                                "the binding caps needed more than {} labels, and neither \
                                 Lagrangian pricing nor a DP over usage in coarser units \
                                 found a plan within them",
                                self.max_labels,
                            ),
                        }),
                    };
                }
            }
        }
    }
}

/// Most host-load combinations [`Dp`] solves one DP each for on a contended problem.
pub const MAX_LOAD_COMBINATIONS: u64 = 4096;

impl Dp {
    /// The exact DP on a problem whose shared hosts slow down with load (see
    /// [`crate::cost`]): for every combination of the hosts' loads `U_h ≤ cores_h`, the
    /// DP on [`Problem::at_loads`] — times at those loads, each host limited to them —
    /// then the cheapest of those plans, priced at the load it really makes. The
    /// optimum's own load is one of the combinations, and there it costs what it really
    /// costs; any plan found at another load really costs no more than there.
    fn over_loads(&self, pb: &Problem, config: &SearchConfig) -> Result<Outcome, PlanError> {
        let cores: Vec<u64> = pb.catalog.hosts.iter().map(|h| h.cores).collect();
        let combinations = cores
            .iter()
            .try_fold(1u64, |n, &c| n.checked_mul(c))
            .filter(|&n| n <= MAX_LOAD_COMBINATIONS)
            .ok_or_else(|| PlanError::TooLarge {
                scheduler: "dp".into(),
                reason: format!(
                    "the hosts' cores ({cores:?}) make more than {MAX_LOAD_COMBINATIONS} load combinations"
                ),
            })?;
        let mut best: Option<Outcome> = None;
        let mut doubt: Option<String> = None;
        let mut undecided: Option<String> = None;
        let mut evaluations = 0;
        for mut code in 0..combinations {
            let loads: Vec<u64> = cores
                .iter()
                .map(|&c| {
                    let u = code % c + 1;
                    code /= c;
                    u
                })
                .collect();
            let inner = match self.schedule(&pb.at_loads(&loads), config) {
                Ok(o) => o,
                Err(PlanError::NoFeasiblePlan(_)) => continue,
                // Undecided at this load: the others may still give a plan (not proven).
                Err(PlanError::Undecided { reason, .. }) => {
                    undecided.get_or_insert_with(|| format!("at host loads {loads:?}: {reason}"));
                    continue;
                }
                Err(e) => return Err(e),
            };
            evaluations += inner.evaluations;
            if let Optimality::NotGuaranteed(why) = &inner.optimality {
                doubt.get_or_insert_with(|| format!("at host loads {loads:?}: {why}"));
            }
            let evaluation = pb
                .evaluate(&inner.plan)
                .map_err(|e| PlanError::Backend(format!("dp: internal error, {e}")))?;
            if best
                .as_ref()
                .is_none_or(|b| evaluation.cost < b.evaluation.cost)
            {
                best = Some(Outcome {
                    evaluation,
                    ..inner
                });
            }
        }
        let Some(mut out) = best else {
            return Err(match undecided {
                Some(reason) => PlanError::Undecided {
                    scheduler: "dp".into(),
                    reason,
                },
                None => PlanError::NoFeasiblePlan(diagnose(pb)),
            });
        };
        out.evaluations = evaluations;
        out.optimality = doubt
            .or(undecided)
            .map_or(Optimality::Proven, Optimality::NotGuaranteed);
        Ok(out)
    }

    /// Lagrangian pricing: over-drawn limits are priced up (a type's price becomes
    /// `price_t + Σ_l μ_l · per_unit_l[t]`) until the table DP (with the limits in
    /// `tracked`) returns a plan within every limit; then the multipliers are bisected
    /// between the last prices that over-drew and the first that did not, since the
    /// first plan within the limits is usually priced well past the cheapest one. Returns
    /// the cheapest plan within the limits seen and its cost in the DP's units (Σ price ×
    /// units; not necessarily optimal), the best Lagrangian lower bound on the optimum
    /// seen, and the stage evaluations.
    ///
    /// The bound: with multipliers μ ≥ 0 the DP's optimum V(μ) is at most the μ-cost of
    /// any plan within the limits, which is its cost plus Σ μ_l · used_l, and
    /// used_l ≤ cap_l; so V(μ) − Σ μ_l · cap_l is a lower bound.
    fn lagrangian(
        &self,
        pb: &Problem,
        prices: &[f64],
        tracked: &[bool],
    ) -> (Option<(Plan, f64)>, f64, usize) {
        let limits = &pb.limits();
        let top = prices.iter().cloned().fold(0.0, f64::max);
        let mut segments = 0;
        let mut bound = 0.0f64;
        let mut best: Option<(Plan, f64)> = None;
        // One DP at multipliers `mu`: the bound it proves, and which limit its plan
        // over-draws (`None`: within every limit, kept if cheapest so far).
        let mut priced_at = |mu: &[f64]| -> Option<Option<usize>> {
            let priced: Vec<f64> = (0..prices.len())
                .map(|t| {
                    prices[t]
                        + limits
                            .iter()
                            .zip(mu)
                            .map(|(l, m)| m * l.per_unit[t] as f64)
                            .sum::<f64>()
                })
                .collect();
            let s = self.solve(pb, &priced, tracked);
            segments += s.segments;
            let surcharge: f64 = limits.iter().zip(mu).map(|(l, m)| m * l.cap as f64).sum();
            bound = bound.max(s.value - surcharge);
            let plan = s.plan?;
            match dp_cost(pb, prices, &plan) {
                Ok(cost) => {
                    if best.as_ref().is_none_or(|b| cost < b.1) {
                        best = Some((plan, cost));
                    }
                    Some(None)
                }
                Err(crate::error::Infeasible::Cap { limit, .. }) => Some(Some(limit)),
                Err(_) => None,
            }
        };
        // Raise the price of each over-drawn limit until a plan keeps them all.
        let mut mu = vec![0.0f64; limits.len()];
        let mut low = mu.clone();
        let mut found = false;
        for _round in 0..64 {
            match priced_at(&mu) {
                Some(Some(limit)) => {
                    low[limit] = mu[limit];
                    // The price of one unit of the limit: its dearest type's, per unit drawn.
                    let l = &limits[limit];
                    let unit_price = (0..prices.len())
                        .filter(|&t| l.draws_on(t))
                        .map(|t| prices[t] / l.per_unit[t] as f64)
                        .fold(0.0, f64::max);
                    mu[limit] = mu[limit] * 1.5 + unit_price * 0.5 + top * 0.05;
                }
                Some(None) => {
                    found = true;
                    break;
                }
                None => break,
            }
        }
        // Bisect each raised price in turn between what over-drew and what kept every
        // limit, the others at the prices that kept them.
        let mut high = mu;
        let raised: Vec<usize> = (0..limits.len()).filter(|&l| high[l] > low[l]).collect();
        let rounds = if found { LAGRANGIAN_BISECTIONS } else { 0 };
        'limits: for &l in &raised {
            for _round in 0..rounds / raised.len() {
                let mut mid = high.clone();
                mid[l] = 0.5 * (low[l] + high[l]);
                match priced_at(&mid) {
                    Some(Some(_)) => low[l] = mid[l],
                    Some(None) => high = mid,
                    None => break 'limits,
                }
            }
        }
        (best, bound, segments)
    }
}

/// DP passes that [`Dp::lagrangian`] spends refining its multipliers once a plan keeps
/// every limit.
const LAGRANGIAN_BISECTIONS: usize = 12;

impl Dp {
    /// An incumbent that keeps every cap: the table DP with the usage of each binding
    /// type counted in quanta, coarse enough that the table has at most
    /// [`Dp::max_cap_states`] states, or 2^n for n tracked types when that is more (up to
    /// `QUANTISED_MAX_TYPES` types; a type whose cap a plan breaks joins the tracked
    /// ones, as in the exact search). Returns the plan and its cost in the DP's units, and
    /// the stage evaluations. Used when the exact table is too large: it finds plans that
    /// pricing cannot (a plan no price setting makes cheapest).
    fn quantised(
        &self,
        pb: &Problem,
        prices: &[f64],
        tracked: &[bool],
    ) -> (Option<(Plan, f64)>, usize) {
        let limits = &pb.limits();
        let mut tracked = tracked.to_vec();
        let mut segments = 0;
        for _ in 0..=limits.len() {
            let capped: Vec<usize> = (0..limits.len()).filter(|&l| tracked[l]).collect();
            // The same number of quanta per tracked type, as many as the table allows, and
            // at least one (2^n states): past QUANTISED_MAX_TYPES tracked types even that
            // table is too large, and there is no incumbent.
            if capped.len() > QUANTISED_MAX_TYPES {
                break;
            }
            let per_type = (self.max_cap_states.max(2) as f64)
                .powf(1.0 / capped.len().max(1) as f64)
                .floor()
                .max(2.0) as usize
                - 1;
            let mut quantum = vec![1; limits.len()];
            for &l in &capped {
                quantum[l] = (limits[l].cap as usize).div_ceil(per_type).max(1);
            }
            let s = self.solve_quantised(pb, prices, &tracked, &quantum);
            segments += s.segments;
            let Some(plan) = s.plan else {
                break;
            };
            match dp_cost(pb, prices, &plan) {
                Ok(cost) => return (Some((plan, cost)), segments),
                Err(crate::error::Infeasible::Cap { limit, .. }) => {
                    if tracked[limit] {
                        break;
                    }
                    tracked[limit] = true;
                }
                Err(_) => break,
            }
        }
        (None, segments)
    }
}

/// Most tracked capped types the quantised incumbent handles: one quantum each is
/// already 2^12 usage states.
const QUANTISED_MAX_TYPES: usize = 12;

/// A plan's cost in the DP's own units (Σ price × units, as the label search counts),
/// or why it is infeasible.
fn dp_cost(pb: &Problem, prices: &[f64], plan: &Plan) -> Result<f64, crate::error::Infeasible> {
    let e = pb.evaluate(plan)?;
    Ok(e.stages
        .iter()
        .map(|r| prices[r.stage.ty] * r.units as f64)
        .sum())
}

/// `lower[j]`: a lower bound on the cost of covering layers `j..L−1` (one more entry, 0,
/// for nothing left), with compute-only unit counts (`⌈X·C/B⌉`: transfers and caps only
/// add units), in the same currency as the DP's prices (cost per hour, before the
/// job's duration).
fn lower_bound_after(pb: &Problem, prices: &[f64]) -> Vec<f64> {
    let l_n = pb.num_layers();
    let x = pb.constraint.throughput;
    let batch = pb.model.batch_size;
    let mut lower = vec![f64::INFINITY; l_n + 1];
    lower[l_n] = 0.0;
    for i in (0..l_n).rev() {
        for e in i..l_n {
            for (t, price) in prices.iter().enumerate() {
                if pb.segment_memory(i, e) > pb.catalog.types[t].memory_bytes {
                    continue;
                }
                let k = (x * pb.segment_compute(i, e, t) / batch).ceil().max(1.0);
                lower[i] = lower[i].min(price * k + lower[e + 1]);
            }
        }
    }
    lower
}
