//! The vocabulary split over ranks (Megatron-LM): rank r holds rows `r·V/P..(r+1)·V/P` of
//! the token embedding and of the output head, so neither the embedding table nor the
//! logits exist whole anywhere.
//!
//! - [`VocabParallelEmbedding`]: each rank looks up the tokens in its range (zero for the
//!   others) and the rows are summed over ranks; going back, each rank's rows get the
//!   gradients of its own tokens.
//! - [`vocab_parallel_cross_entropy`]: the mean cross-entropy from each rank's logits
//!   `[N, V/P]`, with three all-reduces of `N` numbers each (the row maxima, the sums of
//!   exponentials, the target's logit) instead of gathering `N·V`; its gradient on each
//!   rank is `softmax − one-hot` over the rank's own columns, with no communication.

use super::collective::Collective;
use super::group::TensorParallel;
use super::linear::gather_rows;
use super::ops::{collect, reduce_from_parallel};
use super::sequence::scatter_to_sequence_parallel;
use candle_core::{D, DType, Module, Result, Tensor, Var};
use candle_nn::Embedding;

/// A token embedding over this rank's rows of the vocabulary (see the module docs), a
/// drop-in for `candle_nn::Embedding` on the whole table.
#[derive(Clone, Debug)]
pub struct VocabParallelEmbedding {
    weight: Var,
    tp: TensorParallel,
}

/// This rank's range of the vocabulary, of `vocab` tokens over the group.
fn range(vocab: usize, tp: &TensorParallel, what: &str) -> Result<std::ops::Range<usize>> {
    let ranks = tp.size();
    if !vocab.is_multiple_of(ranks) {
        candle_core::bail!(
            "{what}: a vocabulary of {vocab} does not split evenly over {ranks} ranks"
        );
    }
    let n = vocab / ranks;
    Ok(tp.rank() * n..(tp.rank() + 1) * n)
}

/// For token ids `ids` (u32, any shape): the ids within `mine` made local (others 0) and
/// a mask, 1 where an id is within `mine`, as f32 `[ids.., 1]`.
fn localise(ids: &Tensor, mine: &std::ops::Range<usize>) -> Result<(Tensor, Tensor)> {
    let flat = ids.flatten_all()?.to_dtype(DType::U32)?.to_vec1::<u32>()?;
    let inside = |&i: &u32| mine.contains(&(i as usize));
    let local: Vec<u32> = flat
        .iter()
        .map(|i| if inside(i) { i - mine.start as u32 } else { 0 })
        .collect();
    let mask: Vec<f32> = flat
        .iter()
        .map(|i| f32::from(u8::from(inside(i))))
        .collect();
    let mut mask_shape = ids.dims().to_vec();
    mask_shape.push(1);
    Ok((
        Tensor::from_vec(local, ids.dims(), ids.device())?,
        Tensor::from_vec(mask, mask_shape, ids.device())?,
    ))
}

impl VocabParallelEmbedding {
    /// This rank's rows of `full`'s table, as a new `Var`.
    pub fn shard(full: &Embedding, tp: &TensorParallel) -> Result<VocabParallelEmbedding> {
        let table = full.embeddings();
        let mine = range(table.dim(0)?, tp, "a vocabulary-parallel embedding")?;
        let rows = table
            .narrow(0, mine.start, mine.len())?
            .contiguous()?
            .copy()?;
        Ok(VocabParallelEmbedding {
            weight: Var::from_tensor(&rows)?,
            tp: tp.clone(),
        })
    }

    /// This rank's parameter: its rows of the table.
    pub fn vars(&self) -> Vec<Var> {
        vec![self.weight.clone()]
    }

    /// The whole table on every rank (every rank calls it).
    pub fn gather(&self) -> Result<Embedding> {
        let table = gather_rows(self.weight.as_tensor(), &self.tp)?;
        let width = table.dim(1)?;
        Ok(Embedding::new(table, width))
    }

    /// The sequence-parallel variant: token ids (u32, any shape with `N` elements, the
    /// same on every rank) to this rank's block `[N/P, W]` of their embeddings, in the
    /// ids' order (reduce-scattered instead of all-reduced).
    pub fn forward_sequence_parallel(&self, ids: &Tensor) -> Result<Tensor> {
        let rows = self.masked_rows(ids)?;
        let width = rows.dim(D::Minus1)?;
        scatter_to_sequence_parallel(&rows.reshape((ids.elem_count(), width))?, &self.tp)
    }

    /// This rank's rows for `ids`, zero for the ids of other ranks.
    fn masked_rows(&self, ids: &Tensor) -> Result<Tensor> {
        let (local, mask) = localise(ids, &self.mine()?)?;
        let width = self.weight.dim(1)?;
        let rows = Embedding::new(self.weight.as_tensor().clone(), width).forward(&local)?;
        rows.broadcast_mul(&mask)
    }

    fn mine(&self) -> Result<std::ops::Range<usize>> {
        let rows = self.weight.dim(0)?;
        Ok(self.tp.rank() * rows..(self.tp.rank() + 1) * rows)
    }
}

impl Module for VocabParallelEmbedding {
    /// Token ids (u32, any shape, the same on every rank) to their embeddings
    /// `[ids.., W]` (the same on every rank).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        reduce_from_parallel(&self.masked_rows(ids)?, &self.tp)
    }
}

/// The mean cross-entropy of `logits` (`[N, V/P]`: this rank's columns of the whole
/// `[N, V]`, e.g. from a [`ColumnParallelLinear`](super::ColumnParallelLinear) head)
/// against `targets` (`[N]`, u32, the same on every rank) — the same scalar on every rank,
/// equal to `candle_nn::loss::cross_entropy` of the whole logits (see the module docs).
pub fn vocab_parallel_cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    tp: &TensorParallel,
) -> Result<Tensor> {
    let (n, columns) = logits.dims2()?;
    let mine = tp.rank() * columns..(tp.rank() + 1) * columns;
    // The row maxima only keep the exponentials in range: no gradient flows through them
    // (softmax does not depend on them), so they are taken detached.
    let local_max = logits.detach().max_keepdim(D::Minus1)?;
    let max =
        collect(&local_max, Collective::Max, tp, "coconet all-reduce (max)")?.reshape((n, 1))?;
    let shifted = logits.broadcast_sub(&max)?;
    let sum_exp = reduce_from_parallel(&shifted.exp()?.sum_keepdim(D::Minus1)?, tp)?;
    let (local, mask) = localise(targets, &mine)?;
    let picked = shifted
        .gather(&local.unsqueeze(1)?.contiguous()?, 1)?
        .mul(&mask)?;
    let target = reduce_from_parallel(&picked, tp)?;
    (sum_exp.log()? - target)?.mean_all()
}
