//! Data-parallel training of candle models with coconet's fused optimizer step (cargo
//! feature `candle`).
//!
//! P replicas of a model (one per rank, each with its own `Var`s, all initialised the
//! same) each compute gradients on their shard of the batch; [`DataParallelAdamW::step`]
//! takes every replica's `GradStore`, averages the gradients and runs AdamW in one fused
//! collective — reduce-scatter, the update on each rank's 1/P of the parameters with
//! 1/P of the optimizer state, all-gather — on rank threads, then leaves every replica's
//! `Var`s holding the new, bitwise identical weights.
//!
//! The job is prepared once: the parameters are bound as one tensor made of one piece
//! per `Var` (no flat copy of the model inside the job), and every step only copies the
//! gradients in and the weights out. candle-nn's `Optimizer` trait steps one model from
//! one `GradStore`; a data-parallel step needs every replica's, so this is a trainer of
//! its own rather than an implementation of that trait.

mod adamw;

use crate::core::schedule::{Schedule, candidates};
use crate::prelude::*;
use crate::runtime::cpu::{Job, RunOptions};
use crate::runtime::{Plan, RuntimeError};
use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use std::time::{Duration, Instant};

pub use adamw::adamw as adamw_program;

/// Why a data-parallel step could not be prepared or taken. A failed step leaves every
/// replica's weights as they were.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The replicas or gradients do not fit together (named in the message).
    #[error("{0}")]
    Mismatch(String),
    /// candle failed (reading a gradient, writing a weight).
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// coconet failed (planning, binding, a rank).
    #[error("coconet: {0}")]
    Runtime(#[from] RuntimeError),
}

/// AdamW's hyper-parameters (candle-nn's `ParamsAdamW` defaults).
#[derive(Debug, Clone, Copy)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
}

