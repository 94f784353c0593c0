//! The search heuristics' access to the cost model.

use super::budget::Budget;
use super::scheduler::{Outcome, SearchConfig};
use crate::cost::Problem;
use crate::error::PlanError;
use crate::plan::SchedulingPlan;

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

    /// Cost of the assignment in dollars, provisioned as [`SearchConfig::units`] says
    /// (`f64::INFINITY` if infeasible), or `None`
    /// when it was not seen before and the budget is spent.
    pub fn cost(&mut self, types: &[usize]) -> Option<f64> {
        let (problem, units) = (self.problem, self.budget.units());
        self.budget.cost(types, || {
            super::units::cost(problem, &SchedulingPlan::from_assignment(types), units)
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
            SchedulingPlan::from_assignment(&types)
        })
    }
}
