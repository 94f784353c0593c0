//! Measuring this machine's parameters for the cost model, with micro-programs that
//! isolate one term each (none of them is a shipped program, so validating the model
//! on the shipped programs is not circular).

use super::Machine;
use crate::RuntimeError;
use crate::cpu::{Job, RunOptions};
use crate::plan::Plan;
use coconet_core::{
    BinaryOp, Binding, Bindings, DType, Dim, Layout, ProgramBuilder, ReduceKind, ReduceOp,
    Schedule, Shape, ValueId,
};
use std::time::{Duration, Instant};

/// Measures this machine for CPU rank threads: memory bandwidth (a fused all-reduce out
/// of cache on every core), the last-level cache's size and bandwidth, the cost of a
/// pointwise stage and of a reduced element (in cache), matmul flop/s, and the costs of
/// a barrier and of starting a run (at 2 and 4 ranks). Takes a few seconds. Compute
/// costs are the best of several repetitions (the machine is shared); the bandwidth and
/// the run costs are medians, as the tuner measures programs (their good runs are not
/// what a training loop sees).
pub fn calibrate() -> Result<Machine, RuntimeError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The first few hundred runs of a process are slow (clocks ramping up, pages and
    // threads first touched): warm up for half a second before measuring anything.
    let n = 1 << 15;
    let mut warm = chain(n, 17, true)?;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        warm.run()?;
    }
    // Pointwise stages: 17 stages minus 1 stage over the same data in cache.
    let many = best(|| chain(n, 17, true), 200)?;
    let one = best(|| chain(n, 1, true), 200)?;
    let stage_seconds = ((many - one) / (16.0 * n as f64)).max(1e-12);
    // The same chain in f16: what converting each stage to and from f16 adds.
    let many_half = best(|| chain_of(DType::F16, n, 17, true, 1), 200)?;
    let one_half = best(|| chain_of(DType::F16, n, 1, true, 1), 200)?;
    let half_conversion_seconds =
        (((many_half - one_half) - (many - one)) / (16.0 * n as f64)).max(0.0);
    // Dropout: a fused kernel of one dropout stage minus the one-stage chain, less the
    // stage the model also counts it as.
    let dropout_seconds = ((best(|| dropout(n), 200)? - one) / n as f64 - stage_seconds).max(1e-12);
    // Layer norm: the same for a kernel of one layer norm over rows of 1024, less the
    // stage the model also counts it as.
    let layer_norm_seconds =
        ((best(|| layer_norm(n), 200)? - one) / n as f64 - stage_seconds).max(0.0);
    // A step of its own: 17 one-element kernels minus 1.
    // (The smallest of three attempts: a step is a few microseconds, and one preempted
    // attempt would make every prediction of a many-step plan wrong.)
    let mut step_seconds = f64::MAX;
    for _ in 0..3 {
        let steps = best(|| chain(1, 17, false), 300)?;
        let step = best(|| chain(1, 1, false), 300)?;
        step_seconds = step_seconds.min(((steps - step) / 16.0).max(0.0));
    }
    // A full reduction to one value over data in cache (one source); the collectives'
    // element-wise reductions are measured below, once the rest of the machine is.
    let full_reduce_seconds = (best(|| reduction(n), 200)? / n as f64).max(1e-12);
    // Matmuls, per operand dtype: the cost per operand or result element from an outer
    // product ([n, 1] × [1, n]: n² results, almost no flops), then flop/s of a core from
    // a square product less its elements' cost. (k = 768: its flops take ~7× its
    // elements' time, so the difference is well conditioned; at 384 the two were close
    // and the rate came out above a core's peak.) Both run on every core at once, a
    // product per rank, as a layer's ranks do: here that measured the same rate as one
    // product alone (~290 Gflop/s), but cores that share their multiply units would
    // not, and the model divides a step's flops over the cores.
    let base = best(|| chain(1, 1, true), 300)?;
    let matmul_costs = |dtype: DType| -> Result<(f64, f64), RuntimeError> {
        let n = 512;
        let outer = best(|| matmul((n, 1, n), dtype, cores), 20)?;
        let element = ((outer - base) / (n * n + 2 * n) as f64).max(0.0);
        let k = 768;
        let square = best(|| matmul((k, k, k), dtype, cores), 4)?;
        let flops_time = square - base - (3 * k * k) as f64 * element;
        // (Never more than 99.9 % of the square's time charged to its elements.)
        let rate = 2.0 * (k * k * k) as f64 / flops_time.max(square * 1e-3);
        Ok((rate, element))
    };
    let (flops, matmul_element_seconds) = matmul_costs(DType::F32)?;
    let (half_flops, half_matmul_element_seconds) = matmul_costs(DType::F16)?;
    // A run of a one-element all-reduce (2 barriers) and of two (4 barriers), at 2 and 4
    // ranks, alternated: run + 2·P·b and run + 4·P·b, fitted over both rank counts.
    // (Back to back, a run cost 4 µs at P = 2 and 22 at P = 4; after another job's run,
    // 15 and 38: its ranks had gone to sleep, as they do between a training loop's
    // steps and between the tuner's interleaved contenders.)
    let mut fit = Vec::new();
    for ranks in [2usize, 4] {
        let (one, two) = alternated(
            tiny_all_reduces(ranks, 1)?,
            tiny_all_reduces(ranks, 2)?,
            301,
        )?;
        fit.push((ranks as f64, one, two));
    }
    let barrier_seconds_per_rank = (fit
        .iter()
        .map(|&(p, one, two)| (two - one) / (2.0 * p))
        .sum::<f64>()
        / fit.len() as f64)
        .max(0.0);
    // A run's own cost, r + w·P (waking P ranks): solved from the two rank counts;
    // through the origin (w alone) where that would make r negative (waking ranks
    // beyond the cores costs more than linearly).
    let own: Vec<(f64, f64)> = fit
        .iter()
        .map(|&(p, one, _)| (p, (one - 2.0 * p * barrier_seconds_per_rank).max(0.0)))
        .collect();
    let [(p2, o2), (p4, o4)] = [own[0], own[1]];
    let slope = ((o4 - o2) / (p4 - p2)).max(0.0);
    let (run_seconds, wake_seconds_per_rank) = if o2 - slope * p2 >= 0.0 {
        (o2 - slope * p2, slope)
    } else {
        (0.0, (p2 * o2 + p4 * o4) / (p2 * p2 + p4 * p4))
    };
    let mut machine = Machine {
        name: crate::tune::machine_fingerprint(),
        source: format!(
            "measured by coconet::runtime::model::calibrate on {} (best or median of repeated runs)",
            crate::tune::machine_fingerprint()
        ),
        ranks_per_memory: usize::MAX,
        cache_bytes: last_level_cache_bytes(),
        // Set below, from a kernel streaming through the cache.
        cache_bandwidth: 0.0,
        cores: cores as f64,
        stage_seconds,
        // Set below, from a collective priced with every other parameter.
        reduce_seconds: full_reduce_seconds,
        full_reduce_seconds,
        dropout_seconds,
        layer_norm_seconds,
        half_conversion_seconds,
        flops,
        half_flops: Some(half_flops),
        matmul_element_seconds,
        half_matmul_element_seconds,
        barrier_seconds_per_rank,
        step_seconds,
        run_seconds,
        wake_seconds_per_rank,
        compute_overlaps_memory: false,
        links: None,
        // Set below, from a kernel priced with every other parameter.
        memory_bandwidth: f64::MAX,
    };
    machine.cache_bandwidth = cache_bandwidth(cores, &machine)?;
    machine.reduce_seconds = collective_reduce_seconds(cores, &machine)?;
    machine.memory_bandwidth = stream_bandwidth(cores, &machine)?;
    Ok(machine)
}

