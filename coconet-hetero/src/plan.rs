//! Scheduling plans: which type runs each layer, and where the pipeline stages are cut.

/// A pipeline stage: consecutive layers `first..=last` on one resource type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stage {
    /// First layer (inclusive).
    pub first: usize,
    /// Last layer (inclusive).
    pub last: usize,
    /// Resource type index in the catalogue.
    pub ty: usize,
}

/// A scheduling plan as contiguous stages covering every layer once.
///
/// The paper's plans are a type per layer with maximal same-type runs merged
/// ([`SchedulingPlan::from_assignment`]); the exact DP may also cut a run into several stages
/// on the same type (useful when a whole run does not fit one unit's memory).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SchedulingPlan {
    /// Stages in pipeline order.
    pub stages: Vec<Stage>,
}

impl SchedulingPlan {
    /// Merges maximal runs of equal types into stages. `types` must be non-empty.
    pub fn from_assignment(types: &[usize]) -> SchedulingPlan {
        let mut stages: Vec<Stage> = Vec::new();
        for (l, &ty) in types.iter().enumerate() {
            match stages.last_mut() {
                Some(s) if s.ty == ty => s.last = l,
                _ => stages.push(Stage {
                    first: l,
                    last: l,
                    ty,
                }),
            }
        }
        SchedulingPlan { stages }
    }

    /// The type of every layer.
    pub fn assignment(&self) -> Vec<usize> {
        let mut v = Vec::new();
        for s in &self.stages {
            v.extend(std::iter::repeat_n(s.ty, s.last + 1 - s.first));
        }
        v
    }

    /// Number of layers covered.
    pub fn num_layers(&self) -> usize {
        self.stages.last().map_or(0, |s| s.last + 1)
    }

    /// True when stages are contiguous, non-empty, start at layer 0 and cover `layers`
    /// layers, and every type index is below `types`.
    pub fn is_well_formed(&self, layers: usize, types: usize) -> bool {
        let mut next = 0;
        for s in &self.stages {
            if s.first != next || s.last < s.first || s.ty >= types {
                return false;
            }
            next = s.last + 1;
        }
        next == layers && layers > 0
    }
}
