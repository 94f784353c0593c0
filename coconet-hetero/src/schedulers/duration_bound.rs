//! A lower bound on what the plans of high throughput cost under
//! [`crate::Objective::Duration`]: what lets the parametric search (`parametric`) prove
//! optimality before it has walked every throughput, and state a tight gap when it
//! stops short.
//!
//! **The bound.** Take any plan — any partition, types, unit counts `k_s ≥ 1` and
//! parameter-server shards `σ` — whose throughput `X = min(min_s X_s(k_s), σ·bw/r)` lies
//! in `[a, b]` (`b` may be infinite; `r` the server's bytes per sample). Its cost is
//! `price/3600 · max(N/X, m) ≥ N · price_per_second / X`, and whole instances only add
//! idle units to `price ≥ Σ_s p_s·k_s + p_σ·σ` (every unit priced singly). For each
//! stage, `X ≤ X_s(k_s) = k_s·B_s/T_s(k_s)` gives `k_s/X ≥ T_s(k_s)/B_s`, and since the
//! stage reaches `X ≥ a`, `k_s ≥ k_s(a)`, the fewest units reaching `a`
//! ([`min_units`]: every smaller count falls short), so `k_s/X ≥ k_s(a)/b` too and
//! `T_s(k_s) ≥ T_s^↓(a) = inf_{k ≥ k_s(a)} T_s(k)`. Likewise `σ/X ≥ r/bw` and
//! `σ/X ≥ σ(a)/b`. So
//!
//! `cost ≥ N · [ Σ_s p_s · max(T_s^↓(a)/B_s, k_s(a)/b) + p_σ · max(r/bw, σ(a)/b) ]`,
//!
//! a sum over stages of terms that depend only on the stage's layers, type and
//! neighbours: the segment DP minimises it over every partition and type assignment
//! ([`per_sample`]), and the minimum bounds every plan of throughput in `[a, b]`. It is
//! valid whatever the plan's unit counts (the paper's objective may pay for more units
//! than a throughput needs), and with every term of the cost model:
//!
//! - `T_s(k) = max(T₁, T₁' + sync(k))` ([`StageShape::time`]). Under the ring,
//!   `sync(k) = 2(k−1)/k · S` never falls as `k` grows, so `T^↓ = T(k(a))`; in the
//!   asynchronous mode there is no sync, `T^↓ = T₁`. Under coconet's schedules the
//!   cheapest schedule's time may fall with `k` (an update on a `1/k` shard), so `T^↓`
//!   is the least, over every schedule, of its time at the counts `k ≥ k(a)` nearest
//!   the ends of its pieces (on each piece the time is affine in `u = 1/k`, so least at
//!   the counts nearest an end), and its time alone where `k(a) = 1`.
//! - Shared hosts: a stage's time at any load is at least its time alone, which is what
//!   the shapes here use (a count reaching `a` loaded reaches it alone, so `k(a)` alone
//!   is no more than the loaded one, and `T` alone at any `k` is no more than loaded).
//! - Limits (caps, a host's cores): a stage whose `k(a)` alone breaks one (at what the
//!   shards `a` needs leave of it: a plan of more throughput needs at least as many) can
//!   be in no plan of throughput `≥ a`; and since every stage of such a plan has at least
//!   `k(a)` units, its stages' `k(a)` together keep every limit, which Lagrangian
//!   multipliers charge (`lagrangian`: `μ_l ≥ 0` per unit drawn, less `μ_l · cap_l`; the
//!   multipliers searched one limit at a time over cached stage factors). Without it a
//!   chain whose T4 and A100 caps bind was bounded at the plans without caps, 50 % below
//!   its optimum; with it, 5–7 % (what is left is rounding: the bound prices each stage
//!   at its least time per sample, not at whole units). Memory is exact: a
//!   replica that does not fit is in no plan.
//! - Whole instances are relaxed: every unit is priced singly, the idle ones free.
//! - The billing minimum only raises the cost (`max(N/X, m) ≥ N/X`).
//!
//! **Monotonicity.** `k_s(a)` never falls as `a` grows (a count reaching a higher rate
//! reaches a lower one), nor do `σ(a)` and `T^↓(a)` (an infimum over fewer counts), so
//! the bound for `[a, ∞)` never falls as `a` grows: the search may keep an older one for
//! the plans past its frontier. As `a` grows it rises towards the per-sample price of
//! the cheapest plan whose stages synchronise as many units do; where that is above the
//! optimum (synchronisation that grows with the units), the search ends, proven, at a
//! finite frontier. Where what makes the optimum dear is rounding the bound relaxes —
//! whole instances above all (the shipped BERT's optimum rents one whole H100 instance;
//! priced unit by unit, plans of a quarter of it bound it at 74 % of its cost) — it
//! stays below the optimum, and the search ends as before, at the caps or its budget.
//! The compute-only floor (`floor_per_sample`) is this bound with transfers,
//! synchronisation, partitions and rounding all dropped, so the bound is never below
//! it.

