//! The data-parallel trainer: P replicas on P rank threads (or one per MPI process), one
//! fused optimizer step.

use super::engine::Engine;
use super::error::TrainError;
use super::optimizer::{Contract, Optimizer};
use super::state::{StateTensor, TrainerState};
use candle_core::backprop::GradStore;
use candle_core::{DType as CandleDType, Layout, Storage, Tensor, Var};
use coconet_core::half::bf16;
use coconet_core::schedule::{Schedule, candidates};
use coconet_core::{Binding, Bindings};
use coconet_core::{Program, ValueId};
use coconet_runtime::Plan;
use coconet_runtime::cpu::{Job, RunOptions};
use std::time::{Duration, Instant};

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

/// An optimizer over P replicas of a model, data parallel on P rank threads with
/// coconet's fused sharded step (see the module docs).
pub struct DataParallel {
    job: Engine,
    /// The models this process holds: one per local rank, or one all of them share.
    replicas: Vec<Vec<Var>>,
    /// The ranks whose gradients this process passes to [`DataParallel::step`].
    local: Vec<usize>,
    /// The replicas' dtype: f32, or bf16 with f32 master weights in the job.
    dtype: CandleDType,
    scalars: Vec<(String, ValueId)>,
    step_input: Option<ValueId>,
    state: Vec<ValueId>,
    schedule: Schedule,
    steps: u64,
    times: StepTimes,
    /// The parameters' names, where known (errors name them).
    names: Vec<String>,
    /// Whether a parameter without a gradient counts as a zero gradient.
    missing_as_zero: bool,
    /// bf16 replicas on a GPU: each local replica's f32 master weights, candle tensors on
    /// its GPU that the step updates in place (made at the first step or a load).
    #[cfg(feature = "cuda")]
    masters: Vec<Vec<Tensor>>,
}

impl DataParallel {
    /// Prepares the step for replicas given as candle-nn `VarMap`s (from [`replicate`]):
    /// each replica's parameters in the order of their names, which must be the same in
    /// every map. Errors name parameters by these names.
    ///
    /// [`replicate`]: super::replicate
    pub fn from_varmaps(
        replicas: &[candle_nn::VarMap],
        optimizer: impl Into<Optimizer>,
    ) -> Result<DataParallel, TrainError> {
        let named: Vec<Vec<(String, Var)>> =
            replicas.iter().map(super::replicas::named_vars).collect();
        let names: Vec<String> = named
            .first()
            .map(|f| f.iter().map(|(n, _)| n.clone()).collect())
            .unwrap_or_default();
        for (r, replica) in named.iter().enumerate() {
            if let Some(n) = replica
                .iter()
                .map(|(n, _)| n)
                .zip(&names)
                .find(|(a, b)| a != b)
                .map(|(a, _)| a)
                .or_else(|| (replica.len() != names.len()).then_some(&names[0]))
            {
                return Err(TrainError::Mismatch(format!(
                    "replica {r}'s parameters are not replica 0's (first difference at `{n}`)"
                )));
            }
        }
        let vars = named
            .into_iter()
            .map(|r| r.into_iter().map(|(_, v)| v).collect())
            .collect();
        let mut trainer = DataParallel::new(vars, optimizer)?;
        trainer.names = names;
        Ok(trainer)
    }

    /// Lets a parameter have no gradient in a rank's `GradStore` (a branch of the model
    /// not taken on that rank's batch, as torch DDP's `find_unused_parameters`): it
    /// counts as a zero gradient in the average. Off by default: a missing gradient is
    /// more often a bug, and the error names the parameter.
    pub fn allow_missing_gradients(&mut self, allow: bool) {
        self.missing_as_zero = allow;
    }

    /// Each rank's backward pass from its loss (`losses[r]`, on a thread of its own),
    /// then [`DataParallel::step`]: candle's `Optimizer::backward_step`, one loss per
    /// local rank.
    pub fn backward_step(&mut self, losses: &[Tensor]) -> Result<(), TrainError> {
        if losses.len() != self.local.len() {
            return Err(TrainError::Mismatch(format!(
                "{} losses for {} ranks",
                losses.len(),
                self.local.len()
            )));
        }
        // candle's CUDA device queues on the calling thread's stream (per-thread
        // streams): a rank thread's backward pass must come after the forward queued
        // here, and the step after every rank's backward pass.
        let settle = |t: &Tensor| t.device().synchronize();
        if losses.len() > 1 {
            losses.iter().try_for_each(settle)?;
        }
        let grads = super::replicas::for_each_rank(losses.len(), |r| {
            let g = losses[r].backward()?;
            if losses.len() > 1 {
                settle(&losses[r])?;
            }
            Ok(g)
        })?;
        self.step(&grads)
    }

