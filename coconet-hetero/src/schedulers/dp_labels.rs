//! The segment DP under availability caps, exact: a resource-constrained shortest path
//! by label setting.
//!
//! Each DP cell (last layer `j`, last stage type `t`, next stage type `u`) keeps the
//! Pareto front of its partial plans as labels `(cost, what it draws on each tracked
//! limit)` (types' caps, hosts' cores; see [`crate::limit`]): a label is dropped when
//! another one of the cell costs no more and draws no more on every limit, since then
//! every completion of the dropped one completes the other at least as cheaply and
//! within the limits; when its cost plus a lower bound on its completion
//! ([`crate::schedulers::completion`]) reaches the incumbent's; and a stage whose units
//! alone break a limit is never made. So the cheapest label of the last cells is the
//! optimum (or nothing beats the incumbent) — unlike a mixed-radix table of usage states
//! (which grows as the product of the caps) or Lagrangian pricing (which can miss plans
//! no price makes cheapest). A label budget and a deadline bound the worst case.
//!
//! Types rented by whole instances ([`crate::rental`]) add their free slots to a label:
//! its cost is what it rents so far (idle units paid), and it is dropped only when
//! another costs no more, draws no more and has at least as many free slots of every
//! such type — a completion then rents no more instances after the other, so the
//! dominance still holds.

use crate::plan::{SchedulingPlan, Stage};
use crate::rental::{Slots, fill};

use super::completion::Bounds;
use super::effort::{COMPARISON_WORK, Effort, LABEL_WORK};
use super::stage_units::StageUnits;

/// One partial plan of a cell.
#[derive(Clone)]
struct Label {
    /// What the partial plan rents so far, priced (idle units of whole instances paid).
    cost: f64,
    /// What the partial plan draws on each tracked limit, in the limits' order; then
    /// the free slots of each type rented by whole instances ([`Slots`]).
    usage: Vec<u64>,
    /// The stage ending here starts at layer `first`; the partial plan before it is label
    /// `prev_label` of cell (`first − 1`, `prev`, this cell's type).
    first: u32,
    prev: u8,
    prev_label: u32,
}

/// `a` draws no more than `b` on every tracked limit (the first `limits` entries) and
/// has at least as many free slots of every type rented by whole instances (the rest).
fn within(a: &[u64], b: &[u64], limits: usize) -> bool {
    let (a_used, a_free) = a.split_at(limits);
    let (b_used, b_free) = b.split_at(limits);
    a_used.iter().zip(b_used).all(|(x, y)| x <= y) && a_free.iter().zip(b_free).all(|(x, y)| x >= y)
}

/// Adds `new` to a cell's front unless a label there dominates it; drops the labels it
/// dominates (`limits`: how many usage entries are tracked limits). Returns whether it
/// was added.
fn insert(cell: &mut Vec<Label>, new: Label, limits: usize) -> bool {
    if cell
        .iter()
        .any(|l| l.cost <= new.cost && within(&l.usage, &new.usage, limits))
    {
        return false;
    }
    cell.retain(|l| !(new.cost <= l.cost && within(&new.usage, &l.usage, limits)));
    cell.push(new);
    true
}

/// Comparisons between labels allowed per label of the budget (fronts of a few hundred
/// labels are common; beyond that, time grows with the square of the fronts).
pub(crate) const COMPARISONS: usize = 150;

/// Why the label search stopped without an answer.
pub(crate) struct OverBudget;