use crate::cost::{Problem, StageShape};
use crate::provision::{MAX_UNITS, min_units};
use crate::sync::SyncModel;

use super::effort::{BOUND_STAGE_WORK, Effort};
use super::neighbours::Neighbours;
use super::stage_units::StageLayout;

/// Dollars per sample that no plan of `pb` whose throughput lies in `[from, upto]` can
/// beat (see the module docs; `upto` may be infinite), over the plan space of the DP
/// with runs split or not (`split_runs`). Infinite when no plan can reach `from`. The
/// stages it prices count as `effort`'s work; `mu`: the Lagrangian multipliers of `pb`'s
/// limits to start from, where it has limits, left at the best found (see
/// [`lagrangian`]).
pub(super) fn per_sample(
    pb: &Problem,
    split_runs: bool,
    from: f64,
    upto: f64,
    effort: &Effort,
    mu: &mut Vec<f64>,
) -> f64 {
    let at = match crate::constraint::Constraint::new(from, pb.constraint.samples) {
        Ok(c) => pb.with_constraint(c),
        Err(_) => return 0.0,
    };
    // The parameter server: its shards at `from` (a search for more throughput needs at
    // least as many), per sample at the throughput they serve, or spread over `upto`.
    let server = match at.parameter_servers() {
        Ok(None) => 0.0,
        Ok(Some(s)) => {
            let price = pb.price_per_second(s.ty) * s.shards as f64;
            price * (1.0 / s.throughput).max(1.0 / upto)
        }
        // The shards alone cannot serve `from`: no plan reaches it.
        Err(_) => return f64::INFINITY,
    };
    let bound = server + stages(&at, split_runs, (from, upto), effort, mu);
    // (Not a number only from times that are not: then no bound at all.)
    if bound.is_nan() { 0.0 } else { bound }
}

/// The most units of each type one stage may rent under the limits at `pb`'s required
/// rate (`u64::MAX`: no limit).
fn most_units(pb: &Problem) -> Vec<u64> {
    let limits = pb.limits();
    (0..pb.num_types())
        .map(|t| {
            limits
                .iter()
                .filter(|l| l.draws_on(t))
                .map(|l| l.cap / l.per_unit[t])
                .min()
                .unwrap_or(u64::MAX)
        })
        .collect()
}

/// A throughput no plan of `pb` exceeds: each layer's stage runs no faster than the
/// most units its type may rent, each taking at least the layer's compute per batch;
/// infinite where some layer has an unlimited type (or one with no compute).
pub(super) fn max_throughput(pb: &Problem) -> f64 {
    let most = most_units(pb);
    (0..pb.num_layers())
        .map(|l| {
            (0..pb.num_types())
                .filter(|&t| pb.segment_memory(l, l, t) <= pb.catalog.types[t].memory_bytes)
                .map(|t| {
                    let compute = pb.segment_compute(l, l, t);
                    if most[t] == u64::MAX || compute <= 0.0 {
                        f64::INFINITY
                    } else {
                        most[t] as f64 * pb.batch_size(t) / compute
                    }
                })
                .fold(0.0, f64::max)
        })
        .fold(f64::INFINITY, f64::min)
}

