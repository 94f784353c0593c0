//! CPU runtime benchmarks (written up in BENCHMARKS.md).
//!
//! `cargo bench --bench runtime` — optimizer schedules at P = 4, N = 2^24 f32 (Adam, SGD,
//! LAMB, the trainer's clipped AdamW: AR-C vs RS-C-AG vs fuse(RS-C-AG)), the machine's
//! copy and STREAM-triad bandwidths (for the memory-traffic bound), Adam's fused step written by hand
//! (what per-element generated code would reach), and the Megatron layer at P = 2
//! (MM-AR-C vs the overlapped schedule, with the all-reduce and the matmul alone for η). Set `COCONET_BENCH_N` to
//! change N (e.g. 2^20 for a quick run), `COCONET_BENCH_P` the optimizers' rank count,
//! `COCONET_BENCH_CHUNK` the elements per kernel chunk (default the runtime's).

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
    let mut options = RunOptions::default();
    if let Some(chunk) = std::env::var("COCONET_BENCH_CHUNK")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        options.chunk = chunk;
    }
    Job::new(&plan, args, options).expect("bind")
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
    let hp = adam_program::AdamParams::default();
    let v = vec![0.0f32; n];
    let args = adam_program::adam_args(&grads(n), &data::uniform_f32(9, n), &v, &v, hp);
    optimizer(
        c,
        "adam",
        candidates(p.program(), &[p.m.id(), p.v.id()]),
        args.into(),
    );
}

/// A pointer to one rank's copy of `w`, shared with the threads that write its blocks.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: each thread writes only its own block of every copy (see `adam_by_hand`).
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

/// Adam's fused step written by hand: what a kernel generated per element (every stage
/// in registers) would reach, beside coconet's stage-by-stage kernels. P rank threads,
/// as in the fused schedule: each sums its block of the P gradients (f64, rank order,
/// rounded once), updates its slices of m and v and its block of w element by element,
/// and writes the new w into every rank's copy. The same 872 MB per step at N = 2^24
/// and P = 4.
fn adam_by_hand(c: &mut Criterion) {
    let (n, p) = (n(), ranks());
    let block = n.div_ceil(p);
    let g: Vec<Vec<f32>> = grads(n).iter().map(|d| huge_copy(d)).collect();
    let w0 = data::uniform_f32(9, n);
    let mut w: Vec<Vec<f32>> = (0..p).map(|_| huge_copy(&w0)).collect();
    // Moments from an earlier step (v ≥ 0), so that every term of the update counts.
    let m0 = data::uniform_f32(11, n);
    let v0: Vec<f32> = data::uniform_f32(12, n).iter().map(|x| x * x).collect();
    let slices = |whole: &[f32]| -> Vec<Vec<f32>> {
        (0..p)
            .map(|r| huge_copy(&whole[(r * block).min(n)..((r + 1) * block).min(n)]))
            .collect()
    };
    let (mut m, mut v) = (slices(&m0), slices(&v0));
    let ws: Vec<Shared> = w.iter_mut().map(|x| Shared(x.as_mut_ptr())).collect();
    #[cfg(target_arch = "x86_64")]
    assert!(
        std::is_x86_feature_detected!("avx2"),
        "the hand-written step is compiled for AVX2"
    );
    let step = |m: &mut [Vec<f32>], v: &mut [Vec<f32>]| {
        std::thread::scope(|s| {
            for (r, (m, v)) in m.iter_mut().zip(v.iter_mut()).enumerate() {
                let (g, ws) = (&g, &ws);
                let lo = (r * block).min(n);
                let hi = (lo + block).min(n);
                // SAFETY: AVX2 checked; rank r reads its own copy of w and writes
                // block lo..hi of every copy, which no other rank touches.
                s.spawn(move || unsafe { adam_block(g, ws, r, lo..hi, m, v) });
            }
        })
    };
    // The first step must be coconet's fused step bit for bit (w, m and v): the same
    // operations.
    step(&mut m, &mut v);
    let program = adam_program::adam();
    let fused = candidates(program.program(), &[program.m.id(), program.v.id()])
        .into_iter()
        .find(|s| s.name() == "fuse(RS-C-AG)")
        .expect("the fused schedule");
    let hp = adam_program::AdamParams::default();
    let args = adam_program::adam_args(&grads(n), &w0, &m0, &v0, hp);
    let mut coconet = job(&fused, p, &args.into());
    coconet.run().expect("run");
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    let expected = |name: &str| bits(&coconet.final_input::<f32>(name).expect("updated"));
    assert!(
        w.iter().all(|copy| bits(copy) == expected("w"))
            && bits(&m.concat()) == expected("m")
            && bits(&v.concat()) == expected("v"),
        "the hand-written step differs from coconet's"
    );
    let mut g_ = c.benchmark_group(format!("adam/P{p}/N{n}"));
    g_.sample_size(10).measurement_time(Duration::from_secs(8));
    g_.bench_function("fused step by hand", |b| b.iter(|| step(&mut m, &mut v)));
    g_.finish();
}

