//! One worker's training loop over its loader, checkpoints, and the evaluation on
//! held-out data.

use super::adam::{Adam, AdamConfig};
use super::checkpoint::{CheckpointReader, CheckpointWriter, Manifest};

/// The writer a one-worker trainer's checkpoints name.
const WRITER: &str = "trainer";
use super::ctr_dnn::CtrDnn;
use super::error::TrainError;
use crate::data::{ClickLogFormat, Loader, LoaderConfig, ParamServer};
use coconet_hetero::metrics;
use std::path::Path;
use std::time::Instant;

/// How long and how fast to train the dense layers.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// Passes over the worker's share of the data.
    pub epochs: u64,
    /// Adam for the dense layers.
    pub adam: AdamConfig,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 1,
            adam: AdamConfig::default(),
        }
    }
}

/// Where training is: a checkpoint records it, a resumed run continues from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// The epoch under way.
    pub epoch: u64,
    /// Batches of that epoch already trained on.
    pub batch: u64,
    /// Steps taken in all.
    pub steps: u64,
}

/// What a call to [`Trainer::train`] did.
#[derive(Debug, Clone, Default, PartialEq)]
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

/// One worker: the model, its dense optimizer, the table it pulls from and pushes to,
/// and how far it has come.
#[derive(Debug)]
pub struct Trainer<'a> {
    model: CtrDnn,
    ps: &'a ParamServer,
    adam: Adam,
    config: TrainConfig,
    progress: Progress,
    /// The id its checkpoints name (see [`Manifest`]).
    job: String,
}

impl<'a> Trainer<'a> {
    /// A worker at the start of training.
    pub fn new(
        model: CtrDnn,
        ps: &'a ParamServer,
        config: TrainConfig,
    ) -> Result<Self, TrainError> {
        let adam = Adam::new(model.vars(), config.adam)?;
        Ok(Trainer {
            model,
            ps,
            adam,
            config,
            progress: Progress::default(),
            job: Manifest::fresh_job_id(),
        })
    }

    /// The model.
    pub fn model(&self) -> &CtrDnn {
        &self.model
    }

    /// How far training has come.
    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// Trains on `loader`'s batches until the configured epochs are done or, with
    /// `max_steps`, after that many more steps (a later call goes on where this one
    /// stopped). Every step pushes the embedding gradients to the table and applies Adam
    /// to the dense layers.
    pub fn train(
        &mut self,
        loader: &Loader,
        max_steps: Option<u64>,
    ) -> Result<TrainReport, TrainError> {
        let mut progress = self.progress;
        let report = run_epochs(&mut progress, loader, self.config.epochs, max_steps, |b| {
            self.step(b).map(Some)
        });
        self.progress.epoch = progress.epoch;
        self.progress.batch = progress.batch;
        report
    }

    /// One step on `batch` (outside any epoch: the progress counts the step but not a
    /// batch of the epoch); returns the batch's loss before the update.
    pub fn step(&mut self, batch: &crate::data::Batch) -> Result<f32, TrainError> {
        let b = self.model.backward(self.ps, batch)?;
        if !b.loss.is_finite() {
            return Err(TrainError::Diverged {
                step: self.progress.steps,
                loss: b.loss,
            });
        }
        self.ps.push(&b.keys, &b.row_grads)?;
        self.adam.step(&b.dense)?;
        self.progress.steps += 1;
        Ok(b.loss)
    }

