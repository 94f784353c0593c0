//! The CUDA backend: kernels generated from the plan ([`codegen`]), compiled at run time
//! by NVRTC, launched by one executor ([`DeviceJob`]) on a [`Device`].
//!
//! Unlike the original CoCoNet, nothing is edited or rebuilt per program: the fused
//! pointwise kernels, the fused all-reduce over peer memory (reduce my chunk from every
//! peer → computation → write to every peer) and the collectives are generated CUDA C;
//! matmuls are cuBLAS calls; an overlapped matmul releases the fused all-reduce of its
//! rows block by block through events between a compute and a communication stream.
//!
//! Ranks are *virtual*: P ranks' buffers on one GPU, peer pointers being same-device
//! pointers, so fused-collective kernels run and are checked on a single-GPU machine.
//!
//! Ranks with *separate memories* run the same program, each its own launches
//! ([`RankJob`]). Where they can map each other's buffers (CUDA IPC, peer access), the
//! kernels address peers directly and ranks meet at barriers; otherwise what a launch
//! reads from or writes to peers is exchanged before and after it ([`Transport`]: NCCL
//! between GPUs, mailboxes between emulated devices), large exchanges pipelined in chunks
//! against the kernels ([`PeerAccess`], [`Pipelining`]).
//! Backends: `Distributed` (a process per GPU, started by `coconet-launch`), `MultiGpu`
//! (a thread per GPU in this process; both with the `cuda` feature) and
//! [`EmulatedRanks`] (a thread per emulated device, for tests).
//!
//! Devices:
//! - [`Cuda`] (cargo feature `cuda`): a real GPU through cudarc. Creating it without a
//!   driver returns [`RuntimeError::Device`] naming what is missing (cudarc would
//!   panic, so the libraries are probed first).
//! - [`Emulator`]: the generated source compiled as C++ and run on the host, thread by
//!   thread — the same kernels and the same executor, for tests without a GPU.
//!
//! ```no_run
//! use coconet_core::*;
//! use coconet_runtime::{Plan, cuda};
//! # fn main() -> Result<(), coconet_runtime::RuntimeError> {
//! let mut b = ProgramBuilder::new("sum");
//! let x = b.tensor_input("x", DType::F32, Layout::Local, Shape::new(vec![Dim::sym("N")]), 0).unwrap();
//! let y = b.all_reduce(ReduceOp::Sum, x).unwrap();
//! let p = b.finish();
//! let args = Bindings::new()
//!     .dim("N", 3)
//!     .tensor("x", Binding::per_rank(&[vec![1.0f32, 2.0, 3.0], vec![10.0, 20.0, 30.0]]));
//! let plan = Plan::lower(&Schedule::new(&p), 2, args.dims())?;
//! let (device, mut job) = cuda::emulate(&plan, &args)?;
//! job.run(&device)?;
//! assert_eq!(job.values(&device, y)?[1], vec![11.0, 22.0, 33.0]);
//! # Ok(()) }
//! ```

mod actions;
pub mod codegen;
mod device;
#[cfg(feature = "cuda")]
mod distributed;
mod emulated_ranks;
mod emulator;
mod exchange_plan;
mod exec;
// Used by `Distributed` (feature `cuda`); tested without it.
#[cfg(feature = "cuda")]
mod gpu;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod ipc_table;
mod mapped_plan;
#[cfg(feature = "cuda")]
mod multi_gpu;
#[cfg(feature = "cuda")]
mod nccl;
mod rank;
mod rank_threads;
#[cfg(debug_assertions)]
mod stream_check;

pub use codegen::CudaProgram;
pub use device::Device;
#[cfg(feature = "cuda")]
pub use distributed::{Distributed, DistributedJob};
pub use emulated_ranks::{EmulatedRanks, EmulatedRanksJob, MAILBOX_TIMEOUT, Mailbox, Mailboxes};
pub use emulator::{EmuBuffer, Emulator};
pub use exchange_plan::Pipelining;
pub use exec::{BLOCK, DeviceJob};
#[cfg(feature = "cuda")]
pub use gpu::{
    Gpu, GpuBuffer, IpcMapping, compile, compile_cubin, driver_present, nvrtc_present,
    reaches_gpus, unavailable,
};
#[cfg(feature = "cuda")]
pub use multi_gpu::{MultiGpu, MultiGpuJob};
#[cfg(feature = "cuda")]
pub use nccl::{Nccl, nccl_unavailable};
pub use rank::{PeerAccess, RankJob, Transfer, Transport};
pub use rank_threads::ThreadRanksJob;

