//! NCCL between GPUs (cargo feature `cuda`): the [`Transport`] of ranks with separate
//! memories, and [`Distributed`], the backend of a multi-process job started by
//! `coconet-launch` or torchrun (one process and one GPU per rank, on one node or many).
//!
//! Only NCCL's grouped point-to-point transfers are used (`ncclSend`/`ncclRecv` between
//! `ncclGroupStart` and `ncclGroupEnd`, on the GPU's transfers' stream, ordered with the
//! kernels by events, so a pipelined exchange overlaps them): every
//! reduction happens in the generated kernels in rank order, so results are bitwise
//! those of the reference interpreter on any number of nodes. The NCCL unique id travels
//! through the launcher's rendezvous store.
//!
//! Not yet run on a GPU (no session so far had one): the exchanges it performs are the
//! ones [`EmulatedRanks`](super::EmulatedRanks) tests against the interpreter.

use super::codegen::CudaProgram;
use super::gpu::Gpu;
use super::rank::{PeerAccess, RankJob, Transfer, Transport};
use crate::RuntimeError;
use crate::launch::{LaunchEnv, Store};
use crate::plan::Plan;
use coconet_core::{Bindings, Element, ValueId};
use cudarc::nccl::{result, sys};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

fn nccl(e: impl std::fmt::Debug) -> RuntimeError {
    RuntimeError::Device(format!("NCCL: {e:?}"))
}

/// Why NCCL cannot be used, or `None` when it loads.
pub fn nccl_unavailable() -> Option<String> {
    // SAFETY: only tries to load the library.
    if unsafe { sys::is_culib_present() } {
        None
    } else {
        Some(
            "NCCL not found: libnccl.so could not be loaded (cudarc looks for `libnccl.so`; \
             where only `libnccl.so.2` is installed, link `libnccl.so` to it on \
             LD_LIBRARY_PATH)"
                .into(),
        )
    }
}

/// One rank's NCCL communicator.
pub struct Nccl {
    comm: sys::ncclComm_t,
    rank: usize,
    world: usize,
    /// Aborted after a peer's failure: unusable, and already freed.
    aborted: AtomicBool,
}

// SAFETY: an NCCL communicator may be used from any thread, one at a time.
unsafe impl Send for Nccl {}
// SAFETY: through `&self`, transfers are posted only by the thread running the rank's
// job; the one call other threads make is `ncclCommAbort`, which NCCL provides to stop a
// communicator whose operations hang (watchdog threads call it likewise).
unsafe impl Sync for Nccl {}

impl Drop for Nccl {
    fn drop(&mut self) {
        if !*self.aborted.get_mut() {
            // SAFETY: created by NCCL and destroyed once (an abort frees it too).
            let _ = unsafe { result::comm_destroy(self.comm) };
        }
    }
}

/// Communicators created by this process so far: the n-th one of every rank shares the
/// n-th unique id (ranks create them in the same order).
static CREATED: AtomicUsize = AtomicUsize::new(0);

impl Nccl {
    /// Joins an NCCL communicator of `world` ranks as `rank`, on GPU `ordinal`. Rank 0
    /// creates the unique id and publishes it in `store`; the others wait for it (up to
    /// `timeout`).
    pub fn from_store(
        store: &mut Store,
        rank: usize,
        world: usize,
        ordinal: usize,
        timeout: Duration,
    ) -> Result<Nccl, RuntimeError> {
        if let Some(why) = super::gpu::unavailable().or_else(nccl_unavailable) {
            return Err(RuntimeError::Device(why));
        }
        let n = CREATED.fetch_add(1, Ordering::Relaxed);
        let key = format!("coconet/nccl/{n}/unique-id");
        let rendezvous = |e: crate::launch::StoreError| {
            RuntimeError::Device(format!("sharing the NCCL unique id through the store: {e}"))
        };
        let internal: [std::ffi::c_char; 128] = if rank == 0 {
            let id = result::get_uniqueid().map_err(nccl)?;
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            store.set(&key, &bytes).map_err(rendezvous)?;
            id.internal
        } else {
            let bytes = store.get(&key, timeout).map_err(rendezvous)?;
            let arr: [u8; 128] = bytes.as_slice().try_into().map_err(|_| {
                RuntimeError::Device(format!(
                    "the store's NCCL unique id under {key:?} has {} bytes, not 128",
                    bytes.len()
                ))
            })?;
            arr.map(|b| b as std::ffi::c_char)
        };
        let ctx = cudarc::driver::CudaContext::new(ordinal)
            .map_err(|e| RuntimeError::Device(format!("CUDA: {e}")))?;
        ctx.bind_to_thread()
            .map_err(|e| RuntimeError::Device(format!("CUDA: {e}")))?;
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: `comm` is written by NCCL; the id is the one every rank shares.
        let comm = unsafe {
            result::comm_init_rank(
                comm.as_mut_ptr(),
                world as i32,
                sys::ncclUniqueId { internal },
                rank as i32,
            )
            .map_err(nccl)?;
            comm.assume_init()
        };
        Ok(Nccl {
            comm,
            rank,
            world,
            aborted: AtomicBool::new(false),
        })
    }

