//! One worker's training loop over its loader, and the evaluation on held-out data.

use super::{CtrDnn, TrainError};
use crate::data::{ClickLogFormat, Loader, LoaderConfig, ParamServer};
use crate::metrics;
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use std::path::Path;
use std::time::Instant;

/// How long and how fast to train the dense layers.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// Passes over the worker's share of the data.
    pub epochs: u64,
    /// Adam's step size for the dense layers (PaddleRec's CTR-DNN: 0.001).
    pub learning_rate: f64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 1,
            learning_rate: 1e-3,
        }
    }
}

/// What a training run did.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainReport {
    /// Steps taken (batches).
    pub steps: u64,
    /// Records trained on.
    pub samples: u64,
    /// Wall-clock seconds, loading included.
    pub seconds: f64,
    /// The loss of every step.
    pub losses: Vec<f32>,
}

impl TrainReport {
    /// Records per second.
    pub fn samples_per_second(&self) -> f64 {
        self.samples as f64 / self.seconds.max(1e-9)
    }
}

/// Trains `model` and the table in `ps` on `loader`'s batches for `config.epochs`
/// epochs: every step pushes the embedding gradients to `ps` and applies Adam to the
/// dense layers.
pub fn train(
    model: &CtrDnn,
    ps: &ParamServer,
    loader: &Loader,
    config: &TrainConfig,
) -> Result<TrainReport, TrainError> {
    let mut adam = AdamW::new(
        model.vars(),
        ParamsAdamW {
            lr: config.learning_rate,
            weight_decay: 0.0,
            ..ParamsAdamW::default()
        },
    )?;
    let start = Instant::now();
    let mut report = TrainReport {
        steps: 0,
        samples: 0,
        seconds: 0.0,
        losses: Vec::new(),
    };
    for epoch in 0..config.epochs {
        for batch in loader.epoch(epoch) {
            let batch = batch?;
            let (outcome, grads) = model.step(ps, &batch)?;
            if !outcome.loss.is_finite() {
                return Err(TrainError::Diverged {
                    step: report.steps,
                    loss: outcome.loss,
                });
            }
            adam.step(&grads)?;
            report.steps += 1;
            report.samples += batch.len() as u64;
            report.losses.push(outcome.loss);
        }
    }
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

/// Quality of a model's click probabilities on a held-out file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Area under the ROC curve.
    pub auc: f64,
    /// Mean cross-entropy.
    pub log_loss: f64,
    /// Records evaluated.
    pub records: usize,
}

/// Evaluates `model` with the table in `ps` on the click log `file` (the table does not
/// grow: unseen rows read as their initial values).
pub fn evaluate(
    model: &CtrDnn,
    ps: &ParamServer,
    file: &Path,
    format: ClickLogFormat,
) -> Result<Evaluation, TrainError> {
    let loader = Loader::new(
        vec![file.to_path_buf()],
        LoaderConfig {
            batch: 4096,
            shuffle: None,
            format,
            ..LoaderConfig::default()
        },
    )?;
    let (mut p, mut labels) = (Vec::new(), Vec::new());
    for batch in loader.epoch(0) {
        let batch = batch?;
        p.extend(model.predict(ps, &batch)?);
        labels.extend_from_slice(&batch.labels);
    }
    Ok(Evaluation {
        auc: metrics::auc(&p, &labels).unwrap_or(0.5),
        log_loss: metrics::log_loss(&p, &labels),
        records: p.len(),
    })
}
