//! Bayesian optimisation over type assignments: a Gaussian process with a Hamming
//! kernel and expected improvement.
//!
//! Why not a crate: egobox (the maintained Rust EGO library) handles categorical inputs
//! by one-hot continuous relaxation, i.e. `L × T` continuous dimensions (392 for the
//! 98-layer GPT over 4 types), and pulls in the ndarray/linfa stack; the categorical
//! kernel `k(x, x') = exp(−θ · hamming(x, x') / L)` works on the assignment directly and
//! needs only a small Cholesky solve, written here (about 40 lines).
//!
//! The GP models `log cost` (standardised); infeasible plans are observed at the worst
//! feasible value plus one. `θ` is picked from a small grid by marginal likelihood
//! every 10 iterations. The GP is fitted on at most [`Bayesian::max_points`] points (the
//! best half and the most recent half), which bounds each step at `O(m³)`. EI is
//! maximised over random assignments plus one- and two-gene mutations of the best plans.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cost::Problem;
use crate::error::PlanError;

use super::evaluator::Evaluator;
use super::scheduler::{Outcome, Scheduler, SearchConfig};

/// GP-EI Bayesian optimisation.
#[derive(Debug, Clone)]
pub struct Bayesian {
    /// Random initial design size (besides the homogeneous plans).
    pub initial: usize,
    /// Evaluations at most (BO's own cost grows with them; 100–200 is the usual range).
    pub max_evaluations: usize,
    /// Largest GP training set.
    pub max_points: usize,
    /// Candidates scored by EI per step.
    pub candidates: usize,
}

impl Default for Bayesian {
    fn default() -> Self {
        Bayesian {
            initial: 10,
            max_evaluations: 200,
            max_points: 80,
            candidates: 200,
        }
    }
}

/// Cholesky factor of a symmetric positive definite matrix (row-major `n×n`), or `None`.
fn cholesky(a: &[f64], n: usize) -> Option<Vec<f64>> {
    let mut l = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..=i {
            let mut s = a[i * n + j];
            for k in 0..j {
                s -= l[i * n + k] * l[j * n + k];
            }
            if i == j {
                if s <= 0.0 {
                    return None;
                }
                l[i * n + i] = s.sqrt();
            } else {
                l[i * n + j] = s / l[j * n + j];
            }
        }
    }
    Some(l)
}

/// Solves `L Lᵀ x = b`.
fn chol_solve(l: &[f64], n: usize, b: &[f64]) -> Vec<f64> {
    let mut y = b.to_vec();
    for i in 0..n {
        for k in 0..i {
            y[i] -= l[i * n + k] * y[k];
        }
        y[i] /= l[i * n + i];
    }
    for i in (0..n).rev() {
        for k in i + 1..n {
            y[i] -= l[k * n + i] * y[k];
        }
        y[i] /= l[i * n + i];
    }
    y
}

fn hamming(a: &[usize], b: &[usize]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

struct Gp {
    xs: Vec<Vec<usize>>,
    l: Vec<f64>,
    alpha: Vec<f64>,
    theta: f64,
    len: f64,
}

const NOISE: f64 = 1e-6;

impl Gp {
    fn fit(xs: Vec<Vec<usize>>, ys: &[f64], theta: f64) -> Option<(Gp, f64)> {
        let n = xs.len();
        let len = xs[0].len() as f64;
        let mut k = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                k[i * n + j] = (-theta * hamming(&xs[i], &xs[j]) as f64 / len).exp()
                    + if i == j { NOISE } else { 0.0 };
            }
        }
        let l = cholesky(&k, n)?;
        let alpha = chol_solve(&l, n, ys);
        // log marginal likelihood up to a constant
        let lml = -0.5 * ys.iter().zip(&alpha).map(|(y, a)| y * a).sum::<f64>()
            - (0..n).map(|i| l[i * n + i].ln()).sum::<f64>();
        Some((
            Gp {
                xs,
                l,
                alpha,
                theta,
                len,
            },
            lml,
        ))
    }

    fn predict(&self, x: &[usize]) -> (f64, f64) {
        let n = self.xs.len();
        let ks: Vec<f64> = self
            .xs
            .iter()
            .map(|xi| (-self.theta * hamming(xi, x) as f64 / self.len).exp())
            .collect();
        let mean = ks.iter().zip(&self.alpha).map(|(a, b)| a * b).sum();
        let v = chol_solve(&self.l, n, &ks);
        let var = (1.0 + NOISE - ks.iter().zip(&v).map(|(a, b)| a * b).sum::<f64>()).max(1e-12);
        (mean, var.sqrt())
    }
}

/// Expected improvement below `best` for a Gaussian `(mu, sd)` (minimisation).
fn expected_improvement(mu: f64, sd: f64, best: f64) -> f64 {
    let z = (best - mu) / sd;
    let pdf = (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let cdf = 0.5 * (1.0 + erf(z / std::f64::consts::SQRT_2));
    (best - mu) * cdf + sd * pdf
}

/// Abramowitz–Stegun 7.1.26 (|error| < 1.5e-7), enough for ranking candidates.
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let y = 1.0
        - (((((1.061_405_429 * t - 1.453_152_027) * t) + 1.421_413_741) * t - 0.284_496_736) * t
            + 0.254_829_592)
            * t
            * (-x * x).exp();
    if x >= 0.0 { y } else { -y }
}