/// Bytes per second of memory as the model counts them: the fused all-reduce of
/// [`collective_reduce_seconds`] out of cache (2^23 f32: 32 MiB per rank's gradient and
/// weights), its median run alternated with another job (as the tuner times programs),
/// its bytes over that time less what `others` (every parameter but the bandwidth)
/// charges it, so the model is exact on it. Measured on a collective rather than on
/// `memcpy` or a one-input kernel: the copy this replaced read 44–81 GB/s across runs
/// (one of its threads read the zero page), and a one-stage kernel (`x ← x·z`) gave the
/// model 100–200 GB/s, faster than the programs' kernels, which read a gradient from
/// every rank; the collective gives 94–102 GB/s, what a fit over the optimizers'
/// measured steps gives (98.6 GB/s).
fn stream_bandwidth(cores: usize, others: &Machine) -> Result<f64, RuntimeError> {
    let (plan, args) = fused_all_reduce(cores, 1 << 23)?;
    let job = Job::new(&plan, &args, RunOptions::default())?;
    let (measured, _) = alternated(job, tiny_all_reduces(cores, 1)?, 31)?;
    Ok(bandwidth(&plan, measured, others))
}

/// Seconds per element per source of the collectives' element-wise reductions: a fused
/// all-reduce (`x ← x + all_reduce(g)`, on every core) whose buffers fill at most a
/// quarter of the cache (2^18 f32 here; 2^14 where the cache's size is unknown), timed
/// alternated with another job as the tuner times programs, less what `others` charges
/// it besides its reduction. (A full reduction to one value, a blocked
/// tree in f64, cost 0.42 ns per element here; the collectives' f32 sums across ranks
/// far less: one rate for both over-predicted SGD by 20–40 %.)
fn collective_reduce_seconds(cores: usize, others: &Machine) -> Result<f64, RuntimeError> {
    // x and g on every rank (2 · cores · n f32, and a slot as large): a quarter of the
    // cache at most, where its bytes are priced at the cache's bandwidth.
    let fits = (others.cache_bytes / (4.0 * 12.0 * cores as f64)) as usize;
    let n = if others.cache_bytes > 0.0 {
        fits.clamp(1 << 10, 1 << 18)
    } else {
        1 << 14
    };
    let (plan, args) = fused_all_reduce(cores, n)?;
    let job = Job::new(&plan, &args, RunOptions::default())?;
    let (measured, _) = alternated(job, tiny_all_reduces(cores, 1)?, 201)?;
    // The model is linear in the rate: its prediction without it, and per unit of it.
    let at = |rate: f64| {
        let m = Machine {
            reduce_seconds: rate,
            ..others.clone()
        };
        super::predict(&plan, &m).total.as_secs_f64()
    };
    let rest = at(0.0);
    let per_second = (at(1e-9) - rest) / 1e-9;
    Ok(((measured - rest) / per_second).max(1e-12))
}

