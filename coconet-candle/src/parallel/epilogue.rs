//! A row-parallel layer's epilogue fused into its all-reduce (the paper's fused
//! Megatron layer): `residual + (Σ_ranks partial + bias)` is one coconet program whose
//! schedule reduce-scatters the partial products, adds the bias and the residual on each
//! rank's block of the sum only, and all-gathers the result — one pass over the data
//! instead of an all-reduce then two elementwise passes over the whole tensor on every
//! rank. Every stage is rounded to f32 as the separate calls round it, so the result is
//! bitwise the unfused `residual + (reduce_from_parallel(partial) + bias)`.
//!
//! With a [`Dropout`], the layer's output goes through it before the residual is added
//! (Megatron's bias-dropout-add), inside the same program; its mask is the one
//! [`dropout`](super::dropout()) draws over the whole tensor.
//!
//! Going back it is what the separate calls give: the residual's gradient is the
//! output's, the partial products' is the output's through the mask, the bias's that
//! summed over all leading dims — no communication.

use super::collective::Collective;
use super::dropout::{Dropout, dropout};
use super::group::TensorParallel;
use super::storage::cpu_collective;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};
#[cfg(feature = "cuda")]
use {super::storage::cuda_collective, candle_core::CudaStorage};

/// `residual + dropout(Σ_ranks partial + bias)` in one fused collective (see the module
/// docs; no dropout where `dropout` is `None`): `partial` and `residual` `[.., H]` (the
/// residual the same on every rank), `bias` `[H]` (the same on every rank); f32 tensors
/// (on the GPU with a group made by `TensorParallel::gpu`).
pub fn reduce_bias_residual(
    partial: &Tensor,
    bias: &Tensor,
    residual: &Tensor,
    dropout: Option<&Dropout>,
    tp: &TensorParallel,
) -> Result<Tensor> {
    let width = bias.dims1()?;
    if partial.dims() != residual.dims() || partial.dims().last() != Some(&width) {
        candle_core::bail!(
            "reduce_bias_residual: partial {:?}, bias {:?} and residual {:?} do not fit",
            partial.dims(),
            bias.dims(),
            residual.dims()
        );
    }
    for t in [partial, bias, residual] {
        if t.dtype() != DType::F32 || !t.device().same_device(partial.device()) {
            candle_core::bail!(
                "reduce_bias_residual: f32 tensors on one device, got {:?} on {:?} beside \
                 the partial sums on {:?}",
                t.dtype(),
                t.device(),
                partial.device()
            );
        }
    }
    if let Some(d) = dropout
        && !(0.0..1.0).contains(&d.p)
    {
        candle_core::bail!("dropout probability must be in [0, 1), got {}", d.p);
    }
    partial.contiguous()?.apply_op3(
        &bias.contiguous()?,
        &residual.contiguous()?,
        BiasResidual {
            tp: tp.clone(),
            dropout: dropout.copied().filter(|d| d.p > 0.0),
        },
    )
}

/// The op behind [`reduce_bias_residual`].
struct BiasResidual {
    tp: TensorParallel,
    dropout: Option<Dropout>,
}

impl BiasResidual {
    /// The collective for a bias of `width`, and its scalars.
    fn collective(&self, width: usize) -> (Collective, Vec<(&'static str, f64)>) {
        match self.dropout {
            Some(d) => (
                Collective::BiasDropoutResidual { width },
                vec![("drop", f64::from(d.p)), ("seed", d.key() as f64)],
            ),
            None => (Collective::BiasResidual { width }, vec![]),
        }
    }
}

impl CustomOp3 for BiasResidual {
    fn name(&self) -> &'static str {
        "coconet-reduce-bias-residual"
    }

    fn cpu_fwd(
        &self,
        partial: &CpuStorage,
        partial_layout: &Layout,
        bias: &CpuStorage,
        bias_layout: &Layout,
        residual: &CpuStorage,
        residual_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (what, scalars) = self.collective(bias_layout.shape().elem_count());
        cpu_collective(
            &self.tp,
            what,
            (partial, partial_layout),
            &[(bias, bias_layout), (residual, residual_layout)],
            &scalars,
            "coconet fused all-reduce",
        )
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        partial: &CudaStorage,
        partial_layout: &Layout,
        bias: &CudaStorage,
        bias_layout: &Layout,
        residual: &CudaStorage,
        residual_layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (what, scalars) = self.collective(bias_layout.shape().elem_count());
        cuda_collective(
            &self.tp,
            what,
            (partial, partial_layout),
            &[(bias, bias_layout), (residual, residual_layout)],
            &scalars,
            "coconet fused all-reduce",
        )
    }

    fn bwd(
        &self,
        _partial: &Tensor,
        bias: &Tensor,
        _residual: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let width = bias.dim(0)?;
        let rows = grad.elem_count() / width.max(1);
        let through = match &self.dropout {
            Some(d) => dropout(&grad.detach(), d)?,
            None => grad.clone(),
        };
        let bias_grad = through.reshape((rows, width))?.sum(0)?;
        Ok((Some(through), Some(bias_grad), Some(grad.clone())))
    }
}
