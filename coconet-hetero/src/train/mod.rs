//! HeterPS's distributed-training module: the models it trains and their training loops.
//!
//! - [`ctr_dnn`]: CTR-DNN (PaddleRec's `rank/dnn`) in candle, its embedding table in a
//!   [`ParamServer`](crate::data::ParamServer).
//! - [`profile`]: each layer's measured time per kind of worker, as a model TOML for
//!   the planner.
//! - [`worker`]: one worker's training loop, its checkpoints (safetensors) and the
//!   held-out evaluation; [`adam`]: the dense optimizer, its state checkpointable.

pub mod adam;
pub mod checkpoint;
pub mod ctr_dnn;
pub mod profile;
pub mod worker;

pub use adam::{Adam, AdamConfig};
pub use checkpoint::{CheckpointReader, CheckpointWriter, Manifest};
pub use ctr_dnn::{Backward, CtrDnn, CtrDnnConfig, StageBackward, StageForward, StageInput};
pub use worker::{
    Evaluation, Progress, TrainConfig, TrainReport, Trainer, evaluate, run_epochs, train,
};

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
