//! A planner's multi-stage plan run as processes: each process is one replica of one
//! stage (processes `0..k_0` the first stage's replicas, the next `k_1` the second's,
//! and so on), started by `coconet-launch` (or any launcher that sets the rendezvous
//! variables). The step is [`CtrPipeline`](super::CtrPipeline)'s — micro-batch `m` runs
//! on replica `m mod k_s` of each stage, fill-drain — with the activations and gradients
//! on TCP between neighbouring replicas ([`boundary`](super::boundary)), each stage's
//! dense step taken by coconet's fused reduce-scatter → Adam → all-gather among the
//! stage's processes, and the first stage's rows pushed to parameter-server shards
//! served by processes of the job.
//!
//! Data: each first-stage replica reads its own share of the files; its batch is its
//! `micro_batches / k_0` micro-batches, so a step trains on the union of the first
//! stage's batches — one worker's step on that global batch, up to the order of
//! floating-point sums. An epoch ends when the first share runs out (see
//! [`CtrStageProcess::train`]). Later stages follow the first: they take steps until it
//! says training is over.

use super::HeterpsError;
use super::boundary::{ACTIVATION, END, Frame, GRADIENT, Neighbours, PAUSE, Side};
use super::checkpoint::{read_dense, read_state, write_dense, write_state};
use super::pipeline::{StagePlan, check_stages};
use super::processes::{host_table, store_error};
use super::replica::{Links, Micro, ReplicaEnd, replica_pass};
use crate::data::{
    Batch, DataError, EmbeddingTable, Loader, ParamServerConfig, PsServer, RemoteTable,
};
use crate::train::{
    AdamConfig, CheckpointReader, CheckpointWriter, CtrDnn, Manifest, Progress, StageInput,
    TrainError, TrainReport,
};
use candle_core::Tensor;
use coconet_candle::DataParallel;
use coconet_runtime::cpu::Tcp;
use coconet_runtime::launch::{LaunchEnv, Store};
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// This process's replica of a pipelined plan (see the module docs).
pub struct CtrStageProcess {
    model: CtrDnn,
    stages: Vec<StagePlan>,
    stage: usize,
    replica: usize,
    micro_batches: usize,
    /// The first stage's way to the rows.
    table: Option<RemoteTable>,
    /// The stage's dense step among its replicas (none: the embedding alone).
    dense: Option<DataParallel>,
    links: Neighbours,
    progress: Progress,
    /// Why a step failed: the stages may then disagree, so no further step is taken.
    failed: Option<String>,
    /// Whether the first stage said training is over.
    done: bool,
    /// `train` calls ended (the rounds of [`CtrStageProcess::verdict`]).
    verdicts: u64,
    /// The last round whose every word this process read.
    heard_all: Option<u64>,
    /// Seconds this replica computed (forwards, backwards and its dense step).
    busy: f64,
    /// The table shard this process serves, if it hosts one.
    server: Option<PsServer>,
    store: Store,
    /// The pipeline's name in the store.
    name: String,
    process: usize,
    timeout: Duration,
    /// The job's id (process 0 makes it, the store shares it): every checkpoint file
    /// names it, and cleanup removes only checkpoints that name it.
    job: String,
    /// Process 0's hold on the checkpoint directory, once it used one: no other job
    /// writes or cleans there while this job may.
    dir_lock: Option<(PathBuf, std::fs::File)>,
}

/// The file in a checkpoint directory that its job holds locked.
const LOCK_FILE: &str = ".coconet-lock";
/// The file in each checkpoint that names the job that wrote it.
const JOB_FILE: &str = "JOB";

/// The role of process `process` in a plan of `stages`: `(stage, replica)`, stage by
/// stage in order; `None` past the plan's processes.
pub fn stage_role(stages: &[StagePlan], process: usize) -> Option<(usize, usize)> {
    let mut first = 0;
    for (s, st) in stages.iter().enumerate() {
        if process < first + st.replicas {
            return Some((s, process - first));
        }
        first += st.replicas;
    }
    None
}

/// The processes a plan of `stages` runs on: one per replica.
pub fn stage_processes(stages: &[StagePlan]) -> usize {
    stages.iter().map(|s| s.replicas).sum()
}

/// The table of a stage that has no embedding (its forward never reads rows).
struct NoRows;

impl EmbeddingTable for NoRows {
    fn dim(&self) -> usize {
        0
    }

    fn pull(&self, _: &[u64]) -> Result<Vec<f32>, DataError> {
        Err(DataError::Invalid(
            "a stage without the embedding read rows".into(),
        ))
    }

    fn lookup(&self, keys: &[u64]) -> Result<Vec<f32>, DataError> {
        self.pull(keys)
    }
}

