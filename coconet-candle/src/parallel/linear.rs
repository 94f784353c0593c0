//! Megatron-LM's two linear layers over a rank's shard of the weights, each a drop-in for
//! `candle_nn::Linear` on the whole weight:
//!
//! - [`ColumnParallelLinear`]: rank r holds rows `r·O/P..(r+1)·O/P` of the `[O, I]`
//!   weight (and of the bias): it takes the whole input and gives its `O/P` output
//!   features; the input's gradient is summed over ranks going back.
//! - [`RowParallelLinear`]: rank r holds columns `r·I/P..(r+1)·I/P`: it takes its `I/P`
//!   input features (a column-parallel layer's output) and gives the whole output, the
//!   partial products summed over ranks (in rank order), then the bias added once.
//!
//! A column-parallel layer followed by a row-parallel one communicates once each way
//! (Megatron's MLP): nothing between them.
//!
//! [`ColumnParallelLinear::shard`] and [`RowParallelLinear::shard`] cut an existing
//! layer's weights into new `Var`s (train them with any optimizer); `gather` puts the
//! whole layer back together on every rank (to save a single-device checkpoint).

use super::collective::Collective;
use super::dropout::Dropout;
use super::epilogue::reduce_bias_residual;
use super::epilogue_norm::reduce_bias_residual_norm;
use super::group::TensorParallel;
use super::ops::{checked, collect, copy_to_parallel, reduce_from_parallel};
use super::overlap::{column_parallel_overlapped, row_parallel_overlapped};
use super::sequence::{gather_from_sequence_parallel, scatter_to_sequence_parallel};
use candle_core::{D, DType, Module, Result, Tensor, Var};
use candle_nn::Linear;

/// A column-parallel linear layer (see the module docs).
#[derive(Clone, Debug)]
pub struct ColumnParallelLinear {
    weight: Var,
    bias: Option<Var>,
    tp: TensorParallel,
    /// Whether the backward pass overlaps the input gradient's all-reduce with the
    /// weight's gradient ([`ColumnParallelLinear::with_overlap`]).
    overlap: bool,
}

/// A row-parallel linear layer (see the module docs).
#[derive(Clone, Debug)]
pub struct RowParallelLinear {
    weight: Var,
    bias: Option<Var>,
    tp: TensorParallel,
    /// Row chunks whose all-reduces overlap the next chunk's product, if any
    /// ([`RowParallelLinear::with_overlap`]).
    overlap: Option<usize>,
}

/// Rank `tp.rank()`'s block of dim `dim` of `t`, copied into a new `Var`; an error names
/// `what` where the dim does not split evenly.
fn block(t: &Tensor, dim: usize, tp: &TensorParallel, what: &str) -> Result<Var> {
    let (size, ranks) = (t.dim(dim)?, tp.size());
    if ranks == 0 || !size.is_multiple_of(ranks) {
        candle_core::bail!(
            "{what}: dim {dim} of {:?} does not split evenly over {ranks} ranks",
            t.dims()
        );
    }
    let n = size / ranks;
    Var::from_tensor(&t.narrow(dim, tp.rank() * n, n)?.contiguous()?.copy()?)
}

/// Every rank's `mine` (a contiguous f32 tensor of the same shape on every rank),
/// concatenated along dim 0 in rank order.
pub(crate) fn gather_rows(mine: &Tensor, tp: &TensorParallel) -> Result<Tensor> {
    let mut dims = mine.dims().to_vec();
    if dims.is_empty() {
        candle_core::bail!("gathering a scalar");
    }
    dims[0] *= tp.size();
    collect(mine, Collective::Gather, tp, "coconet all-gather")?.reshape(dims)
}

impl ColumnParallelLinear {
    /// This rank's shard of `full` (rows of its weight and bias), as new `Var`s.
    pub fn shard(full: &Linear, tp: &TensorParallel) -> Result<ColumnParallelLinear> {
        let what = "a column-parallel layer's output features";
        Ok(ColumnParallelLinear {
            weight: block(full.weight(), 0, tp, what)?,
            bias: full.bias().map(|b| block(b, 0, tp, what)).transpose()?,
            tp: tp.clone(),
            overlap: false,
        })
    }