/// The cheapest plan within every limit in `tracked` ([`Problem::limits`]), priced
/// with `prices` (the types in `slots` by whole instances), if it costs less than
/// `bound` (`None`: no plan fits below it), and the
/// number of stage evaluations; or [`OverBudget`] once more than `budget` labels were
/// made (or [`COMPARISONS`] times as many comparisons between labels), or once the run's
/// `effort` has ended (its work limit, its time limit or a stop request; the labels and
/// comparisons count as its work, checked every 4096 labels) or the search spent its
/// share of the work ([`Effort::share_labels`]). A partial plan
/// whose cost plus the least its completion can cost (`bounds`) reaches `bound` is
/// dropped.
#[allow(clippy::too_many_arguments)]
pub(crate) fn solve(
    units: &StageUnits,
    prices: &[f64],
    tracked: &[bool],
    slots: &Slots,
    budget: usize,
    effort: &Effort,
    bound: f64,
    bounds: &Bounds,
) -> Result<(Option<SchedulingPlan>, usize), OverBudget> {
    let pb = units.problem();
    let t_n = pb.num_types();
    // The tracked limits' caps, in a label's usage order, and for each type the
    // positions it draws on with how much per unit.
    let limits = &pb.limits();
    let tracked_ids: Vec<usize> = (0..limits.len()).filter(|&l| tracked[l]).collect();
    let caps: Vec<u64> = tracked_ids.iter().map(|&l| limits[l].cap).collect();
    let most_units: Vec<u64> = (0..t_n)
        .map(|t| {
            limits
                .iter()
                .filter(|l| l.draws_on(t))
                .map(|l| l.cap / l.per_unit[t])
                .min()
                .unwrap_or(u64::MAX)
        })
        .collect();
    let draws: Vec<Vec<(usize, u64)>> = (0..t_n)
        .map(|t| {
            tracked_ids
                .iter()
                .enumerate()
                .filter(|&(_, &l)| limits[l].draws_on(t))
                .map(|(s, &l)| (s, limits[l].per_unit[t]))
                .collect()
        })
        .collect();
    let mut start = vec![0; caps.len()];
    start.extend(&slots.start);
    let root = Label {
        cost: slots.start_cost(prices),
        usage: start,
        first: 0,
        prev: 0,
        prev_label: 0,
    };
    let search = Search {
        units,
        prices,
        slots,
        budget,
        effort,
        bound,
        bounds,
        tracked_ids,
        caps,
        most_units,
        draws,
        root,
    };
    effort.start_labels();
    if effort.labels_ended() {
        return Err(OverBudget);
    }
    let mut tally = Tally::default();
    let cells = search.fill(&mut tally)?;
    effort.spend(tally.work() - tally.counted);
    Ok((search.cheapest(&cells), tally.segments))
}

/// What a label search reads: the problem's stages and prices, the limits it tracks and
/// its budget, bound and completion bounds.
struct Search<'a, 'p> {
    units: &'a StageUnits<'p>,
    prices: &'a [f64],
    slots: &'a Slots,
    budget: usize,
    effort: &'a Effort,
    bound: f64,
    bounds: &'a Bounds,
    /// The tracked limits, in a label's usage order, and their caps.
    tracked_ids: Vec<usize>,
    caps: Vec<u64>,
    /// For each type, the most units a stage may have within every limit, tracked or not.
    most_units: Vec<u64>,
    /// For each type, the positions in a label's usage it draws on, with how much per
    /// unit.
    draws: Vec<Vec<(usize, u64)>>,
    /// The empty plan before the first stage.
    root: Label,
}

/// What a label search has done: labels made, comparisons between labels, stage
/// evaluations, and the work counted into the run's effort so far (labels and
/// comparisons).
#[derive(Default)]
struct Tally {
    made: usize,
    compared: usize,
    segments: usize,
    counted: u64,
}

impl Tally {
    /// The work of the labels made and compared so far.
    fn work(&self) -> u64 {
        self.made as u64 * LABEL_WORK + self.compared as u64 * COMPARISON_WORK
    }
}

/// A stage: layers `i..=j` on `k` units of type `t`.
#[derive(Clone, Copy)]
struct Segment {
    i: usize,
    j: usize,
    t: usize,
    k: u64,
}

impl Search<'_, '_> {
    /// How many entries of a label's usage are tracked limits (the rest: free slots).
    fn n_limits(&self) -> usize {
        self.caps.len()
    }

