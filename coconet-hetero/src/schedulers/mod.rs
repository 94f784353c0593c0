//! Schedulers: search for the cheapest feasible plan.
//!
//! Every scheduler implements [`Scheduler`]; it is deterministic for a given
//! [`SearchConfig::seed`] and, apart from the exact solvers, stops after
//! [`SearchConfig::budget`] *distinct* cost-model evaluations (a plan seen before is
//! answered from a cache and not counted), so comparisons are at equal budget.

mod bayes;
mod budget;
mod completion;
mod cpu_first;
mod dp;
mod dp_labels;
mod duration_bound;
mod effort;
mod evaluator;
mod exact;
mod exhaustive;
mod feasibility;
mod genetic;
mod greedy;
mod neighbours;
mod parametric;
mod random;
mod repair;
#[cfg(feature = "rl")]
mod rl;
mod scheduler;
mod stage_units;
mod units;

pub use bayes::Bayesian;
pub use cpu_first::CpuFirst;
pub use dp::Dp;
pub use effort::Ended;
pub use evaluator::Evaluator;
pub use exhaustive::Exhaustive;
pub use genetic::Genetic;
pub use greedy::Greedy;
pub use random::RandomSearch;
#[cfg(feature = "rl")]
pub use rl::{PolicyWeights, Reinforce};
pub use scheduler::{
    Cuts, DEFAULT_TIME_LIMIT_S, DEFAULT_WORK_LIMIT, Found, Optimality, Outcome, Progress,
    Scheduler, SearchConfig, StopFlag, Units,
};

/// Every scheduler with its default settings, exact ones first (the paper's RL scheduler
/// with the feature `rl`).
pub fn all() -> Vec<Box<dyn Scheduler>> {
    let mut all: Vec<Box<dyn Scheduler>> =
        vec![Box::new(Dp::default()), Box::new(Exhaustive::default())];
    #[cfg(feature = "rl")]
    all.push(Box::new(Reinforce::default()));
    all.extend([
        Box::new(Greedy) as Box<dyn Scheduler>,
        Box::new(Genetic::default()),
        Box::new(Bayesian::default()),
        Box::new(RandomSearch),
        Box::new(CpuFirst),
    ]);
    all
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
    by_name(name).ok_or_else(|| {
        if name == "rl" {
            "the RL scheduler is built with coconet-hetero's feature `rl` (its policy is a \
             candle network)"
                .to_string()
        } else {
            format!("unknown scheduler `{name}` (known: {})", names().join(", "))
        }
    })
}
