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
//! synchronisation this is the paper's closed form `⌈X_req·T₁/B⌉`. A synchronisation
//! priced by schedules ([`SyncModel::Schedules`]) is affine in `1/k` piece by piece, so
//! the same reasoning runs on each piece (see `scheduled`).

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
    // With the synchronisation hidden behind part of the compute, `T(k) =
    // max(T₁, T₁' + sync(k))`: `k` meets the throughput iff it does without the
    // synchronisation (`k ≥ k_c = ⌈X·T₁/B⌉`) and with `T₁'` plus the synchronisation.
    // The second set is the one below for single time `T₁'`: all `k` up to its lower
    // root and from its upper root on. If `k_c` is in it, `k_c` is the answer; if not,
    // `k_c` lies between the roots, so the answer is the smallest `k ≥ k_c` past the
    // upper one.
    let mut t1 = shape.single_unit_time();
    let mut at_least = 2u64;
    if shape.sync_overlap > 0.0 {
        let k_c = (required * t1 / shape.batch).ceil().max(2.0);
        if !k_c.is_finite() || k_c > MAX_UNITS as f64 {
            return None;
        }
        if shape.meets(k_c as u64, required) {
            // Rounding may put `k_c` a count high; settle it exactly.
            return settle(shape, required, k_c as u64);
        }
        t1 = shape.exposed_time();
        at_least = k_c as u64;
    }
    // Asynchronous through the parameter server: no synchronisation, the closed form.
    if *shape.sync == SyncModel::AsyncServer {
        let k = (required * t1 / shape.batch).ceil().max(at_least as f64);
        if !k.is_finite() || k > MAX_UNITS as f64 {
            return None;
        }
        return settle(shape, required, k as u64);
    }
    if *shape.sync != SyncModel::Ring {
        return scheduled(shape, t1, at_least, required);
    }
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
    // Floating point may put the root one step off either way; fix it up exactly.
    settle(shape, required, (guess.ceil() as u64).max(at_least))
}

/// [`min_units`] for a synchronisation priced by schedules, once one unit is known to
/// fail: the fewest units from `at_least` on, with single-unit time `t1`. With
/// `u = 1/k`, a schedule's synchronisation is affine in `u` on each of its pieces
/// ([`crate::sync::SyncSchedule::pieces`]), `a + b·u` per parameter byte, so `k` units
/// meet `X` where `X·G·b·u² + X·(T₁ + G·a)·u − B ≤ 0`: a quadratic in `u`, whose
/// feasible stretches on the piece give the smallest `k` there exactly. The answer is the
/// smallest over every piece of every schedule (the stage takes its cheapest schedule at
/// each `k`).
fn scheduled(shape: &StageShape, t1: f64, at_least: u64, required: f64) -> Option<u64> {
    let SyncModel::Schedules(list) = shape.sync else {
        return None;
    };
    let (g, x) = (shape.dense_bytes, required);
    let u_min = 1.0 / MAX_UNITS as f64;
    let mut best: Option<u64> = None;
    for s in list {
        for p in s.pieces(shape.memory_bandwidth, shape.sync_bandwidth, u_min) {
            let quadratic = (x * g * p.b, x * (t1 + g * p.a), -shape.batch);
            for (lo, hi) in at_most_zero(quadratic, p.u_lo, p.u_hi) {
                // The largest feasible u is the smallest k, if an integer k has 1/k there.
                let k = (1.0 / hi).ceil().max(at_least as f64);
                if k <= (1.0 / lo).floor() && k <= MAX_UNITS as f64 {
                    best = Some(best.map_or(k as u64, |b| b.min(k as u64)));
                }
            }
        }
    }
    // No schedule at all: no synchronisation, the compute-only count.
    let none = list
        .is_empty()
        .then(|| ((x * t1 / shape.batch).ceil() as u64).max(at_least));
    // Rounding may put the answer one count off either way; settle it exactly.
    settle(shape, required, best.or(none)?)
}

