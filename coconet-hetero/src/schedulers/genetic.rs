//! Genetic algorithm over type assignments (one gene per layer).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cost::Problem;
use crate::error::PlanError;

use super::evaluator::Evaluator;
use super::scheduler::{Outcome, Scheduler, SearchConfig};

/// Tournament selection, two-point crossover, per-gene mutation, elitism; fitness is
/// the plan's cost after provisioning (infeasible plans rank last).
#[derive(Debug, Clone)]
pub struct Genetic {
    /// Population size.
    pub population: usize,
    /// Tournament size.
    pub tournament: usize,
    /// Crossover probability.
    pub crossover: f64,
    /// Individuals copied unchanged into the next generation.
    pub elitism: usize,
}

impl Default for Genetic {
    fn default() -> Self {
        Genetic {
            population: 50,
            tournament: 3,
            crossover: 0.8,
            elitism: 2,
        }
    }
}

impl Scheduler for Genetic {
    fn name(&self) -> &str {
        "genetic"
    }

    fn schedule(&self, pb: &Problem, config: &SearchConfig) -> Result<Outcome, PlanError> {
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let mut ev = Evaluator::new(pb, config);
        let pop_n = self.population.max(2);
        let mut pop: Vec<(Vec<usize>, f64)> = Vec::with_capacity(pop_n);
        // Seed with the homogeneous plans, then random individuals.
        for i in 0..pop_n {
            let a: Vec<usize> = if i < t_n {
                vec![i; l_n]
            } else {
                (0..l_n).map(|_| rng.random_range(0..t_n)).collect()
            };
            let Some(c) = ev.cost(&a) else {
                return ev.finish(self.name());
            };
            pop.push((a, c));
        }
        let mutation = 1.0 / l_n as f64;
        let mut stale = 0;
        while !ev.exhausted() && stale < 200 {
            pop.sort_by(|a, b| a.1.total_cmp(&b.1));
            let before = ev.used();
            let mut next: Vec<(Vec<usize>, f64)> =
                pop.iter().take(self.elitism.min(pop_n)).cloned().collect();
            while next.len() < pop_n {
                let pa = &pop[self.select(&pop, &mut rng)].0;
                let pb_ = &pop[self.select(&pop, &mut rng)].0;
                let mut child = pa.clone();
                if l_n > 1 && rng.random::<f64>() < self.crossover {
                    let (mut x, mut y) = (rng.random_range(0..l_n), rng.random_range(0..l_n));
                    if x > y {
                        std::mem::swap(&mut x, &mut y);
                    }
                    child[x..=y].copy_from_slice(&pb_[x..=y]);
                }
                for g in child.iter_mut() {
                    if rng.random::<f64>() < mutation {
                        *g = rng.random_range(0..t_n);
                    }
                }
                let Some(c) = ev.cost(&child) else {
                    return ev.finish(self.name());
                };
                next.push((child, c));
            }
            pop = next;
            stale = if ev.used() == before { stale + 1 } else { 0 };
        }
        ev.finish(self.name())
    }
}

impl Genetic {
    /// Index of the tournament winner (lowest cost among `tournament` random picks).
    fn select(&self, pop: &[(Vec<usize>, f64)], rng: &mut ChaCha8Rng) -> usize {
        let mut best = rng.random_range(0..pop.len());
        for _ in 1..self.tournament.max(1) {
            let c = rng.random_range(0..pop.len());
            if pop[c].1 < pop[best].1 {
                best = c;
            }
        }
        best
    }
}
