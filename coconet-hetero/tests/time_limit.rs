//! The DP under caps stopped by its time limit: a plan within every cap and a stated gap
//! that holds against the optimum it proves without the limit.

use coconet_hetero::schedulers::{Dp, Optimality, Scheduler, SearchConfig};
use std::time::Duration;

use coconet_hetero::instances::chain;
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

/// A work limit is counted, not timed: a tiny one stops the search at the same point on
/// every machine and every run, with a plan within every cap, a lower bound below the
/// optimum and the gap to it; the status says which limit stopped it.
#[test]
fn a_tiny_work_limit_stops_the_search_the_same_way_every_time() {
    use coconet_hetero::Objective;
    let tiny = SearchConfig {
        work_limit: Some(1),
        time_limit: None,
        ..SearchConfig::default()
    };
    let unlimited = SearchConfig {
        work_limit: None,
        time_limit: None,
        ..SearchConfig::default()
    };
    // Under binding caps (required rate: the label search is never started) and under
    // the paper's objective without caps (one throughput step).
    for (pb, dp) in [
        (
            chain::problem(400, &[None, Some(24), Some(24), None]),
            Dp {
                max_cap_states: 1,
                ..Dp::default()
            },
        ),
        (
            chain::problem(60, &[None, None, None, None]).with_objective(Objective::Duration),
            Dp::default(),
        ),
    ] {
        let once = dp.schedule(&pb, &tiny).expect("a plan");
        let again = dp.schedule(&pb, &tiny).expect("a plan");
        assert_eq!(once.plan, again.plan);
        assert_eq!(once.evaluation.cost, again.evaluation.cost);
        assert_eq!(once.optimality, again.optimality);
        assert_eq!(once.lower_bound, again.lower_bound);
        assert!(pb.evaluate(&once.plan).is_ok(), "the plan keeps every cap");
        let Optimality::NotGuaranteed(why) = &once.optimality else {
            panic!("stopped by a work limit of 1, yet {:?}", once.optimality);
        };
        assert!(why.contains("work limit ran out"), "{why}");
        assert!(why.contains("of a lower bound"), "{why}");
        let gap = common::stated_gap(why);
        let lb = once.lower_bound.expect("a bound with the gap");
        assert!(
            (100.0 * (once.evaluation.cost / lb - 1.0) - gap).abs() <= 0.005,
            "{gap} % is not the gap to {lb}"
        );
        let full = Dp::default().schedule(&pb, &unlimited).expect("a plan");
        assert_eq!(full.optimality, Optimality::Proven);
        assert!(lb <= full.evaluation.cost * (1.0 + 1e-9), "{lb} > optimum");
        assert!(once.evaluation.cost >= full.evaluation.cost * (1.0 - 1e-9));
    }
}

/// A stop request (what SIGINT sets in the CLI) ends the search with its best plan so
/// far and the bound proved; before any plan, with an error that says so.
#[test]
fn a_stop_request_returns_the_best_plan_so_far_with_its_bound() {
    use coconet_hetero::schedulers::StopFlag;
    use coconet_hetero::{Objective, PlanError};
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    let pb = chain::problem(60, &[None, None, None, None]).with_objective(Objective::Duration);
    let stop = StopFlag::default();
    // Asked to stop as soon as the first plan is found.
    let asked = stop.clone();
    let config = SearchConfig {
        work_limit: None,
        time_limit: None,
        stop: Some(stop.clone()),
        found: Some(Arc::new(move |_| asked.store(2, Ordering::Relaxed))),
        ..SearchConfig::default()
    };
    let out = Dp::default()
        .schedule(&pb, &config)
        .expect("the first plan");
    assert!(pb.evaluate(&out.plan).is_ok());
    let Optimality::NotGuaranteed(why) = &out.optimality else {
        panic!("stopped, yet {:?}", out.optimality);
    };
    assert!(
        why.contains("interrupted (SIGINT) after 1 throughput steps"),
        "{why}"
    );
    let lb = out.lower_bound.expect("a bound");
    assert!(lb > 0.0 && lb < out.evaluation.cost, "{lb}");
    // Asked before it starts: no plan, and an error that says why.
    let before = SearchConfig {
        found: None,
        ..config
    };
    match Dp::default().schedule(&pb, &before) {
        Err(PlanError::Undecided { reason, .. }) => {
            assert!(
                reason.contains("interrupted (SIGINT) before a plan"),
                "{reason}"
            )
        }
        other => panic!("{:?}", other.map(|o| o.optimality)),
    }
    // Under caps and the required rate too.
    let capped = chain::problem(400, &[None, Some(24), Some(24), None]);
    assert!(matches!(
        Dp::default().schedule(&capped, &before),
        Err(PlanError::Undecided { .. })
    ));
}
