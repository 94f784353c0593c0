//! `SearchConfig::cuts`: with `Cuts::Best` the search heuristics price each type
//! assignment at its cheapest cuts into stages (the exact DP restricted to the
//! assignment), so they search the DP's plan space: never worse than the runs merged,
//! feasible and priced by the one cost model, and the DP's optimum is one assignment's.

mod common;

use coconet_hetero::schedulers::{
    Bayesian, CpuFirst, Cuts, Dp, Evaluator, Genetic, Greedy, Optimality, RandomSearch, Scheduler,
    SearchConfig, Units,
};
use coconet_hetero::{Constraint, Objective, Problem};
use common::{arb_problem, close};
use proptest::prelude::*;

fn config(units: Units, cuts: Cuts) -> SearchConfig {
    SearchConfig {
        seed: 5,
        budget: 60,
        units,
        cuts,
        ..SearchConfig::default()
    }
}

/// The heuristics that assign a type per layer (the ones `cuts` applies to).
fn heuristics() -> Vec<Box<dyn Scheduler>> {
    vec![
        Box::new(Greedy),
        Box::new(Genetic::default()),
        Box::new(Bayesian::default()),
        Box::new(RandomSearch),
        Box::new(CpuFirst),
    ]
}

/// Small capped instances under either objective, whole instances and billing minimums
/// included.
fn arb_capped() -> impl Strategy<Value = Problem> {
    (
        arb_problem(4, 3),
        prop::collection::vec(prop_oneof![Just(None), (1u64..=6).prop_map(Some)], 3),
        prop::collection::vec(1u64..=2, 3),
        10.0f64..3000.0,
        prop_oneof![Just(0.0), 1e5f64..1e8],
        any::<bool>(),
    )
        .prop_map(|(pb, caps, sizes, x, minimum, duration)| {
            let objective = if duration {
                Objective::Duration
            } else {
                Objective::RequiredRate
            };
            let mut pb = pb
                .with_constraint(Constraint::new(x, 1e9).unwrap())
                .with_objective(objective);
            for ((t, cap), size) in pb.catalog.types.iter_mut().zip(caps).zip(sizes) {
                t.cap = cap;
                t.units_per_instance = size;
            }
            pb.catalog.billing_minimum = minimum;
            pb
        })
}

/// Every assignment of `l_n` layers to `t_n` types.
fn assignments(l_n: usize, t_n: usize) -> Vec<Vec<usize>> {
    (0..t_n.pow(l_n as u32))
        .map(|mut code| {
            (0..l_n)
                .map(|_| {
                    let t = code % t_n;
                    code /= t_n;
                    t
                })
                .collect()
        })
        .collect()
}

