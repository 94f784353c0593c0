//! A budget of distinct cost-model evaluations, shared by the search heuristics so that
//! comparisons are at equal budget: a plan seen before is answered from a cache and not
//! counted, and the best plan seen is kept. Keyed by what identifies a plan in the
//! scheduler's space (a type per layer for most, the stages themselves for RL).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

use crate::cost::Problem;
use crate::error::PlanError;
use crate::plan::SchedulingPlan;

use super::scheduler::{Optimality, Outcome, Progress, SearchConfig, Units};

/// Cached costs by plan key, the budget, and the best key seen.
pub(crate) struct Budget<K> {
    budget: usize,
    cache: HashMap<K, f64>,
    best: Option<(K, f64)>,
    progress: Option<Progress>,
    units: Units,
}

impl<K: Hash + Eq + Clone> Budget<K> {
    /// A fresh budget of the config's size.
    pub fn new(config: &SearchConfig) -> Self {
        Budget {
            budget: config.budget,
            cache: HashMap::new(),
            best: None,
            progress: config.progress.clone(),
            units: config.units,
        }
    }

    /// The cost of `key` (`eval` if not seen before), or `None` when it was not seen
    /// before and the budget is spent.
    pub fn cost<Q>(&mut self, key: &Q, eval: impl FnOnce() -> f64) -> Option<f64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(&c) = self.cache.get(key) {
            return Some(c);
        }
        if self.cache.len() >= self.budget {
            return None;
        }
        let c = eval();
        self.cache.insert(key.to_owned(), c);
        if c < self.best.as_ref().map_or(f64::INFINITY, |b| b.1) {
            self.best = Some((key.to_owned(), c));
        }
        if let Some(p) = &self.progress {
            p(self.cache.len(), self.budget);
        }
        Some(c)
    }

    /// How the plans are provisioned ([`SearchConfig::units`]).
    pub fn units(&self) -> Units {
        self.units
    }

    /// Distinct evaluations so far.
    pub fn used(&self) -> usize {
        self.cache.len()
    }

    /// Whether the budget is spent.
    pub fn exhausted(&self) -> bool {
        self.cache.len() >= self.budget
    }

    /// The best key seen and its cost.
    pub fn best(&self) -> Option<(&K, f64)> {
        self.best.as_ref().map(|(k, c)| (k, *c))
    }

    /// The best plan seen (`plan` of its key) as `scheduler`'s [`Outcome`].
    pub fn finish(
        self,
        problem: &Problem,
        scheduler: &str,
        plan: impl FnOnce(K) -> SchedulingPlan,
    ) -> Result<Outcome, PlanError> {
        let evaluations = self.cache.len();
        let Some((key, _)) = self.best else {
            return Err(PlanError::NothingFound {
                scheduler: scheduler.to_string(),
                evaluations,
            });
        };
        let plan = plan(key);
        let evaluation = super::units::evaluate(problem, &plan, self.units)
            .map(|(e, _)| e)
            .map_err(|e| {
                PlanError::Backend(format!("{scheduler}: best plan became infeasible: {e}"))
            })?;
        Ok(Outcome {
            scheduler: scheduler.to_string(),
            plan,
            evaluation,
            evaluations,
            optimality: Optimality::Heuristic,
            lower_bound: None,
        })
    }
}
