//! CTR-DNN as PaddleRec defines it (`models/rank/dnn`): 26 categorical slots looked up in
//! one shared embedding table, concatenated with the 13 count features, a ReLU MLP
//! (512-256-128-32) and a 2-way softmax, trained with cross-entropy.
//!
//! The embedding table lives in a [`ParamServer`](crate::data::ParamServer) (or a
//! [`RemoteTable`](crate::data::RemoteTable)): a step pulls the rows its batch
//! touches into a leaf tensor, candle's autodiff gives that tensor's gradient (the
//! gathers' gradients summed per row), and the step pushes it back. The dense layers are
//! candle `Var`s updated by a dense optimizer (Adam). Dense weights are drawn from a
//! seeded generator (candle's own CPU generator cannot be seeded), so two workers built
//! with one seed start identical.

use super::error::TrainError;
use crate::data::{Batch, DENSE_FEATURES, EmbeddingTable, SPARSE_SLOTS};
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

/// A pipeline stage's input.
#[derive(Debug)]
pub enum StageInput<'a> {
    /// The (micro-)batch, for the stage that starts with the embedding.
    Batch(&'a Batch),
    /// The previous stage's output activation.
    Activation(Tensor),
}

/// What a stage's forward keeps for its backward.
#[derive(Debug)]
pub struct StageForward {
    /// The stage's output: the activation for the next stage, or the loss (last stage).
    pub output: Tensor,
    /// The loss, on the last stage.
    pub loss: Option<f32>,
    leaf: Option<Var>,
    rows: Option<(Var, Vec<u64>)>,
}

/// What a stage's backward produced.
#[derive(Debug)]
pub struct StageBackward {
    /// Gradients of the stage's dense variables.
    pub dense: candle_core::backprop::GradStore,
    /// The gradient of the stage's input activation, for the previous stage.
    pub input_grad: Option<Tensor>,
    /// The embedding rows the stage read and their gradients (first stage).
    pub rows: Option<(Vec<u64>, Vec<f32>)>,
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

    /// Layers of the network: the embedding (layer 0), then the fully connected ones
    /// (layer `i` is `fc{i}`); pipeline stages are ranges of them.
    pub fn layer_count(&self) -> usize {
        1 + self.vars.len()
    }

    /// The dense variables of layers `first..=last` (weight, then bias, per layer; the
    /// embedding has none: its rows are in the parameter server).
    pub fn stage_vars(&self, first: usize, last: usize) -> Vec<Var> {
        self.vars
            .iter()
            .enumerate()
            .filter(|(i, _)| (first..=last).contains(&(i + 1)))
            .flat_map(|(_, (w, b))| [w.clone(), b.clone()])
            .collect()
    }

    /// The embedding layer's output `[len, 26·dim + 13]` for a batch whose rows are
    /// `rows` (`[unique, dim]`, gathered by `inverse`).
    fn embed(&self, rows: &Tensor, inverse: &[u32], batch: &Batch) -> Result<Tensor, TrainError> {
        let n = batch.len();
        let inverse = Tensor::from_slice(inverse, inverse.len(), &self.device)?;
        let embedded = rows
            .index_select(&inverse, 0)?
            .reshape((n, SPARSE_SLOTS * self.config.dim))?;
        let dense = Tensor::from_slice(&batch.dense, (n, DENSE_FEATURES), &self.device)?;
        Ok(Tensor::cat(&[&embedded, &dense], 1)?)
    }

