//! What a scheduler is: its search settings, what it returns, and how sure it is.

use crate::cost::{Evaluation, Problem};
use crate::error::PlanError;
use crate::plan::Plan;
use std::sync::Arc;
use std::time::Duration;

/// Called with (evaluations used, budget) as a search progresses.
pub type Progress = Arc<dyn Fn(usize, usize) + Send + Sync>;

/// Search settings shared by all schedulers.
#[derive(Clone)]
pub struct SearchConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Maximum number of distinct cost-model evaluations.
    pub budget: usize,
    /// Optional progress callback.
    pub progress: Option<Progress>,
    /// Wall time after which the exact DP's search under binding caps stops and returns
    /// its best plan with the gap it proved (`None`: no limit). The only setting whose
    /// effect depends on the machine: every "proven" answer is still a proof.
    pub time_limit: Option<Duration>,
}

impl std::fmt::Debug for SearchConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchConfig")
            .field("seed", &self.seed)
            .field("budget", &self.budget)
            .field("time_limit", &self.time_limit)
            .finish()
    }
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            seed: 0,
            budget: 2000,
            progress: None,
            time_limit: Some(Duration::from_secs(8)),
        }
    }
}

/// Whether a result is known to be optimal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Optimality {
    /// Proven optimal over the scheduler's plan space.
    Proven,
    /// An exact method fell back to a heuristic; the string says why.
    NotGuaranteed(String),
    /// A heuristic search: no claim.
    Heuristic,
}

/// A scheduler's answer.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Scheduler name.
    pub scheduler: String,
    /// The best plan found.
    pub plan: Plan,
    /// Its provisioning and cost. Under [`crate::Objective::Duration`] the DP may rent
    /// more units than `X_req` needs (they pay for themselves): the units here are the
    /// ones to rent, and `Problem::evaluate(&plan)`, which provisions for `X_req`, would
    /// price another provisioning of the same plan.
    pub evaluation: Evaluation,
    /// Cost-model evaluations spent (whole plans; for the DP, stage segments).
    pub evaluations: usize,
    /// Optimality claim.
    pub optimality: Optimality,
    /// The least cost, in dollars like `evaluation.cost`, that any plan of the
    /// scheduler's plan space can have, as far as the scheduler proved it: the plan's own
    /// cost when [`Optimality::Proven`]; a bound below it where an exact method stopped
    /// short ([`Optimality::NotGuaranteed`]) and knows one (the gap its text states is
    /// `cost / lower_bound - 1`, or an inner search's); `None` for a heuristic and
    /// wherever no bound is known.
    pub lower_bound: Option<f64>,
}

/// A planning algorithm.
pub trait Scheduler {
    /// Short name for reports.
    fn name(&self) -> &str;
    /// Finds a plan for `problem`.
    fn schedule(&self, problem: &Problem, config: &SearchConfig) -> Result<Outcome, PlanError>;
}
