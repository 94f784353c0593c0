//! The trainer's step on candle's CUDA device (feature `candle-cuda`): every replica's
//! `Var`s and gradients are lent to the CUDA backend in place, one piece per parameter,
//! ordered on candle's stream. Nothing goes through the host and nothing is copied back:
//! the kernels write the new weights into the `Var`s' own device memory.
//!
//! Not yet run on a GPU (no session with one had this code): built with the PyPI CUDA
//! toolkit (`scripts/gpu/candle-cuda.md`).

use super::error::TrainError;
use candle_core::{Storage, Tensor};
use coconet_core::DType;
use coconet_runtime::cuda::cudarc::driver::DevicePtr;
use coconet_runtime::cuda::{DeviceSlice, Memory};

/// A contiguous f32 tensor's device memory, lent for one run (its storage is kept alive
/// by the caller's `Tensor` until the run is queued; candle frees on its stream, which
/// waits for the run).
pub(crate) fn lend(
    t: &Tensor,
    what: &dyn Fn() -> String,
) -> Result<DeviceSlice<'static>, TrainError> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*storage else {
        return Err(TrainError::Mismatch(format!(
            "{} is not on a CUDA device",
            what()
        )));
    };
    let (from, to) = layout
        .contiguous_offsets()
        .ok_or_else(|| TrainError::Mismatch(format!("{} is not contiguous", what())))?;
    let slice = cs.as_cuda_slice::<f32>()?;
    let stream = cs.device.cuda_stream();
    let (base, guard) = slice.device_ptr(&stream);
    drop(guard);
    let address = base + (from * std::mem::size_of::<f32>()) as u64;
    // SAFETY: `to - from` f32 elements of this GPU's memory from `address` (candle's
    // layout of the tensor); the tensor outlives the queuing of the run, and candle's
    // later work on the memory (a free included) is on `stream`, which the run makes
    // wait for it.
    let lent = unsafe {
        DeviceSlice::from_raw(address, to - from, DType::F32, Memory::Gpu(slice.ordinal()))
    };
    Ok(lent.ordered_with(stream))
}

/// Whether the model's parameters are on a CUDA device, and its ordinal.
pub(crate) fn ordinal(t: &Tensor) -> Option<usize> {
    // Whatever the dtype (bf16 replicas are on the GPU too).
    match t.device().location() {
        candle_core::DeviceLocation::Cuda { gpu_id } => Some(gpu_id),
        _ => None,
    }
}
