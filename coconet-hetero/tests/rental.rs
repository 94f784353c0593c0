//! Rental granularity (issue 18, item 5): types rented by whole instances, idle units
//! paid, caps on the rented units; the DP exact with it, and the switch off giving the
//! per-unit costs to the bit.

mod common;

use coconet_hetero::catalog::GIB;
use coconet_hetero::schedulers::{Dp, Exhaustive, Optimality, Outcome, Scheduler, SearchConfig};
use coconet_hetero::{
    Catalog, Constraint, DeviceClass, Infeasible, Model, Objective, Problem, Rental, ResourceType,
    SchedulingPlan, Stage,
};
use common::{arb_problem, arb_ps_problem, close, dp_against_exhaustive, fc_layers, naive_cost};
use proptest::prelude::*;

/// A chain of layers with batch 1 and no transfers or synchronisation, fed at 1
/// sample/s for an hour: a stage of type `t` over layers `i..=j` needs
/// `⌈Σ times[l][t]⌉` units, and a plan costs its rented units' price per hour.
/// `types`: (name, $/h, cap, units per instance).
fn chain(times: &[&[f64]], types: &[(&str, f64, Option<u64>, u64)]) -> Problem {
    let types: Vec<ResourceType> = types
        .iter()
        .map(|&(name, price, cap, per)| ResourceType {
            name: name.into(),
            class: DeviceClass::Gpu,
            price_per_hour: price,
            memory_bytes: 80.0 * GIB,
            peak_flops: 1e12,
            mem_bandwidth: 1e11,
            efficiency: 1.0,
            layer_overhead: 0.0,
            sync_bandwidth: 1e12,
            cap,
            units_per_instance: per,
            data_bandwidth: None,
        })
        .collect();
    let n = types.len();
    let layers = fc_layers(times.iter().copied());
    let model = Model {
        name: "chain".into(),
        batch_size: 1.0,
        batch_sizes: Vec::new(),
        input_bytes: 0.0,
        layers,
        constraint: None,
    };
    let catalog = Catalog {
        types,
        bandwidth: vec![vec![1e12; n]; n],
        hosts: Vec::new(),
        parameter_server: None,
        billing_minimum: 0.0,
        link_latency: 0.0,
    };
    Problem::new(model, catalog, Constraint::new(1.0, 3600.0).unwrap())
        .with_objective(Objective::RequiredRate)
}

/// One stage per layer, all on type `ty`.
fn stage_per_layer(layers: usize, ty: usize) -> SchedulingPlan {
    SchedulingPlan {
        stages: (0..layers)
            .map(|l| Stage {
                first: l,
                last: l,
                ty,
            })
            .collect(),
    }
}

const A100: (&str, f64, Option<u64>, u64) = ("a100", 4.096, None, 8);

/// Two A100 stages of 3 and 2 units share one instance of 8 (3 idle); a third of 4
/// needs a second instance (7 idle). Per unit the same plans cost 5 and 9 units.
#[test]
fn stages_of_a_type_share_whole_instances() {
    let two = chain(&[&[3.0], &[2.0]], &[A100]);
    let e = two.evaluate(&stage_per_layer(2, 0)).unwrap();
    let units: Vec<u64> = e.stages.iter().map(|s| s.units).collect();
    assert_eq!(units, vec![3, 2]);
    assert_eq!(e.rented.len(), 1);
    let r = &e.rented[0];
    assert_eq!(
        (r.used, r.per_instance, r.instances, r.units, r.idle),
        (5, 8, 1, 8, 3)
    );
    assert!(close(e.price_per_hour, 8.0 * 4.096), "{}", e.price_per_hour);
    assert!(close(e.cost, 8.0 * 4.096), "{}", e.cost);
    // The report shows the instance and its idle units.
    let out = Outcome {
        scheduler: "hand".into(),
        plan: stage_per_layer(2, 0),
        evaluation: e,
        evaluations: 1,
        optimality: Optimality::Heuristic,
        lower_bound: None,
    };
    let text = coconet_hetero::report::plan_report(&two, &out);
    assert!(
        text.contains("rented (whole instances, idle units paid):")
            && text.contains("5 units used, 1 instance of 8 = 8 units (3 idle), $32.77/hour"),
        "{text}"
    );
    let per_unit = two.clone().with_rental(Rental::Units);
    let u = per_unit.evaluate(&stage_per_layer(2, 0)).unwrap();
    assert!(close(u.cost, 5.0 * 4.096), "{}", u.cost);
    assert_eq!((u.rented[0].instances, u.rented[0].idle), (5, 0));

    let three = chain(&[&[3.0], &[2.0], &[4.0]], &[A100]);
    let e = three.evaluate(&stage_per_layer(3, 0)).unwrap();
    let r = &e.rented[0];
    assert_eq!((r.used, r.instances, r.units, r.idle), (9, 2, 16, 7));
    assert!(close(e.cost, 16.0 * 4.096), "{}", e.cost);
    // The DP finds the same: one stage of 9 units rents the same two instances.
    let d = Dp::default()
        .schedule(&three, &SearchConfig::default())
        .unwrap();
    assert!(close(d.evaluation.cost, 16.0 * 4.096));
    assert_eq!(d.optimality, Optimality::Proven);
}