/// The fewest units from an estimate `k ≥ 2` one or two counts off: down while one fewer
/// still meets `required`, up until `k` does (or past [`MAX_UNITS`]).
fn settle(shape: &StageShape, required: f64, mut k: u64) -> Option<u64> {
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

/// The stretches of `[lo, hi]` where `c2·u² + c1·u + c0 ≤ 0`.
fn at_most_zero((c2, c1, c0): (f64, f64, f64), lo: f64, hi: f64) -> Vec<(f64, f64)> {
    let clip = |a: f64, b: f64| (a.max(lo) <= b.min(hi)).then(|| (a.max(lo), b.min(hi)));
    if c2 == 0.0 {
        return match c1.partial_cmp(&0.0) {
            Some(std::cmp::Ordering::Greater) => clip(f64::NEG_INFINITY, -c0 / c1),
            Some(std::cmp::Ordering::Less) => clip(-c0 / c1, f64::INFINITY),
            _ => (c0 <= 0.0).then_some((lo, hi)),
        }
        .into_iter()
        .collect();
    }
    let disc = c1 * c1 - 4.0 * c2 * c0;
    if disc < 0.0 {
        // No roots: everywhere (opening down) or nowhere (opening up).
        return if c2 < 0.0 { vec![(lo, hi)] } else { vec![] };
    }
    // Roots without cancellation.
    let q = -0.5 * (c1 + c1.signum() * disc.sqrt());
    let (mut r1, mut r2) = (q / c2, if q != 0.0 { c0 / q } else { 0.0 });
    if r1 > r2 {
        std::mem::swap(&mut r1, &mut r2);
    }
    if c2 > 0.0 {
        clip(r1, r2).into_iter().collect()
    } else {
        [clip(f64::NEG_INFINITY, r1), clip(r2, f64::INFINITY)]
            .into_iter()
            .flatten()
            .collect()
    }
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
            transfers: crate::stage_shape::Transfers::Serial,
            sync_overlap: 0.0,
        }
    }

    /// `min_units` equals counting up from one unit at several requirements.
    fn agrees_with_counting(s: &StageShape, what: &str) {
        for &x in &[10.0, 1e3, 3.3e4, 1e6] {
            let k = min_units(s, x).unwrap();
            let brute = (1..).find(|&k| s.meets(k, x)).unwrap();
            assert_eq!(k, brute, "{what}, x {x}");
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
            agrees_with_counting(&shape(c, g), &format!("compute {c}, dense {g}"));
        }
    }

    /// With schedules (an update on every replica after the ring, or on a 1/k shard
    /// overlapped with it), solving each piece's quadratic agrees with counting up.
    #[test]
    fn scheduled_sync_matches_brute_force() {
        let model = crate::sync::adam_like();
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
            agrees_with_counting(&s, &format!("compute {c}, dense {g}, memory {mem}"));
        }
    }

    /// Huge requirements are solved without counting (no hang), minimal and past the
    /// unit limit refused.
    #[test]
    fn scheduled_sync_at_huge_scale_is_fast_and_minimal() {
        let model = crate::sync::adam_like();
        let s = StageShape {
            sync: &model,
            memory_bandwidth: 1e11,
            ..shape(0.01, 1e9)
        };
        for x in [1e6, 1e8, 1e10] {
            let k = min_units(&s, x).unwrap();
            assert!(s.meets(k, x) && !s.meets(k - 1, x), "{x}: {k}");
        }
        assert_eq!(min_units(&s, 1e30), None);
    }

    /// With the transfers overlapped the single-unit time is `max(C, D)`, and the
    /// closed forms still agree with counting up.
    #[test]
    fn overlapped_transfers_match_brute_force() {
        use crate::stage_shape::Transfers;
        for &(c, d, g) in &[(0.01, 0.001, 1e6), (0.001, 0.01, 5e7), (0.2, 0.3, 0.0)] {
            let s = StageShape {
                transfer: d,
                transfers: Transfers::Overlapped,
                ..shape(c, g)
            };
            assert_eq!(s.single_unit_time(), c.max(d));
            agrees_with_counting(&s, &format!("compute {c}, transfer {d}, dense {g}"));
        }
    }

    /// With the synchronisation hidden behind part of the compute, under the ring and
    /// under schedules, the closed forms agree with counting up (the time is flat until
    /// the synchronisation outgrows what hides it).
    #[test]
    fn hidden_sync_matches_brute_force() {
        let model = crate::sync::adam_like();
        for overlap in [0.3, 2.0 / 3.0, 1.0] {
            for &(c, g) in &[
                (0.01, 1e6),
                (0.001, 5e7),
                (0.2, 1e9),
                (1e-5, 1e8),
                (0.05, 3e7),
            ] {
                let ring = StageShape {
                    sync_overlap: overlap,
                    ..shape(c, g)
                };
                agrees_with_counting(
                    &ring,
                    &format!("ring, overlap {overlap}, compute {c}, dense {g}"),
                );
                let scheduled = StageShape {
                    sync: &model,
                    memory_bandwidth: 2e9,
                    ..ring
                };
                agrees_with_counting(
                    &scheduled,
                    &format!("schedules, overlap {overlap}, compute {c}, dense {g}"),
                );
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
