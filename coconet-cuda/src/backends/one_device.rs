//! The backends on one device with virtual ranks: P ranks' buffers on one GPU
//! ([`Cuda`]) or on the host [`Emulator`] ([`EmulatedCuda`]), run by one
//! [`DeviceJob`].

use crate::codegen::CudaProgram;
use crate::devices::Device;
use crate::devices::emulator::Emulator;
#[cfg(feature = "cuda")]
use crate::devices::gpu::{self, Gpu};
use crate::executors::device_job::DeviceJob;
use crate::executors::launch_graph::GraphStats;
use crate::executors::reads::DeviceData;
use crate::lent::{DeviceSlice, Lent, Memory};
use coconet_core::{Bindings, ValueId};
use coconet_plan::RuntimeError;
use coconet_plan::plan::Plan;

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

impl<D: Device> PreparedJob<D> {
    /// Runs once with `lent` standing for the job's buffers (see [`Lent`]) and waits for
    /// the run to finish.
    pub fn run_lent(&mut self, lent: &Lent<'_>) -> Result<(), RuntimeError> {
        let done = self.job.run_lent(&self.device, lent, None)?;
        self.job.wait(&self.device, &done)
    }

    /// Queues one run with `lent` standing for the job's buffers, after the work of
    /// `after` (an event of the caller's stream) and of the lent cudarc slices' streams,
    /// and returns the event its work ends at without waiting for it: the caller's
    /// kernels that wait on it see the updated values. No device-wide synchronisation.
    /// An `Ok` says the run is queued; a fault of the device while it runs surfaces at
    /// the next wait or read.
    pub fn run_after(
        &mut self,
        lent: &Lent<'_>,
        after: Option<&D::Event>,
    ) -> Result<D::Event, RuntimeError> {
        self.job.run_lent(&self.device, lent, after)
    }

    /// Waits on the host for the work recorded in `event` (a run's, from
    /// [`PreparedJob::run_after`]); a fault it reports leaves the job failed (its buffers
    /// are neither run nor read again).
    pub fn wait(&mut self, event: &D::Event) -> Result<(), RuntimeError> {
        self.job.wait(&self.device, event)
    }

    /// Makes later runs queue the step's launches as CUDA graphs (`on`; the emulator
    /// replays its own record of them), or one by one (`false`, the default).
    ///
    /// The graphs are built at the first run — one for each run of launches between
    /// matmuls (cuBLAS runs those on a stream of its own) — and every later run queues
    /// each with one call. Each run resolves its launches on the host as before —
    /// scalars such as the step count and the learning rate, the addresses of lent
    /// memory — and updates the launches that differ in place; memory lent in another
    /// shape builds new graphs. What a run computes is the same bits with or without.
    pub fn use_graph(&mut self, on: bool) {
        self.job.use_graph(on)
    }

    /// What the runs' graphs have cost so far: builds, launches updated, replays (`None`
    /// without graphs).
    pub fn graph_stats(&self) -> Option<GraphStats> {
        self.job.graph_stats()
    }

    /// Records the device's work so far: an event to wait on after
    /// [`DeviceData::read_to`].
    pub fn record(&self) -> Result<D::Event, RuntimeError> {
        self.device.record()
    }
}

impl<D: Device> coconet_plan::JobData for PreparedJob<D> {
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
        self.job.value(&self.device, v, rank)
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

impl coconet_plan::Backend for EmulatedCuda {
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
impl coconet_plan::Backend for Cuda {
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

impl<D: Device> DeviceData for PreparedJob<D> {
    fn rank_memory(&self, rank: usize) -> Result<Memory, RuntimeError> {
        if rank >= self.job.plan().ranks() {
            return Err(RuntimeError::Read(crate::lent::no_such_rank(
                rank,
                self.job.plan().ranks(),
            )));
        }
        Ok(self.device.memory())
    }

    fn read_rank_bytes(&self, v: ValueId, rank: usize, out: &mut [u8]) -> Result<(), RuntimeError> {
        self.job.read_bytes(&self.device, v, rank, out)
    }

    fn copy_rank_to(
        &self,
        v: ValueId,
        rank: usize,
        dst: &DeviceSlice<'_>,
    ) -> Result<(), RuntimeError> {
        self.job.copy_to(&self.device, v, rank, dst)
    }
}
