//! Why a data-parallel step could not be prepared or taken.

use coconet_runtime::RuntimeError;

/// Why a data-parallel step could not be prepared or taken. A failed step leaves every
/// replica's weights as they were.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The replicas, gradients or optimizer program do not fit together (named in the
    /// message).
    #[error("{0}")]
    Mismatch(String),
    /// candle failed (reading a gradient, writing a weight).
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// coconet failed (planning, binding, a rank).
    #[error("coconet: {0}")]
    Runtime(#[from] RuntimeError),
}
