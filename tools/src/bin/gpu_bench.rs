//! `coconet-gpu-bench` (feature `cuda`): the CUDA backend's step times on one GPU, beside
//! the bandwidth it could reach.
//!
//! ```text
//! coconet-gpu-bench --log2n 28 --ranks 1,2,4 --iters 20 [--big] [--emulate]
//! ```
//!
//! - a copy kernel (coconet's own generated code: `update(y, x)`): the achievable-bandwidth
//!   reference (the bring-up script prints torch's device copy beside it);
//! - Adam, AR-C and fuse(RS-C-AG), on `Cuda::new(0)` with P virtual ranks at N = 2^log2n:
//!   the first step checked against plain-Rust Adam on a sample of elements, then the
//!   median of `iters` steps, reported as GB/s by the fused step's byte model (every
//!   rank's gradient read, m and v read and written, w read and written to every rank:
//!   (2P + 5)·4·N bytes) and as a fraction of the copy kernel's bandwidth;
//! - LAMB, AR-C and fuse(RS-C-AG) (two passes: the reduction folding both norms' partial
//!   sums, then the update written into every peer) at the same P and N, checked against
//!   plain-Rust LAMB on the sample, reported by the two-pass byte model ((2P + 8)·4·N
//!   bytes: every gradient, m, v, w read, m, v, r written, r and w read again, w written to
//!   every rank; the kernel folds the norms per 2048-element block, one f64 each);
//! - bias + layer norm over rows of 4096 (N/4 elements), checked bitwise on three rows;
//! - SGD's schedules on one rank at the same N, and with `--big` the copy kernel and SGD at
//!   N = 2^31 + 4099 (64-bit indexing, a scalar tail), checked on a sample.
//!
//! - AdamW (`coconet::programs::adamw`) on memory lent by the caller
//!   (`coconet::runtime::cuda::Lent`, cudarc slices on a GPU) at P = 1: (a) one tensor of
//!   2^log2n elements, (b) GPT-2 small's 148 parameter tensors (124M elements) lent as
//!   pieces, (c) 2^16 elements (the fixed cost per step); each first checked bitwise
//!   against the same step on the job's own contiguous buffers, then timed as queued steps
//!   (`run_after`, host work included) and reported by the 28-bytes-per-element model
//!   beside the copy kernel; the contiguous step alongside. With `--emulate` the lists
//!   are scaled down.
//!
//! One `RESULT` line per measurement and one `check` line per checked step (what
//! `../shared/gpu/gpu-bringup.sh` collects). `--emulate` runs the same on the host
//! emulator (small N: CI runs it so the binary never rots).

use coconet_example_programs as programs;
use programs::{adam as adam_program, lamb as lamb_program, sgd as sgd_program};

use coconet::core::schedule::{Schedule, candidates};
use coconet::prelude::*;
use coconet::runtime::cuda::{DeviceData, DeviceSlice, EmulatedJob, Lent};
use coconet::runtime::{Backend, Plan, RuntimeError};
use std::time::Instant;

#[coconet]
fn copy(x: Tensor<f32, Local, [N]>, y: Tensor<f32, Local, [N]>) {
    let y1 = update(y, x);
}

/// Bias + layer norm over the rows of a matrix (one block per row on the GPU).
#[coconet]
fn norm(
    x: Tensor<f32, Local, (R, H)>,
    bias: Tensor<f32, Replicated, [H]>,
    gamma: Tensor<f32, Replicated, [H]>,
    beta: Tensor<f32, Replicated, [H]>,
) {
    let out = layer_norm(x + bias, gamma, beta, 0.00001);
    out
}

