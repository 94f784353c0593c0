//! Several GPUs driven by one process (cargo feature `cuda`): a rank per GPU, each on its
//! own thread, exchanging through NCCL communicators made together
//! (`ncclCommInitAll`). The same rank jobs and exchanges as a multi-process job
//! ([`Distributed`](super::Distributed)), without a launcher.
//!
//! Not yet run on a GPU (no session so far had several, or one): the thread runner and
//! the exchanges are the ones [`EmulatedRanks`](super::EmulatedRanks) tests.

use super::codegen::CudaProgram;
use super::exchange_plan::Pipelining;
use super::gpu::Gpu;
use super::nccl::Nccl;
use super::rank::RankJob;
use super::rank_threads::ThreadRanksJob;
use crate::RuntimeError;
use crate::plan::Plan;
use coconet_core::Bindings;

/// The CUDA backend on several GPUs of this machine, one rank per GPU, all driven from
/// this process.
///
/// ```no_run
/// use coconet_core::*;
/// use coconet_runtime::{Backend, Plan, cuda::MultiGpu};
/// # fn main() -> Result<(), coconet_runtime::RuntimeError> {
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
    /// How exchanges are cut to overlap kernels.
    pub pipelining: Pipelining,
}

impl MultiGpu {
    /// Rank `r` on GPU `ordinals[r]`. Fails with a clear error when the driver, NVRTC,
    /// cuBLAS or NCCL cannot be loaded, or a GPU is missing or listed twice.
    pub fn new(ordinals: &[usize]) -> Result<MultiGpu, RuntimeError> {
        Ok(MultiGpu {
            ordinals: ordinals.to_vec(),
            comms: Nccl::all(ordinals)?,
            pipelining: Pipelining::default(),
        })
    }

    /// A rank on every GPU the driver reports.
    pub fn every_gpu() -> Result<MultiGpu, RuntimeError> {
        if let Some(why) = super::gpu::unavailable() {
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

impl crate::Backend for MultiGpu {
    type Job = MultiGpuJob;

    fn prepare(&self, plan: &Plan, bindings: &Bindings) -> Result<MultiGpuJob, RuntimeError> {
        if plan.ranks() != self.ordinals.len() {
            return Err(RuntimeError::Plan(format!(
                "the plan is for {} ranks but the backend has {} GPUs",
                plan.ranks(),
                self.ordinals.len()
            )));
        }
        let program = CudaProgram::generate(plan)?;
        let ranks = self
            .ordinals
            .iter()
            .enumerate()
            .map(|(r, &ordinal)| {
                let gpu = Gpu::new(ordinal, &program)?;
                let job = RankJob::new(
                    &gpu,
                    plan,
                    program.clone(),
                    bindings,
                    r,
                    None,
                    self.pipelining,
                )?;
                Ok((gpu, job))
            })
            .collect::<Result<_, RuntimeError>>()?;
        Ok(ThreadRanksJob { ranks })
    }

    fn run(&self, job: &mut MultiGpuJob) -> Result<(), RuntimeError> {
        if self.comms.iter().any(Nccl::is_aborted) {
            return Err(RuntimeError::Device(
                "a rank failed in an earlier run and NCCL was aborted; make a new MultiGpu".into(),
            ));
        }
        // A failed rank's peers would wait for it inside NCCL forever: abort them all.
        job.run(&self.comms, &|_, _| self.comms.iter().for_each(Nccl::abort))
    }
}
