//! The exact scheduler [`Dp`] as a [`Scheduler`]: the required-rate DP, or under the
//! paper's objective ([`Objective::Duration`]) the parametric search over throughputs
//! that runs it as its oracle.

use super::dp::Dp;
use super::effort::Effort;
use super::scheduler::{Outcome, Scheduler, SearchConfig};
use crate::constraint::Constraint;
use crate::cost::Problem;
use crate::error::PlanError;
use crate::objective::Objective;

impl Scheduler for Dp {
    fn name(&self) -> &str {
        "dp"
    }

    /// The search; where no plan meets the requirement, the error also says the most
    /// throughput a plan reaches (under the caps, with the server it needs), so that the
    /// user knows what to ask for.
    fn schedule(&self, pb: &Problem, config: &SearchConfig) -> Result<Outcome, PlanError> {
        let effort = Effort::new(config);
        match self.schedule_by(pb, config, &effort) {
            Err(PlanError::NoFeasiblePlan(why)) => Err(PlanError::NoFeasiblePlan(
                match self.highest_reachable(pb, config) {
                    Some((x, None)) => format!(
                        "{why}; the most any plan reaches is {} samples/s",
                        crate::constraint::rate(significant(x))
                    ),
                    Some((x, Some(stopped))) => format!(
                        "{why}; a plan reaches {} samples/s (the search for the most stopped: \
                         {stopped}; raise --work-limit or --time-limit to narrow it down)",
                        crate::constraint::rate(significant(x))
                    ),
                    None => why,
                },
            )),
            other => other,
        }
    }
}

/// `x` rounded down to three significant digits (a throughput to ask for: one a plan
/// reaches).
fn significant(x: f64) -> f64 {
    let scale = 10f64.powi(x.log10().floor() as i32 - 2);
    (x / scale).floor() * scale
}

impl Dp {
    /// The most throughput a plan of `pb` reaches, to a relative 1e-3 (bisection over the
    /// required-rate DP below `pb`'s requirement, within the search's limits of work and
    /// time again), with `None`; where those run out first or a DP is undecided, a
    /// throughput a plan reaches, with why the bisection stopped short. `None` where
    /// not even a millionth of a sample per second is reached, the search could not
    /// decide that, or a stop was requested.
    pub(crate) fn highest_reachable(
        &self,
        pb: &Problem,
        config: &SearchConfig,
    ) -> Option<(f64, Option<String>)> {
        let effort = Effort::new(config);
        let oracle = pb.clone().with_objective(Objective::RequiredRate);
        let reaches = |x: f64| -> Option<bool> {
            let at = Constraint::new(x, pb.constraint.samples).ok()?;
            match self.schedule_by(&oracle.with_constraint(at), config, &effort) {
                Ok(_) => Some(true),
                Err(PlanError::NoFeasiblePlan(_)) => Some(false),
                Err(_) => None,
            }
        };
        let (mut lo, mut hi) = (
            1e-6f64.min(pb.constraint.throughput),
            pb.constraint.throughput,
        );
        if !reaches(lo)? {
            return None;
        }
        while hi / lo > 1.0 + 1e-3 {
            if effort.interrupted().is_some() {
                return None;
            }
            if let Some(why) = effort.ended() {
                return Some((lo, Some(why.to_string())));
            }
            let mid = (lo * hi).sqrt();
            match reaches(mid) {
                Some(true) => lo = mid,
                Some(false) => hi = mid,
                None => {
                    let why = effort.ended().map_or_else(
                        || format!("undecided at {} samples/s", crate::constraint::rate(mid)),
                        |e| e.to_string(),
                    );
                    return Some((lo, Some(why)));
                }
            }
        }
        Some((lo, None))
    }

    /// [`Scheduler::schedule`] within the run's limits, `effort`.
    pub(crate) fn schedule_by(
        &self,
        pb: &Problem,
        config: &SearchConfig,
        effort: &Effort,
    ) -> Result<Outcome, PlanError> {
        // Every plan needs the same parameter server at this throughput.
        if let Err(e) = pb.parameter_servers() {
            return Err(PlanError::NoFeasiblePlan(e.to_string()));
        }
        match pb.objective {
            Objective::Duration => super::parametric::solve(self, pb, config, effort),
            Objective::RequiredRate => self.required_rate_by(pb, config, effort),
        }
    }
}
