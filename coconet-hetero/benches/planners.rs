//! Planning time: the exact DP on a 200-layer model over 4 resource types (target
//! < 100 ms; no availability caps, so this is the O(L²·T³) segment DP itself), with RL,
//! GA and BO beside it at the default evaluation budget, and the DP on the shipped
//! 98-layer GPT whose H100 cap binds (lazy cap state: 129 usage states).

// criterion_group! generates an undocumented pub fn.
#![allow(missing_docs)]

use coconet_hetero::schedulers::{Bayesian, Dp, Genetic, Reinforce, Scheduler, SearchConfig};
use coconet_hetero::{Catalog, Model, Problem};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::path::Path;

const CATALOG: &str = r#"
default_bandwidth_gbs = 1.5625
[[types]]
name = "cpu"
class = "cpu"
price_per_hour = 1.36
memory_gib = 64
peak_tflops = 3.58
mem_bandwidth_gbs = 102.4
efficiency = 0.5
layer_overhead_us = 10
sync_bandwidth_gbs = 1.5625
[[types]]
name = "t4"
class = "gpu"
price_per_hour = 0.526
memory_gib = 16
peak_tflops = 65
mem_bandwidth_gbs = 320
efficiency = 0.35
layer_overhead_us = 60
sync_bandwidth_gbs = 3.125
[[types]]
name = "a100"
class = "gpu"
price_per_hour = 4.096
memory_gib = 40
peak_tflops = 312
mem_bandwidth_gbs = 1555
efficiency = 0.45
layer_overhead_us = 60
sync_bandwidth_gbs = 6.25
[[types]]
name = "h100"
class = "gpu"
price_per_hour = 12.29
memory_gib = 80
peak_tflops = 989
mem_bandwidth_gbs = 3350
efficiency = 0.45
layer_overhead_us = 60
sync_bandwidth_gbs = 50
"#;

/// A 200-layer model mixing embedding, FC and transformer-sized layers (deterministic).
fn model_toml() -> String {
    let mut s = String::from(
        "name = \"synthetic-200\"\nbatch_size = 64\n[constraint]\nthroughput = 2000.0\nsamples = 1e9\n",
    );
    for l in 0..200u64 {
        let scale = 1.0 + ((l * 7919) % 13) as f64;
        let (kind, flops, act, dense) = match l % 10 {
            0 => ("embedding", 1e8, 2e6, 0.0),
            1..=6 => ("fc", 2e10 * scale, 4e6, 4e6 * scale),
            _ => ("transformer", 1e11 * scale, 8e6, 2e7 * scale),
        };
        s += &format!(
            "[[layers]]\nname = \"l{l}\"\nkind = \"{kind}\"\nflops = {flops}\nbytes = {}\nactivation_bytes = {act}\ndense_param_bytes = {dense}\n",
            flops / 50.0
        );
    }
    s
}

fn problem() -> Problem {
    let catalog = Catalog::parse(Path::new("bench-catalog.toml"), CATALOG).expect("catalog");
    let model =
        Model::parse(Path::new("bench-model.toml"), &model_toml(), &catalog).expect("model");
    let c = model.constraint.expect("constraint");
    Problem::new(model, catalog, c)
}

fn planners(c: &mut Criterion) {
    let pb = problem();
    let cfg = SearchConfig::default();
    let mut g = c.benchmark_group("plan_200_layers_4_types");
    g.sample_size(10);
    g.bench_function("dp", |b| {
        b.iter(|| black_box(Dp::default().schedule(&pb, &cfg).expect("dp")))
    });
    g.bench_function("genetic", |b| {
        b.iter(|| black_box(Genetic::default().schedule(&pb, &cfg).expect("ga")))
    });
    g.bench_function("bayes", |b| {
        b.iter(|| black_box(Bayesian::default().schedule(&pb, &cfg).expect("bo")))
    });
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/data");
    let gpt = coconet_hetero::load(
        format!("{dir}/gpt-96.toml"),
        format!("{dir}/catalog.toml"),
        None,
    )
    .expect("gpt");
    g.bench_function("dp_gpt96_binding_cap", |b| {
        b.iter(|| black_box(Dp::default().schedule(&gpt, &cfg).expect("dp")))
    });
    g.bench_function("rl", |b| {
        b.iter(|| black_box(Reinforce::default().schedule(&pb, &cfg).expect("rl")))
    });
    g.finish();
}

criterion_group!(benches, planners);
criterion_main!(benches);
