//! Measuring this machine's parameters for the cost model, with micro-programs that
//! isolate one term each (none of them is a shipped program, so validating the model
//! on the shipped programs is not circular).

use super::machine::Machine;
use super::predict::predict;
use coconet_core::{
    BinaryOp, Binding, Bindings, DType, Dim, Layout, ProgramBuilder, ReduceKind, ReduceOp,
    Schedule, Shape, ValueId,
};
use coconet_cpu::{Job, RunOptions};
use coconet_plan::RuntimeError;
use coconet_plan::plan::Plan;
use std::time::{Duration, Instant};

/// Measures this machine for CPU rank threads: memory bandwidth (an all-gather out of
/// cache on every core), the part of the last-level cache a run can count on and its
/// bandwidth, the cost of a pointwise stage and of a reduced element, matmul flop/s,
/// and the costs of a barrier and of starting a run (at 2 and 4 ranks). Takes several
/// seconds. Every time is a median, as the tuner measures programs (their good runs are
/// not what a training loop sees); compute costs are the median of three passes spread
/// over the calibration (a shared machine's speed changes from one second to the next).
pub fn calibrate() -> Result<Machine, RuntimeError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The first few hundred runs of a process are slow (clocks ramping up, pages and
    // threads first touched): warm up for half a second before measuring anything.
    let mut warm = chain(1 << 15, 17, true)?;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        warm.run()?;
    }
    let mut reductions = Reductions::new(cores)?;
    let passes = [(); PASSES].map(|()| {
        reductions.time(31)?;
        compute_costs(cores)
    });
    let passes = passes.into_iter().collect::<Result<Vec<_>, _>>()?;
    let middle = |f: fn(&Compute) -> f64| median(&mut passes.iter().map(f).collect::<Vec<_>>());
    let c = Compute {
        stage: middle(|c| c.stage),
        half_conversion: middle(|c| c.half_conversion),
        dropout: middle(|c| c.dropout),
        layer_norm: middle(|c| c.layer_norm),
        step: middle(|c| c.step),
        full_reduce: middle(|c| c.full_reduce),
        flops: middle(|c| c.flops),
        matmul_element: middle(|c| c.matmul_element),
        half_flops: middle(|c| c.half_flops),
        half_matmul_element: middle(|c| c.half_matmul_element),
    };
    // A run of a one-element all-reduce (2 barriers) and of two (4 barriers), at 2 and 4
    // ranks, alternated: run + 2·P·b and run + 4·P·b, fitted over both rank counts.
    // (Back to back, a run cost 4 µs at P = 2 and 22 at P = 4; after another job's run,
    // 15 and 38: its ranks had gone to sleep, as they do between a training loop's
    // steps and between the tuner's interleaved contenders.)
    let mut fit = Vec::new();
    for ranks in [2usize, 4] {
        let (one, two) = alternated(
            &mut tiny_all_reduces(ranks, 1)?,
            &mut tiny_all_reduces(ranks, 2)?,
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
        name: crate::machine_fingerprint(),
        source: format!(
            "measured by coconet::runtime::model::calibrate on {} (medians of repeated runs)",
            crate::machine_fingerprint()
        ),
        ranks_per_memory: usize::MAX,
        cache_bytes: last_level_cache_bytes(),
        // Set below, from a kernel streaming through the cache.
        cache_bandwidth: 0.0,
        cores: cores as f64,
        stage_seconds: c.stage,
        // Set below, from collectives priced with every other parameter.
        reduce_seconds: c.full_reduce,
        compiled_reduce_seconds: 0.0,
        full_reduce_seconds: c.full_reduce,
        dropout_seconds: c.dropout,
        layer_norm_seconds: c.layer_norm,
        half_conversion_seconds: c.half_conversion,
        flops: c.flops,
        half_flops: Some(c.half_flops),
        matmul_element_seconds: c.matmul_element,
        half_matmul_element_seconds: c.half_matmul_element,
        barrier_seconds_per_rank,
        step_seconds: c.step,
        run_seconds,
        wake_seconds_per_rank,
        compute_overlaps_memory: false,
        links: None,
        // Set below, from a copy priced with every other parameter.
        memory_bandwidth: f64::MAX,
    };
    // Memory first, on a pure copy out of cache; then the cache, whose measured share
    // is bounded by what the run shows; then the reductions, whose runs are priced
    // with both.
    machine.memory_bandwidth = memory_bandwidth(cores, &machine)?;
    (machine.cache_bytes, machine.cache_bandwidth) = cache(cores, &machine)?;
    reductions.time(31)?;
    (machine.reduce_seconds, machine.compiled_reduce_seconds) = reductions.rates(&machine);
    Ok(machine)
}

