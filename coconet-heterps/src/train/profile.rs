//! Profiles CTR-DNN layer by layer on this machine, for the planner.
//!
//! A *resource type* here is a worker with a given number of threads (a rayon pool of
//! that size runs its candle kernels): the only difference between kinds of worker one
//! CPU machine really has. For each type, each layer's forward + backward on one batch
//! is timed on its own (median of repeats after a warm-up), exactly as a pipeline stage
//! of that one layer runs it ([`CtrDnn::stage_forward`], [`CtrDnn::stage_backward`]):
//! the embedding pulls and pushes the batch's rows, a fully connected layer takes an
//! input of its shape (its ReLU included; the last one with the softmax cross-entropy). The result is written as a model TOML the planner reads.
//!
//! Layers are timed twice: *alone* (one worker of the type) and *loaded* (as many
//! workers of the type as the machine's cores hold, `cores / threads`, running the same
//! passes at once, each on its own pool; the median of their times). A planner's units
//! are independent machines; workers on one machine are not — on this CI machine two
//! single-thread workers each run a GEMM 2.6–3× slower than one alone (its two vCPUs
//! share their vector units). The model gets both (`time` and `time_loaded`) and the
//! catalogue a host with the machine's cores, so the cost model prices each plan at the
//! load it makes (see [`coconet_hetero::cost`]).

use super::ctr_dnn::{CtrDnn, CtrDnnConfig, StageInput};
use super::error::TrainError;
use crate::data::{Batch, DENSE_FEATURES, ParamServer, SPARSE_SLOTS};
use candle_core::{Device, Tensor};
use std::fmt::Write as _;
use std::time::Instant;

/// One layer's measured profile.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerProfile {
    /// Layer name (`embedding`, `fc1`, ...).
    pub name: String,
    /// The planner's layer kind (`embedding` or `fc`).
    pub kind: &'static str,
    /// Seconds per batch (forward + backward), one per thread count profiled, one
    /// worker alone.
    pub seconds: Vec<f64>,
    /// The same with the machine full of workers of that thread count; `None` where one
    /// worker already takes every core.
    pub seconds_loaded: Vec<Option<f64>>,
    /// Bytes of the layer's output per batch.
    pub activation_bytes: f64,
    /// Bytes of its dense parameters.
    pub dense_param_bytes: f64,
    /// Bytes of its embedding table (in the parameter server).
    pub sparse_param_bytes: f64,
}

/// The name of the resource type "a worker with `threads` threads".
pub fn type_name(threads: usize) -> String {
    format!("cpu-{threads}t")
}

/// Runs `f` with candle's kernels on a pool of `threads` threads.
pub fn with_threads<T: Send>(
    threads: usize,
    f: impl FnOnce() -> T + Send,
) -> Result<T, TrainError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| candle_core::Error::Msg(format!("cannot start {threads} threads: {e}")))?;
    Ok(pool.install(f))
}

/// The median of `repeats` timings of `f` after `warmup` untimed calls.
fn median_seconds(
    warmup: usize,
    repeats: usize,
    mut f: impl FnMut() -> Result<(), TrainError>,
) -> Result<f64, TrainError> {
    for _ in 0..warmup {
        f()?;
    }
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Forward + backward of layer `layer` alone, as a pipeline stage of that one layer runs
/// it: the embedding on `batch` (its rows pulled, and pushed back with a zero gradient so
/// the table does not drift while profiling), a fully connected layer on `x`; the
/// gradient that comes back is ones, or the loss's on the last layer.
fn layer_step(
    model: &CtrDnn,
    ps: &ParamServer,
    layer: usize,
    batch: &Batch,
    x: Option<&Tensor>,
) -> Result<(), TrainError> {
    let input = match x {
        Some(x) => StageInput::Activation(x.clone()),
        None => StageInput::Batch(batch),
    };
    let forward = model.stage_forward(ps, layer, layer, input, &batch.labels)?;
    let grad = match forward.loss {
        Some(_) => None,
        None => Some(forward.output.ones_like()?),
    };
    let backward = model.stage_backward(forward, grad.as_ref())?;
    if let Some((keys, g)) = backward.rows {
        ps.push(&keys, &vec![0.0; g.len()])?;
    }
    Ok(())
}

/// Profiles every layer of CTR-DNN (`config`) on `batch` for each thread count in
/// `threads`, alone and with `cores / threads` workers running at once, the embedding
/// against `ps` with a table of `vocabulary` rows.
pub fn profile_ctr_dnn(
    config: &CtrDnnConfig,
    ps: &ParamServer,
    vocabulary: u64,
    batch: &Batch,
    threads: &[usize],
    cores: usize,
    repeats: usize,
) -> Result<Vec<LayerProfile>, TrainError> {
    let n = batch.len();
    let dev = Device::Cpu;
    let embedded = SPARSE_SLOTS * config.dim + DENSE_FEATURES;
    let mut layers = vec![LayerProfile {
        name: "embedding".into(),
        kind: "embedding",
        seconds: Vec::new(),
        seconds_loaded: Vec::new(),
        activation_bytes: (n * embedded * 4) as f64,
        dense_param_bytes: 0.0,
        sparse_param_bytes: (vocabulary as usize * config.dim * 4) as f64,
    }];
    let mut widths = vec![embedded];
    widths.extend(&config.hidden);
    widths.push(2);
    for (i, w) in widths.windows(2).enumerate() {
        layers.push(LayerProfile {
            name: format!("fc{}", i + 1),
            kind: "fc",
            seconds: Vec::new(),
            seconds_loaded: Vec::new(),
            activation_bytes: (n * w[1] * 4) as f64,
            dense_param_bytes: ((w[0] * w[1] + w[1]) * 4) as f64,
            sparse_param_bytes: 0.0,
        });
    }
    if let Some(t) = threads.iter().find(|&&t| t == 0) {
        return Err(candle_core::Error::Msg(format!(
            "a worker needs at least one thread, not {t}"
        ))
        .into());
    }
    let model = CtrDnn::new(config.clone())?;
    for &t in threads {
        let one_worker = || -> Result<Vec<f64>, TrainError> {
            with_threads(t, || -> Result<Vec<f64>, TrainError> {
                let mut out = vec![median_seconds(2, repeats, || {
                    layer_step(&model, ps, 0, batch, None)
                })?];
                for (i, w) in widths.windows(2).enumerate() {
                    let x = Tensor::randn(0f32, 1.0, (n, w[0]), &dev)?;
                    out.push(median_seconds(2, repeats, || {
                        layer_step(&model, ps, i + 1, batch, Some(&x))
                    })?);
                }
                Ok(out)
            })?
        };
        // Each layer's median over `workers` workers running at once.
        let at_once = |workers: usize| -> Result<Vec<f64>, TrainError> {
            let per_worker: Vec<Vec<f64>> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..workers).map(|_| scope.spawn(one_worker)).collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(
                                candle_core::Error::Msg("a profiling worker panicked".into())
                                    .into(),
                            )
                        })
                    })
                    .collect::<Result<_, _>>()
            })?;
            Ok((0..layers.len())
                .map(|l| {
                    let mut times: Vec<f64> = per_worker.iter().map(|w| w[l]).collect();
                    times.sort_by(f64::total_cmp);
                    times[times.len() / 2]
                })
                .collect())
        };
        let alone = at_once(1)?;
        let full = cores / t;
        let loaded = if full > 1 { Some(at_once(full)?) } else { None };
        for (l, layer) in layers.iter_mut().enumerate() {
            layer.seconds.push(alone[l]);
            layer.seconds_loaded.push(loaded.as_ref().map(|v| v[l]));
        }
    }
    Ok(layers)
}