/// A cheap deterministic value in [-0.5, 0.5) for element `i` of stream `seed` (2^28
/// elements are filled in seconds, unlike an RNG).
fn value(seed: u64, i: usize) -> f32 {
    let h =
        (i as u64 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    ((h >> 40) as f32 / (1u64 << 24) as f32) - 0.5
}

fn filled(seed: u64, n: usize) -> Vec<f32> {
    (0..n).map(|i| value(seed, i)).collect()
}

/// Element indices checked: both ends, rank-block edges, and a spread in between.
fn sample(n: usize) -> Vec<usize> {
    let mut s: Vec<usize> = (0..64).map(|k| k * (n / 64)).collect();
    s.extend([0, 1, n / 2, n - 2, n - 1]);
    s.retain(|&i| i < n);
    s.sort_unstable();
    s.dedup();
    s
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Runs `plan` once (checked by `check` on the job), then `iters` times; the median
/// seconds per run.
fn timed<B: Backend>(
    backend: &B,
    plan: &Plan,
    bindings: &Bindings,
    iters: usize,
    check: impl Fn(&B::Job) -> Result<(), String>,
) -> Result<(f64, Result<(), String>), RuntimeError> {
    let mut job = backend.prepare(plan, bindings)?;
    backend.run(&mut job)?;
    let checked = check(&job);
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        backend.run(&mut job)?;
        times.push(t.elapsed().as_secs_f64());
    }
    Ok((median(times), checked))
}

/// Prints the `check` line of a checked step; whether it passed.
fn report(what: &str, on: &str, checked: &Result<(), String>) -> bool {
    match checked {
        Ok(()) => println!("check {what}: ok on {on}"),
        Err(e) => println!("check {what}: FAIL {e}"),
    }
    checked.is_ok()
}

fn gbps(bytes: f64, seconds: f64) -> f64 {
    bytes / seconds / 1e9
}

/// The copy kernel's bandwidth (read + written bytes per second).
fn copy_reference<B: Backend>(backend: &B, n: usize, iters: usize) -> Result<f64, RuntimeError> {
    let p = copy();
    let bindings = Bindings::new()
        .dim("N", n)
        .tensor("x", Binding::per_rank(&[filled(1, n)]))
        .tensor("y", Binding::per_rank(&[vec![0.0f32; n]]));
    let plan = Plan::lower(&Schedule::new(p.program()), 1, bindings.dims())?;
    let (t, _) = timed(backend, &plan, &bindings, iters, |_| Ok(()))?;
    let rate = gbps(8.0 * n as f64, t);
    println!(
        "RESULT copy kernel N={n}: {:.3} ms, {rate:.1} GB/s (read + write)",
        t * 1e3
    );
    Ok(rate)
}

/// An optimizer's step to time: its program and bindings, and plain Rust's new `w` at
/// the sampled positions.
struct OptimizerStep<'a> {
    /// `adam` or `lamb`, for the lines printed.
    name: &'a str,
    program: &'a coconet::core::Program,
    /// The optimizer state the schedules keep sharded (m and v).
    state: &'a [coconet::core::ValueId],
    bindings: Bindings,
    at: Vec<usize>,
    want: Vec<f32>,
    /// Learning rate: the tolerance's floor (a step's size).
    lr: f32,
    /// Bytes its byte model moves per element at P ranks, and that model's name.
    bytes_per_element: fn(usize) -> f64,
    model: &'a str,
}

/// AR-C and fuse(RS-C-AG) of `step` at P virtual ranks, each checked on the sample
/// against plain Rust and timed.
fn optimizer<B: Backend>(
    backend: &B,
    step: &OptimizerStep,
    ranks: usize,
    iters: usize,
    copy_rate: f64,
) -> Result<bool, RuntimeError> {
    let n = step.bindings.dims()["N"];
    let mut ok = true;
    for s in candidates(step.program, step.state) {
        if !matches!(s.name(), "AR-C" | "fuse(RS-C-AG)") {
            continue;
        }
        let plan = Plan::lower(&s, ranks, step.bindings.dims())?;
        let check = |job: &B::Job| -> Result<(), String> {
            let got: Vec<f32> = job.final_input("w").map_err(|e| e.to_string())?;
            for (&i, &b) in step.at.iter().zip(&step.want) {
                let a = got[i];
                // Plain f32 Rust rounds in another order (β^t by powi, no rounding per
                // stage, gradients summed in f32, norms in another order): agreement
                // within 1e-5 of the value or of a step's size.
                if (a - b).abs() > 1e-5 * b.abs().max(step.lr) {
                    return Err(format!("w[{i}] = {a}, plain {} gives {b}", step.name));
                }
            }
            Ok(())
        };
        let (t, checked) = timed(backend, &plan, &step.bindings, iters, check)?;
        let name = s.name();
        ok &= report(
            &format!("{} P={ranks} {name}", step.name),
            &format!("{} sampled elements", step.at.len()),
            &checked,
        );
        let rate = gbps((step.bytes_per_element)(ranks) * n as f64, t);
        println!(
            "RESULT {} {name} P={ranks} N={n}: {:.3} ms, {rate:.1} GB/s by the {} byte model, \
             {:.2} of the copy kernel",
            step.name,
            t * 1e3,
            step.model,
            rate / copy_rate
        );
    }
    Ok(ok)
}

