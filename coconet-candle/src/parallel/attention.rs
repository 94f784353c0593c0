//! Megatron-LM's self-attention over a rank's heads: the fused `qkv` projection
//! column-parallel (rank r computes the queries, keys and values of heads
//! `r·A/P..(r+1)·A/P`), attention per head with no communication, the output projection
//! row-parallel (its input features are the heads' outputs, head-major, so rank r's
//! columns are exactly its heads'). One all-reduce forward, one backward.

use super::dropout::{Dropout, dropout_slice};
use super::group::TensorParallel;
use super::linear::{ColumnParallelLinear, RowParallelLinear};
use candle_core::{D, Module, Result, Tensor, Var};
use candle_nn::Linear;

/// Causal multi-head self-attention over this rank's heads (see the module docs), a
/// drop-in for the single-device block that computes `qkv = x·Wᵀ + b` as
/// `[queries | keys | values]`, each `[W]` head-major, and `proj(attention)`.
#[derive(Clone, Debug)]
pub struct ParallelAttention {
    qkv: ColumnParallelLinear,
    proj: RowParallelLinear,
    /// Heads on this rank.
    heads: usize,
}

/// Rows `r·n..(r+1)·n` of each of the three `[W, ..]` thirds of `t` (the queries', keys'
/// and values' rows of this rank's heads), concatenated.
fn thirds(t: &Tensor, tp: &TensorParallel) -> Result<Tensor> {
    let rows = t.dim(0)?;
    let ranks = tp.size();
    if !rows.is_multiple_of(3) || !(rows / 3).is_multiple_of(ranks) {
        candle_core::bail!(
            "attention's qkv projection: {rows} output features are not three equal parts \
             that split evenly over {ranks} ranks"
        );
    }
    let n = rows / 3 / ranks;
    let parts = (0..3)
        .map(|i| t.narrow(0, i * rows / 3 + tp.rank() * n, n))
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&parts, 0)?.contiguous()?.copy()
}

impl ParallelAttention {
    /// This rank's shard of attention with `heads` heads, `qkv` `[3W, W]` and `proj`
    /// `[W, W]` (biases optional); `heads` must split evenly over the ranks.
    pub fn shard(
        qkv: &Linear,
        proj: &Linear,
        heads: usize,
        tp: &TensorParallel,
    ) -> Result<ParallelAttention> {
        if heads == 0 || !heads.is_multiple_of(tp.size()) {
            candle_core::bail!(
                "attention: {heads} heads do not split evenly over {} ranks",
                tp.size()
            );
        }
        let weight = Var::from_tensor(&thirds(qkv.weight(), tp)?)?;
        let bias = match qkv.bias() {
            Some(b) => Some(Var::from_tensor(
                &thirds(&b.unsqueeze(1)?, tp)?.squeeze(1)?,
            )?),
            None => None,
        };
        Ok(ParallelAttention {
            qkv: ColumnParallelLinear::new(weight, bias, tp),
            proj: RowParallelLinear::shard(proj, tp)?,
            heads: heads / tp.size(),
        })
    }

    /// The block with its projections' matmuls overlapped with their all-reduces: the
    /// output projection's forward in `chunks` row chunks, the qkv projection's backward
    /// ([`RowParallelLinear::with_overlap`], [`ColumnParallelLinear::with_overlap`]).
    pub fn with_overlap(self, chunks: usize) -> ParallelAttention {
        ParallelAttention {
            qkv: self.qkv.with_overlap(),
            proj: self.proj.with_overlap(chunks),
            heads: self.heads,
        }
    }

    /// The parameters every rank holds whole (the output projection's bias): under the
    /// sequence-parallel variant each rank's gradient of them is partial (sum it over
    /// the ranks).
    pub fn replicated_vars(&self) -> Vec<Var> {
        self.proj.replicated_vars()
    }

    /// This rank's parameters: `qkv`'s, then `proj`'s.
    pub fn vars(&self) -> Vec<Var> {
        let mut vars = self.qkv.vars();
        vars.extend(self.proj.vars());
        vars
    }

    /// The whole `qkv` and `proj` layers on every rank (every rank calls it).
    pub fn gather(&self) -> Result<(Linear, Linear)> {
        let (local, proj) = (self.qkv.gather()?, self.proj.gather()?);
        // Rank-major `[P · 3n, ..]` back to the three thirds, each rank-major.
        let regroup = |t: &Tensor| -> Result<Tensor> {
            let (ranks, n) = (self.qkv_ranks(), t.dim(0)? / self.qkv_ranks() / 3);
            let mut parts = Vec::with_capacity(3 * ranks);
            for i in 0..3 {
                for r in 0..ranks {
                    parts.push(t.narrow(0, (3 * r + i) * n, n)?);
                }
            }
            Tensor::cat(&parts, 0)?.contiguous()
        };
        let weight = regroup(local.weight())?;
        let bias = match local.bias() {
            Some(b) => Some(regroup(&b.unsqueeze(1)?)?.squeeze(1)?),
            None => None,
        };
        Ok((Linear::new(weight, bias), proj))
    }

