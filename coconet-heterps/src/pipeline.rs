//! A HeterPS plan run on this machine: CTR-DNN's layers as pipeline stages, each stage
//! data parallel over its replicas, synchronous.
//!
//! A step takes a global batch and cuts it into M micro-batches; micro-batch `m` goes
//! through replica `m mod k_s` of each stage s. The schedule is GPipe's fill-drain: every
//! replica runs the forwards of its micro-batches in order (activations flow to the next
//! stage as they are made), then their backwards in reverse order (the gradients of the
//! activations flow back). Micro-batch m's gradients are weighted by its share of the
//! batch (`n_m / n`; micro-batches differ by at most one record): each replica sums its
//! weighted dense gradients, coconet's fused reduce-scatter → Adam → all-gather
//! averages them over the stage's k replicas (so each replica's sum is scaled by k) and
//! steps the stage's layers, and the first stage's weighted rows' gradients of every
//! micro-batch are merged into one Adagrad step per row. So a step is one worker's step
//! on the global batch, up to the order of floating-point sums (tested).
//!
//! Why fill-drain rather than 1F1B: it is the simplest schedule with synchronous
//! semantics, and its memory (every micro-batch's activations held until its backward)
//! is small for CTR-DNN; 1F1B only reorders the same work.

use super::HeterpsError;
use super::checkpoint::{
    finish, read_dense, read_state, read_table_and_progress, write_dense, write_state,
};
use super::replica::{Links, Micro, ReplicaEnd, ReplicaOutcome, replica_pass};
use crate::data::{Batch, Loader, ParamServer};
use crate::train::{
    AdamConfig, CheckpointReader, CheckpointWriter, CtrDnn, Manifest, Progress, StageInput,
    TrainError, TrainReport, run_epochs,
};
use candle_core::Tensor;
use candle_core::backprop::GradStore;
use coconet_candle::DataParallel;
use std::borrow::Cow;
use std::path::Path;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Instant;

/// One stage of a plan: layers `first..=last` on `replicas` workers of `threads`
/// threads each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagePlan {
    /// First layer (0: the embedding).
    pub first: usize,
    /// Last layer.
    pub last: usize,
    /// Data-parallel replicas (the plan's units).
    pub replicas: usize,
    /// Threads per replica (the resource type `cpu-{threads}t`).
    pub threads: usize,
}

/// A stage at run time: its plan, its layers' optimizer, its replicas' thread pools.
struct Stage {
    plan: StagePlan,
    /// `None` when the stage has no dense layer (the embedding alone).
    dense: Option<DataParallel>,
    pools: Vec<rayon::ThreadPool>,
}

/// CTR-DNN run as a pipeline of data-parallel stages (see the module docs).
pub struct CtrPipeline<'a> {
    model: CtrDnn,
    ps: &'a ParamServer,
    stages: Vec<Stage>,
    micro_batches: usize,
    progress: Progress,
    /// Per stage: seconds its busiest replica computed plus its dense step, summed over
    /// the steps (what the stage would take alone, without waiting for its neighbours).
    busy: Vec<f64>,
    /// The id its checkpoints name.
    job: String,
}

/// The writer an in-process pipeline's checkpoints name.
const WRITER: &str = "pipeline";

/// The channel ends of boundary `at` (none: the stage has no such neighbour) for the
/// micro-batches `mine`.
fn take<T>(ends: &mut [Vec<Option<T>>], at: Option<usize>, mine: &[usize]) -> Vec<Option<T>> {
    match at {
        Some(b) => mine.iter().map(|&i| ends[b][i].take()).collect(),
        None => mine.iter().map(|_| None).collect(),
    }
}

/// A replica thread's channel ends, for its own micro-batches.
struct Ends<'b> {
    stage: usize,
    replica: usize,
    micro: Vec<usize>,
    batches: &'b [Batch],
    weight: &'b [f64],
    fwd_in: Vec<Option<Receiver<Tensor>>>,
    fwd_out: Vec<Option<Sender<Tensor>>>,
    bwd_in: Vec<Option<Receiver<Tensor>>>,
    bwd_out: Vec<Option<Sender<Tensor>>>,
}