/// The plan's cost as the cost model prices it at the throughput its units reach (the
/// fewest units for that throughput are the units rented).
fn recosted(pb: &Problem, out: &coconet_hetero::schedulers::Outcome) -> f64 {
    let ev = &out.evaluation;
    let x = match pb.objective {
        Objective::Duration => ev.throughput * (1.0 - 1e-12),
        Objective::RequiredRate => pb.constraint.throughput,
    };
    pb.with_constraint(Constraint::new(x, pb.constraint.samples).unwrap())
        .evaluate(&out.plan)
        .expect("the plan is feasible")
        .cost
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 60, ..ProptestConfig::default() })]

    /// (a) For every assignment, its best cuts cost no more than its runs merged, at
    /// the fewest units or at the cheapest; (and the DP's optimum is the least of
    /// them over all assignments: the union of the restricted spaces is the DP's).
    #[test]
    fn cutting_an_assignment_never_costs_more_and_covers_the_dps_space(pb in arb_capped()) {
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        // Budget for every assignment.
        let every = |units, cuts| SearchConfig { budget: usize::MAX, ..config(units, cuts) };
        let mut cut = Evaluator::new(&pb, &every(Units::Min, Cuts::Best));
        let mut min = Evaluator::new(&pb, &every(Units::Min, Cuts::Runs));
        let mut best = Evaluator::new(&pb, &every(Units::Best, Cuts::Runs));
        let mut least = f64::INFINITY;
        for a in assignments(l_n, t_n) {
            let c = cut.cost(&a).unwrap();
            let runs = best.cost(&a).unwrap().min(min.cost(&a).unwrap());
            prop_assert!(c <= runs * (1.0 + 1e-12), "{:?}: cut {} > runs {}", a, c, runs);
            least = least.min(c);
        }
        match Dp::default().schedule(&pb, &SearchConfig::default()) {
            // The DP may stop short of a proof (2,000 throughput steps under the
            // duration objective); then it only bounds the least from above.
            Ok(dp) if dp.optimality != Optimality::Proven => {
                prop_assert!(least <= dp.evaluation.cost * (1.0 + 1e-9),
                    "dp {} vs best cuts of every assignment {}", dp.evaluation.cost, least);
            }
            Ok(dp) => {
                prop_assert!(close(dp.evaluation.cost, least),
                    "dp {} vs best cuts of every assignment {}", dp.evaluation.cost, least);
            }
            Err(_) => prop_assert!(least.is_infinite(), "dp none, cuts {}", least),
        }
    }

    /// (b) Every heuristic's plan with `Cuts::Best` is feasible, priced by the same cost
    /// model (again from scratch at the units it rents) and no cheaper than the DP's
    /// proven optimum (or the lower bound it proved).
    #[test]
    fn every_heuristics_cut_plan_is_feasible_and_costed_alike(pb in arb_capped()) {
        let dp = Dp::default().schedule(&pb, &SearchConfig::default());
        for s in heuristics() {
            let name = s.name().to_string();
            let out = s.schedule(&pb, &config(Units::Min, Cuts::Best));
            match (&dp, out) {
                (Ok(dp), Ok(out)) => {
                    prop_assert!(out.plan.is_well_formed(pb.num_layers(), pb.num_types()));
                    let c = out.evaluation.cost;
                    prop_assert!(close(recosted(&pb, &out), c),
                        "{}: {} recosted {}", name, c, recosted(&pb, &out));
                    // The optimum where proven, else the bound the DP proved.
                    let bound = dp.lower_bound.unwrap_or(0.0);
                    prop_assert!(c >= bound * (1.0 - 1e-9),
                        "{}: {} below the DP's bound {}", name, c, bound);
                }
                (Err(_), Err(_)) => {}
                // A heuristic may miss every feasible assignment within its budget.
                (Ok(_), Err(_)) => {}
                (Err(_), Ok(out)) => prop_assert!(false, "{}: a plan at {} where dp has none",
                    name, out.evaluation.cost),
            }
        }
    }
}

/// (c) bert-large at 400 samples/s: the DP's optimum cuts long runs of one type into
/// several stages, which the runs merged cannot express; given the optimum's assignment,
/// the heuristics' evaluator with `Cuts::Best` finds the DP's cost, and greedy, started
/// from the homogeneous plans, reaches it.
#[test]
fn the_dps_optimum_is_its_assignment_at_its_best_cuts() {
    let data = |name: &str| format!("{}/data/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let pb = coconet_hetero::load(data("bert-large"), data("catalog"), None).unwrap();
    let pb = pb
        .with_constraint(Constraint::new(400.0, pb.constraint.samples).unwrap())
        .with_objective(Objective::Duration);
    let dp = Dp::default()
        .schedule(&pb, &SearchConfig::default())
        .unwrap();
    assert_eq!(dp.optimality, Optimality::Proven);
    let types = dp.plan.assignment();
    let merged = coconet_hetero::SchedulingPlan::from_assignment(&types);
    assert!(
        dp.plan.stages.len() > merged.stages.len(),
        "the optimum cuts a run: {:?}",
        dp.plan
    );
    let cost = |units, cuts| {
        Evaluator::new(&pb, &config(units, cuts))
            .cost(&types)
            .unwrap()
    };
    let cut = cost(Units::Min, Cuts::Best);
    assert!(
        close(cut, dp.evaluation.cost),
        "{cut} vs dp {}",
        dp.evaluation.cost
    );
    let runs = cost(Units::Best, Cuts::Runs);
    assert!(
        runs > dp.evaluation.cost * (1.0 + 1e-6),
        "runs merged {runs}"
    );
    let greedy = Greedy
        .schedule(&pb, &config(Units::Min, Cuts::Best))
        .unwrap();
    assert!(
        close(greedy.evaluation.cost, dp.evaluation.cost),
        "greedy {} vs dp {}",
        greedy.evaluation.cost,
        dp.evaluation.cost
    );
}
