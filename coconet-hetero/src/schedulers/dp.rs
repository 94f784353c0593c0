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
//! handful of types, and neighbours whose links have one bandwidth are one evaluation
//! (`neighbours`). Consecutive stages may share a type (cutting a run is useful when
//! the run does not fit one unit's memory) unless [`Dp::split_runs`] is false, which
//! restricts the DP to the paper's plan space (maximal runs).
//!
//! **Memory** is exact pruning: a segment whose replica does not fit is skipped, and
//! since memory only grows as a segment extends to the left the scan over `i` stops
//! there. Without tracked caps, a lower bound on a segment's units (`⌈X·C/b_t⌉`, compute
//! only, at the type's batch) skips candidates that cannot improve a cell, and ends the
//! scan over `i` early;
//! both are exact. **Caps** add the units used per capped type to the state (a knapsack
//! dimension), added lazily: the DP first solves without caps, and each time its plan
//! breaks a cap, that type's usage joins the state and it solves again (a relaxation's
//! optimum that respects every cap is optimal). While the product of `(cap_t + 1)` over
//! the tracked types is at most [`Dp::max_cap_states`] (and a pass at most
//! [`Dp::max_table_work`] steps) the usage is a table dimension; beyond that each cell
//! keeps the Pareto front of (cost, usage) labels instead (`dp_labels`: a
//! resource-constrained shortest path, still exact), pruned by an incumbent and by
//! bounds on completing each partial plan (`completion`: a backward DP at the DP's
//! prices and at Lagrangian ones). Before it, weighted sums of the caps
//! (`feasibility`) either prove that no plan keeps them all — the search ends there —
//! or drop the partial plans that cannot keep them, which is what prunes where no
//! incumbent is known. The incumbent is the cheaper of Lagrangian pricing's
//! plan (subgradient steps on per-limit prices, then bisection, its plan repaired window
//! by window from the plans that over-drew: `repair`) and the table DP's with usage
//! counted in coarser units (it finds plans no price setting makes cheapest). Only when
//! the labels exceed [`Dp::max_labels`] or [`SearchConfig::time_limit`] is the incumbent
//! returned, marked [`Optimality::NotGuaranteed`] with its gap to the better of two lower
//! bounds (the Lagrangian dual and the cheapest plan without limits). Every pass reads each
//! stage's units from one store (`stage_units`), provisioned once.
//!
//! **Whole instances** ([`crate::rental`]): a type rented by instances of `n` units
//! costs its stages' units together rounded up to a multiple of `n`, which is not a sum
//! over stages. The DP keeps, for each such type, the free slots left in its last
//! instance (`0..n`) in its state, from the start (the parameter server's shards may
//! leave some): a stage of `k` units fills them and rents `⌈(k − free)⁺ / n⌉` more
//! instances, paid in full, so each cell's value is what its partial plan rents and the
//! optimum is exact. In the table the slots are one more mixed-radix digit per type
//! (the shipped A100 and H100 by eights: 64 states); in the label search a label
//! dominates another only with at least as many free slots of every such type. The
//! lower bounds (the compute-only one, the completions, Lagrangian pricing's dual)
//! price every unit singly, which never exceeds what whole instances cost, so they
//! stay lower bounds; pricing and the coarse table find incumbents per unit, priced by
//! whole instances.
//!
//! **Limits** are the types' caps and the shared hosts' cores alike
//! ([`crate::limit`]): a host's limit draws each unit's threads. Where a host's layers
//! slow down with its load the stages' costs are coupled; the DP then solves once per
//! load (see `Dp::over_loads`).

use std::ops::ControlFlow;

use crate::cost::Problem;
use crate::error::PlanError;
use crate::limit;
use crate::objective::Objective;
use crate::plan::SchedulingPlan;
use crate::provision::min_units;
use crate::rental::{Slots, fill};

use super::completion::Bounds;
use super::dp_labels;
use super::effort::Effort;
use super::feasibility::{self, Feasibility};
use super::repair::{dp_cost, drawn, repair};
use super::scheduler::{Optimality, Outcome, SearchConfig};
use super::stage_units::StageUnits;

/// The exact segment DP.
#[derive(Debug, Clone)]
pub struct Dp {
    /// Allow several consecutive stages on the same type.
    pub split_runs: bool,
    /// Largest state space solved as a table: the caps' usage and the free slots of the
    /// types rented by whole instances (beyond it, the label search).
    pub max_cap_states: usize,
    /// Most labels the exact search under caps may make (and 150 times as many
    /// comparisons between them) before giving up exactness: about 1 s per 10^7 labels
    /// on the shipped GPT here.
    pub max_labels: usize,
    /// Most stage evaluations Lagrangian pricing's passes may make together (its steps
    /// take at most half): about 1 s per 2.5·10^7 here.
    pub max_pricing_work: usize,
    /// Most steps one table pass with usage states may take (stage evaluations times
    /// usage states): about 1 s per 10^8 here.
    pub max_table_work: usize,
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
            max_table_work: 100_000_000,
            max_pricing_work: 100_000_000,
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
#[derive(Clone)]
struct Solved {
    plan: Option<SchedulingPlan>,
    value: f64,
    segments: usize,
}

impl Dp {
    /// One DP pass with the given per-type prices (per unit) and the limits
    /// ([`Problem::limits`]) in `tracked` as table dimensions; with `slots`, the free
    /// slots of the types rented by whole instances too, and the value is what the plan
    /// rents (idle units paid) — without, every unit is priced singly.
    fn solve(
        &self,
        units: &StageUnits,
        prices: &[f64],
        tracked: &[bool],
        slots: Option<&Slots>,
    ) -> Solved {
        self.solve_quantised(
            units,
            prices,
            tracked,
            &vec![1; units.problem().limits().len()],
            slots,
        )
    }

