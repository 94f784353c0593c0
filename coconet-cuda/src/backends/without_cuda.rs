//! The GPU backends in a build without the `cuda` feature: the same names and methods,
//! so code that names them compiles either way (as candle's dummy backend does);
//! constructing one returns an error saying how to enable the feature. No value of
//! them can exist, so their jobs are empty.

use super::built_without_cuda;
use super::with_access::AccessChoice;
use crate::executors::rank_job::PeerAccess;
use crate::executors::reads::DeviceData;
use crate::lent::{DeviceSlice, Lent, Memory};
use coconet_core::{Bindings, ValueId};
use coconet_launch::{LaunchEnv, Store};
use coconet_plan::RuntimeError;
use coconet_plan::plan::Plan;

/// A job of a GPU backend in a build without the `cuda` feature (there is none).
pub enum NoGpuJob {}

impl coconet_plan::JobData for NoGpuJob {
    fn plan(&self) -> &Plan {
        match *self {}
    }

    fn rank_value(&self, _: ValueId, _: usize) -> Result<Option<Vec<f64>>, RuntimeError> {
        match *self {}
    }

    fn write_rank_bytes(&mut self, _: &str, _: usize, _: &[u8]) -> Result<(), RuntimeError> {
        match *self {}
    }

    fn set_scalar_value(&mut self, _: ValueId, _: f64) -> Result<(), RuntimeError> {
        match *self {}
    }
}

/// A plan prepared on a GPU (none without the `cuda` feature).
pub type CudaJob = NoGpuJob;

impl coconet_plan::Backend for super::one_device::Cuda {
    type Job = CudaJob;

    fn prepare(&self, _: &Plan, _: &Bindings) -> Result<CudaJob, RuntimeError> {
        Err(built_without_cuda())
    }

    fn run(&self, job: &mut CudaJob) -> Result<(), RuntimeError> {
        match *job {}
    }
}

/// One process with a thread per GPU; needs the `cuda` feature ([`MultiGpu::new`]
/// says so without it).
#[derive(Debug)]
pub struct MultiGpu {
    /// How kernels reach peers' memory.
    pub access: PeerAccess,
    never: std::convert::Infallible,
}

impl MultiGpu {
    /// Fails: coconet was built without the `cuda` feature.
    pub fn new(ordinals: &[usize]) -> Result<MultiGpu, RuntimeError> {
        let _ = ordinals;
        Err(built_without_cuda())
    }

    /// Fails: coconet was built without the `cuda` feature.
    pub fn every_gpu() -> Result<MultiGpu, RuntimeError> {
        Err(built_without_cuda())
    }

    /// The GPUs' ordinals.
    pub fn ordinals(&self) -> &[usize] {
        match self.never {}
    }
}

/// A plan prepared on [`MultiGpu`] (none without the `cuda` feature).
pub type MultiGpuJob = NoGpuJob;

impl AccessChoice for MultiGpu {
    fn prepare_with(
        &self,
        _: &Plan,
        _: &Bindings,
        _: PeerAccess,
    ) -> Result<MultiGpuJob, RuntimeError> {
        match self.never {}
    }

    fn can_map(&self) -> bool {
        match self.never {}
    }
}

impl MultiGpu {
    /// Runs once with `lent` standing for the ranks' buffers (no job exists without the
    /// `cuda` feature).
    pub fn run_lent(&self, job: &mut MultiGpuJob, _: &Lent<'_>) -> Result<(), RuntimeError> {
        match *job {}
    }
}

impl coconet_plan::Backend for MultiGpu {
    type Job = MultiGpuJob;

    fn prepare(&self, _: &Plan, _: &Bindings) -> Result<MultiGpuJob, RuntimeError> {
        match self.never {}
    }

    fn run(&self, job: &mut MultiGpuJob) -> Result<(), RuntimeError> {
        match *job {}
    }
}

/// One process per GPU under `coconet-launch`; needs the `cuda` feature
/// ([`Distributed::from_env`] says so without it).
#[derive(Debug)]
pub struct Distributed {
    /// How kernels reach peers' memory.
    pub access: PeerAccess,
    never: std::convert::Infallible,
}