    /// Fully connected layers `first..=last` (each `≥ 1`) applied to `x`: ReLU after
    /// every one but the network's last, which gives the logits.
    fn fc_layers(&self, mut x: Tensor, first: usize, last: usize) -> Result<Tensor, TrainError> {
        for layer in first.max(1)..=last {
            let (w, b) = &self.vars[layer - 1];
            x = Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone())).forward(&x)?;
            if layer < self.vars.len() {
                x = x.relu()?;
            }
        }
        Ok(x)
    }

    fn rows(
        &self,
        ps: &dyn EmbeddingTable,
        keys: &[u64],
        pull: bool,
    ) -> Result<Tensor, TrainError> {
        let values = if pull {
            ps.pull(keys)?
        } else {
            ps.lookup(keys)?
        };
        Ok(Tensor::from_vec(
            values,
            (keys.len(), self.config.dim),
            &self.device,
        )?)
    }

    /// Forward of layers `first..=last` on one (micro-)batch, keeping what the backward
    /// needs. The first stage (`first == 0`) takes the batch and pulls its rows; a later
    /// one takes the previous stage's activation. The last stage (`last` the network's
    /// last layer) ends with the cross-entropy against `labels`, and its output is the
    /// loss.
    pub fn stage_forward(
        &self,
        ps: &dyn EmbeddingTable,
        first: usize,
        last: usize,
        input: StageInput<'_>,
        labels: &[f32],
    ) -> Result<StageForward, TrainError> {
        if first > last || last >= self.layer_count() {
            return Err(candle_core::Error::Msg(format!(
                "layers {first}..={last}: the network has layers 0..={}",
                self.layer_count() - 1
            ))
            .into());
        }
        let (x, leaf, rows) = match input {
            StageInput::Batch(batch) if first == 0 => {
                let lookups = Lookups::of(&batch.keys);
                let rows = Var::from_tensor(&self.rows(ps, &lookups.unique, true)?)?;
                let x = self.embed(rows.as_tensor(), &lookups.inverse, batch)?;
                (x, None, Some((rows, lookups.unique)))
            }
            StageInput::Activation(a) if first > 0 => {
                let leaf = Var::from_tensor(&a)?;
                (leaf.as_tensor().clone(), Some(leaf), None)
            }
            _ => {
                return Err(candle_core::Error::Msg(format!(
                    "a stage starting at layer {first} takes {}",
                    if first == 0 {
                        "the batch"
                    } else {
                        "an activation"
                    }
                ))
                .into());
            }
        };
        let mut output = self.fc_layers(x, first, last)?;
        let mut loss = None;
        if last == self.vars.len() {
            let labels: Vec<u32> = labels.iter().map(|&l| l as u32).collect();
            let labels = Tensor::from_vec(labels, output.dim(0)?, &self.device)?;
            output = candle_nn::loss::cross_entropy(&output, &labels)?;
            loss = Some(output.to_scalar::<f32>()?);
        }
        Ok(StageForward {
            output,
            leaf,
            rows,
            loss,
        })
    }

    /// Backward of a stage's forward: from its loss (the last stage, `grad_output`
    /// `None`) or from the gradient of its output that the next stage sent back.
    pub fn stage_backward(
        &self,
        forward: StageForward,
        grad_output: Option<&Tensor>,
    ) -> Result<StageBackward, TrainError> {
        let grads = match grad_output {
            None => forward.output.backward()?,
            Some(g) => (&forward.output * g)?.sum_all()?.backward()?,
        };
        let missing = |what: &str| candle_core::Error::Msg(format!("no gradient for {what}"));
        let input_grad = match &forward.leaf {
            Some(leaf) => Some(
                grads
                    .get(leaf.as_tensor())
                    .ok_or_else(|| missing("the stage's input"))?
                    .clone(),
            ),
            None => None,
        };
        let rows = match forward.rows {
            Some((rows, keys)) => {
                let g = grads
                    .get(rows.as_tensor())
                    .ok_or_else(|| missing("the embedding rows"))?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                Some((keys, g))
            }
            None => None,
        };
        Ok(StageBackward {
            dense: grads,
            input_grad,
            rows,
        })
    }

    /// Forward and backward on a batch: pulls the batch's rows from `ps` and returns the
    /// loss, the dense gradients and the rows' gradients (not yet pushed: a synchronous
    /// data-parallel step merges every worker's first).
    pub fn backward(&self, ps: &dyn EmbeddingTable, batch: &Batch) -> Result<Backward, TrainError> {
        let last = self.layer_count() - 1;
        let forward = self.stage_forward(ps, 0, last, StageInput::Batch(batch), &batch.labels)?;
        let loss = forward.loss.unwrap_or(f32::NAN);
        let b = self.stage_backward(forward, None)?;
        let (keys, row_grads) = b.rows.unwrap_or_default();
        Ok(Backward {
            loss,
            dense: b.dense,
            keys,
            row_grads,
        })
    }

    /// Click probabilities of a batch (rows looked up without creating them).
    pub fn predict(&self, ps: &dyn EmbeddingTable, batch: &Batch) -> Result<Vec<f32>, TrainError> {
        let lookups = Lookups::of(&batch.keys);
        let rows = self.rows(ps, &lookups.unique, false)?;
        let x = self.embed(&rows, &lookups.inverse, batch)?;
        let logits = self.fc_layers(x, 1, self.vars.len())?;
        let p = candle_nn::ops::softmax(&logits.to_dtype(DType::F32)?, D::Minus1)?;
        Ok(p.narrow(1, 1, 1)?.flatten_all()?.to_vec1::<f32>()?)
    }
}