use crate::RuntimeError;
use crate::plan::Plan;
use coconet_core::Bindings;

/// Generates `plan`'s kernels, compiles them for the host emulator and binds `bindings`
/// (small grids, so grid-stride loops wrap).
pub fn emulate(
    plan: &Plan,
    bindings: &Bindings,
) -> Result<(Emulator, DeviceJob<Emulator>), RuntimeError> {
    let program = CudaProgram::generate(plan)?;
    let device = Emulator::new(&program)?;
    let job = DeviceJob::new(&device, plan, program, bindings, Some(2))?;
    Ok((device, job))
}

/// The CUDA backend's executor and kernels on the host [`Emulator`] (tests without a
/// GPU; slow: every thread of every block runs one after another).
#[derive(Debug, Clone, Copy, Default)]
pub struct EmulatedCuda;

/// A plan prepared on a device: the device and the bound plan.
pub struct PreparedJob<D: Device> {
    /// The device.
    pub device: D,
    /// The bound plan.
    pub job: DeviceJob<D>,
}

/// A plan prepared on the emulator.
pub type EmulatedJob = PreparedJob<Emulator>;

impl<D: Device> crate::JobData for PreparedJob<D> {
    fn plan(&self) -> &Plan {
        self.job.plan()
    }

    fn rank_value(
        &self,
        v: coconet_core::ValueId,
        rank: usize,
    ) -> Result<Option<Vec<f64>>, RuntimeError> {
        if rank >= self.job.plan().ranks() {
            return Ok(None);
        }
        Ok(self.job.values(&self.device, v)?.into_iter().nth(rank))
    }

    fn write_rank_bytes(
        &mut self,
        name: &str,
        rank: usize,
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        self.job.write_input(&self.device, name, rank, bytes)
    }

    fn set_scalar_value(
        &mut self,
        id: coconet_core::ValueId,
        value: f64,
    ) -> Result<(), RuntimeError> {
        self.job.set_scalar(id, value);
        Ok(())
    }
}

impl crate::Backend for EmulatedCuda {
    type Job = EmulatedJob;

    fn prepare(&self, plan: &Plan, bindings: &Bindings) -> Result<EmulatedJob, RuntimeError> {
        let (device, job) = emulate(plan, bindings)?;
        Ok(PreparedJob { device, job })
    }

    fn run(&self, job: &mut EmulatedJob) -> Result<(), RuntimeError> {
        job.job.run(&job.device)
    }
}

/// The CUDA backend on one GPU with virtual ranks.
#[derive(Debug, Clone)]
pub struct Cuda {
    ordinal: usize,
}

impl Cuda {
    /// The backend on GPU `ordinal`. Fails with a clear error when coconet was built
    /// without the `cuda` feature, or when the driver, NVRTC or cuBLAS cannot be loaded,
    /// or no GPU is present.
    pub fn new(ordinal: usize) -> Result<Cuda, RuntimeError> {
        #[cfg(feature = "cuda")]
        {
            if let Some(why) = gpu::unavailable() {
                return Err(RuntimeError::Device(why));
            }
            Ok(Cuda { ordinal })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err(RuntimeError::Device(
                "coconet was built without the `cuda` feature (enable it: \
                 `coconet = { features = [\"cuda\"] }`)"
                    .into(),
            ))
        }
    }

    /// The GPU's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
}

/// A plan prepared on a GPU.
#[cfg(feature = "cuda")]
pub type CudaJob = PreparedJob<Gpu>;

#[cfg(feature = "cuda")]
impl crate::Backend for Cuda {
    type Job = CudaJob;

    fn prepare(&self, plan: &Plan, bindings: &Bindings) -> Result<CudaJob, RuntimeError> {
        let program = CudaProgram::generate(plan)?;
        let gpu = Gpu::new(self.ordinal, &program)?;
        let job = DeviceJob::new(&gpu, plan, program, bindings, None)?;
        Ok(PreparedJob { device: gpu, job })
    }

    fn run(&self, job: &mut CudaJob) -> Result<(), RuntimeError> {
        job.job.run(&job.device)
    }
}