    /// [`Dp::solve`] with what a plan draws on each tracked limit counted in quanta of
    /// `quantum[l]`, a stage drawing d taking `⌈d / quantum⌉` of the `⌊cap / quantum⌋`
    /// quanta there are: with quanta above 1 the table is smaller and every plan it
    /// returns keeps every tracked limit (it over-counts usage), but it may miss the
    /// optimum.
    fn solve_quantised(
        &self,
        units: &StageUnits,
        prices: &[f64],
        tracked: &[bool],
        quantum: &[usize],
        slots: Option<&Slots>,
    ) -> Solved {
        let pb = units.problem();
        let no_slots = Slots::none(pb.num_types());
        let slots = slots.unwrap_or(&no_slots);
        let layout = TableLayout::new(pb, prices, tracked, quantum, slots);
        let size = pb.num_layers() * layout.t_n * (layout.t_n + 1) * layout.states;
        let mut pass = TablePass {
            units,
            prices,
            layout,
            f: vec![f64::INFINITY; size],
            back: vec![
                Back {
                    first: 0,
                    prev: 0,
                    prev_r: 0
                };
                size
            ],
            segments: 0,
        };
        pass.fill();
        pass.solved()
    }
}

/// The states of one table pass ([`Dp::solve_quantised`]), a mixed-radix number: what
/// the plan draws on each tracked limit, in quanta, then the free slots of each type
/// rented by whole instances (one digit of radix its instance size: with them the
/// rounding's cost is known stage by stage).
struct TableLayout<'a> {
    /// The types; `t_n` is also the "next type" of the last stage (none).
    t_n: usize,
    /// States per cell.
    states: usize,
    /// Each limit's digit: its stride and radix (radix 1 where untracked).
    stride: Vec<usize>,
    radix: Vec<usize>,
    /// Each limit's quantum.
    quantum: &'a [usize],
    /// Each limit's cap.
    caps: Vec<u64>,
    /// The types rented by whole instances, and the stride of each one's digit.
    slots: &'a Slots,
    slot_stride: Vec<usize>,
    /// The state before the first stage, and what it costs.
    start: usize,
    start_cost: f64,
    /// The tracked limits each type draws on, and how much per unit.
    draws: Vec<Vec<(usize, usize)>>,
}

impl<'a> TableLayout<'a> {
    fn new(
        pb: &Problem,
        prices: &[f64],
        tracked: &[bool],
        quantum: &'a [usize],
        slots: &'a Slots,
    ) -> Self {
        let t_n = pb.num_types();
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
        let mut slot_stride = Vec::with_capacity(slots.types.len());
        let mut start = 0usize;
        for (g, &(_, n)) in slots.types.iter().enumerate() {
            slot_stride.push(states);
            start += slots.start[g] as usize * states;
            states *= n as usize;
        }
        let start_cost = slots.start_cost(prices);
        let draws: Vec<Vec<(usize, usize)>> = (0..t_n)
            .map(|t| {
                (0..limits.len())
                    .filter(|&l| tracked[l] && limits[l].draws_on(t))
                    .map(|l| (l, limits[l].per_unit[t] as usize))
                    .collect()
            })
            .collect();
        TableLayout {
            t_n,
            states,
            stride,
            radix,
            quantum,
            caps: limits.iter().map(|l| l.cap).collect(),
            slots,
            slot_stride,
            start,
            start_cost,
            draws,
        }
    }

    /// The index of state `r` of cell (last layer `j`, type `t`, next type `u`).
    fn idx(&self, j: usize, t: usize, u: usize, r: usize) -> usize {
        ((j * self.t_n + t) * (self.t_n + 1) + u) * self.states + r
    }

    /// Whether `k` units of type `t` alone break a tracked limit.
    fn breaks_alone(&self, t: usize, k: u64) -> bool {
        self.draws[t]
            .iter()
            .any(|&(l, w)| k.saturating_mul(w as u64) > self.caps[l])
    }

    /// A stage of `k` units of type `t` after state `r_prev`: the state after it and
    /// what it adds to the cost (`add`: its units priced singly; whole instances fill
    /// the free slots, then rent instances for the rest), or `None` where it takes more
    /// of a tracked limit than is left.
    fn step(
        &self,
        r_prev: usize,
        t: usize,
        k: u64,
        add: f64,
        prices: &[f64],
    ) -> Option<(usize, f64)> {
        let mut r = r_prev;
        let add = match self.slots.slot[t] {
            None => add,
            Some(g) => {
                let (stride, n) = (self.slot_stride[g], self.slots.types[g].1);
                let free = (r_prev / stride) % n as usize;
                let (more, left) = fill(free as u64, k, n);
                r = r - free * stride + left as usize * stride;
                prices[t] * more.saturating_mul(n) as f64
            }
        };
        for &(l, w) in &self.draws[t] {
            let digit = (r_prev / self.stride[l]) % self.radix[l];
            let take = (k as usize * w).div_ceil(self.quantum[l]);
            if digit + take >= self.radix[l] {
                return None;
            }
            r += take * self.stride[l];
        }
        Some((r, add))
    }
}

