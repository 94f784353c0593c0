//! The paper's RL scheduler: an LSTM policy that walks the layers and decides, at each,
//! whether to cut a new pipeline stage and on which type, trained with REINFORCE.
//!
//! * **Plan space**: the exact DP's, not the paper's one-type-per-layer with maximal runs
//!   merged. At layer `l` the policy either *continues* the open stage or *opens* a stage
//!   on type `t` (which may be the open stage's own type): `T + 1` actions (see `space`).
//!   Without same-type cuts a run of transformer blocks too large for one GPU is
//!   infeasible, which is why on the GPT the one-type-per-layer policy found costly
//!   alternating plans or none.
//! * **Masks**: an action that would break memory (a stage whose replica outgrows one
//!   unit of its type, or a layer opened on a type that cannot hold it) gets a logit of
//!   −10⁴, so memory-infeasible plans are never sampled and no evaluation is spent on
//!   them; a cut is forced where the open stage is full. Limits (caps, cores) depend on
//!   the whole plan and are left to the reward.
//! * **Input** at step `l`: the layer's features (one-hot kind; log of its time on every
//!   type, of its activation, dense, sparse and memory bytes; each column z-scored over
//!   the model) and the walk's state: the open stage's type (one-hot), the fraction of
//!   its type's memory it would fill with `l`, its length, `l / L`, and provisioning
//!   features: the open stage's units with `l` added and whether that is more than
//!   without it, and per type the free share of its last rented instance. The units are
//!   the paper's closed form without synchronisation, `⌈X_req·T₁/B⌉` (`T₁`: compute and
//!   boundary transfers of one unit), a lower bound computed from the profile and the
//!   links; no plan is priced outside the budget. The LSTM (hidden 64) carries the
//!   history, which is where interactions between layers (where to change type, how
//!   many stages fill an instance) are learnt.
//! * **Prior**: fixed logit biases added to the network's (its head starts at zero, so
//!   the first policy is the prior): *continue* is favoured while the open stage needs no
//!   more units (about one voluntary cut per episode), cutting where it would need
//!   another (growing with probability 0.2); a cut keeps the open type with probability
//!   0.95, or 0.3 where the type's last rented instance is then exactly full; and a new
//!   stage's type is weighted by the layer's cost efficiency `(price · time)^{−1/2}`.
//!   The first episodes are thus near-homogeneous plans whose stages fill their units,
//!   starting on every type: the plans that are optimal or nearly so on the shipped
//!   models and that a uniform policy over types almost never samples (probability
//!   `T^{−L}`). The network learns to override the prior where the reward says so.
//! * **Reward**: `−ln(cost / cost_ref)`, with `cost_ref` the first feasible cost seen
//!   (plan costs differ by orders of magnitude); an infeasible plan (a broken limit)
//!   gets the worst feasible reward of its batch minus 2.
//! * **Update**: REINFORCE with a moving-average baseline, advantages divided by the
//!   batch's reward spread, and an entropy bonus, `N` episodes per update (Adam). One
//!   more episode per update follows the policy's most likely actions and is evaluated,
//!   not learnt from.
//! * **Restarts**: a run ends when its policy has not improved its own best plan (by at
//!   least [`Reinforce::min_gain`]) for [`Reinforce::patience`] updates; the next run starts from fresh weights with the
//!   budget left (at most [`Reinforce::restarts`] runs). Which basin a run falls into is
//!   settled early (on the GPT at 20 sequences/s, within its first 500 evaluations), so
//!   fresh starts use the budget better than a converged policy's repeats.
//! * **Pre-training** ([`Reinforce::pretrain`], `examples/rl_pretrain.rs`): one policy
//!   trained across many instances on one catalogue, saved with the catalogue's type
//!   names ([`PolicyWeights`]); [`Reinforce::pretrained`] (the CLI's `--rl-policy`)
//!   starts every run from it and fine-tunes per instance. On the shipped cases it does
//!   worse than fresh weights (BENCHMARKS.md): the pre-trained policy leaves the prior
//!   and, being surer of itself, explores less, so it is off by default.
//! * **Budget**: [`SearchConfig::budget`] distinct plan evaluations, as for every
//!   heuristic (a plan sampled again is answered from a cache keyed by its stages,
//!   shared by all runs). The best plan ever evaluated is returned.
//!
//! **Limits** (`examples/rl_bench.rs`, seeds 1–12, budget 2,000): on the GPT at 20
//! sequences/s the optimum fills one H100 instance, two A100 instances and a few T4s
//! exactly. Runs whose first good plans are all-H100 (+16 %) tend to stay there: of
//! seeds 1–12, 4 reach +2 %, 4 end at +8 to +13 % and 4 at +16 %. Sampling the prior
//! without learning does better there (+2 to +7 % over seeds 1–5), but worse where the
//! optimum is far from the prior (BERT-large at 400 and 1,600 sequences/s: +10 % and
//! +15 % from the prior alone, 0 % learnt; at 1,600, 3 of 12 seeds still end at +7 to
//! +15 %).
//!
//! Weights are initialised from the seed (candle's CPU generator cannot be seeded), so
//! a run is deterministic for a given [`SearchConfig::seed`].