impl<'b> Links<'b> for Ends<'b> {
    fn input(&mut self, j: usize) -> Result<(StageInput<'b>, Micro<'b>), ReplicaEnd> {
        let batch = &self.batches[self.micro[j]];
        let input = match &self.fwd_in[j] {
            Some(rx) => StageInput::Activation(rx.recv().map_err(|_| {
                ReplicaEnd::NeighbourStopped(
                    "the previous stage stopped before sending its activation".into(),
                )
            })?),
            None => StageInput::Batch(batch),
        };
        let micro = Micro {
            labels: Cow::Borrowed(&batch.labels),
            weight: self.weight[self.micro[j]],
        };
        Ok((input, micro))
    }

    // A send fails only if the receiving replica has stopped: its own error is the one
    // reported.
    fn send_activation(
        &mut self,
        j: usize,
        output: &Tensor,
        _: &Micro<'b>,
    ) -> Result<(), ReplicaEnd> {
        if let Some(tx) = &self.fwd_out[j] {
            let _ = tx.send(output.detach());
        }
        Ok(())
    }

    fn gradient(&mut self, j: usize) -> Result<Option<Tensor>, ReplicaEnd> {
        self.bwd_in[j]
            .as_ref()
            .map(|rx| {
                rx.recv().map_err(|_| {
                    ReplicaEnd::NeighbourStopped(
                        "the next stage stopped before sending its gradient".into(),
                    )
                })
            })
            .transpose()
    }

    fn send_gradient(&mut self, j: usize, grad: Tensor) -> Result<(), ReplicaEnd> {
        if let Some(tx) = &self.bwd_out[j] {
            let _ = tx.send(grad);
        }
        Ok(())
    }
}

/// Checks that `stages` are consecutive, cover the `layers` in order, each with a
/// replica and a thread, and that `micro_batches` divide among every stage's replicas.
pub(super) fn check_stages(
    layers: usize,
    stages: &[StagePlan],
    micro_batches: usize,
) -> Result<(), HeterpsError> {
    if micro_batches == 0 {
        return Err(mismatch("a step needs at least one micro-batch".into()));
    }
    let mut next = 0;
    for (s, st) in stages.iter().enumerate() {
        if st.first != next || st.last < st.first || st.replicas == 0 || st.threads == 0 {
            return Err(mismatch(format!(
                "stage {s} ({}..={}, {} replicas of {} threads) does not continue the stages before it at layer {next} with at least one replica and one thread",
                st.first, st.last, st.replicas, st.threads
            )));
        }
        if !micro_batches.is_multiple_of(st.replicas) {
            return Err(mismatch(format!(
                "{micro_batches} micro-batches do not divide among stage {s}'s {} replicas",
                st.replicas
            )));
        }
        next = st.last + 1;
    }
    if next != layers {
        return Err(mismatch(format!(
            "the stages cover layers 0..{next}, the model has {layers}"
        )));
    }
    Ok(())
}

/// Every replica's outcome, or the first error that is not a consequence of another
/// replica stopping (else the first error).
fn first_failure(
    outcomes: Vec<Result<ReplicaOutcome, (bool, HeterpsError)>>,
) -> Result<Vec<ReplicaOutcome>, HeterpsError> {
    let mut done = Vec::with_capacity(outcomes.len());
    let mut first_error = None;
    for o in outcomes {
        match o {
            Ok(o) => done.push(o),
            Err((secondary, e)) => {
                if first_error.is_none()
                    || (!secondary && first_error.as_ref().is_some_and(|(s, _)| *s))
                {
                    first_error = Some((secondary, e));
                }
            }
        }
    }
    match first_error {
        Some((_, e)) => Err(e),
        None => Ok(done),
    }
}

fn mismatch(message: String) -> HeterpsError {
    HeterpsError::Mismatch(message)
}