/// Bytes per second through the last-level cache as the model counts them: the
/// one-stage chain ([`chain_of`]) on buffers that fill a quarter of the
/// cache (the model's bound for data served from it), median of back-to-back runs, less
/// what `others` charges it besides its bytes. 0 (free) where the cache's size is
/// unknown. A residual: here ~14 µs of an ~88 µs run, so it moved 0.7–1.4 TB/s between
/// runs (it prices only the small runs' bytes); never less than a tenth of the run.
fn cache_bandwidth(cores: usize, others: &Machine) -> Result<f64, RuntimeError> {
    // x and z on every rank: 2 · cores · n f32 = a quarter of the cache.
    let n = (others.cache_bytes / (4.0 * 8.0 * cores as f64)) as usize;
    if n < 1 << 12 {
        return Ok(0.0);
    }
    let mut job = chain_of(DType::F32, n, 1, true, cores)?;
    for _ in 0..5 {
        job.run()?;
    }
    let mut times = Vec::new();
    for _ in 0..101 {
        let start = Instant::now();
        job.run()?;
        times.push(start.elapsed().as_secs_f64());
    }
    let free = Machine {
        cache_bandwidth: 0.0,
        ..others.clone()
    };
    Ok(bandwidth(job.plan(), median(&mut times), &free))
}

