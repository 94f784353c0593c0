//! The exact DP agrees with exhaustive enumeration, and provisioning is minimal.

mod common;

use coconet_hetero::schedulers::{Dp, Exhaustive, Optimality, Scheduler, SearchConfig};
use coconet_hetero::{PlanError, StageShape};
use common::{arb_problem, close, naive_cost};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn dp_equals_exhaustive(pb in arb_problem(5, 3), split in any::<bool>()) {
        let cfg = SearchConfig::default();
        let dp = Dp { split_runs: split, ..Dp::default() }.schedule(&pb, &cfg);
        let ex = Exhaustive { split_runs: split, ..Exhaustive::default() }.schedule(&pb, &cfg);
        match (dp, ex) {
            (Ok(d), Ok(e)) => {
                prop_assert!(close(d.evaluation.cost, e.evaluation.cost), "dp {} vs exhaustive {}", d.evaluation.cost, e.evaluation.cost);
                prop_assert_eq!(d.optimality, Optimality::Proven);
                // Independent re-evaluation of the DP's plan.
                let (naive, _) = naive_cost(&pb, &d.plan).expect("dp plan must be feasible");
                prop_assert!(close(naive, d.evaluation.cost));
                if !split {
                    prop_assert!(d.plan.stages.windows(2).all(|w| w[0].ty != w[1].ty));
                }
            }
            (Err(PlanError::NoFeasiblePlan(_)), Err(PlanError::NoFeasiblePlan(_))) => {}
            (d, e) => prop_assert!(false, "disagree: dp {:?} exhaustive {:?}", d.map(|o| o.evaluation.cost), e.map(|o| o.evaluation.cost)),
        }
    }

    #[test]
    fn provisioning_is_minimal(pb in arb_problem(6, 3), seed in any::<u64>()) {
        // A random plan; every stage with k > 1 units misses the throughput with k - 1.
        let l = pb.num_layers();
        let t = pb.num_types();
        let types: Vec<usize> = (0..l).map(|i| ((seed >> (2 * i)) as usize) % t).collect();
        let plan = coconet_hetero::Plan::from_assignment(&types);
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
