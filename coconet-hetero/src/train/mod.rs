//! HeterPS's distributed-training module: the models it trains and their training loops.
//!
//! - [`ctr_dnn`]: CTR-DNN (PaddleRec's `rank/dnn`) in candle, its embedding table in a
//!   [`ParamServer`](crate::data::ParamServer).
//! - [`worker`]: one worker's training loop and the held-out evaluation.

pub mod ctr_dnn;
pub mod worker;

pub use ctr_dnn::{CtrDnn, CtrDnnConfig};
pub use worker::{Evaluation, TrainConfig, TrainReport, evaluate, train};

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
    /// The loss stopped being a number.
    #[error("the loss is {loss} at step {step}: lower the learning rates")]
    Diverged {
        /// The step (0-based, over all epochs).
        step: u64,
        /// The loss it reached.
        loss: f32,
    },
}
