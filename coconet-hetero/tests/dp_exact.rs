//! The exact DP agrees with exhaustive enumeration, and provisioning is minimal.

mod common;

use coconet_hetero::schedulers::{Dp, Exhaustive, Optimality, Scheduler, SearchConfig};
use coconet_hetero::{PlanError, StageShape, Transfers};
use common::{
    arb_problem, chain, close, dp_against_exhaustive, naive_cost, stated_gap, two_layers,
};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn dp_equals_exhaustive(pb in arb_problem(5, 3), split in any::<bool>()) {
        if let Some(d) = dp_against_exhaustive(&pb, split, 4096)? {
            // Independent re-evaluation of the DP's plan.
            let (naive, _) = naive_cost(&pb, &d.plan).expect("dp plan must be feasible");
            prop_assert!(close(naive, d.evaluation.cost));
            if !split {
                prop_assert!(d.plan.stages.windows(2).all(|w| w[0].ty != w[1].ty));
            }
        }
    }

    /// Exhaustive evaluates exactly the plans it counts (the count `max_plans` bounds).
    #[test]
    fn exhaustive_evaluates_the_plans_it_counts(pb in arb_problem(6, 4), split in any::<bool>()) {
        let ex = Exhaustive { split_runs: split, ..Exhaustive::default() };
        let want = ex.plan_count(pb.num_layers(), pb.num_types());
        match ex.schedule(&pb, &SearchConfig::default()) {
            Ok(out) => prop_assert_eq!(out.evaluations as f64, want),
            Err(PlanError::NoFeasiblePlan(m)) => {
                let all = format!("all {want} plans are infeasible");
                prop_assert!(m.starts_with(&all), "{}", m);
            }
            Err(e) => prop_assert!(false, "{}", e),
        }
    }

    /// With one bandwidth between every pair of types, neighbours form groups of several
    /// types (one stage evaluation per group): the table DP and the label search are
    /// still exact, runs split or not.
    #[test]
    fn one_link_bandwidth_dp_equals_exhaustive(
        pb in arb_problem(5, 3),
        split in any::<bool>(),
        bandwidth in 1e8f64..1e10,
    ) {
        let mut pb = pb;
        for row in &mut pb.catalog.bandwidth {
            row.fill(bandwidth);
        }
        dp_against_exhaustive(&pb, split, 4096)?;
        dp_against_exhaustive(&pb, split, 1)?;
    }

    /// The label search (forced by a one-state table) is exact too, on every instance.
    #[test]
    fn dp_with_caps_as_labels_equals_exhaustive(pb in arb_problem(5, 3), split in any::<bool>()) {
        dp_against_exhaustive(&pb, split, 1)?;
    }

    /// With the synchronisation hidden behind part of the compute, the DP is still exact,
    /// and no plan costs more than without.
    #[test]
    fn dp_with_hidden_sync_equals_exhaustive(
        pb in arb_problem(5, 3),
        split in any::<bool>(),
        overlap in 0.0f64..=1.0,
    ) {
        let hidden = pb.clone().with_sync_overlap(overlap);
        let fast = dp_against_exhaustive(&hidden, split, 4096)?;
        let slow = dp_against_exhaustive(&pb, split, 4096)?;
        match (fast, slow) {
            (Some(f), Some(s)) => prop_assert!(f.evaluation.cost <= s.evaluation.cost * (1.0 + 1e-12)),
            (_, None) => {}
            (None, Some(_)) => prop_assert!(false, "hiding the sync made a feasible instance infeasible"),
        }
    }

    /// With the transfers overlapping the compute, the DP is still exact, and no plan
    /// costs more than with them in series.
    #[test]
    fn dp_with_overlapped_transfers_equals_exhaustive(pb in arb_problem(5, 3), split in any::<bool>()) {
        let overlapped = pb.clone().with_transfers(Transfers::Overlapped);
        let fast = dp_against_exhaustive(&overlapped, split, 4096)?;
        let slow = dp_against_exhaustive(&pb, split, 4096)?;
        match (fast, slow) {
            (Some(f), Some(s)) => prop_assert!(f.evaluation.cost <= s.evaluation.cost * (1.0 + 1e-12)),
            (_, None) => {}
            (None, Some(_)) => prop_assert!(false, "overlapping made a feasible instance infeasible"),
        }
    }

    /// Out of its label budget, the DP's plan keeps every cap and is within the gap it
    /// states of the optimum (its Lagrangian and compute-only lower bounds hold), and it
    /// never claims a plan where none exists.
    #[test]
    fn out_of_budget_the_dp_states_a_gap_that_holds(pb in arb_problem(5, 3)) {
        let cfg = SearchConfig::default();
        let dp = Dp { max_cap_states: 1, max_labels: 1, ..Dp::default() }.schedule(&pb, &cfg);
        let ex = Exhaustive::default().schedule(&pb, &cfg);
        match (dp, ex) {
            (Ok(d), Ok(e)) => {
                prop_assert!(naive_cost(&pb, &d.plan).is_some(), "the plan must keep every cap");
                prop_assert!(d.evaluation.cost >= e.evaluation.cost * (1.0 - 1e-9));
                if let Optimality::NotGuaranteed(why) = &d.optimality {
                    let gap = stated_gap(why);
                    let real = 100.0 * (d.evaluation.cost - e.evaluation.cost) / d.evaluation.cost;
                    prop_assert!(real <= gap + 0.05, "real gap {real} % > stated {gap} %");
                    // The bound it states the gap to: below the optimum, the gap to it.
                    let lb = d.lower_bound.expect("a stated gap has its bound");
                    prop_assert!(lb <= e.evaluation.cost * (1.0 + 1e-9), "bound {lb} > optimum {}", e.evaluation.cost);
                    let to_bound = 100.0 * (d.evaluation.cost / lb - 1.0);
                    prop_assert!((to_bound - gap).abs() <= 0.005 || (to_bound.is_infinite() && gap.is_infinite()), "gap {gap} % stated, {to_bound} % to the bound");
                } else {
                    prop_assert!(close(d.evaluation.cost, e.evaluation.cost));
                    prop_assert_eq!(d.lower_bound, Some(d.evaluation.cost));
                }
            }
            (Err(PlanError::NoFeasiblePlan(_) | PlanError::Undecided { .. }), Err(PlanError::NoFeasiblePlan(_))) => {}
            (Err(PlanError::Undecided { .. }), Ok(_)) => {}
            (d, e) => prop_assert!(false, "disagree: dp {:?} exhaustive {:?}", d.map(|o| o.evaluation.cost), e.map(|o| o.evaluation.cost)),
        }
    }

    #[test]
    fn provisioning_is_minimal(pb in arb_problem(6, 3), seed in any::<u64>()) {
        // A random plan; every stage with k > 1 units misses the throughput with k - 1.
        let l = pb.num_layers();
        let t = pb.num_types();
        let types: Vec<usize> = (0..l).map(|i| ((seed >> (2 * i)) as usize) % t).collect();
        let plan = coconet_hetero::SchedulingPlan::from_assignment(&types);
        let Ok(ev) = pb.evaluate(&plan) else { return Ok(()) };
        prop_assert!(ev.throughput >= pb.constraint.throughput * (1.0 - 1e-12));
        let (_, naive_units) = naive_cost(&pb, &plan).expect("feasible");
        for (i, r) in ev.stages.iter().enumerate() {
            prop_assert_eq!(r.units, naive_units[i]);
            let st = r.stage;
            let prev = (i > 0).then(|| plan.stages[i - 1].ty);
            let next = plan.stages.get(i + 1).map(|s| s.ty);
            let shape: StageShape = pb.stage_shape(st.first, st.last, st.ty, prev, next);
            prop_assert!(shape.throughput(r.units) >= pb.constraint.throughput * (1.0 - 1e-12));
            for fewer in 1..r.units.min(50) {
                prop_assert!(shape.throughput(r.units - fewer) < pb.constraint.throughput, "stage {} meets with {} < {} units", i, r.units - fewer, r.units);
            }
        }
    }
}