/// Bytes per second of `plan`'s memory traffic, measured at `measured` seconds a run:
/// its bytes over what is left of the run once `others` has priced the rest (never
/// less than a tenth of the run: it streams).
fn bandwidth(plan: &Plan, measured: f64, others: &Machine) -> f64 {
    let bytes: f64 = super::demands(plan).iter().map(|d| d.memory_bytes).sum();
    let rest = super::predict(plan, others).total.as_secs_f64();
    bytes / (measured - rest).max(measured * 0.1)
}

/// `x ← x + all_reduce(g)` over `n` f32 on `cores` ranks, fused (reduce-scatter, the
/// addition, all-gather in one pass): its plan and bindings.
fn fused_all_reduce(cores: usize, n: usize) -> Result<(Plan, Bindings), RuntimeError> {
    let mut b = ProgramBuilder::new("reduce");
    let x = vector(&mut b, "x", Layout::Replicated)?;
    let g = vector(&mut b, "g", Layout::Local)?;
    let sum = check(b.all_reduce(ReduceOp::Sum, g))?;
    let y = check(b.binary(BinaryOp::Add, x, sum))?;
    check(b.update(x, y))?;
    let p = b.finish();
    let s = coconet_core::schedule::candidates(&p, &[])
        .into_iter()
        .find(|s| s.name().starts_with("fuse("))
        .ok_or_else(|| RuntimeError::Plan("calibration: no fused all-reduce".into()))?;
    let args = Bindings::new()
        .dim("N", n)
        .tensor("x", Binding::global(&vec![0.0f32; n]))
        .tensor("g", Binding::per_rank(&vec![vec![0.0f32; n]; cores]));
    let plan = Plan::lower(&s, cores, args.dims())?;
    Ok((plan, args))
}

/// The size of the largest cache of CPU 0 (Linux sysfs); 0 where it cannot be read
/// (the model then charges all traffic to memory).
fn last_level_cache_bytes() -> f64 {
    let Ok(entries) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
        return 0.0;
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
        .filter_map(|size| {
            let size = size.trim();
            let (digits, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit())?);
            let scale = match unit {
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                _ => return None,
            };
            Some(digits.parse::<f64>().ok()? * scale as f64)
        })
        .fold(0.0, f64::max)
}

/// The median seconds of a run of `a` and of `b`, over `reps` runs of each, one after
/// the other: each run then wakes ranks that idled through the other job's run, as a
/// training loop's step does after the rest of the iteration (and as the tuner's
/// interleaved rounds measure every schedule).
fn alternated(mut a: Job, mut b: Job, reps: usize) -> Result<(f64, f64), RuntimeError> {
    let (mut ta, mut tb) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        for (job, times) in [(&mut a, &mut ta), (&mut b, &mut tb)] {
            let start = Instant::now();
            job.run()?;
            times.push(start.elapsed().as_secs_f64());
        }
    }
    Ok((median(&mut ta), median(&mut tb)))
}

/// The median of `times` (not empty).
fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The fastest of `reps` runs of the job `make` prepares (seconds per run).
fn best(make: impl Fn() -> Result<Job, RuntimeError>, reps: usize) -> Result<f64, RuntimeError> {
    let mut job = make()?;
    job.run()?;
    let mut fastest = f64::MAX;
    for _ in 0..reps {
        let start = Instant::now();
        job.run()?;
        fastest = fastest.min(start.elapsed().as_secs_f64());
    }
    Ok(fastest)
}

