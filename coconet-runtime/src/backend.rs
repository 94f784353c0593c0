//! The interface a backend implements to execute plans.
//!
//! # Design
//! A backend turns a backend-neutral [`Plan`] into a prepared job (buffers allocated and
//! inputs bound on each rank's device, every binding checked before any rank starts),
//! then runs it. The CPU backend's ranks are threads sharing memory; a CUDA backend's are
//! devices (or virtual ranks on one device) with streams and events, whose fused
//! collectives use peer memory the way the CPU backend uses shared memory.

use crate::RuntimeError;
use crate::plan::Plan;
use coconet_core::Bindings;

/// Executes plans.
pub trait Backend {
    /// A plan bound to inputs on this backend.
    type Job;

    /// Binds inputs and allocates buffers; fails (with nothing changed) on bad bindings.
    fn prepare(&self, plan: &Plan, bindings: &Bindings) -> Result<Self::Job, RuntimeError>;

    /// Runs the job once (updating its inputs in place, as a training step does).
    fn run(&self, job: &mut Self::Job) -> Result<(), RuntimeError>;
}
