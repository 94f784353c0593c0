//! Errors of planning and running.

use coconet_core::InterpError;
use thiserror::Error;

/// The message a panic carried (a `String` or a `&str` payload), for error reports.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// Why a schedule could not be planned or run.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RuntimeError {
    /// The bindings do not fit the program (checked before any rank starts).
    #[error("binding: {0}")]
    Binding(#[from] InterpError),
    /// The schedule cannot be lowered to a plan.
    #[error("plan: {0}")]
    Plan(String),
    /// A rank failed (an error or a panic); every other rank stopped.
    #[error("rank {rank} failed: {message}")]
    RankFailed {
        /// The rank that failed first.
        rank: usize,
        /// What happened.
        message: String,
    },
    /// A rank waited too long for its peers.
    #[error(
        "rank {rank} waited {seconds:.1} s at `{at}`; ranks {missing:?} never arrived (stuck or gone)"
    )]
    Timeout {
        /// The rank that gave up.
        rank: usize,
        /// Where it was waiting.
        at: String,
        /// How long it waited.
        seconds: f64,
        /// The ranks it was waiting for.
        missing: Vec<usize>,
    },
    /// A device (GPU driver, NVRTC, cuBLAS, NCCL) is missing or failed.
    #[error("device: {0}")]
    Device(String),
    /// The processes of a job could not connect to each other (rendezvous store,
    /// listening socket, a peer's greeting).
    #[error("connecting the processes: {0}")]
    Connect(String),
    /// Reading a result that the run does not have.
    #[error("{0}")]
    Read(String),
    /// Memory lent to a job does not fit the input it is lent for (dtype, length,
    /// device, or overlap with other lent memory).
    #[error("lent memory: {0}")]
    Lend(String),
}
