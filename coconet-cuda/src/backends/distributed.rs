//! The backend of a multi-process job (cargo feature `cuda`), started by
//! `coconet-launch` or torchrun: one process and one GPU per rank, on one machine or
//! many. Ranks on one machine whose GPUs can all reach each other map each other's
//! buffers through CUDA IPC (handles shared through the launcher's store) and run the
//! fused kernels on peers' memory directly, meeting at barriers; otherwise they exchange
//! through NCCL, pipelined against the kernels.
//!
//! Not yet run on a GPU (no session so far had one): the mapped and exchanged paths are
//! the ones [`EmulatedRanks`](crate::EmulatedRanks) tests against the interpreter.

use crate::codegen::CudaProgram;
use crate::devices::Device;
use crate::devices::gpu::{Gpu, IpcMapping, reaches_gpus};
use crate::executors::rank_job::{PeerAccess, RankJob};
use crate::executors::reads::DeviceData;
use crate::lent::{DeviceSlice, Lent, Memory};
use crate::transports::ipc_table;
use crate::transports::nccl::Nccl;
use coconet_core::{Bindings, ValueId};
use coconet_launch::{LaunchEnv, Store};
use coconet_plan::RuntimeError;
use coconet_plan::agreement;
use coconet_plan::plan::Plan;
use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// `Distributed` backends this process joined, and mapped jobs it prepared: every rank
/// counts the same, so the n-th of every rank uses the same store keys.
static JOINED: AtomicUsize = AtomicUsize::new(0);

/// Agreement checks so far in this process: every process prepares the same jobs in the
/// same order, so the n-th check uses the same store key everywhere.
static AGREED: AtomicUsize = AtomicUsize::new(0);
static PREPARED: AtomicUsize = AtomicUsize::new(0);

fn rendezvous(what: &str) -> impl Fn(coconet_launch::StoreError) -> RuntimeError + '_ {
    move |e| RuntimeError::Device(format!("{what} through the store: {e}"))
}

/// The CUDA backend of a multi-process job: this process is rank `RANK` of
/// `WORLD_SIZE`, on GPU `LOCAL_RANK`, as `coconet-launch` (or torchrun) set them. Every
/// process passes the same plan and its own rank's bindings (its gradient as
/// [`Binding::this_rank`](coconet_core::Binding::this_rank), Replicated inputs whole;
/// prepare checks through the store that the processes agree), and prepares and runs the
/// same jobs in the same order.
///
/// A process whose run fails should exit with an error: its peers may be waiting for it
/// inside NCCL, and the launcher stops every rank when one exits abnormally (there is no
/// watchdog in the process yet).
///
/// ```no_run
/// // Run with `coconet-launch --nproc-per-node 2 ./this-program`.
/// use coconet_core::*;
/// use coconet_cuda::Distributed;
/// use coconet_plan::{Backend, JobData, Plan};
/// # fn main() -> Result<(), coconet_plan::RuntimeError> {
/// let mut b = ProgramBuilder::new("sum");
/// let x = b.tensor_input("x", DType::F32, Layout::Local, Shape::new(vec![Dim::sym("N")]), 0).unwrap();
/// let y = b.all_reduce(ReduceOp::Sum, x).unwrap();
/// let p = b.finish();
/// let backend = Distributed::from_env()?;
/// // Each process binds its own rank's data only.
/// let mine = if backend.rank() == 0 { vec![1.0f32, 2.0, 3.0] } else { vec![10.0, 20.0, 30.0] };
/// let args = Bindings::new().dim("N", 3).tensor("x", Binding::this_rank(&mine));
/// let plan = Plan::lower(&Schedule::new(&p), 2, args.dims())?;
/// let mut job = backend.prepare(&plan, &args)?;
/// backend.run(&mut job)?;
/// assert_eq!(job.local::<f32>(y, backend.rank()), Some(vec![11.0, 22.0, 33.0]));
/// # Ok(()) }
/// ```
pub struct Distributed {
    nccl: Nccl,
    ordinal: usize,
    store: Mutex<Store>,
    timeout: Duration,
    /// Every rank on one machine and every GPU able to reach every other (all ranks
    /// agreed).
    ipc_capable: bool,
    /// How kernels reach peers' memory (the same on every rank): mapped through CUDA IPC
    /// where every rank is on this machine and every GPU can reach every other,
    /// exchanged through NCCL otherwise.
    pub access: PeerAccess,
    /// Held through every prepare and run: the ranks must issue the same NCCL calls in
    /// the same order, so two threads must not interleave them.
    serial: Mutex<()>,
    /// The store of a job of this one process ([`Distributed::single_process`]), served
    /// for as long as the job lives.
    #[cfg(feature = "launcher")]
    _server: Option<coconet_launch::StoreServer>,
}

