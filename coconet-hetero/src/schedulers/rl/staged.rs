//! Budgeted, cached access to the cost model for plans with explicit stage cuts.
//!
//! [`super::super::Evaluator`] keys its cache by a type per layer (runs merged), which
//! cannot express a run cut into several stages of the same type. The RL scheduler
//! searches the DP's plan space, so it keys by the stages themselves: two action
//! sequences that build the same stages are one evaluation, and the budget counts
//! distinct cost-model evaluations exactly as the other heuristics' does.

use std::collections::HashMap;

use crate::cost::Problem;
use crate::error::PlanError;
use crate::plan::{Plan, Stage};

use super::super::{Optimality, Outcome, Progress, SearchConfig};

/// A budget of distinct plan evaluations, a cache, and the best plan seen.
pub(super) struct StagedEvaluator<'p> {
    problem: &'p Problem,
    budget: usize,
    cache: HashMap<Vec<Stage>, f64>,
    best: Option<(Plan, f64)>,
    progress: Option<Progress>,
}

impl<'p> StagedEvaluator<'p> {
    /// A fresh evaluator with the config's budget.
    pub(super) fn new(problem: &'p Problem, config: &SearchConfig) -> Self {
        StagedEvaluator {
            problem,
            budget: config.budget,
            cache: HashMap::new(),
            best: None,
            progress: config.progress.clone(),
        }
    }

    /// Cost of `plan` in dollars (`f64::INFINITY` if infeasible), or `None` when it was
    /// not seen before and the budget is spent.
    pub(super) fn cost(&mut self, plan: &Plan) -> Option<f64> {
        if let Some(&c) = self.cache.get(&plan.stages) {
            return Some(c);
        }
        if self.cache.len() >= self.budget {
            return None;
        }
        let c = self
            .problem
            .evaluate(plan)
            .map_or(f64::INFINITY, |e| e.cost);
        self.cache.insert(plan.stages.clone(), c);
        if c < self.best.as_ref().map_or(f64::INFINITY, |b| b.1) {
            self.best = Some((plan.clone(), c));
        }
        if let Some(p) = &self.progress {
            p(self.cache.len(), self.budget);
        }
        Some(c)
    }

    /// Whether the budget is spent.
    pub(super) fn exhausted(&self) -> bool {
        self.cache.len() >= self.budget
    }

    /// Turns the best plan seen into an [`Outcome`].
    pub(super) fn finish(self, scheduler: &str) -> Result<Outcome, PlanError> {
        let evaluations = self.cache.len();
        let Some((plan, _)) = self.best else {
            return Err(PlanError::NothingFound {
                scheduler: scheduler.to_string(),
                evaluations,
            });
        };
        let evaluation = self.problem.evaluate(&plan).map_err(|e| {
            PlanError::Backend(format!("{scheduler}: best plan became infeasible: {e}"))
        })?;
        Ok(Outcome {
            scheduler: scheduler.to_string(),
            plan,
            evaluation,
            evaluations,
            optimality: Optimality::Heuristic,
        })
    }
}