fn vector(b: &mut ProgramBuilder, name: &str, layout: Layout) -> Result<ValueId, RuntimeError> {
    let shape = Shape::new(vec![Dim::sym("N")]);
    b.tensor_input(name, DType::F32, layout, shape, 0)
        .map_err(|e| RuntimeError::Plan(e.to_string()))
}

fn job(b: ProgramBuilder, ranks: usize, args: Bindings) -> Result<Job, RuntimeError> {
    let p = b.finish();
    let plan = Plan::lower(&Schedule::new(&p), ranks, args.dims())?;
    Job::new(&plan, &args, RunOptions::default())
}

fn check<T>(r: Result<T, coconet_core::CheckError>) -> Result<T, RuntimeError> {
    r.map_err(|e| RuntimeError::Plan(e.to_string()))
}

/// `x ← (x + z)·z` repeated over `stages` stages, on one rank: one fused kernel, or a
/// kernel per stage. (Adding first: a lone multiplication by 0.5 run after run would
/// reach denormals, which are far slower.)
fn chain(n: usize, stages: usize, fused: bool) -> Result<Job, RuntimeError> {
    chain_of(DType::F32, n, stages, fused, 1)
}

/// [`chain`] over `dtype` values, on each of `ranks` ranks (its own data on each).
fn chain_of(
    dtype: DType,
    n: usize,
    stages: usize,
    fused: bool,
    ranks: usize,
) -> Result<Job, RuntimeError> {
    let mut b = ProgramBuilder::new("chain");
    let shape = || Shape::new(vec![Dim::sym("N")]);
    let x = check(b.tensor_input("x", dtype, Layout::Local, shape(), 0))?;
    let z = check(b.tensor_input("z", dtype, Layout::Local, shape(), 0))?;
    let mut y = x;
    let mut members = Vec::new();
    for i in 0..stages {
        let op = if i % 2 == 0 {
            BinaryOp::Add
        } else {
            BinaryOp::Mul
        };
        y = check(b.binary(op, y, z))?;
        members.push(y);
    }
    members.push(check(b.update(x, y))?);
    let p = b.finish();
    let mut s = Schedule::new(&p);
    if fused {
        s.fuse(&members)
            .map_err(|e| RuntimeError::Plan(e.to_string()))?;
    }
    let data = |v: f64| Binding::per_rank_as(dtype, &vec![vec![v; n]; ranks]);
    let args = Bindings::new()
        .dim("N", n)
        .tensor("x", data(1.0))
        .tensor("z", data(0.5));
    let plan = Plan::lower(&s, ranks, args.dims())?;
    Job::new(&plan, &args, RunOptions::default())
}

/// `x ← dropout(x·z)` in one kernel, on one rank.
fn dropout(n: usize) -> Result<Job, RuntimeError> {
    let mut b = ProgramBuilder::new("dropout");
    let x = vector(&mut b, "x", Layout::Replicated)?;
    let z = vector(&mut b, "z", Layout::Replicated)?;
    let seed = check(b.scalar_input("seed", DType::I64))?;
    let y = check(b.binary(BinaryOp::Mul, x, z))?;
    let d = check(b.dropout(y, 0.1, seed))?;
    let u = check(b.update(x, d))?;
    let p = b.finish();
    let mut s = Schedule::new(&p);
    s.fuse(&[y, d, u])
        .map_err(|e| RuntimeError::Plan(e.to_string()))?;
    let args = Bindings::new()
        .dim("N", n)
        .scalar("seed", 7i64)
        .tensor("x", Binding::global(&vec![1.0f32; n]))
        .tensor("z", Binding::global(&vec![1.0f32; n]));
    let plan = Plan::lower(&s, 1, args.dims())?;
    Job::new(&plan, &args, RunOptions::default())
}