    /// A layer over this rank's shard as given: `weight` `[O/P, I]`, `bias` `[O/P]`.
    pub fn new(weight: Var, bias: Option<Var>, tp: &TensorParallel) -> ColumnParallelLinear {
        ColumnParallelLinear {
            weight,
            bias,
            tp: tp.clone(),
            overlap: false,
        }
    }

    /// The layer with its backward pass overlapped: the input gradient's all-reduce
    /// runs on the rank's communication thread while the weight's gradient is computed
    /// (`forward` only; the sequence-parallel variant is not overlapped).
    pub fn with_overlap(mut self) -> ColumnParallelLinear {
        self.overlap = true;
        self
    }

    /// This rank's parameters: the weight shard, then the bias shard (if any).
    pub fn vars(&self) -> Vec<Var> {
        std::iter::once(self.weight.clone())
            .chain(self.bias.clone())
            .collect()
    }

    /// The number of ranks the layer is split over.
    pub(crate) fn ranks(&self) -> usize {
        self.tp.size()
    }

    /// The whole layer on every rank (every rank calls it).
    pub fn gather(&self) -> Result<Linear> {
        let weight = gather_rows(self.weight.as_tensor(), &self.tp)?;
        let bias = match &self.bias {
            Some(b) => Some(gather_rows(b.as_tensor(), &self.tp)?),
            None => None,
        };
        Ok(Linear::new(weight, bias))
    }
}

impl ColumnParallelLinear {
    /// The sequence-parallel variant: this rank's block of the tokens `[n, I]` to this
    /// rank's output features of every token, `[P·n, O/P]` (the tokens all-gathered
    /// first; their gradient reduce-scattered going back).
    pub fn forward_sequence_parallel(&self, x: &Tensor) -> Result<Tensor> {
        let x = gather_from_sequence_parallel(x, &self.tp)?;
        self.local().forward(&x)
    }

    fn local(&self) -> Linear {
        Linear::new(
            self.weight.as_tensor().clone(),
            self.bias.as_ref().map(|b| b.as_tensor().clone()),
        )
    }
}

impl Module for ColumnParallelLinear {
    /// `[.., I]` (the same on every rank) to this rank's `[.., O/P]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.overlap {
            let y = column_parallel_overlapped(
                &checked(x, "a column-parallel layer")?,
                self.weight.as_tensor(),
                &self.tp,
            )?;
            return match &self.bias {
                Some(b) => y.broadcast_add(b.as_tensor()),
                None => Ok(y),
            };
        }
        let x = copy_to_parallel(x, &self.tp)?;
        self.local().forward(&x)
    }
}

impl RowParallelLinear {
    /// This rank's shard of `full` (columns of its weight; the bias whole), as new
    /// `Var`s.
    pub fn shard(full: &Linear, tp: &TensorParallel) -> Result<RowParallelLinear> {
        let what = "a row-parallel layer's input features";
        Ok(RowParallelLinear {
            weight: block(full.weight(), 1, tp, what)?,
            bias: full
                .bias()
                .map(|b| Var::from_tensor(&b.copy()?))
                .transpose()?,
            tp: tp.clone(),
            overlap: None,
        })
    }

    /// A layer over this rank's shard as given: `weight` `[O, I/P]`, `bias` `[O]` (the
    /// same on every rank).
    pub fn new(weight: Var, bias: Option<Var>, tp: &TensorParallel) -> RowParallelLinear {
        RowParallelLinear {
            weight,
            bias,
            tp: tp.clone(),
            overlap: None,
        }
    }

    /// The layer with its forward pass overlapped: the partial product computed in
    /// `chunks` row chunks, each chunk's all-reduce running on the rank's communication
    /// thread while the next chunk is computed (`forward` only; `forward_residual`'s
    /// fused epilogue and the sequence-parallel variant are not overlapped).
    pub fn with_overlap(mut self, chunks: usize) -> RowParallelLinear {
        self.overlap = Some(chunks.max(1));
        self
    }