#[test]
fn caps_make_instances_infeasible_and_dp_says_why() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut pb = arb_problem(3, 2).new_tree(&mut runner).unwrap().current();
    for t in &mut pb.catalog.types {
        t.cap = Some(1);
        t.memory_bytes = 1e15;
    }
    pb.constraint.throughput = 1e9;
    let err = Dp::default()
        .schedule(&pb, &SearchConfig::default())
        .unwrap_err();
    assert!(
        matches!(err, PlanError::NoFeasiblePlan(ref m) if m.contains("caps")),
        "{err}"
    );
}

/// The random instances cover feasible, memory-infeasible and cap-bound cases in
/// meaningful proportions (so the equality property above is not vacuous).
#[test]
fn random_instances_mix_feasible_and_infeasible() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = arb_problem(5, 3);
    let (mut feasible, mut infeasible, mut capped_binding) = (0, 0, 0);
    for _ in 0..300 {
        let pb = strategy.new_tree(&mut runner).unwrap().current();
        match Dp::default().schedule(&pb, &SearchConfig::default()) {
            Ok(o) => {
                feasible += 1;
                let mut relaxed = pb.clone();
                relaxed.catalog.types.iter_mut().for_each(|t| t.cap = None);
                let free = Dp::default()
                    .schedule(&relaxed, &SearchConfig::default())
                    .unwrap();
                capped_binding +=
                    usize::from(free.evaluation.cost < o.evaluation.cost * (1.0 - 1e-9));
            }
            Err(_) => infeasible += 1,
        }
    }
    eprintln!("feasible {feasible}, infeasible {infeasible}, caps binding {capped_binding}");
    assert!(
        feasible >= 60 && infeasible >= 30 && capped_binding >= 10,
        "{feasible} {infeasible} {capped_binding}"
    );
}

/// Each stage's type and unit count.
fn types_and_units(d: &coconet_hetero::schedulers::Outcome) -> Vec<(usize, u64)> {
    d.evaluation
        .stages
        .iter()
        .map(|s| (s.stage.ty, s.units))
        .collect()
}

