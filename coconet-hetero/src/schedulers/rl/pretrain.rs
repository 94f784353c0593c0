//! Pre-training: one policy trained across many instances on one catalogue, so that a
//! planning run starts from what other models taught it instead of from scratch.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::cost::Problem;
use crate::error::PlanError;

use super::super::SearchConfig;
use super::policy::{Policy, PolicyWeights, type_names};
use super::staged::StagedEvaluator;
use super::{Reinforce, Rewards};

impl Reinforce {
    /// Trains one policy across `problems`, `updates` REINFORCE updates on each in turn,
    /// the weights carried from one instance to the next (starting from
    /// [`Reinforce::pretrained`] where set, else fresh from `seed`). Every problem must
    /// be on one catalogue: the policy's per-type inputs and actions are that
    /// catalogue's. `progress(i, best)` is told each instance's best cost found.
    ///
    /// The result goes into [`Reinforce::pretrained`] for planning, where each run
    /// fine-tunes it on its own instance.
    pub fn pretrain<'p>(
        &self,
        problems: impl IntoIterator<Item = &'p Problem>,
        updates: usize,
        seed: u64,
        mut progress: impl FnMut(usize, f64),
    ) -> Result<PolicyWeights, PlanError> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut policy: Option<(Policy, candle_nn::AdamW, &'p Problem)> = None;
        for (i, pb) in problems.into_iter().enumerate() {
            let Some(ep) = self.episodes(pb)? else {
                continue;
            };
            let (net, opt, first) = match &mut policy {
                Some(p) => p,
                None => {
                    let (net, opt) = self.start(pb, &ep, &mut rng)?;
                    policy.insert((net, opt, pb))
                }
            };
            if type_names(pb) != type_names(first) {
                return Err(PlanError::Backend(format!(
                    "rl: pre-training instance {i} is on another catalogue than the first"
                )));
            }
            let config = SearchConfig {
                budget: updates.saturating_mul(ep.n_s + 1).max(1),
                ..SearchConfig::default()
            };
            let mut ev = StagedEvaluator::new(pb, &config);
            let mut rewards = Rewards::default();
            let mut best = f64::INFINITY;
            for _ in 0..updates {
                let batch = self.sample(&ep, net, &mut rng)?;
                let mut costs = Vec::with_capacity(batch.walks.len());
                for w in &batch.walks {
                    costs.push(ev.cost(&ep.space.plan(w)).unwrap_or(f64::INFINITY));
                }
                best = costs.iter().copied().fold(best, f64::min);
                self.learn(batch, &costs, &mut rewards, opt)?;
            }
            progress(i, best);
        }
        match &policy {
            Some((net, _, first)) => net.weights(first),
            None => Err(PlanError::Backend(
                "rl: no pre-training instance fits memory anywhere".into(),
            )),
        }
    }
}
