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
//!   multipliers searched one limit at a time along supergradients, over stage factors
//!   kept from call to call: [`Memo`]). Without it a
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
use crate::limit::Limit;
use crate::provision::{MAX_UNITS, min_units};
use crate::sync::SyncModel;

use super::effort::{BOUND_STAGE_WORK, Effort};
use super::neighbours::Neighbours;
use super::stage_units::StageLayout;

/// What the bounds of one search keep from one call to the next. Under limits the
/// bound makes dozens of segment-DP passes over every stage (`lagrangian`), and pricing
/// a stage afresh costs thirty times reading it: so every stage's fewest units at
/// `from` are kept, and kept on as `from` grows while they still reach it (they then
/// are its fewest units there too), the pieces of throughput that follow one another
/// re-pricing only the stages whose units change. The multipliers of the limits are
/// kept too, one set for the tail bound (`upto` infinite) and one for the pieces, each
/// call starting where the last of its kind ended.
pub(super) struct Memo {
    /// Whether consecutive stages may share a type (the DP's plan space).
    split_runs: bool,
    /// The stages' fewest units, once built (where `pb` has limits and they fit).
    factors: Option<Factors>,
    /// Multipliers of the limits for the tail bound and for the pieces.
    tail_mu: Vec<f64>,
    piece_mu: Vec<f64>,
}

impl Memo {
    /// Nothing kept yet, over the plan space of the DP with runs split or not.
    pub(super) fn new(split_runs: bool) -> Self {
        Memo {
            split_runs,
            factors: None,
            tail_mu: Vec::new(),
            piece_mu: Vec::new(),
        }
    }