/// How many times the compute costs are measured, spread over the calibration, each
/// with a third of the runs (the same runs in all as one pass of full length).
const PASSES: usize = 3;

/// The compute costs of one pass of measurements (see [`Machine`] for each).
struct Compute {
    stage: f64,
    half_conversion: f64,
    dropout: f64,
    layer_norm: f64,
    step: f64,
    full_reduce: f64,
    flops: f64,
    matmul_element: f64,
    half_flops: f64,
    half_matmul_element: f64,
}

/// One pass over the compute micro-programs, each timed as the median of its runs.
fn compute_costs(cores: usize) -> Result<Compute, RuntimeError> {
    let n = 1 << 15;
    // Pointwise stages: 17 stages minus 1 stage over the same data in cache.
    let many = typical(|| chain(n, 17, true), 200 / PASSES)?;
    let one = typical(|| chain(n, 1, true), 200 / PASSES)?;
    let stage_seconds = ((many - one) / (16.0 * n as f64)).max(1e-12);
    // The same chain in f16: what converting each stage to and from f16 adds.
    let many_half = typical(|| chain_of(DType::F16, n, 17, true, 1), 200 / PASSES)?;
    let one_half = typical(|| chain_of(DType::F16, n, 1, true, 1), 200 / PASSES)?;
    let half_conversion_seconds =
        (((many_half - one_half) - (many - one)) / (16.0 * n as f64)).max(0.0);
    // Dropout: a fused kernel of one dropout stage minus the one-stage chain, less the
    // stage the model also counts it as.
    let dropout_seconds =
        ((typical(|| dropout(n), 200 / PASSES)? - one) / n as f64 - stage_seconds).max(1e-12);
    // Layer norm: the same for a kernel of one layer norm over rows of 1024, less the
    // stage the model also counts it as.
    let layer_norm_seconds =
        ((typical(|| layer_norm(n), 200 / PASSES)? - one) / n as f64 - stage_seconds).max(0.0);
    // A step of its own: 17 one-element kernels minus 1.
    let steps = typical(|| chain(1, 17, false), 300 / PASSES)?;
    let step = typical(|| chain(1, 1, false), 300 / PASSES)?;
    let step_seconds = ((steps - step) / 16.0).max(0.0);
    // A full reduction to one value over data in cache (one source); the collectives'
    // element-wise reductions are measured below, once the rest of the machine is.
    let full_reduce_seconds = (typical(|| reduction(n), 200 / PASSES)? / n as f64).max(1e-12);
    // Matmuls, per operand dtype: the cost per operand or result element from an outer
    // product ([n, 1] × [1, n]: n² results, almost no flops), then flop/s of a core from
    // a square product less its elements' cost. (k = 768: its flops take ~7× its
    // elements' time, so the difference is well conditioned; at 384 the two were close
    // and the rate came out above a core's peak.) Both run on every core at once, a
    // product per rank, as a layer's ranks do: here that measured the same rate as one
    // product alone (~290 Gflop/s), but cores that share their multiply units would
    // not, and the model divides a step's flops over the cores.
    let base = typical(|| chain(1, 1, true), 300 / PASSES)?;
    let matmul_costs = |dtype: DType| -> Result<(f64, f64), RuntimeError> {
        let n = 512;
        let outer = typical(|| matmul((n, 1, n), dtype, cores), 21 / PASSES)?;
        let element = ((outer - base) / (n * n + 2 * n) as f64).max(0.0);
        let k = 768;
        let square = typical(|| matmul((k, k, k), dtype, cores), 3)?;
        let flops_time = square - base - (3 * k * k) as f64 * element;
        // (Never more than 99.9 % of the square's time charged to its elements.)
        let rate = 2.0 * (k * k * k) as f64 / flops_time.max(square * 1e-3);
        Ok((rate, element))
    };
    let (flops, matmul_element_seconds) = matmul_costs(DType::F32)?;
    let (half_flops, half_matmul_element_seconds) = matmul_costs(DType::F16)?;
    Ok(Compute {
        stage: stage_seconds,
        half_conversion: half_conversion_seconds,
        dropout: dropout_seconds,
        layer_norm: layer_norm_seconds,
        step: step_seconds,
        full_reduce: full_reduce_seconds,
        flops,
        matmul_element: matmul_element_seconds,
        half_flops,
        half_matmul_element: half_matmul_element_seconds,
    })
}