impl Distributed {
    /// Fails: coconet was built without the `cuda` feature.
    pub fn from_env() -> Result<Distributed, RuntimeError> {
        Err(built_without_cuda())
    }

    /// Fails: coconet was built without the `cuda` feature.
    pub fn join(store: Store, env: &LaunchEnv) -> Result<Distributed, RuntimeError> {
        let _ = (store, env);
        Err(built_without_cuda())
    }

    /// Fails: coconet was built without the `cuda` feature.
    #[cfg(feature = "launcher")]
    pub fn single_process() -> Result<Distributed, RuntimeError> {
        Err(built_without_cuda())
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        match self.never {}
    }

    /// The number of processes (ranks) in the job.
    pub fn size(&self) -> usize {
        match self.never {}
    }

    /// The GPU this process runs on.
    pub fn ordinal(&self) -> usize {
        match self.never {}
    }

    /// Every process's `mine`, in rank order (no job exists without the `cuda` feature).
    pub fn all_gather_bytes(&self, _: &[u8]) -> Result<Vec<Vec<u8>>, RuntimeError> {
        match self.never {}
    }

    /// Runs once with `lent` standing for this process's rank's buffers (no job exists
    /// without the `cuda` feature).
    pub fn run_lent(&self, job: &mut DistributedJob, _: &Lent<'_>) -> Result<(), RuntimeError> {
        match job.never {}
    }
}

/// This process's rank of a plan prepared on [`Distributed`] (none without the `cuda`
/// feature).
pub struct DistributedJob {
    never: NoGpuJob,
}

impl DistributedJob {
    /// This process's rank.
    pub fn rank(&self) -> usize {
        match self.never {}
    }
}

impl coconet_plan::JobData for DistributedJob {
    fn plan(&self) -> &Plan {
        match self.never {}
    }

    fn rank_value(&self, _: ValueId, _: usize) -> Result<Option<Vec<f64>>, RuntimeError> {
        match self.never {}
    }

    fn write_rank_bytes(&mut self, _: &str, _: usize, _: &[u8]) -> Result<(), RuntimeError> {
        match self.never {}
    }

    fn set_scalar_value(&mut self, _: ValueId, _: f64) -> Result<(), RuntimeError> {
        match self.never {}
    }
}

impl DeviceData for NoGpuJob {
    fn rank_memory(&self, _: usize) -> Result<Memory, RuntimeError> {
        match *self {}
    }

    fn read_rank_bytes(&self, _: ValueId, _: usize, _: &mut [u8]) -> Result<(), RuntimeError> {
        match *self {}
    }

    fn copy_rank_to(&self, _: ValueId, _: usize, _: &DeviceSlice<'_>) -> Result<(), RuntimeError> {
        match *self {}
    }
}

impl DeviceData for DistributedJob {
    fn rank_memory(&self, _: usize) -> Result<Memory, RuntimeError> {
        match self.never {}
    }

    fn read_rank_bytes(&self, _: ValueId, _: usize, _: &mut [u8]) -> Result<(), RuntimeError> {
        match self.never {}
    }

    fn copy_rank_to(&self, _: ValueId, _: usize, _: &DeviceSlice<'_>) -> Result<(), RuntimeError> {
        match self.never {}
    }
}

impl coconet_plan::Backend for Distributed {
    type Job = DistributedJob;

    fn prepare(&self, _: &Plan, _: &Bindings) -> Result<DistributedJob, RuntimeError> {
        match self.never {}
    }

    fn run(&self, job: &mut DistributedJob) -> Result<(), RuntimeError> {
        match job.never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gpu_backend_says_how_to_enable_cuda() {
        let errors = [
            super::super::one_device::Cuda::new(0).err(),
            MultiGpu::new(&[0, 1]).err(),
            MultiGpu::every_gpu().err(),
            Distributed::from_env().err(),
        ];
        for e in errors {
            let e = e
                .expect("no GPU backend without the cuda feature")
                .to_string();
            assert!(e.contains("built without the `cuda` feature"), "{e}");
        }
    }
}
