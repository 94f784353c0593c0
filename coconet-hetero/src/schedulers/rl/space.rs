//! The RL scheduler's action space: the DP's plan space, built one layer at a time.
//!
//! At layer `l` an episode either *continues* the open stage (the layer joins it) or
//! *opens* a new stage on type `t` (a cut before `l`; `t` may be the open stage's own
//! type, so a same-type run can be cut into several stages, as the DP's `split_runs`
//! allows). That is `T + 1` actions, and every plan the DP can return is one action
//! sequence. An action is masked when it would break memory, the one constraint that is
//! local to a stage: one replica of a stage must fit one unit (replicas are data
//! parallel, a stage is never sharded), so *continue* is allowed only while the open
//! stage with `l` still fits its type, and *open on `t`* only when `l` alone fits `t`.
//! Limits (caps, hosts' cores) depend on the whole plan's provisioning and are left to
//! the reward.

use crate::cost::Problem;
use crate::plan::{SchedulingPlan, Stage};

/// The actions at every layer, and which of them a partial plan allows.
pub(super) struct Space<'p> {
    problem: &'p Problem,
    /// Bytes one unit of each type holds.
    memory: Vec<f64>,
    /// Units per rented instance of each type under the problem's rental (1: rented
    /// singly).
    per_instance: Vec<u64>,
}

/// A partial plan: the stages of the layers decided so far, the last one open, and the
/// compute-only units of its closed stages per type (see [`Space::units`]).
#[derive(Debug, Clone, Default)]
pub(super) struct Walk {
    stages: Vec<Stage>,
    units: Vec<u64>,
    /// Units the open stage needs as it stands (see [`Space::grown`]).
    open_units: u64,
}

/// Units counted for a stage whose compute load overflows (a feature, not a price).
const UNREACHABLE: u64 = 1 << 20;

impl<'p> Space<'p> {
    /// The action space of `problem`.
    pub(super) fn new(problem: &'p Problem) -> Self {
        Space {
            problem,
            memory: problem
                .catalog
                .types
                .iter()
                .map(|t| t.memory_bytes)
                .collect(),
            per_instance: (0..problem.num_types())
                .map(|t| problem.rental.instance_size(&problem.catalog, t))
                .collect(),
        }
    }

    /// Number of actions: one per type (open a stage on it), then *continue*.
    pub(super) fn num_actions(&self) -> usize {
        self.memory.len() + 1
    }

    /// The *continue* action's index.
    pub(super) fn cont(&self) -> usize {
        self.memory.len()
    }

    /// Whether some type holds each layer alone: without that no plan fits memory.
    pub(super) fn every_layer_fits(&self) -> bool {
        (0..self.problem.num_layers()).all(|l| {
            (0..self.memory.len()).any(|t| self.problem.segment_memory(l, l, t) <= self.memory[t])
        })
    }

    /// Whether `action` is allowed at layer `l` after `walk` (layers `0..l` decided).
    pub(super) fn allowed(&self, walk: &Walk, l: usize, action: usize) -> bool {
        if action == self.cont() {
            walk.stages
                .last()
                .is_some_and(|s| self.problem.segment_memory(s.first, l, s.ty) <= self.memory[s.ty])
        } else {
            self.problem.segment_memory(l, l, action) <= self.memory[action]
        }
    }

    /// Applies `action` at layer `l`.
    pub(super) fn step(&self, walk: &mut Walk, l: usize, action: usize) {
        if walk.units.is_empty() {
            walk.units = vec![0; self.memory.len()];
        }
        let extend = action == self.cont() && !walk.stages.is_empty();
        if extend {
            if let Some(s) = walk.stages.last_mut() {
                s.last = l;
            }
        } else {
            let ty = action.min(self.memory.len() - 1);
            // The open stage closes before `l`; its next neighbour is now known.
            if let Some(s) = walk.stages.last() {
                let k = self.units(walk, s.first, s.last, Some(ty));
                walk.units[s.ty] += k;
            }
            walk.stages.push(Stage {
                first: l,
                last: l,
                ty,
            });
        }
        if let Some(s) = walk.stages.last() {
            walk.open_units = self.units(walk, s.first, l, self.guess_next(s.ty, l));
        }
    }

    /// Units the open stage would need with layer `l` added (`None` where *continue* is
    /// masked), and whether that is more than it needs now: the point where growing the
    /// stage stops being free and a cut becomes the natural choice.
    pub(super) fn grown(&self, walk: &Walk, l: usize) -> Option<(u64, bool)> {
        let s = walk.stages.last()?;
        if !self.allowed(walk, l, self.cont()) {
            return None;
        }
        let k = self.units(walk, s.first, l, self.guess_next(s.ty, l));
        Some((k, k > walk.open_units))
    }

    /// The open stage's units over `first..=last` without synchronisation,
    /// `⌈X_req · T₁ / B⌉` with `T₁` one unit's time per batch (compute and boundary
    /// transfers, the next stage taken to be of the same type, or none after the last
    /// layer): the paper's closed form, a lower bound on what provisioning rents. It
    /// reads the profile and the links, not a plan's cost (no synchronisation, rental,
    /// limits or parameter server), so it spends none of the evaluation budget.
    fn units(&self, walk: &Walk, first: usize, last: usize, next: Option<usize>) -> u64 {
        let n = walk.stages.len();
        let Some(ty) = walk.stages.last().map(|s| s.ty) else {
            return 0;
        };
        let prev = (n > 1).then(|| walk.stages[n - 2].ty);
        let shape = self.problem.stage_shape(first, last, ty, prev, next);
        let load = self.problem.constraint.throughput * shape.single_unit_time() / shape.batch;
        if load.is_finite() && load < UNREACHABLE as f64 {
            (load.ceil() as u64).max(1)
        } else {
            UNREACHABLE
        }
    }