/// The least time per batch of the stage `shape` with `k0` units or more.
fn least_time_from(shape: &StageShape, k0: u64) -> f64 {
    let sync = if shape.dense_bytes == 0.0 {
        0.0
    } else {
        match shape.sync {
            // Never falls as k grows (2(k−1)/k), or none at all.
            SyncModel::Ring | SyncModel::AsyncServer => shape.sync_seconds(k0),
            SyncModel::Schedules(list) => {
                let (memory, network) = (shape.memory_bandwidth, shape.sync_bandwidth);
                let from = k0.max(2);
                let per_byte = list
                    .iter()
                    .map(|s| {
                        let mut least = if k0 <= 1 {
                            s.seconds_per_byte(1, memory, network)
                        } else {
                            f64::INFINITY
                        };
                        // On each piece the time is affine in u = 1/k, so least at the
                        // counts nearest its ends: the fewest units whose 1/k is in it
                        // and the most (with one count either side, against rounding;
                        // every count from `from` on is a count the stage may have).
                        for p in s.pieces(memory, network, 1.0 / MAX_UNITS as f64) {
                            let fewest = (1.0 / p.u_hi).ceil() as u64;
                            let most = (1.0 / p.u_lo).floor() as u64;
                            for k in [fewest.max(from), most] {
                                for k in [k.saturating_sub(1), k, k.saturating_add(1)] {
                                    if (from..=MAX_UNITS).contains(&k) {
                                        least = least.min(s.seconds_per_byte(k, memory, network));
                                    }
                                }
                            }
                        }
                        least
                    })
                    .fold(f64::INFINITY, f64::min);
                // No schedule at all: no synchronisation.
                if per_byte.is_finite() {
                    shape.dense_bytes * per_byte
                } else {
                    0.0
                }
            }
        }
    };
    shape.single_unit_time().max(shape.exposed_time() + sync)
}

/// The least over every plan of `Σ_s p_s · max(T_s^↓/B_s, k_s(from)/upto)`, dollars
/// per sample (infinite when no plan has every stage reach `from`): a segment DP over
/// `F[j][t][u]`, the least sum over partitions of layers `0..=j` whose last stage has
/// type `t` and precedes one of type `u` (or none), as in `dp`. Where `pb` has limits
/// (caps, hosts' cores), the best of that at Lagrangian prices less what the limits
/// are worth ([`lagrangian`]), which is never less.
fn stages(
    pb: &Problem,
    split_runs: bool,
    (from, upto): (f64, f64),
    effort: &Effort,
    mu: &mut Vec<f64>,
) -> f64 {
    if pb.num_layers() == 0 {
        return 0.0;
    }
    let neighbours = Neighbours::new(pb, split_runs);
    let most = most_units(pb);
    let price: Vec<f64> = (0..pb.num_types())
        .map(|t| pb.price_per_second(t))
        .collect();
    if !pb.limits().is_empty()
        && let Some(cache) = Factors::new(pb, &neighbours)
    {
        return lagrangian(pb, &neighbours, &price, &cache, effort, mu, |i, j, t, g| {
            factor(pb, &neighbours, (i, j, t, g), from, upto, &most)
        });
    }
    let priced = std::cell::Cell::new(0u64);
    let least = least_sum(pb, &neighbours, &price, None, |i, j, t, g| {
        priced.set(priced.get() + 1);
        factor(pb, &neighbours, (i, j, t, g), from, upto, &most)
    });
    effort.spend(priced.get().saturating_mul(BOUND_STAGE_WORK));
    least
}

/// A stage's `max(T^↓/B, k(from)/upto)`, dollars per sample per dollar per second of
/// its type, and its fewest units `k(from)`: the stage is layers `i..=j` on type `t`
/// between neighbours of the groups `g` (previous, next; see [`Neighbours`]); `None`
/// where no count up to what the limits allow one stage reaches `from`; a factor of 0
/// where it is not a number (it bounds nothing).
fn factor(
    pb: &Problem,
    neighbours: &Neighbours,
    (i, j, t, (g_in, g_out)): (usize, usize, usize, (usize, usize)),
    from: f64,
    upto: f64,
    most: &[u64],
) -> Option<(f64, u64)> {
    let prev = (i > 0).then(|| neighbours.before[t][g_in][0]);
    let next = (j + 1 < pb.num_layers()).then(|| neighbours.after[t][g_out][0]);
    let shape = pb.stage_shape(i, j, t, prev, next);
    let k0 = min_units(&shape, from).filter(|&k| k <= most[t])?;
    let per_unit = least_time_from(&shape, k0) / shape.batch;
    let w = per_unit.max(k0 as f64 / upto);
    Some((if w.is_nan() { 0.0 } else { w }, k0))
}

