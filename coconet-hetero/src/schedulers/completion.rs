//! Lower bounds on what completing a partial plan costs, which prune the label search
//! under limits (`dp_labels`): a partial plan whose cost plus the cheapest completion
//! reaches the incumbent's cost cannot lead to a cheaper plan.
//!
//! The cheapest completion ignoring the limits is a segment DP run backwards from the
//! last layer. It is weak where the limits bind (the completion uses what the limits
//! forbid), so it is also run at Lagrangian prices (each unit of a type charged
//! `μ_l` more per unit it draws on limit `l`): a completion `Q` that keeps the limits,
//! drawing `q_l ≤ cap_l − used_l` where the partial plan already drew `used_l`, costs
//! `cost_μ(Q) − Σ μ_l·q_l ≥ C_μ − Σ μ_l·(cap_l − used_l)` with `C_μ` the cheapest
//! completion at those prices. With good multipliers this bound is close to the
//! completion's real cost, and it grows with what the partial plan has used.

use crate::limit;

use super::stage_units::StageUnits;

/// The cheapest completion after every cut, at one set of prices.
pub(crate) struct Completion {
    t_n: usize,
    layers: usize,
    /// `cost[(i · (T + 1) + prev) · T + first]`: the cheapest covering of layers `i..`
    /// whose first stage has type `first` and follows a stage of type `prev` (`T`: none,
    /// at `i = 0`), priced per unit; infinite where none exists.
    cost: Vec<f64>,
}

impl Completion {
    /// The backward segment DP at `prices` (per unit of each type). A stage whose units
    /// alone break a limit is left out (no plan within the limits has it).
    pub fn new(units: &StageUnits, prices: &[f64]) -> Self {
        let pb = units.problem();
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        let x = pb.constraint.throughput;
        let limits = pb.limits();
        let neighbours = &units.neighbours;
        let mut done = Completion {
            t_n,
            layers: l_n,
            cost: vec![f64::INFINITY; l_n * (t_n + 1) * t_n],
        };
        let mut work = 0u64;
        for i in (0..l_n).rev() {
            for (u, &price) in prices.iter().enumerate().take(t_n) {
                let before = neighbours.preceding(u, i);
                // Previous types in one group see the same completions.
                for (g_in, prev_group) in before.iter().enumerate() {
                    let mut best = f64::INFINITY;
                    for j in i..l_n {
                        if pb.segment_memory(i, j, u) > pb.catalog.types[u].memory_bytes {
                            break;
                        }
                        // The segment's compute-only price grows as it extends right.
                        let lb = price
                            * (x * pb.segment_compute(i, j, u) / pb.batch_size(u))
                                .ceil()
                                .max(1.0);
                        if lb >= best {
                            break;
                        }
                        let after = neighbours.following(u, j);
                        for (g_out, next_group) in after.iter().enumerate() {
                            work += 1;
                            let rest = next_group
                                .iter()
                                .map(|&v| done.after(j + 1, u, v))
                                .fold(f64::INFINITY, f64::min);
                            if lb + rest >= best {
                                continue;
                            }
                            let Some(k) = units.get(i, j, u, g_in, g_out) else {
                                continue;
                            };
                            if limits
                                .iter()
                                .any(|l| k.saturating_mul(l.per_unit[u]) > l.cap)
                            {
                                continue;
                            }
                            best = best.min(price * k as f64 + rest);
                        }
                    }
                    for &p in prev_group {
                        done.cost[(i * (t_n + 1) + p) * t_n + u] = best;
                    }
                }
            }
        }
        units.spend(work * super::effort::COMPLETION_WORK);
        done
    }

    /// The cheapest covering of layers `i..` whose first stage has type `first` after a
    /// stage of type `prev`; 0 for nothing left (`i` past the last layer, `first` = none).
    pub fn after(&self, i: usize, prev: usize, first: usize) -> f64 {
        if i == self.layers {
            return if first == self.t_n {
                0.0
            } else {
                f64::INFINITY
            };
        }
        if first == self.t_n {
            return f64::INFINITY;
        }
        self.cost[(i * (self.t_n + 1) + prev) * self.t_n + first]
    }

    /// The cheapest plan of all (at these prices).
    pub fn whole(&self) -> f64 {
        (0..self.t_n)
            .map(|u| self.after(0, self.t_n, u))
            .fold(f64::INFINITY, f64::min)
    }
}

