//! The two conjugate operations of Megatron-LM's tensor parallelism as candle custom ops,
//! so that candle's autograd runs the collectives of the backward pass too:
//!
//! - [`copy_to_parallel`]: the identity going forward, an all-reduce of the gradient
//!   going back — at the input of a column-parallel layer, whose every rank consumes the
//!   whole input and so holds only its part of the input's gradient;
//! - [`reduce_from_parallel`]: an all-reduce going forward, the identity going back — at
//!   the output of a row-parallel layer, whose ranks each hold a partial sum.
//!
//! Both take and give f32 tensors on the CPU (any shape; the all-reduce runs over the
//! flattened tensor, the same length on every rank).

use super::group::{Collective, TensorParallel};
use super::storage::f32_data;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};

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

impl TensorParallel {
    /// The sum over the group's ranks of each rank's `t` (f32, on the CPU, the same
    /// shape on every rank), the same bits on every rank: e.g. the gradient of a
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
    if !x.device().is_cpu() {
        candle_core::bail!(
            "{what}: tensor parallelism runs on the CPU for now, got a tensor on {:?}",
            x.device()
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
        let x = f32_data(storage, layout, self.name())?;
        let sum = self
            .0
            .run(Collective::Sum, x, &[])
            .map_err(|e| candle_core::Error::Msg(format!("coconet all-reduce: {e}")))?;
        Ok((CpuStorage::F32(sum), layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad.clone()))
    }
}