    /// Writes a checkpoint to `path` (safetensors: the dense layers, Adam's state, every
    /// embedding row with its Adagrad state, and the progress), atomically: a crash
    /// mid-write leaves the previous checkpoint.
    pub fn save(&self, path: &Path) -> Result<(), TrainError> {
        let mut file = CheckpointWriter::new();
        file.manifest(Manifest {
            job: self.job.clone(),
            step: self.progress.steps,
            writer: WRITER.into(),
        });
        for (i, var) in self.model.vars().iter().enumerate() {
            file.tensor(format!("dense.{i}"), var.as_tensor().clone());
        }
        for (i, (m, v)) in self.adam.moments().iter().enumerate() {
            file.tensor(format!("adam.m.{i}"), m.as_tensor().clone());
            file.tensor(format!("adam.v.{i}"), v.as_tensor().clone());
        }
        file.table(&self.ps.export())?;
        let p = self.progress;
        file.counters("progress", &[p.epoch, p.batch, p.steps, self.adam.steps()])?;
        file.save(path)
    }

    /// Continues from the checkpoint at `path`: the dense layers, Adam's state, the
    /// table's rows and the progress are replaced by the checkpoint's. Everything is
    /// read and checked before anything changes.
    pub fn restore(&mut self, path: &Path) -> Result<(), TrainError> {
        let mut file = CheckpointReader::open(path)?;
        let vars = self.model.vars();
        let mut dense = Vec::with_capacity(vars.len());
        let mut moments = Vec::with_capacity(vars.len());
        for (i, var) in vars.iter().enumerate() {
            let shape = var.dims();
            dense.push(file.shaped(&format!("dense.{i}"), shape)?);
            moments.push((
                file.shaped(&format!("adam.m.{i}"), shape)?,
                file.shaped(&format!("adam.v.{i}"), shape)?,
            ));
        }
        let table = file.table(self.ps.config().dim)?;
        let [epoch, batch, steps, adam_steps] = file.counters("progress", 4)?[..] else {
            unreachable!("four counters were checked");
        };
        file.expect_writer(WRITER)?;
        file.expect_step(steps)?;
        // The table is checked as a whole before it is replaced (duplicate keys); the
        // shapes of everything else were checked above.
        self.ps.restore(&table)?;
        self.adam.restore(adam_steps, &moments)?;
        for (var, value) in vars.iter().zip(&dense) {
            var.set(value)?;
        }
        self.progress = Progress {
            epoch,
            batch,
            steps,
        };
        Ok(())
    }
}

/// The epochs of a training loop that can stop after `max_steps` steps and resume:
/// runs `step` on `loader`'s batches from where `progress` says (a resumed epoch
/// re-reads and skips the batches trained before: the loader's order is a function of
/// the epoch alone) until `epochs` epochs are done; `step` returns the batch's loss, or
/// `None` to skip the rest of the epoch. `progress.batch`/`epoch` advance here,
/// `progress.steps` is the step's business.
pub fn run_epochs<E: From<crate::data::DataError>>(
    progress: &mut Progress,
    loader: &Loader,
    epochs: u64,
    max_steps: Option<u64>,
    mut step: impl FnMut(&crate::data::Batch) -> Result<Option<f32>, E>,
) -> Result<TrainReport, E> {
    let start = Instant::now();
    let mut report = TrainReport::default();
    let budget = max_steps.unwrap_or(u64::MAX);
    'epochs: while progress.epoch < epochs {
        for batch in loader.epoch(progress.epoch).skip(progress.batch as usize) {
            if report.steps == budget {
                break 'epochs;
            }
            let batch = batch?;
            let Some(loss) = step(&batch)? else {
                break;
            };
            progress.batch += 1;
            report.steps += 1;
            report.samples += batch.len() as u64;
            report.losses.push(loss);
        }
        progress.epoch += 1;
        progress.batch = 0;
    }
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

/// Trains a fresh worker for `config.epochs` epochs: [`Trainer::new`] then
/// [`Trainer::train`].
pub fn train(
    model: CtrDnn,
    ps: &ParamServer,
    loader: &Loader,
    config: &TrainConfig,
) -> Result<(CtrDnn, TrainReport), TrainError> {
    let mut trainer = Trainer::new(model, ps, config.clone())?;
    let report = trainer.train(loader, None)?;
    Ok((trainer.model, report))
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
    ps: &dyn crate::data::EmbeddingTable,
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
