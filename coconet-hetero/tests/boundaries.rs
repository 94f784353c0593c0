//! What a stage pays at its boundaries besides its compute: each message's network
//! latency, and the first stage loading its batch's samples.

mod common;

use coconet_hetero::{Catalog, Constraint, Model, Problem, SchedulingPlan, Transfers};
use common::close;
use std::path::Path;

const CATALOG: &str = r#"
default_bandwidth_gbs = 1.0
link_latency_us = 1000
[[types]]
name = "cpu"
class = "cpu"
price_per_hour = 1.0
memory_gib = 64.0
peak_tflops = 1.0
mem_bandwidth_gbs = 100.0
sync_bandwidth_gbs = 1.0
[[types]]
name = "gpu"
class = "gpu"
price_per_hour = 3.0
memory_gib = 16.0
peak_tflops = 100.0
mem_bandwidth_gbs = 1000.0
sync_bandwidth_gbs = 1.0
data_bandwidth_gbs = 1.0
"#;

/// Two layers, batch 100, 10 MB of samples per batch, 1 MB activations between them.
const MODEL: &str = r#"
name = "two-layers"
batch_size = 100
input_bytes = 1e7
[[layers]]
name = "a"
kind = "fc"
activation_bytes = 1e6
[layers.time]
cpu = 0.1
gpu = 0.01
[[layers]]
name = "b"
kind = "fc"
activation_bytes = 1e3
[layers.time]
cpu = 0.1
gpu = 0.01
"#;

fn problem(catalog: &str) -> Problem {
    let catalog = Catalog::parse(Path::new("catalog.toml"), catalog).unwrap();
    let model = Model::parse(Path::new("model.toml"), MODEL, &catalog).unwrap();
    Problem::new(model, catalog, Constraint::new(1e4, 3.6e7).unwrap())
}

#[test]
fn latency_and_loading_by_hand() {
    let pb = problem(CATALOG);
    assert_eq!(pb.catalog.link_latency, 1e-3);
    assert_eq!(pb.catalog.types[1].data_bandwidth, Some(1e9));
    // GPU first: it reads 10 MB at 1 GB/s (10 ms) and sends 1 MB forward and back, each
    // 1 ms of bytes + 1 ms of latency: 0.01 + 0.010 + 0.004 = 0.024 s per batch,
    // ⌈10^4 · 0.024 / 100⌉ = 3 units. The CPU stage: 0.1 + 0.004 = 0.104 s, 11 units.
    let ev = pb
        .evaluate(&SchedulingPlan::from_assignment(&[1, 0]))
        .unwrap();
    let (gpu, cpu) = (&ev.stages[0], &ev.stages[1]);
    assert!(close(gpu.time_per_batch, 0.024), "{}", gpu.time_per_batch);
    assert!(close(cpu.time_per_batch, 0.104), "{}", cpu.time_per_batch);
    assert_eq!((gpu.units, cpu.units), (3, 11));
    // CPU first: the CPU has no data bandwidth, so its loading is free (0.104 s); the
    // GPU pays only the boundary (0.014 s, 2 units).
    let ev = pb
        .evaluate(&SchedulingPlan::from_assignment(&[0, 1]))
        .unwrap();
    assert!(close(ev.stages[0].time_per_batch, 0.104));
    assert!(close(ev.stages[1].time_per_batch, 0.014));
    assert_eq!(ev.stages[1].units, 2);
    // One GPU stage: no boundary, the loading only: 0.02 + 0.01 s, 3 units.
    let ev = pb
        .evaluate(&SchedulingPlan::from_assignment(&[1, 1]))
        .unwrap();
    assert!(close(ev.stages[0].time_per_batch, 0.03));
    assert_eq!(ev.stages[0].units, 3);
    // Overlapped with the compute, the GPU stage's loading and boundary (0.014 s) hide
    // behind nothing longer than themselves: max(0.01, 0.014).
    let ev = pb
        .clone()
        .with_transfers(Transfers::Overlapped)
        .evaluate(&SchedulingPlan::from_assignment(&[1, 0]))
        .unwrap();
    assert!(close(ev.stages[0].time_per_batch, 0.014));
}

#[test]
fn without_the_numbers_the_terms_are_free() {
    let plain = CATALOG
        .replace("link_latency_us = 1000\n", "")
        .replace("data_bandwidth_gbs = 1.0\n", "");
    let pb = problem(&plain);
    let ev = pb
        .evaluate(&SchedulingPlan::from_assignment(&[1, 0]))
        .unwrap();
    // Only the bytes: 0.01 + 2 · 1 ms.
    assert!(close(ev.stages[0].time_per_batch, 0.012));
}

#[test]
fn negative_numbers_are_refused_with_their_line() {
    let e = Catalog::parse(
        Path::new("c.toml"),
        &CATALOG.replace("data_bandwidth_gbs = 1.0", "data_bandwidth_gbs = -1.0"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("type `gpu`: data_bandwidth_gbs must be finite and > 0"),
        "{e}"
    );
    let e = Catalog::parse(
        Path::new("c.toml"),
        &CATALOG.replace("link_latency_us = 1000", "link_latency_us = -1"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("c.toml:3:") && e.contains("link_latency_us must be finite and >= 0"),
        "{e}"
    );
    let catalog = Catalog::parse(Path::new("c.toml"), CATALOG).unwrap();
    let e = Model::parse(
        Path::new("m.toml"),
        &MODEL.replace("input_bytes = 1e7", "input_bytes = -1"),
        &catalog,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("m.toml:4:") && e.contains("input_bytes must be finite and >= 0"),
        "{e}"
    );
}
