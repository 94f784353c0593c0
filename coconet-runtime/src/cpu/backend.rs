//! The CPU backend: rank threads in this process.

use super::job::Job;
use super::options::RunOptions;
use crate::RuntimeError;
use crate::backend::Backend;
use crate::plan::Plan;
use coconet_core::Bindings;

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
