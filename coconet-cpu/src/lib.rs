//! # coconet-cpu: the CPU backend, P rank threads in one process sharing memory
//!
//! A [`Job`] binds a [`Plan`](coconet_plan::Plan) to inputs (validating every binding before any rank
//! starts), allocates each rank's buffers, starts P rank threads once, and runs the plan
//! on them every time it is run. A rank
//! that returns an error or panics marks the shared world failed; every
//! other rank returns from its next wait with an error naming it, and every wait has a
//! deadline, so a run never hangs.

pub(crate) mod affinity;
pub(crate) mod array;
mod backend;
pub(crate) mod collective;
pub(crate) mod exec;
#[cfg(all(test, feature = "jit"))]
mod floats;
pub(crate) mod folds;
pub(crate) mod fused;
pub(crate) mod inputs;
#[cfg(feature = "jit")]
pub(crate) mod jit;
mod job;
pub(crate) mod kernel;
pub(crate) mod local_ops;
pub(crate) mod options;
mod pool;
pub(crate) mod process;
pub(crate) mod rank_context;
pub(crate) mod shared_memory_sync;
pub(crate) mod sync;
pub(crate) mod trace;
pub(crate) mod values;

pub use backend::Cpu;
pub use coconet_plan::host::memory::Buffer;
pub use job::Job;
pub use kernel::CHUNK;
pub use options::{Fault, RunOptions};
#[cfg(feature = "mpi")]
pub use process::mpi::Mpi;
pub use process::{DataPath, ProcessJob, ROUND_CHUNKS, TCP_ROUND_CHUNKS, Tcp, Threads, Transport};

/// What the autotuner and the cost model (`coconet-runtime`'s `tune` and `model`) read of
/// this backend: the collectives they time over a transport, and what the kernels compile.
/// Not a stable API.
#[doc(hidden)]
pub mod for_tuning {
    pub use crate::kernel::{compiles, reduces_in_code};
    pub use crate::process::transport::{all_gather_f64, all_gather_u64};
}
