//! What a scheduler is: its search settings, what it returns, and how sure it is.

use crate::cost::{Evaluation, Problem};
use crate::error::PlanError;
use crate::plan::SchedulingPlan;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

/// A flag that asks a running search to stop as soon as it can and return its best plan
/// so far: 0 lets it run; any other value stops it (the CLI stores the number of the
/// signal that asked, so that messages name it).
pub type StopFlag = Arc<AtomicUsize>;

/// Called with (evaluations used, budget) as a search progresses.
pub type Progress = Arc<dyn Fn(usize, usize) + Send + Sync>;

/// Called with each better plan the exact DP finds under the paper's objective, as it
/// searches (its optimality and bound there are not final).
pub type Found = Arc<dyn Fn(&Outcome) + Send + Sync>;

/// Search settings shared by all schedulers.
#[derive(Clone)]
pub struct SearchConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Maximum number of distinct cost-model evaluations.
    pub budget: usize,
    /// Optional progress callback.
    pub progress: Option<Progress>,
    /// Work after which the exact DP stops and returns its best plan with the lower
    /// bound it proved and the gap to it (`None`: no limit), in units that do not depend
    /// on the machine (see `effort`: 1 to 2.5·10^8 a second on the benchmarks' 2-core VM):
    /// the same problem and limit always give the same plan, bound and status.
    pub work_limit: Option<u64>,
    /// Wall time after which the exact DP stops likewise (`None`: no limit): a cap on
    /// the run, the only setting whose effect depends on the machine and its load. Every
    /// "proven" answer is still a proof.
    pub time_limit: Option<Duration>,
    /// Set (non-zero) by another thread or a signal handler to stop the exact DP as soon
    /// as it can, with its best plan so far and the bound it proved (`None`: never).
    pub stop: Option<StopFlag>,
    /// Optional callback for each better plan the exact DP finds ([`Found`]).
    pub found: Option<Found>,
    /// How many units the search heuristics and exhaustive search rent for each plan
    /// they look at (the exact DP always chooses the cheapest counts).
    pub units: Units,
    /// How the search heuristics (greedy, genetic, Bayesian optimisation, random,
    /// cpu-first) cut the type assignments they look at into stages.
    pub cuts: Cuts,
}

/// How many units of each stage a plan is priced with by the schedulers that search
/// plans rather than build them (greedy, genetic, Bayesian optimisation, random,
/// cpu-first, RL, exhaustive). The same under [`crate::Objective::RequiredRate`], where
/// the fewest units are the cheapest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Units {
    /// The fewest that meet the required throughput: the paper's plan space.
    #[default]
    Min,
    /// Under [`crate::Objective::Duration`], the counts that make the plan cheapest (more
    /// units can pay for themselves by finishing sooner), as the exact DP chooses them:
    /// the DP's space of units, so that a comparison measures the search alone.
    Best,
}

/// How the search heuristics that work on one type per layer (greedy, genetic, Bayesian
/// optimisation, random, cpu-first) turn an assignment into stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cuts {
    /// Each maximal run of one type is one stage: the paper's plan space.
    #[default]
    Runs,
    /// Each assignment at its cheapest cuts into stages, and under
    /// [`crate::Objective::Duration`] its cheapest units (as [`Units::Best`], whatever
    /// [`SearchConfig::units`] says): the exact DP restricted to the assignment's types.
    /// With it the heuristics search the DP's plan space, which cuts a long run of one
    /// type where several stages cost less than one, so that a comparison measures the
    /// search alone.
    Best,
}

/// The exact DP's default work limit (10 to 20 s on the benchmarks' 2-core VM).
pub const DEFAULT_WORK_LIMIT: u64 = 2_000_000_000;

/// The exact DP's default wall-time cap, seconds.
pub const DEFAULT_TIME_LIMIT_S: u64 = 60;

impl std::fmt::Debug for SearchConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchConfig")
            .field("seed", &self.seed)
            .field("budget", &self.budget)
            .field("work_limit", &self.work_limit)
            .field("time_limit", &self.time_limit)
            .field("stop", &self.stop)
            .field("units", &self.units)
            .field("cuts", &self.cuts)
            .finish()
    }
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            seed: 0,
            budget: 2000,
            progress: None,
            work_limit: Some(DEFAULT_WORK_LIMIT),
            time_limit: Some(Duration::from_secs(DEFAULT_TIME_LIMIT_S)),
            stop: None,
            found: None,
            units: Units::default(),
            cuts: Cuts::default(),
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
    pub plan: SchedulingPlan,
    /// Its provisioning and cost. Under [`crate::Objective::Duration`] the DP (and every
    /// scheduler with [`Units::Best`]) may rent more units than `X_req` needs (they pay
    /// for themselves): the units here are the ones to rent, and
    /// `Problem::evaluate(&plan)`, which provisions for `X_req`, would price another
    /// provisioning of the same plan.
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