    /// Dollars per sample that no plan of `pb` whose throughput lies in `[from, upto]`
    /// can beat (see the module docs; `upto` may be infinite). Infinite when no plan can
    /// reach `from`. The stages it prices count as `effort`'s work. Every call must be
    /// for the same `pb` (up to its required throughput); a call for a lower `from` than
    /// the last one starts the kept stages afresh.
    pub(super) fn per_sample(
        &mut self,
        pb: &Problem,
        from: f64,
        upto: f64,
        effort: &Effort,
    ) -> f64 {
        let at = match crate::constraint::Constraint::new(from, pb.constraint.samples) {
            Ok(c) => pb.with_constraint(c),
            Err(_) => return 0.0,
        };
        // The parameter server: its shards at `from` (a search for more throughput needs
        // at least as many), per sample at the throughput they serve, or spread over
        // `upto`.
        let server = match at.parameter_servers() {
            Ok(None) => 0.0,
            Ok(Some(s)) => {
                let price = pb.price_per_second(s.ty) * s.shards as f64;
                price * (1.0 / s.throughput).max(1.0 / upto)
            }
            // The shards alone cannot serve `from`: no plan reaches it.
            Err(_) => return f64::INFINITY,
        };
        let bound = server + self.stages(&at, (from, upto), effort);
        // (Not a number only from times that are not: then no bound at all.)
        if bound.is_nan() { 0.0 } else { bound }
    }
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

impl Memo {
    /// The least over every plan of `Σ_s p_s · max(T_s^↓/B_s, k_s(from)/upto)`, dollars
    /// per sample (infinite when no plan has every stage reach `from`): a segment DP over
    /// `F[j][t][u]`, the least sum over partitions of layers `0..=j` whose last stage has
    /// type `t` and precedes one of type `u` (or none), as in `dp`. Where `pb` has limits
    /// (caps, hosts' cores), the best of that at Lagrangian prices less what the limits
    /// are worth ([`lagrangian`]), which is never less.
    fn stages(&mut self, pb: &Problem, (from, upto): (f64, f64), effort: &Effort) -> f64 {
        if pb.num_layers() == 0 {
            return 0.0;
        }
        let neighbours = Neighbours::new(pb, self.split_runs);
        let most = most_units(pb);
        let price: Vec<f64> = (0..pb.num_types())
            .map(|t| pb.price_per_second(t))
            .collect();
        if !pb.limits().is_empty() {
            // Kept stages priced at a higher `from` may have more units than this one
            // needs: start afresh.
            if self.factors.as_ref().is_some_and(|f| f.from > from) {
                self.factors = None;
            }
            if self.factors.is_none() {
                self.factors = Factors::new(pb, &neighbours);
            }
        }
        if let Some(cache) = &mut self.factors {
            cache.from = from;
            let mu = if upto.is_finite() {
                &mut self.piece_mu
            } else {
                &mut self.tail_mu
            };
            let stage = |i, j, t, g| provisioned(pb, &neighbours, (i, j, t, g), from, &most);
            return lagrangian(
                pb,
                &neighbours,
                &price,
                (cache, upto, &most),
                effort,
                mu,
                stage,
            );
        }
        let priced = std::cell::Cell::new(0u64);
        let (least, _) = least_sum(pb, &neighbours, &price, None, |i, j, t, g| {
            priced.set(priced.get() + 1);
            provisioned(pb, &neighbours, (i, j, t, g), from, &most).map(|p| p.factor(upto))
        });
        effort.spend(priced.get().saturating_mul(BOUND_STAGE_WORK));
        least
    }
}

/// One stage provisioned for the bounds at some `from`: its fewest units reaching it,
/// the least time per sample of one unit from those units on (`T^↓/B`), and the
/// throughput those units reach (up to which they stay the fewest).
#[derive(Clone, Copy)]
struct Provisioned {
    per_unit: f64,
    units: u64,
    reach: f64,
}

impl Provisioned {
    /// The stage's `max(T^↓/B, k(from)/upto)`, dollars per sample per dollar per second
    /// of its type (0 where it is not a number: it bounds nothing), and its fewest units.
    fn factor(&self, upto: f64) -> (f64, u64) {
        let w = self.per_unit.max(self.units as f64 / upto);
        (if w.is_nan() { 0.0 } else { w }, self.units)
    }
}

/// The stage of layers `i..=j` on type `t` between neighbours of the groups `g`
/// (previous, next; see [`Neighbours`]) provisioned at `from`; `None` where no count up
/// to what the limits allow one stage reaches `from`.
fn provisioned(
    pb: &Problem,
    neighbours: &Neighbours,
    (i, j, t, (g_in, g_out)): (usize, usize, usize, (usize, usize)),
    from: f64,
    most: &[u64],
) -> Option<Provisioned> {
    let prev = (i > 0).then(|| neighbours.before[t][g_in][0]);
    let next = (j + 1 < pb.num_layers()).then(|| neighbours.after[t][g_out][0]);
    let shape = pb.stage_shape(i, j, t, prev, next);
    let k0 = min_units(&shape, from).filter(|&k| k <= most[t])?;
    Some(Provisioned {
        per_unit: least_time_from(&shape, k0) / shape.batch,
        units: k0,
        reach: shape.throughput(k0),
    })
}

/// The segment DP of [`Memo::stages`] at per-unit `price`s, each stage weighing its
/// type's price times its factor, plus (with `charge`: a price per unit by type, and the
/// limits) that price times its fewest units (`factor(i, j, t, (previous group, next
/// group))` gives both). Returns the least sum and what the stages of a partition that
/// reaches it draw on each limit at their fewest units (a supergradient of the least
/// sum in the limits' multipliers, for [`lagrangian`]).
fn least_sum(
    pb: &Problem,
    neighbours: &Neighbours,
    price: &[f64],
    charge: Option<(&[f64], &[Limit])>,
    mut factor: impl FnMut(usize, usize, usize, (usize, usize)) -> Option<(f64, u64)>,
) -> (f64, Vec<f64>) {
    let (l_n, t_n) = (pb.num_layers(), pb.num_types());
    let limits = charge.map_or(&[][..], |c| c.1);
    let n_l = limits.len();
    let idx = |j: usize, t: usize, u: usize| (j * t_n + t) * (t_n + 1) + u;
    let mut f = vec![f64::INFINITY; l_n * t_n * (t_n + 1)];
    // What the partition reaching each cell's value draws on each limit.
    let mut drawn = vec![0.0; f.len() * n_l];
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
                        let (base, from) = if i == 0 {
                            (0.0, None)
                        } else {
                            prev_group
                                .iter()
                                .map(|&p| (f[idx(i - 1, p, t)], Some(idx(i - 1, p, t))))
                                .fold((f64::INFINITY, None), |a, b| if b.0 < a.0 { b } else { a })
                        };
                        if base + least >= f[cell] {
                            continue;
                        }
                        let Some((x, k0)) = factor(i, j, t, (g_in, g_out)) else {
                            continue;
                        };
                        // No stage costs less than nothing (a weight that is not a
                        // number bounds nothing).
                        let w = price[t] * x + charge.map_or(0.0, |c| c.0[t] * k0 as f64);
                        let v = base + if w.is_nan() { 0.0 } else { w };
                        if v < f[cell] {
                            f[cell] = v;
                            for (l, limit) in limits.iter().enumerate() {
                                let before = from.map_or(0.0, |c| drawn[c * n_l + l]);
                                drawn[cell * n_l + l] =
                                    before + (limit.per_unit[t] as f64) * k0 as f64;
                            }
                        }
                    }
                }
                for &v in &next_group[1..] {
                    let copy = idx(j, t, v);
                    f[copy] = f[cell];
                    drawn.copy_within(cell * n_l..(cell + 1) * n_l, copy * n_l);
                }
            }
        }
    }
    let end = (0..t_n)
        .map(|t| idx(l_n - 1, t, t_n))
        .min_by(|&a, &b| f[a].total_cmp(&f[b]))
        .expect("at least one type");
    (f[end], drawn[end * n_l..(end + 1) * n_l].to_vec())
}

