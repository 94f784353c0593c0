//! Per-type batch sizes in the cost model: a type's replicas step with their own batch,
//! its layers keep their fixed overhead and scale the rest, its activations and
//! transfers scale, and it synchronises once per batch of its own.

mod common;

use coconet_hetero::schedulers::{Dp, Scheduler, SearchConfig};
use coconet_hetero::{Catalog, Constraint, Infeasible, Model, Problem, SchedulingPlan, SyncModel};
use common::{arb_batched_problem, arb_problem, close, dp_against_exhaustive, naive_cost};
use proptest::prelude::*;
use std::path::Path;

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// With per-type batches and overheads (and a parameter server in some), the DP
    /// equals exhaustive search, with the table and with the label search, and its plan
    /// costs what the naive model (written from the formulas, loops, units counted up)
    /// says.
    #[test]
    fn dp_equals_exhaustive_with_per_type_batches(
        pb in arb_batched_problem(4, 3),
        split in any::<bool>(),
        labels in any::<bool>(),
    ) {
        let states = if labels { 1 } else { 4096 };
        if let Some(d) = dp_against_exhaustive(&pb, split, states)? {
            let (naive, units) = naive_cost(&pb, &d.plan).expect("the dp's plan keeps every cap");
            prop_assert!(close(naive, d.evaluation.cost), "naive {} vs dp {}", naive, d.evaluation.cost);
            let dp_units: Vec<u64> = d.evaluation.stages.iter().map(|s| s.units).collect();
            prop_assert_eq!(units, dp_units);
        }
    }

    /// On shared hosts (units slowing each other down), with per-type batches and
    /// batches in flight, the DP still equals exhaustive search.
    #[test]
    fn dp_equals_exhaustive_on_shared_hosts_with_per_type_batches(
        pb in common::arb_hosted_problem(3, 3),
        ratios in prop::collection::vec(prop_oneof![Just(1.0), 0.25f64..4.0], 3),
        in_flight in 1u32..3,
        split in any::<bool>(),
    ) {
        let batches = ratios[..pb.num_types()]
            .iter()
            .map(|r| r * pb.model.batch_size)
            .collect();
        let pb = pb.with_batch_sizes(batches).expect("positive").with_in_flight(in_flight);
        dp_against_exhaustive(&pb, split, 4096)?;
    }

    /// Every type at the model's own batch, one batch in flight, is the problem without
    /// per-type settings, to the bit, on every single-type and two-stage plan.
    #[test]
    fn the_model_batch_everywhere_changes_nothing(pb in arb_problem(4, 3)) {
        let uniform = pb
            .with_batch_sizes(vec![pb.model.batch_size; pb.num_types()])
            .expect("positive")
            .with_in_flight(1);
        prop_assert!(!uniform.has_per_type_batches());
        let (l_n, t_n) = (pb.num_layers(), pb.num_types());
        let mut plans: Vec<Vec<usize>> = (0..t_n).map(|t| vec![t; l_n]).collect();
        for t in 0..t_n {
            let mut two = vec![t; l_n];
            two[l_n - 1] = (t + 1) % t_n;
            plans.push(two);
        }
        for types in plans {
            let plan = SchedulingPlan::from_assignment(&types);
            match (uniform.evaluate(&plan), pb.evaluate(&plan)) {
                (Ok(a), Ok(b)) => {
                    prop_assert_eq!(a.cost.to_bits(), b.cost.to_bits());
                    prop_assert_eq!(a.stages, b.stages);
                }
                (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                (a, b) => prop_assert!(false, "{:?} against {:?}", a.map(|e| e.cost), b.map(|e| e.cost)),
            }
        }
    }
}