/// A small job: one A100 is the cheapest per unit ($4.096 against nine T4s' $4.734),
/// but an A100 comes in eights ($32.77): whole instances make the T4s the optimum.
#[test]
fn whole_instances_change_the_optimal_plan() {
    let pb = chain(&[&[1.0, 9.0]], &[A100, ("t4", 0.526, None, 1)]);
    let cfg = SearchConfig::default();
    for (rental, ty, units, cost) in [
        (Rental::Units, 0, 1, 4.096),
        (Rental::Instances, 1, 9, 9.0 * 0.526),
    ] {
        let pb = pb.clone().with_rental(rental);
        let d = Dp::default().schedule(&pb, &cfg).unwrap();
        let e = Exhaustive::default().schedule(&pb, &cfg).unwrap();
        assert_eq!(d.optimality, Optimality::Proven);
        assert_eq!(
            (
                d.evaluation.stages[0].stage.ty,
                d.evaluation.stages[0].units
            ),
            (ty, units),
            "{rental:?}"
        );
        assert!(close(d.evaluation.cost, cost), "{}", d.evaluation.cost);
        assert!(close(e.evaluation.cost, cost), "{}", e.evaluation.cost);
    }
}

/// A cap counts rented units: 9 A100s need 16 rented, over a cap of 12 (whose usable
/// part is one instance of 8), though 9 ≤ 12 per unit.
#[test]
fn caps_count_rented_units() {
    let pb = chain(
        &[&[3.0, 7.0], &[2.0, 6.0], &[4.0, 9.0]],
        &[("a100", 4.096, Some(12), 8), ("t4", 5.0, None, 1)],
    );
    let plan = stage_per_layer(3, 0);
    match pb.evaluate(&plan) {
        Err(Infeasible::Cap { need, cap, .. }) => assert_eq!((need, cap), (9, 8)),
        other => panic!("expected the cap broken, got {other:?}"),
    }
    assert_eq!(pb.limits()[0].cap, 8);
    assert!(pb.limits()[0].name.contains("whole instances of 8"));
    let per_unit = pb.clone().with_rental(Rental::Units);
    assert!(per_unit.evaluate(&plan).is_ok());
    assert_eq!(per_unit.limits()[0].cap, 12);
    // The DP keeps the cap: at most one instance of A100s, the rest on T4s. Cheapest:
    // layers 0 and 2 (3 + 4 units) on the instance, layer 1 on 6 T4s.
    let cfg = SearchConfig::default();
    let d = Dp::default().schedule(&pb, &cfg).unwrap();
    let e = Exhaustive::default().schedule(&pb, &cfg).unwrap();
    assert_eq!(d.optimality, Optimality::Proven);
    let want = 8.0 * 4.096 + 6.0 * 5.0;
    assert!(close(d.evaluation.cost, want), "{}", d.evaluation.cost);
    assert!(close(e.evaluation.cost, want), "{}", e.evaluation.cost);
    assert!(d.evaluation.rented.iter().all(|r| r.units <= 12));
}