/// Most stages whose factors [`Factors`] keeps (16 bytes each): beyond it the bound
/// ignores the limits.
const MAX_FACTORS: usize = 1 << 25;

/// Every stage provisioned at the latest `from`, computed on first use, for the many
/// passes of [`lagrangian`] and for the calls that follow at higher `from` (the layout
/// of `stage_units`: by type and last layer, then first layer and neighbour groups).
struct Factors {
    l_n: usize,
    /// `first[t · L + j]`: the first layer of the longest stage ending at `j` that fits
    /// one unit of `t`.
    first: Vec<usize>,
    offset: Vec<usize>,
    /// Previous and next groups of each type (at least 1 each).
    groups: Vec<(usize, usize)>,
    /// The `from` of the latest call: every entry was provisioned at or below it.
    from: f64,
    /// Each stage's `T^↓/B`: not a number where not provisioned yet, negative where no
    /// count reaches (at an earlier `from`, so none reaches a later one either).
    per_unit: Vec<std::cell::Cell<f64>>,
    /// Its fewest units, where provisioned.
    units: Vec<std::cell::Cell<u32>>,
    /// The throughput they reach, rounded down: while `from` stays at or below it, they
    /// are the fewest units there too (no fewer reach a lower rate), and the entry holds.
    reach: Vec<std::cell::Cell<f32>>,
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
        let cells = |v| (0..total).map(|_| std::cell::Cell::new(v)).collect();
        (total <= MAX_FACTORS).then(|| Factors {
            l_n,
            first,
            offset,
            groups,
            from: 0.0,
            per_unit: cells(f64::NAN),
            units: (0..total).map(|_| std::cell::Cell::new(0)).collect(),
            reach: (0..total).map(|_| std::cell::Cell::new(0.0)).collect(),
        })
    }

    /// The stage's `T^↓/B` and fewest units at `self.from`, from the store or from
    /// `compute` (counted in `fresh`) where not kept or no longer reaching `from`; `None`
    /// where no count up to `most` units reaches.
    fn get(
        &self,
        (i, j, t, (g_in, g_out)): (usize, usize, usize, (usize, usize)),
        most: u64,
        fresh: &mut u64,
        compute: impl FnOnce() -> Option<Provisioned>,
    ) -> Option<Provisioned> {
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
        let v = self.per_unit[slot].get();
        if v < 0.0 {
            return None;
        }
        if !v.is_nan() && f64::from(self.reach[slot].get()) >= self.from {
            let units = u64::from(self.units[slot].get());
            // (The limits' room may shrink as `from` grows: a parameter server's shards.)
            return (units <= most).then_some(Provisioned {
                per_unit: v,
                units,
                reach: f64::from(self.reach[slot].get()),
            });
        }
        *fresh += 1;
        let p = compute();
        match p {
            None => self.per_unit[slot].set(-1.0),
            // (Counts past 32 bits are provisioned each time.)
            Some(p) if p.units <= u64::from(u32::MAX) => {
                self.per_unit[slot].set(if p.per_unit.is_nan() { 0.0 } else { p.per_unit });
                self.units[slot].set(p.units as u32);
                // Rounded down, so that a kept entry always still reaches `from`.
                let reach = if p.reach.is_nan() {
                    0.0
                } else {
                    p.reach * (1.0 - 1e-6)
                };
                self.reach[slot].set(reach as f32);
            }
            Some(_) => {}
        }
        p
    }
}

