//! How a run goes: its options, and failures injected to test the fault handling.

use super::kernel::CHUNK;
use std::time::Duration;

/// Options of a run: `RunOptions::default()` and the `with_*` methods (new options can
/// come without breaking code that names the ones it sets).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunOptions {
    /// How long a rank waits for its peers before giving up.
    pub timeout: Duration,
    /// Record each rank's steps for [`Job::trace_json`](crate::Job::trace_json).
    pub trace: bool,
    /// Makes a rank fail on purpose (to test failure handling).
    pub fault: Option<Fault>,
    /// Elements per chunk of a pointwise kernel and of a fused all-reduce (default
    /// [`CHUNK`]): a whole kernel's registers should stay in cache. Results do
    /// not depend on it; coconet-tune picks it by measurement.
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
            chunk: CHUNK,
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
