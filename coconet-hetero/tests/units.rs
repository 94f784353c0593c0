//! `SearchConfig::units`: the search heuristics priced with the units the exact DP would
//! rent (`Units::Best`) find plans at least as cheap as with the fewest units, and
//! exhaustive search in that space is the DP's proven optimum.

mod common;

use coconet_hetero::schedulers::{
    self, Dp, Exhaustive, Optimality, Scheduler, SearchConfig, Units,
};
use coconet_hetero::{Constraint, Objective, Problem};
use common::{arb_problem, chain, close};
use proptest::prelude::*;

fn config(units: Units) -> SearchConfig {
    SearchConfig {
        seed: 3,
        budget: 500,
        units,
        ..SearchConfig::default()
    }
}

/// Two layers, two types at $1/h: layer 0 takes 1 s a sample on A, layer 1 0.5 s on B
/// (10 s on the other type). At 1 sample/s and 3,600 samples the fewest units, one
/// each, reach 1 sample/s for $2/h over an hour: $2. Two units of A (and one of B)
/// reach 2 samples/s for $3/h over half an hour: $1.50, which is optimal (each layer's
/// compute at its cheapest is 1.5 unit-seconds a sample).
fn rounding_pays() -> Problem {
    chain(
        &[&[1.0, 10.0], &[10.0, 0.5]],
        &[1.0, 1.0],
        &[None, None],
        1.0,
    )
    .with_objective(Objective::Duration)
}

#[test]
fn every_heuristic_in_the_dps_space_of_units_finds_the_optimum_the_fewest_miss() {
    let pb = rounding_pays();
    let dp = Dp::default().schedule(&pb, &config(Units::Min)).unwrap();
    assert_eq!(dp.optimality, Optimality::Proven);
    assert!(close(dp.evaluation.cost, 1.5), "{}", dp.evaluation.cost);
    for s in schedulers::all() {
        let min = s.schedule(&pb, &config(Units::Min)).unwrap();
        let best = s.schedule(&pb, &config(Units::Best)).unwrap();
        let name = s.name();
        assert!(
            best.evaluation.cost <= min.evaluation.cost * (1.0 + 1e-12),
            "{name}: {} > {}",
            best.evaluation.cost,
            min.evaluation.cost
        );
        assert!(
            close(best.evaluation.cost, 1.5),
            "{name}: {}",
            best.evaluation.cost
        );
        if name != "dp" {
            // The paper's space cannot rent the second unit of A.
            assert!(
                close(min.evaluation.cost, 2.0),
                "{name}: {}",
                min.evaluation.cost
            );
        }
        // The plan is priced as rented: the units reach the throughput it is charged for.
        let ev = &best.evaluation;
        assert!(
            ev.throughput >= 2.0 * (1.0 - 1e-12),
            "{name}: {}",
            ev.throughput
        );
        assert!(close(ev.wall_time, pb.constraint.samples / ev.throughput));
        let units: Vec<u64> = ev.stages.iter().map(|r| r.units).collect();
        assert_eq!(units.iter().sum::<u64>(), 3, "{name}: {units:?}");
    }
    // Exhaustive search over every unit count is a proof.
    let ex = Exhaustive::default()
        .schedule(&pb, &config(Units::Best))
        .unwrap();
    assert_eq!(ex.optimality, Optimality::Proven);
    let ex = Exhaustive::default()
        .schedule(&pb, &config(Units::Min))
        .unwrap();
    assert!(matches!(ex.optimality, Optimality::NotGuaranteed(_)));
}

/// Fed at the required rate the fewest units are the cheapest: both settings agree.
#[test]
fn under_the_required_rate_the_settings_agree() {
    let pb = rounding_pays().with_objective(Objective::RequiredRate);
    for s in schedulers::all() {
        let min = s.schedule(&pb, &config(Units::Min)).unwrap();
        let best = s.schedule(&pb, &config(Units::Best)).unwrap();
        assert_eq!(min.evaluation, best.evaluation, "{}", s.name());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, ..ProptestConfig::default() })]

    /// On small capped instances (billing minimum, whole instances included) exhaustive
    /// search with every plan at its cheapest units is the DP's proven optimum, and
    /// without cuts inside runs (the heuristics' plans) no worse than at the fewest.
    #[test]
    fn exhaustive_in_the_same_space_equals_the_dp(
        pb in arb_problem(3, 3),
        caps in prop::collection::vec(1u64..=5, 3),
        sizes in prop::collection::vec(1u64..=2, 3),
        x in 10.0f64..3000.0,
        minimum in prop_oneof![Just(0.0), 1e5f64..1e8],
    ) {
        let mut pb = pb
            .with_constraint(Constraint::new(x, 1e9).unwrap())
            .with_objective(Objective::Duration);
        for ((t, cap), size) in pb.catalog.types.iter_mut().zip(caps).zip(sizes) {
            t.cap = Some(cap);
            t.units_per_instance = size;
        }
        pb.catalog.billing_minimum = minimum;
        let dp = Dp::default().schedule(&pb, &config(Units::Min));
        let ex = Exhaustive::default().schedule(&pb, &config(Units::Best));
        match (dp, ex) {
            (Ok(d), Ok(e)) => {
                prop_assert_eq!(&d.optimality, &Optimality::Proven);
                prop_assert_eq!(&e.optimality, &Optimality::Proven);
                prop_assert!(close(d.evaluation.cost, e.evaluation.cost),
                    "dp {} exhaustive {}", d.evaluation.cost, e.evaluation.cost);
            }
            (Err(_), Err(_)) => {}
            (d, e) => prop_assert!(false, "dp {:?} exhaustive {:?}",
                d.map(|o| o.evaluation.cost), e.map(|o| o.evaluation.cost)),
        }
        let merged = |units| Exhaustive { split_runs: false, ..Exhaustive::default() }
            .schedule(&pb, &config(units))
            .map(|o| o.evaluation.cost);
        if let Ok(min) = merged(Units::Min) {
            let best = merged(Units::Best).expect("a plan at its fewest units is one");
            prop_assert!(best <= min * (1.0 + 1e-12), "{} > {}", best, min);
        }
    }
}