/// Passes one line search of [`lagrangian`] (one limit's multiplier) makes at most.
const LINE_PASSES: usize = 12;

/// Rounds of line searches over the limits [`lagrangian`] makes at most.
const ROUNDS: usize = 3;

/// Where a multiplier's search starts from 0, relative to its scale: the multipliers
/// that bind sit near their scale, and the search moves by growing steps.
const FIRST_STEP: f64 = 1.0 / 64.0;

/// The bound of a line search taken as reached within this, relative.
const LINE_TOLERANCE: f64 = 2e-5;

/// The best of [`least_sum`] with each stage charged `Σ_l μ_l · w_l(t) · k(from)` more
/// (`μ_l ≥ 0` dollars per sample for each unit it draws on limit `l`, at its fewest
/// units reaching `from`), less `Σ_l μ_l · cap_l`, over multipliers searched one limit
/// at a time. Every such value bounds the plans of throughput at least `from` within the
/// limits: each stage of such a plan has `k_s ≥ k_s(from)` units, so
/// `Σ_s w_l(t_s) · k_s(from) ≤ Σ_s w_l(t_s) · k_s ≤ cap_l` and
/// `Σ_l μ_l · (Σ_s w_l(t_s) · k_s(from) − cap_l) ≤ 0` may be added to the bound of the
/// module docs, a sum over stages that the segment DP minimises. At `μ = 0` it is the
/// bound without limits; a stage's units counted whole, it charges what a fraction
/// of a unit per stage would let slip (many stages each on a little of a capped type).
///
/// The value is concave in `μ` (a least over partitions of sums affine in `μ`), and what
/// the least partition draws less the caps is a supergradient: each limit's multiplier
/// moves the way it points, by growing steps until it turns, then to where the tangents
/// either side meet ([`line_search`]) — a handful of passes where a scan would take
/// dozens. The search starts from the multipliers in `start` and leaves its best there.
/// The stages come from `cache` (spread over `upto`, at most `most` units a type) or,
/// where not kept, from `stage`; the passes count as `effort`'s work, and a stop request
/// ends the search with the best value so far.
fn lagrangian(
    pb: &Problem,
    neighbours: &Neighbours,
    price: &[f64],
    (cache, upto, most): (&Factors, f64, &[u64]),
    effort: &Effort,
    start: &mut Vec<f64>,
    stage: impl Fn(usize, usize, usize, (usize, usize)) -> Option<Provisioned>,
) -> f64 {
    let from = pb.constraint.throughput;
    let limits = pb.limits();
    let zero = vec![0.0; price.len()];
    // The bound at `mu`, and what its partition draws beyond each cap.
    let value = |mu: &[f64]| -> (f64, Vec<f64>) {
        // Dollars per sample for each of a stage's fewest units, by type.
        let per_unit = crate::limit::priced(&zero, &limits, mu);
        let (mut read, mut fresh) = (0u64, 0u64);
        let charge = Some((&per_unit[..], &limits[..]));
        let (least, drawn) = least_sum(pb, neighbours, price, charge, |i, j, t, g| {
            read += 1;
            let p = cache.get((i, j, t, g), most[t], &mut fresh, || stage(i, j, t, g));
            p.map(|p| p.factor(upto))
        });
        effort.spend(read.saturating_add(fresh.saturating_mul(BOUND_STAGE_WORK)));
        let worth: f64 = limits.iter().zip(mu).map(|(l, m)| m * l.cap as f64).sum();
        let beyond = drawn.iter().zip(&limits).map(|(d, l)| d - l.cap as f64);
        (least - worth, beyond.collect())
    };
    let mut mu = start.clone();
    mu.resize(limits.len(), 0.0);
    let (mut best, mut slope) = value(&mu);
    if !best.is_finite() {
        return best;
    }
    // The moves made, and at how many each limit's search last found nothing: from the
    // same multipliers it would find nothing again.
    let mut moves = 0usize;
    let mut stuck: Vec<Option<usize>> = vec![None; limits.len()];
    for _round in 0..ROUNDS {
        let mut moved = false;
        for l in 0..limits.len() {
            if effort.interrupted().is_some() {
                break;
            }
            if stuck[l] == Some(moves) {
                continue;
            }
            // The scale of a multiplier: the dearest price per unit drawn on the limit,
            // per sample at `from`.
            let scale = (0..price.len())
                .filter(|&t| limits[l].draws_on(t))
                .map(|t| price[t] / limits[l].per_unit[t] as f64)
                .fold(0.0, f64::max)
                / from;
            // Where the least partition keeps the limit with μ_l at 0, or meets it
            // exactly, μ_l stays.
            if scale <= 0.0 || slope[l] == 0.0 || (slope[l] < 0.0 && mu[l] == 0.0) {
                continue;
            }
            let mut trial = mu.clone();
            let mut at = |m: f64| {
                trial[l] = m;
                value(&trial)
            };
            let here = Point {
                m: mu[l],
                value: best,
                slope: slope[l],
            };
            let (m, v, s) = line_search(&mut at, l, here, scale * FIRST_STEP);
            if v > best {
                (mu[l], best, slope, moved) = (m, v, s, true);
                moves += 1;
            } else {
                stuck[l] = Some(moves);
            }
        }
        if !moved {
            break;
        }
    }
    *start = mu;
    best
}