/// Bytes per second of memory as the model counts them: an all-gather (a pure copy:
/// no reduction, no stage to share its time with) whose buffers fill the whole
/// last-level cache at least, its median run alternated with another job (as the tuner
/// times programs), the bandwidth at which the model predicts that time. (This came
/// from a fused all-reduce once: its reduction's rate, measured first in cache, took
/// up part of its time and the bandwidth came out 4–6× too high on a machine whose
/// cached runs are slower than its cache's bandwidth says; copies were then priced far
/// too cheaply.)
fn memory_bandwidth(cores: usize, others: &Machine) -> Result<f64, RuntimeError> {
    let mut job = evicting(cores, others)?;
    let plan = job.plan().clone();
    let (measured, _) = alternated(&mut job, &mut tiny_all_reduces(cores, 1)?, 31)?;
    Ok(fit(
        &plan,
        measured,
        others,
        |m, b| m.memory_bandwidth = b,
        (1e8, 1e14),
    ))
}

/// The part of the last-level cache the model may count on, and the bytes per second
/// the cores move through it: a chain of 8 pointwise stages, a kernel each ([`chain_of`],
/// unfused: each stage's result goes through a buffer to the next) on buffers filling
/// a quarter of the cache, then of half of it, down to 256 KiB, each run's median
/// alternated with a twin of the same size — as the tuner times contenders of one
/// size, one after the other. Each size `s` proposes a cache of `4s` whose bandwidth
/// makes the model exact on the run at `s` (which it serves wholly from the cache);
/// the proposal (or no cache at all) that predicts all the runs best, in squared log
/// error, is kept. (A threshold — the largest size running 1.2× memory — flipped between
/// 10 and 150 MiB from one calibration to the next on a machine whose cache runs
/// barely faster than its memory. Timed back to back, a one-stage kernel found 57–100
/// GB/s in a cache of 300 MiB on a machine whose programs' steps, timed alternated,
/// moved 20–30 GB/s at every size; alternated with a 300 MiB copy, as a training
/// step's other work would leave it, it found no cache at all, and the model
/// over-predicted every small run by 45–80 %.)
fn cache(cores: usize, others: &Machine) -> Result<(f64, f64), RuntimeError> {
    const STAGES: usize = 8;
    let chain = |n| chain_of(DType::F32, n, STAGES, false, cores);
    let mut jobs = Vec::new();
    let mut size = others.cache_bytes;
    while size >= (1 << 20) as f64 {
        let n = elements_for(size / 4.0, cores, chain)?;
        jobs.push((size, chain(n)?, chain(n)?, Vec::new()));
        size /= 2.0;
    }
    // Round by round over every size, so that each size's median samples the machine's
    // slow and fast spells alike.
    for _ in 0..31 {
        for (_, job, twin, times) in &mut jobs {
            times.push(timed(job)?);
            twin.run()?;
        }
    }
    let runs: Vec<_> = jobs
        .into_iter()
        .map(|(size, job, _, mut times)| (size, job.plan().clone(), median(&mut times)))
        .collect();
    let error = |cache: (f64, f64)| {
        let m = Machine {
            cache_bytes: cache.0,
            cache_bandwidth: cache.1,
            ..others.clone()
        };
        runs.iter()
            .map(|(_, plan, t)| (predict(plan, &m).total.as_secs_f64() / t).ln().powi(2))
            .sum::<f64>()
    };
    let proposals = runs.iter().map(|(size, plan, measured)| {
        let cached = Machine {
            cache_bytes: *size,
            ..others.clone()
        };
        let set = |m: &mut Machine, b: f64| m.cache_bandwidth = b;
        (*size, fit(plan, *measured, &cached, set, (1e8, 1e15)))
    });
    // (A cache no faster than memory is none: its runs were slowed by something else.)
    let proposals = proposals.filter(|&(_, bandwidth)| bandwidth > others.memory_bandwidth);
    Ok(std::iter::once((0.0, 0.0))
        .chain(proposals)
        .map(|c| (error(c), c))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map_or((0.0, 0.0), |(_, c)| c))
}

