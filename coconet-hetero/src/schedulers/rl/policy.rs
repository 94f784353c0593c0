//! The policy network (an LSTM and a linear head over the actions) and its weights,
//! which a pre-training run saves and a later planning run starts from.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::rnn::{LSTM, LSTMConfig};
use candle_nn::{AdamW, Linear, ParamsAdamW, VarBuilder, VarMap};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::cost::Problem;
use crate::error::PlanError;

/// The name under which the catalogue's type names are stored beside the weights: a
/// policy's per-type inputs and actions only mean something on the catalogue it was
/// trained on.
const TYPES: &str = "meta.types";

/// The names of `pb`'s types, in order: what a policy's per-type inputs and actions
/// refer to.
pub(super) fn type_names(pb: &Problem) -> Vec<String> {
    pb.catalog.types.iter().map(|t| t.name.clone()).collect()
}

/// A policy's weights with the names of the types it was trained on; saved and loaded
/// as safetensors.
#[derive(Debug, Clone)]
pub struct PolicyWeights {
    tensors: HashMap<String, Tensor>,
    types: Vec<String>,
}

impl PolicyWeights {
    /// Reads weights written by [`PolicyWeights::save`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self, PlanError> {
        let path = path.as_ref();
        let failed = |e: candle_core::Error| {
            PlanError::Backend(format!("rl: reading the policy {}: {e}", path.display()))
        };
        let mut tensors = candle_core::safetensors::load(path, &Device::Cpu).map_err(failed)?;
        let names = tensors
            .remove(TYPES)
            .ok_or_else(|| {
                PlanError::Backend(format!(
                    "rl: {} holds no `{TYPES}`: not a policy written by coconet-hetero",
                    path.display()
                ))
            })?
            .to_vec1::<u8>()
            .map_err(failed)?;
        let types = String::from_utf8_lossy(&names)
            .split('\n')
            .map(str::to_string)
            .collect();
        Ok(PolicyWeights { tensors, types })
    }

    /// Writes the weights and the type names to `path`.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), PlanError> {
        let path = path.as_ref();
        let failed = |e: candle_core::Error| {
            PlanError::Backend(format!("rl: writing the policy {}: {e}", path.display()))
        };
        let mut all = self.tensors.clone();
        let names = self.types.join("\n").into_bytes();
        let n = names.len();
        all.insert(
            TYPES.to_string(),
            Tensor::from_vec(names, n, &Device::Cpu).map_err(failed)?,
        );
        candle_core::safetensors::save(&all, path).map_err(failed)
    }

    /// The type names the policy was trained on.
    pub fn types(&self) -> &[String] {
        &self.types
    }
}

/// An LSTM over the layers and a head giving each action's logit.
pub(super) struct Policy {
    varmap: VarMap,
    pub lstm: LSTM,
    pub head: Linear,
}

impl Policy {
    /// A policy for `in_dim` inputs and `actions` actions: `init`'s weights where given
    /// (checked against `pb`'s types and the shapes), else fresh ones from `rng`,
    /// uniform ±1/√fan_in in name order, the head at zero so that the first policy is
    /// the prior.
    pub fn new(
        pb: &Problem,
        in_dim: usize,
        hidden: usize,
        actions: usize,
        init: Option<&PolicyWeights>,
        rng: &mut ChaCha8Rng,
    ) -> Result<Self, PlanError> {
        let dev = Device::Cpu;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let lstm = candle_nn::lstm(in_dim, hidden, LSTMConfig::default(), vb.pp("lstm"))
            .map_err(backend)?;
        let head = candle_nn::linear(hidden, actions, vb.pp("head")).map_err(backend)?;
        {
            let data = varmap
                .data()
                .lock()
                .map_err(|_| PlanError::Backend("rl: poisoned var map".into()))?;
            let mut names: Vec<&String> = data.keys().collect();
            names.sort();
            if let Some(w) = init {
                let ours = type_names(pb);
                if w.types != ours {
                    return Err(PlanError::Backend(format!(
                        "rl: the pre-trained policy was trained on the types [{}], this catalogue has [{}]",
                        w.types.join(", "),
                        ours.join(", ")
                    )));
                }
            }
            for name in names {
                let var = &data[name];
                let dims = var.dims();
                let value = match init {
                    Some(w) => {
                        let t = w.tensors.get(name).ok_or_else(|| {
                            PlanError::Backend(format!(
                                "rl: the pre-trained policy has no `{name}`"
                            ))
                        })?;
                        if t.dims() != dims {
                            return Err(PlanError::Backend(format!(
                                "rl: the pre-trained policy's `{name}` is {:?}, this problem needs {dims:?} (another hidden size or feature layout)",
                                t.dims()
                            )));
                        }
                        t.clone()
                    }
                    None => {
                        let fan_in = *dims.last().unwrap_or(&1) as f64;
                        let bound = if name.starts_with("head") {
                            0.0
                        } else {
                            1.0 / fan_in.sqrt()
                        };
                        let vals: Vec<f32> = (0..var.elem_count())
                            .map(|_| {
                                if bound > 0.0 {
                                    rng.random_range(-bound..bound) as f32
                                } else {
                                    0.0
                                }
                            })
                            .collect();
                        Tensor::from_vec(vals, dims, &dev).map_err(backend)?
                    }
                };
                var.set(&value).map_err(backend)?;
            }
        }
        Ok(Policy { varmap, lstm, head })
    }

    /// An Adam optimiser over every weight.
    pub fn optimizer(&self, learning_rate: f64) -> Result<AdamW, PlanError> {
        use candle_nn::Optimizer;
        AdamW::new(
            self.varmap.all_vars(),
            ParamsAdamW {
                lr: learning_rate,
                weight_decay: 0.0,
                ..ParamsAdamW::default()
            },
        )
        .map_err(backend)
    }

    /// A copy of the weights, with `pb`'s type names.
    pub fn weights(&self, pb: &Problem) -> Result<PolicyWeights, PlanError> {
        let data = self
            .varmap
            .data()
            .lock()
            .map_err(|_| PlanError::Backend("rl: poisoned var map".into()))?;
        let tensors = data
            .iter()
            .map(|(k, v)| v.as_tensor().copy().map(|t| (k.clone(), t)))
            .collect::<Result<_, _>>()
            .map_err(backend)?;
        Ok(PolicyWeights {
            tensors,
            types: type_names(pb),
        })
    }
}

pub(super) fn backend(e: candle_core::Error) -> PlanError {
    PlanError::Backend(format!("rl: {e}"))
}
