//! The sequence-parallel variant (Korthikanti et al., Megatron-LM): between the tensor-
//! parallel regions — layer norms, residual additions, dropout — each rank holds only its
//! block of the tokens (`[N/P, H]` of the `[N, H]` tokens of a batch, flattened), so those
//! activations take 1/P of the memory and their work is split too. The all-reduce at each
//! region's end becomes a reduce-scatter, and each region starts with an all-gather:
//!
//! - [`gather_from_sequence_parallel`]: all-gather of the token blocks going forward, the
//!   gradient reduce-scattered going back;
//! - [`scatter_to_sequence_parallel`]: reduce-scatter going forward (the sum over ranks,
//!   this rank's block of the tokens), the gradient all-gathered going back.
//!
//! A parameter every rank holds whole but applies to its own tokens only (layer norms,
//! position embeddings, a row-parallel layer's bias) gets a partial gradient on each rank:
//! sum it over the ranks ([`TensorParallel::sum_over_ranks`]) before the optimizer step.

use super::collective::Collective;
use super::group::TensorParallel;
use super::storage::cpu_collective;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
#[cfg(feature = "cuda")]
use {super::storage::cuda_collective, candle_core::CudaStorage};

/// `[n, ..]` on each rank to `[P·n, ..]`, every rank's block in rank order (see the
/// module docs).
pub fn gather_from_sequence_parallel(x: &Tensor, tp: &TensorParallel) -> Result<Tensor> {
    checked(x, "gather_from_sequence_parallel")?.apply_op1(Gather(tp.clone()))
}

/// `[N, ..]` on each rank (`N` a multiple of P) to this rank's block `[N/P, ..]` of the
/// sum over ranks (see the module docs).
pub fn scatter_to_sequence_parallel(x: &Tensor, tp: &TensorParallel) -> Result<Tensor> {
    checked(x, "scatter_to_sequence_parallel")?.apply_op1(Scatter(tp.clone()))
}

/// `x` made contiguous, or an error where coconet cannot take it yet.
fn checked(x: &Tensor, what: &str) -> Result<Tensor> {
    if x.dtype() != DType::F32 || x.rank() == 0 {
        candle_core::bail!(
            "{what}: f32 tensors of at least one dim, got {:?} {:?} on {:?}",
            x.dtype(),
            x.dims(),
            x.device()
        );
    }
    x.contiguous()
}

/// The op behind [`gather_from_sequence_parallel`].
struct Gather(TensorParallel);

impl CustomOp1 for Gather {
    fn name(&self) -> &'static str {
        "coconet-gather-from-sequence-parallel"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_collective(
            &self.0,
            Collective::Gather,
            (storage, layout),
            &[],
            &[],
            self.name(),
        )
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        cuda_collective(
            &self.0,
            Collective::Gather,
            (storage, layout),
            &[],
            &[],
            self.name(),
        )
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        checked(grad, self.name())?
            .apply_op1_no_bwd(&Scatter(self.0.clone()))
            .map(Some)
    }
}

/// The op behind [`scatter_to_sequence_parallel`].
struct Scatter(TensorParallel);

impl CustomOp1 for Scatter {
    fn name(&self) -> &'static str {
        "coconet-scatter-to-sequence-parallel"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let what = Collective::ReduceScatter;
        cpu_collective(&self.0, what, (storage, layout), &[], &[], self.name())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        let what = Collective::ReduceScatter;
        cuda_collective(&self.0, what, (storage, layout), &[], &[], self.name())
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        checked(grad, self.name())?
            .apply_op1_no_bwd(&Gather(self.0.clone()))
            .map(Some)
    }
}
