//! Running HeterPS's models: the distributed-training module, with coconet's fused
//! optimizer step for the dense synchronisation (the planner is [`coconet_hetero`];
//! feature `candle`).
//!
//! [`CtrDataParallel`] trains CTR-DNN on W workers (rank threads) in synchronous data
//! parallelism: each worker takes its batch, pulls its embedding rows from the shared
//! [`ParamServer`](crate::data::ParamServer) and computes its gradients; the
//! dense gradients are averaged and applied by [`DataParallel`](coconet_candle::DataParallel)'s
//! fused reduce-scatter → Adam → all-gather, and the rows' gradients of all workers are
//! merged into one Adagrad step per row on the server. The result is single-worker
//! training on the union of the workers' batches, up to the order of floating-point sums.
//!
//! [`CtrPipeline`] runs a planner's multi-stage plan: consecutive layers as pipeline
//! stages with micro-batches, each stage data parallel over its replicas.
//!
//! [`CtrProcess`] is [`CtrDataParallel`]'s worker as a process of a job started by
//! `coconet-launch`: parameter-server shards served by processes of the job, the dense
//! step over TCP.
//!
//! [`CtrStageProcess`] is [`CtrPipeline`]'s replica as a process: a multi-stage plan
//! run by one process per replica, activations and gradients on TCP between stages,
//! checkpoints that resume bitwise.

mod boundary;
mod checkpoint;
pub mod data;
mod data_parallel;
mod dense_optimizer;
pub mod hetero_sync;
mod pipeline;
mod processes;
mod replica;
mod stage_process;
pub mod train;

pub use data_parallel::CtrDataParallel;
pub use pipeline::{CtrPipeline, StagePlan};
pub use processes::CtrProcess;
pub use stage_process::{CtrStageProcess, stage_processes, stage_role};

/// Why data-parallel training stopped.
#[derive(Debug, thiserror::Error)]
pub enum HeterpsError {
    /// A worker's forward/backward, its data, or the parameter server failed.
    #[error(transparent)]
    Worker(#[from] crate::train::TrainError),
    /// The dense data-parallel step failed (the model is as it was before it).
    #[error(transparent)]
    Dense(#[from] coconet_candle::TrainError),
    /// The processes of the job could not connect or run their step.
    #[error(transparent)]
    Runtime(#[from] coconet_runtime::RuntimeError),
    /// The workers' inputs do not fit the run.
    #[error("{0}")]
    Mismatch(String),
    /// A replica of a pipeline stage failed (an error or a panic); nothing was updated.
    #[error("stage {stage} replica {replica} failed: {message}")]
    Replica {
        /// The stage.
        stage: usize,
        /// The replica within the stage.
        replica: usize,
        /// What happened.
        message: String,
    },
}

impl From<crate::data::DataError> for HeterpsError {
    fn from(e: crate::data::DataError) -> Self {
        HeterpsError::Worker(e.into())
    }
}
