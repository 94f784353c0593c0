//! The CPU backend: P rank threads in one process sharing memory.
//!
//! A [`Job`] binds a [`Plan`] to inputs (validating every binding before any rank
//! starts), allocates each rank's buffers, starts P rank threads once, and runs the plan
//! on them every time it is run. A rank
//! that returns an error or panics marks the shared world failed; every
//! other rank returns from its next wait with an error naming it, and every wait has a
//! deadline, so a run never hangs.

pub(crate) mod affinity;
pub(crate) mod array;
pub(crate) mod collective;
pub(crate) mod ctx;
pub(crate) mod exec;
pub(crate) mod folds;
pub(crate) mod fused;
pub(crate) mod inputs;
#[cfg(feature = "jit")]
pub(crate) mod jit;
mod job;
pub(crate) mod kernel;
pub(crate) mod ops;
mod pool;
pub(crate) mod process;
pub(crate) mod process_sync;
pub(crate) mod sync;
pub(crate) mod trace;

pub use crate::host::memory::Buffer;
pub use job::Job;
pub use kernel::CHUNK;
pub use process::{DataPath, ProcessJob, ROUND_CHUNKS, TCP_ROUND_CHUNKS, Tcp, Threads, Transport};

use crate::RuntimeError;
use crate::backend::Backend;
use crate::plan::{Plan, Storage};
use coconet_core::{Bindings, Layout, ValueId, block_range};
use std::time::Duration;

/// Options of a run: `RunOptions::default()` and the `with_*` methods (new options can
/// come without breaking code that names the ones it sets).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunOptions {
    /// How long a rank waits for its peers before giving up.
    pub timeout: Duration,
    /// Record each rank's steps for [`Job::trace_json`].
    pub trace: bool,
    /// Makes a rank fail on purpose (to test failure handling).
    pub fault: Option<Fault>,
    /// Elements per chunk of a pointwise kernel and of a fused all-reduce (default
    /// [`CHUNK`]): a whole kernel's registers should stay in cache. Results do
    /// not depend on it; [`crate::tune`] picks it by measurement.
    pub chunk: usize,
    /// Binds the job's worker threads (ranks 1..P) to the process's CPUs, one each in
    /// turn, as MPI binds ranks to cores, and the caller's thread (rank 0) to its CPU
    /// for the length of each run, giving it back its CPUs after (default: on).
    /// Without it Linux may leave two computing ranks on one core for milliseconds: a
    /// pipeline step measured 4.8 or 9 ms at random; with only the workers bound, a
    /// small step still took 0.13 or 0.24 ms depending on where the caller ran. Turn it
    /// off where the process manages its own thread placement.
    pub bind_threads: bool,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions {
            timeout: Duration::from_secs(60),
            trace: false,
            fault: None,
            chunk: kernel::CHUNK,
            bind_threads: true,
        }
    }
}

impl RunOptions {
    /// With [`RunOptions::timeout`] set.
    pub fn with_timeout(mut self, timeout: Duration) -> RunOptions {
        self.timeout = timeout;
        self
    }

    /// With [`RunOptions::trace`] set.
    pub fn with_trace(mut self, trace: bool) -> RunOptions {
        self.trace = trace;
        self
    }

    /// With [`RunOptions::fault`] set.
    pub fn with_fault(mut self, fault: Option<Fault>) -> RunOptions {
        self.fault = fault;
        self
    }

    /// With [`RunOptions::chunk`] set.
    pub fn with_chunk(mut self, chunk: usize) -> RunOptions {
        self.chunk = chunk;
        self
    }

    /// With [`RunOptions::bind_threads`] set.
    pub fn with_bind_threads(mut self, bind: bool) -> RunOptions {
        self.bind_threads = bind;
        self
    }
}

/// A failure injected into a run, to test that every rank reports it without hanging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `rank` panics before step `step`.
    Panic {
        /// The failing rank.
        rank: usize,
        /// Before this step.
        step: usize,
    },
    /// `rank` stops (returns without an error, never reaching its peers) before `step`.
    Vanish {
        /// The vanishing rank.
        rank: usize,
        /// Before this step.
        step: usize,
    },
    /// `rank` sleeps for twice the run's timeout before `step` (a stuck rank: its peers
    /// give up waiting and must name it), then carries on.
    Stall {
        /// The stalling rank.
        rank: usize,
        /// Before this step.
        step: usize,
    },
}

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

/// `v`'s data on rank `r`, from that rank's input buffers and slots (views are sliced
/// out of the viewed value); `None` if the rank does not hold it or it has no memory.
pub(crate) fn value_on(
    plan: &Plan,
    v: ValueId,
    r: usize,
    input: &dyn Fn(ValueId) -> Option<Vec<f64>>,
    slot: &dyn Fn(usize) -> Option<Vec<f64>>,
) -> Option<Vec<f64>> {
    let p = plan.program();
    let q = plan.group_size;
    let holds = match p.node(v).ty.placement {
        coconet_core::Placement::Everywhere => true,
        coconet_core::Placement::Group(g) => r / q == g,
    };
    if !holds || plan.unreadable(v).is_some() {
        return None;
    }
    match plan.storage(v)? {
        Storage::Input(t) => input(t),
        Storage::Slot(s) => slot(s),
        Storage::View { of, dim } => {
            let data = value_on(plan, of, r, input, slot)?;
            let mut shape = plan.shape(of).to_vec();
            if let Layout::Sliced(d) = p.node(of).ty.layout {
                shape[d] = block_range(shape[d], q, r % q).len();
            }
            let b = block_range(plan.shape(of)[dim], q, r % q);
            Some(coconet_core::numerics::tensor::slice_dim(
                &data, &shape, dim, b,
            ))
        }
        Storage::Uniform | Storage::Register => None,
    }
}
