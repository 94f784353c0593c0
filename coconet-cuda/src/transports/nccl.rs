//! NCCL between GPUs (cargo feature `cuda`): the [`PeerTransport`] of ranks with separate
//! memories ([`Distributed`](crate::Distributed), [`MultiGpu`](crate::MultiGpu)).
//!
//! Only NCCL's grouped point-to-point transfers are used (`ncclSend`/`ncclRecv` between
//! `ncclGroupStart` and `ncclGroupEnd`, on the GPU's transfers' stream, ordered with the
//! kernels by events, so a pipelined exchange overlaps them), and a one-byte all-reduce
//! as the barrier of ranks that map each other's memory: every
//! reduction happens in the generated kernels in rank order, so results are bitwise
//! those of the reference interpreter on any number of nodes. The NCCL unique id travels
//! through the launcher's rendezvous store.
//!
//! Not yet run on a GPU (no session so far had one): the exchanges it performs are the
//! ones [`EmulatedRanks`](crate::EmulatedRanks) tests against the interpreter.

use crate::devices::gpu::Gpu;
use crate::executors::rank_job::{PeerTransfer, PeerTransport};
use coconet_launch::Store;
use coconet_plan::RuntimeError;
use cudarc::nccl::{result, sys};
use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

fn nccl(e: impl std::fmt::Debug) -> RuntimeError {
    RuntimeError::Device(format!("NCCL: {e:?}"))
}

/// Why NCCL cannot be used, or `None` when it loads.
pub fn nccl_unavailable() -> Option<String> {
    if crate::devices::libraries::nccl() {
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
    /// Held while posting: an abort from another thread waits for a posting to end, so
    /// no call sees the communicator alive and then uses it freed.
    posting: Mutex<()>,
}

// SAFETY: an NCCL communicator may be used from any thread, one at a time.
unsafe impl Send for Nccl {}
// SAFETY: every NCCL call through `&self` holds `posting`, so one thread at a time
// operates the communicator (NCCL's rule). The exception is an abort that could not get
// the lock because a posting hangs inside NCCL (waiting for a dead peer): then it calls
// `ncclCommAbort` anyway, as watchdog threads do (PyTorch's, XLA's) to end hung calls.
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
        if let Some(why) = crate::devices::gpu::unavailable().or_else(nccl_unavailable) {
            return Err(RuntimeError::Device(why));
        }
        let n = CREATED.fetch_add(1, Ordering::Relaxed);
        let key = format!("coconet/nccl/{n}/unique-id");
        let rendezvous = |e: coconet_launch::StoreError| {
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
        let ctx = crate::devices::gpu::context(ordinal)?;
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
            posting: Mutex::new(()),
        })
    }

    /// One communicator per GPU of `ordinals`, all in this process (`ncclCommInitAll`):
    /// rank `r` on GPU `ordinals[r]`.
    pub fn all(ordinals: &[usize]) -> Result<Vec<Nccl>, RuntimeError> {
        if let Some(why) = crate::devices::gpu::unavailable().or_else(nccl_unavailable) {
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
                posting: Mutex::new(()),
            })
            .collect())
    }

    /// Stops the communicator's operations in progress (a peer failed, so they would
    /// wait forever) and frees it; it cannot be used afterwards.
    pub fn abort(&self) {
        // Wait (a little) for a posting in progress to end; a posting hung in NCCL is
        // what the abort is for.
        let start = std::time::Instant::now();
        let guard = loop {
            match self.posting.try_lock() {
                Ok(g) => break Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => break Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock)
                    if start.elapsed() < Duration::from_secs(5) =>
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(std::sync::TryLockError::WouldBlock) => break None,
            }
        };
        if !self.aborted.swap(true, Ordering::SeqCst) {
            // SAFETY: a live communicator, aborted once.
            let _ = unsafe { result::comm_abort(self.comm) };
        }
        drop(guard);
    }

    /// Runs `post` with the communicator while holding the posting lock, unless it was
    /// aborted.
    fn posting<T>(
        &self,
        at: &str,
        post: impl FnOnce(sys::ncclComm_t) -> Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        let _guard = self.posting.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_aborted() {
            return Err(RuntimeError::Device(format!(
                "NCCL at `{at}`: the communicator was aborted after a rank failed"
            )));
        }
        post(self.comm)
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

impl PeerTransport<Gpu> for Nccl {
    fn exchange(
        &self,
        gpu: &Gpu,
        sends: &[PeerTransfer],
        recvs: &[PeerTransfer],
        at: &str,
    ) -> Result<(), RuntimeError> {
        gpu.bind()?;
        let stream = gpu.transfer_stream() as sys::cudaStream_t;
        let fail = |e| RuntimeError::Device(format!("NCCL at `{at}`: {e:?}"));
        self.posting(at, |comm| {
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
                        comm,
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
                        comm,
                        stream,
                    )
                };
                posted = posted.and(r.map(drop));
            }
            // The group is always closed, even when posting failed.
            let ended = result::group_end();
            posted.map_err(fail)?;
            ended.map(drop).map_err(fail)
        })
    }

    fn barrier(&self, gpu: &Gpu, scratch: u64, world: usize, at: &str) -> Result<(), RuntimeError> {
        debug_assert_eq!(world, self.world);
        gpu.bind()?;
        self.posting(at, |comm| {
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
                    comm,
                    gpu.kernel_stream() as sys::cudaStream_t,
                )
            }
            .map(drop)
            .map_err(|e| RuntimeError::Device(format!("NCCL barrier at `{at}`: {e:?}")))
        })
    }
}