impl Distributed {
    /// Joins the job described by the launch environment: connects to its store, shares
    /// the NCCL unique id and opens GPU `LOCAL_RANK`.
    pub fn from_env() -> Result<Distributed, RuntimeError> {
        let env = LaunchEnv::from_env().map_err(|e| RuntimeError::Device(e.to_string()))?;
        let store = env
            .connect()
            .map_err(|e| RuntimeError::Device(e.to_string()))?;
        Distributed::join(store, &env)
    }

    /// Joins the job `env` describes (rank `env.rank` of `env.world_size`, on GPU
    /// `env.local_rank`) through its `store`: shares the NCCL unique id, and agrees with
    /// every rank whether their memories can be mapped (`env.local_world_size` equal to
    /// the world size, and every rank's GPU reaching every other's).
    pub fn join(mut store: Store, env: &LaunchEnv) -> Result<Distributed, RuntimeError> {
        let nccl = Nccl::from_store(
            &mut store,
            env.rank,
            env.world_size,
            env.local_rank,
            env.timeout,
        )?;
        // On one machine, rank r uses GPU r (its LOCAL_RANK).
        let one_machine = env.local_world_size == Some(env.world_size);
        let gpus: Vec<usize> = (0..env.world_size).collect();
        let mine = one_machine && reaches_gpus(env.local_rank, &gpus)?;
        let n = JOINED.fetch_add(1, Ordering::Relaxed);
        let all = store
            .all_gather(
                &format!("coconet/ipc-capable/{n}"),
                env.rank,
                env.world_size,
                &[u8::from(mine)],
                env.timeout,
            )
            .map_err(rendezvous("agreeing on CUDA IPC"))?;
        let ipc_capable = all.iter().all(|v| v.as_slice() == [1]);
        Ok(Distributed {
            nccl,
            ordinal: env.local_rank,
            store: Mutex::new(store),
            timeout: env.timeout,
            ipc_capable,
            serial: Mutex::new(()),
            #[cfg(feature = "launcher")]
            _server: None,
            access: if ipc_capable {
                PeerAccess::Mapped
            } else {
                PeerAccess::default()
            },
        })
    }

    /// A job of this one process on GPU 0, with a store of its own on loopback (a fresh
    /// secret): the code of a launched job with no launcher (one GPU, tests). Feature
    /// `launcher` (the store's server).
    #[cfg(feature = "launcher")]
    pub fn single_process() -> Result<Distributed, RuntimeError> {
        use coconet_launch::{JobSecret, Launcher, StoreServer};
        let device = |e: &dyn std::fmt::Display| RuntimeError::Device(e.to_string());
        let secret = JobSecret::generate().map_err(|e| device(&e))?;
        let server = StoreServer::bind("127.0.0.1:0", secret.clone()).map_err(|e| device(&e))?;
        let env = LaunchEnv {
            launcher: Launcher::Coconet,
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: Some(1),
            master_addr: server.local_addr().ip().to_string(),
            master_port: server.local_addr().port(),
            timeout: Duration::from_secs(30),
            secret,
        };
        let store = env.connect().map_err(|e| device(&e))?;
        let mut joined = Distributed::join(store, &env)?;
        joined._server = Some(server);
        Ok(joined)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.nccl.rank()
    }

    /// The number of processes (ranks) in the job.
    pub fn size(&self) -> usize {
        self.nccl.world_size()
    }

    /// The GPU this process runs on (its `LOCAL_RANK`).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Every process's `mine`, in rank order, through the job's store: small values
    /// every process computes at the same point (a loss to log). Every process calls it
    /// the same number of times, in the same order.
    pub fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, RuntimeError> {
        // The store counts the rounds of a key (and deletes each round once read).
        self.store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .all_gather(
                "coconet/gathered",
                self.rank(),
                self.size(),
                mine,
                self.timeout,
            )
            .map_err(rendezvous("gathering values"))
    }

