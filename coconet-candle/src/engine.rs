//! Where the trainer's step runs: P rank threads in this process, or this process's
//! rank of a multi-process job (over TCP, or MPI with feature `mpi`). The trainer sees
//! one interface either way.

use coconet_core::ValueId;
use coconet_runtime::cpu::{Job, ProcessJob, Tcp};
#[cfg(feature = "mpi")]
use coconet_runtime::mpi::MpiJob;
use coconet_runtime::tune::{ProcessKnobs, TuneOptions, Tuning, tune_processes};
use coconet_runtime::{JobData, Plan, RuntimeError};

/// The job behind a trainer.
pub(crate) enum Engine {
    /// Every rank, on rank threads.
    Threads(Job),
    /// This process's rank, over TCP.
    Tcp(ProcessJob<Tcp>),
    /// This process's rank, over MPI.
    #[cfg(feature = "mpi")]
    Mpi(MpiJob),
    /// Every rank as a virtual rank of one GPU, on the replicas' device memory.
    #[cfg(feature = "cuda")]
    Cuda(Box<coconet_runtime::cuda::CudaJob>),
    /// This process's rank of a job of one process per GPU (NCCL between them), on its
    /// replica's device memory.
    #[cfg(feature = "cuda")]
    CudaRank(
        Box<coconet_runtime::cuda::DistributedJob>,
        Box<coconet_runtime::cuda::Distributed>,
    ),
}

/// Why a host view of the job's buffers does not exist on CUDA.
#[cfg(feature = "cuda")]
fn on_device() -> RuntimeError {
    RuntimeError::Read(
        "on CUDA the weights are the replicas' Vars themselves and the optimizer state is \
         in device memory: read them with DataParallel::state"
            .into(),
    )
}

/// `$body` with `$job` bound to the job, whichever engine it is; on CUDA `$cuda` with `$c`
/// bound to the CUDA job (by default an error: no host view of its buffers).
macro_rules! on_job {
    ($engine:expr, $job:ident => $body:expr) => {
        on_job!($engine, $job => $body, _c => return Err(on_device()))
    };
    ($engine:expr, $job:ident => $body:expr, $c:ident => $cuda:expr) => {
        match $engine {
            Engine::Threads($job) => $body,
            Engine::Tcp($job) => $body,
            #[cfg(feature = "mpi")]
            Engine::Mpi($job) => $body,
            #[cfg(feature = "cuda")]
            Engine::Cuda($c) => $cuda,
            #[cfg(feature = "cuda")]
            Engine::CudaRank($c, _) => $cuda,
        }
    };
}

/// `$body` with `$job` bound to a process's job (the rank-thread job handled apart).
macro_rules! on_process {
    ($engine:expr, $job:ident => $body:expr, $threads:ident => $other:expr) => {
        match $engine {
            Engine::Threads($threads) => $other,
            Engine::Tcp($job) => $body,
            #[cfg(feature = "mpi")]
            Engine::Mpi($job) => $body,
            #[cfg(feature = "cuda")]
            Engine::Cuda(_) | Engine::CudaRank(..) => unreachable!("handled before"),
        }
    };
}

impl Engine {
    /// The ranks whose data this process holds, in order.
    pub fn local_ranks(&self) -> Vec<usize> {
        #[cfg(feature = "cuda")]
        match self {
            Engine::Cuda(job) => return (0..job.plan().ranks()).collect(),
            Engine::CudaRank(job, _) => return vec![job.rank()],
            _ => {}
        }
        on_process!(self, job => vec![job.rank()], job => (0..job.plan().ranks()).collect())
    }

    pub fn plan(&self) -> &Plan {
        on_job!(self, job => job.plan(), job => job.plan())
    }

    /// Whether the processes' buffers are in memory they share (rank threads: always).
    pub fn shares_memory(&self) -> bool {
        #[cfg(feature = "cuda")]
        match self {
            Engine::Cuda(_) => return true,
            Engine::CudaRank(..) => return false,
            _ => {}
        }
        on_process!(self, job => job.shares_memory(), _job => true)
    }

    pub fn set_scalar_value(&mut self, id: ValueId, value: f64) -> Result<(), RuntimeError> {
        on_job!(self, job => job.set_scalar_value(id, value), job => job.set_scalar_value(id, value))
    }

    pub fn run(&mut self) -> Result<(), RuntimeError> {
        match self {
            #[cfg(feature = "cuda")]
            Engine::Cuda(job) => job.run_lent(&coconet_runtime::cuda::Lent::new()),
            #[cfg(feature = "cuda")]
            Engine::CudaRank(job, backend) => {
                use coconet_runtime::Backend;
                backend.run(job)
            }
            other => on_process!(other, job => job.run(), job => job.run()),
        }
    }