/// The segment DP of [`stages`] at per-unit `price`s, each stage weighing its type's
/// price times its factor, plus (with `per_unit`) `per_unit[t]` times its fewest units
/// (`factor(i, j, t, (previous group, next group))` gives both).
fn least_sum(
    pb: &Problem,
    neighbours: &Neighbours,
    price: &[f64],
    per_unit: Option<&[f64]>,
    mut factor: impl FnMut(usize, usize, usize, (usize, usize)) -> Option<(f64, u64)>,
) -> f64 {
    let (l_n, t_n) = (pb.num_layers(), pb.num_types());
    let idx = |j: usize, t: usize, u: usize| (j * t_n + t) * (t_n + 1) + u;
    let mut f = vec![f64::INFINITY; l_n * t_n * (t_n + 1)];
    for j in 0..l_n {
        for t in 0..t_n {
            let memory = pb.catalog.types[t].memory_bytes;
            let after = neighbours.following(t, j);
            for (g_out, next_group) in after.iter().enumerate() {
                let u = next_group[0];
                let cell = idx(j, t, u);
                for i in (0..=j).rev() {
                    if pb.segment_memory(i, j, t) > memory {
                        break;
                    }
                    // The compute alone bounds the weight, and grows as the stage
                    // extends to the left.
                    let least = price[t] * pb.segment_compute(i, j, t) / pb.batch_size(t);
                    if least >= f[cell] {
                        break;
                    }
                    for (g_in, prev_group) in neighbours.preceding(t, i).iter().enumerate() {
                        let base = if i == 0 {
                            0.0
                        } else {
                            prev_group
                                .iter()
                                .map(|&p| f[idx(i - 1, p, t)])
                                .fold(f64::INFINITY, f64::min)
                        };
                        if base + least >= f[cell] {
                            continue;
                        }
                        if let Some((x, k0)) = factor(i, j, t, (g_in, g_out)) {
                            // No stage costs less than nothing (a weight that is not a
                            // number bounds nothing).
                            let w = price[t] * x + per_unit.map_or(0.0, |m| m[t] * k0 as f64);
                            f[cell] = f[cell].min(base + if w.is_nan() { 0.0 } else { w });
                        }
                    }
                }
                for &v in &next_group[1..] {
                    f[idx(j, t, v)] = f[cell];
                }
            }
        }
    }
    (0..t_n)
        .map(|t| f[idx(l_n - 1, t, t_n)])
        .fold(f64::INFINITY, f64::min)
}

/// Most stages whose factors [`Factors`] keeps (8 bytes each): beyond it the bound
/// ignores the limits.
const MAX_FACTORS: usize = 1 << 25;

/// Every stage's [`factor`], computed on first use, for the many passes of
/// [`lagrangian`] (the layout of `stage_units`: by type and last layer, then first
/// layer and neighbour groups).
struct Factors {
    l_n: usize,
    /// `first[t · L + j]`: the first layer of the longest stage ending at `j` that fits
    /// one unit of `t`.
    first: Vec<usize>,
    offset: Vec<usize>,
    /// Previous and next groups of each type (at least 1 each).
    groups: Vec<(usize, usize)>,
    /// Not a number: not computed yet; negative: no count reaches.
    values: Vec<std::cell::Cell<f64>>,
    /// The fewest units, where computed.
    units: Vec<std::cell::Cell<u64>>,
}

impl Factors {
    fn new(pb: &Problem, neighbours: &Neighbours) -> Option<Self> {
        let StageLayout {
            l_n,
            first,
            offset,
            groups,
            total,
        } = StageLayout::new(pb, neighbours);
        let total = total?;
        (total <= MAX_FACTORS).then(|| Factors {
            l_n,
            first,
            offset,
            groups,
            values: (0..total).map(|_| std::cell::Cell::new(f64::NAN)).collect(),
            units: (0..total).map(|_| std::cell::Cell::new(0)).collect(),
        })
    }

