//! The search heuristics' access to the cost model.

use super::budget::Budget;
use super::dp::Dp;
use super::effort::Effort;
use super::scheduler::{Cuts, Optimality, Outcome, SearchConfig, Units};
use crate::cost::Problem;
use crate::error::PlanError;
use crate::plan::SchedulingPlan;

/// Budgeted, cached access to the cost model for the search heuristics, which work on
/// one type per layer: maximal runs merged into stages (the paper's plan space) or, with
/// [`Cuts::Best`], each assignment at its cheapest cuts (the DP's).
pub struct Evaluator<'p> {
    problem: &'p Problem,
    budget: Budget<Vec<usize>>,
    /// With [`Cuts::Best`]: the settings of the DP each assignment is cut by.
    cuts: Option<SearchConfig>,
    /// The plan of the cheapest assignment seen, where it is not its runs merged.
    best_plan: Option<(f64, SchedulingPlan)>,
}

impl<'p> Evaluator<'p> {
    /// A fresh evaluator with the config's budget.
    pub fn new(problem: &'p Problem, config: &SearchConfig) -> Self {
        let cuts = (config.cuts == Cuts::Best).then(|| SearchConfig {
            // The DP's space of units too: the DP always chooses the cheapest counts.
            units: Units::Best,
            // One DP per assignment: no progress of its own, no plans reported as found.
            progress: None,
            found: None,
            ..config.clone()
        });
        let budget_config = cuts.as_ref().unwrap_or(config);
        Evaluator {
            problem,
            budget: Budget::new(budget_config),
            cuts,
            best_plan: None,
        }
    }

    /// Cost of the assignment in dollars, provisioned as [`SearchConfig::units`] says
    /// and cut as [`SearchConfig::cuts`] says (`f64::INFINITY` if infeasible), or `None`
    /// when it was not seen before and the budget is spent.
    pub fn cost(&mut self, types: &[usize]) -> Option<f64> {
        let (problem, units) = (self.problem, self.budget.units());
        let Some(dp_config) = &self.cuts else {
            return self.budget.cost(types, || {
                super::units::cost(problem, &SchedulingPlan::from_assignment(types), units)
            });
        };
        let mut plan = None;
        let cost = self.budget.cost(types, || {
            let (cost, p) = best_cuts(problem, types, dp_config);
            plan = Some(p);
            cost
        })?;
        if let Some(p) = plan
            && cost < self.best_plan.as_ref().map_or(f64::INFINITY, |b| b.0)
        {
            self.best_plan = Some((cost, p));
        }
        Some(cost)
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

    /// Turns the best plan seen into an [`Outcome`], priced again by the cost model of
    /// the whole problem.
    pub fn finish(self, scheduler: &str) -> Result<Outcome, PlanError> {
        let best_plan = self.best_plan.map(|(_, p)| p);
        self.budget.finish(self.problem, scheduler, |types| {
            best_plan.unwrap_or_else(|| SchedulingPlan::from_assignment(&types))
        })
    }
}

/// The cheapest plan that cuts `types`' runs into stages, and its cost (infinite where
/// none is feasible): the exact DP on the problem restricted to the assignment. Where the
/// DP stops short of a proof (its limits, a stop request), the cheaper of its plan and
/// the runs merged, so that cutting never costs more than not cutting.
fn best_cuts(pb: &Problem, types: &[usize], config: &SearchConfig) -> (f64, SchedulingPlan) {
    let restricted = pb.restricted_to(types);
    let effort = Effort::new(config);
    let merged = || {
        let plan = SchedulingPlan::from_assignment(types);
        (super::units::cost(pb, &plan, Units::Best), plan)
    };
    match Dp::default().schedule_by(&restricted, config, &effort) {
        Ok(out) if out.optimality == Optimality::Proven => (out.evaluation.cost, out.plan),
        Ok(out) => {
            let other = merged();
            if out.evaluation.cost <= other.0 {
                (out.evaluation.cost, out.plan)
            } else {
                other
            }
        }
        Err(PlanError::NoFeasiblePlan(_)) => {
            (f64::INFINITY, SchedulingPlan::from_assignment(types))
        }
        Err(_) => merged(),
    }
}