/// `units_per_instance` drawn from 1..=4 for each type of a random instance.
fn with_sizes(pb: Problem, sizes: &[u64]) -> Problem {
    let mut catalog = pb.catalog.clone();
    for (t, ty) in catalog.types.iter_mut().enumerate() {
        ty.units_per_instance = sizes[t % sizes.len()];
    }
    let mut out = Problem::new(pb.model.clone(), catalog, pb.constraint);
    out.sync = pb.sync.clone();
    out
}

/// The DP equals exhaustive search on `pb`, in the table and in the label search
/// (4096 and 1 table states), and its cost is the naive re-count's.
fn matches_exhaustive(pb: &Problem, split: bool) -> Result<(), TestCaseError> {
    for states in [4096, 1] {
        if let Some(d) = dp_against_exhaustive(pb, split, states)? {
            let (naive, _) = naive_cost(pb, &d.plan).expect("dp plan must be feasible");
            prop_assert!(
                close(naive, d.evaluation.cost),
                "{} vs {}",
                naive,
                d.evaluation.cost
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// With whole instances the DP (table and label search alike) equals exhaustive
    /// search, caps included, and its cost is the naive re-count's.
    #[test]
    fn dp_equals_exhaustive_with_whole_instances(
        pb in arb_problem(5, 3),
        sizes in prop::collection::vec(1u64..=4, 3),
        split in any::<bool>(),
    ) {
        matches_exhaustive(&with_sizes(pb, &sizes), split)?;
    }

    /// The parameter server's shards share their type's instances with the stages.
    #[test]
    fn dp_equals_exhaustive_with_shards_in_whole_instances(
        pb in arb_ps_problem(4, 3),
        sizes in prop::collection::vec(1u64..=4, 3),
    ) {
        matches_exhaustive(&with_sizes(pb, &sizes), true)?;
    }

    /// `Rental::Units` on a catalogue with instance sizes prices every plan exactly as
    /// the catalogue without them does, and the DP returns the same plan and cost.
    #[test]
    fn per_unit_rental_reproduces_per_unit_costs(
        pb in arb_problem(5, 3),
        sizes in prop::collection::vec(1u64..=8, 3),
    ) {
        let sized = with_sizes(pb.clone(), &sizes).with_rental(Rental::Units);
        let cfg = SearchConfig::default();
        for t in 0..pb.num_types() {
            let plan = SchedulingPlan::from_assignment(&vec![t; pb.num_layers()]);
            let (a, b) = (pb.evaluate(&plan), sized.evaluate(&plan));
            match (a, b) {
                (Ok(a), Ok(b)) => {
                    prop_assert_eq!(a.cost.to_bits(), b.cost.to_bits());
                    prop_assert_eq!(a.price_per_hour.to_bits(), b.price_per_hour.to_bits());
                }
                (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                (a, b) => prop_assert!(false, "{:?} vs {:?}", a, b),
            }
        }
        match (Dp::default().schedule(&pb, &cfg), Dp::default().schedule(&sized, &cfg)) {
            (Ok(a), Ok(b)) => {
                prop_assert_eq!(a.plan, b.plan);
                prop_assert_eq!(a.evaluation.cost.to_bits(), b.evaluation.cost.to_bits());
            }
            (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
            (a, b) => prop_assert!(false, "{:?} vs {:?}", a.map(|o| o.plan), b.map(|o| o.plan)),
        }
    }
}

/// The shipped catalogue rents A100 and H100 by p4d/p5 instances of 8, the rest singly.
#[test]
fn shipped_catalogue_rents_a100_and_h100_by_eights() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/catalog.toml");
    let c = Catalog::load(path).unwrap();
    let sizes: Vec<(&str, u64)> = c
        .types
        .iter()
        .map(|t| (t.name.as_str(), t.units_per_instance))
        .collect();
    assert_eq!(
        sizes,
        vec![
            ("cpu-c6i", 1),
            ("t4", 1),
            ("v100", 1),
            ("a100", 8),
            ("h100", 8)
        ]
    );
}
