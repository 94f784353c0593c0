//! The parameter server's shards in the cost model: provisioned for the tables and the
//! rows' traffic, priced, drawing on their type's limits, bounding the throughput.

mod common;

use coconet_hetero::schedulers::{Dp, Scheduler, SearchConfig};
use coconet_hetero::{Catalog, Infeasible, Model, Problem, SchedulingPlan};
use common::{arb_ps_problem, close, dp_against_exhaustive, naive_cost};
use proptest::prelude::*;
use std::path::Path;

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// With a parameter server (its shards sharing type 0's cap), the DP equals
    /// exhaustive search — with the table and with the label search, the replicas
    /// synchronised by the ring or asynchronously through the server.
    #[test]
    fn dp_equals_exhaustive_with_a_parameter_server(
        pb in arb_ps_problem(4, 3),
        split in any::<bool>(),
        labels in any::<bool>(),
        asynchronous in any::<bool>(),
    ) {
        let states = if labels { 1 } else { 4096 };
        let pb = if asynchronous { pb.with_sync(coconet_hetero::SyncModel::AsyncServer) } else { pb };
        if let Some(d) = dp_against_exhaustive(&pb, split, states)? {
            // Independently: shards counted up one by one, stages too.
            let (naive, _) = naive_cost(&pb, &d.plan).expect("the dp's plan keeps every cap");
            prop_assert!(close(naive, d.evaluation.cost), "naive {} vs dp {}", naive, d.evaluation.cost);
            let ps = d.evaluation.parameter_servers.as_ref().expect("the table needs shards");
            prop_assert!(ps.shards >= 1 && ps.throughput >= pb.constraint.throughput * (1.0 - 1e-12));
        }
    }
}

const CATALOG: &str = r#"
default_bandwidth_gbs = 100.0
[[types]]
name = "cpu"
class = "cpu"
price_per_hour = 1.0
memory_gib = 64.0
peak_tflops = 1.0
mem_bandwidth_gbs = 100.0
sync_bandwidth_gbs = 1.0
cap = 10
[[types]]
name = "gpu"
class = "gpu"
price_per_hour = 3.0
memory_gib = 16.0
peak_tflops = 100.0
mem_bandwidth_gbs = 1000.0
sync_bandwidth_gbs = 10.0
[parameter_server]
type = "cpu"
bandwidth_gbs = 2.0
"#;

/// An embedding of 200 GiB pulling and pushing 4 MB per batch of 100, then one layer;
/// both layers take 0.1 s a batch on the CPU, 0.05 s on the GPU.
fn problem(x: f64) -> Problem {
    problem_with_dense(x, 0.0)
}

/// [`problem`] with `dense` bytes of dense parameters on the second layer.
fn problem_with_dense(x: f64, dense: f64) -> Problem {
    let catalog = Catalog::parse(Path::new("catalog.toml"), CATALOG).unwrap();
    let model = format!(
        "name = \"m\"\nbatch_size = 100\n[constraint]\nthroughput = {x}\nsamples = 3.6e6\n\
         [[layers]]\nname = \"emb\"\nkind = \"embedding\"\nactivation_bytes = 1e6\n\
         sparse_param_bytes = 214748364800\nsparse_traffic_bytes = 4e6\nmemory_bytes = 1\n\
         [layers.time]\ncpu = 0.1\ngpu = 0.05\n\
         [[layers]]\nname = \"fc\"\nkind = \"fc\"\nactivation_bytes = 0\nmemory_bytes = 1\n\
         dense_param_bytes = {dense}\n\
         [layers.time]\ncpu = 0.1\ngpu = 0.05\n"
    );
    let model = Model::parse(Path::new("model.toml"), &model, &catalog).unwrap();
    let c = model.constraint.unwrap();
    Problem::new(model, catalog, c)
}

/// Shards: max(⌈200 GiB / 64 GiB⌉ = 4, ⌈X · 40 kB / 2 GB/s⌉); priced, counted against
/// the CPU's cap of 10, and the throughput's bound when they are the slowest.
#[test]
fn shards_hold_the_tables_serve_the_rows_and_share_the_cap() {
    let cfg = SearchConfig::default();
    // 1,000 samples/s: 40 MB/s of rows, one shard would do; the tables need 4.
    let pb = problem(1000.0);
    let ps = pb.parameter_servers().unwrap().unwrap();
    assert_eq!((ps.ty, ps.shards), (0, 4));
    assert!(close(ps.throughput, 4.0 * 2e9 / 4e4));
    assert!(close(ps.price_per_hour, 4.0));
    // All on the CPU: 1000 · 0.2 / 100 = 2 units, 6 with the shards, within the cap.
    let cpu = pb
        .evaluate(&SchedulingPlan::from_assignment(&[0, 0]))
        .unwrap();
    assert_eq!(cpu.stages[0].units, 2);
    assert!(close(cpu.price_per_hour, 2.0 + 4.0));
    // 300,000 samples/s: 12 GB/s of rows, 6 shards; the CPU stage would need 600 units
    // of the 10 - 6 = 4 left, so the DP puts both layers on the GPU (300 units, plus the
    // transfers' share).
    let pb = problem(300_000.0);
    assert_eq!(pb.parameter_servers().unwrap().unwrap().shards, 6);
    assert_eq!(pb.limits()[0].cap, 4);
    let e = pb
        .evaluate(&SchedulingPlan::from_assignment(&[0, 1]))
        .unwrap_err();
    assert!(matches!(e, Infeasible::Cap { cap: 4, .. }), "{e}");
    let out = Dp::default().schedule(&pb, &cfg).unwrap();
    assert_eq!(out.plan, SchedulingPlan::from_assignment(&[1, 1]));
    let gpu_units = out.evaluation.stages[0].units as f64;
    assert!(close(out.evaluation.price_per_hour, gpu_units * 3.0 + 6.0));
    // 600,000 samples/s: 12 shards are more than the CPU's cap of 10.
    let err = Dp::default()
        .schedule(&problem(600_000.0), &cfg)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("parameter server: 12 shards of cpu")
            && err.contains("type cpu, which has 10"),
        "{err}"
    );
}