    /// The index of cell (last layer `j`, type `t`, next type `u`).
    fn cell(&self, j: usize, t: usize, u: usize) -> usize {
        let t_n = self.units.problem().num_types();
        (j * t_n + t) * (t_n + 1) + u
    }

    /// What a label's cost and the least its completion costs add up to: the completion
    /// bounds price every unit singly, so they start from the label's cost less its free
    /// slots (which the completion may fill for nothing); and a completion never costs
    /// less than nothing.
    fn reach(&self, cost: f64, j: usize, t: usize, next: &[usize], usage: &[u64]) -> f64 {
        let n_limits = self.n_limits();
        let free: f64 = self
            .slots
            .types
            .iter()
            .zip(&usage[n_limits..])
            .map(|(&(ty, _), &f)| self.prices[ty] * f as f64)
            .sum();
        let completion = self
            .bounds
            .completing(j, t, next, &usage[..n_limits], &self.tracked_ids);
        (cost - free + completion).max(cost)
    }

    /// A label that cannot end below the bound (a hair under it: sums in another order).
    fn hopeless(&self, reach: f64) -> bool {
        reach >= self.bound * (1.0 - 1e-12)
    }

    /// Every cell's front, layer by layer.
    fn fill(&self, tally: &mut Tally) -> Result<Vec<Vec<Label>>, OverBudget> {
        let pb = self.units.problem();
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        let mut cells: Vec<Vec<Label>> = vec![Vec::new(); l_n * t_n * (t_n + 1)];
        for j in 0..l_n {
            for t in 0..t_n {
                let after = self.units.neighbours.following(t, j);
                // The fronts of next types in one group are equal: build the first, copy.
                for (g_out, next_group) in after.iter().enumerate() {
                    let u = next_group[0];
                    let front = self.front(&cells, tally, j, t, g_out, next_group)?;
                    for &v in &next_group[1..] {
                        let c = self.cell(j, t, v);
                        cells[c] = front.clone();
                    }
                    let c = self.cell(j, t, u);
                    cells[c] = front;
                }
            }
        }
        Ok(cells)
    }

    /// The front of cell (`j`, `t`, `next_group[0]`) (next types' group `g_out`), over
    /// every stage ending at `j`.
    fn front(
        &self,
        cells: &[Vec<Label>],
        tally: &mut Tally,
        j: usize,
        t: usize,
        g_out: usize,
        next_group: &[usize],
    ) -> Result<Vec<Label>, OverBudget> {
        let pb = self.units.problem();
        let mut front = Vec::new();
        for i in (0..=j).rev() {
            if pb.segment_memory(i, j, t) > pb.catalog.types[t].memory_bytes {
                break;
            }
            let before = self.units.neighbours.preceding(t, i);
            for (g_in, prev_group) in before.iter().enumerate() {
                tally.segments += 1;
                let Some(k) = self.units.get(i, j, t, g_in, g_out) else {
                    continue;
                };
                // A stage whose units alone break a limit, tracked or not, is in
                // no plan within the limits.
                if k > self.most_units[t]
                    || self.draws[t]
                        .iter()
                        .any(|&(s, w)| k.saturating_mul(w) > self.caps[s])
                {
                    continue;
                }
                let stage = Segment { i, j, t, k };
                for &p in prev_group {
                    let before: &[Label] = if i == 0 {
                        std::slice::from_ref(&self.root)
                    } else {
                        &cells[self.cell(i - 1, p, t)]
                    };
                    self.extend(&mut front, tally, before, stage, p, next_group)?;
                }
            }
        }
        Ok(front)
    }