/// The runs that price the two reduction rates, timed a little in every pass of the
/// calibration (timed at once, the compiled rate moved between 1.5 and 2.6 ns from one
/// calibration to the next: its runs took 15 ms, all in one of the machine's fast or
/// slow spells) and fitted once the memory and the cache are known.
struct Reductions {
    /// `reduce_scatter(g)` on every core, and its twin.
    collective: (Job, Job),
    /// `x ← x + all_reduce(g)`, fused, on every core, and its twin.
    compiled: (Job, Job),
    /// Seconds of each timed run of the two.
    times: (Vec<f64>, Vec<f64>),
}

impl Reductions {
    /// Both programs over [`REDUCTION_ELEMENTS`].
    fn new(cores: usize) -> Result<Reductions, RuntimeError> {
        let n = REDUCTION_ELEMENTS;
        let (plan, args) = fused_all_reduce(cores, n)?;
        let compiled = || Job::new(&plan, &args, RunOptions::default());
        Ok(Reductions {
            collective: (reduce_scatter(cores, n)?, reduce_scatter(cores, n)?),
            compiled: (compiled()?, compiled()?),
            times: (Vec::new(), Vec::new()),
        })
    }

    /// `reps` more runs of each, each alternated with its twin (as the tuner times
    /// contenders of one size).
    fn time(&mut self, reps: usize) -> Result<(), RuntimeError> {
        for _ in 0..reps {
            for ((job, twin), times) in [
                (&mut self.collective, &mut self.times.0),
                (&mut self.compiled, &mut self.times.1),
            ] {
                times.push(timed(job)?);
                twin.run()?;
            }
        }
        Ok(())
    }

    /// Seconds per element per source of the collectives' element-wise reductions, and
    /// seconds per element of the sum a fused all-reduce's compiled kernel computes in
    /// its loop: the rates at which the model predicts the median runs. They differ:
    /// the kernel sums each element's sources in f64 in rank order, one element at a
    /// time, reading every peer's block, where a collective sums whole blocks of one
    /// source at a time. (A full reduction to one value, a blocked tree in f64, costs
    /// more per element again: one rate for all over-predicted SGD by 20–40 %.)
    fn rates(&mut self, others: &Machine) -> (f64, f64) {
        let collective = fit(
            self.collective.0.plan(),
            median(&mut self.times.0),
            others,
            |m, r| m.reduce_seconds = r,
            (1e-13, 1e-6),
        );
        let compiled = fit(
            self.compiled.0.plan(),
            median(&mut self.times.1),
            &Machine {
                reduce_seconds: collective,
                ..others.clone()
            },
            |m, r| m.compiled_reduce_seconds = r,
            (1e-13, 1e-6),
        );
        (collective, compiled)
    }
}