    /// One communicator per GPU of `ordinals`, all in this process (`ncclCommInitAll`):
    /// rank `r` on GPU `ordinals[r]`.
    pub fn all(ordinals: &[usize]) -> Result<Vec<Nccl>, RuntimeError> {
        if let Some(why) = super::gpu::unavailable().or_else(nccl_unavailable) {
            return Err(RuntimeError::Device(why));
        }
        let count = cudarc::driver::CudaContext::device_count()
            .map_err(|e| RuntimeError::Device(format!("CUDA: {e}")))?;
        let mut seen = std::collections::HashSet::new();
        for &o in ordinals {
            if o >= count as usize {
                return Err(RuntimeError::Device(format!(
                    "there is no GPU {o}: the driver reports {count}"
                )));
            }
            if !seen.insert(o) {
                return Err(RuntimeError::Device(format!(
                    "GPU {o} is listed twice (NCCL needs one rank per GPU)"
                )));
            }
        }
        let devices: Vec<i32> = ordinals.iter().map(|&o| o as i32).collect();
        let mut comms = vec![std::ptr::null_mut(); ordinals.len()];
        // SAFETY: one communicator slot per listed device.
        unsafe {
            result::comm_init_all(comms.as_mut_ptr(), devices.len() as i32, devices.as_ptr())
        }
        .map_err(nccl)?;
        let world = comms.len();
        Ok(comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| Nccl {
                comm,
                rank,
                world,
                aborted: AtomicBool::new(false),
            })
            .collect())
    }

    /// Stops the communicator's operations in progress (a peer failed, so they would
    /// wait forever) and frees it; it cannot be used afterwards.
    pub fn abort(&self) {
        if !self.aborted.swap(true, Ordering::SeqCst) {
            // SAFETY: a live communicator, aborted once.
            let _ = unsafe { result::comm_abort(self.comm) };
        }
    }

    /// Whether [`Nccl::abort`] was called.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// This communicator's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }
}

impl Transport<Gpu> for Nccl {
    fn exchange(
        &self,
        gpu: &Gpu,
        sends: &[Transfer],
        recvs: &[Transfer],
        at: &str,
    ) -> Result<(), RuntimeError> {
        if self.is_aborted() {
            return Err(RuntimeError::Device(format!(
                "NCCL at `{at}`: the communicator was aborted after a rank failed"
            )));
        }
        gpu.bind()?;
        let stream = gpu.transfer_stream() as sys::cudaStream_t;
        let fail = |e| RuntimeError::Device(format!("NCCL at `{at}`: {e:?}"));
        result::group_start().map_err(fail)?;
        let mut posted = Ok(());
        for t in sends {
            // SAFETY: `address` is `bytes` bytes of this GPU's memory, alive until the
            // stream passes this point (the job owns it).
            let r = unsafe {
                result::send(
                    t.address as *const c_void,
                    t.bytes,
                    sys::ncclDataType_t::ncclInt8,
                    t.peer as i32,
                    self.comm,
                    stream,
                )
            };
            posted = posted.and(r.map(drop));
        }
        for t in recvs {
            // SAFETY: as for sends.
            let r = unsafe {
                result::recv(
                    t.address as *mut c_void,
                    t.bytes,
                    sys::ncclDataType_t::ncclInt8,
                    t.peer as i32,
                    self.comm,
                    stream,
                )
            };
            posted = posted.and(r.map(drop));
        }
        // The group is always closed, even when posting failed.
        let ended = result::group_end();
        posted.map_err(fail)?;
        ended.map(drop).map_err(fail)
    }

    fn barrier(&self, gpu: &Gpu, scratch: u64, world: usize, at: &str) -> Result<(), RuntimeError> {
        if self.is_aborted() {
            return Err(RuntimeError::Device(format!(
                "NCCL at `{at}`: the communicator was aborted after a rank failed"
            )));
        }
        debug_assert_eq!(world, self.world);
        gpu.bind()?;
        // A one-byte all-reduce on the kernels' stream: no rank's later kernels start
        // before every rank's earlier kernels are done, with no host synchronisation.
        // SAFETY: `scratch` is eight bytes of this GPU's memory owned by the job.
        unsafe {
            result::all_reduce(
                scratch as *const c_void,
                scratch as *mut c_void,
                1,
                sys::ncclDataType_t::ncclInt8,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                gpu.kernel_stream() as sys::cudaStream_t,
            )
        }
        .map(drop)
        .map_err(|e| RuntimeError::Device(format!("NCCL barrier at `{at}`: {e:?}")))
    }
}

