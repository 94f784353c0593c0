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
mod error;
pub mod profile;
pub mod worker;

pub use adam::{Adam, AdamConfig};
pub use checkpoint::{CheckpointReader, CheckpointWriter, Manifest};
pub use ctr_dnn::{Backward, CtrDnn, CtrDnnConfig, StageBackward, StageForward, StageInput};
pub use error::TrainError;
pub use worker::{
    Evaluation, Progress, TrainConfig, TrainReport, Trainer, evaluate, run_epochs, train,
};