/// An all-gather whose buffers fill the whole last-level cache (64 MiB at least): a
/// pure copy that no cache can serve.
fn evicting(cores: usize, machine: &Machine) -> Result<Job, RuntimeError> {
    let bytes = machine.cache_bytes.max(64.0 * (1 << 20) as f64);
    all_gather(cores, elements_for(bytes, cores, |n| all_gather(cores, n))?)
}

/// Elements of the reductions' calibration runs: 1 MiB of f32 a rank. (Sized to a
/// quarter of the cache found, they moved between 2^14 and 2^18 from one calibration to
/// the next, and the compiled rate with them by 2×: small runs pay their fixed costs.)
const REDUCTION_ELEMENTS: usize = 1 << 18;

/// The elements `n` (a multiple of 1024 × `cores`, from 2^10 to 2^26) at which the
/// program `make(n)` makes has buffers of about `bytes`: footprints grow linearly in
/// `n`, so one small probe tells.
fn elements_for(
    bytes: f64,
    cores: usize,
    make: impl Fn(usize) -> Result<Job, RuntimeError>,
) -> Result<usize, RuntimeError> {
    let step = 1024 * cores;
    let per_element = super::traffic::footprint(make(step)?.plan()) / step as f64;
    let n = (bytes / per_element.max(1.0)) as usize / step * step;
    Ok(n.clamp(1 << 10, 1 << 26))
}