/// One rank's part of [`adam_by_hand`], compiled for AVX2 like coconet's kernels.
///
/// # Safety
/// The CPU has AVX2; no other thread touches positions `range` of any copy of `w`.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2"))]
unsafe fn adam_block(
    g: &[Vec<f32>],
    ws: &[Shared],
    me: usize,
    range: std::ops::Range<usize>,
    m: &mut [f32],
    v: &mut [f32],
) {
    let (b1, b2, lr, eps) = (0.9f32, 0.999f32, 1e-3f32, 1e-8f32);
    let (c1, c2) = ((1.0 - 0.9f64) as f32, (1.0 - 0.999f64) as f32);
    let (bc1, bc2) = (c1, c2); // 1 - beta^1 at step 1
    const TILE: usize = 256;
    let mut acc = [0f64; TILE];
    let mut w1 = [0f32; TILE];
    let mut lo = range.start;
    while lo < range.end {
        let len = TILE.min(range.end - lo);
        let acc = &mut acc[..len];
        for (a, x) in acc.iter_mut().zip(&g[0][lo..lo + len]) {
            *a = f64::from(*x);
        }
        for src in &g[1..] {
            for (a, x) in acc.iter_mut().zip(&src[lo..lo + len]) {
                *a += f64::from(*x);
            }
        }
        // SAFETY: my copy of w holds n ≥ range.end elements (the caller's contract).
        let mine = unsafe { std::slice::from_raw_parts(ws[me].0.add(lo), len) };
        let at = lo - range.start;
        let (m, v) = (&mut m[at..at + len], &mut v[at..at + len]);
        for i in 0..len {
            let gi = acc[i] as f32;
            let m1 = b1 * m[i] + c1 * gi;
            let v1 = b2 * v[i] + c2 * gi * gi;
            m[i] = m1;
            v[i] = v1;
            w1[i] = mine[i] - lr * (m1 / bc1) / ((v1 / bc2).sqrt() + eps);
        }
        for w in ws {
            // SAFETY: as above, for every copy.
            let dst = unsafe { std::slice::from_raw_parts_mut(w.0.add(lo), len) };
            stream(dst, &w1[..len]);
        }
        lo += len;
    }
    // Orders the streaming stores before the step ends.
    #[cfg(target_arch = "x86_64")]
    std::arch::x86_64::_mm_sfence();
}

/// `dst = src` with non-temporal stores (no read of the destination lines), as
/// coconet's kernels write a peer's copy.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn stream(dst: &mut [f32], src: &[f32]) {
    use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
    let head = dst.as_ptr().align_offset(16).min(dst.len());
    let body = (dst.len() - head) / 4 * 4;
    dst[..head].copy_from_slice(&src[..head]);
    for i in (head..head + body).step_by(4) {
        // SAFETY: `dst[i..i + 4]` is in bounds and 16-byte aligned, `src[i..i + 4]` in
        // bounds (an unaligned load).
        unsafe { _mm_stream_ps(dst.as_mut_ptr().add(i), _mm_loadu_ps(src.as_ptr().add(i))) };
    }
    dst[head + body..].copy_from_slice(&src[head + body..]);
}

/// `dst = src` (plain stores off x86-64).
#[cfg(not(target_arch = "x86_64"))]
fn stream(dst: &mut [f32], src: &[f32]) {
    dst.copy_from_slice(src);
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

/// `n` copies of `x` on transparent huge pages where Linux gives them on request (as
/// coconet's buffers are): references and steps go through the TLB alike.
fn huge_vec(n: usize, x: f32) -> Vec<f32> {
    let mut v: Vec<f32> = Vec::with_capacity(n);
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (v.as_mut_ptr() as usize).next_multiple_of(HUGE);
        let end = (v.as_mut_ptr() as usize + 4 * n) / HUGE * HUGE;
        if end > start {
            // SAFETY: inside the untouched allocation; a hint that changes no contents.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    v.resize(n, x);
    v
}

/// A copy of `data` on huge pages (see [`huge_vec`]).
fn huge_copy(data: &[f32]) -> Vec<f32> {
    let mut v = huge_vec(data.len(), 0.0);
    v.copy_from_slice(data);
    v
}

/// Copy bandwidth with two threads (one per core): bytes read + written per second.
fn copy_bandwidth(c: &mut Criterion) {
    let n = n();
    let src: Vec<Vec<f32>> = (0..2).map(|_| huge_vec(n, 1.0)).collect();
    let mut dst: Vec<Vec<f32>> = (0..2).map(|_| huge_vec(n, 0.0)).collect();
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

/// STREAM's triad (`a = b + s·c`) with two threads, one per core: 12 bytes per element
/// as STREAM counts them (two reads, one write), the other side of the memory-traffic
/// bound (an optimizer step reads more than it writes, as the triad does).
fn triad_bandwidth(c: &mut Criterion) {
    let n = n();
    let b: Vec<Vec<f32>> = (0..2).map(|_| huge_vec(n, 1.0)).collect();
    let cs: Vec<Vec<f32>> = (0..2).map(|_| huge_vec(n, 2.0)).collect();
    let mut a: Vec<Vec<f32>> = (0..2).map(|_| huge_vec(n, 0.0)).collect();
    let mut g = c.benchmark_group(format!("stream/N{n}"));
    g.sample_size(10);
    g.bench_function("triad, 2 threads x N f32", |bench| {
        bench.iter(|| {
            std::thread::scope(|s| {
                for ((a, b), c) in a.iter_mut().zip(&b).zip(&cs) {
                    s.spawn(move || {
                        for ((a, b), c) in a.iter_mut().zip(b).zip(c) {
                            *a = b + 3.0 * c;
                        }
                    });
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
        triad_bandwidth,
        adam_by_hand,
        adam,
        sgd,
        lamb,
        adamw_clipped,
        megatron
    );
}
criterion_main!(group::benches);