    /// This rank's parameters: the weight shard, then the bias (if any; its gradient is
    /// the same on every rank).
    pub fn vars(&self) -> Vec<Var> {
        std::iter::once(self.weight.clone())
            .chain(self.bias.clone())
            .collect()
    }

    /// This rank.
    pub(crate) fn rank(&self) -> usize {
        self.tp.rank()
    }

    /// The parameters every rank holds whole (the bias): under the sequence-parallel
    /// variant each rank's gradient of them is partial (sum it over the ranks).
    pub fn replicated_vars(&self) -> Vec<Var> {
        self.bias.iter().cloned().collect()
    }

    /// The whole layer on every rank (every rank calls it).
    pub fn gather(&self) -> Result<Linear> {
        let columns = self.weight.as_tensor().t()?.contiguous()?;
        let weight = gather_rows(&columns, &self.tp)?.t()?.contiguous()?;
        let bias = self.bias.as_ref().map(|b| b.as_tensor().clone());
        Ok(Linear::new(weight, bias))
    }
}

impl RowParallelLinear {
    /// `residual + dropout(self.forward(x))`, with the bias, the dropout (if any) and the
    /// residual inside the all-reduce ([`reduce_bias_residual`]): bitwise the separate
    /// calls (with [`dropout`](super::dropout())), one pass over the sum instead of three.
    pub fn forward_residual(
        &self,
        x: &Tensor,
        residual: &Tensor,
        dropout: Option<&Dropout>,
    ) -> Result<Tensor> {
        let (partial, bias) = self.partial_and_bias(x)?;
        reduce_bias_residual(&partial, &bias, residual, dropout, &self.tp)
    }

    /// This rank's partial product `x·Wᵀ` (without the bias) and the bias (zeros where
    /// the layer has none): what the fused epilogues take.
    fn partial_and_bias(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let partial = Linear::new(self.weight.as_tensor().clone(), None).forward(x)?;
        let bias = match &self.bias {
            Some(b) => b.as_tensor().clone(),
            None => Tensor::zeros(partial.dim(D::Minus1)?, DType::F32, partial.device())?,
        };
        Ok((partial, bias))
    }

    /// [`RowParallelLinear::forward_residual`] with the layer norm that follows fused in
    /// too (`norm`: its weight and bias, `[O]`): `(x, layer_norm(x))` for `x` the
    /// residual stream (see [`reduce_bias_residual_norm`]).
    pub fn forward_residual_norm(
        &self,
        x: &Tensor,
        residual: &Tensor,
        dropout: Option<&Dropout>,
        norm: (&Tensor, &Tensor),
    ) -> Result<(Tensor, Tensor)> {
        let (partial, bias) = self.partial_and_bias(x)?;
        reduce_bias_residual_norm(&partial, &bias, residual, norm, dropout, &self.tp)
    }

    /// The sequence-parallel variant: this rank's `[N, I/P]` (every token) to this
    /// rank's block of the tokens of the whole output, `[N/P, O]` (the partial products
    /// reduce-scattered, then the bias added to the block; its gradient is then partial
    /// on each rank: sum it over the ranks).
    pub fn forward_sequence_parallel(&self, x: &Tensor) -> Result<Tensor> {
        let partial = Linear::new(self.weight.as_tensor().clone(), None).forward(x)?;
        let y = scatter_to_sequence_parallel(&partial, &self.tp)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b.as_tensor()),
            None => Ok(y),
        }
    }
}

impl Module for RowParallelLinear {
    /// This rank's `[.., I/P]` to the whole `[.., O]` (the same on every rank).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match self.overlap {
            Some(chunks) => row_parallel_overlapped(
                &checked(x, "a row-parallel layer")?,
                self.weight.as_tensor(),
                &self.tp,
                chunks,
            )?,
            None => {
                let partial = Linear::new(self.weight.as_tensor().clone(), None).forward(x)?;
                reduce_from_parallel(&partial, &self.tp)?
            }
        };
        match &self.bias {
            Some(b) => y.broadcast_add(b.as_tensor()),
            None => Ok(y),
        }
    }
}
