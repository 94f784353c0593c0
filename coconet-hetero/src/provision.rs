//! Provisioning: the fewest units of a stage's type that meet the required throughput.
//!
//! With `k` data-parallel replicas a stage's per-batch time is
//! `T(k) = T₁ + 2(k−1)/k · S` (see [`crate::cost`]), with `T₁` the single-unit time and
//! `S = G / bw_sync` the time to move the stage's dense parameters once. The stage
//! processes `X(k) = k·B / T(k)` samples/s. `X(k) ≥ X_req` is equivalent to the quadratic
//! `B·k² − X_req(T₁ + 2S)·k + 2·X_req·S ≥ 0`, which holds for `k ≤ r₁` or `k ≥ r₂`
//! (its roots). If `k = 1` does not meet the requirement then `r₁ < 1`, so the answer
//! is the smallest integer `≥ r₂` and *every* smaller count fails: the result is
//! minimal even though `X(k)` is not monotone when synchronisation dominates. Without
//! synchronisation this is the paper's closed form `⌈X_req·T₁/B⌉`.

use crate::stage_shape::StageShape;
use crate::sync::SyncModel;

/// Above this many units of one stage we call the throughput unreachable.
pub const MAX_UNITS: u64 = 1 << 40;

/// The fewest units `k ≥ 1` with `shape.throughput(k) ≥ required`, or `None` when that
/// needs more than [`MAX_UNITS`].
pub fn min_units(shape: &StageShape, required: f64) -> Option<u64> {
    if shape.meets(1, required) {
        return Some(1);
    }
    if *shape.sync != SyncModel::Ring {
        return scan(shape, required);
    }
    let t1 = shape.single_unit_time();
    let s = shape.sync_time();
    let b = shape.batch;
    let lin = required * (t1 + 2.0 * s);
    let disc = lin * lin - 8.0 * b * required * s;
    let guess = if disc >= 0.0 {
        (lin + disc.sqrt()) / (2.0 * b)
    } else {
        1.0
    };
    if !guess.is_finite() || guess > MAX_UNITS as f64 {
        return None;
    }
    let mut k = (guess.ceil() as u64).max(2);
    // Floating point may put the root one step off either way; fix it up exactly.
    while k > 2 && shape.meets(k - 1, required) {
        k -= 1;
    }
    while !shape.meets(k, required) {
        k += 1;
        if k > MAX_UNITS {
            return None;
        }
    }
    Some(k)
}

/// [`min_units`] for a synchronisation priced by schedules (not of the ring's closed
/// form), once one unit is known to fail: every `k` below
/// `X·(T₁ + G·lo)/B` fails and every `k` from `X·(T₁ + G·hi)/B` on meets the
/// requirement, where `lo ≤ sync(k)/G ≤ hi` for all `k ≥ 2` (see [`SyncModel::bounds`]);
/// the first count between that meets it is the answer.
fn scan(shape: &StageShape, required: f64) -> Option<u64> {
    let (lo, hi) = shape
        .sync
        .bounds(shape.memory_bandwidth, shape.sync_bandwidth);
    let t1 = shape.single_unit_time();
    let at = |per_byte: f64| required * (t1 + shape.dense_bytes * per_byte) / shape.batch;
    let (first, last) = (at(lo), at(hi));
    if !last.is_finite() || last > MAX_UNITS as f64 {
        return None;
    }
    let first = (first.floor() as u64).max(2);
    (first..=(last.ceil() as u64).max(first)).find(|&k| shape.meets(k, required))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(compute: f64, dense_bytes: f64) -> StageShape<'static> {
        StageShape {
            compute,
            transfer: 0.001,
            dense_bytes,
            sync_bandwidth: 1e9,
            memory_bandwidth: 1e11,
            sync: &SyncModel::Ring,
            batch: 32.0,
            memory: 0.0,
        }
    }

    /// The closed form agrees with counting up from one unit, with and without sync,
    /// including the non-monotone case where synchronisation dominates.
    #[test]
    fn closed_form_matches_brute_force() {
        for &(c, g) in &[
            (0.01, 0.0),
            (0.01, 1e6),
            (0.001, 5e7),
            (0.2, 1e9),
            (1e-5, 1e8),
        ] {
            let s = shape(c, g);
            for &x in &[10.0, 1e3, 3.3e4, 1e6] {
                let k = min_units(&s, x).unwrap();
                let brute = (1..).find(|&k| s.meets(k, x)).unwrap();
                assert_eq!(k, brute, "compute {c}, dense {g}, x {x}");
            }
        }
    }

    /// With schedules (an update on every replica after the ring, or on a 1/k shard
    /// overlapped with it), the scan between the bounds agrees with counting up.
    #[test]
    fn scheduled_sync_matches_brute_force() {
        use crate::sync::{SyncSchedule, SyncStep, Traffic};
        let ring = Traffic {
            fixed: 2.0,
            per_replica: -2.0,
        };
        let model = SyncModel::Schedules(vec![
            SyncSchedule {
                name: "AR-C".into(),
                steps: vec![
                    SyncStep {
                        memory: Traffic::default(),
                        network: ring,
                    },
                    SyncStep {
                        memory: Traffic {
                            fixed: 7.0,
                            per_replica: 0.0,
                        },
                        network: Traffic::default(),
                    },
                ],
            },
            SyncSchedule {
                name: "fused".into(),
                steps: vec![SyncStep {
                    memory: Traffic {
                        fixed: 2.0,
                        per_replica: 5.0,
                    },
                    network: ring,
                }],
            },
        ]);
        for &(c, g, mem) in &[
            (0.01, 1e6, 1e9),
            (0.001, 5e7, 2e9),
            (0.2, 1e9, 1e11),
            (1e-5, 1e8, 5e8),
        ] {
            let s = StageShape {
                sync: &model,
                memory_bandwidth: mem,
                ..shape(c, g)
            };
            for &x in &[10.0, 1e3, 3.3e4, 1e6] {
                let k = min_units(&s, x).unwrap();
                let brute = (1..).find(|&k| s.meets(k, x)).unwrap();
                assert_eq!(k, brute, "compute {c}, dense {g}, memory {mem}, x {x}");
            }
        }
    }

    #[test]
    fn no_sync_is_the_paper_closed_form() {
        let s = shape(0.099, 0.0);
        // T = 0.1 s per batch of 32: X_req = 1000 needs ceil(1000 * 0.1 / 32) = 4 units.
        assert_eq!(min_units(&s, 1000.0), Some(4));
        assert_eq!(min_units(&s, 320.0), Some(1));
        assert_eq!(min_units(&s, 1e30), None);
    }
}
