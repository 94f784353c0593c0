//! The exact scheduler [`Dp`] as a [`Scheduler`]: the required-rate DP, or under the
//! paper's objective ([`Objective::Duration`]) the parametric search over throughputs
//! that runs it as its oracle.

use super::dp::Dp;
use super::scheduler::{Outcome, Scheduler, SearchConfig};
use crate::cost::Problem;
use crate::error::PlanError;
use crate::objective::Objective;
use std::time::Instant;

impl Scheduler for Dp {
    fn name(&self) -> &str {
        "dp"
    }

    fn schedule(&self, pb: &Problem, config: &SearchConfig) -> Result<Outcome, PlanError> {
        let deadline = config
            .time_limit
            .and_then(|t| Instant::now().checked_add(t));
        self.schedule_by(pb, config, deadline)
    }
}

impl Dp {
    /// [`Scheduler::schedule`] with the search stopping at `deadline`.
    pub(crate) fn schedule_by(
        &self,
        pb: &Problem,
        config: &SearchConfig,
        deadline: Option<Instant>,
    ) -> Result<Outcome, PlanError> {
        // Every plan needs the same parameter server at this throughput.
        if let Err(e) = pb.parameter_servers() {
            return Err(PlanError::NoFeasiblePlan(e.to_string()));
        }
        match pb.objective {
            Objective::Duration => super::parametric::solve(self, pb, config, deadline),
            Objective::RequiredRate => self.required_rate_by(pb, config, deadline),
        }
    }
}
