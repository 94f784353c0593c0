//! The DP under caps stopped by its time limit: a plan within every cap and a stated gap
//! that holds against the optimum it proves without the limit.

use coconet_hetero::schedulers::{Dp, Optimality, Scheduler, SearchConfig};
use std::time::Duration;

#[path = "../benches/chain/mod.rs"]
mod chain;
mod common;

#[test]
fn a_time_limit_stops_the_search_with_a_gap_that_holds() {
    let pb = chain::problem(400, &[None, Some(24), Some(24), None]);
    let unlimited = SearchConfig {
        time_limit: None,
        ..SearchConfig::default()
    };
    let full = Dp::default().schedule(&pb, &unlimited).expect("a plan");
    assert_eq!(full.optimality, Optimality::Proven);
    let at_once = SearchConfig {
        time_limit: Some(Duration::ZERO),
        ..SearchConfig::default()
    };
    let stopped = Dp {
        max_cap_states: 1,
        ..Dp::default()
    }
    .schedule(&pb, &at_once)
    .expect("an incumbent");
    assert!(
        pb.evaluate(&stopped.plan).is_ok(),
        "the plan keeps every cap"
    );
    let Optimality::NotGuaranteed(why) = &stopped.optimality else {
        panic!("stopped at once, yet {:?}", stopped.optimality);
    };
    assert!(why.contains("or 0 s"), "{why}");
    let gap = common::stated_gap(why);
    let real = 100.0 * (stopped.evaluation.cost - full.evaluation.cost) / stopped.evaluation.cost;
    assert!(
        real >= -1e-9 && real <= gap + 0.005,
        "real gap {real} % > stated {gap} %"
    );
    // The bound the gap is stated to, in dollars: below the optimum; a proven answer is
    // its own bound.
    let lb = stopped.lower_bound.expect("a bound with the gap");
    assert!(
        lb <= full.evaluation.cost,
        "{lb} > {}",
        full.evaluation.cost
    );
    assert!(
        (100.0 * (stopped.evaluation.cost / lb - 1.0) - gap).abs() <= 0.005,
        "{gap} % is not the gap to {lb}"
    );
    assert_eq!(full.lower_bound, Some(full.evaluation.cost));
}

/// Under the paper's objective the search runs one DP per throughput step; past the time
/// limit it takes no further step and returns the best plan so far with a gap to the
/// floor that holds (issue 46: every step after the deadline still ran a whole DP).
#[test]
fn the_duration_objective_stops_at_its_time_limit_with_a_gap_that_holds() {
    use coconet_hetero::Objective;
    let pb = chain::problem(60, &[None, None, None, None]).with_objective(Objective::Duration);
    let full = Dp::default()
        .schedule(
            &pb,
            &SearchConfig {
                time_limit: None,
                ..SearchConfig::default()
            },
        )
        .expect("a plan");
    let stopped = Dp::default()
        .schedule(
            &pb,
            &SearchConfig {
                time_limit: Some(Duration::ZERO),
                ..SearchConfig::default()
            },
        )
        .expect("the first step's plan");
    assert!(pb.evaluate(&stopped.plan).is_ok());
    match &stopped.optimality {
        Optimality::NotGuaranteed(why) => {
            assert!(
                why.contains("time limit passed after 1 throughput steps"),
                "{why}"
            );
            let gap = common::stated_gap(why);
            let real =
                100.0 * (stopped.evaluation.cost - full.evaluation.cost) / stopped.evaluation.cost;
            assert!(
                real >= -1e-9 && real <= gap + 0.005,
                "real gap {real} % > stated {gap} %"
            );
            // The floor it states the gap to, in dollars, below the optimum.
            let lb = stopped.lower_bound.expect("a bound with the gap");
            assert!(
                lb <= full.evaluation.cost,
                "{lb} > {}",
                full.evaluation.cost
            );
            assert!(
                (100.0 * (stopped.evaluation.cost / lb - 1.0) - gap).abs() <= 0.005,
                "{gap} % is not the gap to {lb}"
            );
        }
        // The first step's plan already met the floor: nothing to stop.
        Optimality::Proven => assert_eq!(stopped.evaluation.cost, full.evaluation.cost),
        Optimality::Heuristic => panic!("the DP is exact"),
    }
}
