//! The CPU backend: rank threads in this process.

use super::job::Job;
use super::options::RunOptions;
use coconet_core::Bindings;
use coconet_plan::RuntimeError;
use coconet_plan::backend::Backend;
use coconet_plan::plan::Plan;

/// The CPU backend (rank threads in this process).
#[derive(Debug, Clone, Default)]
pub struct Cpu {
    /// Options for jobs it prepares.
    pub options: RunOptions,
}

impl Backend for Cpu {
    type Job = Job;

    fn prepare(&self, plan: &Plan, bindings: &Bindings) -> Result<Job, RuntimeError> {
        Job::new(plan, bindings, self.options.clone())
    }

    fn run(&self, job: &mut Job) -> Result<(), RuntimeError> {
        job.run()
    }
}