/// An optimizer's inputs from streams `seed`, ...: every rank's gradient, w, and m and v
/// of the size a few steps in would give them (v ≥ 0).
fn optimizer_data(
    seed: u64,
    ranks: usize,
    n: usize,
) -> (Vec<Vec<f32>>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let grads = (0..ranks).map(|r| filled(seed + 3 + r as u64, n)).collect();
    let w = filled(seed, n);
    let m = filled(seed + 1, n).iter().map(|x| x * 0.1).collect();
    let v = filled(seed + 2, n).iter().map(|x| x * x * 0.01).collect();
    (grads, w, m, v)
}

/// Adam's schedules at P virtual ranks, each checked on a sample and timed; reported by
/// the fused byte model ((2P + 5)·4 bytes per element).
fn adam<B: Backend>(
    backend: &B,
    ranks: usize,
    n: usize,
    iters: usize,
    copy_rate: f64,
) -> Result<bool, RuntimeError> {
    let p = adam_program::adam();
    let hp = adam_program::AdamParams {
        step: 3,
        ..Default::default()
    };
    let (grads, w, m, v) = optimizer_data(10, ranks, n);
    let at = sample(n);
    let pick = |x: &[f32]| at.iter().map(|&i| x[i]).collect::<Vec<f32>>();
    let sampled: Vec<Vec<f32>> = grads.iter().map(|g| pick(g)).collect();
    let (want, _, _) = adam_program::adam_reference(&sampled, &pick(&w), &pick(&m), &pick(&v), hp);
    let step = OptimizerStep {
        name: "adam",
        program: p.program(),
        state: &[p.m.id(), p.v.id()],
        bindings: adam_program::adam_args(&grads, &w, &m, &v, hp).into(),
        at,
        want,
        lr: hp.lr as f32,
        bytes_per_element: |p| (2 * p + 5) as f64 * 4.0,
        model: "fused",
    };
    drop((grads, w, m, v));
    optimizer(backend, &step, ranks, iters, copy_rate)
}

/// LAMB's schedules at P virtual ranks, each checked on a sample against plain-Rust LAMB
/// (whose norms run over every element) and timed; reported by the two-pass byte model
/// ((2P + 8)·4 bytes per element).
fn lamb<B: Backend>(
    backend: &B,
    ranks: usize,
    n: usize,
    iters: usize,
    copy_rate: f64,
) -> Result<bool, RuntimeError> {
    let p = lamb_program::lamb();
    let hp = lamb_program::LambParams {
        step: 3,
        ..Default::default()
    };
    let (grads, w, m, v) = optimizer_data(40, ranks, n);
    let at = sample(n);
    let want = lamb_sampled(&grads, &w, &m, &v, hp, &at);
    let step = OptimizerStep {
        name: "lamb",
        program: p.program(),
        state: &[p.m.id(), p.v.id()],
        bindings: lamb_program::lamb_args(&grads, &w, &m, &v, hp).into(),
        at,
        want,
        lr: hp.lr as f32,
        bytes_per_element: |p| (2 * p + 8) as f64 * 4.0,
        model: "two-pass",
    };
    drop((grads, w, m, v));
    optimizer(backend, &step, ranks, iters, copy_rate)
}

/// Plain-Rust LAMB's new `w` at the positions `at` (`lamb_program::lamb_reference`'s
/// arithmetic, its norms streamed over every element instead of materialising the whole
/// step: 2^28 elements would take gigabytes).
fn lamb_sampled(
    grads: &[Vec<f32>],
    w: &[f32],
    m: &[f32],
    v: &[f32],
    p: lamb_program::LambParams,
    at: &[usize],
) -> Vec<f32> {
    let r = |i: usize| lamb_program::lamb_element(grads, w, m, v, p, i).2;
    let trust = lamb_program::lamb_trust((0..w.len()).map(|i| (w[i], r(i))));
    let lr = p.lr as f32;
    at.iter().map(|&i| w[i] - lr * trust * r(i)).collect()
}