impl Scheduler for Bayesian {
    fn name(&self) -> &str {
        "bayes"
    }

    fn schedule(&self, pb: &Problem, config: &SearchConfig) -> Result<Outcome, PlanError> {
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let cfg = SearchConfig {
            budget: config.budget.min(self.max_evaluations),
            ..config.clone()
        };
        let mut ev = Evaluator::new(pb, &cfg);
        let mut obs: Vec<(Vec<usize>, f64)> = Vec::new();
        let space = (t_n as f64).powi(l_n as i32);
        let random = |rng: &mut ChaCha8Rng| {
            (0..l_n)
                .map(|_| rng.random_range(0..t_n))
                .collect::<Vec<usize>>()
        };
        let mut design: Vec<Vec<usize>> = (0..t_n).map(|t| vec![t; l_n]).collect();
        design.extend((0..self.initial).map(|_| random(&mut rng)));
        for a in design {
            match ev.cost(&a) {
                Some(c) => obs.push((a, c)),
                None => return ev.finish(self.name()),
            }
        }
        let mut theta = 2.0;
        let mut iter = 0;
        while !ev.exhausted() && (ev.used() as f64) < space {
            // Training targets: standardised log cost, infeasible at worst + 1.
            let finite: Vec<f64> = obs
                .iter()
                .filter(|o| o.1.is_finite())
                .map(|o| o.1.ln())
                .collect();
            let worst = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let worst = if worst.is_finite() { worst + 1.0 } else { 1.0 };
            let mut pts: Vec<(Vec<usize>, f64)> = obs
                .iter()
                .map(|(a, c)| (a.clone(), if c.is_finite() { c.ln() } else { worst }))
                .collect();
            if pts.len() > self.max_points {
                let recent = pts.split_off(pts.len() - self.max_points / 2);
                pts.sort_by(|a, b| a.1.total_cmp(&b.1));
                pts.truncate(self.max_points - recent.len());
                pts.extend(recent);
            }
            let mean = pts.iter().map(|p| p.1).sum::<f64>() / pts.len() as f64;
            let sd = (pts.iter().map(|p| (p.1 - mean).powi(2)).sum::<f64>() / pts.len() as f64)
                .sqrt()
                .max(1e-9);
            let ys: Vec<f64> = pts.iter().map(|p| (p.1 - mean) / sd).collect();
            let xs: Vec<Vec<usize>> = pts.into_iter().map(|p| p.0).collect();
            if iter % 10 == 0 {
                let grid = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0];
                theta = grid
                    .iter()
                    .filter_map(|&th| Gp::fit(xs.clone(), &ys, th).map(|(_, lml)| (th, lml)))
                    .fold(
                        (theta, f64::NEG_INFINITY),
                        |a, b| if b.1 > a.1 { b } else { a },
                    )
                    .0;
            }
            iter += 1;
            let Some((gp, _)) = Gp::fit(xs, &ys, theta) else {
                break;
            };
            let best_y = ys.iter().copied().fold(f64::INFINITY, f64::min);
            // Candidates: random, plus mutations of the five best observed plans.
            let mut ranked: Vec<&(Vec<usize>, f64)> = obs.iter().collect();
            ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
            let elite: Vec<Vec<usize>> = ranked.iter().take(5).map(|o| o.0.clone()).collect();
            let mut best: Option<(f64, Vec<usize>)> = None;
            for c in 0..self.candidates {
                let cand = if c % 3 == 0 {
                    random(&mut rng)
                } else {
                    let mut a = elite[rng.random_range(0..elite.len())].clone();
                    for _ in 0..1 + c % 2 {
                        let l = rng.random_range(0..l_n);
                        a[l] = rng.random_range(0..t_n);
                    }
                    a
                };
                if obs.iter().any(|o| o.0 == cand) {
                    continue;
                }
                let (mu, s) = gp.predict(&cand);
                let ei = expected_improvement(mu, s, best_y);
                if best.as_ref().is_none_or(|b| ei > b.0) {
                    best = Some((ei, cand));
                }
            }
            let next = best.map_or_else(|| random(&mut rng), |b| b.1);
            match ev.cost(&next) {
                Some(c) => {
                    if !obs.iter().any(|o| o.0 == next) {
                        obs.push((next, c));
                    }
                }
                None => break,
            }
        }
        ev.finish(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cholesky_solves_a_small_system() {
        let a = [4.0, 2.0, 2.0, 3.0];
        let l = cholesky(&a, 2).unwrap();
        let x = chol_solve(&l, 2, &[2.0, 1.0]);
        // [4 2; 2 3] x = [2 1]  ->  x = [0.5, 0]
        assert!((x[0] - 0.5).abs() < 1e-12 && x[1].abs() < 1e-12);
    }

    #[test]
    fn erf_and_ei_values() {
        assert!((erf(1.0) - 0.842_700_79).abs() < 2e-7);
        assert!((erf(-0.5) + 0.520_499_88).abs() < 2e-7);
        // mu = best: EI = sd * pdf(0)
        assert!((expected_improvement(0.0, 1.0, 0.0) - 0.398_942_28).abs() < 1e-6);
    }
}
