//! Several GPUs driven by one process (cargo feature `cuda`): a rank per GPU, each on its
//! own thread. Where every GPU can access every other's memory (NVLink, or PCIe peer
//! access), peer access is enabled and kernels read and write peers' buffers directly, as
//! with virtual ranks, ranks meeting at barriers ([`PeerAccess::Mapped`]); otherwise
//! they exchange through NCCL communicators made together (`ncclCommInitAll`), as a
//! multi-process job ([`Distributed`](crate::Distributed)) does.
//!
//! Not yet run on a GPU (no session so far had several, or one): the thread runner and
//! the exchanges are the ones [`EmulatedRanks`](crate::EmulatedRanks) tests.

use crate::backends::with_access::AccessChoice;
use crate::devices::gpu::Gpu;
use crate::executors::rank_job::PeerAccess;
use crate::executors::rank_threads::ThreadRanksJob;
use crate::lent::Lent;
use crate::transports::nccl::Nccl;
use coconet_core::Bindings;
use coconet_plan::RuntimeError;
use coconet_plan::plan::Plan;
use cudarc::driver::{CudaContext, sys};
use std::sync::{Arc, Mutex};

/// The CUDA backend on several GPUs of this machine, one rank per GPU, all driven from
/// this process.
///
/// ```no_run
/// use coconet_core::*;
/// use coconet_cuda::MultiGpu;
/// use coconet_plan::{Backend, JobData, Plan};
/// # fn main() -> Result<(), coconet_plan::RuntimeError> {
/// let mut b = ProgramBuilder::new("sum");
/// let x = b.tensor_input("x", DType::F32, Layout::Local, Shape::new(vec![Dim::sym("N")]), 0).unwrap();
/// let y = b.all_reduce(ReduceOp::Sum, x).unwrap();
/// let p = b.finish();
/// let args = Bindings::new()
///     .dim("N", 3)
///     .tensor("x", Binding::per_rank(&[vec![1.0f32, 2.0, 3.0], vec![10.0, 20.0, 30.0]]));
/// let plan = Plan::lower(&Schedule::new(&p), 2, args.dims())?;
/// let backend = MultiGpu::new(&[0, 1])?;
/// let mut job = backend.prepare(&plan, &args)?;
/// backend.run(&mut job)?;
/// assert_eq!(job.local::<f32>(y, 1), Some(vec![11.0, 22.0, 33.0]));
/// # Ok(()) }
/// ```
pub struct MultiGpu {
    ordinals: Vec<usize>,
    comms: Vec<Nccl>,
    /// Kept so that peer access stays enabled (it belongs to the contexts).
    _contexts: Vec<Arc<CudaContext>>,
    peer_capable: bool,
    /// How kernels reach peers' memory: mapped where every GPU can access every other,
    /// exchanged through NCCL otherwise (may be set to exchanged).
    pub access: PeerAccess,
    /// Held through every prepare and run: the ranks must issue the same NCCL calls in
    /// the same order, so two threads must not interleave them.
    serial: Mutex<()>,
}

fn cuda(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Device(format!("CUDA: {e}"))
}

/// Enables peer access between every pair of GPUs when every pair allows it; returns the
/// contexts and whether it did.
fn enable_peer_access(ordinals: &[usize]) -> Result<(Vec<Arc<CudaContext>>, bool), RuntimeError> {
    let contexts = ordinals
        .iter()
        .map(|&o| crate::devices::gpu::context(o))
        .collect::<Result<Vec<_>, _>>()?;
    for a in &contexts {
        for b in contexts.iter().filter(|b| b.ordinal() != a.ordinal()) {
            let mut can = 0;
            // SAFETY: two valid devices and an out-parameter.
            let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.cu_device(), b.cu_device()) };
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(cuda(format!("cuDeviceCanAccessPeer: {r:?}")));
            }
            if can == 0 {
                return Ok((contexts, false));
            }
        }
    }
    for a in &contexts {
        a.bind_to_thread().map_err(cuda)?;
        for b in contexts.iter().filter(|b| b.ordinal() != a.ordinal()) {
            // SAFETY: `a` is current; `b` is a live context.
            let r = unsafe { sys::cuCtxEnablePeerAccess(b.cu_ctx(), 0) };
            if r != sys::CUresult::CUDA_SUCCESS
                && r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
            {
                return Err(cuda(format!(
                    "enabling GPU {}'s access to GPU {}: {r:?}",
                    a.ordinal(),
                    b.ordinal()
                )));
            }
        }
    }
    Ok((contexts, true))
}

