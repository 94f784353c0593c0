//! Greedy hill climbing: start from the cheapest homogeneous plan, then repeatedly
//! apply the single-layer type change that lowers the cost most, until none does or
//! the budget is spent.

use crate::cost::Problem;
use crate::error::PlanError;

use super::evaluator::Evaluator;
use super::scheduler::{Outcome, Scheduler, SearchConfig};

/// Best-improvement hill climbing over one-layer moves.
#[derive(Debug, Clone, Copy, Default)]
pub struct Greedy;

impl Scheduler for Greedy {
    fn name(&self) -> &str {
        "greedy"
    }

    fn schedule(&self, pb: &Problem, config: &SearchConfig) -> Result<Outcome, PlanError> {
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        let mut ev = Evaluator::new(pb, config);
        let mut current: Option<(Vec<usize>, f64)> = None;
        for t in 0..t_n {
            let a = vec![t; l_n];
            let Some(c) = ev.cost(&a) else { break };
            if current.as_ref().is_none_or(|b| c < b.1) {
                current = Some((a, c));
            }
        }
        let Some((mut cur, mut cur_cost)) = current else {
            return ev.finish(self.name());
        };
        'climb: loop {
            let mut best_move: Option<(usize, usize, f64)> = None;
            for l in 0..l_n {
                for t in 0..t_n {
                    if t == cur[l] {
                        continue;
                    }
                    let old = cur[l];
                    cur[l] = t;
                    let c = ev.cost(&cur);
                    cur[l] = old;
                    let Some(c) = c else { break 'climb };
                    if c < cur_cost && best_move.is_none_or(|m| c < m.2) {
                        best_move = Some((l, t, c));
                    }
                }
            }
            match best_move {
                Some((l, t, c)) => {
                    cur[l] = t;
                    cur_cost = c;
                }
                None => break,
            }
        }
        ev.finish(self.name())
    }
}
