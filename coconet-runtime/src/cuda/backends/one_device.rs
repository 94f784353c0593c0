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
use crate::cuda::lent::{DeviceSlice, Lent};
use crate::plan::Plan;
use coconet_core::{Bindings, Element, ValueId};

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
        self.device.wait_host(&done)
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

    /// Copies rank `rank`'s data of `v` after the last run into `out`, in the value's own
    /// dtype `T`: no f64, and only that rank's data leaves the device.
    pub fn read<T: Element>(
        &self,
        v: impl Into<ValueId>,
        rank: usize,
        out: &mut [T],
    ) -> Result<(), RuntimeError> {
        let (v, n) = readable::<T>(self.job.plan(), v.into(), rank)?;
        check_len(self.job.plan(), v, rank, n, out.len())?;
        // SAFETY: every element type is plain data; the bytes are exactly `out`'s.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                out.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(out),
            )
        };
        self.job.read_bytes(&self.device, v, rank, bytes)?;
        Ok(())
    }

    /// Copies rank `rank`'s data of `v` after the last run into the caller's device
    /// memory `dst` (its dtype and length exactly), ordered after the run: the copy
    /// finishes before any work that waits on an event recorded afterwards
    /// ([`PreparedJob::run_after`]'s next event, or the device's).
    pub fn read_to(
        &self,
        v: impl Into<ValueId>,
        rank: usize,
        dst: &DeviceSlice<'_>,
    ) -> Result<(), RuntimeError> {
        let plan = self.job.plan();
        let v = plan.resolve(v.into())?;
        let dtype = plan.program().node(v).ty.dtype;
        if dst.dtype() != dtype {
            return Err(RuntimeError::Lend(format!(
                "the memory to read `{}` into is {:?}; it holds {dtype:?}",
                plan.program().label(v),
                dst.dtype()
            )));
        }
        let n = read_extent(plan, v, rank)?;
        check_len(plan, v, rank, n, dst.len())?;
        if dst.memory() != self.device.memory() {
            return Err(RuntimeError::Lend(format!(
                "the memory to read `{}` into is in {}; the job runs on {}",
                plan.program().label(v),
                dst.memory(),
                self.device.memory()
            )));
        }
        self.device
            .check_lent(dst.address(), dst.bytes())
            .map_err(|why| {
                RuntimeError::Lend(format!(
                    "the memory to read `{}` into: {why}",
                    plan.program().label(v)
                ))
            })?;
        self.job.copy_to(&self.device, v, rank, dst.address())?;
        Ok(())
    }

    /// Records the device's work so far: an event to wait on after
    /// [`PreparedJob::read_to`].
    pub fn record(&self) -> Result<D::Event, RuntimeError> {
        self.device.record()
    }
}

/// Resolves `v` for a typed read of rank `rank`'s data: `T` its dtype, the value kept
/// in memory and held by the rank; its length there.
fn readable<T: Element>(
    plan: &Plan,
    v: ValueId,
    rank: usize,
) -> Result<(ValueId, usize), RuntimeError> {
    let v = plan.resolve(v)?;
    let p = plan.program();
    let dtype = p.node(v).ty.dtype;
    if T::DTYPE != dtype {
        return Err(RuntimeError::Read(format!(
            "`{}` holds {dtype:?} elements, not {:?} (a typed read does not convert)",
            p.label(v),
            T::DTYPE
        )));
    }
    Ok((v, read_extent(plan, v, rank)?))
}

/// The number of elements of `v` on rank `rank`, or why it cannot be read there.
fn read_extent(plan: &Plan, v: ValueId, rank: usize) -> Result<usize, RuntimeError> {
    let p = plan.program();
    if !plan.holders(v).contains(&rank) {
        return Err(RuntimeError::Read(format!(
            "rank {rank} does not hold `{}`",
            p.label(v)
        )));
    }
    if let Some(why) = plan.unreadable(v) {
        return Err(RuntimeError::Read(why));
    }
    Ok(plan.local_shape(v, rank).iter().product())
}

fn check_len(
    plan: &Plan,
    v: ValueId,
    rank: usize,
    n: usize,
    got: usize,
) -> Result<(), RuntimeError> {
    if n == got {
        return Ok(());
    }
    Err(RuntimeError::Read(format!(
        "`{}` on rank {rank} has {n} elements ({:?}); the destination holds {got}",
        plan.program().label(v),
        plan.local_shape(v, rank)
    )))
}

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