impl Default for AdamWConfig {
    fn default() -> AdamWConfig {
        AdamWConfig {
            lr: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// Where a step's time went (summed over the steps taken).
#[derive(Debug, Clone, Copy, Default)]
pub struct StepTimes {
    /// Copying every replica's gradients into the job.
    pub copy_in: Duration,
    /// The fused collective step.
    pub step: Duration,
    /// Copying the new weights into every replica's `Var`s.
    pub copy_out: Duration,
}

/// AdamW over P replicas of a model, data parallel on P rank threads with coconet's
/// fused sharded step (see the module docs).
pub struct DataParallelAdamW {
    job: Job,
    replicas: Vec<Vec<Var>>,
    config: AdamWConfig,
    step: i32,
    times: StepTimes,
}

impl DataParallelAdamW {
    /// Prepares the step for `replicas[r]`, rank r's parameters (the same `Var`s in the
    /// same order on every rank, f32, with identical values).
    pub fn new(replicas: Vec<Vec<Var>>, config: AdamWConfig) -> Result<Self, TrainError> {
        let ranks = replicas.len();
        let first = replicas
            .first()
            .ok_or_else(|| TrainError::Mismatch("no replicas".into()))?;
        if first.is_empty() {
            return Err(TrainError::Mismatch("the model has no parameters".into()));
        }
        let mut weights = Vec::with_capacity(first.len());
        for (i, var) in first.iter().enumerate() {
            if var.dtype() != candle_core::DType::F32 {
                return Err(TrainError::Mismatch(format!(
                    "parameter {i} is {:?}; the trainer keeps f32 weights",
                    var.dtype()
                )));
            }
            weights.push(var.as_tensor().flatten_all()?.to_vec1::<f32>()?);
        }
        for (r, replica) in replicas.iter().enumerate().skip(1) {
            if replica.len() != first.len() {
                return Err(TrainError::Mismatch(format!(
                    "replica {r} has {} parameters, replica 0 has {}",
                    replica.len(),
                    first.len()
                )));
            }
            for (i, (var, w0)) in replica.iter().zip(&weights).enumerate() {
                if var.shape() != first[i].shape() || var.dtype() != first[i].dtype() {
                    return Err(TrainError::Mismatch(format!(
                        "parameter {i} of replica {r} is {:?} {:?}, replica 0's is {:?} {:?}",
                        var.dtype(),
                        var.shape(),
                        first[i].dtype(),
                        first[i].shape()
                    )));
                }
                let w: Vec<f32> = var.as_tensor().flatten_all()?.to_vec1()?;
                if w.iter()
                    .map(|x| x.to_bits())
                    .ne(w0.iter().map(|x| x.to_bits()))
                {
                    return Err(TrainError::Mismatch(format!(
                        "parameter {i} of replica {r} differs from replica 0's: replicas must \
                         start from the same weights"
                    )));
                }
            }
        }
        let n: usize = weights.iter().map(Vec::len).sum();
        let zeros = vec![0.0f32; n];
        let grads: Vec<Vec<Vec<f32>>> = (0..ranks)
            .map(|_| weights.iter().map(|w| vec![0.0; w.len()]).collect())
            .collect();
        let p = adamw::adamw();
        let bindings = Bindings::new()
            .dim("N", n)
            .tensor("g", Binding::per_rank_pieces(&grads))
            .tensor("w", Binding::pieces(&weights))
            .tensor("m", Binding::global(&zeros))
            .tensor("v", Binding::global(&zeros))
            .scalar("lr", config.lr)
            .scalar("beta1", config.beta1)
            .scalar("beta2", config.beta2)
            .scalar("eps", config.eps)
            .scalar("weight_decay", config.weight_decay)
            .scalar("step", 1i32);
        let schedule = fused_schedule(p.program(), &[p.m.id(), p.v.id()]);
        let plan = Plan::lower(&schedule, ranks, bindings.dims())?;
        let job = Job::new(&plan, &bindings, RunOptions::default())?;
        Ok(DataParallelAdamW {
            job,
            replicas,
            config,
            step: 0,
            times: StepTimes::default(),
        })
    }

    /// The learning rate.
    pub fn learning_rate(&self) -> f32 {
        self.config.lr
    }

    /// Sets the learning rate of the next steps (a schedule).
    pub fn set_learning_rate(&mut self, lr: f32) {
        self.config.lr = lr;
    }

    /// Steps taken.
    pub fn steps(&self) -> i32 {
        self.step
    }

    /// Where the steps' time went so far.
    pub fn times(&self) -> StepTimes {
        self.times
    }

    /// Bytes of optimizer state (m and v) each rank holds: 1/P of the model's, twice.
    pub fn state_bytes_per_rank(&self) -> usize {
        let plan = self.job.plan();
        let m: usize = plan
            .local_shape(plan.tensor_input("m").expect("m"), 0)
            .iter()
            .product();
        2 * m * 4
    }

    /// One data-parallel AdamW step from every rank's gradients (`grads[r]` for replica
    /// r). Every gradient is checked before anything is written; a failed step leaves
    /// every replica's weights as they were.
    pub fn step(&mut self, grads: &[GradStore]) -> Result<(), TrainError> {
        if grads.len() != self.replicas.len() {
            return Err(TrainError::Mismatch(format!(
                "{} gradient stores for {} replicas",
                grads.len(),
                self.replicas.len()
            )));
        }
        let t = Instant::now();
        let mut flat = Vec::with_capacity(self.replicas.len());
        for (r, (replica, store)) in self.replicas.iter().zip(grads).enumerate() {
            let mut mine = Vec::with_capacity(replica.len());
            for (i, var) in replica.iter().enumerate() {
                let g = store.get(var.as_tensor()).ok_or_else(|| {
                    TrainError::Mismatch(format!("no gradient for parameter {i} of replica {r}"))
                })?;
                if g.shape() != var.shape() {
                    return Err(TrainError::Mismatch(format!(
                        "the gradient of parameter {i} of replica {r} is {:?}, the parameter \
                         {:?} (did its shape change?)",
                        g.shape(),
                        var.shape()
                    )));
                }
                mine.push(g.to_dtype(candle_core::DType::F32)?.flatten_all()?);
            }
            flat.push(mine);
        }
        for (r, mine) in flat.iter().enumerate() {
            for (i, g) in mine.iter().enumerate() {
                let g = g.to_vec1::<f32>()?;
                self.job.piece_mut::<f32>("g", r, i)?.copy_from_slice(&g);
            }
        }
        self.times.copy_in += t.elapsed();
        let t = Instant::now();
        self.job.set_scalar("step", self.step + 1)?;
        self.job.set_scalar("lr", self.config.lr)?;
        self.job.run()?;
        self.step += 1;
        self.times.step += t.elapsed();
        let t = Instant::now();
        for (r, replica) in self.replicas.iter().enumerate() {
            for (i, var) in replica.iter().enumerate() {
                let w = self.job.piece::<f32>("w", r, i)?;
                var.set(&Tensor::from_slice(w, var.shape(), var.device())?)?;
            }
        }
        self.times.copy_out += t.elapsed();
        Ok(())
    }
}

/// The program's fused sharded schedule: reduce-scatter → update of each rank's block
/// (with its block of the optimizer state) → all-gather, in one pass.
fn fused_schedule(program: &Program, state: &[crate::core::ValueId]) -> Schedule {
    candidates(program, state)
        .into_iter()
        .find(|s| s.name() == "fuse(RS-C-AG)")
        .expect("AdamW has a fused sharded schedule")
}