    /// Adds `stage` after each label of `before` (the cell of previous type `p`) to
    /// `front`, the front of a cell whose next types are `next_group`.
    fn extend(
        &self,
        front: &mut Vec<Label>,
        tally: &mut Tally,
        before: &[Label],
        stage: Segment,
        p: usize,
        next_group: &[usize],
    ) -> Result<(), OverBudget> {
        let Segment { i, j, t, k } = stage;
        let n_limits = self.n_limits();
        let add = self.prices[t] * k as f64;
        let slot = self.slots.slot[t].map(|g| (n_limits + g, self.slots.types[g].1));
        for (b, base) in before.iter().enumerate() {
            let mut usage = base.usage.clone();
            let mut fits = true;
            for &(s, w) in &self.draws[t] {
                usage[s] = usage[s].saturating_add(k.saturating_mul(w));
                fits &= usage[s] <= self.caps[s];
            }
            if !fits {
                continue;
            }
            // Whole instances: fill the free slots, rent the rest.
            let cost = match slot {
                None => base.cost + add,
                Some((s, n)) => {
                    let (more, left) = fill(usage[s], k, n);
                    usage[s] = left;
                    base.cost + self.prices[t] * more.saturating_mul(n) as f64
                }
            };
            if self.hopeless(self.reach(cost, j, t, next_group, &usage)) {
                continue;
            }
            self.count(tally, front.len())?;
            insert(
                front,
                Label {
                    cost,
                    usage,
                    first: i as u32,
                    prev: p as u8,
                    prev_label: b as u32,
                },
                n_limits,
            );
        }
        Ok(())
    }

    /// Counts a label made and compared with a front of `front` labels: over the budget,
    /// or (checked every 4096 labels, when the work is counted into the run's effort) past
    /// the run's limits, the search stops.
    fn count(&self, tally: &mut Tally, front: usize) -> Result<(), OverBudget> {
        tally.made += 1;
        tally.compared += front;
        if tally.made > self.budget || tally.compared > self.budget.saturating_mul(COMPARISONS) {
            return Err(OverBudget);
        }
        if tally.made.is_multiple_of(4096) {
            let now = tally.work();
            self.effort.spend(now - tally.counted);
            tally.counted = now;
            if self.effort.labels_ended() {
                return Err(OverBudget);
            }
        }
        Ok(())
    }

    /// The cheapest complete plan, traced back through its labels.
    fn cheapest(&self, cells: &[Vec<Label>]) -> Option<SchedulingPlan> {
        let pb = self.units.problem();
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        let none = t_n;
        let best = (0..t_n)
            .flat_map(|t| {
                cells[self.cell(l_n - 1, t, none)]
                    .iter()
                    .enumerate()
                    .map(move |(b, l)| (t, b, l.cost))
            })
            .min_by(|a, b| a.2.total_cmp(&b.2));
        best.map(|(t_end, b_end, _)| {
            trace_back(l_n, t_end, none, b_end, |j, t, u, b| {
                let l = &cells[self.cell(j, t, u)][b];
                (l.first as usize, l.prev as usize, l.prev_label as usize)
            })
        })
    }
}

/// The plan whose last stage ends at layer `l_n − 1` with type `t_end` and entry `e_end`
/// of its DP cell, followed back stage by stage: `link(j, t, u, e)` is where the stage
/// ending at `j` (type `t`, next type `u`, cell entry `e`) starts, the previous stage's
/// type, and its entry in the previous cell. Shared by the table DP and the label search.
pub(crate) fn trace_back(
    l_n: usize,
    t_end: usize,
    none: usize,
    e_end: usize,
    link: impl Fn(usize, usize, usize, usize) -> (usize, usize, usize),
) -> SchedulingPlan {
    let mut stages = Vec::new();
    let (mut j, mut t, mut u, mut e) = (l_n - 1, t_end, none, e_end);
    loop {
        let (first, prev, prev_e) = link(j, t, u, e);
        stages.push(Stage {
            first,
            last: j,
            ty: t,
        });
        if first == 0 {
            break;
        }
        (j, u, t, e) = (first - 1, t, prev, prev_e);
    }
    stages.reverse();
    SchedulingPlan { stages }
}