/// SGD on one rank for each of its schedules, checked on a sample and timed; reported
/// by its byte model (g and w read, w written: 12 bytes per element) and as a fraction
/// of the copy kernel's bandwidth at the same N.
fn sgd<B: Backend>(
    backend: &B,
    n: usize,
    iters: usize,
    copy_rate: f64,
) -> Result<bool, RuntimeError> {
    let p = sgd_program::sgd();
    let (g, w) = (filled(20, n), filled(21, n));
    let at = sample(n);
    let pick = |x: &[f32]| at.iter().map(|&i| x[i]).collect::<Vec<f32>>();
    let want = sgd_program::sgd_reference(&[pick(&g)], &pick(&w), 0.01);
    let bindings = Bindings::new()
        .dim("N", n)
        .tensor("g", Binding::per_rank(&[g]))
        .tensor("w", Binding::global(&w))
        .scalar("lr", 0.01f32);
    drop(w);
    let mut ok = true;
    for s in candidates(p.program(), &[]) {
        let plan = Plan::lower(&s, 1, bindings.dims())?;
        let check = |job: &B::Job| -> Result<(), String> {
            let got: Vec<f32> = job.final_input("w").map_err(|e| e.to_string())?;
            match at.iter().zip(&want).find(|&(&i, b)| got[i] != *b) {
                Some((&i, b)) => Err(format!("w[{i}] = {}, plain SGD gives {b}", got[i])),
                None => Ok(()),
            }
        };
        let (t, checked) = timed(backend, &plan, &bindings, iters, check)?;
        let name = s.name();
        ok &= report(
            &format!("sgd {name} N={n}"),
            &format!("{} sampled elements", at.len()),
            &checked,
        );
        let rate = gbps(12.0 * n as f64, t);
        println!(
            "RESULT sgd {name} P=1 N={n}{}: {:.3} ms, {rate:.1} GB/s (g, w read, w written), \
             {:.2} of the copy kernel",
            if n > u32::MAX as usize {
                " (64-bit indexing)"
            } else {
                ""
            },
            t * 1e3,
            rate / copy_rate
        );
    }
    Ok(ok)
}

/// Bias + layer norm on `rows` × `h` f32 on one rank, checked bitwise against
/// `coconet::core::numerics::layer_norm_row` on three rows, timed; reported by its byte model (x
/// read, the result written: 8 bytes per element) and as a fraction of the copy kernel.
fn layer_norm<B: Backend>(
    backend: &B,
    rows: usize,
    h: usize,
    iters: usize,
    copy_rate: f64,
) -> Result<bool, RuntimeError> {
    let p = norm();
    let x = filled(30, rows * h);
    let (bias, gamma, beta) = (filled(31, h), filled(32, h), filled(33, h));
    let at = [0, rows / 2, rows - 1];
    let want: Vec<Vec<f32>> = at
        .iter()
        .map(|&r| {
            let row: Vec<f64> = (0..h).map(|c| (x[r * h + c] + bias[c]) as f64).collect();
            let wide = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
            let mut out = vec![0.0; h];
            let eps = 0.00001f32 as f64;
            coconet::core::numerics::layer_norm_row(
                &row,
                &wide(&gamma),
                &wide(&beta),
                eps,
                &mut out,
            );
            out.iter().map(|&y| y as f32).collect()
        })
        .collect();
    let bindings = Bindings::new()
        .dim("R", rows)
        .dim("H", h)
        .tensor("x", Binding::per_rank(&[x]))
        .tensor("bias", Binding::global(&bias))
        .tensor("gamma", Binding::global(&gamma))
        .tensor("beta", Binding::global(&beta));
    let plan = Plan::lower(&Schedule::new(p.program()), 1, bindings.dims())?;
    let out = p.program().outputs()[0];
    let check = |job: &B::Job| -> Result<(), String> {
        let got: Vec<f32> = job.local(out, 0).ok_or("no output")?;
        for (k, &r) in at.iter().enumerate() {
            if let Some(c) = (0..h).find(|&c| got[r * h + c].to_bits() != want[k][c].to_bits()) {
                return Err(format!(
                    "row {r}, column {c}: {} vs layer_norm_row {}",
                    got[r * h + c],
                    want[k][c]
                ));
            }
        }
        Ok(())
    };
    let (t, checked) = timed(backend, &plan, &bindings, iters, check)?;
    let ok = report(
        &format!("layer_norm {rows}x{h}"),
        &format!("{} rows, bitwise", at.len()),
        &checked,
    );
    let rate = gbps(8.0 * (rows * h) as f64, t);
    println!(
        "RESULT layer_norm(x + bias) {rows}x{h} f32: {:.3} ms, {rate:.1} GB/s (x read, out \
         written), {:.2} of the copy kernel",
        t * 1e3,
        rate / copy_rate
    );
    Ok(ok)
}