impl CtrStageProcess {
    /// Joins the job the launcher started: `stages` (every process passes the same)
    /// need exactly the job's processes; processes `0..shards` each serve one shard of
    /// a table configured by `table`, and the first stage's replicas pull and push its
    /// rows. With `checkpoint`, a checkpoint there (see [`save`](CtrStageProcess::save))
    /// is where training goes on from: the table's servers start from its rows and every
    /// process restores its part.
    #[allow(clippy::too_many_arguments)]
    pub fn from_env(
        model: CtrDnn,
        stages: &[StagePlan],
        micro_batches: usize,
        shards: usize,
        table: ParamServerConfig,
        adam: AdamConfig,
        checkpoint: Option<&Path>,
    ) -> Result<CtrStageProcess, HeterpsError> {
        let env = LaunchEnv::from_env()
            .map_err(|e| HeterpsError::Mismatch(format!("not started by a launcher: {e}")))?;
        let (process, processes) = (env.rank, env.world_size);
        if stage_processes(stages) != processes {
            return Err(HeterpsError::Mismatch(format!(
                "the plan has {} replicas, one per process, but the job has {processes} processes",
                stage_processes(stages)
            )));
        }
        if shards == 0 || shards > processes {
            return Err(HeterpsError::Mismatch(format!(
                "{shards} parameter-server shards for {processes} processes: give 1 to {processes}"
            )));
        }
        let mut store = env.connect().map_err(store_error)?;
        let dim = table.dim;
        let pushers = stages.first().map_or(1, |s| s.replicas);
        let rows = match checkpoint {
            Some(dir) if process < shards => Self::checkpointed_table(dir, dim)?,
            _ => None,
        };
        let (server, addrs) = host_table(
            &mut store,
            process,
            shards,
            table,
            pushers,
            env.timeout,
            rows.as_ref(),
        )?;
        let remote = match stage_role(stages, process) {
            Some((0, r)) => Some(RemoteTable::connect(
                &addrs,
                r,
                pushers,
                dim,
                env.timeout,
                &env.secret,
            )?),
            _ => None,
        };
        let mut me = CtrStageProcess::new(
            model,
            stages,
            micro_batches,
            process,
            remote,
            store,
            "job",
            adam,
            env.timeout,
        )?;
        me.server = server;
        if let Some(dir) = checkpoint {
            me.restore(dir)?;
        }
        Ok(me)
    }

