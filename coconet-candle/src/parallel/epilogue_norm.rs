//! The whole epilogue of the paper's Megatron layer in one collective: the row-parallel
//! layer's partial products summed, the bias added, dropout, the residual added — and
//! the layer norm that comes next, all in one coconet program
//! (`tp_bias_dropout_residual_norm`) whose fused schedule does them on each rank's block
//! of the rows only, between the reduce-scatter and the all-gather. It gives both what a
//! pre-norm transformer needs next: the residual stream `x` and `layer_norm(x)`, the
//! next sublayer's input.
//!
//! The residual stream is bitwise [`reduce_bias_residual`](super::reduce_bias_residual)'s;
//! the norm is coconet's `layer_norm` (biased variance, ε = 1e-5, its sums in a GPU
//! block's order), within rounding of candle's. Going back, the norm's gradient joins
//! the stream's before the dropout mask; the norm's weight and bias get theirs, summed
//! over the rows — no communication.

use super::collective::Collective;
use super::dropout::{Dropout, dropout};
use super::group::TensorParallel;
use super::storage::cpu_collective;
use candle_core::{CpuStorage, CustomOp3, D, DType, Layout, Result, Shape, Tensor};
#[cfg(feature = "cuda")]
use {super::storage::cuda_collective, candle_core::CudaStorage};

/// The layer norm's ε inside the fused program.
pub const NORM_EPS: f64 = 1e-5;

