//! Exhaustive enumeration: the ground truth for small models.

use crate::cost::{Evaluation, Problem};
use crate::error::PlanError;
use crate::plan::{SchedulingPlan, Stage};

use super::scheduler::{Optimality, Outcome, Scheduler, SearchConfig, Units};
use super::units;

/// Tries every plan (every type per layer and, with `split_runs`, every way of cutting
/// same-type runs into stages), each provisioned as [`SearchConfig::units`] says. Refuses instances with more than `max_plans` plans.
#[derive(Debug, Clone)]
pub struct Exhaustive {
    /// Also enumerate cuts inside same-type runs (the DP's plan space).
    pub split_runs: bool,
    /// Largest number of plans tried ([`Exhaustive::plan_count`]); larger instances are
    /// refused.
    pub max_plans: f64,
}

impl Default for Exhaustive {
    fn default() -> Self {
        Exhaustive {
            split_runs: true,
            max_plans: 2e6,
        }
    }
}

impl Exhaustive {
    /// The plans it evaluates for `layers` layers over `types` types (what `max_plans`
    /// bounds): T^L type assignments without cuts inside runs; with them, each layer
    /// after the first either changes type (T − 1 ways, a cut) or keeps it (cut or
    /// not): T·(T + 1)^(L − 1).
    pub fn plan_count(&self, layers: usize, types: usize) -> f64 {
        if layers == 0 {
            return 1.0;
        }
        let (l, t) = (layers as f64, types as f64);
        if self.split_runs {
            t * (t + 1.0).powf(l - 1.0)
        } else {
            t.powf(l)
        }
    }
}

impl Scheduler for Exhaustive {
    fn name(&self) -> &str {
        "exhaustive"
    }

    fn schedule(&self, pb: &Problem, config: &SearchConfig) -> Result<Outcome, PlanError> {
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        let count = self.plan_count(l_n, t_n);
        if count > self.max_plans {
            return Err(PlanError::TooLarge {
                scheduler: "exhaustive".into(),
                reason: format!("{count:.3e} plans > {:.0e}", self.max_plans),
            });
        }
        let mut types = vec![0usize; l_n];
        let mut best: Option<(SchedulingPlan, Evaluation)> = None;
        let mut evaluations = 0;
        // Whether every plan's units are the cheapest for it ([`units::evaluate`]).
        let mut every_best = true;
        let mut first_reason = None;
        loop {
            // Boundaries inside same-type runs may optionally be cut.
            let optional: Vec<usize> = if self.split_runs {
                (1..l_n).filter(|&l| types[l] == types[l - 1]).collect()
            } else {
                Vec::new()
            };
            for mask in 0u64..(1u64 << optional.len()) {
                let mut stages: Vec<Stage> = Vec::new();
                for (l, &ty) in types.iter().enumerate() {
                    let cut = l == 0
                        || types[l - 1] != ty
                        || optional
                            .iter()
                            .position(|&o| o == l)
                            .is_some_and(|bit| mask >> bit & 1 == 1);
                    match stages.last_mut() {
                        Some(s) if !cut => s.last = l,
                        _ => stages.push(Stage {
                            first: l,
                            last: l,
                            ty,
                        }),
                    }
                }
                let plan = SchedulingPlan { stages };
                evaluations += 1;
                match units::evaluate(pb, &plan, config.units) {
                    Ok((e, cheapest)) => {
                        every_best &= cheapest;
                        if best.as_ref().is_none_or(|b| e.cost < b.1.cost) {
                            best = Some((plan, e));
                        }
                    }
                    Err(e) => {
                        first_reason.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            // Next assignment (odometer).
            let mut pos = 0;
            loop {
                if pos == l_n {
                    return match best {
                        Some((plan, evaluation)) => {
                            let proven = every_best;
                            Ok(Outcome {
                                scheduler: "exhaustive".into(),
                                plan,
                                lower_bound: proven.then_some(evaluation.cost),
                                evaluation,
                                evaluations,
                                optimality: if proven {
                                    Optimality::Proven
                                } else {
                                    // Every plan, but each at its fewest units (the
                                    // paper's objective may pay for more) or some
                                    // plan's walk over its counts cut short.
                                    Optimality::NotGuaranteed(
                                        match config.units {
                                            Units::Min => "every plan at its fewest units only",
                                            Units::Best => "some plan's unit counts not all tried",
                                        }
                                        .into(),
                                    )
                                },
                            })
                        }
                        None => Err(PlanError::NoFeasiblePlan(format!(
                            "all {evaluations} plans are infeasible, e.g. {}",
                            first_reason.unwrap_or_default()
                        ))),
                    };
                }
                types[pos] += 1;
                if types[pos] < t_n {
                    break;
                }
                types[pos] = 0;
                pos += 1;
            }
        }
    }
}
