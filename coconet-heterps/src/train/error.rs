//! Why training stopped.

use crate::data::DataError;

/// Why training stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Reading data or updating the parameter server failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// candle failed (a shape or an allocation).
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// A checkpoint could not be written or read, or does not fit the model.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The checkpoint file.
        path: std::path::PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The loss stopped being a number.
    #[error("the loss is {loss} at step {step}: lower the learning rates")]
    Diverged {
        /// The step (0-based, over all epochs).
        step: u64,
        /// The loss it reached.
        loss: f32,
    },
}