    /// The heads on this rank.
    pub fn heads(&self) -> usize {
        self.heads
    }

    fn qkv_ranks(&self) -> usize {
        self.qkv.ranks()
    }

    /// `[B, T, W]` (the same on every rank) to `[B, T, W]` (the same on every rank),
    /// adding `mask` (`[T, T]`: 0 where a position may attend, -inf where not) to the
    /// scores.
    pub fn forward(&self, x: &Tensor, mask: &Tensor) -> Result<Tensor> {
        self.forward_with(x, mask, None)
    }

    /// [`ParallelAttention::forward`] with dropout on the attention probabilities
    /// (`dropout.site(0)`, each rank drawing its heads' part of the whole mask).
    pub fn forward_with(
        &self,
        x: &Tensor,
        mask: &Tensor,
        dropout: Option<&Dropout>,
    ) -> Result<Tensor> {
        self.proj.forward(&self.heads_output(x, mask, dropout)?)
    }

    /// `residual + dropout(self.forward_with(x, mask, dropout))`, the output projection's
    /// bias, the output's dropout (`dropout.site(1)`) and the residual inside its
    /// all-reduce ([`RowParallelLinear::forward_residual`]).
    pub fn forward_residual(
        &self,
        x: &Tensor,
        mask: &Tensor,
        residual: &Tensor,
        dropout: Option<&Dropout>,
    ) -> Result<Tensor> {
        let out = dropout.map(|d| d.site(1));
        let heads = self.heads_output(x, mask, dropout)?;
        self.proj.forward_residual(&heads, residual, out.as_ref())
    }

    /// [`ParallelAttention::forward_residual`] with the next layer norm fused in too:
    /// `(x, layer_norm(x))` ([`RowParallelLinear::forward_residual_norm`]).
    pub fn forward_residual_norm(
        &self,
        x: &Tensor,
        mask: &Tensor,
        residual: &Tensor,
        dropout: Option<&Dropout>,
        norm: (&Tensor, &Tensor),
    ) -> Result<(Tensor, Tensor)> {
        let out = dropout.map(|d| d.site(1));
        let heads = self.heads_output(x, mask, dropout)?;
        self.proj
            .forward_residual_norm(&heads, residual, out.as_ref(), norm)
    }

    /// The sequence-parallel variant: this rank's block `[n, W]` of the `[B·T, W]`
    /// tokens (sequence after sequence) to its block of the output `[n, W]` (all-gathered
    /// in, reduce-scattered out), with dropout on the probabilities as
    /// [`ParallelAttention::forward_with`] (the output's is the caller's, on its block).
    pub fn forward_sequence_parallel(
        &self,
        x: &Tensor,
        batch: usize,
        mask: &Tensor,
        dropout: Option<&Dropout>,
    ) -> Result<Tensor> {
        let qkv = self.qkv.forward_sequence_parallel(x)?;
        let (tokens, features) = qkv.dims2()?;
        if batch == 0 || !tokens.is_multiple_of(batch) {
            candle_core::bail!("attention: {tokens} tokens are not {batch} sequences");
        }
        let qkv = qkv.reshape((batch, tokens / batch, features))?;
        let y = self.attend_masked(&qkv, mask, dropout)?;
        let y = y.reshape((tokens, y.dim(2)?))?;
        self.proj.forward_sequence_parallel(&y)
    }

    /// This rank's heads' outputs `[B, T, W/P]`, head-major.
    fn heads_output(&self, x: &Tensor, mask: &Tensor, dropout: Option<&Dropout>) -> Result<Tensor> {
        self.attend_masked(&self.qkv.forward(x)?, mask, dropout)
    }

    /// Attention of this rank's heads from their queries, keys and values `qkv`
    /// `[B, T, 3W/P]`: `[B, T, W/P]`, head-major.
    fn attend_masked(
        &self,
        qkv: &Tensor,
        mask: &Tensor,
        dropout: Option<&Dropout>,
    ) -> Result<Tensor> {
        let (b, t, _) = qkv.dims3()?;
        let local = qkv.dim(2)? / 3;
        let hd = local / self.heads;
        let head = |i: usize| -> Result<Tensor> {
            qkv.narrow(2, i * local, local)?
                .reshape((b, t, self.heads, hd))?
                .transpose(1, 2)?
                .contiguous()
        };
        let (q, k, v) = (head(0)?, head(1)?, head(2)?);
        let scores = (q.matmul(&k.t()?.contiguous()?)? / (hd as f64).sqrt())?;
        let mut attention = candle_nn::ops::softmax(&scores.broadcast_add(mask)?, D::Minus1)?;
        if let Some(d) = dropout {
            let ranks = self.qkv_ranks();
            let whole = [b, self.heads * ranks, t, t];
            let first = self.proj.rank() * self.heads;
            attention = dropout_slice(&attention, &d.site(0), &whole, 1, first)?;
        }
        attention
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, t, local))
    }
}