/// The cases where two binding caps defeated the Lagrangian fallback (issue 18): one
/// plan no price makes cheapest ($17.00 returned, $14.00 optimal), and one "no feasible
/// plan" where every other scheduler found one ($12.00).
#[test]
fn two_binding_caps_are_solved_exactly() {
    let cfg = SearchConfig::default();
    for (pb, want, stages) in [
        (
            two_layers(
                [[4.0, 1.0, 2.0], [3.0, 2.0, 3.0]],
                [1.0, 2.0, 5.0],
                [Some(70), Some(80), None],
                40.0,
            ),
            14.0,
            vec![(2, 80), (1, 80)],
        ),
        (
            two_layers(
                [[4.0, 1.0, 1.0], [4.0, 2.0, 3.0]],
                [2.0, 4.0, 4.0],
                [Some(65), Some(65), Some(70)],
                30.0,
            ),
            12.0,
            vec![(2, 30), (1, 60)],
        ),
    ] {
        let d = Dp::default().schedule(&pb, &cfg).unwrap();
        let e = Exhaustive::default().schedule(&pb, &cfg).unwrap();
        assert!(
            close(d.evaluation.cost, want),
            "dp {} vs {want}",
            d.evaluation.cost
        );
        assert!(
            close(e.evaluation.cost, want),
            "exhaustive {}",
            e.evaluation.cost
        );
        assert_eq!(d.optimality, Optimality::Proven);
        assert_eq!(types_and_units(&d), stages);
    }
}

/// Caps each of which a stage fits, but which no plan keeps together: three layers of one
/// second each at 10 samples/s need 30 units in all, and two types capped at 14 cannot
/// hold three stages of 10. With the table and the label search both out of budget the
/// DP once answered "undecided"; a weighted sum of the caps (half each: every plan draws
/// at least 30 / 28 of it) now proves that no plan exists, as exhaustive search finds.
#[test]
fn caps_out_of_reach_together_are_proven_so() {
    let one: &[f64] = &[1.0, 1.0];
    let pb = chain(&[one, one, one], &[1.0, 2.0], &[Some(14), Some(14)], 10.0);
    let cfg = SearchConfig::default();
    let tiny = Dp {
        max_cap_states: 1,
        max_labels: 1,
        ..Dp::default()
    };
    match tiny.schedule(&pb, &cfg) {
        Err(PlanError::NoFeasiblePlan(why)) => {
            assert!(why.contains("weighted sum"), "{why}");
            assert!(why.contains("50 % of type A (14 units)"), "{why}");
        }
        other => panic!("expected a proof of infeasibility, got {other:?}"),
    }
    assert!(matches!(
        Exhaustive::default().schedule(&pb, &cfg),
        Err(PlanError::NoFeasiblePlan(_))
    ));
    // Caps of 20 and 10 hold a stage of two layers and one of one: the weighted sums
    // prove nothing, and the label search finds that plan.
    let pb = chain(&[one, one, one], &[1.0, 2.0], &[Some(20), Some(10)], 10.0);
    let d = Dp {
        max_cap_states: 1,
        ..Dp::default()
    }
    .schedule(&pb, &cfg)
    .unwrap();
    let e = Exhaustive::default().schedule(&pb, &cfg).unwrap();
    assert!(close(d.evaluation.cost, e.evaluation.cost));
    assert_eq!(d.optimality, Optimality::Proven);
}

/// The first case above scaled by 10^8: caps and unit counts beyond 2^32. The label
/// search once kept usage in u32 (caps clamped to 2^32 − 1, unit counts truncated) and
/// returned B×4·10^9 + C×1.2·10^10 here, 1.5× the optimum.
#[test]
fn caps_beyond_u32_are_kept_exactly() {
    let scale = 1e8;
    let pb = two_layers(
        [[4.0, 1.0, 2.0], [3.0, 2.0, 3.0]],
        [1.0, 2.0, 5.0],
        [Some(70 * 100_000_000), Some(80 * 100_000_000), None],
        40.0 * scale,
    );
    let d = Dp::default()
        .schedule(&pb, &SearchConfig::default())
        .unwrap();
    assert_eq!(
        types_and_units(&d),
        vec![(2, 8_000_000_000), (1, 8_000_000_000)]
    );
    // Units × price × the job's hours: the scale cancels.
    assert!(close(d.evaluation.cost, 14.0), "{}", d.evaluation.cost);
    assert_eq!(d.optimality, Optimality::Proven);
}

/// 9 layers of 4 types with cuts inside runs: 4·5^8 = 1.6e6 plans fit the default
/// budget (the count once said 4^9·2^8 = 6.7e7 and refused them).
#[test]
fn exhaustive_counts_nine_layers_of_four_types_within_its_budget() {
    let ex = Exhaustive::default();
    assert_eq!(ex.plan_count(9, 4), 1_562_500.0);
    assert!(ex.plan_count(9, 4) <= ex.max_plans);
    let no_cuts = Exhaustive {
        split_runs: false,
        ..Exhaustive::default()
    };
    assert_eq!(no_cuts.plan_count(9, 4), 262_144.0);
}