/// The model's value of the parameter `set` writes at which it predicts `measured`
/// seconds for `plan`, between `lo` and `hi` (the nearer end where no value in
/// between does): the prediction is monotonic in every parameter, so a bisection on
/// its logarithm finds it. The model is then exact on the calibration run, whether the
/// parameter's term adds to the others or overlaps them.
fn fit(
    plan: &Plan,
    measured: f64,
    others: &Machine,
    set: impl Fn(&mut Machine, f64),
    (lo, hi): (f64, f64),
) -> f64 {
    let at = |x: f64| {
        let mut m = others.clone();
        set(&mut m, x);
        predict(plan, &m).total.as_secs_f64()
    };
    let rising = at(hi) > at(lo);
    let (mut lo, mut hi) = (lo.ln(), hi.ln());
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        // Too slow a prediction: move the parameter toward cheaper.
        if (at(mid.exp()) > measured) == rising {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    (0.5 * (lo + hi)).exp()
}

/// An all-gather of `x` (Sliced over `n` f32) on `cores` ranks, the whole of it an
/// output on every rank.
fn all_gather(cores: usize, n: usize) -> Result<Job, RuntimeError> {
    let mut b = ProgramBuilder::new("gather");
    let x = vector(&mut b, "x", Layout::Sliced(0))?;
    let y = check(b.all_gather(x))?;
    check(b.output(y))?;
    let args = Bindings::new()
        .dim("N", n)
        .tensor("x", Binding::global(&vec![0.5f32; n]));
    job(b, cores, args)
}

/// `reduce_scatter(g)` (Local, `n` f32) on `cores` ranks, each rank's block an output.
fn reduce_scatter(cores: usize, n: usize) -> Result<Job, RuntimeError> {
    let mut b = ProgramBuilder::new("reduce_scatter");
    let g = vector(&mut b, "g", Layout::Local)?;
    let s = check(b.reduce_scatter(ReduceOp::Sum, g, 0))?;
    check(b.output(s))?;
    job(
        b,
        cores,
        Bindings::new()
            .dim("N", n)
            .tensor("g", Binding::per_rank(&vec![vec![0.5f32; n]; cores])),
    )
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
fn alternated(a: &mut Job, b: &mut Job, reps: usize) -> Result<(f64, f64), RuntimeError> {
    let (mut ta, mut tb) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        ta.push(timed(a)?);
        tb.push(timed(b)?);
    }
    Ok((median(&mut ta), median(&mut tb)))
}

/// Seconds of one run of `job`.
fn timed(job: &mut Job) -> Result<f64, RuntimeError> {
    let start = Instant::now();
    job.run()?;
    Ok(start.elapsed().as_secs_f64())
}

/// The median of `times` (not empty).
fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The median of `reps` runs of the job `make` prepares (seconds per run), as the
/// tuner measures programs. (The fastest run, which this took once, priced every
/// compute cost at the machine's best moments: on a virtual machine whose cores ran
/// 1.45× slower for about a second in four, each at its own times, the programs'
/// medians were then 20–40 % above the predictions.)
fn typical(make: impl Fn() -> Result<Job, RuntimeError>, reps: usize) -> Result<f64, RuntimeError> {
    let mut job = make()?;
    job.run()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        times.push(timed(&mut job)?);
    }
    Ok(median(&mut times))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine with every parameter known: a shipped preset, its links left out so that
    /// the plans below run on memory and compute alone, slowed so that their times are
    /// long against the nanoseconds a prediction is counted in.
    fn known() -> Machine {
        Machine {
            links: None,
            memory_bandwidth: 1e10,
            reduce_seconds: 1e-9,
            ..Machine::preset("dgx-h100").unwrap()
        }
    }

    /// `fit` finds the value a parameter had when the model predicted a time, whether
    /// the parameter's term adds to the others (a reduce-scatter's reductions) or is the
    /// whole of it (an all-gather's copy), and the nearer end of its range where no
    /// value in it predicts the time.
    #[test]
    fn fit_recovers_the_parameter_behind_a_prediction() {
        let machine = known();
        let gather = all_gather(2, 1 << 20).unwrap().plan().clone();
        let scatter = reduce_scatter(2, 1 << 20).unwrap().plan().clone();
        let time = |plan: &Plan| {
            crate::model::predict::predict(plan, &machine)
                .total
                .as_secs_f64()
        };
        let bandwidth = |m: &mut Machine, b: f64| m.memory_bandwidth = b;
        let got = fit(&gather, time(&gather), &machine, bandwidth, (1e8, 1e14));
        let want = machine.memory_bandwidth;
        assert!((got / want - 1.0).abs() < 1e-5, "{got} B/s, was {want}");
        let reduce = |m: &mut Machine, r: f64| m.reduce_seconds = r;
        let got = fit(&scatter, time(&scatter), &machine, reduce, (1e-13, 1e-6));
        let want = machine.reduce_seconds;
        assert!((got / want - 1.0).abs() < 1e-5, "{got} s, was {want}");
        // Faster than the fastest memory in range, and slower than the slowest.
        let fast = fit(&gather, 1e-12, &machine, bandwidth, (1e8, 1e14));
        assert!((fast / 1e14 - 1.0).abs() < 1e-6, "{fast}");
        let slow = fit(&gather, 1e3, &machine, bandwidth, (1e8, 1e14));
        assert!((slow / 1e8 - 1.0).abs() < 1e-6, "{slow}");
    }

    /// `elements_for` sizes a program to a footprint: within one step of the rounding,
    /// and clamped to its range.
    #[test]
    fn elements_for_sizes_a_program_to_a_footprint() {
        let cores = 2;
        let make = |n| all_gather(cores, n);
        let n = elements_for(64.0 * (1 << 20) as f64, cores, make).unwrap();
        assert_eq!(n % (1024 * cores), 0);
        let bytes_at = |n| crate::model::traffic::footprint(make(n).unwrap().plan());
        let bytes = bytes_at(n);
        let step = bytes_at(n + 1024 * cores) - bytes;
        assert!(
            bytes <= 64.0 * (1 << 20) as f64 && bytes + step > 64.0 * (1 << 20) as f64,
            "{n} elements: {bytes} bytes"
        );
        assert_eq!(elements_for(1.0, cores, make).unwrap(), 1 << 10);
    }
}