    /// The factor of the stage, from the store or `compute` (counted in `fresh`).
    fn get(
        &self,
        (i, j, t, (g_in, g_out)): (usize, usize, usize, (usize, usize)),
        fresh: &mut u64,
        compute: impl FnOnce() -> Option<(f64, u64)>,
    ) -> Option<(f64, u64)> {
        let at = t * self.l_n + j;
        if i < self.first[at] {
            *fresh += 1;
            return compute();
        }
        let (_, after) = self.groups[t];
        let (g_in, g_out) = (
            if i == 0 { 0 } else { g_in },
            if j + 1 == self.l_n { 0 } else { g_out },
        );
        let slot = self.offset[at] + ((j - i) * self.groups[t].0 + g_in) * after + g_out;
        let v = self.values[slot].get();
        if v.is_nan() {
            *fresh += 1;
            let x = compute();
            self.values[slot].set(x.map_or(-1.0, |x| x.0));
            self.units[slot].set(x.map_or(0, |x| x.1));
            x
        } else {
            (v >= 0.0).then(|| (v, self.units[slot].get()))
        }
    }
}

/// Lagrangian passes per limit and round where the limit binds: a coarse scan of the
/// multiplier over 2^±SCAN times its last value, then a golden-section search around its
/// best.
const SCAN: i32 = 8;
const GOLDEN: usize = 10;

