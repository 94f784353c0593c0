//! # coconet-runtime: plans and backends under one name
//!
//! A [`Schedule`] is lowered to a per-rank [`Plan`] (steps and buffers), which a
//! [`Backend`] executes. The [`cpu`] backend runs P rank threads in this process with
//! shared-memory collectives, fused collectives and overlap.
//!
//! The runtime is five crates along its data flow, each re-exported here at the path it
//! always had: `coconet-plan` (plans, the backend contract, host memory) → the backends
//! `coconet-cpu` ([`cpu`]; also one rank per process over TCP, shared memory or MPI)
//! and `coconet-cuda` ([`cuda`]), both on `coconet-launch`
//! ([`launch`]: the launcher and the rendezvous store) → `coconet-tune` ([`tune`], and
//! the cost model, [`model`]). A backend of its own depends on `coconet-plan` alone.
//!
//! ```
//! use coconet_core::*;
//! use coconet_runtime::{JobData, cpu, run};
//! let mut b = ProgramBuilder::new("sum");
//! let x = b.tensor_input("x", DType::F32, Layout::Local, Shape::new(vec![Dim::sym("N")]), 0).unwrap();
//! let y = b.all_reduce(ReduceOp::Sum, x).unwrap();
//! let p = b.finish();
//! let args = Bindings::new()
//!     .dim("N", 3)
//!     .tensor("x", Binding::per_rank(&[vec![1.0f32, 2.0, 3.0], vec![10.0, 20.0, 30.0]]));
//! let job = run(&Schedule::new(&p), 2, &args).unwrap();
//! assert_eq!(job.logical::<f32>(y).unwrap(), vec![11.0, 22.0, 33.0]);
//! ```

pub use coconet_cpu as cpu;
pub use coconet_cuda as cuda;
pub use coconet_launch as launch;
pub use coconet_plan::{Backend, JobData, Plan, PlanStep, RuntimeError, Storage, panic_message};
pub use coconet_plan::{backend, plan};
pub use coconet_tune as tune;
pub use coconet_tune::model;

/// One rank per process over Open MPI (cargo feature `mpi`): the process executor with
/// an MPI communicator as its transport.
#[cfg(feature = "mpi")]
pub mod mpi {
    pub use coconet_cpu::{Mpi, ROUND_CHUNKS};
    /// A plan bound to this process's rank of an MPI job (a
    /// [`ProcessJob`](coconet_cpu::ProcessJob) whose transport is an MPI communicator:
    /// `MpiJob::new(&plan, &bindings, world.into())`).
    pub type MpiJob = coconet_cpu::ProcessJob<Mpi>;
}

use coconet_core::{Bindings, Schedule};

/// Lowers `schedule` for `ranks` ranks and runs it once on the CPU backend.
pub fn run(
    schedule: &Schedule,
    ranks: usize,
    bindings: &Bindings,
) -> Result<cpu::Job, RuntimeError> {
    let plan = Plan::lower(schedule, ranks, bindings.dims())?;
    let mut job = cpu::Job::new(&plan, bindings, cpu::RunOptions::default())?;
    job.run()?;
    Ok(job)
}
