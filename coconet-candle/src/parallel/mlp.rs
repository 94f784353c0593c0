//! Megatron-LM's MLP block over a rank's shard: a column-parallel layer, the activation on
//! this rank's `4H/P` hidden features, a row-parallel layer — one all-reduce forward (at
//! the end) and one backward (at the input), nothing between.

use super::dropout::Dropout;
use super::group::TensorParallel;
use super::linear::{ColumnParallelLinear, RowParallelLinear};
use candle_core::{Module, Result, Tensor, Var};
use candle_nn::{Activation, Linear};

/// A tensor-parallel MLP block (see the module docs), a drop-in for
/// `proj(activation(fc(x)))` on the whole weights.
#[derive(Clone, Debug)]
pub struct ParallelMlp {
    fc: ColumnParallelLinear,
    activation: Activation,
    proj: RowParallelLinear,
}

impl ParallelMlp {
    /// This rank's shard of the block `proj(activation(fc(x)))`.
    pub fn shard(
        fc: &Linear,
        activation: Activation,
        proj: &Linear,
        tp: &TensorParallel,
    ) -> Result<ParallelMlp> {
        Ok(ParallelMlp {
            fc: ColumnParallelLinear::shard(fc, tp)?,
            activation,
            proj: RowParallelLinear::shard(proj, tp)?,
        })
    }

    /// The block with both layers' matmuls overlapped with their all-reduces: the
    /// output projection's forward in `chunks` row chunks, the input projection's
    /// backward ([`RowParallelLinear::with_overlap`],
    /// [`ColumnParallelLinear::with_overlap`]).
    pub fn with_overlap(self, chunks: usize) -> ParallelMlp {
        ParallelMlp {
            fc: self.fc.with_overlap(),
            activation: self.activation,
            proj: self.proj.with_overlap(chunks),
        }
    }

    /// The parameters every rank holds whole (the output projection's bias): under the
    /// sequence-parallel variant each rank's gradient of them is partial (sum it over
    /// the ranks).
    pub fn replicated_vars(&self) -> Vec<Var> {
        self.proj.replicated_vars()
    }

    /// This rank's parameters: `fc`'s, then `proj`'s.
    pub fn vars(&self) -> Vec<Var> {
        let mut vars = self.fc.vars();
        vars.extend(self.proj.vars());
        vars
    }

    /// `residual + dropout(self.forward(x))`, the bias, the dropout (if any) and the
    /// residual added inside the all-reduce ([`RowParallelLinear::forward_residual`]).
    pub fn forward_residual(
        &self,
        x: &Tensor,
        residual: &Tensor,
        dropout: Option<&Dropout>,
    ) -> Result<Tensor> {
        let hidden = self.activation.forward(&self.fc.forward(x)?)?;
        self.proj.forward_residual(&hidden, residual, dropout)
    }

    /// [`ParallelMlp::forward_residual`] with the next layer norm fused in too:
    /// `(x, layer_norm(x))` ([`RowParallelLinear::forward_residual_norm`]).
    pub fn forward_residual_norm(
        &self,
        x: &Tensor,
        residual: &Tensor,
        dropout: Option<&Dropout>,
        norm: (&Tensor, &Tensor),
    ) -> Result<(Tensor, Tensor)> {
        let hidden = self.activation.forward(&self.fc.forward(x)?)?;
        self.proj
            .forward_residual_norm(&hidden, residual, dropout, norm)
    }

    /// The sequence-parallel variant: this rank's block of the tokens `[n, H]` to its
    /// block of the block's output `[n, H]` (all-gathered in, reduce-scattered out).
    pub fn forward_sequence_parallel(&self, x: &Tensor) -> Result<Tensor> {
        let hidden = self
            .activation
            .forward(&self.fc.forward_sequence_parallel(x)?)?;
        self.proj.forward_sequence_parallel(&hidden)
    }

    /// The whole `fc` and `proj` layers on every rank (every rank calls it).
    pub fn gather(&self) -> Result<(Linear, Linear)> {
        Ok((self.fc.gather()?, self.proj.gather()?))
    }
}

impl Module for ParallelMlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let hidden = self.activation.forward(&self.fc.forward(x)?)?;
        self.proj.forward(&hidden)
    }
}
