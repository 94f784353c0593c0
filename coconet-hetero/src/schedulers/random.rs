//! Random search: uniform type assignments until the budget is spent.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cost::Problem;
use crate::error::PlanError;

use super::evaluator::Evaluator;
use super::scheduler::{Outcome, Scheduler, SearchConfig};

/// Uniform sampling of one type per layer.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomSearch;

impl Scheduler for RandomSearch {
    fn name(&self) -> &str {
        "random"
    }

    fn schedule(&self, pb: &Problem, config: &SearchConfig) -> Result<Outcome, PlanError> {
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let mut ev = Evaluator::new(pb, config);
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        let space = (t_n as f64).powi(l_n as i32);
        // Stop when the budget is spent, or when the space is exhausted (repeats are free
        // but would loop for ever on a tiny space).
        let mut misses = 0;
        while !ev.exhausted() && (ev.used() as f64) < space && misses < 100 * config.budget.max(1) {
            let before = ev.used();
            let a: Vec<usize> = (0..l_n).map(|_| rng.random_range(0..t_n)).collect();
            ev.cost(&a);
            misses += usize::from(ev.used() == before);
        }
        ev.finish(self.name())
    }
}
