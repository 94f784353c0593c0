//! The paper's RL scheduler: an LSTM policy that emits one resource type per layer,
//! trained with REINFORCE.
//!
//! * **Input** at step `l`: the layer's features (one-hot kind; log of its time on every
//!   type, of its activation, dense, sparse and memory bytes; each column z-scored over
//!   the model) concatenated with the one-hot previous action (autoregressive).
//! * **Network**: a one-layer LSTM (hidden 64) and a linear head giving a softmax over
//!   the types; candle-nn provides the LSTM, autodiff and Adam.
//! * **Episode**: sample a type per layer → merge runs → provision → cost model.
//! * **Reward**: `−ln(cost / cost_ref)`, with `cost_ref` the first feasible cost seen
//!   (scale-free: plan costs differ by orders of magnitude, and a linear reward let a few
//!   bad samples dominate the gradient); an infeasible plan gets the worst feasible
//!   reward of its batch minus 2.
//! * **Update**: REINFORCE with a moving-average baseline (decay 0.9), advantages divided
//!   by the batch's reward spread, and an entropy bonus, `N` episodes per update; the
//!   best plan ever sampled is kept.
//!
//! Weights are initialised from the seed (the output head at zero, so the first
//! policy is uniform) (candle's CPU generator cannot be seeded), so
//! a run is deterministic for a given [`SearchConfig::seed`].

