//! The fewest units of every stage the segment DPs look at, computed once: under limits
//! the DPs make dozens of passes over the same stages at different prices (Lagrangian
//! pricing, the completion bounds, the label search), and provisioning a stage costs
//! far more than reading a number.

use std::cell::Cell;

use crate::cost::Problem;
use crate::provision::min_units;

use super::effort::Effort;
use super::neighbours::Neighbours;

/// Most stages kept (4 bytes each); beyond that each stage is provisioned when asked.
const MAX_KEPT: usize = 1 << 25;

/// Not provisioned yet.
const UNKNOWN: u32 = 0;
/// Cannot be provisioned.
const UNREACHABLE: u32 = 1;

/// Where each stage lies in a table of one entry per stage: by type and last layer,
/// then first layer and neighbour groups (what [`StageUnits`] keeps, and the duration
/// bound's factors).
pub(super) struct StageLayout {
    pub(super) l_n: usize,
    /// `first[t · L + j]`: the first layer of the longest stage ending at `j` that fits
    /// one unit of `t` (`j` when none does).
    pub(super) first: Vec<usize>,
    /// `offset[t · L + j]`: where the stages of type `t` ending at `j` begin.
    pub(super) offset: Vec<usize>,
    /// Entries per stage start of each type: previous groups × next groups (at least 1
    /// each).
    pub(super) groups: Vec<(usize, usize)>,
    /// Entries in all; `None` past `usize`.
    pub(super) total: Option<usize>,
}

impl StageLayout {
    pub(super) fn new(pb: &Problem, neighbours: &Neighbours) -> StageLayout {
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        let (mut first, mut offset) = (vec![0; t_n * l_n], vec![0; t_n * l_n]);
        let mut groups = Vec::with_capacity(t_n);
        let mut total = Some(0usize);
        for t in 0..t_n {
            let g = (
                neighbours.before[t].len().max(1),
                neighbours.after[t].len().max(1),
            );
            groups.push(g);
            let memory = pb.catalog.types[t].memory_bytes;
            let mut i = 0;
            for j in 0..l_n {
                while i < j && pb.segment_memory(i, j, t) > memory {
                    i += 1;
                }
                first[t * l_n + j] = i;
                offset[t * l_n + j] = total.unwrap_or(usize::MAX);
                total = total.and_then(|n| n.checked_add((j + 1 - i).checked_mul(g.0 * g.1)?));
            }
        }
        StageLayout {
            l_n,
            first,
            offset,
            groups,
            total,
        }
    }
}

/// Every stage's fewest units, provisioned on first use. A stage is its layers
/// `i..=j`, its type `t`, and the groups of its previous and next types
/// ([`Neighbours`]: types in one group give the same stage).
pub(crate) struct StageUnits<'p> {
    pb: &'p Problem,
    /// The neighbour groups of each type.
    pub neighbours: Neighbours,
    l_n: usize,
    /// `first[t · L + j]`: the first layer of the longest stage ending at `j` that fits
    /// one unit of `t` (`j` when none does).
    first: Vec<usize>,
    /// `offset[t · L + j]`: where the stages of type `t` ending at `j` are kept.
    offset: Vec<usize>,
    /// Entries per stage start of each type: previous groups × next groups.
    per_start: Vec<(usize, usize)>,
    /// [`UNKNOWN`], [`UNREACHABLE`], or units + 2; empty when there would be too many.
    units: Vec<Cell<u32>>,
    /// The run's limits and the work it spent, where the passes count it.
    effort: Option<&'p Effort>,
}

impl<'p> StageUnits<'p> {
    /// An empty store for `pb`'s stages (a type is not its own neighbour unless
    /// `split_runs`).
    pub fn new(pb: &'p Problem, split_runs: bool) -> Self {
        let neighbours = Neighbours::new(pb, split_runs);
        let StageLayout {
            l_n,
            first,
            offset,
            groups: per_start,
            total,
        } = StageLayout::new(pb, &neighbours);
        let units = match total {
            Some(total) if total <= MAX_KEPT => (0..total).map(|_| Cell::new(UNKNOWN)).collect(),
            _ => Vec::new(),
        };
        StageUnits {
            pb,
            neighbours,
            l_n,
            first,
            offset,
            per_start,
            units,
            effort: None,
        }
    }

    /// The store with the passes over it counting their work into `effort`.
    pub fn with_effort(mut self, effort: &'p Effort) -> Self {
        self.effort = Some(effort);
        self
    }

    /// Counts `work` units done by a pass over the stages.
    pub fn spend(&self, work: u64) {
        if let Some(e) = self.effort {
            e.spend(work);
        }
    }