impl<'a> CtrPipeline<'a> {
    /// Prepares `stages` (consecutive, covering every layer of `model` in order) with
    /// `micro_batches` micro-batches per step (a multiple of every stage's replicas, so
    /// each replica gets the same number). The dense layers take Adam steps (`adam`).
    pub fn new(
        model: CtrDnn,
        ps: &'a ParamServer,
        stages: &[StagePlan],
        micro_batches: usize,
        adam: AdamConfig,
    ) -> Result<Self, HeterpsError> {
        check_stages(model.layer_count(), stages, micro_batches)?;
        let optimizer = super::dense_optimizer::dense_optimizer(adam);
        let mut built = Vec::with_capacity(stages.len());
        for (s, &plan) in stages.iter().enumerate() {
            let vars = model.stage_vars(plan.first, plan.last);
            let dense = if vars.is_empty() {
                None
            } else {
                Some(DataParallel::shared(vars, plan.replicas, optimizer)?)
            };
            let pools = (0..plan.replicas)
                .map(|r| {
                    rayon::ThreadPoolBuilder::new()
                        .num_threads(plan.threads)
                        .thread_name(move |i| format!("coconet-stage-{s}-{r}-{i}"))
                        .build()
                        .map_err(|e| {
                            mismatch(format!("cannot start stage {s} replica {r}'s threads: {e}"))
                        })
                })
                .collect::<Result<_, _>>()?;
            built.push(Stage { plan, dense, pools });
        }
        Ok(CtrPipeline {
            busy: vec![0.0; built.len()],
            model,
            ps,
            stages: built,
            micro_batches,
            progress: Progress::default(),
            job: Manifest::fresh_job_id(),
        })
    }

    /// The model.
    pub fn model(&self) -> &CtrDnn {
        &self.model
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.progress.steps
    }

    /// How far training has come.
    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// Per stage, the seconds it was busy over the steps taken: its slowest replica's
    /// forwards and backwards plus its dense step — the stage's own time per step, to
    /// compare with the planner's per-stage prediction.
    pub fn stage_seconds(&self) -> &[f64] {
        &self.busy
    }

    /// One synchronous step on `batch` (cut into the micro-batches); returns its mean
    /// loss. If any replica fails, nothing is updated.
    pub fn step(&mut self, batch: &Batch) -> Result<f32, HeterpsError> {
        let m = self.micro_batches;
        if batch.len() < m {
            return Err(mismatch(format!(
                "a batch of {} records cannot feed {m} micro-batches (each needs a record)",
                batch.len()
            )));
        }
        let micro = batch.split(m);
        let weight: Vec<f64> = micro
            .iter()
            .map(|b| b.len() as f64 / batch.len() as f64)
            .collect();
        let jobs = self.wire(&micro, &weight);
        let mut done = first_failure(self.run_replicas(jobs))?;
        let mut losses: Vec<(usize, f32)> =
            done.iter().flat_map(|o| o.losses.iter().copied()).collect();
        losses.sort_by_key(|l| l.0);
        let loss = losses.iter().map(|l| l.1).sum::<f32>();
        if !loss.is_finite() {
            return Err(TrainError::Diverged {
                step: self.progress.steps,
                loss,
            }
            .into());
        }
        let busy = self.step_dense(&mut done)?;
        let mut rows: Vec<(usize, Vec<u64>, Vec<f32>)> =
            done.into_iter().flat_map(|o| o.rows).collect();
        rows.sort_by_key(|r| r.0);
        let pushes: Vec<(&[u64], &[f32])> = rows.iter().map(|(_, k, g)| (&k[..], &g[..])).collect();
        self.ps
            .push_merged(&pushes, 1.0)
            .map_err(TrainError::from)?;
        self.progress.steps += 1;
        self.busy
            .iter_mut()
            .zip(busy)
            .for_each(|(total, b)| *total += b);
        Ok(loss)
    }