    /// Replica `r`'s gradient of parameter `i` (`var`) in `store`, checked: zeros where it
    /// has none and that is allowed.
    fn gradient(
        &self,
        store: &GradStore,
        r: usize,
        i: usize,
        var: &Var,
    ) -> Result<Tensor, TrainError> {
        let g = match store.get(var.as_tensor()) {
            Some(g) => g.clone(),
            None if self.missing_as_zero => var.as_tensor().zeros_like()?,
            None => {
                return Err(TrainError::Mismatch(format!(
                    "no gradient for {} of replica {r} (it took no part in the loss; \
                     DataParallel::allow_missing_gradients counts that as zero)",
                    self.param(i)
                )));
            }
        };
        if g.shape() != var.shape() || g.dtype() != self.dtype {
            return Err(TrainError::Mismatch(format!(
                "the gradient of {} of replica {r} is {:?} {:?}, the parameter {:?} {:?} \
                 (did its shape change?)",
                self.param(i),
                g.dtype(),
                g.shape(),
                self.dtype,
                var.shape()
            )));
        }
        Ok(g)
    }

    /// The mean over every rank of a value each rank computed (its loss, for logging):
    /// `mine` holds this process's ranks' values (one per replica here, or this
    /// process's one). Across processes every process must call it at the same point;
    /// each gets the same result (the values are added in rank order).
    pub fn mean_over_ranks(&mut self, mine: &[f64]) -> Result<f64, TrainError> {
        if mine.len() != self.local.len() {
            return Err(TrainError::Mismatch(format!(
                "{} values for the {} ranks of this process",
                mine.len(),
                self.local.len()
            )));
        }
        let all = self.job.all_gather(mine)?;
        Ok(all.iter().sum::<f64>() / all.len() as f64)
    }

    /// How errors name parameter `i`.
    fn param(&self, i: usize) -> String {
        match self.names.get(i) {
            Some(n) => format!("`{n}`"),
            None => format!("parameter {i}"),
        }
    }

    /// Prepares the step for `replicas[r]`, rank r's parameters (the same `Var`s in the
    /// same order on every rank, all f32 or all bf16, on the CPU, with identical values).
    ///
    /// bf16 replicas train in mixed precision: the job keeps f32 master weights, the
    /// bf16 gradients are widened on the way in and the new weights rounded to bf16 on
    /// the way out.
    pub fn new(
        replicas: Vec<Vec<Var>>,
        optimizer: impl Into<Optimizer>,
    ) -> Result<DataParallel, TrainError> {
        let ranks = replicas.len();
        DataParallel::prepare(replicas, ranks, optimizer.into(), Place::Threads)
    }

    /// Prepares the step for this process's rank of an MPI job (feature `mpi`): `vars`
    /// is this process's model (every process passes the same parameters in the same
    /// order, with the same initial values — checked across processes), and each
    /// [`DataParallel::step`] takes this process's `GradStore` only. Memory per process:
    /// the model and its gradient once, 1/P of the optimizer state.
    #[cfg(feature = "mpi")]
    pub fn mpi(
        vars: Vec<Var>,
        world: ::mpi::topology::SimpleCommunicator,
        optimizer: impl Into<Optimizer>,
    ) -> Result<DataParallel, TrainError> {
        use ::mpi::traits::Communicator;
        let ranks = world.size() as usize;
        DataParallel::prepare(vec![vars], ranks, optimizer.into(), Place::Mpi(world))
    }

    /// Prepares the step for this process's rank of a job whose processes are
    /// connected by `tcp` (made with [`Tcp::from_env`](coconet_runtime::cpu::Tcp::from_env)
    /// under `coconet-launch` or torchrun): as `DataParallel::mpi` (feature `mpi`), without MPI.
    pub fn tcp(
        vars: Vec<Var>,
        tcp: coconet_runtime::cpu::Tcp,
        optimizer: impl Into<Optimizer>,
    ) -> Result<DataParallel, TrainError> {
        let ranks = tcp.size();
        DataParallel::prepare(vec![vars], ranks, optimizer.into(), Place::Tcp(tcp))
    }

    /// Prepares the step for this process's rank of a job of one process per GPU
    /// (feature `candle-cuda`), started by `coconet-launch` or torchrun: `vars` is this
    /// process's model on its GPU (`LOCAL_RANK`; every process passes the same
    /// parameters in the same order, with the same initial values — checked across
    /// processes), `gpus` the job ([`Distributed::from_env`]). Each
    /// [`DataParallel::step`] takes this process's `GradStore` only, lends the model's
    /// and the gradient's device memory in place, and queues the fused step on candle's
    /// stream: the gradients reduce-scattered and the weights all-gathered through NCCL
    /// (or mapped peer memory on one machine), 1/P of the optimizer state per GPU.
    ///
    /// [`Distributed::from_env`]: coconet_runtime::cuda::Distributed::from_env
    #[cfg(feature = "cuda")]
    pub fn distributed(
        vars: Vec<Var>,
        gpus: coconet_runtime::cuda::Distributed,
        optimizer: impl Into<Optimizer>,
    ) -> Result<DataParallel, TrainError> {
        let on = vars
            .first()
            .and_then(|v| super::cuda::ordinal(v.as_tensor()));
        if on != Some(gpus.ordinal()) {
            return Err(TrainError::Mismatch(format!(
                "DataParallel::distributed: this process (rank {}) runs on GPU {}, the \
                 model's parameters are {}",
                gpus.rank(),
                gpus.ordinal(),
                match on {
                    Some(g) => format!("on GPU {g}"),
                    None => "not on a GPU".into(),
                }
            )));
        }
        let ranks = gpus.size();
        DataParallel::prepare(
            vec![vars],
            ranks,
            optimizer.into(),
            Place::Gpus(Box::new(gpus)),
        )
    }