    /// Whether a stop was requested: the passes that find a first plan check it before
    /// each pass (the limits of work and time stop the search only once it has a plan).
    pub fn interrupted(&self) -> bool {
        self.effort.is_some_and(|e| e.interrupted().is_some())
    }

    /// The problem the stages are of.
    pub fn problem(&self) -> &'p Problem {
        self.pb
    }

    /// Stage evaluations a pass that reads every stage fitting memory makes: each once
    /// per previous type it follows and next group (an upper bound: the first and last
    /// layers have no neighbour there).
    pub fn stages(&self) -> usize {
        let mut total = 0usize;
        for (t, &(_, after)) in self.per_start.iter().enumerate() {
            let before: usize = self.neighbours.before[t].iter().map(Vec::len).sum();
            for j in 0..self.l_n {
                let starts = j + 1 - self.first[t * self.l_n + j];
                total = total.saturating_add(starts * before.max(1) * after);
            }
        }
        total
    }

    /// The fewest units of the stage `i..=j` on `t` after a type of group `before`
    /// (ignored at `i = 0`) and before one of group `after` (ignored after the last
    /// layer); `None` if no count reaches the throughput.
    pub fn get(&self, i: usize, j: usize, t: usize, before: usize, after: usize) -> Option<u64> {
        let prev = (i > 0).then(|| self.neighbours.before[t][before][0]);
        let next = (j + 1 < self.l_n).then(|| self.neighbours.after[t][after][0]);
        let provision = || {
            min_units(
                &self.pb.stage_shape(i, j, t, prev, next),
                self.pb.constraint.throughput,
            )
        };
        let at = t * self.l_n + j;
        if self.units.is_empty() || i < self.first[at] {
            self.spend(super::effort::PROVISION_WORK);
            return provision();
        }
        let (_, groups_after) = self.per_start[t];
        let before = if i == 0 { 0 } else { before };
        let after = if j + 1 == self.l_n { 0 } else { after };
        let per_start = self.per_start[t].0 * groups_after;
        let cell =
            &self.units[self.offset[at] + (j - i) * per_start + before * groups_after + after];
        match cell.get() {
            UNKNOWN => {
                self.spend(super::effort::PROVISION_WORK);
                let k = provision();
                match k {
                    None => cell.set(UNREACHABLE),
                    Some(k) if k <= u64::from(u32::MAX - 2) => cell.set(k as u32 + 2),
                    Some(_) => {}
                }
                k
            }
            UNREACHABLE => None,
            kept => Some(u64::from(kept - 2)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every neighbour in a group gives the stage the same units, and the store answers
    /// what provisioning answers, the first time and from the store, with and without
    /// runs split (the shipped catalogue's links differ between types).
    #[test]
    fn kept_units_equal_provisioning_for_every_neighbour() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/data");
        let pb = crate::load(
            format!("{dir}/gpt-96.toml"),
            format!("{dir}/catalog.toml"),
            None,
        )
        .expect("shipped model");
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        let x = pb.constraint.throughput;
        for split_runs in [true, false] {
            let units = StageUnits::new(&pb, split_runs);
            assert!(!units.units.is_empty());
            let mut checked = 0;
            for pass in 0..2 {
                for t in 0..t_n {
                    let before = &units.neighbours.before[t];
                    let after = &units.neighbours.after[t];
                    if !split_runs {
                        assert!(before.iter().chain(after).flatten().all(|&n| n != t));
                    }
                    for j in (0..l_n).step_by(7) {
                        for i in (units.first[t * l_n + j]..=j).step_by(3) {
                            let prevs: Vec<(usize, Option<usize>)> = if i == 0 {
                                vec![(0, None)]
                            } else {
                                before
                                    .iter()
                                    .enumerate()
                                    .flat_map(|(g, m)| m.iter().map(move |&p| (g, Some(p))))
                                    .collect()
                            };
                            let nexts: Vec<(usize, Option<usize>)> = if j + 1 == l_n {
                                vec![(0, None)]
                            } else {
                                after
                                    .iter()
                                    .enumerate()
                                    .flat_map(|(g, m)| m.iter().map(move |&u| (g, Some(u))))
                                    .collect()
                            };
                            for &(g_in, prev) in &prevs {
                                for &(g_out, next) in &nexts {
                                    let want = min_units(&pb.stage_shape(i, j, t, prev, next), x);
                                    assert_eq!(
                                        units.get(i, j, t, g_in, g_out),
                                        want,
                                        "pass {pass}"
                                    );
                                    checked += 1;
                                }
                            }
                        }
                    }
                }
            }
            assert!(checked > 1000, "{checked}");
        }
    }
}