/// Memory a bench lends to a job: host vectors on the emulator, cudarc slices on a GPU.
trait Lender {
    /// A lent buffer.
    type Buf;
    /// A buffer holding `data`.
    fn alloc(&self, data: &[f32]) -> Result<Self::Buf, RuntimeError>;
    /// The buffer, lent.
    fn lend<'a>(&self, b: &'a mut Self::Buf) -> DeviceSlice<'a>;
    /// The buffer's contents (after the work queued on it).
    fn read(&self, b: &Self::Buf) -> Result<Vec<f32>, RuntimeError>;
}

/// A job that runs on lent memory (`run_after`) and waits for a run's event.
trait LentJob: DeviceData {
    /// Queues `k` runs on `lent()` and waits for the last.
    fn runs(
        &mut self,
        k: usize,
        lent: &mut dyn FnMut() -> Lent<'static>,
    ) -> Result<(), RuntimeError>;
    /// Replays the runs' launches as one CUDA graph from now on.
    fn graph(&mut self) -> Result<(), RuntimeError>;
}

impl LentJob for EmulatedJob {
    fn runs(
        &mut self,
        k: usize,
        lent: &mut dyn FnMut() -> Lent<'static>,
    ) -> Result<(), RuntimeError> {
        for _ in 0..k {
            let done = self.run_after(&lent(), None)?;
            self.wait(&done)?;
        }
        Ok(())
    }
    fn graph(&mut self) -> Result<(), RuntimeError> {
        self.use_graph(true);
        Ok(())
    }
}

/// Host vectors standing for device memory (the emulator).
struct HostLender;

impl Lender for HostLender {
    type Buf = Vec<f32>;
    fn alloc(&self, data: &[f32]) -> Result<Vec<f32>, RuntimeError> {
        Ok(data.to_vec())
    }
    fn lend<'a>(&self, b: &'a mut Vec<f32>) -> DeviceSlice<'a> {
        DeviceSlice::host(b)
    }
    fn read(&self, b: &Vec<f32>) -> Result<Vec<f32>, RuntimeError> {
        Ok(b.clone())
    }
}

mod gpu {
    use super::*;
    use coconet::runtime::cuda::{CudaJob, cudarc};
    use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
    use std::sync::Arc;

    fn cuda(e: impl std::fmt::Display) -> RuntimeError {
        RuntimeError::Device(format!("CUDA: {e}"))
    }

    /// cudarc slices on GPU 0, on a stream of the caller's (as a framework's tensors).
    pub(crate) struct GpuLender {
        stream: Arc<CudaStream>,
    }

    impl GpuLender {
        pub(crate) fn new() -> Result<GpuLender, RuntimeError> {
            let ctx = CudaContext::new(0).map_err(cuda)?;
            Ok(GpuLender {
                stream: ctx.new_stream().map_err(cuda)?,
            })
        }
    }

    impl Lender for GpuLender {
        type Buf = CudaSlice<f32>;
        fn alloc(&self, data: &[f32]) -> Result<CudaSlice<f32>, RuntimeError> {
            if data.is_empty() {
                return self.stream.alloc_zeros(0).map_err(cuda);
            }
            self.stream.clone_htod(data).map_err(cuda)
        }
        fn lend<'a>(&self, b: &'a mut CudaSlice<f32>) -> DeviceSlice<'a> {
            DeviceSlice::cuda(b)
        }
        fn read(&self, b: &CudaSlice<f32>) -> Result<Vec<f32>, RuntimeError> {
            self.stream.clone_dtoh(b).map_err(cuda)
        }
    }

    impl LentJob for CudaJob {
        fn runs(
            &mut self,
            k: usize,
            lent: &mut dyn FnMut() -> Lent<'static>,
        ) -> Result<(), RuntimeError> {
            let mut last = None;
            for _ in 0..k {
                last = Some(self.run_after(&lent(), None)?);
            }
            match last {
                Some(e) => self.wait(&e),
                None => Ok(()),
            }
        }
        fn graph(&mut self) -> Result<(), RuntimeError> {
            self.use_graph(true);
            Ok(())
        }
    }
}