const CATALOG: &str = r#"
default_bandwidth_gbs = 1.0
[[types]]
name = "cpu"
class = "cpu"
price_per_hour = 1.0
memory_gib = 64.0
peak_tflops = 1.0
mem_bandwidth_gbs = 100.0
sync_bandwidth_gbs = 1.0
layer_overhead_us = 0
[[types]]
name = "gpu"
class = "gpu"
price_per_hour = 3.0
memory_gib = 16.0
peak_tflops = 100.0
mem_bandwidth_gbs = 1000.0
sync_bandwidth_gbs = 1.0
layer_overhead_us = 8000
"#;

/// One FC layer, batch 100: 0.1 s per batch on the CPU, 0.01 s on the GPU (8 ms of it
/// the GPU's fixed overhead); 1 GiB of activations, 4 GiB per replica.
const MODEL: &str = r#"
name = "one-layer"
batch_size = 100
[[layers]]
name = "fc"
kind = "fc"
activation_bytes = 1073741824
memory_bytes = 4294967296
[layers.time]
cpu = 0.1
gpu = 0.01
"#;

fn problem(extra: &str) -> Problem {
    let catalog = Catalog::parse(Path::new("catalog.toml"), CATALOG).unwrap();
    let model = Model::parse(
        Path::new("model.toml"),
        &MODEL.replacen("[[layers]]", &format!("{extra}\n[[layers]]"), 1),
        &catalog,
    )
    .unwrap();
    // 10^5 samples/s for an hour.
    Problem::new(model, catalog, Constraint::new(1e5, 3.6e8).unwrap())
}

#[test]
fn a_larger_gpu_batch_spreads_the_fixed_overhead() {
    let cfg = SearchConfig::default();
    // At batch 100 a GPU does 100 / 0.01 = 10^4 samples/s: 10 GPUs, $30/h (a CPU does
    // 10^3: 100 CPUs, $100/h). For an hour: $30.
    let base = problem("");
    let out = Dp::default().schedule(&base, &cfg).unwrap();
    assert_eq!(out.plan, SchedulingPlan::from_assignment(&[1]));
    assert_eq!(out.evaluation.stages[0].units, 10);
    assert!(close(out.evaluation.cost, 30.0), "{}", out.evaluation.cost);

    // At batch 400 (4×): 8 ms + 4 · 2 ms = 16 ms per batch, 25,000 samples/s per GPU:
    // 4 GPUs, $12/h. Memory: 4 GiB − 2 GiB of activations + 4 · 2 GiB = 10 GiB.
    let at_400 = problem("[batch_sizes]\ngpu = 400");
    assert!(at_400.has_per_type_batches());
    assert_eq!(at_400.batch_size(1), 400.0);
    assert_eq!(at_400.batch_size(0), 100.0);
    let out = Dp::default().schedule(&at_400, &cfg).unwrap();
    let st = &out.evaluation.stages[0];
    assert_eq!((st.stage.ty, st.units), (1, 4));
    assert!(close(st.time_per_batch, 0.016), "{}", st.time_per_batch);
    assert!(close(st.memory, 10.0 * 1073741824.0), "{}", st.memory);
    assert!(close(out.evaluation.cost, 12.0), "{}", out.evaluation.cost);

    // At batch 800 (8×) a replica needs 4 − 2 + 16 = 18 GiB: it no longer fits a 16 GiB
    // GPU, and the evaluation says so; the planner falls back to the CPUs ($100).
    let at_800 = base.with_batch_sizes(vec![100.0, 800.0]).unwrap();
    match at_800.evaluate(&SchedulingPlan::from_assignment(&[1])) {
        Err(Infeasible::Memory { need, have, .. }) => {
            assert!(close(need, 18.0 * 1073741824.0) && have == 16.0 * 1073741824.0);
        }
        other => panic!("expected a memory error, got {other:?}"),
    }
    let out = Dp::default().schedule(&at_800, &cfg).unwrap();
    assert_eq!(out.plan, SchedulingPlan::from_assignment(&[0]));
    assert!(close(out.evaluation.cost, 100.0), "{}", out.evaluation.cost);
}