/// The profile as a model TOML for the planner: `[layers.time]` (alone) and
/// `[layers.time_loaded]` (the machine full) name each thread count's type
/// ([`type_name`]); `header` is written first as comments.
pub fn model_toml(
    name: &str,
    batch: usize,
    threads: &[usize],
    layers: &[LayerProfile],
    header: &str,
) -> String {
    let mut out = String::new();
    for line in header.lines() {
        let _ = writeln!(out, "# {line}");
    }
    let _ = writeln!(out, "name = \"{name}\"\nbatch_size = {batch}");
    for l in layers {
        let _ = writeln!(
            out,
            "\n[[layers]]\nname = \"{}\"\nkind = \"{}\"\nactivation_bytes = {:.0}",
            l.name, l.kind, l.activation_bytes
        );
        if l.dense_param_bytes > 0.0 {
            let _ = writeln!(out, "dense_param_bytes = {:.0}", l.dense_param_bytes);
        }
        if l.sparse_param_bytes > 0.0 {
            let _ = writeln!(out, "sparse_param_bytes = {:.0}", l.sparse_param_bytes);
        }
        let _ = writeln!(
            out,
            "[layers.time]   # measured, seconds per batch (forward + backward)"
        );
        for (t, s) in threads.iter().zip(&l.seconds) {
            let _ = writeln!(out, "{} = {s:.6e}", type_name(*t));
        }
        if l.seconds_loaded.iter().any(Option::is_some) {
            let _ = writeln!(
                out,
                "[layers.time_loaded]   # measured, every core of the machine busy"
            );
            for (t, s) in threads.iter().zip(&l.seconds_loaded) {
                if let Some(s) = s {
                    let _ = writeln!(out, "{} = {s:.6e}", type_name(*t));
                }
            }
        }
    }
    out
}

/// `[[hosts]]` for a catalogue of this machine's thread-count types: one host with
/// `cores` cores, a unit of `cpu-Tt` taking T of them (all of them when T is more). A
/// machine of more than [`coconet_hetero::catalog::MAX_HOST_CORES`] cores is written as that many
/// (plans then use at most that many of its cores), so the catalogue always loads.
pub fn host_toml(cores: usize, threads: &[usize]) -> String {
    let cores = cores.min(coconet_hetero::catalog::MAX_HOST_CORES as usize);
    let mut out =
        format!("\n[[hosts]]\nname = \"this machine\"\ncores = {cores}\n[hosts.threads]\n");
    for &t in threads {
        let _ = writeln!(out, "{} = {}", type_name(t), t.min(cores));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use coconet_hetero::catalog::{Catalog, MAX_HOST_CORES};

    /// The host written for a machine of any size loads, larger ones as the most cores a
    /// host may have; a unit of more threads than the machine takes all of it.
    #[test]
    fn the_host_of_any_machine_loads() {
        for cores in [2usize, 64, 8192] {
            let mut toml = String::from("default_bandwidth_gbs = 10\n");
            for t in [1usize, 4] {
                toml += &format!(
                    "[[types]]\nname = \"{}\"\nclass = \"cpu\"\nprice_per_hour = 1\nmemory_gib = 8\npeak_tflops = 1\nmem_bandwidth_gbs = 10\nefficiency = 0.5\nlayer_overhead_us = 1\nsync_bandwidth_gbs = 1\n",
                    type_name(t)
                );
            }
            toml += &host_toml(cores, &[1, 4]);
            let catalog = Catalog::parse(std::path::Path::new("host.toml"), &toml)
                .unwrap_or_else(|e| panic!("{cores} cores: {e}"));
            let host = &catalog.hosts[0];
            assert_eq!(host.cores, (cores as u64).min(MAX_HOST_CORES));
            assert_eq!(host.threads, vec![1, 4.min(cores as u64)]);
        }
    }
}