/// GPT-2 small's parameter tensors (tied embedding): 148 tensors, 124,439,808 elements.
fn gpt2_small() -> Vec<usize> {
    let (d, layers, vocab, ctx) = (768, 12, 50257, 1024);
    let mut sizes = vec![vocab * d, ctx * d];
    for _ in 0..layers {
        sizes.extend([
            d,
            d,
            d * 3 * d,
            3 * d,
            d * d,
            d,
            d,
            d,
            d * 4 * d,
            4 * d,
            4 * d * d,
            d,
        ]);
    }
    sizes.extend([d, d]);
    sizes
}

/// AdamW over parameter tensors of `sizes` lent by `lender` as pieces (one piece where
/// there is one tensor) at P = 1: checked bitwise against the job's own contiguous
/// buffers, then timed (median of rounds of `iters` queued steps).
fn lent_adamw<B: Backend, L: Lender>(
    backend: &B,
    lender: &L,
    what: &str,
    sizes: &[usize],
    iters: usize,
    copy_rate: f64,
) -> Result<bool, RuntimeError>
where
    B::Job: LentJob,
{
    let n: usize = sizes.iter().sum();
    let p = coconet::programs::adamw();
    let (grads, w, m, v) = optimizer_data(40, 1, n);
    let bindings = adamw_bindings(n, &grads, &w, (&m, &v));
    drop((m, v));
    let s = candidates(p.program(), &[p.m.id(), p.v.id()])
        .into_iter()
        .find(|s| s.name() == "fuse(RS-C-AG)")
        .unwrap_or_else(|| Schedule::new(p.program()));
    let plan = Plan::lower(&s, 1, bindings.dims())?;
    // The contiguous step: the job's own buffers.
    let mut whole = backend.prepare(&plan, &bindings)?;
    backend.run(&mut whole)?;
    let wid = plan.tensor_input("w")?;
    let mut want = vec![0.0f32; n];
    whole.read(wid, 0, &mut want)?;
    let t = Instant::now();
    for _ in 0..iters {
        backend.run(&mut whole)?;
    }
    let contiguous = t.elapsed().as_secs_f64() / iters as f64;
    drop(whole);
    // The lent step.
    let cut = |x: &[f32]| -> Vec<Vec<f32>> {
        let mut at = 0;
        sizes
            .iter()
            .map(|&k| {
                at += k;
                x[at - k..at].to_vec()
            })
            .collect()
    };
    let alloc = |x: &[f32]| {
        cut(x)
            .iter()
            .map(|x| lender.alloc(x))
            .collect::<Result<Vec<_>, _>>()
    };
    // One job launching one by one, one replaying a CUDA graph: each its own weights,
    // the same gradients.
    let (mut w_plain, mut w_graph, mut g_lent) = (alloc(&w)?, alloc(&w)?, alloc(&grads[0])?);
    drop((grads, w));
    let mut plain = backend.prepare(&plan, &bindings)?;
    let mut graph = backend.prepare(&plan, &bindings)?;
    graph.graph()?;
    drop(bindings);
    // SAFETY (of the 'static below): the slices outlive every run (`runs` waits for the
    // last one) and are not touched by anything else meanwhile.
    let gp = &mut g_lent as *mut Vec<L::Buf>;
    let lend = |w: *mut Vec<L::Buf>| {
        move || -> Lent<'static> {
            let (w, g) = unsafe { (&mut *w, &mut *gp) };
            Lent::new()
                .pieces(
                    "w",
                    0,
                    w.iter_mut().map(|b| lender.lend(b)).map(forever).collect(),
                )
                .pieces(
                    "g",
                    0,
                    g.iter_mut().map(|b| lender.lend(b)).map(forever).collect(),
                )
        }
    };
    let mut lent_plain = lend(&mut w_plain as *mut Vec<L::Buf>);
    let mut lent_graph = lend(&mut w_graph as *mut Vec<L::Buf>);
    let mut ok = true;
    for (job, lent, w_lent, how) in [
        (
            &mut plain,
            &mut lent_plain as &mut dyn FnMut() -> Lent<'static>,
            &w_plain,
            "",
        ),
        (&mut graph, &mut lent_graph, &w_graph, " as a CUDA graph"),
    ] {
        job.runs(1, lent)?;
        let checked = bitwise(lender, w_lent, &want)?;
        ok &= report(
            &format!("adamw lent {what}{how}"),
            &format!("all {n} elements, bitwise the contiguous step"),
            &checked,
        );
        job.runs(3, lent)?;
    }
    // Rounds of each, interleaved.
    let (mut t_plain, mut t_graph) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        for (job, lent, times) in [
            (
                &mut plain,
                &mut lent_plain as &mut dyn FnMut() -> Lent<'static>,
                &mut t_plain,
            ),
            (&mut graph, &mut lent_graph, &mut t_graph),
        ] {
            let t = Instant::now();
            job.runs(iters, lent)?;
            times.push(t.elapsed().as_secs_f64() / iters as f64);
        }
    }
    let (t, tg) = (median(t_plain), median(t_graph));
    let (rate, rate_g) = (gbps(28.0 * n as f64, t), gbps(28.0 * n as f64, tg));
    println!(
        "RESULT adamw lent {what} P=1 N={n} in {} tensors: {:.4} ms per step ({:.4} ms on the \
         job's contiguous buffers), {rate:.1} GB/s (28 B/elem), {:.2} of the copy kernel",
        sizes.len(),
        t * 1e3,
        contiguous * 1e3,
        rate / copy_rate
    );
    println!(
        "RESULT adamw lent {what} as a CUDA graph P=1 N={n} in {} tensors: {:.4} ms per \
         step, {rate_g:.1} GB/s (28 B/elem), {:.2} of the copy kernel",
        sizes.len(),
        tg * 1e3,
        rate_g / copy_rate
    );
    Ok(ok)
}