use candle_core::{D, DType, Device, Tensor};
use candle_nn::rnn::{LSTMConfig, RNN};
use candle_nn::{AdamW, Module, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cost::Problem;
use crate::error::PlanError;
use crate::model::LayerKind;

use super::{Evaluator, Outcome, Scheduler, SearchConfig};

/// REINFORCE over an LSTM policy.
#[derive(Debug, Clone)]
pub struct Reinforce {
    /// LSTM hidden size.
    pub hidden: usize,
    /// Episodes per policy update.
    pub episodes_per_update: usize,
    /// Maximum number of updates (repeated plans cost no evaluation, so the budget alone
    /// would not stop a converged policy).
    pub max_updates: usize,
    /// Stop after this many updates without a new best plan (the policy has converged).
    pub patience: usize,
    /// Adam learning rate.
    pub learning_rate: f64,
    /// Entropy bonus weight.
    pub entropy: f64,
    /// Moving-average decay of the reward baseline.
    pub baseline_decay: f64,
}

impl Default for Reinforce {
    fn default() -> Self {
        Reinforce {
            hidden: 64,
            episodes_per_update: 32,
            max_updates: 300,
            patience: 100,
            learning_rate: 0.005,
            entropy: 0.1,
            baseline_decay: 0.9,
        }
    }
}

fn backend(e: candle_core::Error) -> PlanError {
    PlanError::Backend(format!("rl: {e}"))
}

/// Per-layer features, z-scored per column.
fn features(pb: &Problem) -> Vec<Vec<f32>> {
    let ln = |x: f64| (x.max(0.0) + 1e-12).ln();
    let mut rows: Vec<Vec<f64>> = pb
        .model
        .layers
        .iter()
        .map(|l| {
            let mut r: Vec<f64> = LayerKind::ALL
                .iter()
                .map(|&k| f64::from(u8::from(k == l.kind)))
                .collect();
            r.extend(l.time.iter().map(|&t| ln(t)));
            r.extend([
                ln(l.activation_bytes),
                ln(l.dense_param_bytes),
                ln(l.sparse_param_bytes),
                ln(l.memory_bytes),
            ]);
            r
        })
        .collect();
    let cols = rows[0].len();
    for c in LayerKind::ALL.len()..cols {
        let n = rows.len() as f64;
        let mean = rows.iter().map(|r| r[c]).sum::<f64>() / n;
        let sd = (rows.iter().map(|r| (r[c] - mean).powi(2)).sum::<f64>() / n)
            .sqrt()
            .max(1.0);
        for r in &mut rows {
            r[c] = (r[c] - mean) / sd;
        }
    }
    rows.into_iter()
        .map(|r| r.into_iter().map(|x| x as f32).collect())
        .collect()
}

impl Scheduler for Reinforce {
    fn name(&self) -> &str {
        "rl"
    }

    fn schedule(&self, pb: &Problem, config: &SearchConfig) -> Result<Outcome, PlanError> {
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        let dev = Device::Cpu;
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let feats = features(pb);
        let in_dim = feats[0].len() + t_n + 1;
        let n = self.episodes_per_update.max(1);

        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let lstm = candle_nn::lstm(in_dim, self.hidden, LSTMConfig::default(), vb.pp("lstm"))
            .map_err(backend)?;
        let head = candle_nn::linear(self.hidden, t_n, vb.pp("head")).map_err(backend)?;
        {
            // Deterministic initialisation, uniform ±1/√fan_in, in name order.
            let data = varmap
                .data()
                .lock()
                .map_err(|_| PlanError::Backend("rl: poisoned var map".into()))?;
            let mut names: Vec<&String> = data.keys().collect();
            names.sort();
            for name in names {
                let var = &data[name];
                let dims = var.dims();
                let fan_in = *dims.last().unwrap_or(&1) as f64;
                // The head starts at zero: a uniform initial policy explores every type.
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
                var.set(&Tensor::from_vec(vals, dims, &dev).map_err(backend)?)
                    .map_err(backend)?;
            }
        }
        let mut opt = AdamW::new(
            varmap.all_vars(),
            ParamsAdamW {
                lr: self.learning_rate,
                weight_decay: 0.0,
                ..ParamsAdamW::default()
            },
        )
        .map_err(backend)?;

        // Layer features repeated over the batch, one tensor per layer.
        let layer_inputs: Vec<Tensor> = feats
            .iter()
            .map(|f| {
                Tensor::from_vec(f.clone(), (1, f.len()), &dev)
                    .and_then(|t| t.broadcast_as((n, f.len()))?.contiguous())
            })
            .collect::<Result<_, _>>()
            .map_err(backend)?;

        let mut ev = Evaluator::new(pb, config);
        let mut baseline: Option<f64> = None;
        let mut cost_ref: Option<f64> = None;
        let mut last_best = f64::INFINITY;
        let mut since_best = 0;
        for _update in 0..self.max_updates {
            if ev.exhausted() || since_best >= self.patience {
                break;
            }
            let best_now = ev.best().map_or(f64::INFINITY, |b| b.1);
            since_best = if best_now < last_best {
                0
            } else {
                since_best + 1
            };
            last_best = best_now;
            let mut state = lstm.zero_state(n).map_err(backend)?;
            let mut prev = vec![t_n; n];
            let mut actions = vec![vec![0usize; l_n]; n];
            let mut logp_sum: Option<Tensor> = None;
            let mut ent_sum: Option<Tensor> = None;
            for l in 0..l_n {
                let mut onehot = vec![0f32; n * (t_n + 1)];
                for (e, &p) in prev.iter().enumerate() {
                    onehot[e * (t_n + 1) + p] = 1.0;
                }
                let prev_t = Tensor::from_vec(onehot, (n, t_n + 1), &dev).map_err(backend)?;
                let x = Tensor::cat(&[&layer_inputs[l], &prev_t], 1).map_err(backend)?;
                state = lstm.step(&x, &state).map_err(backend)?;
                let logits = head.forward(state.h()).map_err(backend)?;
                let logp = candle_nn::ops::log_softmax(&logits, D::Minus1).map_err(backend)?;
                let probs: Vec<Vec<f32>> = logp.exp().and_then(|p| p.to_vec2()).map_err(backend)?;
                let mut mask = vec![0f32; n * t_n];
                for e in 0..n {
                    let u: f32 = rng.random();
                    let mut acc = 0.0;
                    let mut a = t_n - 1;
                    for (t, &p) in probs[e].iter().enumerate() {
                        acc += p;
                        if u < acc {
                            a = t;
                            break;
                        }
                    }
                    actions[e][l] = a;
                    prev[e] = a;
                    mask[e * t_n + a] = 1.0;
                }
                let mask = Tensor::from_vec(mask, (n, t_n), &dev).map_err(backend)?;
                let chosen = (&logp * &mask).and_then(|t| t.sum(1)).map_err(backend)?;
                let ent = (logp.exp().and_then(|p| p * &logp))
                    .and_then(|t| t.sum(1))
                    .and_then(|t| t.neg())
                    .map_err(backend)?;
                logp_sum = Some(match logp_sum {
                    Some(s) => (s + chosen).map_err(backend)?,
                    None => chosen,
                });
                ent_sum = Some(match ent_sum {
                    Some(s) => (s + ent).map_err(backend)?,
                    None => ent,
                });
            }
            // Rewards.
            let mut costs = Vec::with_capacity(n);
            for a in &actions {
                match ev.cost(a) {
                    Some(c) => costs.push(c),
                    None => break,
                }
            }
            if costs.len() < n {
                break;
            }
            if cost_ref.is_none() {
                cost_ref = costs
                    .iter()
                    .copied()
                    .filter(|c| c.is_finite())
                    .reduce(f64::min);
            }
            let Some(cref) = cost_ref else { continue };
            let worst = costs
                .iter()
                .copied()
                .filter(|c| c.is_finite())
                .fold(cref, f64::max)
                / cref;
            let rewards: Vec<f64> = costs
                .iter()
                .map(|&c| {
                    if c.is_finite() {
                        -(c / cref).ln()
                    } else {
                        -worst.ln() - 2.0
                    }
                })
                .collect();
            let mean = rewards.iter().sum::<f64>() / n as f64;
            let spread =
                (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
            let b = baseline.map_or(mean, |b| {
                self.baseline_decay * b + (1.0 - self.baseline_decay) * mean
            });
            baseline = Some(b);
            let adv: Vec<f32> = rewards
                .iter()
                .map(|r| ((r - b) / (spread + 0.05)) as f32)
                .collect();
            let adv = Tensor::from_vec(adv, n, &dev).map_err(backend)?;
            let (Some(lp), Some(en)) = (logp_sum, ent_sum) else {
                break;
            };
            let loss = (lp * adv)
                .and_then(|t| t.mean_all())
                .and_then(|pg| pg.neg()? - (en.mean_all()? * self.entropy)?)
                .map_err(backend)?;
            opt.backward_step(&loss).map_err(backend)?;
        }
        ev.finish(self.name())
    }
}
