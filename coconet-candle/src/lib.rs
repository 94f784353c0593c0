//! # coconet-candle: training candle models with coconet's fused optimizer step
//!
//! Data-parallel training (here) and tensor-parallel layers ([`parallel`]); through the
//! `coconet` facade, `coconet::candle` with its feature `candle`.
//!
//! P replicas of a model (one per rank, each with its own `Var`s, all initialised the
//! same) each compute gradients on their shard of the batch; [`DataParallel::step`]
//! takes every replica's `GradStore`, averages the gradients and runs the optimizer in
//! one fused collective — reduce-scatter, the update on each rank's 1/P of the
//! parameters with 1/P of the optimizer state, all-gather — on rank threads, then leaves
//! every replica's `Var`s holding the new, bitwise identical weights. Across processes,
//! each holding one replica, the same step runs over TCP (`DataParallel::tcp`, under
//! `coconet-launch`) or MPI (`DataParallel::mpi`).
//!
//! The optimizer is AdamW ([`AdamWConfig`]), SGD with momentum ([`SgdConfig`]), either
//! with global-norm clipping, or a `#[coconet]` program of the user's
//! ([`OptimizerProgram`]). Replicas are f32, or bf16 with f32 master weights kept in the
//! job.
//!
//! The job is prepared once: the parameters are bound as one tensor made of one piece
//! per `Var` (no flat copy of the model inside the job), and every step only copies the
//! gradients in and the weights out. candle-nn's `Optimizer` trait steps one model from
//! one `GradStore`; a data-parallel step needs every replica's, so this is a trainer of
//! its own rather than an implementation of that trait — shaped like it:
//! [`DataParallel::backward_step`] takes one loss per rank (each backward pass on a
//! thread of its own). [`replicate`] makes the replicas from a candle-nn `VarMap` (the
//! original is replica 0, so it ends up holding the trained weights),
//! [`DataParallel::from_varmaps`] takes them (errors name parameters by their names),
//! and [`shard`] gives each rank its share of a batch or a dataset.

#[cfg(feature = "cuda")]
mod cuda;
mod engine;
mod error;
mod optimizer;
pub mod parallel;
mod replicas;
mod state;
mod trainer;

pub use coconet_programs::{adamw, adamw_clipped, sgd, sgd_clipped};
pub use error::TrainError;
pub use optimizer::{AdamWConfig, Optimizer, OptimizerProgram, SgdConfig};
pub use replicas::{for_each_rank, named_vars, replicate, shard};
pub use state::{StateTensor, TrainerState};
pub use trainer::{DataParallel, StepTimes};