    /// Prepares the step for one model whose `vars` every one of `ranks` rank threads
    /// uses (each computing gradients on its own shard with the same `Var`s, which is
    /// safe: a backward pass only reads them). The step is the same as with replicas,
    /// but the new weights are copied out once instead of once per rank, and the model
    /// is held once.
    pub fn shared(
        vars: Vec<Var>,
        ranks: usize,
        optimizer: impl Into<Optimizer>,
    ) -> Result<DataParallel, TrainError> {
        if ranks == 0 {
            return Err(TrainError::Mismatch("no ranks".into()));
        }
        DataParallel::prepare(vec![vars], ranks, optimizer.into(), Place::Threads)
    }

    fn prepare(
        replicas: Vec<Vec<Var>>,
        ranks: usize,
        optimizer: Optimizer,
        place: Place,
    ) -> Result<DataParallel, TrainError> {
        optimizer.validate()?;
        let optimizer = optimizer.to_program();
        let contract = optimizer.contract()?;
        let (dtype, weights) = check_replicas(&replicas)?;
        let n: usize = weights.iter().map(Vec::len).sum();
        let zero_grad: Vec<Vec<f32>> = weights.iter().map(|w| vec![0.0; w.len()]).collect();
        let grads = match place {
            Place::Threads => Binding::per_rank_pieces(&vec![zero_grad; ranks]),
            _ => Binding::this_rank_pieces(&zero_grad),
        };
        let p = optimizer.program();
        let zeros = vec![0.0f32; n];
        let mut bindings = Bindings::new()
            .dim(&contract.dim, n)
            .tensor("g", grads)
            .tensor("w", Binding::pieces(&weights));
        for &s in &contract.state {
            bindings = bindings.tensor(&p.label(s), Binding::global(&zeros));
        }
        let dtype_of = |name: &str| p.node(p.find(name).expect("checked")).ty.dtype;
        for (name, value) in &contract.scalars {
            bindings = bindings.scalar_as(name, dtype_of(name), *value);
        }
        if contract.has_step {
            bindings = bindings.scalar_as("step", dtype_of("step"), 1.0);
        }
        let schedule = fused_schedule(p, &contract);
        let plan = Plan::lower(&schedule, ranks, bindings.dims())?;
        #[cfg(feature = "cuda")]
        let on_gpu = super::cuda::ordinal(replicas[0][0].as_tensor());
        #[cfg(not(feature = "cuda"))]
        let on_gpu: Option<usize> = None;
        let job = match place {
            Place::Threads if on_gpu.is_some() => gpu_engine(on_gpu, &plan, &bindings)?,
            Place::Threads => Engine::Threads(Job::new(&plan, &bindings, RunOptions::default())?),
            Place::Tcp(tcp) => Engine::Tcp(coconet_runtime::cpu::ProcessJob::new(
                &plan, &bindings, tcp,
            )?),
            #[cfg(feature = "cuda")]
            Place::Gpus(backend) => {
                use coconet_runtime::Backend;
                let job = backend.prepare(&plan, &bindings)?;
                Engine::CudaRank(Box::new(job), backend)
            }
            #[cfg(feature = "mpi")]
            Place::Mpi(world) => Engine::Mpi(coconet_runtime::mpi::MpiJob::new(
                &plan,
                &bindings,
                world.into(),
            )?),
        };
        let id = |name: &str| p.find(name).expect("checked by the contract");
        Ok(DataParallel {
            local: job.local_ranks(),
            job,
            replicas,
            dtype,
            scalars: contract
                .scalars
                .iter()
                .map(|(name, _)| (name.clone(), id(name)))
                .collect(),
            step_input: contract.has_step.then(|| id("step")),
            state: contract.state,
            schedule,
            steps: 0,
            times: StepTimes::default(),
            names: Vec::new(),
            missing_as_zero: false,
            #[cfg(feature = "cuda")]
            masters: Vec::new(),
        })
    }

