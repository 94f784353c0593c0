//! The two conjugate operations of Megatron-LM's tensor parallelism as candle custom ops,
//! so that candle's autograd runs the collectives of the backward pass too:
//!
//! - [`copy_to_parallel`]: the identity going forward, an all-reduce of the gradient
//!   going back — at the input of a column-parallel layer, whose every rank consumes the
//!   whole input and so holds only its part of the input's gradient;
//! - [`reduce_from_parallel`]: an all-reduce going forward, the identity going back — at
//!   the output of a row-parallel layer, whose ranks each hold a partial sum.
//!
//! Both take and give f32 tensors (any shape; the all-reduce runs over the flattened
//! tensor, the same length on every rank), on the CPU or, with a group made by
//! `TensorParallel::gpu`, on the GPU.

use super::collective::Collective;
use super::group::TensorParallel;
use super::storage::{cpu_collective, f32_data};
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
#[cfg(feature = "cuda")]
use {super::storage::cuda_collective, candle_core::CudaStorage};

/// The identity forward, the sum over ranks backward (see the module docs).
pub fn copy_to_parallel(x: &Tensor, tp: &TensorParallel) -> Result<Tensor> {
    checked(x, "copy_to_parallel")?.apply_op1(Copy(tp.clone()))
}

/// The sum over ranks forward, the identity backward (see the module docs).
pub fn reduce_from_parallel(x: &Tensor, tp: &TensorParallel) -> Result<Tensor> {
    checked(x, "reduce_from_parallel")?.apply_op1(Reduce(tp.clone()))
}

/// The sum over ranks of `x`, recorded without a backward (a gradient's all-reduce).
pub(crate) fn sum_over_ranks(x: &Tensor, tp: &TensorParallel) -> Result<Tensor> {
    checked(x, "an all-reduce")?.apply_op1_no_bwd(&Reduce(tp.clone()))
}

/// `what` over every rank's `x`, recorded without a backward (a row maximum, a gather of
/// weights).
pub(super) fn collect(
    x: &Tensor,
    what: Collective,
    tp: &TensorParallel,
    name: &'static str,
) -> Result<Tensor> {
    checked(x, name)?.apply_op1_no_bwd(&Collect {
        tp: tp.clone(),
        what,
        name,
    })
}

impl TensorParallel {
    /// The sum over the group's ranks of each rank's `t` (f32, the same shape on every
    /// rank), the same bits on every rank: e.g. the gradient of a
    /// parameter every rank holds whole but trains on its own tokens only (the
    /// sequence-parallel variant's layer norms).
    pub fn sum_over_ranks(&self, t: &Tensor) -> Result<Tensor> {
        sum_over_ranks(t, self)
    }
}

/// `x` made contiguous, or an error where coconet cannot take it yet.
pub(super) fn checked(x: &Tensor, what: &str) -> Result<Tensor> {
    if x.dtype() != DType::F32 {
        candle_core::bail!(
            "{what}: tensor parallelism takes f32 tensors, got {:?}",
            x.dtype()
        );
    }
    x.contiguous()
}

/// The op behind [`copy_to_parallel`].
struct Copy(TensorParallel);

impl CustomOp1 for Copy {
    fn name(&self) -> &'static str {
        "coconet-copy-to-parallel"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = f32_data(storage, layout, self.name())?;
        Ok((CpuStorage::F32(x.to_vec()), layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        // The layout's elements only (candle's own clone copies the whole buffer).
        let (from, to) = layout.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg(format!("{}: expected a contiguous tensor", self.name()))
        })?;
        let slice = storage.as_cuda_slice::<f32>()?;
        let copy = storage
            .device
            .cuda_stream()
            .clone_dtod(&slice.slice(from..to))
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", self.name())))?;
        Ok((
            CudaStorage::wrap_cuda_slice(copy, storage.device.clone()),
            layout.shape().clone(),
        ))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        sum_over_ranks(grad, &self.0).map(Some)
    }
}

/// The op behind [`reduce_from_parallel`].
struct Reduce(TensorParallel);

impl CustomOp1 for Reduce {
    fn name(&self) -> &'static str {
        "coconet-reduce-from-parallel"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_collective(
            &self.0,
            Collective::Sum,
            (storage, layout),
            &[],
            &[],
            "coconet all-reduce",
        )
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        cuda_collective(
            &self.0,
            Collective::Sum,
            (storage, layout),
            &[],
            &[],
            "coconet all-reduce",
        )
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad.clone()))
    }
}

/// The op behind [`collect`].
struct Collect {
    tp: TensorParallel,
    what: Collective,
    name: &'static str,
}

impl CustomOp1 for Collect {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_collective(&self.tp, self.what, (storage, layout), &[], &[], self.name)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        cuda_collective(&self.tp, self.what, (storage, layout), &[], &[], self.name)
    }
}