/// One table pass: the cheapest partial plan of each cell and state (`f`), where it
/// came from (`back`), and the segments evaluated.
struct TablePass<'a, 'p> {
    units: &'a StageUnits<'p>,
    prices: &'a [f64],
    layout: TableLayout<'a>,
    f: Vec<f64>,
    back: Vec<Back>,
    segments: usize,
}

impl TablePass<'_, '_> {
    /// Every cell, layer by layer.
    fn fill(&mut self) {
        let units = self.units;
        for j in 0..units.problem().num_layers() {
            for t in 0..self.layout.t_n {
                let after = units.neighbours.following(t, j);
                // The cells of next types in one group are equal: solve the first, copy.
                for (g_out, next_group) in after.iter().enumerate() {
                    let u = next_group[0];
                    self.fill_cell(j, t, u, g_out);
                    let states = self.layout.states;
                    let solved = self.layout.idx(j, t, u, 0);
                    for &v in &next_group[1..] {
                        let copy = self.layout.idx(j, t, v, 0);
                        self.f.copy_within(solved..solved + states, copy);
                        self.back.copy_within(solved..solved + states, copy);
                    }
                }
            }
        }
    }

    /// Cell (`j`, `t`, `u`) over every stage ending at `j` (next types' group `g_out`).
    fn fill_cell(&mut self, j: usize, t: usize, u: usize, g_out: usize) {
        let units = self.units;
        let pb = units.problem();
        let (x, prices, states) = (pb.constraint.throughput, self.prices, self.layout.states);
        for i in (0..=j).rev() {
            if pb.segment_memory(i, j, t) > pb.catalog.types[t].memory_bytes {
                break;
            }
            // Lower bound on this segment's price: T(k) ≥ compute, so
            // k ≥ X·compute/b_t. It only grows as the segment extends left, so
            // once it alone cannot improve the cell, no longer segment can.
            let lb = prices[t]
                * (x * pb.segment_compute(i, j, t) / pb.batch_size(t))
                    .ceil()
                    .max(1.0);
            if states == 1 && lb >= self.f[self.layout.idx(j, t, u, 0)] {
                break;
            }
            let before = units.neighbours.preceding(t, i);
            for (g_in, prev_group) in before.iter().enumerate() {
                if states == 1 && i > 0 {
                    let base = prev_group
                        .iter()
                        .map(|&p| self.f[self.layout.idx(i - 1, p, t, 0)])
                        .fold(f64::INFINITY, f64::min);
                    if base + lb >= self.f[self.layout.idx(j, t, u, 0)] {
                        continue;
                    }
                }
                self.segments += 1;
                let Some(k) = units.get(i, j, t, g_in, g_out) else {
                    continue;
                };
                if self.layout.breaks_alone(t, k) {
                    continue;
                }
                self.extend(i, j, t, u, k, prev_group);
            }
        }
    }

    /// The stage of layers `i..=j` on `k` units of type `t` after every state of the
    /// cells before it (previous types `prev_group`), into cell (`j`, `t`, `u`).
    fn extend(&mut self, i: usize, j: usize, t: usize, u: usize, k: u64, prev_group: &[usize]) {
        let layout = &self.layout;
        let add = self.prices[t] * k as f64;
        for &p in prev_group {
            for r_prev in 0..layout.states {
                let base = if i == 0 {
                    if r_prev != layout.start {
                        continue;
                    }
                    layout.start_cost
                } else {
                    self.f[layout.idx(i - 1, p, t, r_prev)]
                };
                if !base.is_finite() {
                    continue;
                }
                let Some((r, add)) = layout.step(r_prev, t, k, add, self.prices) else {
                    continue;
                };
                let cell = layout.idx(j, t, u, r);
                let v = base + add;
                if v < self.f[cell] {
                    self.f[cell] = v;
                    self.back[cell] = Back {
                        first: i as u32,
                        prev: if i == 0 { 0 } else { p as u8 },
                        prev_r: r_prev as u32,
                    };
                }
            }
        }
    }

    /// The cheapest complete plan, traced back.
    fn solved(self) -> Solved {
        let layout = &self.layout;
        let (l_n, none) = (self.units.problem().num_layers(), layout.t_n);
        let mut best: Option<(usize, usize, f64)> = None;
        for t in 0..layout.t_n {
            for r in 0..layout.states {
                let v = self.f[layout.idx(l_n - 1, t, none, r)];
                if v.is_finite() && best.is_none_or(|b| v < b.2) {
                    best = Some((t, r, v));
                }
            }
        }
        self.units
            .spend((self.segments as u64).saturating_mul(layout.states as u64));
        let value = best.map_or(f64::INFINITY, |b| b.2);
        let plan = best.map(|(t_end, r_end, _)| {
            dp_labels::trace_back(l_n, t_end, none, r_end, |j, t, u, r| {
                let b = self.back[layout.idx(j, t, u, r)];
                (b.first as usize, b.prev as usize, b.prev_r as usize)
            })
        });
        Solved {
            plan,
            value,
            segments: self.segments,
        }
    }
}

/// Most resource types the DP handles (a stage's previous type is kept in a byte).
const MAX_TYPES: usize = 256;