    /// Runs with input `name` read from `per_local[k]`, the pieces of local rank k.
    pub fn run_with_pieces(
        &mut self,
        name: &str,
        per_local: &[Vec<&[f32]>],
    ) -> Result<(), RuntimeError> {
        #[cfg(feature = "cuda")]
        if self.on_gpu() {
            return Err(on_device());
        }
        on_process!(
            self,
            job => job.run_with_pieces(name, &per_local[0]),
            job => job.run_with_pieces(name, per_local)
        )
    }

    pub fn piece(&self, name: &str, rank: usize, piece: usize) -> Result<&[f32], RuntimeError> {
        on_job!(self, job => job.piece(name, rank, piece))
    }

    pub fn piece_mut(
        &mut self,
        name: &str,
        rank: usize,
        piece: usize,
    ) -> Result<&mut [f32], RuntimeError> {
        on_job!(self, job => job.piece_mut(name, rank, piece))
    }

    /// Rank `rank`'s buffer of input `name` (its block, for a sliced input).
    pub fn input(&self, name: &str, rank: usize) -> Result<&[f32], RuntimeError> {
        on_job!(self, job => job.input(name, rank))
    }

    /// Rank `rank`'s buffer of input `name`, to write.
    pub fn input_mut(&mut self, name: &str, rank: usize) -> Result<&mut [f32], RuntimeError> {
        on_job!(self, job => job.input_mut(name, rank))
    }

    /// Whether the job holds the master weights (`w`) in host memory of its own; on a
    /// GPU the replicas' `Var`s are lent as the weights and stepped in place.
    pub fn holds_weights(&self) -> bool {
        !self.on_gpu()
    }

    /// Whether the job runs on a GPU, on the replicas' own device memory.
    pub fn on_gpu(&self) -> bool {
        #[cfg(feature = "cuda")]
        if let Engine::Cuda(_) | Engine::CudaRank(..) = self {
            return true;
        }
        false
    }

    /// The number of elements of rank `rank`'s buffer of input `name`.
    pub fn input_len(&self, name: &str, rank: usize) -> Result<usize, RuntimeError> {
        let plan = self.plan();
        let id = plan.tensor_input(name)?;
        Ok(plan.local_shape(id, rank).iter().product())
    }

    /// A copy of rank `rank`'s buffer of f32 input `name` (on a GPU: that rank's data
    /// downloaded, nothing else).
    pub fn read_input(&self, name: &str, rank: usize) -> Result<Vec<f32>, RuntimeError> {
        #[cfg(feature = "cuda")]
        if self.on_gpu() {
            use coconet_runtime::cuda::DeviceData;
            let v = self.plan().tensor_input(name)?;
            let mut out = vec![0f32; self.input_len(name, rank)?];
            match self {
                Engine::Cuda(job) => job.read(v, rank, &mut out)?,
                Engine::CudaRank(job, _) => job.read(v, rank, &mut out)?,
                _ => unreachable!("on a GPU"),
            }
            return Ok(out);
        }
        Ok(self.input(name, rank)?.to_vec())
    }

    /// Writes rank `rank`'s buffer of f32 input `name` (its length exactly: checked).
    pub fn write_input(
        &mut self,
        name: &str,
        rank: usize,
        data: &[f32],
    ) -> Result<(), RuntimeError> {
        #[cfg(feature = "cuda")]
        match self {
            Engine::Cuda(job) => return job.write_input_local(name, rank, data),
            Engine::CudaRank(job, _) => return job.write_input_local(name, rank, data),
            _ => {}
        }
        let mine = self.input_mut(name, rank)?;
        if mine.len() != data.len() {
            return Err(RuntimeError::Plan(format!(
                "`{name}` on rank {rank} has {} elements, not {}",
                mine.len(),
                data.len()
            )));
        }
        mine.copy_from_slice(data);
        Ok(())
    }

    /// Every rank's values in rank order: this process's `mine` (one per local rank)
    /// gathered from every process.
    pub fn all_gather(&mut self, mine: &[f64]) -> Result<Vec<f64>, RuntimeError> {
        #[cfg(feature = "cuda")]
        match self {
            Engine::Cuda(_) => return Ok(mine.to_vec()),
            Engine::CudaRank(_, backend) => {
                let bytes: Vec<u8> = mine.iter().flat_map(|x| x.to_le_bytes()).collect();
                let all = backend.all_gather_bytes(&bytes)?;
                return Ok(all
                    .concat()
                    .chunks_exact(8)
                    .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
                    .collect());
            }
            _ => {}
        }
        on_process!(
            self,
            job => Ok(job.all_gather(mine)?.concat()),
            _threads => Ok(mine.to_vec())
        )
    }

    /// Tunes a process's job over `knobs` with its peers; `None` on rank threads.
    pub fn tune(
        &mut self,
        knobs: &[ProcessKnobs],
        options: &TuneOptions,
    ) -> Option<Result<Tuning, RuntimeError>> {
        #[cfg(feature = "cuda")]
        if self.on_gpu() {
            return None;
        }
        on_process!(
            self,
            job => Some(tune_processes(std::slice::from_mut(job), knobs, options)),
            _threads => None
        )
    }
}