/// AdamW's bindings over `n` elements at P = 1 (the bench's hyper-parameters).
fn adamw_bindings(n: usize, grads: &[Vec<f32>], w: &[f32], (m, v): (&[f32], &[f32])) -> Bindings {
    Bindings::new()
        .dim("N", n)
        .tensor("g", Binding::per_rank(grads))
        .tensor("w", Binding::global(w))
        .tensor("m", Binding::global(m))
        .tensor("v", Binding::global(v))
        .scalar("lr", 1e-3f32)
        .scalar("beta1", 0.9f32)
        .scalar("beta2", 0.999f32)
        .scalar("eps", 1e-8f32)
        .scalar("weight_decay", 0.01f32)
        .scalar("step", 3i32)
}

/// Whether the lent buffers `got` hold `want` bit for bit (the error says where not).
fn bitwise<L: Lender>(
    lender: &L,
    got: &[L::Buf],
    want: &[f32],
) -> Result<Result<(), String>, RuntimeError> {
    let mut all = Vec::with_capacity(want.len());
    for b in got {
        all.extend(lender.read(b)?);
    }
    let n = want.len();
    Ok(
        match all
            .iter()
            .zip(want)
            .position(|(a, b)| a.to_bits() != b.to_bits())
        {
            None if all.len() == n => Ok(()),
            None => Err(format!("{} of {n} elements came back", all.len())),
            Some(i) => Err(format!(
                "w[{i}] = {}, the contiguous step gives {}",
                all[i], want[i]
            )),
        },
    )
}