/// `x = residual + dropout(Σ_ranks partial + bias)` and `layer_norm(x, gamma, beta)` (ε
/// [`NORM_EPS`]) in one fused collective (see the module docs): `partial` and `residual`
/// `[.., H]` (the residual the same on every rank), `bias`, `gamma` and `beta` `[H]` (the
/// same on every rank); f32 tensors on one device. Returns `(x, layer_norm(x))`.
pub fn reduce_bias_residual_norm(
    partial: &Tensor,
    bias: &Tensor,
    residual: &Tensor,
    (gamma, beta): (&Tensor, &Tensor),
    dropout: Option<&Dropout>,
    tp: &TensorParallel,
) -> Result<(Tensor, Tensor)> {
    let width = bias.dims1()?;
    if partial.dims() != residual.dims()
        || partial.dims().last() != Some(&width)
        || gamma.dims() != [width]
        || beta.dims() != [width]
    {
        candle_core::bail!(
            "reduce_bias_residual_norm: partial {:?}, bias {:?}, residual {:?}, gamma {:?} \
             and beta {:?} do not fit",
            partial.dims(),
            bias.dims(),
            residual.dims(),
            gamma.dims(),
            beta.dims()
        );
    }
    for t in [partial, bias, residual, gamma, beta] {
        if t.dtype() != DType::F32 || !t.device().same_device(partial.device()) {
            candle_core::bail!(
                "reduce_bias_residual_norm: f32 tensors on one device, got {:?} on {:?} \
                 beside the partial sums on {:?}",
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
    // The three `[H]` parameters as one `[3, H]` operand (a custom op takes three); the
    // stack is candle's, so their gradients flow back to each.
    let params = Tensor::stack(&[bias, gamma, beta], 0)?;
    let both = partial.contiguous()?.apply_op3(
        &params,
        &residual.contiguous()?,
        BiasResidualNorm {
            tp: tp.clone(),
            dropout: dropout.copied().filter(|d| d.p > 0.0),
        },
    )?;
    Ok((both.get(0)?, both.get(1)?))
}

/// The op behind [`reduce_bias_residual_norm`]: `(partial, [bias; gamma; beta],
/// residual)` to `[x; layer_norm(x)]`.
struct BiasResidualNorm {
    tp: TensorParallel,
    dropout: Option<Dropout>,
}

impl BiasResidualNorm {
    const NAME: &'static str = "coconet fused all-reduce and layer norm";

    /// The collective and its scalars (a probability of 0 keeps every element, scaled by
    /// exactly 1).
    fn collective(&self, width: usize) -> (Collective, Vec<(&'static str, f64)>) {
        let (p, seed) = self
            .dropout
            .map_or((0.0, 0.0), |d| (f64::from(d.p), d.key() as f64));
        (
            Collective::BiasDropoutResidualNorm { width },
            vec![("drop", p), ("seed", seed)],
        )
    }
}

/// Rows `0..3` of the `[3, H]` parameters' layout, one each.
fn parameter_rows(layout: &Layout) -> Result<[Layout; 3]> {
    Ok([
        layout.narrow(0, 0, 1)?,
        layout.narrow(0, 1, 1)?,
        layout.narrow(0, 2, 1)?,
    ])
}

impl CustomOp3 for BiasResidualNorm {
    fn name(&self) -> &'static str {
        "coconet-reduce-bias-residual-norm"
    }

    fn cpu_fwd(
        &self,
        partial: &CpuStorage,
        partial_layout: &Layout,
        params: &CpuStorage,
        params_layout: &Layout,
        residual: &CpuStorage,
        residual_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let [b, g, be] = parameter_rows(params_layout)?;
        let (what, scalars) = self.collective(params_layout.dims()[1]);
        cpu_collective(
            &self.tp,
            what,
            (partial, partial_layout),
            &[
                (params, &b),
                (residual, residual_layout),
                (params, &g),
                (params, &be),
            ],
            &scalars,
            Self::NAME,
        )
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        partial: &CudaStorage,
        partial_layout: &Layout,
        params: &CudaStorage,
        params_layout: &Layout,
        residual: &CudaStorage,
        residual_layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let [b, g, be] = parameter_rows(params_layout)?;
        let (what, scalars) = self.collective(params_layout.dims()[1]);
        cuda_collective(
            &self.tp,
            what,
            (partial, partial_layout),
            &[
                (params, &b),
                (residual, residual_layout),
                (params, &g),
                (params, &be),
            ],
            &scalars,
            Self::NAME,
        )
    }

    fn bwd(
        &self,
        _partial: &Tensor,
        params: &Tensor,
        _residual: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let width = params.dim(1)?;
        let shape = out.get(0)?.shape().clone();
        let rows = shape.elem_count() / width.max(1);
        let x = out.get(0)?.detach().reshape((rows, width))?;
        let (g_stream, g_norm) = (grad.get(0)?, grad.get(1)?.reshape((rows, width))?);
        let gamma = params.get(1)?.detach();
        // The layer norm's backward, from its input x (recomputed statistics).
        let mean = x.mean_keepdim(D::Minus1)?;
        let centred = x.broadcast_sub(&mean)?;
        let inv = centred
            .sqr()?
            .mean_keepdim(D::Minus1)?
            .affine(1.0, NORM_EPS)?
            .sqrt()?
            .recip()?;
        let xhat = centred.broadcast_mul(&inv)?;
        let dxhat = g_norm.broadcast_mul(&gamma)?;
        let m1 = dxhat.mean_keepdim(D::Minus1)?;
        let m2 = (&dxhat * &xhat)?.mean_keepdim(D::Minus1)?;
        let dx = dxhat
            .broadcast_sub(&m1)?
            .sub(&xhat.broadcast_mul(&m2)?)?
            .broadcast_mul(&inv)?;
        let d_gamma = (&g_norm * &xhat)?.sum(0)?;
        let d_beta = g_norm.sum(0)?;
        // The stream's gradient: its own and the norm's.
        let g_x = (g_stream + dx.reshape(&shape)?)?;
        let through = match &self.dropout {
            Some(d) => dropout(&g_x.detach(), d)?,
            None => g_x.clone(),
        };
        let d_bias = through.reshape((rows, width))?.sum(0)?;
        let d_params = Tensor::stack(&[d_bias, d_gamma, d_beta], 0)?;
        Ok((Some(through), Some(d_params), Some(g_x)))
    }
}
