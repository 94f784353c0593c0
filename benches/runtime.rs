//! CPU runtime benchmarks (written up in BENCHMARKS.md).
//!
//! `cargo bench --bench runtime` — optimizer schedules at P = 4, N = 2^24 f32 (Adam, SGD,
//! LAMB, the trainer's clipped AdamW: AR-C vs RS-C-AG vs fuse(RS-C-AG)), the machine's
//! copy bandwidth (for the memory-traffic bound), and the Megatron layer at P = 2
//! (MM-AR-C vs the overlapped schedule, with the all-reduce and the matmul alone for η). Set `COCONET_BENCH_N` to
//! change N (e.g. 2^20 for a quick run), `COCONET_BENCH_P` the optimizers' rank count.

use coconet_example_programs::adam as adam_program;
use coconet_example_programs::data;
use coconet_example_programs::lamb as lamb_program;
use coconet_example_programs::megatron as megatron_program;
use coconet_example_programs::sgd as sgd_program;

use coconet::core::schedule::{Schedule, candidates};
use coconet::core::{DType, Dim, Layout, ProgramBuilder, ReduceOp, Shape};
use coconet::prelude::*;
use coconet::runtime::Plan;
use coconet::runtime::cpu::{Job, RunOptions};
use criterion::{Criterion, criterion_group, criterion_main};
use std::time::Duration;

/// Ranks of the optimizer benchmarks: `COCONET_BENCH_P`, 4 by default.
fn ranks() -> usize {
    std::env::var("COCONET_BENCH_P")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4)
}

fn n() -> usize {
    std::env::var("COCONET_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1 << 24)
}

fn job(s: &Schedule, ranks: usize, args: &Bindings) -> Job {
    let plan = Plan::lower(s, ranks, args.dims()).expect("plan");
    Job::new(&plan, args, RunOptions::default()).expect("bind")
}

fn optimizer(c: &mut Criterion, name: &str, schedules: Vec<Schedule>, args: Bindings) {
    let mut g = c.benchmark_group(format!("{name}/P{}/N{}", ranks(), n()));
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    for s in &schedules {
        let mut j = job(s, ranks(), &args);
        eprintln!(
            "{name} {}: runtime buffers {} MiB per rank",
            s.name(),
            j.plan().slot_bytes() >> 20
        );
        g.bench_function(s.name(), |b| b.iter(|| j.run().expect("run")));
    }
    g.finish();
}

fn grads(n: usize) -> Vec<Vec<f32>> {
    (0..ranks())
        .map(|r| data::uniform_f32(r as u64, n))
        .collect()
}

fn adam(c: &mut Criterion) {
    let n = n();
    let p = adam_program::adam();
    let hp = adam_program::AdamParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        step: 1,
    };
    let v = vec![0.0f32; n];
    let args = adam_program::adam_args(&grads(n), &data::uniform_f32(9, n), &v, &v, hp);
    optimizer(
        c,
        "adam",
        candidates(p.program(), &[p.m.id(), p.v.id()]),
        args.into(),
    );
}

fn sgd(c: &mut Criterion) {
    let n = n();
    let p = sgd_program::sgd();
    let args = sgd_program::sgd::Args {
        N: n,
        g: TensorArg::PerRank(grads(n)),
        w: TensorArg::Global(data::uniform_f32(9, n)),
        lr: 0.01,
    };
    optimizer(c, "sgd", candidates(p.program(), &[]), args.into());
}

fn lamb(c: &mut Criterion) {
    let n = n();
    let p = lamb_program::lamb();
    let hp = lamb_program::LambParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-6,
        weight_decay: 0.01,
        step: 1,
    };
    let v = vec![0.0f32; n];
    let args = lamb_program::lamb_args(&grads(n), &data::uniform_f32(9, n), &v, &v, hp);
    optimizer(
        c,
        "lamb",
        candidates(p.program(), &[p.m.id(), p.v.id()]),
        args.into(),
    );
}

/// AdamW on the gradient clipped to global norm 1 (the data-parallel trainer's
/// `adamw_clipped`, as torch's `clip_grad_norm_` + AdamW): the norm sits between the
/// reduction and the update, so its fused step is two passes.
fn adamw_clipped(c: &mut Criterion) {
    let n = n();
    let p = coconet::programs::adamw_clipped();
    let zeros = vec![0.0f32; n];
    let args = coconet::programs::adamw_clipped::Args {
        N: n,
        g: TensorArg::PerRank(grads(n)),
        w: TensorArg::Global(data::uniform_f32(9, n)),
        m: TensorArg::Global(zeros.clone()),
        v: TensorArg::Global(zeros),
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        max_norm: 1.0,
        step: 1,
    };
    optimizer(
        c,
        "adamw_clipped",
        candidates(p.program(), &[p.m.id(), p.v.id()]),
        args.into(),
    );
}

/// Copy bandwidth with two threads (one per core): bytes read + written per second.
fn copy_bandwidth(c: &mut Criterion) {
    let n = n();
    let src: Vec<Vec<f32>> = (0..2).map(|_| vec![1.0f32; n]).collect();
    let mut dst: Vec<Vec<f32>> = (0..2).map(|_| vec![0.0f32; n]).collect();
    let mut g = c.benchmark_group(format!("copy/N{n}"));
    g.sample_size(10);
    g.bench_function("2 threads x N f32", |b| {
        b.iter(|| {
            std::thread::scope(|s| {
                for (d, sr) in dst.iter_mut().zip(&src) {
                    s.spawn(move || d.copy_from_slice(sr));
                }
            })
        })
    });
    g.finish();
}

fn megatron(c: &mut Criterion) {
    let ranks = 2;
    let (b, s, h) = (8, 256, 1024);
    let p = megatron_program::megatron();
    let args: Bindings = megatron_program::megatron_args(b, s, h, 7).into();
    let mut g = c.benchmark_group(format!("megatron/P{ranks}/B{b}S{s}H{h}"));
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    for sch in candidates(p.program(), &[]) {
        let mut j = job(&sch, ranks, &args);
        g.bench_function(sch.name(), |bch| bch.iter(|| j.run().expect("run")));
    }
    // The all-reduce alone (for η), same size and dtype.
    let mut bld = ProgramBuilder::new("allreduce");
    let shape = Shape::new(vec![Dim::sym("B"), Dim::sym("S"), Dim::sym("H")]);
    let x = bld
        .tensor_input("x", DType::F16, Layout::Local, shape, 0)
        .unwrap();
    let y = bld.all_reduce(ReduceOp::Sum, x).unwrap();
    bld.output(y).unwrap();
    let ar = bld.finish();
    let ar_args = Bindings::new().dim("B", b).dim("S", s).dim("H", h).tensor(
        "x",
        Binding::global(
            &data::uniform(8, b * s * h)
                .into_iter()
                .map(f16::from_f64)
                .collect::<Vec<_>>(),
        ),
    );
    let mut j = job(&Schedule::new(&ar), ranks, &ar_args);
    g.bench_function("all_reduce alone", |bch| bch.iter(|| j.run().expect("run")));
    g.finish();
}

/// The benchmark group (the macro's function has no docs of its own).
mod group {
    #![allow(missing_docs)]
    use super::*;
    criterion_group!(
        benches,
        copy_bandwidth,
        adam,
        sgd,
        lamb,
        adamw_clipped,
        megatron
    );
}
criterion_main!(group::benches);