    /// The schedule the step runs (named `fuse(RS-C-AG)` unless the program has none);
    /// its program is what the step computes, bit for bit (a norm for clipping is summed
    /// per rank slice, then across ranks, so it may differ from the program as written
    /// in the last bits).
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Sets scalar input `name` of the optimizer (e.g. `lr`, for a schedule) for the
    /// next steps.
    pub fn set_scalar(&mut self, name: &str, value: f64) -> Result<(), TrainError> {
        let id = self
            .scalars
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, id)| id)
            .ok_or_else(|| {
                let names: Vec<&str> = self.scalars.iter().map(|(n, _)| n.as_str()).collect();
                TrainError::Mismatch(format!(
                    "the optimizer has no scalar `{name}` (it has {})",
                    names.join(", ")
                ))
            })?;
        let dtype = self.job.plan().program().node(id).ty.dtype;
        self.job.set_scalar_value(id, dtype.round(value))?;
        Ok(())
    }

    /// Sets the learning rate (`lr`) of the next steps.
    pub fn set_learning_rate(&mut self, lr: f64) -> Result<(), TrainError> {
        check_finite_nonnegative("learning rate", lr)?;
        self.set_scalar("lr", lr)
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Where the steps' time went so far.
    pub fn times(&self) -> StepTimes {
        self.times
    }

    /// Times the step of a trainer of one process per rank (`DataParallel::mpi`,
    /// [`DataParallel::tcp`]) under each of `knobs` with the other processes (every
    /// process calls it with the same knobs), and keeps the fastest: the pipelined
    /// rounds of its fused collective suit the transport and the machine. The step is
    /// timed on the job's own gradient buffer (zeros: the trainer lends each step's
    /// gradients). The model, the optimizer state and the step count are as they were
    /// afterwards, on success and where another process failed; a failure of this
    /// process's run leaves the trainer unusable, as a failed step does. The choice is
    /// cached as [`tune_processes`](coconet_runtime::tune::tune_processes) says.
    ///
    /// ```no_run
    /// # fn f(trainer: &mut coconet_candle::DataParallel) -> Result<(), coconet_candle::TrainError> {
    /// use coconet_runtime::tune::{ProcessKnobs, TuneOptions};
    /// let tuning = trainer.tune(&ProcessKnobs::rounds(&[32, 128, 512]), &TuneOptions::default())?;
    /// println!("{tuning}");
    /// # Ok(()) }
    /// ```
    pub fn tune(
        &mut self,
        knobs: &[coconet_runtime::tune::ProcessKnobs],
        options: &coconet_runtime::tune::TuneOptions,
    ) -> Result<coconet_runtime::tune::Tuning, TrainError> {
        match self.job.tune(knobs, options) {
            Some(tuning) => Ok(tuning?),
            None if self.job.on_gpu() => Err(TrainError::Mismatch(
                "tune: the processes' transport knobs are the CPU trainers'; on a GPU the \
                 step's exchanges are NCCL's or mapped peer memory (PeerAccess), chosen when \
                 the backend is made"
                    .into(),
            )),
            None => Err(TrainError::Mismatch(
                "tune: a trainer on rank threads has no transport knobs; tuning applies to \
                 trainers of one process per rank (DataParallel::mpi, DataParallel::tcp)"
                    .into(),
            )),
        }
    }

    /// Replays the step's launches as CUDA graphs from the next step on (`on`), or
    /// launches them one by one (`false`, the default): the same bits, one driver call
    /// for each run of launches instead of one per launch (see
    /// [`PreparedJob::use_graph`](coconet_runtime::cuda::PreparedJob::use_graph)). For
    /// trainers on GPUs (replicas on one GPU, one process per GPU); refused, saying so,
    /// for the CPU trainers.
    pub fn use_cuda_graph(&mut self, on: bool) -> Result<(), TrainError> {
        match &mut self.job {
            #[cfg(feature = "cuda")]
            Engine::Cuda(job) => {
                job.use_graph(on);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Engine::CudaRank(job, _) => {
                job.use_graph(on);
                Ok(())
            }
            _ => Err(TrainError::Mismatch(format!(
                "use_cuda_graph({on}): only trainers on GPUs (DataParallel::new over CUDA \
                 Vars, DataParallel::distributed) replay their step as CUDA graphs"
            ))),
        }
    }

    /// Whether the step's buffers are in memory every rank reads and writes directly:
    /// rank threads, or processes on one machine that share memory
    /// ([`ProcessJob::shares_memory`](coconet_runtime::cpu::ProcessJob::shares_memory));
    /// false where the processes send every byte in messages.
    pub fn shares_memory(&self) -> bool {
        self.job.shares_memory()
    }

    /// Bytes of optimizer state each rank holds (1/P of the model's per state tensor
    /// under the fused schedule).
    pub fn state_bytes_per_rank(&self) -> usize {
        let plan = self.job.plan();
        self.state
            .iter()
            .map(|&s| plan.local_shape(s, self.local[0]).iter().product::<usize>() * 4)
            .sum()
    }

    /// The state to checkpoint: steps, master weights, and the optimizer state this
    /// process holds (see [`TrainerState`]).
    pub fn state(&self) -> Result<TrainerState, TrainError> {
        let weights = self.master_weights()?;
        let p = self.job.plan().program();
        let mut tensors = Vec::with_capacity(self.state.len());
        for &s in &self.state {
            let name = p.label(s);
            let whole = self.replicated_state(s);
            let ranks: Vec<usize> = if whole {
                Vec::new()
            } else {
                self.local.clone()
            };
            let mut data = Vec::new();
            for &r in if whole {
                &self.local[..1]
            } else {
                &self.local[..]
            } {
                data.extend(self.job.read_input(&name, r)?);
            }
            tensors.push(StateTensor { name, ranks, data });
        }
        Ok(TrainerState {
            steps: self.steps,
            weights,
            tensors,
        })
    }

    /// Continues from a checkpoint's `state` (taken by [`DataParallel::state`] from a
    /// trainer of the same model, optimizer, rank count and — under MPI — rank): the
    /// master weights, the optimizer state and the step count are replaced and every
    /// replica's `Var`s set to the weights. Everything is checked before anything is
    /// written.
    pub fn load_state(&mut self, state: &TrainerState) -> Result<(), TrainError> {
        let bad = |m: String| Err(TrainError::Mismatch(format!("checkpoint: {m}")));
        let r0 = self.local[0];
        let params = self.replicas[0].len();
        if state.weights.len() != params {
            return bad(format!(
                "{} parameters, the model has {params}",
                state.weights.len()
            ));
        }
        for (i, w) in state.weights.iter().enumerate() {
            let have = self.replicas[0][i].elem_count();
            if w.len() != have {
                return bad(format!(
                    "parameter {i} has {} elements, the model's {have}",
                    w.len()
                ));
            }
        }
        let p = self.job.plan().program();
        let names: Vec<String> = self.state.iter().map(|&s| p.label(s)).collect();
        let theirs: Vec<&str> = state.tensors.iter().map(|t| t.name.as_str()).collect();
        if names.iter().map(String::as_str).ne(theirs.iter().copied()) {
            return bad(format!(
                "optimizer state {theirs:?}, this optimizer's is {names:?} (another optimizer?)"
            ));
        }
        for (&s, t) in self.state.iter().zip(&state.tensors) {
            let whole = self.replicated_state(s);
            let want: Vec<usize> = if whole {
                Vec::new()
            } else {
                self.local.clone()
            };
            let len: usize = if whole {
                self.job.input_len(&t.name, r0)?
            } else {
                self.local
                    .iter()
                    .map(|&r| Ok(self.job.input_len(&t.name, r)?))
                    .sum::<Result<usize, TrainError>>()?
            };
            if t.ranks != want || t.data.len() != len {
                return bad(format!(
                    "`{}` holds {} elements of ranks {:?}; this trainer needs {len} of ranks {want:?} (another rank count or rank?)",
                    t.name,
                    t.data.len(),
                    t.ranks
                ));
            }
        }
        let local = self.local.clone();
        if self.job.holds_weights() {
            for &r in &local {
                for (i, w) in state.weights.iter().enumerate() {
                    self.job.piece_mut("w", r, i)?.copy_from_slice(w);
                }
            }
        }
        let wholes: Vec<bool> = self
            .state
            .iter()
            .map(|&s| self.replicated_state(s))
            .collect();
        for (whole, t) in wholes.into_iter().zip(&state.tensors) {
            let mut at = 0;
            for &r in &local {
                let n = self.job.input_len(&t.name, r)?;
                let data = if whole {
                    &t.data[..]
                } else {
                    at += n;
                    &t.data[at - n..at]
                };
                self.job.write_input(&t.name, r, data)?;
            }
        }
        self.steps = state.steps;
        for replica in &self.replicas {
            for (var, w) in replica.iter().zip(&state.weights) {
                let t = Tensor::from_slice(w, var.shape(), var.device())?.to_dtype(self.dtype)?;
                var.set(&t)?;
            }
        }
        #[cfg(feature = "cuda")]
        if self.job.on_gpu() && self.dtype == CandleDType::BF16 {
            // The f32 masters themselves, not the bf16 weights widened.
            self.masters = self.per_parameter(|i, v| {
                Ok(Tensor::from_slice(
                    &state.weights[i],
                    v.shape(),
                    v.device(),
                )?)
            })?;
        }
        Ok(())
    }

    /// The f32 master weights, one vector per parameter: the job's (rank threads,
    /// processes) or, where the replicas' `Var`s are the weights themselves (on a GPU),
    /// replica 0's.
    fn master_weights(&self) -> Result<Vec<Vec<f32>>, TrainError> {
        let r0 = self.local[0];
        if self.job.holds_weights() {
            (0..self.replicas[0].len())
                .map(|i| Ok(self.job.piece("w", r0, i)?.to_vec()))
                .collect()
        } else {
            #[cfg(feature = "cuda")]
            if let Some(masters) = self.masters.first() {
                return masters
                    .iter()
                    .map(|t| Ok(t.flatten_all()?.to_vec1::<f32>()?))
                    .collect();
            }
            self.replicas[0]
                .iter()
                .map(|v| {
                    Ok(v.as_tensor()
                        .to_dtype(CandleDType::F32)?
                        .flatten_all()?
                        .to_vec1::<f32>()?)
                })
                .collect()
        }
    }

    /// Whether every rank holds state input `s` whole (not a 1/P block).
    fn replicated_state(&self, s: ValueId) -> bool {
        let plan = self.job.plan();
        let global: usize = plan.shape(s).iter().product();
        plan.local_shape(s, self.local[0]).iter().product::<usize>() == global
    }

    /// Sets the `step` scalar (if the program has one) to the number of the step about
    /// to run.
    fn set_step(&mut self) -> Result<(), TrainError> {
        if let Some(id) = self.step_input {
            self.job.set_scalar_value(id, (self.steps + 1) as f64)?;
        }
        Ok(())
    }

    /// One data-parallel step from every rank's gradients (`grads[r]` for replica r).
    /// Every gradient is checked before anything is written; a failed step leaves every
    /// replica's weights as they were.
    pub fn step(&mut self, grads: &[GradStore]) -> Result<(), TrainError> {
        if grads.len() != self.local.len() {
            return Err(TrainError::Mismatch(format!(
                "{} gradient stores for {} ranks{}",
                grads.len(),
                self.local.len(),
                if self.local.len() == 1 && self.local[0] > 0 {
                    " (this process's)"
                } else {
                    ""
                }
            )));
        }
        #[cfg(feature = "cuda")]
        if self.job.on_gpu() {
            return self.step_on_gpu(grads);
        }
        let t = Instant::now();
        let mut found = Vec::with_capacity(self.local.len());
        for (k, store) in grads.iter().enumerate() {
            let r = self.local[k];
            let replica = &self.replicas[k.min(self.replicas.len() - 1)];
            let mut mine = Vec::with_capacity(replica.len());
            for (i, var) in replica.iter().enumerate() {
                mine.push(self.gradient(store, r, i, var)?);
            }
            found.push(mine);
        }
        if self.dtype == CandleDType::F32 {
            // f32 gradients are lent to the job straight from candle's storage.
            let contiguous: Vec<Vec<Tensor>> = found
                .iter()
                .map(|mine| mine.iter().map(cpu_contiguous).collect())
                .collect::<Result<_, _>>()?;
            let held: Vec<Vec<_>> = contiguous
                .iter()
                .map(|mine| mine.iter().map(Tensor::storage_and_layout).collect())
                .collect();
            let slices: Vec<Vec<&[f32]>> = held
                .iter()
                .map(|mine| mine.iter().map(|(s, l)| cpu_slice::<f32>(s, l)).collect())
                .collect::<Result<_, _>>()?;
            self.times.copy_in += t.elapsed();
            let t = Instant::now();
            self.set_step()?;
            self.job.run_with_pieces("g", &slices)?;
            self.times.step += t.elapsed();
        } else {
            for (&r, mine) in self.local.iter().zip(&found) {
                for (i, g) in mine.iter().enumerate() {
                    widen_into(self.job.piece_mut("g", r, i)?, &cpu_contiguous(g)?)?;
                }
            }
            self.times.copy_in += t.elapsed();
            let t = Instant::now();
            self.set_step()?;
            self.job.run()?;
            self.times.step += t.elapsed();
        }
        self.steps += 1;
        let t = Instant::now();
        // Local rank k's weights into replica k (a shared model: the first local rank's).
        let weights: Vec<Vec<&[f32]>> = (0..self.replicas.len())
            .map(|k| {
                (0..self.replicas[k].len())
                    .map(|i| self.job.piece("w", self.local[k], i))
                    .collect()
            })
            .collect::<Result<_, _>>()?;
        let dtype = self.dtype;
        let write = |replica: &[Var], new: &[&[f32]]| -> Result<(), TrainError> {
            for (var, w) in replica.iter().zip(new) {
                let t = match dtype {
                    CandleDType::BF16 => {
                        Tensor::from_iter(w.iter().map(|&x| bf16::from_f32(x)), var.device())?
                            .reshape(var.shape())?
                    }
                    _ => Tensor::from_slice(w, var.shape(), var.device())?,
                };
                var.set(&t)?;
            }
            Ok(())
        };
        let per_replica: usize = weights[0].iter().map(|w| w.len()).sum();
        if self.replicas.len() > 1 && per_replica >= PARALLEL_COPY {
            // Each replica's weights written by its own thread, as each rank would.
            std::thread::scope(|s| {
                let handles: Vec<_> = self
                    .replicas
                    .iter()
                    .zip(&weights)
                    .map(|(replica, new)| {
                        s.spawn(move || {
                            write(replica, new)?;
                            // Queued on this thread's stream (a GPU's per-thread one):
                            // done before the next step's forward on the caller's.
                            if let Some(v) = replica.first() {
                                v.device().synchronize()?;
                            }
                            Ok::<(), TrainError>(())
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .try_for_each(|h| h.join().expect("copy thread"))
            })?;
        } else {
            for (replica, new) in self.replicas.iter().zip(&weights) {
                write(replica, new)?;
            }
        }
        self.times.copy_out += t.elapsed();
        Ok(())
    }
}

/// The engine of replicas on GPU `ordinal`: every rank a virtual rank of it.
#[cfg(feature = "cuda")]
fn gpu_engine(
    ordinal: Option<usize>,
    plan: &Plan,
    bindings: &Bindings,
) -> Result<Engine, TrainError> {
    use coconet_runtime::Backend;
    let gpu = coconet_runtime::cuda::Cuda::new(ordinal.unwrap_or(0))?;
    Ok(Engine::Cuda(Box::new(gpu.prepare(plan, bindings)?)))
}

/// No GPU engine without the `candle-cuda` feature (replicas are on the CPU then).
#[cfg(not(feature = "cuda"))]
fn gpu_engine(_: Option<usize>, _: &Plan, _: &Bindings) -> Result<Engine, TrainError> {
    Err(TrainError::Mismatch(
        "replicas on a GPU need coconet's `candle-cuda` feature".into(),
    ))
}

#[cfg(feature = "cuda")]
impl DataParallel {
    /// [`DataParallel::step`] on replicas in GPU memory: every replica's `Var`s (the `w`
    /// pieces) and gradients (the `g` pieces) lent to the job in place, the run queued
    /// on candle's stream; nothing is copied in or out.
    fn step_on_gpu(&mut self, grads: &[GradStore]) -> Result<(), TrainError> {
        use coconet_runtime::cuda::Lent;
        if self.replicas.len() != self.local.len() {
            return Err(TrainError::Mismatch(
                "DataParallel::shared on a GPU: every rank needs weights of its own there \
                 (make replicas)"
                    .into(),
            ));
        }
        let t = Instant::now();
        // Gradients kept alive (and contiguous) until the run is queued.
        let mut held: Vec<Vec<Tensor>> = Vec::with_capacity(grads.len());
        for (k, store) in grads.iter().enumerate() {
            let r = self.local[k];
            let mut mine = Vec::with_capacity(self.replicas[k].len());
            for (i, var) in self.replicas[k].iter().enumerate() {
                mine.push(self.gradient(store, r, i, var)?.contiguous()?);
            }
            held.push(mine);
        }
        let mixed = self.dtype == CandleDType::BF16;
        if mixed {
            // bf16 replicas: the step reads widened gradients and updates f32 masters
            // (candle's casts, queued on its stream before the step).
            self.make_masters()?;
            for mine in &mut held {
                for g in mine.iter_mut() {
                    *g = g.to_dtype(CandleDType::F32)?;
                }
            }
        }
        let mut lent = Lent::new();
        for (k, (replica, mine)) in self.replicas.iter().zip(&held).enumerate() {
            let r = self.local[k];
            let what = |name: &str, i: usize| format!("{name} of {} of replica {r}", self.param(i));
            let weights: Vec<&Tensor> = if mixed {
                self.masters[k].iter().collect()
            } else {
                replica.iter().map(|v| v.as_tensor()).collect()
            };
            let w = weights
                .into_iter()
                .enumerate()
                .map(|(i, t)| super::cuda::lend(t, &|| what("the weights", i)))
                .collect::<Result<Vec<_>, _>>()?;
            let g = mine
                .iter()
                .enumerate()
                .map(|(i, t)| super::cuda::lend(t, &|| what("the gradient", i)))
                .collect::<Result<Vec<_>, _>>()?;
            lent = lent.pieces("w", r, w).pieces("g", r, g);
        }
        self.times.copy_in += t.elapsed();
        let t = Instant::now();
        self.set_step()?;
        // Queued only: candle's stream waits for the run, so the next forward pass (and
        // the gradients' frees) come after it.
        match &mut self.job {
            Engine::Cuda(job) => drop(job.run_after(&lent, None)?),
            Engine::CudaRank(job, backend) => drop(backend.run_after(job, &lent, None)?),
            _ => unreachable!("called for the GPU engines"),
        }
        drop(lent);
        drop(held);
        if mixed {
            // The new weights rounded to bf16 into the Vars, on candle's stream after
            // the step.
            for (replica, masters) in self.replicas.iter().zip(&self.masters) {
                for (var, master) in replica.iter().zip(masters) {
                    var.set(&master.to_dtype(CandleDType::BF16)?)?;
                }
            }
        }
        self.times.step += t.elapsed();
        self.steps += 1;
        Ok(())
    }

    /// The f32 master weights of bf16 replicas on a GPU, widened from the replicas'
    /// `Var`s where they do not exist yet.
    fn make_masters(&mut self) -> Result<(), TrainError> {
        if self.masters.is_empty() {
            self.masters =
                self.per_parameter(|_, v| Ok(v.as_tensor().to_dtype(CandleDType::F32)?))?;
        }
        Ok(())
    }

    /// `make(i, var)` for every parameter `i` of every local replica.
    fn per_parameter(
        &self,
        make: impl Fn(usize, &Var) -> Result<Tensor, TrainError>,
    ) -> Result<Vec<Vec<Tensor>>, TrainError> {
        self.replicas
            .iter()
            .map(|replica| {
                replica
                    .iter()
                    .enumerate()
                    .map(|(i, v)| make(i, v))
                    .collect()
            })
            .collect()
    }
}

/// Where the ranks run.
enum Place {
    Threads,
    Tcp(coconet_runtime::cpu::Tcp),
    /// One process per GPU (feature `candle-cuda`).
    #[cfg(feature = "cuda")]
    Gpus(Box<coconet_runtime::cuda::Distributed>),
    #[cfg(feature = "mpi")]
    Mpi(::mpi::topology::SimpleCommunicator),
}

/// Elements per replica from which the new weights are written by one thread per
/// replica (below it, spawning threads costs more than the copies).
const PARALLEL_COPY: usize = 1 << 18;

/// Refuses a NaN, infinite or negative value for `what`.
fn check_finite_nonnegative(what: &str, x: f64) -> Result<(), TrainError> {
    if x.is_finite() && x >= 0.0 {
        Ok(())
    } else {
        Err(TrainError::Mismatch(format!(
            "the {what} is {x}; it must be a finite number ≥ 0"
        )))
    }
}

/// Checks that the replicas fit together and returns their dtype and rank 0's weights
/// as f32 (one vector per parameter).
fn check_replicas(replicas: &[Vec<Var>]) -> Result<(CandleDType, Vec<Vec<f32>>), TrainError> {
    let bad = |m: String| TrainError::Mismatch(m);
    let first = replicas.first().ok_or_else(|| bad("no replicas".into()))?;
    let dtype = first
        .first()
        .ok_or_else(|| bad("the model has no parameters".into()))?
        .dtype();
    if !matches!(dtype, CandleDType::F32 | CandleDType::BF16) {
        return Err(bad(format!(
            "parameter 0 is {dtype:?}; the trainer takes f32 or bf16 (with f32 master weights)"
        )));
    }
    let as_f32 = |var: &Var| -> Result<Vec<f32>, TrainError> {
        Ok(var
            .as_tensor()
            .flatten_all()?
            .to_dtype(CandleDType::F32)?
            .to_vec1::<f32>()?)
    };
    // Every parameter on replica 0's first one's device: the CPU, or (feature
    // `candle-cuda`) one GPU.
    let device = first[0].device().clone();
    let placed = |var: &Var| {
        var.device().same_device(&device) && (device.is_cpu() || cfg!(feature = "cuda"))
    };
    let allowed = if cfg!(feature = "cuda") {
        "on the CPU or on one GPU"
    } else {
        "on the CPU"
    };
    let mut weights = Vec::with_capacity(first.len());
    for (i, var) in first.iter().enumerate() {
        if var.dtype() != dtype || !placed(var) || !var.as_tensor().is_contiguous() {
            return Err(bad(format!(
                "parameter {i} is {:?} on {:?}; every parameter must be a contiguous \
                 {dtype:?} tensor {allowed}",
                var.dtype(),
                var.device()
            )));
        }
        weights.push(as_f32(var)?);
    }
    for (r, replica) in replicas.iter().enumerate().skip(1) {
        if replica.len() != first.len() {
            return Err(bad(format!(
                "replica {r} has {} parameters, replica 0 has {}",
                replica.len(),
                first.len()
            )));
        }
        for (i, (var, w0)) in replica.iter().zip(&weights).enumerate() {
            if var.shape() != first[i].shape() || var.dtype() != dtype || !placed(var) {
                return Err(bad(format!(
                    "parameter {i} of replica {r} is {:?} {:?}, replica 0's is {:?} {:?}",
                    var.dtype(),
                    var.shape(),
                    first[i].dtype(),
                    first[i].shape()
                )));
            }
            let w = as_f32(var)?;
            if w.iter()
                .map(|x| x.to_bits())
                .ne(w0.iter().map(|x| x.to_bits()))
            {
                return Err(bad(format!(
                    "parameter {i} of replica {r} differs from replica 0's: replicas must \
                     start from the same weights"
                )));
            }
        }
    }
    Ok((dtype, weights))
}

/// `g` on the CPU with a contiguous layout (itself when it already is: no copy).
fn cpu_contiguous(g: &Tensor) -> Result<Tensor, TrainError> {
    let g = g.to_device(&candle_core::Device::Cpu)?;
    Ok(if g.is_contiguous() {
        g
    } else {
        g.contiguous()?
    })
}

/// The elements of a contiguous CPU tensor's storage, as `T` (its dtype).
fn cpu_slice<'a, T: candle_core::WithDType>(
    storage: &'a Storage,
    layout: &Layout,
) -> Result<&'a [T], TrainError> {
    match (storage, layout.contiguous_offsets()) {
        (Storage::Cpu(cpu), Some((from, to))) => Ok(&cpu.as_slice::<T>()?[from..to]),
        _ => Err(TrainError::Mismatch(
            "a gradient is not a contiguous CPU tensor".into(),
        )),
    }
}

/// Widens bf16 gradient `g` (contiguous, on the CPU) into `dst`.
fn widen_into(dst: &mut [f32], g: &Tensor) -> Result<(), TrainError> {
    let (storage, layout) = g.storage_and_layout();
    for (d, s) in dst.iter_mut().zip(cpu_slice::<bf16>(&storage, layout)?) {
        *d = s.to_f32();
    }
    Ok(())
}

/// The program's fused sharded schedule (reduce-scatter → update of each rank's block
/// with its block of the state → all-gather, in one pass); the unfused sharded one, or
/// the program as written, where the program allows no better.
fn fused_schedule(program: &Program, contract: &Contract) -> Schedule {
    let all = candidates(program, &contract.state);
    let rank = |s: &Schedule| match s.name() {
        "fuse(RS-C-AG)" => 0,
        "RS-C-AG" => 1,
        _ => 2,
    };
    all.into_iter()
        .min_by_key(rank)
        .expect("the program as written is always a candidate")
}