    /// Every replica's channel ends for a step over the micro-batches `micro` (weighed
    /// `weight`), stage by stage: one channel per (boundary, micro-batch) each way,
    /// forward[s][m] carrying micro m's activation from stage s to s + 1, backward[s][m]
    /// its gradient back.
    fn wire<'b>(&self, micro: &'b [Batch], weight: &'b [f64]) -> Vec<Ends<'b>> {
        let m = self.micro_batches;
        let s_count = self.stages.len();
        let mut fwd_tx: Vec<Vec<Option<Sender<Tensor>>>> = Vec::new();
        let mut fwd_rx: Vec<Vec<Option<Receiver<Tensor>>>> = Vec::new();
        let mut bwd_tx: Vec<Vec<Option<Sender<Tensor>>>> = Vec::new();
        let mut bwd_rx: Vec<Vec<Option<Receiver<Tensor>>>> = Vec::new();
        for _ in 0..s_count.saturating_sub(1) {
            let (ft, fr): (Vec<_>, Vec<_>) = (0..m)
                .map(|_| channel())
                .map(|(t, r)| (Some(t), Some(r)))
                .unzip();
            let (bt, br): (Vec<_>, Vec<_>) = (0..m)
                .map(|_| channel())
                .map(|(t, r)| (Some(t), Some(r)))
                .unzip();
            fwd_tx.push(ft);
            fwd_rx.push(fr);
            bwd_tx.push(bt);
            bwd_rx.push(br);
        }
        let mut jobs = Vec::new();
        for (s, stage) in self.stages.iter().enumerate() {
            let k = stage.plan.replicas;
            for r in 0..k {
                let mine: Vec<usize> = (r..m).step_by(k).collect();
                let before = s.checked_sub(1);
                let after = (s + 1 < s_count).then_some(s);
                jobs.push(Ends {
                    stage: s,
                    replica: r,
                    batches: micro,
                    weight,
                    fwd_in: take(&mut fwd_rx, before, &mine),
                    fwd_out: take(&mut fwd_tx, after, &mine),
                    bwd_in: take(&mut bwd_rx, after, &mine),
                    bwd_out: take(&mut bwd_tx, before, &mine),
                    micro: mine,
                });
            }
        }
        jobs
    }

    /// Runs every replica's pass on a thread of its own (in its stage's pool); each
    /// failure comes back with whether it is a consequence of a neighbour stopping.
    fn run_replicas(
        &self,
        jobs: Vec<Ends<'_>>,
    ) -> Vec<Result<ReplicaOutcome, (bool, HeterpsError)>> {
        // What the replica threads read: the plans and pools, not the stages' optimizers
        // (an MPI-backed one is not shareable across threads).
        let layouts: Vec<(StagePlan, &[rayon::ThreadPool])> =
            self.stages.iter().map(|s| (s.plan, &s.pools[..])).collect();
        let (model, ps, layouts) = (&self.model, self.ps, &layouts);
        let run = |mut e: Ends| -> Result<ReplicaOutcome, ReplicaEnd> {
            let (plan, pools) = layouts[e.stage];
            let micro = e.micro.clone();
            pools[e.replica].install(|| {
                replica_pass(
                    model,
                    ps,
                    (plan.first, plan.last, plan.replicas),
                    &micro,
                    &mut e,
                )
            })
        };
        std::thread::scope(|scope| {
            let handles: Vec<_> = jobs
                .into_iter()
                .map(|e| {
                    let (stage, replica) = (e.stage, e.replica);
                    (stage, replica, scope.spawn(move || run(e)))
                })
                .collect();
            handles
                .into_iter()
                .map(|(stage, replica, h)| {
                    let failed = |message: String| HeterpsError::Replica {
                        stage,
                        replica,
                        message,
                    };
                    match h.join() {
                        Ok(Ok(o)) => Ok(o),
                        Ok(Err(ReplicaEnd::Failed(e))) => Err((false, failed(e.to_string()))),
                        Ok(Err(ReplicaEnd::NeighbourStopped(m))) => Err((true, failed(m))),
                        Err(panic) => Err((
                            false,
                            failed(format!(
                                "panicked: {}",
                                coconet_runtime::panic_message(&*panic)
                            )),
                        )),
                    }
                })
                .collect()
        })
    }

