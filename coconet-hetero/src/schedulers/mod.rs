//! Schedulers: search for the cheapest feasible plan.
//!
//! Every scheduler implements [`Scheduler`]; it is deterministic for a given
//! [`SearchConfig::seed`] and, apart from the exact solvers, stops after
//! [`SearchConfig::budget`] *distinct* cost-model evaluations (a plan seen before is
//! answered from a cache and not counted), so comparisons are at equal budget.

use std::sync::Arc;
use std::time::Duration;

use crate::cost::{Evaluation, Problem};
use crate::error::PlanError;
use crate::plan::Plan;

mod bayes;
mod budget;
mod completion;
mod cpu_first;
mod dp;
mod dp_labels;
mod duration_bound;
mod exhaustive;
mod feasibility;
mod genetic;
mod greedy;
mod neighbours;
mod parametric;
mod random;
mod repair;
mod rl;
mod stage_units;

use budget::Budget;

pub use bayes::Bayesian;
pub use cpu_first::CpuFirst;
pub use dp::Dp;
pub use exhaustive::Exhaustive;
pub use genetic::Genetic;
pub use greedy::Greedy;
pub use random::RandomSearch;
pub use rl::{PolicyWeights, Reinforce};

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

/// Budgeted, cached access to the cost model for the search heuristics, which work on
/// one type per layer (the paper's plan space: maximal runs merged into stages).
pub struct Evaluator<'p> {
    problem: &'p Problem,
    budget: Budget<Vec<usize>>,
}

impl<'p> Evaluator<'p> {
    /// A fresh evaluator with the config's budget.
    pub fn new(problem: &'p Problem, config: &SearchConfig) -> Self {
        Evaluator {
            problem,
            budget: Budget::new(config),
        }
    }

    /// Cost of the assignment in dollars (`f64::INFINITY` if infeasible), or `None`
    /// when it was not seen before and the budget is spent.
    pub fn cost(&mut self, types: &[usize]) -> Option<f64> {
        let problem = self.problem;
        self.budget.cost(types, || {
            problem
                .evaluate_assignment(types)
                .map_or(f64::INFINITY, |e| e.cost)
        })
    }

    /// Distinct evaluations so far.
    pub fn used(&self) -> usize {
        self.budget.used()
    }

    /// Whether the budget is spent.
    pub fn exhausted(&self) -> bool {
        self.budget.exhausted()
    }

    /// Best feasible assignment so far and its cost.
    pub fn best(&self) -> Option<(&[usize], f64)> {
        self.budget.best().map(|(a, c)| (a.as_slice(), c))
    }

    /// The problem being searched.
    pub fn problem(&self) -> &'p Problem {
        self.problem
    }

    /// Turns the best plan seen into an [`Outcome`].
    pub fn finish(self, scheduler: &str) -> Result<Outcome, PlanError> {
        self.budget.finish(self.problem, scheduler, |types| {
            Plan::from_assignment(&types)
        })
    }
}

/// Every scheduler with its default settings, exact ones first.
pub fn all() -> Vec<Box<dyn Scheduler>> {
    vec![
        Box::new(Dp::default()),
        Box::new(Exhaustive::default()),
        Box::new(Reinforce::default()),
        Box::new(Greedy),
        Box::new(Genetic::default()),
        Box::new(Bayesian::default()),
        Box::new(RandomSearch),
        Box::new(CpuFirst),
    ]
}

/// Looks a scheduler up by its [`Scheduler::name`].
pub fn by_name(name: &str) -> Option<Box<dyn Scheduler>> {
    all().into_iter().find(|s| s.name() == name)
}

/// Every scheduler's [`Scheduler::name`], in the order of [`all`].
pub fn names() -> Vec<String> {
    all().iter().map(|s| s.name().to_string()).collect()
}

/// [`by_name`], or an error naming the schedulers there are (for command lines).
pub fn named(name: &str) -> Result<Box<dyn Scheduler>, String> {
    by_name(name)
        .ok_or_else(|| format!("unknown scheduler `{name}` (known: {})", names().join(", ")))
}