/// One multiplier's value in a [`line_search`]: the bound there and its slope.
#[derive(Clone, Copy)]
struct Point {
    m: f64,
    value: f64,
    slope: f64,
}

/// The most of a concave function of one multiplier `m ≥ 0` (the bound of
/// [`lagrangian`] along limit `l`; `at(m)` gives the value and the supergradient of
/// every limit's multiplier) from `here`, whose slope is not 0: steps the way the slope
/// points, growing fourfold from `step` (down to 0 at most), until it turns; then
/// to where the tangents either side meet (for a piecewise-linear function, the
/// breakpoint between them in a few passes), until the value is within
/// [`LINE_TOLERANCE`] of the tangents' meeting value, which bounds the maximum. Returns
/// the best multiplier seen, its value and its supergradient (`here`'s where no pass
/// raised the value: then an empty one).
fn line_search(
    at: &mut impl FnMut(f64) -> (f64, Vec<f64>),
    l: usize,
    here: Point,
    step: f64,
) -> (f64, f64, Vec<f64>) {
    let mut best = (here.m, here.value, Vec::new());
    let (mut lo, mut hi) = if here.slope > 0.0 {
        (Some(here), None)
    } else {
        (None, Some(here))
    };
    let mut step = if here.m > 0.0 { here.m * 0.25 } else { step };
    let mut passes = 0;
    // Past the top, from either side.
    while lo.is_none() || hi.is_none() {
        if passes >= LINE_PASSES {
            return best;
        }
        let m = match (lo, hi) {
            (Some(p), _) => p.m + step,
            (_, Some(p)) => (p.m - step).max(0.0),
            (None, None) => unreachable!("one side is known"),
        };
        step *= 4.0;
        let (value, slopes) = at(m);
        passes += 1;
        let point = Point {
            m,
            value,
            slope: slopes[l],
        };
        if value > best.1 {
            best = (m, value, slopes);
        }
        // At 0 still falling, or flat: the top.
        if point.slope == 0.0 || (m == 0.0 && point.slope < 0.0) || !value.is_finite() {
            return best;
        }
        if point.slope > 0.0 {
            lo = Some(point);
        } else {
            hi = Some(point);
        }
    }
    let (Some(mut lo), Some(mut hi)) = (lo, hi) else {
        return best;
    };
    while passes < LINE_PASSES {
        // The tangents at either side meet at `m`, their value there bounds the top.
        let m = (hi.value - lo.value + lo.slope * lo.m - hi.slope * hi.m) / (lo.slope - hi.slope);
        let top = lo.value + lo.slope * (m - lo.m);
        if top.is_nan() || top - best.1 <= LINE_TOLERANCE * best.1.abs() {
            break;
        }
        let m = if m > lo.m && m < hi.m {
            m
        } else {
            0.5 * (lo.m + hi.m)
        };
        let (value, slopes) = at(m);
        passes += 1;
        let point = Point {
            m,
            value,
            slope: slopes[l],
        };
        if value > best.1 {
            best = (m, value, slopes);
        }
        match point.slope {
            s if s > 0.0 => lo = point,
            s if s < 0.0 => hi = point,
            _ => break,
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedulers::SearchConfig;
    use crate::{Catalog, Model};
    use std::path::Path;

    /// A chain of `layers` random layers over `types` random types, each capped at 1 to
    /// 4 units, `seed` choosing everything.
    fn capped_chain(seed: u64, layers: usize, types: usize) -> Problem {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut draw = |lo: f64, hi: f64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((state >> 11) as f64 / (1u64 << 53) as f64)
        };
        let mut catalog = String::from("default_bandwidth_gbs = 1.5\n");
        for t in 0..types {
            catalog += &format!(
                "[[types]]\nname = \"t{t}\"\nclass = \"gpu\"\nprice_per_hour = {}\n\
                 memory_gib = {}\npeak_tflops = {}\nmem_bandwidth_gbs = 300\n\
                 efficiency = 0.5\nlayer_overhead_us = {}\nsync_bandwidth_gbs = {}\ncap = {}\n",
                draw(0.2, 8.0),
                draw(8.0, 40.0),
                draw(5.0, 200.0),
                draw(0.0, 100.0),
                draw(0.5, 20.0),
                draw(1.0, 5.0).floor()
            );
        }
        let mut model = format!(
            "name = \"chain\"\nbatch_size = 64\n[constraint]\nthroughput = {}\nsamples = 1e9\n",
            draw(50.0, 2000.0)
        );
        for l in 0..layers {
            model += &format!(
                "[[layers]]\nname = \"l{l}\"\nkind = \"fc\"\nflops = {}\nbytes = {}\n\
                 activation_bytes = {}\ndense_param_bytes = {}\n",
                draw(1e9, 2e11),
                draw(1e8, 6e9),
                draw(1e5, 1e7),
                draw(0.0, 4e8)
            );
        }
        let catalog = Catalog::parse(Path::new("c.toml"), &catalog).expect("catalog");
        let model = Model::parse(Path::new("m.toml"), &model, &catalog).expect("model");
        let c = model.constraint.expect("constraint");
        Problem::new(model, catalog, c)
    }

    /// Every plan within the caps (any partition, types, counts up to the caps) as its
    /// throughput and dollars per sample at it.
    fn every_plan(pb: &Problem) -> Vec<(f64, f64)> {
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        let caps: Vec<u64> = pb.catalog.types.iter().map(|t| t.cap.unwrap()).collect();
        let mut plans = Vec::new();
        for cuts in 0u32..(1 << (l_n - 1)) {
            let mut spans = Vec::new();
            let mut first = 0;
            for l in 0..l_n {
                if l + 1 == l_n || cuts & (1 << l) != 0 {
                    spans.push((first, l));
                    first = l + 1;
                }
            }
            let n = spans.len();
            let choices: u64 = (0..n).map(|_| t_n as u64).product();
            for mut code in 0..choices {
                let types: Vec<usize> = (0..n)
                    .map(|_| {
                        let t = (code % t_n as u64) as usize;
                        code /= t_n as u64;
                        t
                    })
                    .collect();
                let counts: u64 = types.iter().map(|&t| caps[t]).product();
                'counts: for mut code in 0..counts {
                    let (mut x, mut price) = (f64::INFINITY, 0.0);
                    let mut used = vec![0u64; t_n];
                    for (s, &(i, j)) in spans.iter().enumerate() {
                        let t = types[s];
                        let k = code % caps[t] + 1;
                        code /= caps[t];
                        used[t] += k;
                        let shape = pb.stage_shape(
                            i,
                            j,
                            t,
                            (s > 0).then(|| types[s - 1]),
                            (s + 1 < n).then(|| types[s + 1]),
                        );
                        if shape.memory > pb.catalog.types[t].memory_bytes || used[t] > caps[t] {
                            continue 'counts;
                        }
                        x = x.min(shape.throughput(k));
                        price += pb.price_per_second(t) * k as f64;
                    }
                    plans.push((x, price / x));
                }
            }
        }
        plans
    }

    /// The bound of [`Memo::stages`] at multipliers 0: the stages priced alone.
    fn without_limits(pb: &Problem, from: f64, upto: f64) -> f64 {
        let at = pb.with_constraint(
            crate::constraint::Constraint::new(from, pb.constraint.samples).unwrap(),
        );
        let neighbours = Neighbours::new(&at, true);
        let most = most_units(&at);
        let price: Vec<f64> = (0..at.num_types())
            .map(|t| at.price_per_second(t))
            .collect();
        least_sum(&at, &neighbours, &price, None, |i, j, t, g| {
            provisioned(&at, &neighbours, (i, j, t, g), from, &most).map(|p| p.factor(upto))
        })
        .0
    }

    /// Every stage `cache` keeps as still reaching `from` has the fewest units that
    /// provisioning gives there, and every one kept as unreachable is.
    fn check_against_provisioning(cache: &Factors, pb: &Problem, from: f64) {
        let neighbours = Neighbours::new(pb, true);
        let most = vec![u64::MAX; pb.num_types()];
        let l_n = cache.l_n;
        for t in 0..pb.num_types() {
            let (before, after) = cache.groups[t];
            for j in 0..l_n {
                for i in cache.first[t * l_n + j]..=j {
                    for g_in in 0..if i == 0 { 1 } else { before } {
                        for g_out in 0..if j + 1 == l_n { 1 } else { after } {
                            let slot = cache.offset[t * l_n + j]
                                + ((j - i) * before + g_in) * after
                                + g_out;
                            let (v, reach) = (cache.per_unit[slot].get(), cache.reach[slot].get());
                            let fresh =
                                provisioned(pb, &neighbours, (i, j, t, (g_in, g_out)), from, &most);
                            if v < 0.0 {
                                let k = fresh.map(|p| p.units).unwrap_or(0);
                                assert!(k > pb.catalog.types[t].cap.unwrap_or(u64::MAX), "{k}");
                            } else if !v.is_nan() && f64::from(reach) >= from {
                                let fresh = fresh.expect("reachable");
                                assert_eq!(u64::from(cache.units[slot].get()), fresh.units);
                                assert_eq!(v, fresh.per_unit);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The pieces and tails one [`Memo`] bounds as `from` grows (its stages kept from
    /// call to call, its multipliers searched from the last ones) are below every plan of
    /// their throughputs, on random chains whose caps bind; the stages it keeps are what
    /// provisioning gives at the latest `from`; and the limits' multipliers lift the bound
    /// above the one without them on many chains.
    #[test]
    fn kept_stages_and_searched_multipliers_bound_every_plan() {
        let effort = Effort::new(&SearchConfig {
            work_limit: None,
            time_limit: None,
            ..SearchConfig::default()
        });
        let (mut checked, mut lifted) = (0, 0);
        for seed in 0..120 {
            let pb = capped_chain(seed, 2 + seed as usize % 3, 2 + seed as usize % 2);
            let plans = every_plan(&pb);
            let least = |a: f64, b: f64| {
                plans
                    .iter()
                    .filter(|p| p.0 >= a && p.0 <= b)
                    .map(|p| p.1)
                    .fold(f64::INFINITY, f64::min)
            };
            let mut memo = Memo::new(true);
            let mut a = pb.constraint.throughput;
            for step in 0..12 {
                let b = a * (1.0 + [0.01, 0.05, 0.3][step % 3]);
                for upto in [b, f64::INFINITY] {
                    let bound = memo.per_sample(&pb, a, upto, &effort);
                    let opt = least(a, upto);
                    assert!(
                        bound <= opt * (1.0 + 1e-9),
                        "seed {seed}, [{a}, {upto}]: bound {bound} > best plan {opt}"
                    );
                    // Without the limits (a memo of its own, no multipliers).
                    let blind = without_limits(&pb, a, upto);
                    if bound.is_finite() && bound > blind * (1.0 + 1e-6) {
                        lifted += 1;
                    }
                    checked += usize::from(opt.is_finite());
                }
                if let Some(cache) = &memo.factors {
                    check_against_provisioning(cache, &pb, a);
                }
                a = b;
            }
        }
        assert!(checked >= 1000, "{checked} ranges with plans");
        assert!(lifted >= 100, "the limits lifted the bound {lifted} times");
    }
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
