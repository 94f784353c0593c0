//! Budgeted, cached access to the cost model for plans with explicit stage cuts.
//!
//! [`super::super::Evaluator`] keys its cache by a type per layer (runs merged), which
//! cannot express a run cut into several stages of the same type. The RL scheduler
//! searches the DP's plan space, so it keys by the stages themselves: two action
//! sequences that build the same stages are one evaluation, and the budget counts
//! distinct cost-model evaluations exactly as the other heuristics' does.

use crate::cost::Problem;
use crate::error::PlanError;
use crate::plan::{SchedulingPlan, Stage};

use super::super::budget::Budget;
use super::super::scheduler::{Outcome, SearchConfig};

/// A budget of distinct plan evaluations, a cache, and the best plan seen.
pub(super) struct StagedEvaluator<'p> {
    problem: &'p Problem,
    budget: Budget<Vec<Stage>>,
}

impl<'p> StagedEvaluator<'p> {
    /// A fresh evaluator with the config's budget.
    pub(super) fn new(problem: &'p Problem, config: &SearchConfig) -> Self {
        StagedEvaluator {
            problem,
            budget: Budget::new(config),
        }
    }

    /// Cost of `plan` in dollars (`f64::INFINITY` if infeasible), or `None` when it was
    /// not seen before and the budget is spent.
    pub(super) fn cost(&mut self, plan: &SchedulingPlan) -> Option<f64> {
        let (problem, units) = (self.problem, self.budget.units());
        self.budget.cost(plan.stages.as_slice(), || {
            super::super::units::cost(problem, plan, units)
        })
    }

    /// Whether the budget is spent.
    pub(super) fn exhausted(&self) -> bool {
        self.budget.exhausted()
    }

    /// Turns the best plan seen into an [`Outcome`].
    pub(super) fn finish(self, scheduler: &str) -> Result<Outcome, PlanError> {
        self.budget
            .finish(self.problem, scheduler, |stages| SchedulingPlan { stages })
    }
}