/// A lent slice's borrow stretched to the bench's own lifetime (see `lent_adamw`).
fn forever(s: DeviceSlice<'_>) -> DeviceSlice<'static> {
    // SAFETY: `lent_adamw` keeps the memory alive and unused by anything else for as
    // long as any run on it is queued.
    unsafe { s.detach() }
}

/// The lent-memory AdamW cases: one big tensor, GPT-2 small's list, 2^16 elements (scaled
/// down on the emulator).
fn lent_cases<B: Backend, L: Lender>(
    backend: &B,
    lender: &L,
    log2n: u32,
    iters: usize,
    copy_rate: f64,
    emulated: bool,
) -> Result<bool, RuntimeError>
where
    B::Job: LentJob,
{
    let list = if emulated {
        (0..148).map(|i| [3, 17, 64, 129, 0, 5][i % 6]).collect()
    } else {
        gpt2_small()
    };
    let mut ok = lent_adamw(
        backend,
        lender,
        &format!("one tensor 2^{log2n}"),
        &[1 << log2n],
        iters,
        copy_rate,
    )?;
    ok &= lent_adamw(
        backend,
        lender,
        "GPT-2 small's tensors",
        &list,
        iters,
        copy_rate,
    )?;
    let small = if emulated { 1 << 10 } else { 1 << 16 };
    ok &= lent_adamw(
        backend,
        lender,
        "2^16 (fixed cost)",
        &[small],
        iters * 10,
        copy_rate,
    )?;
    Ok(ok)
}

fn run<B: Backend>(
    backend: &B,
    log2n: u32,
    ranks: &[usize],
    iters: usize,
    big: bool,
) -> Result<bool, RuntimeError> {
    let n = 1usize << log2n;
    let copy_rate = copy_reference(backend, n, iters)?;
    let mut ok = true;
    for &p in ranks {
        ok &= adam(backend, p, n, iters, copy_rate)?;
    }
    for &p in ranks {
        ok &= lamb(backend, p, n, iters, copy_rate)?;
    }
    ok &= sgd(backend, n, iters, copy_rate)?;
    // Megatron-like rows (h = 4096), 2^26 elements at the default size.
    let h = 4096.min(n);
    ok &= layer_norm(backend, (n / 4 / h).max(1), h, iters, copy_rate)?;
    if big {
        // Past 2^31 elements and not a multiple of 4 (64-bit indices, a scalar tail).
        let n = (1usize << 31) + 4099;
        let copy_rate = copy_reference(backend, n, 3)?;
        ok &= sgd(backend, n, 3, copy_rate)?;
    }
    Ok(ok)
}

/// The copy kernel's bandwidth, then the lent-memory AdamW cases.
fn run_lent<B: Backend, L: Lender>(
    backend: &B,
    lender: &L,
    log2n: u32,
    iters: usize,
    emulated: bool,
) -> Result<bool, RuntimeError>
where
    B::Job: LentJob,
{
    let copy_rate = copy_reference(backend, 1 << log2n, iters)?;
    lent_cases(backend, lender, log2n, iters, copy_rate, emulated)
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Result<T, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{name} needs a value")),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let parsed = (|| -> Result<(u32, Vec<usize>, usize), String> {
        let ranks: String = arg(&args, "--ranks", "1,2,4".to_string())?;
        let ranks = ranks
            .split(',')
            .map(|r| {
                r.trim()
                    .parse()
                    .map_err(|_| format!("bad rank count {r:?}"))
            })
            .collect::<Result<Vec<usize>, _>>()?;
        Ok((
            arg(&args, "--log2n", 28)?,
            ranks,
            arg(&args, "--iters", 20)?,
        ))
    })();
    let (log2n, ranks, iters) = match parsed {
        Ok(p) => p,
        Err(e) => {
            eprintln!("coconet-gpu-bench: {e}");
            std::process::exit(2);
        }
    };
    let big = args.iter().any(|a| a == "--big");
    // `--lent`: only the lent-memory cases (the bring-up's own step for them).
    let lent_only = args.iter().any(|a| a == "--lent");
    let result = if args.iter().any(|a| a == "--emulate") {
        println!("device host emulator (the generated CUDA compiled as C++)");
        let backend = coconet::runtime::cuda::EmulatedCuda;
        if lent_only {
            run_lent(&backend, &HostLender, log2n, iters, true)
        } else {
            run(&backend, log2n, &ranks, iters, big)
                .and_then(|ok| Ok(ok & run_lent(&backend, &HostLender, log2n, iters, true)?))
        }
    } else {
        match coconet::runtime::cuda::Cuda::new(0).and_then(|g| Ok((g, gpu::GpuLender::new()?))) {
            Ok((gpu, lender)) => {
                println!("device GPU 0 (CUDA backend, virtual ranks)");
                if lent_only {
                    run_lent(&gpu, &lender, log2n, iters, false)
                } else {
                    run(&gpu, log2n, &ranks, iters, big)
                        .and_then(|ok| Ok(ok & run_lent(&gpu, &lender, log2n, iters, false)?))
                }
            }
            Err(e) => Err(e),
        }
    };
    match result {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("FAIL: a checked step differs from the plain-Rust reference");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("FAIL: {e}");
            std::process::exit(1);
        }
    }
}