    /// Checks through the store that every process binds the same program, dims,
    /// scalars and Replicated inputs (hashed); every process fails the same way, naming
    /// the first rank that differs from rank 0. A process whose own bindings do not bind
    /// still takes part, so that its peers fail with it instead of waiting in NCCL.
    fn agree(&self, plan: &Plan, bindings: &Bindings) -> Result<(), RuntimeError> {
        let rank = self.nccl.rank();
        let bound = plan.bind_rank(bindings, rank);
        let mine = match &bound {
            Ok(b) => {
                let replicated = |id: ValueId, h: &mut DefaultHasher| match b
                    .tensors
                    .get(&id)
                    .and_then(|per_rank| per_rank[rank].as_ref())
                {
                    Some(d) => {
                        h.write(d.as_bytes());
                        true
                    }
                    None => false,
                };
                agreement::fingerprint(plan, rank, &replicated, &b.scalars)
            }
            Err(_) => agreement::failed_to_bind(),
        };
        let bytes: Vec<u8> = mine.iter().flat_map(|(_, v)| v.to_le_bytes()).collect();
        let n = AGREED.fetch_add(1, Ordering::Relaxed);
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let all = store
            .all_gather(
                &format!("coconet/agree/{n}"),
                rank,
                self.nccl.world_size(),
                &bytes,
                self.timeout,
            )
            .map_err(rendezvous("checking that the ranks agree"))?;
        drop(store);
        bound?;
        let all: Vec<Vec<u64>> = all
            .iter()
            .map(|b| {
                b.chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect()
            })
            .collect();
        agreement::compare(&mine, &all)
    }

    /// Maps every peer's buffers into `job` through CUDA IPC (handles through the
    /// store); the mappings must outlive the job's runs.
    fn map_peers(
        &self,
        gpu: &Gpu,
        job: &mut RankJob<Gpu>,
    ) -> Result<Vec<IpcMapping>, RuntimeError> {
        let entries = job
            .own_buffers()
            .map(|(b, buf)| Ok((b, gpu.ipc_handle(buf)?)))
            .collect::<Result<Vec<_>, RuntimeError>>()?;
        let k = PREPARED.fetch_add(1, Ordering::Relaxed);
        let (rank, world) = (self.nccl.rank(), self.nccl.world_size());
        let all = self
            .store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .all_gather(
                &format!("coconet/ipc/{k}"),
                rank,
                world,
                &ipc_table::encode(&entries),
                self.timeout,
            )
            .map_err(rendezvous("sharing CUDA IPC handles"))?;
        let mut mappings = vec![];
        for (r, bytes) in all.iter().enumerate().filter(|(r, _)| *r != rank) {
            let entries = ipc_table::decode(bytes).map_err(|e| {
                RuntimeError::Device(format!("rank {r}'s CUDA IPC handles in the store: {e}"))
            })?;
            for (b, handle) in entries {
                let m = gpu.open_ipc(&handle).map_err(|e| {
                    RuntimeError::Device(format!("mapping rank {r}'s buffer {b:?}: {e}"))
                })?;
                job.map_peer(r, b, m.address());
                mappings.push(m);
            }
        }
        Ok(mappings)
    }
}

/// This process's rank of a plan prepared on [`Distributed`].
pub struct DistributedJob {
    job: RankJob<Gpu>,
    /// Peers' buffers mapped into this process (unmapped after the job's own buffers
    /// are freed, before the GPU is released).
    _mappings: Vec<IpcMapping>,
    gpu: Gpu,
}

impl DistributedJob {
    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.job.rank()
    }

    /// Makes later runs queue this rank's launches as CUDA graphs, one for each run of
    /// launches between NCCL exchanges, barriers and matmuls (`on`), or one by one (see
    /// [`PreparedJob::use_graph`](crate::PreparedJob::use_graph)). Ranks may differ.
    pub fn use_graph(&mut self, on: bool) {
        self.job.use_graph(on)
    }

    /// What this rank's graphs have cost so far (`None` without graphs).
    pub fn graph_stats(&self) -> Option<crate::GraphStats> {
        self.job.graph_stats()
    }
}

impl coconet_plan::JobData for DistributedJob {
    fn plan(&self) -> &Plan {
        self.job.plan()
    }

