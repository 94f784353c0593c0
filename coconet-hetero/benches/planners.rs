//! Planning time: the exact DP on a 200-layer model over 4 resource types (target
//! < 100 ms; no availability caps, so this is the O(L²·T³) segment DP itself), with RL,
//! GA and BO beside it at the default evaluation budget, and the DP on the shipped
//! 98-layer GPT whose H100 cap binds (lazy cap state: 129 usage states).

// criterion_group! generates an undocumented pub fn.
#![allow(missing_docs)]

use coconet_hetero::schedulers::{Bayesian, Dp, Genetic, Reinforce, Scheduler, SearchConfig};
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

use coconet_hetero::instances::chain;

fn planners(c: &mut Criterion) {
    let pb = chain::problem(200, &[]);
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