/// Explains why no plan exists, for the error message.
/// Why no plan keeps the limits, from the shares that prove it ([`feasibility`]).
fn impossible(pb: &Problem, shares: &[f64], least: f64) -> String {
    let weighed: Vec<String> = pb
        .limits()
        .iter()
        .zip(shares)
        .filter(|&(_, &y)| y >= 0.005)
        .map(|(l, y)| format!("{:.0} % of {} ({} {})", 100.0 * y, l.name, l.cap, l.unit))
        .collect();
    format!(
        "no plan meets {} samples/s within the caps: every plan draws at least {:.1} % of \
         a weighted sum of them ({})",
        crate::constraint::rate(pb.constraint.throughput),
        100.0 * least,
        weighed.join(" + ")
    )
}

fn diagnose(pb: &Problem) -> String {
    // A layer's memory depends on the type (its batch there, the batches in flight).
    for (l, layer) in pb.model.layers.iter().enumerate() {
        let types = &pb.catalog.types;
        if (0..pb.num_types()).all(|t| pb.segment_memory(l, l, t) > types[t].memory_bytes) {
            let (t, need) = (0..pb.num_types())
                .map(|t| (t, pb.segment_memory(l, l, t)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap_or((0, layer.memory_bytes));
            return format!(
                "layer `{}` needs at least {need:.3e} bytes per replica (on {}), more than any type's memory (largest {:.3e})",
                layer.name,
                types[t].name,
                types.iter().map(|t| t.memory_bytes).fold(0.0, f64::max)
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

impl Dp {
    /// The required-rate DP (`pb`'s objective is [`Objective::RequiredRate`]) within the
    /// run's limits, `effort`, one for the whole run (the parametric search and the
    /// loads solve many DPs within it): a stop request ends it before its next pass,
    /// with the best plan within every limit if it has one; the work and time limits
    /// end it once it has one (the label search, and the next DP of a search that has a
    /// plan, are not started or are stopped), with the bound it proved.
    pub(crate) fn required_rate_by(
        &self,
        pb: &Problem,
        config: &SearchConfig,
        effort: &Effort,
    ) -> Result<Outcome, PlanError> {
        // Every plan needs the same parameter server at this throughput.
        if let Err(e) = pb.parameter_servers() {
            return Err(PlanError::NoFeasiblePlan(e.to_string()));
        }
        debug_assert_eq!(pb.objective, Objective::RequiredRate);
        if pb.is_contended() {
            return self.over_loads(pb, config, effort);
        }
        if pb.num_types() > MAX_TYPES {
            return Err(PlanError::TooLarge {
                scheduler: "dp".into(),
                reason: "more than 256 resource types".into(),
            });
        }
        let prices: Vec<f64> = pb.catalog.types.iter().map(|t| t.price_per_hour).collect();
        // Types rented by whole instances add their free slots to the state (exact: see
        // `rental`), in the table and in the label search alike.
        let shards = pb
            .parameter_servers()
            .ok()
            .flatten()
            .map(|s| (s.ty, s.shards));
        let slots = Slots::new(&pb.catalog, pb.rental, shards);
        let units = StageUnits::new(pb, self.split_runs).with_effort(effort);
        let mut search = RateSearch {
            dp: self,
            units: &units,
            prices: &prices,
            slots: &slots,
            effort,
            segments: 0,
        };
        match search.by_table()? {
            ControlFlow::Break(outcome) => Ok(outcome),
            ControlFlow::Continue(table) => search.beyond_table(table),
        }
    }
}

/// One required-rate DP ([`Dp::required_rate_by`]) on a problem whose hosts do not
/// slow down with load: its stages, prices and whole instances, the run's limits, and
/// the stage evaluations so far.
struct RateSearch<'a, 'p> {
    dp: &'a Dp,
    units: &'a StageUnits<'p>,
    prices: &'a [f64],
    slots: &'a Slots,
    effort: &'a Effort,
    segments: usize,
}

/// Where the table passes ([`RateSearch::by_table`]) left the search: the limits they
/// tracked, their pass without limits (if made), the first limit a plan broke, and the
/// one that made the table too large (`None`: the free slots alone did, or no pass was
/// made).
struct TableEnd {
    tracked: Vec<bool>,
    uncapped: Option<Solved>,
    first_broken: Option<usize>,
    last_broken: Option<usize>,
}

/// The error of a search stopped (`why`) before a plan within every limit was found.
fn stopped(why: super::effort::Ended) -> PlanError {
    PlanError::Undecided {
        scheduler: "dp".into(),
        reason: format!("{why} before a plan within every limit was found"),
    }
}

impl RateSearch<'_, '_> {
    /// `plan` as the search's outcome, with the stage evaluations so far.
    fn outcome(&self, plan: SchedulingPlan, optimality: Optimality) -> Result<Outcome, PlanError> {
        let evaluation = self
            .units
            .problem()
            .evaluate(&plan)
            .map_err(|e| PlanError::Backend(format!("dp: internal error, {e}")))?;
        // A proven plan is its own bound; one not proven gets its bound below.
        let lower_bound = (optimality == Optimality::Proven).then_some(evaluation.cost);
        Ok(Outcome {
            scheduler: "dp".into(),
            plan,
            evaluation,
            evaluations: self.segments,
            optimality,
            lower_bound,
        })
    }

    /// Lazy cap constraints: solve with the caps tracked so far; a plan that breaks an
    /// untracked cap adds that cap to the state and solves again. A relaxation's
    /// optimum that respects every cap is optimal. Breaks with that plan, or continues
    /// where the table would grow too large.
    fn by_table(&mut self) -> Result<ControlFlow<Outcome, TableEnd>, PlanError> {
        let (dp, units, pb) = (self.dp, self.units, self.units.problem());
        let mut tracked = vec![false; pb.limits().len()];
        let mut states = self.slots.states();
        let table_segments = units.stages();
        let mut uncapped: Option<Solved> = None;
        let mut first_broken = None;
        // Whether the table holds the free slots at all.
        let slot_table = states <= dp.max_cap_states
            && states.saturating_mul(table_segments) <= dp.max_table_work;
        let last_broken = loop {
            if !slot_table {
                break None;
            }
            if let Some(why) = self.effort.interrupted() {
                return Err(stopped(why));
            }
            let s = dp.solve(units, self.prices, &tracked, Some(self.slots));
            self.segments += s.segments;
            let Some(plan) = s.plan.clone() else {
                return Err(PlanError::NoFeasiblePlan(diagnose(pb)));
            };
            if !tracked.contains(&true) {
                uncapped = Some(s);
            }
            match pb.evaluate(&plan) {
                Ok(_) => return Ok(ControlFlow::Break(self.outcome(plan, Optimality::Proven)?)),
                Err(crate::error::Infeasible::Cap {
                    limit, name, cap, ..
                }) => {
                    let grown = states.saturating_mul((cap as usize).saturating_add(1));
                    first_broken.get_or_insert(limit);
                    if tracked[limit] {
                        return Err(PlanError::Backend(format!(
                            "dp: internal error, a plan breaks the tracked limit of {name}"
                        )));
                    }
                    if grown > dp.max_cap_states
                        || grown.saturating_mul(table_segments) > dp.max_table_work
                    {
                        break Some(limit);
                    }
                    tracked[limit] = true;
                    states = grown;
                }
                Err(e) => return Err(PlanError::Backend(format!("dp: internal error, {e}"))),
            }
        };
        Ok(ControlFlow::Continue(TableEnd {
            tracked,
            uncapped,
            first_broken,
            last_broken,
        }))
    }

    /// Too many usage states for a table. Incumbents, each a plan within every limit:
    /// Lagrangian pricing (DP passes without usage states; its plans repaired, see
    /// `repair`) and the table DP with usage counted in coarser units (it finds plans
    /// no price setting makes cheapest); then the exact label search, which drops every
    /// partial plan whose cost plus the least its completion can cost (at the DP's
    /// prices and at the best multipliers') reaches the cheapest incumbent.
    fn beyond_table(&mut self, table: TableEnd) -> Result<Outcome, PlanError> {
        let (dp, units, pb, prices) = (self.dp, self.units, self.units.problem(), self.prices);
        // First, whether any plan keeps the limits at all: a proof that none does ends
        // the search; otherwise the shares found prune partial plans that cannot.
        let no_limits = vec![false; pb.limits().len()];
        let (feasible, s) = feasibility::search(
            units,
            |prices| {
                // Stopped: no plan and no proof (a value below 1 proves nothing).
                if units.interrupted() {
                    return (None, 0.0, 0);
                }
                let s = dp.solve(units, prices, &no_limits, None);
                (s.plan, s.value, s.segments)
            },
            |plan| drawn(pb, prices, plan).map(|(used, _)| used),
        );
        self.segments += s;
        let pruning = match feasible {
            Feasibility::Impossible { shares, least } => {
                return Err(PlanError::NoFeasiblePlan(impossible(pb, &shares, least)));
            }
            Feasibility::Unknown(pruning) => pruning,
        };
        let lagrange = dp.lagrangian(units, prices, table.uncapped);
        self.segments += lagrange.segments;
        let bounds = Bounds::new(units, prices, Some(&lagrange.mu)).with_pruning(pruning);
        // The table's limits, the one it could not take and the one the plan without
        // limits broke.
        let mut binding = table.tracked;
        for l in table.first_broken.into_iter().chain(table.last_broken) {
            binding[l] = true;
        }
        // What sent the search here, for messages.
        let why = if table.last_broken.is_some() {
            "binding caps"
        } else {
            "whole instances (too many free-slot states for a table)"
        };
        let (quantised, s) = dp.quantised(units, prices, &binding);
        self.segments += s;
        // The cheaper of the two incumbents (both keep every cap).
        let incumbent = match (lagrange.plan, quantised) {
            (Some(a), Some(b)) => Some(if b.1 < a.1 { b } else { a }),
            (a, b) => a.or(b),
        };
        let root = bounds.whole().max(lagrange.dual);
        if let (None, Some(why)) = (&incumbent, self.effort.interrupted()) {
            return Err(stopped(why));
        }
        // The label search tracks the limits the table did, or the first one broken
        // (more join it as its plans break them).
        self.by_labels(binding, incumbent, &bounds, root, why)
    }

    /// The exact label search from the limits in `tracked` (more join them as its plans
    /// break them), below the incumbent's cost; `root` a lower bound on the optimum in
    /// the DP's units, `why` what sent the search here.
    fn by_labels(
        &mut self,
        mut tracked: Vec<bool>,
        incumbent: Option<(SchedulingPlan, f64)>,
        bounds: &Bounds,
        root: f64,
        why: &str,
    ) -> Result<Outcome, PlanError> {
        let (dp, pb) = (self.dp, self.units.problem());
        let bound = incumbent.as_ref().map_or(f64::INFINITY, |i| i.1);
        loop {
            let solved = dp_labels::solve(
                self.units,
                self.prices,
                &tracked,
                self.slots,
                dp.max_labels,
                self.effort,
                bound,
                bounds,
            );
            match solved {
                Ok((Some(plan), s)) => {
                    self.segments += s;
                    match pb.evaluate(&plan) {
                        Ok(_) => return self.outcome(plan, Optimality::Proven),
                        Err(crate::error::Infeasible::Cap { limit, name, .. }) => {
                            if tracked[limit] {
                                return Err(PlanError::Backend(format!(
                                    "dp: internal error, a plan breaks the tracked limit of {name}"
                                )));
                            }
                            tracked[limit] = true;
                        }
                        Err(e) => {
                            return Err(PlanError::Backend(format!("dp: internal error, {e}")));
                        }
                    }
                }
                // Nothing beats the incumbent: it is optimal (or no plan exists at all).
                Ok((None, s)) => {
                    self.segments += s;
                    return match incumbent {
                        Some((plan, _)) => self.outcome(plan, Optimality::Proven),
                        None => Err(PlanError::NoFeasiblePlan(diagnose(pb))),
                    };
                }
                Err(dp_labels::OverBudget) => return self.over_budget(incumbent, root, why),
            }
        }
    }

    /// The label search stopped over its budget: the incumbent, unproven, with its gap
    /// to `root` (a lower bound in the DP's units); or, without one, undecided.
    fn over_budget(
        &self,
        incumbent: Option<(SchedulingPlan, f64)>,
        root: f64,
        why: &str,
    ) -> Result<Outcome, PlanError> {
        let (dp, effort) = (self.dp, self.effort);
        match incumbent {
            Some((plan, _)) => {
                let mut out = self.outcome(plan, Optimality::NotGuaranteed(String::new()))?;
                // `root` bounds the DP's units (Σ price × units); in dollars, with
                // the parameter server every plan pays alike, over the job's
                // billed time (the same for every plan at the required rate).
                let ev = &out.evaluation;
                let server = ev
                    .parameter_servers
                    .as_ref()
                    .map_or(0.0, |s| s.price_per_hour);
                let bound = ((root.max(0.0) + server) / 3600.0 * ev.billed_time).min(ev.cost);
                out.lower_bound = Some(bound);
                out.optimality = Optimality::NotGuaranteed(format!(
                    "{why}: the label search stopped {} ({}); the best plan of Lagrangian pricing and of a DP over usage in coarser units, within {:.2} % of a lower bound",
                    dp.label_stop(effort),
                    dp.label_budget(effort),
                    100.0 * (ev.cost / bound - 1.0)
                ));
                Ok(out)
            }
            None => Err(PlanError::Undecided {
                scheduler: "dp".into(),
                reason: format!(
                    "{why}: the label search stopped {} ({}), \
                     and neither Lagrangian pricing nor a DP over usage in \
                     coarser units found a plan within them",
                    dp.label_stop(effort),
                    dp.label_budget(effort),
                ),
            }),
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
    fn over_loads(
        &self,
        pb: &Problem,
        config: &SearchConfig,
        effort: &Effort,
    ) -> Result<Outcome, PlanError> {
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
        // The least of the loads' bounds (the optimum is the least of the loads' optima):
        // none where a load has none or is undecided; a load without plans adds nothing.
        let mut bound = Some(f64::INFINITY);
        for mut code in 0..combinations {
            // Stopped with a plan in hand (or by a request): the loads left unsolved
            // leave the answer unproven, with no bound.
            if let Some(why) = effort
                .interrupted()
                .or_else(|| best.as_ref().and(effort.ended()))
            {
                undecided.get_or_insert_with(|| format!("{why} before every host load was solved"));
                bound = None;
                break;
            }
            let loads: Vec<u64> = cores
                .iter()
                .map(|&c| {
                    let u = code % c + 1;
                    code /= c;
                    u
                })
                .collect();
            let inner = match self.required_rate_by(&pb.at_loads(&loads), config, effort) {
                Ok(o) => o,
                Err(PlanError::NoFeasiblePlan(_)) => continue,
                // Undecided at this load: the others may still give a plan (not proven).
                Err(PlanError::Undecided { reason, .. }) => {
                    undecided.get_or_insert_with(|| format!("at host loads {loads:?}: {reason}"));
                    bound = None;
                    continue;
                }
                Err(e) => return Err(e),
            };
            evaluations += inner.evaluations;
            bound = bound.zip(inner.lower_bound).map(|(a, b)| a.min(b));
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
        out.lower_bound = match out.optimality {
            Optimality::Proven => Some(out.evaluation.cost),
            _ => bound.map(|b| b.min(out.evaluation.cost)),
        };
        Ok(out)
    }

    /// Lagrangian pricing: each limit gets a price per unit drawn (a type's price becomes
    /// `price_t + Σ_l μ_l · per_unit_l[t]`), moved by subgradient steps until the DP
    /// without usage states returns a plan within every limit (if they do not get there,
    /// each over-drawn limit's price is raised until they do); then the multipliers are
    /// bisected between the last prices that over-drew and the first that did not, since
    /// the first plan within the limits is usually priced well past the cheapest one,
    /// and the cheapest plan within the limits is repaired with the plans that over-drew
    /// (`repair`). Returns that plan and its cost in the DP's units (Σ price × units; not
    /// necessarily optimal), and the best Lagrangian lower bound on the optimum seen with
    /// its multipliers. `uncapped`: the pass at `prices`, if already made.
    ///
    /// The bound: with multipliers μ ≥ 0 the DP's optimum V(μ) is at most the μ-cost of
    /// any plan within the limits, which is its cost plus Σ μ_l · used_l, and
    /// used_l ≤ cap_l; so V(μ) − Σ μ_l · cap_l is a lower bound.
    fn lagrangian(&self, units: &StageUnits, prices: &[f64], uncapped: Option<Solved>) -> Lagrange {
        let pb = units.problem();
        let limits = pb.limits();
        let n = limits.len();
        let mut pricing = Pricing {
            dp: self,
            units,
            prices,
            tracked: vec![false; n],
            limits,
            uncapped,
            segments: 0,
            top: prices.iter().cloned().fold(0.0, f64::max),
            bound: 0.0,
            best_mu: vec![0.0; n],
            over: Vec::new(),
            best: None,
        };
        let mut mu = vec![0.0f64; n];
        let mut low = mu.clone();
        let found = pricing.subgradient(&mut mu, &mut low) || pricing.raise(&mut mu, &mut low);
        let high = pricing.bisect(mu, &mut low, found);
        // Repair with the over-drawing plans, the latest (nearest the limits) first.
        let best = pricing.best.take().map(|mut b| {
            for o in pricing.over.iter().rev() {
                b = repair(pb, prices, &high, self.split_runs, b, o);
            }
            b
        });
        Lagrange {
            plan: best,
            dual: pricing.bound,
            mu: pricing.best_mu,
            segments: pricing.segments,
        }
    }
}

/// Lagrangian pricing's passes ([`Dp::lagrangian`]) and what they found so far.
struct Pricing<'a, 'p> {
    dp: &'a Dp,
    units: &'a StageUnits<'p>,
    /// The types' prices per unit.
    prices: &'a [f64],
    /// No limit tracked: the passes have no usage states.
    tracked: Vec<bool>,
    limits: Vec<crate::limit::Limit>,
    /// The pass at `prices`, if already made.
    uncapped: Option<Solved>,
    /// Stage evaluations.
    segments: usize,
    /// The dearest type's price.
    top: f64,
    /// The best lower bound on the optimum so far, and the multipliers that proved it.
    bound: f64,
    best_mu: Vec<f64>,
    /// Plans that over-drew a limit, to repair the best plan with.
    over: Vec<SchedulingPlan>,
    /// The cheapest plan within every limit so far, and its cost in the DP's units.
    best: Option<(SchedulingPlan, f64)>,
}

/// What one pass of Lagrangian pricing shows: which limit its plan over-draws (`None`:
/// within every limit), the bound it proves, and what the plan draws beyond each limit
/// (negative: left).
type Priced = (Option<usize>, f64, Vec<f64>);

impl Pricing<'_, '_> {
    /// One DP at multipliers `mu`: the bound it proves, which limit its plan over-draws
    /// (`None`: within every limit, kept if cheapest so far) and what it draws beyond
    /// each limit (negative: left).
    fn at(&mut self, mu: &[f64]) -> Option<Priced> {
        let (units, prices, limits) = (self.units, self.prices, &self.limits);
        let pb = units.problem();
        if units.interrupted() {
            return None;
        }
        let priced = limit::priced(prices, limits, mu);
        let s = match self.uncapped.take() {
            Some(s) if mu.iter().all(|&m| m == 0.0) => s,
            _ => self.dp.solve(units, &priced, &self.tracked, None),
        };
        self.segments += s.segments;
        let surcharge: f64 = limits.iter().zip(mu).map(|(l, m)| m * l.cap as f64).sum();
        let dual = s.value - surcharge;
        if dual > self.bound {
            self.bound = dual;
            self.best_mu = mu.to_vec();
        }
        let plan = s.plan?;
        let beyond: Vec<f64> = drawn(pb, prices, &plan)?
            .0
            .iter()
            .zip(limits.iter())
            .map(|(&d, l)| d as f64 - l.cap as f64)
            .collect();
        match dp_cost(pb, prices, &plan) {
            Ok(cost) => {
                if self.best.as_ref().is_none_or(|b| cost < b.1) {
                    self.best = Some((plan, cost));
                }
                Some((None, dual, beyond))
            }
            Err(crate::error::Infeasible::Cap { limit, .. }) => {
                self.over.push(plan);
                Some((Some(limit), dual, beyond))
            }
            Err(_) => None,
        }
    }

    /// Subgradient steps from `mu` (each moving the bound's value by about 5 %, halved
    /// when the bound stalls) until a plan keeps every limit: over-drawn limits' prices
    /// rise, those with room left fall, so the prices of several binding limits settle
    /// against each other. Half the work is theirs, the rest to reach the limits and
    /// bisect. `low`: each limit's last price that over-drew. Returns whether a plan
    /// kept every limit.
    fn subgradient(&mut self, mu: &mut [f64], low: &mut [f64]) -> bool {
        let (mut theta, mut stalled, mut best_dual) = (1.0f64, 0, f64::NEG_INFINITY);
        for _round in 0..LAGRANGIAN_ROUNDS {
            if self.segments > self.dp.max_pricing_work / 2 {
                break;
            }
            let Some((over_limit, dual, beyond)) = self.at(mu) else {
                break;
            };
            if over_limit.is_none() {
                return true;
            }
            if dual > best_dual * (1.0 + 1e-9) {
                (best_dual, stalled) = (dual, 0);
            } else {
                stalled += 1;
                if stalled >= 4 {
                    (theta, stalled) = (theta * 0.5, 0);
                }
            }
            for (l, &b) in beyond.iter().enumerate() {
                if b > 0.0 {
                    low[l] = mu[l];
                }
            }
            let norm2: f64 = beyond
                .iter()
                .zip(mu.iter())
                .filter(|&(&b, &m)| b > 0.0 || m > 0.0)
                .map(|(b, _)| b * b)
                .sum();
            let aim = dual.abs().max(self.top) * 0.05;
            let step = theta * aim / norm2.max(1.0);
            for (m, b) in mu.iter_mut().zip(&beyond) {
                *m = (*m + step * b).max(0.0);
            }
        }
        false
    }

    /// Where the steps never reach the limits (many stages tied on a capped type:
    /// prices flip them all at once), raises the price of each over-drawn limit until a
    /// plan keeps them all. Returns whether one did.
    fn raise(&mut self, mu: &mut [f64], low: &mut [f64]) -> bool {
        for _round in 0..LAGRANGIAN_ROUNDS {
            if self.segments > self.dp.max_pricing_work {
                break;
            }
            match self.at(mu) {
                Some((Some(limit), ..)) => {
                    low[limit] = mu[limit];
                    // The price of one unit of the limit: its dearest type's, per unit drawn.
                    let l = &self.limits[limit];
                    let unit_price = (0..self.prices.len())
                        .filter(|&t| l.draws_on(t))
                        .map(|t| self.prices[t] / l.per_unit[t] as f64)
                        .fold(0.0, f64::max);
                    mu[limit] = mu[limit] * 1.5 + unit_price * 0.5 + self.top * 0.05;
                }
                Some((None, ..)) => return true,
                None => break,
            }
        }
        false
    }

    /// Bisects each raised price in turn between what over-drew (`low`) and what kept
    /// every limit (`high`), the others at the prices that kept them (only where a plan
    /// `found` kept them). Returns the prices that keep every limit.
    fn bisect(&mut self, mut high: Vec<f64>, low: &mut [f64], found: bool) -> Vec<f64> {
        let raised: Vec<usize> = (0..self.limits.len())
            .filter(|&l| high[l] > low[l])
            .collect();
        let rounds = if found { LAGRANGIAN_BISECTIONS } else { 0 };
        'limits: for &l in &raised {
            for _round in 0..rounds / raised.len() {
                if self.segments > self.dp.max_pricing_work {
                    break 'limits;
                }
                let mut mid = high.clone();
                mid[l] = 0.5 * (low[l] + high[l]);
                match self.at(&mid) {
                    Some((Some(_), ..)) => low[l] = mid[l],
                    Some((None, ..)) => high = mid,
                    None => break 'limits,
                }
            }
        }
        high
    }
}

/// What [`Dp::lagrangian`] found.
struct Lagrange {
    /// The cheapest plan within every limit seen, and its cost in the DP's units.
    plan: Option<(SchedulingPlan, f64)>,
    /// The best lower bound on the optimum.
    dual: f64,
    /// The multipliers (per limit) that proved it.
    mu: Vec<f64>,
    /// Stage evaluations.
    segments: usize,
}

/// Most subgradient steps [`Dp::lagrangian`] takes looking for prices at which a plan
/// keeps every limit.
const LAGRANGIAN_ROUNDS: usize = 64;

/// DP passes that [`Dp::lagrangian`] spends refining its multipliers once a plan keeps
/// every limit.
const LAGRANGIAN_BISECTIONS: usize = 12;

impl Dp {
    /// An incumbent that keeps every cap: the table DP with the usage of each binding
    /// type counted in quanta, coarse enough that the table has at most
    /// [`Dp::max_cap_states`] states, or 2^n for n tracked types when that is more (up to
    /// `QUANTISED_MAX_TYPES` types; a type whose cap a plan breaks joins the tracked
    /// ones, as in the exact search), and fewer where a pass would take more than
    /// [`Dp::max_table_work`] steps (none below 2^n). Returns the plan and its cost in the DP's units, and
    /// the stage evaluations. Used when the exact table is too large: it finds plans that
    /// pricing cannot (a plan no price setting makes cheapest).
    fn quantised(
        &self,
        units: &StageUnits,
        prices: &[f64],
        tracked: &[bool],
    ) -> (Option<(SchedulingPlan, f64)>, usize) {
        let pb = units.problem();
        let table_segments = units.stages();
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
            let root = |n: usize| (n as f64).powf(1.0 / capped.len().max(1) as f64).floor();
            // At least two states per type (2^n), within one pass's work.
            let within_work = root(self.max_table_work / table_segments.max(1));
            if within_work < 2.0 {
                break;
            }
            if units.interrupted() {
                break;
            }
            let per_type = root(self.max_cap_states).max(2.0).min(within_work) as usize - 1;
            let mut quantum = vec![1; limits.len()];
            for &l in &capped {
                quantum[l] = (limits[l].cap as usize).div_ceil(per_type).max(1);
            }
            let s = self.solve_quantised(units, prices, &tracked, &quantum, None);
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

impl Dp {
    /// The label search's budget, for messages: its labels, or the run's limits.
    fn label_budget(&self, effort: &Effort) -> String {
        format!("{} labels or {}", self.max_labels, effort.describe())
    }

    /// Why the label search stopped, for messages.
    fn label_stop(&self, effort: &Effort) -> String {
        match effort.ended() {
            Some(why) => format!("as {why}"),
            None if effort.labels_spent() => "at its share of the work left".into(),
            None => "at its label budget".into(),
        }
    }
}

/// Most tracked capped types the quantised incumbent handles: one quantum each is
/// already 2^12 usage states.
const QUANTISED_MAX_TYPES: usize = 12;
