//! The backends on one device with virtual ranks: P ranks' buffers on one GPU
//! ([`Cuda`]) or on the host [`Emulator`] ([`EmulatedCuda`]), run by one
//! [`DeviceJob`].

use crate::RuntimeError;
use crate::cuda::codegen::CudaProgram;
use crate::cuda::devices::Device;
use crate::cuda::devices::emulator::Emulator;
#[cfg(feature = "cuda")]
use crate::cuda::devices::gpu::{self, Gpu};
use crate::cuda::executors::device_job::DeviceJob;
use crate::plan::Plan;
use coconet_core::Bindings;

/// Generates `plan`'s kernels, compiles them for the host emulator and binds `bindings`
/// (small grids, so grid-stride loops wrap).
pub(crate) fn emulate(
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
            Err(super::built_without_cuda())
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