mod policy;
mod pretrain;
mod space;
mod staged;

use std::sync::Arc;

use candle_core::{D, Device, Tensor};
use candle_nn::rnn::RNN;
use candle_nn::{AdamW, Module, Optimizer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cost::Problem;
use crate::error::PlanError;
use crate::model::LayerKind;

use super::scheduler::{Outcome, Scheduler, SearchConfig};
pub use policy::PolicyWeights;
use policy::{Policy, backend};
use space::{Space, Walk};
use staged::StagedEvaluator;

/// REINFORCE over an LSTM policy that places stage cuts and types.
#[derive(Debug, Clone)]
pub struct Reinforce {
    /// LSTM hidden size.
    pub hidden: usize,
    /// Episodes per policy update.
    pub episodes_per_update: usize,
    /// Maximum number of updates per run (repeated plans cost no evaluation, so the
    /// budget alone would not stop a converged policy).
    pub max_updates: usize,
    /// End a run after this many updates without improving its own best plan (the policy
    /// has converged or stalled in a basin); the next restart gets the budget left.
    pub patience: usize,
    /// Relative improvement of a run's best that counts as progress for
    /// [`Reinforce::patience`]: a run that only shaves fractions of a percent off a plan
    /// has settled in its basin, and a fresh start is likelier to find a better one.
    pub min_gain: f64,
    /// Adam learning rate.
    pub learning_rate: f64,
    /// Entropy bonus weight.
    pub entropy: f64,
    /// Moving-average decay of the reward baseline.
    pub baseline_decay: f64,
    /// Expected voluntary cuts per episode under the initial policy (the prior's bias
    /// toward *continue*); 0 disables the prior's continue, same-type and grow biases
    /// (not [`Reinforce::prior_efficiency`]).
    pub prior_cuts: f64,
    /// Initial probability that a cut keeps the open stage's type (the prior's bias
    /// toward near-homogeneous plans).
    pub prior_same_type: f64,
    /// Initial probability of growing a stage where that needs another unit (against
    /// cutting): stages that fill their units are where cost is saved.
    pub prior_grow: f64,
    /// [`Reinforce::prior_same_type`] where the cut leaves the open stage's type with
    /// its last rented instance exactly full (types rented by whole instances).
    pub prior_same_type_full: f64,
    /// Weight of the layer's cost efficiency on each type, `−ln(price · time)`, in the
    /// initial logits of opening a stage on it (0: types equally likely).
    pub prior_efficiency: f64,
    /// Most independent runs (fresh weights, the same evaluation cache and budget); the
    /// best plan over all is returned. Which basin a run's policy falls into is settled
    /// within its first few hundred evaluations (on the GPT a run that has settled on
    /// all-H100 plans never leaves them), so the budget a stalled run would spend on
    /// repeats is better spent on a fresh start.
    pub restarts: usize,
    /// Weights to start every run from instead of fresh ones: a policy pre-trained
    /// across many instances on this catalogue ([`Reinforce::pretrain`]), fine-tuned
    /// here per instance. Its head is no longer zero, so the first policy is the prior
    /// as the pre-training left it.
    pub pretrained: Option<Arc<PolicyWeights>>,
    /// Every second run only samples its first policy (the prior, or the pre-trained
    /// one) without learning (false: every run learns). Learning is what finds optima
    /// far from the prior; sampling the prior alone does better where the optimum is
    /// near it but learning settles in the wrong basin.
    pub prior_only_runs: bool,
}

impl Default for Reinforce {
    fn default() -> Self {
        Reinforce {
            hidden: 64,
            episodes_per_update: 32,
            max_updates: 300,
            patience: 25,
            min_gain: 0.005,
            learning_rate: 0.01,
            entropy: 0.05,
            baseline_decay: 0.9,
            prior_cuts: 1.0,
            prior_same_type: 0.95,
            prior_grow: 0.2,
            prior_same_type_full: 0.3,
            prior_efficiency: 0.5,
            restarts: 8,
            pretrained: None,
            prior_only_runs: false,
        }
    }
}

/// Per-layer features, z-scored per column.
fn features(pb: &Problem) -> Vec<Vec<f32>> {
    let ln = |x: f64| (x.max(0.0) + 1e-12).ln();
    let mut rows: Vec<Vec<f64>> = pb
        .model
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut r: Vec<f64> = LayerKind::ALL
                .iter()
                .map(|&k| f64::from(u8::from(k == l.kind)))
                .collect();
            // Seconds per batch of the type's own: z-scored per type, the same as per
            // sample.
            r.extend((0..pb.num_types()).map(|t| ln(pb.layer_time(i, t))));
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

/// Number of walk-state features (see [`walk_state`]) beyond the two per-type blocks.
const STATE_EXTRA: usize = 7;

/// The walk's state before deciding layer `l`: the open stage's type (one-hot, last
/// slot for none), the memory fraction it would fill with `l`, its length, `l / L`, and
/// the provisioning features (`Space::provisioning`).
fn walk_state(
    space: &Space,
    walk: &Walk,
    grown: Option<(u64, bool)>,
    l: usize,
    l_n: usize,
    t_n: usize,
    out: &mut [f32],
) {
    out.fill(0.0);
    out[space.current(walk).unwrap_or(t_n)] = 1.0;
    out[t_n + 1] = space.fill(walk, l).min(2.0) as f32;
    out[t_n + 2] = ((1 + space.open_len(walk, l)) as f32).ln() / ((1 + l_n) as f32).ln();
    out[t_n + 3] = l as f32 / l_n as f32;
    space.provisioning(walk, grown, &mut out[t_n + 4..]);
}

/// Fixed prior logits: `(continue, same type)` biases such that the initial policy makes
/// about `cuts` voluntary cuts per episode and keeps the type with probability `same`
/// (`cuts ≤ 0`: no bias).
fn prior(l_n: usize, t_n: usize, cuts: f64, same: f64) -> (f32, f32) {
    if cuts <= 0.0 {
        return (0.0, 0.0);
    }
    let same = same.clamp(1e-3, 1.0 - 1e-3);
    // e^βs / (e^βs + T − 1) = same (with one type every cut keeps it).
    let beta_s = if t_n > 1 {
        (same / (1.0 - same) * (t_n - 1) as f64).ln()
    } else {
        0.0
    };
    // (e^βs + T − 1) / e^βc = cuts / L per step.
    let beta_c = ((beta_s.exp() + (t_n - 1) as f64) * l_n as f64 / cuts).ln();
    (beta_c.max(0.0) as f32, beta_s.max(0.0) as f32)
}

/// Per layer and type, `weight · ln` of the layer's cost efficiency on the type (per
/// sample, at the type's batch) relative to its best,
/// `−ln(price · time) + min_t ln(price · time) ≤ 0`: an initial preference for the types
/// that process the layer's samples for fewest dollars.
fn efficiency(pb: &Problem, weight: f64) -> Vec<Vec<f32>> {
    (0..pb.num_layers())
        .map(|l| {
            // Dollars per sample, up to the model's batch: `price · time / (b_t / B)`.
            let c: Vec<f64> = (0..pb.num_types())
                .map(|t| {
                    (pb.price_per_second(t) * pb.layer_time(l, t))
                        .max(1e-30)
                        .ln()
                        - pb.batch_ratio(t).ln()
                })
                .collect();
            let best = c.iter().copied().fold(f64::INFINITY, f64::min);
            c.iter()
                .map(|&x| {
                    if weight == 0.0 {
                        0.0
                    } else {
                        (weight * (best - x)).max(-30.0) as f32
                    }
                })
                .collect()
        })
        .collect()
}

/// The *continue* logit where growing the stage needs another unit: continue with
/// probability `grow` against every cut together.
fn grow_prior(t_n: usize, beta_s: f32, grow: f64) -> f32 {
    let grow = grow.clamp(1e-3, 1.0 - 1e-3);
    let cuts = f64::from(beta_s).exp() + t_n.saturating_sub(1) as f64;
    (grow / (1.0 - grow) * cuts).ln() as f32
}

/// One instance as the policy sees it: its action space, layer inputs and prior biases.
struct Episodes<'p> {
    space: Space<'p>,
    /// Per layer, its features repeated over the batch of episodes.
    layer_inputs: Vec<Tensor>,
    eff: Vec<Vec<f32>>,
    /// Prior logits: continue, same type, grow, same type where an instance is full.
    beta: [f32; 4],
    l_n: usize,
    t_n: usize,
    /// Sampled episodes per batch (one more follows the most likely actions).
    n_s: usize,
    /// Walk-state features per episode.
    s_n: usize,
    /// The network's input size.
    in_dim: usize,
}

/// What a batch of episodes built: the walks, and per episode the sum of its chosen
/// actions' log-probabilities and of its policy's entropies.
struct Batch {
    walks: Vec<Walk>,
    logp: Tensor,
    entropy: Tensor,
}

/// The reward's scale and baseline on one instance.
#[derive(Default)]
struct Rewards {
    /// The first feasible cost seen: rewards are `−ln(cost / cost_ref)`.
    cost_ref: Option<f64>,
    /// Moving average of the batches' mean rewards.
    baseline: Option<f64>,
}

impl Reinforce {
    /// `pb` as the policy sees it, or `None` when some layer fits no type (no plan fits
    /// memory: the mask would leave it without an action).
    fn episodes<'p>(&self, pb: &'p Problem) -> Result<Option<Episodes<'p>>, PlanError> {
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        let space = Space::new(pb);
        if !space.every_layer_fits() {
            return Ok(None);
        }
        let feats = features(pb);
        let s_n = 2 * t_n + STATE_EXTRA;
        let n_s = self.episodes_per_update.max(1);
        let n = n_s + 1;
        let (beta_c, beta_s) = prior(l_n, t_n, self.prior_cuts, self.prior_same_type);
        let beta_g = if self.prior_cuts > 0.0 {
            grow_prior(t_n, beta_s, self.prior_grow)
        } else {
            0.0
        };
        let (_, beta_f) = prior(l_n, t_n, self.prior_cuts, self.prior_same_type_full);
        let layer_inputs = feats
            .iter()
            .map(|f| {
                Tensor::from_vec(f.clone(), (1, f.len()), &Device::Cpu)
                    .and_then(|t| t.broadcast_as((n, f.len()))?.contiguous())
            })
            .collect::<Result<_, _>>()
            .map_err(backend)?;
        Ok(Some(Episodes {
            space,
            layer_inputs,
            eff: efficiency(pb, self.prior_efficiency),
            beta: [beta_c, beta_s, beta_g, beta_f],
            l_n,
            t_n,
            n_s,
            s_n,
            in_dim: feats[0].len() + s_n,
        }))
    }

    /// The policy a run starts from ([`Reinforce::pretrained`], or fresh weights from
    /// `rng`) and its optimiser.
    fn start(
        &self,
        pb: &Problem,
        ep: &Episodes,
        rng: &mut ChaCha8Rng,
    ) -> Result<(Policy, AdamW), PlanError> {
        let actions = ep.space.num_actions();
        let policy = Policy::new(
            pb,
            ep.in_dim,
            self.hidden,
            actions,
            self.pretrained.as_deref(),
            rng,
        )?;
        let opt = policy.optimizer(self.learning_rate)?;
        Ok((policy, opt))
    }

    /// Walks a batch of episodes with `policy`: `n_s` sampled, one following the most
    /// likely allowed actions.
    fn sample(
        &self,
        ep: &Episodes,
        policy: &Policy,
        rng: &mut ChaCha8Rng,
    ) -> Result<Batch, PlanError> {
        let dev = Device::Cpu;
        let (space, l_n, t_n, s_n) = (&ep.space, ep.l_n, ep.t_n, ep.s_n);
        let [beta_c, beta_s, beta_g, beta_f] = ep.beta;
        let a_n = space.num_actions();
        let cont = space.cont();
        let n_s = ep.n_s;
        let n = n_s + 1;
        let mut state = policy.lstm.zero_state(n).map_err(backend)?;
        let mut walks = vec![Walk::default(); n];
        let mut logp_sum: Option<Tensor> = None;
        let mut ent_sum: Option<Tensor> = None;
        let mut st = vec![0f32; n * s_n];
        let mut bias = vec![0f32; n * a_n];
        for l in 0..l_n {
            for (e, w) in walks.iter().enumerate() {
                let grown = space.grown(w, l);
                walk_state(
                    space,
                    w,
                    grown,
                    l,
                    l_n,
                    t_n,
                    &mut st[e * s_n..(e + 1) * s_n],
                );
                let cur = space.current(w);
                let same = if space.fills_instance(w) {
                    beta_f
                } else {
                    beta_s
                };
                for a in 0..a_n {
                    bias[e * a_n + a] = if !space.allowed(w, l, a) {
                        -1e4
                    } else if a == cont {
                        // Growing is free until the stage needs another unit.
                        if grown.is_some_and(|g| g.1) {
                            beta_g
                        } else {
                            beta_c
                        }
                    } else if Some(a) == cur {
                        same + ep.eff[l][a]
                    } else {
                        ep.eff[l][a]
                    };
                }
            }
            let st_t = Tensor::from_vec(st.clone(), (n, s_n), &dev).map_err(backend)?;
            let bias_t = Tensor::from_vec(bias.clone(), (n, a_n), &dev).map_err(backend)?;
            let x = Tensor::cat(&[&ep.layer_inputs[l], &st_t], 1).map_err(backend)?;
            state = policy.lstm.step(&x, &state).map_err(backend)?;
            let logits =
                (policy.head.forward(state.h()).map_err(backend)? + bias_t).map_err(backend)?;
            let logp = candle_nn::ops::log_softmax(&logits, D::Minus1).map_err(backend)?;
            let probs: Vec<Vec<f32>> = logp.exp().and_then(|p| p.to_vec2()).map_err(backend)?;
            let mut chosen_mask = vec![0f32; n * a_n];
            for (e, w) in walks.iter_mut().enumerate() {
                let a = if e == n_s {
                    // The most likely allowed action (masked ones have probability 0).
                    (0..a_n)
                        .max_by(|&x, &y| probs[e][x].total_cmp(&probs[e][y]).then(y.cmp(&x)))
                        .unwrap_or(0)
                } else {
                    let u: f32 = rng.random();
                    let mut acc = 0.0;
                    let mut pick = None;
                    for (a, &p) in probs[e].iter().enumerate() {
                        acc += p;
                        if u < acc {
                            pick = Some(a);
                            break;
                        }
                    }
                    // Rounding can leave `u` above the sum: the last allowed action.
                    pick.unwrap_or_else(|| {
                        (0..a_n)
                            .rev()
                            .find(|&a| space.allowed(w, l, a))
                            .unwrap_or(0)
                    })
                };
                let a = if space.allowed(w, l, a) {
                    a
                } else {
                    (0..a_n).find(|&a| space.allowed(w, l, a)).unwrap_or(0)
                };
                space.step(w, l, a);
                chosen_mask[e * a_n + a] = 1.0;
            }
            let chosen_mask = Tensor::from_vec(chosen_mask, (n, a_n), &dev).map_err(backend)?;
            let chosen = (&logp * &chosen_mask)
                .and_then(|t| t.sum(1))
                .map_err(backend)?;
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
        match (logp_sum, ent_sum) {
            (Some(logp), Some(entropy)) => Ok(Batch {
                walks,
                logp,
                entropy,
            }),
            _ => Err(PlanError::Backend("rl: a model without layers".into())),
        }
    }

    /// One REINFORCE step on a batch whose episodes cost `costs` (the last one, the most
    /// likely episode, is not learnt from).
    fn learn(
        &self,
        batch: Batch,
        costs: &[f64],
        rewards: &mut Rewards,
        opt: &mut AdamW,
    ) -> Result<(), PlanError> {
        let n_s = costs.len() - 1;
        let sampled = &costs[..n_s];
        if rewards.cost_ref.is_none() {
            rewards.cost_ref = costs
                .iter()
                .copied()
                .filter(|c| c.is_finite())
                .reduce(f64::min);
        }
        let Some(cref) = rewards.cost_ref else {
            return Ok(());
        };
        let worst = sampled
            .iter()
            .copied()
            .filter(|c| c.is_finite())
            .fold(cref, f64::max)
            / cref;
        let reward: Vec<f64> = sampled
            .iter()
            .map(|&c| {
                if c.is_finite() {
                    -(c / cref).ln()
                } else {
                    -worst.ln() - 2.0
                }
            })
            .collect();
        let mean = reward.iter().sum::<f64>() / n_s as f64;
        let spread = (reward.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n_s as f64).sqrt();
        let b = rewards.baseline.map_or(mean, |b| {
            self.baseline_decay * b + (1.0 - self.baseline_decay) * mean
        });
        rewards.baseline = Some(b);
        let mut adv: Vec<f32> = reward
            .iter()
            .map(|r| ((r - b) / (spread + 0.05)) as f32)
            .collect();
        // The most likely episode is evaluated, not learnt from.
        adv.push(0.0);
        let adv = Tensor::from_vec(adv, n_s + 1, &Device::Cpu).map_err(backend)?;
        let loss = (batch.logp * adv)
            .and_then(|t| t.mean_all())
            .and_then(|pg| pg.neg()? - (batch.entropy.mean_all()? * self.entropy)?)
            .map_err(backend)?;
        opt.backward_step(&loss).map_err(backend)
    }
}