/// `x ← layer_norm(x·z)` over rows of 1024 (`n` a multiple of it) in one kernel, on one
/// rank.
fn layer_norm(n: usize) -> Result<Job, RuntimeError> {
    const ROW: usize = 1024;
    let mut b = ProgramBuilder::new("layer_norm");
    let rows = |b: &mut ProgramBuilder, name: &str, shape: Vec<Dim>| {
        check(b.tensor_input(name, DType::F32, Layout::Replicated, Shape::new(shape), 0))
    };
    let x = rows(&mut b, "x", vec![Dim::sym("R"), Dim::sym("H")])?;
    let z = rows(&mut b, "z", vec![Dim::sym("R"), Dim::sym("H")])?;
    let gamma = rows(&mut b, "gamma", vec![Dim::sym("H")])?;
    let beta = rows(&mut b, "beta", vec![Dim::sym("H")])?;
    let y = check(b.binary(BinaryOp::Mul, x, z))?;
    let l = check(b.layer_norm(y, gamma, beta, 1e-5))?;
    let u = check(b.update(x, l))?;
    let p = b.finish();
    let mut s = Schedule::new(&p);
    s.fuse(&[y, l, u])
        .map_err(|e| RuntimeError::Plan(e.to_string()))?;
    let ones = |k: usize| Binding::global(&vec![1.0f32; k]);
    let args = Bindings::new()
        .dim("R", n / ROW)
        .dim("H", ROW)
        .tensor("x", ones(n))
        .tensor("z", ones(n))
        .tensor("gamma", ones(ROW))
        .tensor("beta", Binding::global(&vec![0.0f32; ROW]));
    let plan = Plan::lower(&s, 1, args.dims())?;
    Job::new(&plan, &args, RunOptions::default())
}

/// The sum of `n` elements, on one rank.
fn reduction(n: usize) -> Result<Job, RuntimeError> {
    let mut b = ProgramBuilder::new("reduction");
    let x = vector(&mut b, "x", Layout::Replicated)?;
    let s = check(b.reduce_all(ReduceKind::Sum, x))?;
    check(b.output(s))?;
    job(
        b,
        1,
        Bindings::new()
            .dim("N", n)
            .tensor("x", Binding::global(&vec![1.0f32; n])),
    )
}

/// An `[m, k] × [k, n]` matmul of `dtype` operands on each of `ranks` ranks (Replicated
/// operands: every rank computes the whole product).
fn matmul(
    (m, k, n): (usize, usize, usize),
    dtype: DType,
    ranks: usize,
) -> Result<Job, RuntimeError> {
    let mut b = ProgramBuilder::new("matmul");
    let shape = |r: &str, c: &str| Shape::new(vec![Dim::sym(r), Dim::sym(c)]);
    let x = check(b.tensor_input("a", dtype, Layout::Replicated, shape("M", "K"), 0))?;
    let y = check(b.tensor_input("b", dtype, Layout::Replicated, shape("K", "N"), 0))?;
    let z = check(b.matmul(x, y))?;
    check(b.output(z))?;
    let data = |len: usize| Binding::global_as(dtype, &vec![0.5; len]);
    job(
        b,
        ranks,
        Bindings::new()
            .dim("M", m)
            .dim("K", k)
            .dim("N", n)
            .tensor("a", data(m * k))
            .tensor("b", data(k * n)),
    )
}

/// `count` all-reduces of one element each on `ranks` ranks.
fn tiny_all_reduces(ranks: usize, count: usize) -> Result<Job, RuntimeError> {
    let mut b = ProgramBuilder::new("barriers");
    let mut args = Bindings::new().dim("N", 1);
    for i in 0..count {
        let name = format!("g{i}");
        let g = vector(&mut b, &name, Layout::Local)?;
        let s = check(b.all_reduce(ReduceOp::Sum, g))?;
        check(b.output(s))?;
        args = args.tensor(&name, Binding::per_rank(&vec![vec![1.0f32]; ranks]));
    }
    job(b, ranks, args)
}