#[test]
fn batches_in_flight_multiply_the_activations_kept() {
    // Batch 400 on the GPU with two batches in flight: 4 − 2 + 2 · 4 · 2 = 18 GiB, past
    // the GPU's 16; with one it is 10 GiB (above). The CPU stage then: 4 − 2 + 2 · 2 = 6.
    let pb = problem("[batch_sizes]\ngpu = 400").with_in_flight(2);
    assert_eq!(pb.in_flight(), 2);
    assert!(matches!(
        pb.evaluate(&SchedulingPlan::from_assignment(&[1])),
        Err(Infeasible::Memory { need, .. }) if close(need, 18.0 * 1073741824.0)
    ));
    let ev = pb.evaluate(&SchedulingPlan::from_assignment(&[0])).unwrap();
    assert!(close(ev.stages[0].memory, 6.0 * 1073741824.0));
    // 0 is taken as 1: a batch is always in flight.
    assert_eq!(pb.with_in_flight(0).in_flight(), 1);
}

#[test]
fn a_larger_batch_synchronises_less_often_per_sample() {
    // The GPU layer with 1 GB of dense parameters over a 1 GB/s ring and no activations
    // to scale: with k replicas a step takes C + 2(k−1)/k s.
    let dense = MODEL
        .replace("activation_bytes = 1073741824", "activation_bytes = 0")
        .replace(
            "memory_bytes = 4294967296",
            "memory_bytes = 4294967296\ndense_param_bytes = 1e9",
        );
    let catalog = Catalog::parse(Path::new("catalog.toml"), CATALOG).unwrap();
    let model = Model::parse(Path::new("model.toml"), &dense, &catalog).unwrap();
    let pb = Problem::new(model, catalog, Constraint::new(1e5, 3.6e8).unwrap());
    let gpu = SchedulingPlan::from_assignment(&[1]);
    // At batch 100 (C = 0.01 s) every replica adds nearly 2 s per 100 samples:
    // 100·k ≥ 10^5 · (2.01 − 2/k) first holds at k = 2010 (k = 2009 gives 99,999.8).
    let ev = pb.evaluate(&gpu).unwrap();
    assert_eq!(ev.stages[0].units, 2010);
    // At batch 10^5 (1000×: C = 8 ms + 1000 · 2 ms = 2.008 s) the ring runs once per
    // 10^5 samples: k = 4 gives 4·10^5 / (2.008 + 1.5) = 114,025 samples/s, k = 3 gives
    // 3·10^5 / 3.341 = 89,784.
    let big = pb.with_batch_sizes(vec![100.0, 1e5]).unwrap();
    let ev = big.evaluate(&gpu).unwrap();
    assert_eq!(ev.stages[0].units, 4);
    assert!(
        close(ev.stages[0].time_per_batch, 2.008 + 1.5),
        "{}",
        ev.stages[0].time_per_batch
    );
}

#[test]
fn bad_batches_are_refused_with_the_type_named() {
    let pb = problem("");
    let e = pb
        .with_batch_sizes(vec![100.0, 0.0])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("batch size on gpu must be > 0 and at most 2^32"),
        "{e}"
    );
    let e = pb
        .with_batch_sizes(vec![100.0, u64::MAX as f64])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("batch size on gpu must be > 0 and at most 2^32"),
        "{e}"
    );
    let e = pb.with_batch_sizes(vec![100.0]).unwrap_err().to_string();
    assert!(e.contains("1 batch sizes for 2 resource types"), "{e}");
    // The asynchronous mode prices the dense traffic at the model's batch only.
    let mut catalog = pb.catalog.clone();
    catalog.parameter_server = Some(coconet_hetero::ParameterServer {
        ty: 0,
        bandwidth: 1e9,
    });
    let asynchronous = Problem::new(pb.model.clone(), catalog, pb.constraint)
        .with_sync(SyncModel::AsyncServer)
        .with_batch_sizes(vec![100.0, 400.0])
        .unwrap();
    let e = asynchronous
        .evaluate(&SchedulingPlan::from_assignment(&[1]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not support per-type batch sizes"), "{e}");
}
