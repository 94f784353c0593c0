//! CTR-DNN as PaddleRec defines it (`models/rank/dnn`): 26 categorical slots looked up in
//! one shared embedding table, concatenated with the 13 count features, a ReLU MLP
//! (512-256-128-32) and a 2-way softmax, trained with cross-entropy.
//!
//! The embedding table lives in a [`ParamServer`]: a step pulls the rows its batch
//! touches into a leaf tensor, candle's autodiff gives that tensor's gradient (the
//! gathers' gradients summed per row), and the step pushes it back. The dense layers are
//! candle `Var`s updated by a dense optimizer (Adam). Dense weights are drawn from a
//! seeded generator (candle's own CPU generator cannot be seeded), so two workers built
//! with one seed start identical.

use super::TrainError;
use crate::data::{Batch, DENSE_FEATURES, ParamServer, SPARSE_SLOTS};
use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::{Linear, Module};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

/// The network's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct CtrDnnConfig {
    /// Widths of the hidden ReLU layers.
    pub hidden: Vec<usize>,
    /// Embedding dimension (the parameter server's row length).
    pub dim: usize,
    /// Seed of the dense layers' initial weights.
    pub seed: u64,
}

impl Default for CtrDnnConfig {
    /// PaddleRec's: FC 512-256-128-32, embeddings of 9.
    fn default() -> Self {
        CtrDnnConfig {
            hidden: vec![512, 256, 128, 32],
            dim: 9,
            seed: 0,
        }
    }
}

/// The dense part of CTR-DNN (the embedding rows are in the parameter server).
#[derive(Debug)]
pub struct CtrDnn {
    config: CtrDnnConfig,
    /// Weight and bias of every layer, input to output.
    vars: Vec<(Var, Var)>,
    device: Device,
}

/// A batch's categories as the rows to pull and, per lookup, which of them it reads.
struct Lookups {
    /// Distinct keys, in order of first appearance.
    unique: Vec<u64>,
    /// For each of the batch's `len × 26` lookups, its index in `unique`.
    inverse: Vec<u32>,
}

impl Lookups {
    fn of(keys: &[u64]) -> Lookups {
        let mut position: HashMap<u64, u32> = HashMap::with_capacity(keys.len());
        let mut unique = Vec::new();
        let inverse = keys
            .iter()
            .map(|&k| {
                *position.entry(k).or_insert_with(|| {
                    unique.push(k);
                    (unique.len() - 1) as u32
                })
            })
            .collect();
        Lookups { unique, inverse }
    }
}

/// What a forward and backward pass on one batch produced.
#[derive(Debug)]
pub struct Backward {
    /// Mean cross-entropy of the batch.
    pub loss: f32,
    /// Gradients of the dense layers' variables ([`CtrDnn::vars`]).
    pub dense: candle_core::backprop::GradStore,
    /// The distinct embedding rows the batch read.
    pub keys: Vec<u64>,
    /// Their gradients, `dim` per key.
    pub row_grads: Vec<f32>,
}

impl CtrDnn {
    /// A network with weights uniform in `±1/√fan_in` (PyTorch's `Linear` default).
    pub fn new(config: CtrDnnConfig) -> Result<CtrDnn, TrainError> {
        let device = Device::Cpu;
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let mut widths = vec![SPARSE_SLOTS * config.dim + DENSE_FEATURES];
        widths.extend(&config.hidden);
        widths.push(2);
        let mut vars = Vec::with_capacity(widths.len() - 1);
        for w in widths.windows(2) {
            let (fan_in, fan_out) = (w[0], w[1]);
            let bound = 1.0 / (fan_in as f32).sqrt();
            let mut uniform = |n: usize| -> Vec<f32> {
                (0..n).map(|_| rng.random_range(-bound..bound)).collect()
            };
            let weight = Var::from_vec(uniform(fan_in * fan_out), (fan_out, fan_in), &device)?;
            let bias = Var::from_vec(uniform(fan_out), fan_out, &device)?;
            vars.push((weight, bias));
        }
        Ok(CtrDnn {
            config,
            vars,
            device,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CtrDnnConfig {
        &self.config
    }

    /// Every dense parameter, layer by layer (weight, then bias): what a dense
    /// optimizer updates and a checkpoint saves.
    pub fn vars(&self) -> Vec<Var> {
        self.vars
            .iter()
            .flat_map(|(w, b)| [w.clone(), b.clone()])
            .collect()
    }

    /// Logits `[len, 2]` of a batch whose embedding rows are `rows` (`[unique, dim]`,
    /// gathered by `inverse`).
    fn logits(&self, rows: &Tensor, inverse: &[u32], batch: &Batch) -> Result<Tensor, TrainError> {
        let n = batch.len();
        let inverse = Tensor::from_slice(inverse, inverse.len(), &self.device)?;
        let embedded = rows
            .index_select(&inverse, 0)?
            .reshape((n, SPARSE_SLOTS * self.config.dim))?;
        let dense = Tensor::from_slice(&batch.dense, (n, DENSE_FEATURES), &self.device)?;
        let mut x = Tensor::cat(&[&embedded, &dense], 1)?;
        let last = self.vars.len() - 1;
        for (i, (w, b)) in self.vars.iter().enumerate() {
            x = Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone())).forward(&x)?;
            if i < last {
                x = x.relu()?;
            }
        }
        Ok(x)
    }

    fn rows(&self, ps: &ParamServer, keys: &[u64], pull: bool) -> Result<Tensor, TrainError> {
        let values = if pull { ps.pull(keys) } else { ps.lookup(keys) };
        Ok(Tensor::from_vec(
            values,
            (keys.len(), self.config.dim),
            &self.device,
        )?)
    }

    /// Forward and backward on a batch: pulls the batch's rows from `ps` and returns the
    /// loss, the dense gradients and the rows' gradients (not yet pushed: a synchronous
    /// data-parallel step merges every worker's first).
    pub fn backward(&self, ps: &ParamServer, batch: &Batch) -> Result<Backward, TrainError> {
        let lookups = Lookups::of(&batch.keys);
        let rows = Var::from_tensor(&self.rows(ps, &lookups.unique, true)?)?;
        let logits = self.logits(rows.as_tensor(), &lookups.inverse, batch)?;
        let labels: Vec<u32> = batch.labels.iter().map(|&l| l as u32).collect();
        let labels = Tensor::from_vec(labels, batch.len(), &self.device)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &labels)?;
        let dense = loss.backward()?;
        let row_grads = dense
            .get(rows.as_tensor())
            .ok_or_else(|| candle_core::Error::Msg("no gradient for the embedding rows".into()))?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(Backward {
            loss: loss.to_scalar::<f32>()?,
            dense,
            keys: lookups.unique,
            row_grads,
        })
    }

    /// Click probabilities of a batch (rows looked up without creating them).
    pub fn predict(&self, ps: &ParamServer, batch: &Batch) -> Result<Vec<f32>, TrainError> {
        let lookups = Lookups::of(&batch.keys);
        let rows = self.rows(ps, &lookups.unique, false)?;
        let logits = self.logits(&rows, &lookups.inverse, batch)?;
        let p = candle_nn::ops::softmax(&logits.to_dtype(DType::F32)?, D::Minus1)?;
        Ok(p.narrow(1, 1, 1)?.flatten_all()?.to_vec1::<f32>()?)
    }
}