    fn rank_value(&self, v: ValueId, rank: usize) -> Result<Option<Vec<f64>>, RuntimeError> {
        if rank != self.job.rank() {
            return Ok(None);
        }
        self.job.values(&self.gpu, v)
    }

    fn write_rank_bytes(
        &mut self,
        name: &str,
        rank: usize,
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        if rank != self.job.rank() {
            return Err(RuntimeError::Read(format!(
                "rank {rank}'s data is in another process (this is rank {})",
                self.job.rank()
            )));
        }
        self.job.write_input(&self.gpu, name, bytes)
    }

    fn set_scalar_value(&mut self, id: ValueId, value: f64) -> Result<(), RuntimeError> {
        self.job.set_scalar(id, value);
        Ok(())
    }
}

impl coconet_plan::Backend for Distributed {
    type Job = DistributedJob;

    fn prepare(&self, plan: &Plan, bindings: &Bindings) -> Result<DistributedJob, RuntimeError> {
        let _serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        if plan.ranks() != self.nccl.world_size() {
            return Err(RuntimeError::Plan(format!(
                "the plan is for {} ranks but the job has {} processes",
                plan.ranks(),
                self.nccl.world_size()
            )));
        }
        if self.access == PeerAccess::Mapped && !self.ipc_capable {
            return Err(RuntimeError::Device(
                "the ranks cannot map each other's memory (not all on this machine, or a GPU \
                 cannot reach another); use PeerAccess::Exchanged"
                    .into(),
            ));
        }
        self.agree(plan, bindings)?;
        let program = CudaProgram::generate(plan)?;
        let gpu = Gpu::new(self.ordinal, &program)?;
        let mut job = RankJob::new(
            &gpu,
            plan,
            program,
            bindings,
            self.nccl.rank(),
            None,
            self.access,
        )?;
        let mappings = match self.access {
            PeerAccess::Mapped => self.map_peers(&gpu, &mut job)?,
            PeerAccess::Exchanged(_) => vec![],
        };
        Ok(DistributedJob {
            job,
            _mappings: mappings,
            gpu,
        })
    }

    fn run(&self, job: &mut DistributedJob) -> Result<(), RuntimeError> {
        self.run_lent(job, &Lent::new())
    }
}

impl Distributed {
    /// Runs once with `lent` standing for this process's rank's buffers (memory of its
    /// GPU; entries for other ranks are refused) and waits for it.
    pub fn run_lent(&self, job: &mut DistributedJob, lent: &Lent<'_>) -> Result<(), RuntimeError> {
        let done = self.run_after(job, lent, None)?;
        job.job.wait(&job.gpu, &done)
    }

    /// Queues one run with `lent` standing for this process's rank's buffers, after
    /// `after` (an event of the caller's stream) and the lent slices' streams, and returns
    /// the event its work ends at without waiting. `Ok` says the run is queued; a fault
    /// (or a peer's failure inside NCCL) surfaces when the event is waited on.
    pub fn run_after(
        &self,
        job: &mut DistributedJob,
        lent: &Lent<'_>,
        after: Option<&cudarc::driver::CudaEvent>,
    ) -> Result<cudarc::driver::CudaEvent, RuntimeError> {
        let me = job.job.rank();
        if let Some(e) = lent.entries.iter().find(|e| e.rank != me) {
            return Err(RuntimeError::Lend(format!(
                "`{}` on rank {}: that rank's data is in another process (this is rank {me})",
                e.input, e.rank
            )));
        }
        let _serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        job.job.run_lent(&job.gpu, &self.nccl, lent, after)
    }
}

impl DeviceData for DistributedJob {
    fn rank_memory(&self, rank: usize) -> Result<Memory, RuntimeError> {
        if rank != self.job.rank() {
            return Err(RuntimeError::Read(format!(
                "rank {rank}'s data is in another process (this is rank {})",
                self.job.rank()
            )));
        }
        Ok(self.gpu.memory())
    }

    fn read_rank_bytes(&self, v: ValueId, _: usize, out: &mut [u8]) -> Result<(), RuntimeError> {
        self.job.read_bytes(&self.gpu, v, out)
    }

    fn copy_rank_to(
        &self,
        v: ValueId,
        _: usize,
        dst: &DeviceSlice<'_>,
    ) -> Result<(), RuntimeError> {
        self.job.copy_to(&self.gpu, v, dst)
    }
}
