//! Synchronous data-parallel CTR-DNN: W worker threads, one shared model and table.

use super::HeterpsError;
use super::checkpoint::{
    finish, read_dense, read_state, read_table_and_progress, write_dense, write_state,
};
use crate::data::{Batch, Loader, ParamServer};
use crate::train::{
    AdamConfig, Backward, CheckpointReader, CheckpointWriter, CtrDnn, Manifest, Progress,
    TrainError, TrainReport,
};
use coconet_candle::DataParallel;
use std::path::Path;
use std::time::Instant;

/// CTR-DNN trained by W workers in lockstep (see the module docs).
pub struct CtrDataParallel<'a> {
    model: CtrDnn,
    ps: &'a ParamServer,
    dense: DataParallel,
    workers: usize,
    /// One thread pool per worker when workers have a fixed thread count.
    pools: Vec<rayon::ThreadPool>,
    progress: Progress,
    /// The id its checkpoints name.
    job: String,
}

/// The writer a data-parallel trainer's checkpoints name.
const WRITER: &str = "data-parallel trainer";

impl<'a> CtrDataParallel<'a> {
    /// `workers` workers training `model` (its dense layers, shared by every worker
    /// thread: a backward pass only reads them) with its table in `ps`; the dense layers
    /// take Adam steps (`adam`, as the single worker's
    /// [`Trainer`](crate::train::Trainer) does).
    pub fn new(
        model: CtrDnn,
        ps: &'a ParamServer,
        workers: usize,
        adam: AdamConfig,
    ) -> Result<Self, HeterpsError> {
        let optimizer = super::dense_optimizer::dense_optimizer(adam);
        let dense = DataParallel::shared(model.vars(), workers, optimizer)?;
        Ok(CtrDataParallel {
            model,
            ps,
            dense,
            workers,
            pools: Vec::new(),
            progress: Progress::default(),
            job: Manifest::fresh_job_id(),
        })
    }