/// The CUDA backend of a multi-process job: this process is rank `RANK` of
/// `WORLD_SIZE`, on GPU `LOCAL_RANK`, as `coconet-launch` (or torchrun) set them.
/// Ranks exchange through NCCL; every process passes the same plan and the same, whole
/// bindings, and runs every step.
///
/// ```no_run
/// // Run with `coconet-launch --nproc-per-node 2 ./this-program`.
/// use coconet_core::*;
/// use coconet_runtime::{Backend, Plan, cuda::Distributed};
/// # fn main() -> Result<(), coconet_runtime::RuntimeError> {
/// let mut b = ProgramBuilder::new("sum");
/// let x = b.tensor_input("x", DType::F32, Layout::Local, Shape::new(vec![Dim::sym("N")]), 0).unwrap();
/// let y = b.all_reduce(ReduceOp::Sum, x).unwrap();
/// let p = b.finish();
/// let args = Bindings::new()
///     .dim("N", 3)
///     .tensor("x", Binding::per_rank(&[vec![1.0f32, 2.0, 3.0], vec![10.0, 20.0, 30.0]]));
/// let plan = Plan::lower(&Schedule::new(&p), 2, args.dims())?;
/// let backend = Distributed::from_env()?;
/// let mut job = backend.prepare(&plan, &args)?;
/// backend.run(&mut job)?;
/// assert_eq!(job.local::<f32>(y), Some(vec![11.0, 22.0, 33.0]));
/// # Ok(()) }
/// ```
pub struct Distributed {
    nccl: Nccl,
    ordinal: usize,
    /// How kernels reach peers' memory (the same on every rank): exchanged through NCCL
    /// (the default). CUDA IPC between processes is not built yet, so
    /// [`PeerAccess::Mapped`] is refused.
    pub access: PeerAccess,
}

impl Distributed {
    /// Joins the job described by the launch environment: connects to its store, shares
    /// the NCCL unique id and opens GPU `LOCAL_RANK`.
    pub fn from_env() -> Result<Distributed, RuntimeError> {
        let env = LaunchEnv::from_env().map_err(|e| RuntimeError::Device(e.to_string()))?;
        let mut store = env
            .connect()
            .map_err(|e| RuntimeError::Device(e.to_string()))?;
        Distributed::new(
            &mut store,
            env.rank,
            env.world_size,
            env.local_rank,
            env.timeout,
        )
    }

    /// Joins a job as `rank` of `world` on GPU `ordinal`, sharing the NCCL id through
    /// `store` (waiting up to `timeout` for rank 0 to publish it).
    pub fn new(
        store: &mut Store,
        rank: usize,
        world: usize,
        ordinal: usize,
        timeout: Duration,
    ) -> Result<Distributed, RuntimeError> {
        Ok(Distributed {
            nccl: Nccl::from_store(store, rank, world, ordinal, timeout)?,
            ordinal,
            access: PeerAccess::default(),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.nccl.rank
    }
}

/// This process's rank of a plan prepared on [`Distributed`].
pub struct DistributedJob {
    gpu: Gpu,
    job: RankJob<Gpu>,
}

impl DistributedJob {
    /// This rank's data of `v` after the last run (`None` where it does not hold it).
    pub fn local<T: Element>(&self, v: impl Into<ValueId>) -> Option<Vec<T>> {
        self.job.local(&self.gpu, v.into())
    }

    /// This rank's buffer of tensor input `name` after the last run.
    pub fn final_input_local<T: Element>(&self, name: &str) -> Result<Vec<T>, RuntimeError> {
        self.job.final_input_local(&self.gpu, name)
    }
}

impl crate::Backend for Distributed {
    type Job = DistributedJob;

    fn prepare(&self, plan: &Plan, bindings: &Bindings) -> Result<DistributedJob, RuntimeError> {
        if plan.ranks() != self.nccl.world {
            return Err(RuntimeError::Plan(format!(
                "the plan is for {} ranks but the job has {} processes",
                plan.ranks(),
                self.nccl.world
            )));
        }
        if self.access == PeerAccess::Mapped {
            return Err(RuntimeError::Device(
                "processes cannot map each other's memory yet (CUDA IPC is not built); \
                 use PeerAccess::Exchanged"
                    .into(),
            ));
        }
        let program = CudaProgram::generate(plan)?;
        let gpu = Gpu::new(self.ordinal, &program)?;
        let job = RankJob::new(
            &gpu,
            plan,
            program,
            bindings,
            self.nccl.rank,
            None,
            self.access,
        )?;
        Ok(DistributedJob { gpu, job })
    }

    fn run(&self, job: &mut DistributedJob) -> Result<(), RuntimeError> {
        job.job.run(&job.gpu, &self.nccl)
    }
}