/// The bounds the label search prunes with: the completion at the DP's prices, and at
/// Lagrangian prices with their multipliers; and whether a partial plan can still keep
/// the limits at all ([`Pruning`]).
pub(crate) struct Bounds {
    plain: Completion,
    /// The completion at Lagrangian prices, the multipliers, and `Σ μ_l · cap_l`.
    priced: Option<(Completion, Vec<f64>, f64)>,
    limits: Pruning,
}

impl Bounds {
    /// Bounds at `prices`, and at Lagrangian multipliers `mu` (one per limit of
    /// [`Problem::limits`]) where given.
    pub fn new(units: &StageUnits, prices: &[f64], mu: Option<&[f64]>) -> Self {
        let limits = units.problem().limits();
        let priced = mu.filter(|mu| mu.iter().any(|&m| m > 0.0)).map(|mu| {
            let priced = limit::priced(prices, &limits, mu);
            let surcharge = mu.iter().zip(&limits).map(|(m, l)| m * l.cap as f64).sum();
            (Completion::new(units, &priced), mu.to_vec(), surcharge)
        });
        Bounds {
            plain: Completion::new(units, prices),
            priced,
            limits: Pruning::none(),
        }
    }

    /// These bounds, with partial plans that cannot keep the limits pruned by `limits`.
    pub fn with_pruning(self, limits: Pruning) -> Self {
        Bounds { limits, ..self }
    }

    /// A lower bound on what the cheapest plan within the limits costs.
    pub fn whole(&self) -> f64 {
        let priced = self
            .priced
            .as_ref()
            .map_or(0.0, |(c, _, surcharge)| c.whole() - surcharge);
        self.plain.whole().max(priced)
    }

    /// A lower bound on completing a partial plan that covers layers `..=j`, ends with a
    /// stage of type `t` followed by one of a type in `next` (the least over them; none
    /// after the last layer), and drew `used[s]` on limit `ids[s]`. Limits not in `ids`
    /// are counted as not drawn yet. Infinite where no completion keeps the limits.
    pub fn completing(
        &self,
        j: usize,
        t: usize,
        next: &[usize],
        used: &[u64],
        ids: &[usize],
    ) -> f64 {
        if !self.limits.can_keep(j, t, next, used, ids) {
            return f64::INFINITY;
        }
        let plain = |u: usize| self.plain.after(j + 1, t, u);
        let Some((priced, mu, surcharge)) = &self.priced else {
            return next.iter().map(|&u| plain(u)).fold(f64::INFINITY, f64::min);
        };
        let mut left = *surcharge;
        for (&s, &d) in ids.iter().zip(used) {
            left -= mu[s] * d as f64;
        }
        next.iter()
            .map(|&u| plain(u).max(priced.after(j + 1, t, u) - left))
            .fold(f64::INFINITY, f64::min)
    }
}

/// A margin on `1` for sums of floating-point shares in another order.
pub(crate) const SLACK: f64 = 1e-9;

/// Completions at share prices, each with its shares per limit divided by the caps.
pub(crate) struct Pruning {
    checks: Vec<(Completion, Vec<f64>)>,
}

impl Pruning {
    /// Checks by `checks`: each a completion at share prices and the weight per unit
    /// drawn of each limit ([`super::feasibility`]).
    pub fn new(checks: Vec<(Completion, Vec<f64>)>) -> Self {
        Pruning { checks }
    }

    /// No pruning.
    pub fn none() -> Self {
        Pruning { checks: Vec::new() }
    }

    /// Whether a partial plan covering layers `..=j`, whose last stage has type `t` and
    /// is followed by one of a type in `next`, and which drew `used[s]` on limit `ids[s]`,
    /// can still keep every limit.
    pub fn can_keep(
        &self,
        j: usize,
        t: usize,
        next: &[usize],
        used: &[u64],
        ids: &[usize],
    ) -> bool {
        self.checks.iter().all(|(completion, weight)| {
            let drawn: f64 = ids
                .iter()
                .zip(used)
                .map(|(&l, &u)| weight[l] * u as f64)
                .sum();
            let rest = next
                .iter()
                .map(|&u| completion.after(j + 1, t, u))
                .fold(f64::INFINITY, f64::min);
            drawn + rest <= 1.0 + SLACK
        })
    }
}