    /// Runs each worker's forward and backward on a pool of its own of `threads`
    /// threads (the planner's resource type `cpu-{threads}t`); by default all workers
    /// share the process's pool.
    pub fn with_threads(mut self, threads: usize) -> Result<Self, HeterpsError> {
        self.pools = (0..self.workers)
            .map(|w| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(move |i| format!("coconet-worker-{w}-{i}"))
                    .build()
                    .map_err(|e| {
                        HeterpsError::Mismatch(format!(
                            "cannot start worker {w}'s {threads} threads: {e}"
                        ))
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(self)
    }

    /// Where the dense step's time went, summed over the steps taken.
    pub fn dense_times(&self) -> coconet_candle::StepTimes {
        self.dense.times()
    }

    /// The model.
    pub fn model(&self) -> &CtrDnn {
        &self.model
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.progress.steps
    }

    /// How far training has come (what a checkpoint records).
    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// One synchronous step: `batches[w]` is worker w's batch. Returns the mean of the
    /// workers' losses (each before the update). If a worker fails, nothing is updated.
    pub fn step(&mut self, batches: &[Batch]) -> Result<f32, HeterpsError> {
        if batches.len() != self.workers {
            return Err(HeterpsError::Mismatch(format!(
                "{} batches for {} workers",
                batches.len(),
                self.workers
            )));
        }
        let (model, ps, pools) = (&self.model, self.ps, &self.pools);
        let run = move |w: usize, b: &Batch| match pools.get(w) {
            Some(pool) => pool.install(|| model.backward(ps, b)),
            None => model.backward(ps, b),
        };
        let results: Vec<Result<Backward, TrainError>> = std::thread::scope(|scope| {
            let others: Vec<_> = batches[1..]
                .iter()
                .enumerate()
                .map(|(w, b)| scope.spawn(move || run(w + 1, b)))
                .collect();
            let mut all = vec![run(0, &batches[0])];
            for (w, handle) in others.into_iter().enumerate() {
                all.push(handle.join().unwrap_or_else(|panic| {
                    Err(TrainError::Candle(candle_core::Error::Msg(format!(
                        "worker {} panicked: {}",
                        w + 1,
                        coconet_runtime::panic_message(&*panic)
                    ))))
                }));
            }
            all
        });
        let backward = results.into_iter().collect::<Result<Vec<_>, _>>()?;
        let loss = backward.iter().map(|b| b.loss).sum::<f32>() / self.workers as f32;
        if !loss.is_finite() {
            return Err(TrainError::Diverged {
                step: self.progress.steps,
                loss,
            }
            .into());
        }
        let (mut grads, mut rows) = (Vec::new(), Vec::new());
        for b in backward {
            grads.push(b.dense);
            rows.push((b.keys, b.row_grads));
        }
        self.dense.step(&grads)?;
        let pushes: Vec<(&[u64], &[f32])> = rows.iter().map(|(k, g)| (&k[..], &g[..])).collect();
        self.ps
            .push_merged(&pushes, 1.0 / self.workers as f32)
            .map_err(TrainError::from)?;
        self.progress.steps += 1;
        Ok(loss)
    }

    /// Trains until `epochs` epochs are done (or `max_steps` steps were taken in this
    /// call), from where [`CtrDataParallel::progress`] says — a restored checkpoint's
    /// place, in the middle of an epoch too: `loaders[w]` is worker w's share of the
    /// data (replica w of W). Every worker must have as many batches as the others in
    /// each epoch (equal files, a number of files that the workers divide): a worker
    /// that runs out first is an error, not a silently shorter epoch.
    pub fn train(
        &mut self,
        loaders: &[Loader],
        epochs: u64,
        max_steps: Option<u64>,
    ) -> Result<TrainReport, HeterpsError> {
        if loaders.len() != self.workers {
            return Err(HeterpsError::Mismatch(format!(
                "{} loaders for {} workers",
                loaders.len(),
                self.workers
            )));
        }
        let start = Instant::now();
        let mut report = TrainReport::default();
        let budget = max_steps.unwrap_or(u64::MAX);
        'epochs: while self.progress.epoch < epochs {
            let epoch = self.progress.epoch;
            // A resumed epoch re-reads and skips the batches trained before (a loader's
            // order is a function of the epoch alone).
            let mut streams: Vec<_> = loaders
                .iter()
                .map(|l| l.epoch(epoch).skip(self.progress.batch as usize))
                .collect();
            loop {
                if report.steps == budget {
                    break 'epochs;
                }
                let next: Vec<Option<_>> = streams.iter_mut().map(Iterator::next).collect();
                if next.iter().all(Option::is_none) {
                    break;
                }
                let mut batches = Vec::with_capacity(self.workers);
                for (w, b) in next.into_iter().enumerate() {
                    match b {
                        Some(b) => batches.push(b.map_err(TrainError::from)?),
                        None => {
                            return Err(HeterpsError::Mismatch(format!(
                                "worker {w} ran out of data at batch {} of epoch {epoch} while others had more: give every worker as many records",
                                self.progress.batch
                            )));
                        }
                    }
                }
                let loss = self.step(&batches)?;
                self.progress.batch += 1;
                report.steps += 1;
                report.samples += batches.iter().map(|b| b.len() as u64).sum::<u64>();
                report.losses.push(loss);
            }
            self.progress.epoch += 1;
            self.progress.batch = 0;
        }
        report.seconds = start.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Writes a checkpoint to `path` (safetensors, atomically): the dense layers, the
    /// optimizer state, the embedding table and the progress.
    pub fn save(&self, path: &Path) -> Result<(), HeterpsError> {
        let mut file = CheckpointWriter::new();
        write_dense(&mut file, &self.model);
        write_state(&mut file, "optimizer", &self.dense.state()?)?;
        finish(file, self.ps, self.progress, (&self.job, WRITER), path)
    }

    /// Continues from the checkpoint at `path` (written by a trainer of the same model;
    /// the worker count may differ: the optimizer state is whole tensors): the dense
    /// layers, the optimizer state, the table and the progress are replaced. Everything
    /// is read and checked before anything changes; a resumed run ends bitwise where an
    /// uninterrupted one would.
    pub fn restore(&mut self, path: &Path) -> Result<(), HeterpsError> {
        let mut file = CheckpointReader::open(path)?;
        let dense = read_dense(&mut file, &self.model)?;
        let state = read_state(
            &mut file,
            "optimizer",
            &self.dense.state()?,
            dense,
            "the trainer",
        )?;
        let (table, progress) = read_table_and_progress(&mut file, self.ps, WRITER)?;
        self.ps.restore(&table).map_err(TrainError::from)?;
        self.dense.load_state(&state)?;
        self.progress = progress;
        Ok(())
    }
}