/// The best of [`least_sum`] with each stage charged `Σ_l μ_l · w_l(t) · k(from)` more
/// (`μ_l ≥ 0` dollars per sample for each unit it draws on limit `l`, at its fewest
/// units reaching `from`), less `Σ_l μ_l · cap_l`, over multipliers searched one limit
/// at a time (two rounds). Every such value bounds the plans of throughput at least
/// `from` within the limits: each stage of such a plan has `k_s ≥ k_s(from)` units, so
/// `Σ_s w_l(t_s) · k_s(from) ≤ Σ_s w_l(t_s) · k_s ≤ cap_l` and
/// `Σ_l μ_l · (Σ_s w_l(t_s) · k_s(from) − cap_l) ≤ 0` may be added to the bound of the
/// module docs, a sum over stages that the segment DP minimises. At `μ = 0` it is the
/// bound without limits; a stage's units counted whole, it charges what a fraction
/// of a unit per stage would let slip (many stages each on a little of a capped type).
/// The search starts from the multipliers in `start` (the last call's, as the search
/// moves its frontier) and leaves its best there. The passes count as `effort`'s work; a
/// stop request ends the search with the best value so far.
fn lagrangian(
    pb: &Problem,
    neighbours: &Neighbours,
    price: &[f64],
    cache: &Factors,
    effort: &Effort,
    start: &mut Vec<f64>,
    factor: impl Fn(usize, usize, usize, (usize, usize)) -> Option<(f64, u64)>,
) -> f64 {
    let from = pb.constraint.throughput;
    let limits = pb.limits();
    let zero = vec![0.0; price.len()];
    let value = |mu: &[f64]| -> f64 {
        // Dollars per sample for each of a stage's fewest units, by type.
        let per_unit = crate::limit::priced(&zero, &limits, mu);
        let (mut read, mut fresh) = (0u64, 0u64);
        let least = least_sum(pb, neighbours, price, Some(&per_unit), |i, j, t, g| {
            read += 1;
            cache.get((i, j, t, g), &mut fresh, || factor(i, j, t, g))
        });
        effort.spend(read.saturating_add(fresh.saturating_mul(BOUND_STAGE_WORK)));
        let worth: f64 = limits.iter().zip(mu).map(|(l, m)| m * l.cap as f64).sum();
        least - worth
    };
    let mut mu = start.clone();
    mu.resize(limits.len(), 0.0);
    let mut best = value(&mu);
    if !best.is_finite() {
        return best;
    }
    for _round in 0..2 {
        let mut moved = false;
        for l in 0..limits.len() {
            if effort.interrupted().is_some() {
                break;
            }
            // The scale of a multiplier: the dearest price per unit drawn on the limit,
            // per sample at `from`.
            let scale = (0..price.len())
                .filter(|&t| limits[l].draws_on(t))
                .map(|t| price[t] / limits[l].per_unit[t] as f64)
                .fold(0.0, f64::max)
                / from;
            if scale <= 0.0 {
                continue;
            }
            let mut trial = mu.clone();
            let mut at = |m: f64| {
                trial[l] = m;
                value(&trial)
            };
            // The value is concave in μ_l: where a step either way does not raise it
            // (from 0, a tiny step up: the limit does not bind), μ_l stays.
            let up = if mu[l] > 0.0 {
                mu[l] * 1.25
            } else {
                scale * 2f64.powi(-SCAN)
            };
            let down = if mu[l] > 0.0 { at(mu[l] * 0.8) } else { best };
            if at(up) <= best && down <= best {
                continue;
            }
            // A scan over 2^-SCAN .. 2^SCAN times the current multiplier (or the scale),
            // and 0, then golden sections between the best one's neighbours.
            let centre = if mu[l] > 0.0 { mu[l] } else { scale };
            let mut grid: Vec<f64> = vec![0.0];
            grid.extend((-SCAN..=SCAN).map(|e| centre * 2f64.powi(e)));
            let mut values = Vec::with_capacity(grid.len());
            for &m in &grid {
                values.push(if m == mu[l] { best } else { at(m) });
            }
            let k = (0..values.len())
                .max_by(|&a, &b| values[a].total_cmp(&values[b]))
                .unwrap_or(0);
            let (mut lo, mut hi) = (grid[k.saturating_sub(1)], grid[(k + 1).min(grid.len() - 1)]);
            let (mut m_best, mut v_best) = (grid[k], values[k]);
            let phi = 0.5 * (5f64.sqrt() - 1.0);
            for _ in 0..GOLDEN {
                let (a, b) = (hi - phi * (hi - lo), lo + phi * (hi - lo));
                let (va, vb) = (at(a), at(b));
                for (m, v) in [(a, va), (b, vb)] {
                    if v > v_best {
                        (m_best, v_best) = (m, v);
                    }
                }
                if va >= vb {
                    hi = b;
                } else {
                    lo = a;
                }
            }
            if v_best > best {
                (best, mu[l], moved) = (v_best, m_best, true);
            }
        }
        if !moved {
            break;
        }
    }
    *start = mu;
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage_shape::Transfers;
    use crate::sync::{SyncSchedule, SyncStep, Traffic};

    /// The update on a 1/k shard beside a ring: slower alone than with a few replicas.
    fn sharded() -> SyncModel {
        SyncModel::Schedules(vec![SyncSchedule {
            name: "sharded".into(),
            alone: 30.0,
            steps: vec![SyncStep {
                memory: Traffic {
                    fixed: 0.0,
                    per_replica: 30.0,
                },
                network: Traffic {
                    fixed: 2.0,
                    per_replica: -2.0,
                },
            }],
        }])
    }

    /// The least time from `k0` units on is the least of the times at every count from
    /// `k0` to far beyond (within rounding), under the ring (the time at `k0`), the
    /// asynchronous server and schedules whose time falls with the count in places,
    /// with the synchronisation hidden or not.
    #[test]
    fn least_time_from_is_the_least_time_from_there_on() {
        for sync in [
            SyncModel::Ring,
            SyncModel::AsyncServer,
            crate::sync::adam_like(),
            sharded(),
        ] {
            for &(compute, dense, memory_bandwidth, overlap) in &[
                (0.01, 1e6, 1e11, 0.0),
                (0.001, 5e7, 2e9, 0.0),
                (0.2, 1e9, 1e11, 0.5),
                (1e-5, 1e8, 5e8, 0.0),
                (0.05, 3e7, 1e10, 1.0),
            ] {
                let shape = StageShape {
                    compute,
                    transfer: 0.001,
                    dense_bytes: dense,
                    sync_bandwidth: 1e9,
                    memory_bandwidth,
                    sync: &sync,
                    batch: 32.0,
                    memory: 0.0,
                    transfers: Transfers::Serial,
                    sync_overlap: overlap,
                };
                for k0 in [1u64, 2, 3, 5, 17, 100] {
                    let least = least_time_from(&shape, k0);
                    let counted = (k0..k0 + 20_000)
                        .map(|k| shape.time(k))
                        .fold(f64::INFINITY, f64::min);
                    let what = format!("{sync:?} {compute} {dense} {overlap} from {k0}");
                    assert!(
                        least <= counted * (1.0 + 1e-12),
                        "{what}: {least} > {counted}"
                    );
                    // Exact where the least is within reach of counting; the counts up to
                    // 20,000 past `k0` come within 0.1 % of it anyway.
                    assert!(
                        least >= counted * (1.0 - 1e-3),
                        "{what}: {least} < {counted}"
                    );
                    if sync == SyncModel::Ring {
                        assert_eq!(least, shape.time(k0), "{what}");
                    }
                }
            }
        }
    }
}