    /// Each stage's dense step on its replicas' gradients (`done`, stage by stage);
    /// returns the seconds each stage was busy: its slowest replica plus its step.
    fn step_dense(&mut self, done: &mut [ReplicaOutcome]) -> Result<Vec<f64>, HeterpsError> {
        let mut at = 0;
        let mut busy = vec![0.0; self.stages.len()];
        for (s, stage) in self.stages.iter_mut().enumerate() {
            let k = stage.plan.replicas;
            let mine = &mut done[at..at + k];
            busy[s] = mine.iter().map(|o| o.busy).fold(0.0, f64::max);
            let grads: Vec<GradStore> = mine.iter_mut().filter_map(|o| o.dense.take()).collect();
            if let Some(dense) = &mut stage.dense {
                let t = Instant::now();
                dense.step(&grads)?;
                busy[s] += t.elapsed().as_secs_f64();
            }
            at += k;
        }
        Ok(busy)
    }

    /// Trains over `loader`'s batches (global batches: the loader's batch size is the
    /// micro-batch size times the micro-batches) until `epochs` epochs are done or, with
    /// `max_steps`, after that many more steps; a later call (or one after
    /// [`CtrPipeline::restore`]) goes on where this one stopped. An epoch's last batch,
    /// if it has fewer records than there are micro-batches, is skipped (and not
    /// counted).
    pub fn train(
        &mut self,
        loader: &Loader,
        epochs: u64,
        max_steps: Option<u64>,
    ) -> Result<TrainReport, HeterpsError> {
        let mut progress = self.progress;
        let micro = self.micro_batches;
        let report = run_epochs(&mut progress, loader, epochs, max_steps, |batch| {
            // A last batch too small to feed every micro-batch is skipped.
            if batch.len() < micro {
                return Ok(None);
            }
            self.step(batch).map(Some)
        });
        self.progress.epoch = progress.epoch;
        self.progress.batch = progress.batch;
        report
    }

    /// Writes a checkpoint to `path` (safetensors, atomically): the dense layers, each
    /// stage's optimizer state (`stage{s}.{m,v}`, every replica's block), the embedding
    /// table and the progress.
    pub fn save(&self, path: &Path) -> Result<(), HeterpsError> {
        let mut file = CheckpointWriter::new();
        write_dense(&mut file, &self.model);
        for (s, stage) in self.stages.iter().enumerate() {
            if let Some(dense) = &stage.dense {
                write_state(&mut file, &format!("stage{s}"), &dense.state()?)?;
            }
        }
        finish(file, self.ps, self.progress, (&self.job, WRITER), path)
    }

    /// Continues from the checkpoint at `path` (written by a pipeline with the same stage
    /// boundaries; the replica counts may differ: a stage's saved state is its replicas'
    /// blocks in rank order, i.e. the whole tensor): the dense layers, the stages'
    /// optimizer state, the table and the progress are replaced. Everything is read and
    /// checked before anything changes.
    pub fn restore(&mut self, path: &Path) -> Result<(), HeterpsError> {
        let mut file = CheckpointReader::open(path)?;
        let dense = read_dense(&mut file, &self.model)?;
        let mut states = Vec::with_capacity(self.stages.len());
        for (s, stage) in self.stages.iter().enumerate() {
            let Some(dp) = &stage.dense else {
                states.push(None);
                continue;
            };
            // The stage's parameters are the model's variables of its layers, in order.
            let (first, last) = (stage.plan.first.max(1), stage.plan.last);
            let weights = dense[2 * (first - 1)..2 * last].to_vec();
            let prefix = format!("stage{s}");
            let what = format!("stage {s}");
            states.push(Some(read_state(
                &mut file,
                &prefix,
                &dp.state()?,
                weights,
                &what,
            )?));
        }
        let (table, progress) = read_table_and_progress(&mut file, self.ps, WRITER)?;
        // Checked: shapes and sizes above; the table's keys by `restore` before it
        // changes anything. Then every stage's state (its weights set its layers).
        self.ps.restore(&table).map_err(TrainError::from)?;
        for (stage, state) in self.stages.iter_mut().zip(&states) {
            if let (Some(dp), Some(state)) = (&mut stage.dense, state) {
                dp.load_state(state)?;
            }
        }
        self.progress = progress;
        Ok(())
    }
}
