//! What a plan's cost is: the job's wall time at which rate.
//!
//! The job has `N` samples to process and rents `Σ_s k_s` units at `Σ_s k_s·price(τ_s)`
//! per second. How long it rents them is the choice:
//!
//! - [`Objective::RequiredRate`]: the job is fed at the required rate, so it lasts
//!   `N / X_req` whatever the plan's capacity. The cost is then a sum over stages, which
//!   the segment DP minimises directly; but faster hardware gets no credit for finishing
//!   sooner.
//! - [`Objective::Duration`] (the paper's): the job runs at the pipeline's throughput
//!   `X = min_s X_s(k_s) ≥ X_req`, so it lasts `N / X` and costs `N · price / X`. Renting
//!   more units than the requirement needs can pay for itself.

/// Which wall time a plan's cost is charged for (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Objective {
    /// `N / X_req`: fed at the required rate.
    #[default]
    RequiredRate,
    /// `N / X` at the plan's own throughput (the paper's).
    Duration,
}