impl MultiGpu {
    /// Rank `r` on GPU `ordinals[r]`. Fails with a clear error when the driver, NVRTC,
    /// cuBLAS or NCCL cannot be loaded, or a GPU is missing or listed twice.
    pub fn new(ordinals: &[usize]) -> Result<MultiGpu, RuntimeError> {
        let comms = Nccl::all(ordinals)?;
        let (contexts, peer_capable) = enable_peer_access(ordinals)?;
        Ok(MultiGpu {
            ordinals: ordinals.to_vec(),
            comms,
            _contexts: contexts,
            peer_capable,
            serial: Mutex::new(()),
            access: if peer_capable {
                PeerAccess::Mapped
            } else {
                PeerAccess::default()
            },
        })
    }

    /// A rank on every GPU the driver reports.
    pub fn every_gpu() -> Result<MultiGpu, RuntimeError> {
        if let Some(why) = crate::devices::gpu::unavailable() {
            return Err(RuntimeError::Device(why));
        }
        let count = cudarc::driver::CudaContext::device_count()
            .map_err(|e| RuntimeError::Device(format!("CUDA: {e}")))?;
        MultiGpu::new(&(0..count as usize).collect::<Vec<_>>())
    }

    /// The GPUs, rank by rank.
    pub fn ordinals(&self) -> &[usize] {
        &self.ordinals
    }
}

/// A plan prepared on [`MultiGpu`]: every rank's GPU and job.
pub type MultiGpuJob = ThreadRanksJob<Gpu>;

impl coconet_plan::Backend for MultiGpu {
    type Job = MultiGpuJob;

    fn prepare(&self, plan: &Plan, bindings: &Bindings) -> Result<MultiGpuJob, RuntimeError> {
        self.prepare_with(plan, bindings, self.access)
    }

    fn run(&self, job: &mut MultiGpuJob) -> Result<(), RuntimeError> {
        self.run_lent(job, &Lent::new())
    }
}

impl MultiGpu {
    /// Runs once with `lent` standing for the ranks' buffers (each rank takes its own
    /// entries, memory of its GPU) and waits for every rank.
    pub fn run_lent(&self, job: &mut MultiGpuJob, lent: &Lent<'_>) -> Result<(), RuntimeError> {
        let _serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        if self.comms.iter().any(Nccl::is_aborted) {
            return Err(RuntimeError::Device(
                "a rank failed in an earlier run and NCCL was aborted; make a new MultiGpu".into(),
            ));
        }
        // A failed rank's peers would wait for it inside NCCL forever: abort them all.
        job.run_lent(
            &self.comms,
            &|_, _| self.comms.iter().for_each(Nccl::abort),
            lent,
        )
    }
}

impl AccessChoice for MultiGpu {
    fn prepare_with(
        &self,
        plan: &Plan,
        bindings: &Bindings,
        access: PeerAccess,
    ) -> Result<MultiGpuJob, RuntimeError> {
        let _serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        if plan.ranks() != self.ordinals.len() {
            return Err(RuntimeError::Plan(format!(
                "the plan is for {} ranks but the backend has {} GPUs",
                plan.ranks(),
                self.ordinals.len()
            )));
        }
        if access == PeerAccess::Mapped && !self.peer_capable {
            return Err(RuntimeError::Device(
                "these GPUs cannot all access each other's memory; use PeerAccess::Exchanged"
                    .into(),
            ));
        }
        // Unified addressing: a device pointer means the same in every context.
        ThreadRanksJob::prepare(plan, bindings, access, None, |r, program| {
            Gpu::new(self.ordinals[r], program)
        })
    }

    fn can_map(&self) -> bool {
        self.peer_capable
    }
}