    /// The next stage's type as far as the open stage's units are estimated: one of its
    /// own type (a cut), or none after the last layer.
    fn guess_next(&self, ty: usize, l: usize) -> Option<usize> {
        (l + 1 < self.problem.num_layers()).then_some(ty)
    }

    /// Provisioning features before a layer is decided, given what [`Space::grown`] says
    /// of it: per type, the free fraction of its last instance after the closed stages;
    /// then the open stage's units with the layer added (log scale), the free fraction of
    /// its type's last instance with them, and whether they are more than now. Whole-instance rental makes the cost depend on these (a plan
    /// that fills its instances pays for no idle unit).
    pub(super) fn provisioning(&self, walk: &Walk, grown: Option<(u64, bool)>, out: &mut [f32]) {
        let free = |used: u64, n: u64| ((n - used % n) % n) as f32 / n as f32;
        for (t, &n) in self.per_instance.iter().enumerate() {
            out[t] = free(walk.units.get(t).copied().unwrap_or(0), n);
        }
        let t_n = self.memory.len();
        out[t_n..t_n + 3].fill(0.0);
        if let (Some(s), Some((k, more))) = (walk.stages.last(), grown) {
            out[t_n] = (1.0 + k as f32).ln() / 8.0;
            out[t_n + 1] = free(walk.units[s.ty] + k, self.per_instance[s.ty]);
            out[t_n + 2] = f32::from(u8::from(more));
        }
    }

    /// Whether closing the open stage now would leave its type's last rented instance
    /// exactly full (types rented by whole instances only): a natural point to change
    /// type, since staying opens an instance whose idle units are paid.
    pub(super) fn fills_instance(&self, walk: &Walk) -> bool {
        walk.stages.last().is_some_and(|s| {
            let n = self.per_instance[s.ty];
            n > 1 && (walk.units[s.ty] + walk.open_units).is_multiple_of(n)
        })
    }

    /// The open stage's type, if any.
    pub(super) fn current(&self, walk: &Walk) -> Option<usize> {
        walk.stages.last().map(|s| s.ty)
    }

    /// Fraction of its type's memory the open stage would fill with layer `l` added
    /// (0 with no open stage): how close a forced cut is.
    pub(super) fn fill(&self, walk: &Walk, l: usize) -> f64 {
        walk.stages.last().map_or(0.0, |s| {
            self.problem.segment_memory(s.first, l, s.ty) / self.memory[s.ty]
        })
    }

    /// Layers in the open stage so far.
    pub(super) fn open_len(&self, walk: &Walk, l: usize) -> usize {
        walk.stages.last().map_or(0, |s| l - s.first)
    }

    /// The finished plan (every layer decided).
    pub(super) fn plan(&self, walk: &Walk) -> SchedulingPlan {
        SchedulingPlan {
            stages: walk.stages.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Infeasible;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Random allowed actions on the shipped GPT, whose blocks fill GPUs: no plan the mask
    /// lets through breaks memory.
    #[test]
    fn masked_walks_never_break_memory() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/data");
        let pb = crate::load(
            format!("{dir}/gpt-96.toml"),
            format!("{dir}/catalog.toml"),
            None,
        )
        .unwrap();
        let space = Space::new(&pb);
        assert!(space.every_layer_fits());
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let (mut same_type_cuts, mut forced_cuts) = (0, 0);
        for episode in 0..300 {
            let mut walk = Walk::default();
            for l in 0..pb.num_layers() {
                let ok: Vec<usize> = (0..space.num_actions())
                    .filter(|&a| space.allowed(&walk, l, a))
                    .collect();
                assert!(!ok.is_empty(), "layer {l} has no allowed action");
                if l > 0 && !ok.contains(&space.cont()) {
                    forced_cuts += 1;
                }
                // Mostly continue, so that stages grow to the memory limit.
                let p_continue = if episode % 2 == 0 { 0.9 } else { 0.5 };
                let a = if ok.contains(&space.cont()) && rng.random::<f64>() < p_continue {
                    space.cont()
                } else {
                    let cur = space.current(&walk);
                    match cur {
                        Some(t) if ok.contains(&t) && rng.random::<f64>() < 0.5 => t,
                        _ => ok[rng.random_range(0..ok.len())],
                    }
                };
                space.step(&mut walk, l, a);
            }
            let plan = space.plan(&walk);
            assert!(plan.is_well_formed(pb.num_layers(), pb.num_types()));
            same_type_cuts += plan
                .stages
                .windows(2)
                .filter(|w| w[0].ty == w[1].ty)
                .count();
            if let Err(e) = pb.evaluate(&plan) {
                assert!(
                    !matches!(e, Infeasible::Memory { .. }),
                    "masked plan broke memory: {e}"
                );
            }
        }
        // The mask did bind (stages grew until memory forced a cut), and runs of one type
        // were cut: the plans lie outside the paper's merged-runs space.
        assert!(forced_cuts > 0 && same_type_cuts > 0);
    }
}