    /// Process `process`'s replica of `stages` (`micro_batches` per step, a multiple of
    /// every stage's replicas), meeting the others of the pipeline `name` through
    /// `store`; a first-stage replica reads rows through `table` (connected as worker
    /// `replica` of `k_0`). Waits up to `timeout` for each neighbour, and in each step.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: CtrDnn,
        stages: &[StagePlan],
        micro_batches: usize,
        process: usize,
        table: Option<RemoteTable>,
        mut store: Store,
        name: &str,
        adam: AdamConfig,
        timeout: Duration,
    ) -> Result<CtrStageProcess, HeterpsError> {
        check_stages(model.layer_count(), stages, micro_batches)?;
        let Some((stage, replica)) = stage_role(stages, process) else {
            return Err(HeterpsError::Mismatch(format!(
                "process {process} has no role in a plan of {} replicas",
                stage_processes(stages)
            )));
        };
        if stage == 0 && table.is_none() {
            return Err(HeterpsError::Mismatch(
                "a replica of the first stage needs the embedding table".into(),
            ));
        }
        let replicas: Vec<usize> = stages.iter().map(|s| s.replicas).collect();
        let links = Neighbours::connect(
            &mut store,
            name,
            &replicas,
            (stage, replica),
            micro_batches,
            timeout,
        )?;
        let plan = stages[stage];
        let vars = model.stage_vars(plan.first, plan.last);
        let dense = if vars.is_empty() {
            None
        } else {
            let tcp = Tcp::connect(
                &mut store,
                replica,
                plan.replicas,
                &format!("heterps/pipe/{name}/dense/{stage}"),
                timeout,
            )?;
            Some(DataParallel::tcp(
                vars,
                tcp,
                super::dense_optimizer::dense_optimizer(adam),
            )?)
        };
        let job_key = format!("heterps/pipe/{name}/job");
        if process == 0 {
            store
                .set(&job_key, Manifest::fresh_job_id().as_bytes())
                .map_err(store_error)?;
        }
        let job = store.get(&job_key, timeout).map_err(store_error)?;
        let job = String::from_utf8_lossy(&job).into_owned();
        Ok(CtrStageProcess {
            model,
            stages: stages.to_vec(),
            stage,
            replica,
            micro_batches,
            table: if stage == 0 { table } else { None },
            dense,
            links,
            progress: Progress::default(),
            failed: None,
            done: false,
            verdicts: 0,
            heard_all: None,
            busy: 0.0,
            server: None,
            store,
            name: name.to_string(),
            process,
            timeout,
            job,
            dir_lock: None,
        })
    }

    /// This process's `(stage, replica)`.
    pub fn role(&self) -> (usize, usize) {
        (self.stage, self.replica)
    }

    /// The model: this stage's layers are trained here; the others are as they started
    /// (see [`CtrStageProcess::gather_model`]).
    pub fn model(&self) -> &CtrDnn {
        &self.model
    }

    /// The table, on a first-stage replica.
    pub fn table(&self) -> Option<&RemoteTable> {
        self.table.as_ref()
    }

    /// Seconds this replica spent computing (its forwards, backwards and dense step),
    /// summed over the steps: the stage's own time, to set beside the planner's.
    pub fn busy_seconds(&self) -> f64 {
        self.busy
    }

    /// Trains: a first-stage replica over `loader` (its share of the data, in batches of
    /// `micro_batches / k_0` micro-batches) for `epochs` epochs, then tells the next
    /// stage it is over (an epoch ends on every replica when one share runs out or its
    /// batch cannot feed each micro-batch a record: the first stage's replicas agree on
    /// it before each step, through the store); a later stage follows until told so (`loader` unused). A
    /// last-stage replica's `losses` are its share of each step's loss (the step's loss
    /// is their sum over the last stage's replicas); other stages report none.
    ///
    /// With `max_steps`, the first stage stops after that many more steps and the call
    /// returns on every process (to [`save`](CtrStageProcess::save) a checkpoint, say); a
    /// later call goes on. [`done`](CtrStageProcess::done) says when training is over.
    pub fn train(
        &mut self,
        loader: Option<&Loader>,
        epochs: u64,
        max_steps: Option<u64>,
    ) -> Result<TrainReport, HeterpsError> {
        let mut result = self.try_train(loader, epochs, max_steps);
        if let Err(e) = &result {
            self.fail(e.to_string());
        }
        // Every process says how its part ended: a step that one stage applied and
        // another did not is an error everywhere, never `Ok` on some processes.
        let word = match &result {
            Ok(_) => String::new(),
            Err(e) => format!("stage {} replica {}: {e}", self.stage, self.replica),
        };
        match self.verdict(&word) {
            Err(e) => {
                self.fail(e.to_string());
                if result.is_ok() {
                    result = Err(e);
                }
            }
            Ok(Some(other)) if result.is_ok() => {
                let why = format!("another process failed ({other}); the stages may disagree");
                self.fail(why.clone());
                result = Err(HeterpsError::Mismatch(why));
            }
            Ok(_) => {}
        }
        result
    }

    fn try_train(
        &mut self,
        loader: Option<&Loader>,
        epochs: u64,
        max_steps: Option<u64>,
    ) -> Result<TrainReport, HeterpsError> {
        if let Some(why) = &self.failed {
            return Err(HeterpsError::Mismatch(format!(
                "an earlier step failed ({why}); the stages may disagree: restart the job"
            )));
        }
        let last = self.stage + 1 == self.stages.len();
        let mut report = if self.stage == 0 {
            let loader = loader.ok_or_else(|| {
                HeterpsError::Mismatch("a replica of the first stage needs a loader".into())
            })?;
            let report = self.lead(loader, epochs, max_steps.unwrap_or(u64::MAX))?;
            self.done = self.progress.epoch >= epochs;
            let kind = if self.done { END } else { PAUSE };
            let at = (self.progress.epoch, self.progress.batch);
            self.links.stop(kind, at).map_err(end_error)?;
            report
        } else {
            let start = Instant::now();
            let mut report = TrainReport::default();
            while let Some((loss, samples)) = self.follow()? {
                report.steps += 1;
                report.samples += samples;
                report.losses.push(loss);
            }
            report.seconds = start.elapsed().as_secs_f64();
            report
        };
        if !last {
            report.losses.clear();
        }
        Ok(report)
    }

    /// Publishes how this process's `train` call ended (`word`: empty for success, else
    /// the error) and, if it succeeded, waits until every process has said so or one
    /// says it failed: that one's error. A process that failed does not wait (its peers
    /// learn of it from its word).
    fn verdict(&mut self, word: &str) -> Result<Option<String>, HeterpsError> {
        let round = self.verdicts;
        self.verdicts += 1;
        let name = &self.name;
        let round_key = |round: u64, p: usize| format!("heterps/pipe/{name}/verdict/{round}/{p}");
        let key = |p: usize| round_key(round, p);
        self.store
            .set(&key(self.process), word.as_bytes())
            .map_err(store_error)?;
        // Once this process has read every word of round - 1, every process has finished
        // reading round - 2 (it wrote round - 1's word after): this process's word of
        // round - 2 is nobody's any more, so the store keeps no word per call.
        if round >= 2 && self.heard_all == Some(round - 1) {
            self.store
                .delete(&round_key(round - 2, self.process))
                .map_err(store_error)?;
        }
        if !word.is_empty() {
            return Ok(None);
        }
        let processes = stage_processes(&self.stages);
        let mut waiting: Vec<usize> = (0..processes).filter(|&p| p != self.process).collect();
        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_micros(200);
        while !waiting.is_empty() {
            let mut still = Vec::new();
            for p in waiting {
                match self.store.try_get(&key(p)).map_err(store_error)? {
                    Some(w) if !w.is_empty() => {
                        return Ok(Some(String::from_utf8_lossy(&w).into_owned()));
                    }
                    Some(_) => {}
                    None => still.push(p),
                }
            }
            waiting = still;
            if !waiting.is_empty() {
                if Instant::now() > deadline {
                    let roles: Vec<String> = waiting
                        .iter()
                        .filter_map(|&p| stage_role(&self.stages, p))
                        .map(|(s, r)| format!("stage {s} replica {r}"))
                        .collect();
                    return Err(HeterpsError::Mismatch(format!(
                        "{} did not finish within {:.0} s (stopped or hung)",
                        roles.join(", "),
                        self.timeout.as_secs_f64()
                    )));
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
        }
        self.heard_all = Some(round);
        Ok(None)
    }

    /// A first-stage replica's epochs. Before each step the first stage's replicas tell
    /// each other their batch's size (through the store; 0 when a share is done or its
    /// batch cannot feed every micro-batch): an epoch ends for all when one share ends,
    /// and the global batch is the sum of the sizes. So shares of unequal size (files
    /// that do not divide evenly) cost records of the longer shares in that epoch, never
    /// a hang or a wrongly weighted step.
    fn lead(
        &mut self,
        loader: &Loader,
        epochs: u64,
        budget: u64,
    ) -> Result<TrainReport, HeterpsError> {
        let start = Instant::now();
        let mut report = TrainReport::default();
        let k0 = self.stages[0].replicas;
        let per_replica = self.micro_batches / k0;
        let key = format!("heterps/pipe/{}/batch", self.name);
        'epochs: while self.progress.epoch < epochs {
            let mut batches = loader
                .epoch(self.progress.epoch)
                .skip(self.progress.batch as usize);
            loop {
                if report.steps == budget {
                    break 'epochs;
                }
                // A replica that cannot read its data says so (u64::MAX) instead of
                // leaving the others waiting for its size.
                let batch = batches.next().transpose();
                let len = match &batch {
                    Ok(Some(b)) if b.len() >= per_replica => b.len() as u64,
                    Ok(_) => 0,
                    Err(_) => u64::MAX,
                };
                let sizes: Vec<u64> = if k0 == 1 {
                    vec![len]
                } else {
                    self.store
                        .all_gather(&key, self.replica, k0, &len.to_le_bytes(), self.timeout)
                        .map_err(store_error)?
                        .iter()
                        .map(|b| {
                            b.get(..8)
                                .and_then(|b| b.try_into().ok())
                                .map_or(u64::MAX, u64::from_le_bytes)
                        })
                        .collect()
                };
                let batch = batch?;
                if let Some(r) = sizes.iter().position(|&n| n == u64::MAX) {
                    return Err(HeterpsError::Mismatch(format!(
                        "replica {r} of the first stage could not read its data"
                    )));
                }
                let (Some(batch), false) = (batch, sizes.contains(&0)) else {
                    break;
                };
                let global = sizes.iter().sum::<u64>() as usize;
                let loss = self.run_step(Some((&batch, global)), None, &mut 0)?;
                self.progress.batch += 1;
                report.steps += 1;
                report.samples += batch.len() as u64;
                report.losses.push(loss);
            }
            self.progress.epoch += 1;
            self.progress.batch = 0;
        }
        report.seconds = start.elapsed().as_secs_f64();
        Ok(report)
    }

    /// A later stage's step: `None` once the first stage says training is over or
    /// pauses, else this replica's share of the loss and its records.
    fn follow(&mut self) -> Result<Option<(f32, u64)>, HeterpsError> {
        let k_prev = self.stages[self.stage - 1].replicas;
        let first = self
            .links
            .receive(Side::Prev, self.replica % k_prev)
            .map_err(end_error)?;
        if first.kind == END || first.kind == PAUSE {
            // Every previous-stage replica this one shares micro-batches with says so.
            for r in self.links.prev_replicas() {
                if r == self.replica % k_prev {
                    continue;
                }
                let other = self.links.receive(Side::Prev, r).map_err(end_error)?;
                if other.kind != first.kind {
                    return Err(HeterpsError::Mismatch(format!(
                        "stage {} replica {r} sent {} where replica {} ended the step with {}",
                        self.stage - 1,
                        frame_name(other.kind),
                        self.replica % k_prev,
                        frame_name(first.kind)
                    )));
                }
            }
            self.done = first.kind == END;
            // The first stage's place in its data: every process's checkpoint says it.
            if let [epoch, batch] = first.dims[..] {
                self.progress.epoch = epoch;
                self.progress.batch = batch;
            }
            let at = (self.progress.epoch, self.progress.batch);
            self.links.stop(first.kind, at).map_err(end_error)?;
            return Ok(None);
        }
        let mut samples = 0;
        let loss = self.run_step(None, Some(first), &mut samples)?;
        Ok(Some((loss, samples)))
    }

    /// One step: a first-stage replica's on `batch`, a later one's from the frame
    /// `pending` it has read; this replica's share of the step's loss. Adds the records
    /// of its micro-batches to `samples`.
    fn run_step(
        &mut self,
        batch: Option<(&Batch, usize)>,
        pending: Option<Frame>,
        samples: &mut u64,
    ) -> Result<f32, HeterpsError> {
        let plan = self.stages[self.stage];
        let mine: Vec<usize> = (self.replica..self.micro_batches)
            .step_by(plan.replicas)
            .collect();
        let batches = batch.map(|b| b.0.split(mine.len())).unwrap_or_default();
        let global = batch.map_or(0, |b| b.1);
        let mut links = ProcessLinks {
            links: &mut self.links,
            stages: &self.stages,
            stage: self.stage,
            micro: &mine,
            batches: &batches,
            global,
            pending,
            step: self.progress.steps,
            samples: 0,
        };
        let table: &dyn EmbeddingTable = match &self.table {
            Some(t) => t,
            None => &NoRows,
        };
        let model = &self.model;
        let (stage, replica) = (self.stage, self.replica);
        let out = replica_pass(
            model,
            table,
            (plan.first, plan.last, plan.replicas),
            &mine,
            &mut links,
        )
        .map_err(|e| match e {
            ReplicaEnd::Failed(e) => HeterpsError::Replica {
                stage,
                replica,
                message: e.to_string(),
            },
            ReplicaEnd::NeighbourStopped(m) => HeterpsError::Replica {
                stage,
                replica,
                message: m,
            },
        })?;
        *samples += links.samples;
        let t = Instant::now();
        if let (Some(dense), Some(grads)) = (&mut self.dense, out.dense) {
            dense.step(&[grads])?;
        }
        if let Some(table) = &self.table {
            let mut rows = out.rows;
            rows.sort_by_key(|r| r.0);
            let keys: Vec<u64> = rows.iter().flat_map(|r| r.1.iter().copied()).collect();
            let grads: Vec<f32> = rows.iter().flat_map(|r| r.2.iter().copied()).collect();
            table.push(&keys, &grads, 1.0)?;
        }
        self.busy += out.busy + t.elapsed().as_secs_f64();
        self.progress.steps += 1;
        let mut losses = out.losses;
        losses.sort_by_key(|l| l.0);
        Ok(losses.iter().map(|l| l.1).sum())
    }

    /// Whether training is over: the first stage has finished its epochs.
    pub fn done(&self) -> bool {
        self.done
    }

    /// How far training has come (a later stage learns the first stage's epoch and
    /// batch when a `train` call ends).
    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// Writes a checkpoint under `dir` (every process calls it, between
    /// [`train`](CtrStageProcess::train) calls): each process its stage's dense layers,
    /// its block of the stage's optimizer state and the progress in
    /// `dir/step-{steps}-epoch-{e}-batch-{b}/{stage}-{replica}.safetensors`, process 0
    /// the table too. Once
    /// every process has written its file, process 0 points `dir/latest` at them
    /// (atomically) and removes the earlier ones, so a job that dies while saving resumes
    /// from the previous complete checkpoint. `dir` must be one directory for every process (one machine, or a
    /// shared file system).
    pub fn save(&mut self, dir: &Path) -> Result<(), HeterpsError> {
        if let Some(why) = &self.failed {
            return Err(HeterpsError::Mismatch(format!(
                "an earlier step failed ({why}): nothing to save"
            )));
        }
        // Named by the whole progress, so a save never rewrites the one `latest` names.
        let p = self.progress;
        let name = format!("step-{}-epoch-{}-batch-{}", p.steps, p.epoch, p.batch);
        let at = dir.join(&name);
        let io = |what: &Path, e: std::io::Error| {
            HeterpsError::Mismatch(format!("checkpoint {}: {e}", what.display()))
        };
        self.hold_dir(dir, "save")?;
        std::fs::create_dir_all(&at).map_err(|e| io(&at, e))?;
        let mut file = CheckpointWriter::new();
        file.manifest(Manifest {
            job: self.job.clone(),
            step: p.steps,
            writer: self.writer(),
        });
        write_dense(&mut file, &self.model);
        if let Some(dense) = &self.dense {
            write_state(&mut file, "stage", &dense.state()?)?;
        }
        if self.process == 0 {
            let table = self.table.as_ref().ok_or_else(|| {
                HeterpsError::Mismatch("process 0 is the first stage's and holds the table".into())
            })?;
            file.table(&table.export()?)?;
            let job_file = at.join(JOB_FILE);
            std::fs::write(&job_file, &self.job).map_err(|e| io(&job_file, e))?;
        }
        file.counters("progress", &[p.epoch, p.batch, p.steps])?;
        file.save(&at.join(self.file_name()))?;
        let processes = stage_processes(&self.stages);
        let saved = format!("heterps/pipe/{}/saved", self.name);
        self.store
            .barrier(&saved, processes, self.timeout)
            .map_err(store_error)?;
        if self.process == 0 {
            let (tmp, latest) = (dir.join("latest.tmp"), dir.join("latest"));
            std::fs::write(&tmp, format!("{name}\n{}\n", self.job)).map_err(|e| io(&tmp, e))?;
            std::fs::rename(&tmp, &latest).map_err(|e| io(&latest, e))?;
        }
        // Nobody reads `latest` (or leaves) before it names this checkpoint.
        self.store
            .barrier(&saved, processes, self.timeout)
            .map_err(store_error)?;
        if self.process == 0 {
            // This job's earlier checkpoints are superseded; another job's are not this
            // job's to remove (best effort: a leftover costs disk, not correctness).
            for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))?.flatten() {
                let old = entry.file_name().to_string_lossy().into_owned();
                let ours = std::fs::read_to_string(entry.path().join(JOB_FILE))
                    .is_ok_and(|job| job == self.job);
                if old.starts_with("step-") && old != name && ours {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        Ok(())
    }

    /// Process 0 takes the checkpoint directory `dir` for this job (once; other
    /// processes of the job write there under its hold): a directory another running
    /// job holds is refused, naming it, before anything is read or written. The hold
    /// ends with the process (a crashed job leaves no hold).
    fn hold_dir(&mut self, dir: &Path, doing: &str) -> Result<(), HeterpsError> {
        if self.process != 0 || self.dir_lock.as_ref().is_some_and(|(d, _)| d == dir) {
            return Ok(());
        }
        let fail =
            |what: String| HeterpsError::Mismatch(format!("checkpoint {}: {what}", dir.display()));
        std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
        let path = dir.join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| fail(format!("cannot open its lock {}: {e}", path.display())))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                return Err(fail(format!(
                    "another running job ({}) holds it: this job ({}) cannot {doing} there \
                     (give each job its own directory)",
                    holder.trim(),
                    self.job
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(fail(format!("cannot lock {}: {e}", path.display())));
            }
        }
        let mut f = &file;
        use std::io::Write;
        f.set_len(0)
            .and_then(|()| {
                f.write_all(format!("{} (pid {})", self.job, std::process::id()).as_bytes())
            })
            .map_err(|e| fail(format!("cannot write its lock {}: {e}", path.display())))?;
        self.dir_lock = Some((dir.to_path_buf(), file));
        Ok(())
    }

    /// The role this process's checkpoint files name.
    fn writer(&self) -> String {
        format!("stage {} replica {}", self.stage, self.replica)
    }

    /// This process's file in a checkpoint.
    fn file_name(&self) -> String {
        checkpoint_file(self.stage, self.replica)
    }

    /// The complete checkpoint under `dir` (the one `dir/latest` names), if any.
    pub fn latest_checkpoint(dir: &Path) -> Result<Option<PathBuf>, HeterpsError> {
        Ok(latest(dir)?.map(|(at, _)| at))
    }

    /// The table of the checkpoint under `dir` (rows `dim` wide), if there is one: what
    /// the processes serving the table start from.
    pub fn checkpointed_table(
        dir: &Path,
        dim: usize,
    ) -> Result<Option<crate::data::TableSnapshot>, HeterpsError> {
        let Some((at, job)) = latest(dir)? else {
            return Ok(None);
        };
        let mut file = CheckpointReader::open(&at.join(checkpoint_file(0, 0)))?;
        check_manifest(&file, &job, "stage 0 replica 0")?;
        Ok(Some(file.table(dim)?))
    }

    /// Continues from the checkpoint under `dir` (see [`save`](CtrStageProcess::save)),
    /// if there is one, written by a job with the same plan: this stage's dense layers
    /// and optimizer state and the progress are replaced (everything read and checked
    /// first). The table is not: the processes serving it start from the checkpoint's
    /// ([`CtrStageProcess::checkpointed_table`]; [`from_env`](CtrStageProcess::from_env)
    /// does both). Returns whether there was a checkpoint.
    pub fn restore(&mut self, dir: &Path) -> Result<bool, HeterpsError> {
        self.hold_dir(dir, "resume")?;
        let Some((at, job)) = latest(dir)? else {
            return Ok(false);
        };
        let mut file = CheckpointReader::open(&at.join(self.file_name()))?;
        check_manifest(&file, &job, &self.writer())?;
        let dense = read_dense(&mut file, &self.model)?;
        let plan = self.stages[self.stage];
        let state = match &self.dense {
            Some(dp) => {
                // The stage's parameters are the model's variables of its layers, in order.
                let (first, last) = (plan.first.max(1), plan.last);
                let weights = dense[2 * (first - 1)..2 * last].to_vec();
                let what = format!("stage {}", self.stage);
                Some(read_state(
                    &mut file,
                    "stage",
                    &dp.state()?,
                    weights,
                    &what,
                )?)
            }
            None => None,
        };
        let [epoch, batch, steps] = file.counters("progress", 3)?[..] else {
            unreachable!("three counters were checked");
        };
        file.expect_step(steps)?;
        if let (Some(dp), Some(state)) = (&mut self.dense, &state) {
            dp.load_state(state)?;
        }
        self.progress = Progress {
            epoch,
            batch,
            steps,
        };
        Ok(true)
    }

    /// Stops taking steps and closes the connections (neighbours waiting on this
    /// replica stop at once instead of at their timeout).
    fn fail(&mut self, why: String) {
        self.failed.get_or_insert(why);
        self.links.shutdown();
        self.dense = None;
        self.table = None;
    }

    /// Puts the whole trained model on process 0: every stage's first replica publishes
    /// its layers through the store and process 0 loads them into its model. Returns
    /// whether this is process 0 (whose [`model`](CtrStageProcess::model) is then the
    /// trained network). Every process calls it.
    pub fn gather_model(&mut self) -> Result<bool, HeterpsError> {
        let plan = self.stages[self.stage];
        let vars = self.model.stage_vars(plan.first, plan.last);
        let name = &self.name;
        let key = |s: usize, v: usize| format!("heterps/pipe/{name}/model/{s}/{v}");
        // Process 0 holds the first stage's layers itself.
        if self.replica == 0 && self.stage > 0 {
            for (v, var) in vars.iter().enumerate() {
                let values = var
                    .as_tensor()
                    .flatten_all()
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(TrainError::from)?;
                let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
                self.store
                    .set(&key(self.stage, v), &bytes)
                    .map_err(store_error)?;
            }
        }
        if self.process != 0 {
            return Ok(false);
        }
        for (s, st) in self.stages.iter().enumerate().skip(1) {
            for (v, var) in self.model.stage_vars(st.first, st.last).iter().enumerate() {
                let bytes = self
                    .store
                    .get(&key(s, v), self.timeout)
                    .map_err(store_error)?;
                let values: Vec<f32> = bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                let t = Tensor::from_vec(values, var.as_tensor().shape(), var.as_tensor().device())
                    .map_err(|e| {
                        HeterpsError::Mismatch(format!("stage {s}'s layer {v} as published: {e}"))
                    })?;
                var.set(&t).map_err(TrainError::from)?;
            }
        }
        Ok(true)
    }

    /// Waits until every process is done (a process serving a shard must not leave
    /// before the others' last pull), then releases this process's shard.
    pub fn finish(mut self) -> Result<(), HeterpsError> {
        let processes = stage_processes(&self.stages);
        self.store
            .barrier(
                &format!("heterps/pipe/{}/done", self.name),
                processes,
                self.timeout,
            )
            .map_err(|e| HeterpsError::Mismatch(format!("the end-of-job barrier: {e}")))?;
        drop(self.server.take());
        Ok(())
    }
}

/// The file of replica `replica` of stage `stage` in a checkpoint (process 0's,
/// `(0, 0)`, holds the table).
/// The checkpoint `dir/latest` names and the job that wrote it, both checked for shape
/// (a damaged `latest` must not point outside `dir`).
fn latest(dir: &Path) -> Result<Option<(PathBuf, String)>, HeterpsError> {
    let path = dir.join("latest");
    let fail =
        |what: String| HeterpsError::Mismatch(format!("checkpoint {}: {what}", path.display()));
    let text = match std::fs::read(&path) {
        Ok(text) if text.len() <= 256 => {
            String::from_utf8(text).map_err(|_| fail("is not text".into()))?
        }
        Ok(text) => {
            return Err(fail(format!(
                "holds {} bytes, not a checkpoint's name",
                text.len()
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fail(e.to_string())),
    };
    let mut lines = text.lines();
    let (name, job) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    let numbers = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let parts: Vec<&str> = name.split('-').collect();
    let named = matches!(parts.as_slice(), ["step", s, "epoch", e, "batch", b] if numbers(s) && numbers(e) && numbers(b));
    let hex = job
        .strip_prefix("job-")
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    if !named || !hex || lines.next().is_some() {
        return Err(fail(format!(
            "is damaged ({text:?}): it should name a checkpoint `step-S-epoch-E-batch-B` and its job"
        )));
    }
    Ok(Some((dir.join(name), job.to_string())))
}

/// Refuses a checkpoint file that another job wrote than the one `latest` names (two
/// jobs' files mixed in one checkpoint), or another role than `writer`.
fn check_manifest(file: &CheckpointReader, job: &str, writer: &str) -> Result<(), HeterpsError> {
    if file.manifest().job != job {
        return Err(file
            .error(format!(
                "was written by job {}, but the checkpoint is job {job}'s (two jobs wrote this \
             directory?)",
                file.manifest().job
            ))
            .into());
    }
    Ok(file.expect_writer(writer)?)
}

fn checkpoint_file(stage: usize, replica: usize) -> String {
    format!("{stage}-{replica}.safetensors")
}

/// What a frame kind is called in messages.
fn frame_name(kind: u8) -> &'static str {
    match kind {
        ACTIVATION => "activation",
        GRADIENT => "gradient",
        END => "end of training",
        PAUSE => "pause",
        _ => "unknown frame",
    }
}

/// An error ending training or telling the next stage so.
fn end_error(e: ReplicaEnd) -> HeterpsError {
    match e {
        ReplicaEnd::Failed(e) => e,
        ReplicaEnd::NeighbourStopped(m) => HeterpsError::Mismatch(m),
    }
}

/// A replica's links to its neighbours for one step.
struct ProcessLinks<'a, 'b> {
    links: &'a mut Neighbours,
    stages: &'a [StagePlan],
    stage: usize,
    /// This replica's micro-batches (global indices).
    micro: &'a [usize],
    /// A first-stage replica's micro-batches' records.
    batches: &'b [Batch],
    /// Records in the step's global batch (first stage).
    global: usize,
    /// The step's first frame, already read (a later stage reads it to see whether
    /// training is over).
    pending: Option<Frame>,
    /// Steps taken before this one.
    step: u64,
    /// Records of the micro-batches received so far.
    samples: u64,
}

impl ProcessLinks<'_, '_> {
    fn prev(&self, j: usize) -> usize {
        self.micro[j] % self.stages[self.stage - 1].replicas
    }

    fn next(&self, j: usize) -> Option<usize> {
        let s = self.stages.get(self.stage + 1)?;
        Some(self.micro[j] % s.replicas)
    }

    /// Checks that `frame` is micro-batch `j`'s of `kind`.
    fn expect(&self, frame: Frame, kind: u8, j: usize, from: String) -> Result<Frame, ReplicaEnd> {
        if frame.kind != kind || frame.micro != self.micro[j] as u64 {
            let what = frame_name;
            return Err(ReplicaEnd::Failed(HeterpsError::Mismatch(format!(
                "expected micro-batch {}'s {} from {from}, got micro-batch {}'s {} (do the \
                 processes run the same plan?)",
                self.micro[j],
                what(kind),
                frame.micro,
                what(frame.kind)
            ))));
        }
        Ok(frame)
    }
}

impl<'b> Links<'b> for ProcessLinks<'_, 'b> {
    fn input(&mut self, j: usize) -> Result<(StageInput<'b>, Micro<'b>), ReplicaEnd> {
        if self.stage == 0 {
            let batch: &'b Batch = &self.batches[j];
            let weight = batch.len() as f64 / self.global as f64;
            return Ok((
                StageInput::Batch(batch),
                Micro {
                    labels: Cow::Borrowed(&batch.labels),
                    weight,
                },
            ));
        }
        let r = self.prev(j);
        let frame = match self.pending.take() {
            Some(f) => f,
            None => self.links.receive(Side::Prev, r)?,
        };
        let from = format!("stage {} replica {r}", self.stage - 1);
        let mut frame = self.expect(frame, ACTIVATION, j, from)?;
        let labels = std::mem::take(&mut frame.labels);
        self.samples += labels.len() as u64;
        let weight = frame.weight;
        Ok((
            StageInput::Activation(frame.tensor()?),
            Micro {
                labels: Cow::Owned(labels),
                weight,
            },
        ))
    }

    fn send_activation(
        &mut self,
        j: usize,
        output: &Tensor,
        micro: &Micro<'b>,
    ) -> Result<(), ReplicaEnd> {
        let Some(r) = self.next(j) else {
            // The last stage's output is the micro-batch's loss: a step that diverged
            // stops here, before any gradient leaves and so before anything is updated.
            let loss = output.to_scalar::<f32>().map_err(TrainError::from)?;
            if !loss.is_finite() {
                return Err(ReplicaEnd::Failed(
                    TrainError::Diverged {
                        step: self.step,
                        loss,
                    }
                    .into(),
                ));
            }
            return Ok(());
        };
        let mut frame = Frame::of(ACTIVATION, self.micro[j], output)?;
        frame.weight = micro.weight;
        frame.labels = micro.labels.to_vec();
        self.links.send(Side::Next, r, &frame)
    }

    fn gradient(&mut self, j: usize) -> Result<Option<Tensor>, ReplicaEnd> {
        let Some(r) = self.next(j) else {
            return Ok(None);
        };
        let frame = self.links.receive(Side::Next, r)?;
        let from = format!("stage {} replica {r}", self.stage + 1);
        let frame = self.expect(frame, GRADIENT, j, from)?;
        Ok(Some(frame.tensor()?))
    }

    fn send_gradient(&mut self, j: usize, grad: Tensor) -> Result<(), ReplicaEnd> {
        let r = self.prev(j);
        let frame = Frame::of(GRADIENT, self.micro[j], &grad)?;
        self.links.send(Side::Prev, r, &frame)
    }
}