/// The report names the shards.
#[test]
fn the_report_shows_the_parameter_server() {
    let pb = problem(1000.0);
    let out = Dp::default()
        .schedule(&pb, &SearchConfig::default())
        .unwrap();
    let text = coconet_hetero::report::plan_report(&pb, &out);
    assert!(text.contains("parameter server: 4 shards of cpu"), "{text}");
}

/// The random instances are not vacuous: many feasible, and in some the shards take
/// units of a capped type the stages would have used (the optimum without the server's
/// draw is cheaper than with it, beyond the shards' price).
#[test]
fn random_servers_bind() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = arb_ps_problem(4, 3);
    let (mut feasible, mut binding) = (0, 0);
    for _ in 0..300 {
        let pb = strategy.new_tree(&mut runner).unwrap().current();
        let Ok(o) = Dp::default().schedule(&pb, &SearchConfig::default()) else {
            continue;
        };
        feasible += 1;
        let mut catalog = pb.catalog.clone();
        catalog.parameter_server = None;
        let free = Problem::new(pb.model.clone(), catalog, pb.constraint);
        let shards = o
            .evaluation
            .parameter_servers
            .as_ref()
            .unwrap()
            .price_per_hour;
        if let Ok(f) = Dp::default().schedule(&free, &SearchConfig::default()) {
            binding += usize::from(
                f.evaluation.price_per_hour + shards < o.evaluation.price_per_hour * (1.0 - 1e-9),
            );
        }
    }
    eprintln!("feasible {feasible}, the server's draw binding {binding}");
    assert!(feasible >= 60 && binding >= 5, "{feasible} {binding}");
}

/// [`problem`]'s model with 10 MB of dense parameters on its second layer, at `x`
/// samples/s, synchronised by `sync`.
fn with_dense(x: f64, sync: coconet_hetero::SyncModel) -> Problem {
    problem_with_dense(x, 1e7).with_sync(sync)
}

/// The asynchronous parameter-server mode by hand, one GPU stage over both layers
/// (0.1 s a batch of 100), 3.6·10⁶ samples:
/// * at 10⁴ samples/s the stage needs ⌈10⁴ · 0.1 / 100⌉ = 10 GPUs, no synchronisation;
///   the shards hold 200 GiB + 10 MB (4 of 64 GiB) and serve 10⁴ · (4 MB + 2 · 10 MB)
///   / 100 = 2.4 GB/s (2 of 2 GB/s): 4 shards, $34/h for 0.1 h, $3.40. The ring instead
///   adds 2 · (k − 1)/k · 10 MB / 10 GB/s to each batch: 10 GPUs reach 9,823 samples/s,
///   so 11, and 4 shards for the tables: $37/h, $3.70.
/// * at 4·10⁴ samples/s the dense traffic sets the shards: ⌈9.6 GB/s / 2 GB/s⌉ = 5
///   (the ring's sparse rows alone need 1, the tables 4).
/// * without a parameter server in the catalogue the mode has nowhere to keep the
///   parameters: no plan, and the message says why.
#[test]
fn the_asynchronous_mode_moves_the_dense_parameters_to_the_server() {
    use coconet_hetero::{Stage, SyncModel};
    let one_gpu_stage = SchedulingPlan {
        stages: vec![Stage {
            first: 0,
            last: 1,
            ty: 1,
        }],
    };
    let cases = [
        (1e4, SyncModel::AsyncServer, 10, 4, 3.40),
        (1e4, SyncModel::Ring, 11, 4, 3.70),
        (
            4e4,
            SyncModel::AsyncServer,
            40,
            5,
            (40.0 * 3.0 + 5.0) * 0.025,
        ),
        (4e4, SyncModel::Ring, 41, 4, (41.0 * 3.0 + 4.0) * 0.025),
    ];
    for (x, sync, units, shards, cost) in cases {
        let e = with_dense(x, sync.clone())
            .evaluate(&one_gpu_stage)
            .unwrap();
        let ps = e.parameter_servers.as_ref().unwrap();
        assert_eq!(
            (e.stages[0].units, ps.shards),
            (units, shards),
            "{x} {sync:?}"
        );
        assert!(close(e.cost, cost), "{x} {sync:?}: ${} vs ${cost}", e.cost);
    }
    // The DP's plan in the asynchronous mode is priced the same way.
    let d = Dp::default()
        .schedule(
            &with_dense(1e4, SyncModel::AsyncServer),
            &SearchConfig::default(),
        )
        .unwrap();
    assert!(d.evaluation.cost <= 3.40 + 1e-9);

    let mut pb = with_dense(1e4, SyncModel::AsyncServer);
    pb.catalog.parameter_server = None;
    let err = Dp::default()
        .schedule(&pb, &SearchConfig::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("asynchronous mode"), "{err}");
}