impl Scheduler for Reinforce {
    fn name(&self) -> &str {
        "rl"
    }

    fn schedule(&self, pb: &Problem, config: &SearchConfig) -> Result<Outcome, PlanError> {
        let mut ev = StagedEvaluator::new(pb, config);
        let Some(ep) = self.episodes(pb)? else {
            return ev.finish(self.name());
        };
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let mut cost_ref = None;
        let restarts = self.restarts.max(1);
        // A run ends when its policy stalls (`patience` updates without improving its own
        // best); the next starts afresh (or from the pre-trained weights again) with what
        // budget is left.
        'restarts: for run in 0..restarts {
            // Odd runs may only sample the prior (the first policy), learning nothing.
            let learns = !(self.prior_only_runs && run % 2 == 1);
            let (policy, mut opt) = self.start(pb, &ep, &mut rng)?;
            let mut rewards = Rewards {
                cost_ref,
                baseline: None,
            };
            // This restart's best cost and the updates since it improved.
            let mut run_best = f64::INFINITY;
            let mut since_best = 0;
            for _update in 0..self.max_updates {
                if ev.exhausted() || since_best >= self.patience {
                    break;
                }
                let batch = self.sample(&ep, &policy, &mut rng)?;
                let mut costs = Vec::with_capacity(batch.walks.len());
                for w in &batch.walks {
                    match ev.cost(&ep.space.plan(w)) {
                        Some(c) => costs.push(c),
                        None => break 'restarts,
                    }
                }
                let batch_best = costs.iter().copied().fold(f64::INFINITY, f64::min);
                if !run_best.is_finite() || batch_best < run_best * (1.0 - self.min_gain) {
                    since_best = 0;
                } else {
                    since_best += 1;
                }
                run_best = run_best.min(batch_best);
                if learns {
                    self.learn(batch, &costs, &mut rewards, &mut opt)?;
                }
            }
            cost_ref = rewards.cost_ref;
        }
        ev.finish(self.name())
    }
}
