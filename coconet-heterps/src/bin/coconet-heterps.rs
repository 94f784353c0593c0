//! `coconet-heterps generate|profile|plan|train`: HeterPS's loop on this machine — write
//! synthetic click logs, profile CTR-DNN per kind of worker for the planner, and train
//! with W workers (coconet's fused step for the dense layers, the parameter server for
//! the embeddings), reporting measured against predicted throughput.
//!
//! ```sh
//! coconet-heterps generate --out /tmp/ctr
//! coconet-heterps profile --data /tmp/ctr --model-out /tmp/ctr/model.toml --catalog-out /tmp/ctr/catalog.toml
//! coconet-heterps plan --data /tmp/ctr --model /tmp/ctr/model.toml --catalog /tmp/ctr/catalog.toml --throughput 20000
//! coconet-heterps train --data /tmp/ctr --workers 2 --threads 1 --model /tmp/ctr/model.toml --catalog /tmp/ctr/catalog.toml
//! # One worker per process, the table's shards served by the first two processes:
//! coconet-launch --nproc-per-node 4 -- coconet-heterps train --processes --ps-shards 2 --data /tmp/ctr
//! # A planned multi-stage plan, one process per replica (the plan says how many):
//! coconet-launch --nproc-per-node 3 -- coconet-heterps train --processes --throughput 20000 \
//!     --data /tmp/ctr --model /tmp/ctr/model.toml --catalog /tmp/ctr/catalog.toml
//! ```

use clap::{Parser, Subcommand};
use coconet_hetero::schedulers::{self, SearchConfig};
use coconet_hetero::{Catalog, Constraint, Model, Problem, report};
use coconet_heterps::data::{
    ClickLogFormat, Dataset, GeneratorConfig, Loader, LoaderConfig, ParamServer, ParamServerConfig,
};
use coconet_heterps::train::profile::{host_toml, model_toml, profile_ctr_dnn, type_name};
use coconet_heterps::train::{AdamConfig, CtrDnn, CtrDnnConfig, evaluate};
use coconet_heterps::{CtrDataParallel, CtrPipeline, CtrProcess, StagePlan};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "coconet-heterps",
    version,
    about = "HeterPS on this machine: data, profile, train"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Writes synthetic click logs (Criteo format) from a hidden model.
    Generate {
        /// Directory to write.
        #[arg(long)]
        out: PathBuf,
        /// Training files.
        #[arg(long, default_value_t = 8)]
        files: usize,
        /// Records per training file.
        #[arg(long, default_value_t = 32768)]
        rows: usize,
        /// Distinct values of the largest categorical slot.
        #[arg(long, default_value_t = 2000)]
        cardinality: u64,
        /// Seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Times each layer per kind of worker; writes the model and a local catalogue.
    Profile {
        /// A generated data set (its first batch is profiled).
        #[arg(long)]
        data: PathBuf,
        /// Model TOML to write.
        #[arg(long)]
        model_out: PathBuf,
        /// Catalogue TOML to write (one type per thread count).
        #[arg(long)]
        catalog_out: PathBuf,
        /// Thread counts, one resource type each.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<usize>,
        /// Records per batch.
        #[arg(long, default_value_t = 512)]
        batch: usize,
        /// Timed repetitions per layer (median).
        #[arg(long, default_value_t = 15)]
        repeats: usize,
    },
    /// Plans CTR-DNN on the profiled model and catalogue for a throughput and prints
    /// the plan and its prediction: what `train --throughput` would run.
    Plan {
        /// A generated data set (its size is the job's).
        #[arg(long)]
        data: PathBuf,
        /// The profiled model.
        #[arg(long)]
        model: PathBuf,
        /// The local catalogue written by `profile`.
        #[arg(long)]
        catalog: PathBuf,
        /// Required samples/s.
        #[arg(long)]
        throughput: f64,
        /// Epochs of the job.
        #[arg(long, default_value_t = 1)]
        epochs: u64,
        /// The scheduler (`dp`, the exact one; `cpu-first`, `greedy`, ...).
        #[arg(long, default_value = "dp")]
        scheduler: String,
        /// How the cost model prices the dense step (see `train --sync`).
        #[arg(long, value_enum, default_value_t = SyncPricing::Coconet)]
        sync: SyncPricing,
    },
    /// Trains with W workers and reports throughput, measured and predicted.
    Train {
        /// A generated data set.
        #[arg(long)]
        data: PathBuf,
        /// Data-parallel workers (units of one resource type: a one-stage plan).
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// Threads per worker (the resource type `cpu-{threads}t`); 0: the workers share
        /// the process's thread pool.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Epochs.
        #[arg(long, default_value_t = 1)]
        epochs: u64,
        /// Records per batch per worker.
        #[arg(long, default_value_t = 512)]
        batch: usize,
        /// The profiled model, to predict the throughput (with --catalog).
        #[arg(long)]
        model: Option<PathBuf>,
        /// The local catalogue written by `profile`.
        #[arg(long)]
        catalog: Option<PathBuf>,
        /// Plan for this throughput (samples/s) with the exact DP over --model and
        /// --catalog and run the plan (pipeline stages, each data parallel) instead of
        /// --workers x --threads (the micro-batch is the model's batch size).
        #[arg(long)]
        throughput: Option<f64>,
        /// With --throughput: the scheduler that plans (`dp`, the exact one; `cpu-first`,
        /// Paddle's default split; `greedy`, `genetic`, ...), to run and measure its plan.
        #[arg(long, default_value = "dp")]
        scheduler: String,
        /// With --throughput: micro-batches in flight per step, per replica of the most
        /// replicated stage (the pipeline fills and drains once per step, so more
        /// micro-batches overlap the stages better; the planner assumes full overlap).
        #[arg(long, default_value_t = 8)]
        in_flight: usize,
        /// With --throughput: write a checkpoint here every --checkpoint-every steps and
        /// at the end, and resume from it when it exists (the same plan must be chosen).
        /// With --processes it is a directory every process can reach.
        #[arg(long)]
        checkpoint: Option<PathBuf>,
        /// Steps between checkpoints.
        #[arg(long, default_value_t = 100)]
        checkpoint_every: u64,
        /// Be one worker of a job started by `coconet-launch` (one worker per process:
        /// --workers is the job's size), the table served by --ps-shards of them. With
        /// --throughput: be one replica of the plan's stages (the job needs one process
        /// per replica; process 0 plans and tells the others).
        #[arg(long)]
        processes: bool,
        /// With --processes: how many processes serve a shard of the table.
        #[arg(long, default_value_t = 1)]
        ps_shards: usize,
        /// How the cost model prices the dense step: `coconet` (coconet's schedules of
        /// all-reduce + Adam, the update included: what runs here) or `ring` (the
        /// paper's ring all-reduce, the update free).
        #[arg(long, value_enum, default_value_t = SyncPricing::Coconet)]
        sync: SyncPricing,
    },
}

/// The cost model's synchronisation (`--sync`).
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SyncPricing {
    /// coconet's schedules of the dense step, the optimizer update included.
    Coconet,
    /// The paper's ring all-reduce, the update free.
    Ring,
}

impl SyncPricing {
    /// `problem` with its synchronisation priced this way.
    fn apply(self, problem: Problem) -> Result<Problem> {
        Ok(match self {
            SyncPricing::Coconet => {
                problem.with_sync(coconet_heterps::hetero_sync::coconet_schedules()?)
            }
            SyncPricing::Ring => problem,
        })
    }
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// candle allocates every tensor of every pass afresh; glibc's allocator maps and unmaps
/// the large ones each time, and the page faults made CTR-DNN's forward + backward 1.25×
/// as long (and its layers, profiled one at a time, up to 5× as long as inside a stage).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const FORMAT: ClickLogFormat = ClickLogFormat {
    vocabulary: 1_000_001,
};

fn table() -> Result<ParamServer> {
    Ok(ParamServer::new(ParamServerConfig::default())?)
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Generate {
            out,
            files,
            rows,
            cardinality,
            seed,
        } => {
            let d = Dataset::generate(
                &out,
                &GeneratorConfig {
                    seed,
                    files,
                    rows_per_file: rows,
                    max_cardinality: cardinality,
                    ..GeneratorConfig::default()
                },
            )?;
            println!(
                "{} files x {rows} records in {}; held-out optimum AUC {:.4}, log loss {:.4}",
                files,
                out.display(),
                d.optimal_auc,
                d.optimal_log_loss
            );
            Ok(())
        }
        Command::Plan {
            data,
            model,
            catalog,
            throughput,
            epochs,
            scheduler,
            sync,
        } => {
            let (problem, outcome) = choose(
                &data, &model, &catalog, throughput, epochs, &scheduler, sync,
            )?;
            print!("{}", report::plan_report(&problem, &outcome));
            Ok(())
        }
        Command::Profile {
            data,
            model_out,
            catalog_out,
            threads,
            batch,
            repeats,
        } => profile(&data, &model_out, &catalog_out, &threads, batch, repeats),
        Command::Train {
            data,
            workers: _,
            threads: _,
            epochs,
            batch: _,
            model,
            catalog,
            throughput: Some(x),
            scheduler,
            in_flight,
            checkpoint,
            checkpoint_every,
            processes,
            ps_shards,
            sync,
        } => {
            let (Some(model), Some(catalog)) = (model, catalog) else {
                return Err("--throughput plans over --model and --catalog: give both".into());
            };
            let run = PlanRun {
                throughput: x,
                scheduler,
                epochs,
                in_flight,
                checkpoint,
                checkpoint_every,
                sync,
            };
            if processes {
                return run_plan_processes(&data, &run, &model, &catalog, ps_shards);
            }
            run_plan(&data, &run, &model, &catalog)
        }
        Command::Train {
            data,
            threads,
            epochs,
            batch,
            throughput: None,
            processes: true,
            ps_shards,
            ..
        } => train_processes(&data, threads, epochs, batch, ps_shards),
        Command::Train {
            data,
            workers,
            threads,
            epochs,
            batch,
            model,
            catalog,
            throughput: None,
            sync,
            ..
        } => train(
            &data,
            workers,
            threads,
            epochs,
            batch,
            model.zip(catalog).map(|p| (p, sync)),
        ),
    }
}

fn loader(
    data: &std::path::Path,
    d: &Dataset,
    batch: usize,
    replica: usize,
    replicas: usize,
) -> Result<Loader> {
    Ok(Loader::new(
        d.train_paths(data),
        LoaderConfig {
            batch,
            replica,
            replicas,
            format: FORMAT,
            ..LoaderConfig::default()
        },
    )?)
}

fn profile(
    data: &std::path::Path,
    model_out: &std::path::Path,
    catalog_out: &std::path::Path,
    threads: &[usize],
    batch: usize,
    repeats: usize,
) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let d = Dataset::open(data)?;
    let first = loader(data, &d, batch, 0, 1)?
        .epoch(0)
        .next()
        .ok_or("the data set is empty")??;
    let config = CtrDnnConfig::default();
    let ps = table()?;
    let layers = profile_ctr_dnn(
        &config,
        &ps,
        FORMAT.vocabulary,
        &first,
        threads,
        cores,
        repeats,
    )?;
    for l in &layers {
        let times: Vec<String> = l
            .seconds
            .iter()
            .zip(&l.seconds_loaded)
            .zip(threads)
            .map(|((s, loaded), t)| match loaded {
                Some(f) => format!(
                    "{}: {:.3} ms, full {:.3} ms",
                    type_name(*t),
                    s * 1e3,
                    f * 1e3
                ),
                None => format!("{}: {:.3} ms", type_name(*t), s * 1e3),
            })
            .collect();
        println!("{:>10}: {}", l.name, times.join("; "));
    }
    let header = format!(
        "CTR-DNN (PaddleRec rank/dnn), profiled on this machine ({cores} cores) by `coconet-heterps profile`:\n\
         median of {repeats} forward+backward passes per layer, batch {batch}, one type per\n\
         thread count ({}); `time` with one worker alone, `time_loaded` with cores / threads\n\
         workers of the type running at once.",
        threads
            .iter()
            .map(|&t| type_name(t))
            .collect::<Vec<_>>()
            .join(", "),
    );
    std::fs::write(
        model_out,
        model_toml("ctr-dnn-local", batch, threads, &layers, &header),
    )?;

    // The dense step's speed: coconet's fused Adam step (reduce-scatter, update,
    // all-gather) timed on 1 and 2 workers, as the memory and network bandwidths with
    // which coconet's schedules in the cost model (`--sync coconet`) take that long: the
    // update alone at one worker gives the memory's, then the network's is the one that
    // makes two workers' step take what it took.
    let dense_bytes: f64 = layers.iter().map(|l| l.dense_param_bytes).sum();
    let step_ms = |workers: usize| -> Result<f64> {
        let ps = table()?;
        let mut dp = CtrDataParallel::new(
            CtrDnn::new(config.clone())?,
            &ps,
            workers,
            AdamConfig::default(),
        )?;
        let shards = first.split(workers);
        let steps = repeats.max(3) as u32;
        for _ in 0..steps {
            dp.step(&shards)?;
        }
        let t = dp.dense_times();
        Ok((t.copy_in + t.step + t.copy_out).as_secs_f64() * 1e3 / f64::from(steps))
    };
    let (one_ms, two_ms) = (step_ms(1)?, step_ms(2)?);
    let (mem_gbs, sync_gbs) = calibrate(dense_bytes, one_ms * 1e-3, two_ms * 1e-3)?;
    let mut catalog = format!(
        "# This machine ({cores} cores) as HeterPS resource types, written by `coconet-heterps profile`.\n\
         # A type is a worker with a number of threads; layer times are measured (the model file),\n\
         # so peak_tflops is an unused placeholder.\n\
         # price_per_hour: ASSUMPTION, c6i.8xlarge's price per core ($1.36/h / 16 cores) x threads.\n\
         # mem_bandwidth_gbs, sync_bandwidth_gbs: measured for coconet's schedules of the dense\n\
         # step (`coconet-heterps train --sync coconet`, the default): coconet's fused Adam step\n\
         # took {one_ms:.3} ms on 1 worker and {two_ms:.3} ms on 2 for {dense_bytes:.0} dense bytes.\n\
         # The types share this machine's cores: one host, each unit taking its threads.\n\
         default_bandwidth_gbs = 10.0\n",
    );
    for &th in threads {
        catalog += &format!(
            "\n[[types]]\nname = \"{}\"\nclass = \"cpu\"\nprice_per_hour = {:.4}\nmemory_gib = 16.0\npeak_tflops = 0.1\nmem_bandwidth_gbs = {mem_gbs:.4}\nsync_bandwidth_gbs = {sync_gbs:.4}\n",
            type_name(th),
            1.36 / 16.0 * th as f64,
        );
    }
    catalog += &host_toml(cores, threads);
    std::fs::write(catalog_out, catalog)?;
    println!(
        "dense step: {one_ms:.3} ms on 1 worker, {two_ms:.3} ms on 2 = memory {mem_gbs:.3} GB/s, network {sync_gbs:.3} GB/s for coconet's schedules in the cost model; wrote {} and {}",
        model_out.display(),
        catalog_out.display()
    );
    Ok(())
}

/// The memory and network bandwidths (GB/s) with which coconet's schedules of the dense
/// step take `one` seconds on one worker and `two` on two, for `dense_bytes` of
/// parameters: the cheapest schedule's update traffic alone over `one`; then, by
/// bisection, the network at which the cheapest schedule at two workers takes `two`
/// (capped at 10^4 GB/s when the memory's share alone takes that long).
fn calibrate(dense_bytes: f64, one: f64, two: f64) -> Result<(f64, f64)> {
    let model = coconet_heterps::hetero_sync::coconet_schedules()?;
    let coconet_hetero::SyncModel::Schedules(list) = &model else {
        return Err("coconet's synchronisation model has no schedules".into());
    };
    let alone = list.iter().map(|s| s.alone).fold(f64::INFINITY, f64::min);
    let memory = alone * dense_bytes / one;
    let at = |network: f64| dense_bytes * model.seconds_per_byte(2, memory, network).0;
    let (mut lo, mut hi) = (1e6f64, 1e13f64);
    if at(hi) >= two {
        return Ok((memory / 1e9, hi / 1e9));
    }
    for _ in 0..100 {
        let mid = (lo * hi).sqrt();
        if at(mid) > two {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok((memory / 1e9, hi / 1e9))
}

fn train(
    data: &std::path::Path,
    workers: usize,
    threads: usize,
    epochs: u64,
    batch: usize,
    predict: Option<((PathBuf, PathBuf), SyncPricing)>,
) -> Result<()> {
    let d = Dataset::open(data)?;
    let ps = table()?;
    let mut dp = CtrDataParallel::new(
        CtrDnn::new(CtrDnnConfig::default())?,
        &ps,
        workers,
        AdamConfig::default(),
    )?;
    if threads > 0 {
        dp = dp.with_threads(threads)?;
    }
    let loaders = (0..workers)
        .map(|w| loader(data, &d, batch, w, workers))
        .collect::<Result<Vec<_>>>()?;
    let report = dp.train(&loaders, epochs, None)?;
    let eval = evaluate(dp.model(), &ps, &data.join(&d.heldout), FORMAT)?;
    let measured = report.samples_per_second();
    let dense = dp.dense_times();
    let dense_ms =
        (dense.copy_in + dense.step + dense.copy_out).as_secs_f64() * 1e3 / report.steps as f64;
    let step_ms = report.seconds * 1e3 / report.steps as f64;
    println!(
        "{workers} workers x {} ({} steps, {} samples, {:.2} s): {measured:.0} samples/s; per step {step_ms:.2} ms, of which the dense fused step {dense_ms:.2} ms",
        type_name(threads),
        report.steps,
        report.samples,
        report.seconds
    );
    println!(
        "held-out AUC {:.4} (optimum {:.4}), log loss {:.4} (optimum {:.4})",
        eval.auc, d.optimal_auc, eval.log_loss, d.optimal_log_loss
    );
    if threads == 0 && predict.is_some() {
        println!(
            "no prediction: workers sharing the process's pool are not a planner type (give --threads)"
        );
        return Ok(());
    }
    if let Some(((model, catalog), sync)) = predict {
        let catalog = Catalog::load(&catalog)?;
        let model = Model::load(&model, &catalog)?;
        let name = type_name(threads);
        let ty = catalog.index_of(&name).ok_or_else(|| {
            format!("the catalogue has no type `{name}`: profile with --threads {threads}")
        })?;
        let last = model.layers.len() - 1;
        let k = workers as u64;
        // The load these workers make on the machine's host, at most its cores.
        let loads: Vec<u64> = catalog
            .hosts
            .iter()
            .map(|h| (h.threads[ty] * k).min(h.cores))
            .collect();
        let oversubscribed = catalog.hosts.iter().any(|h| h.threads[ty] * k > h.cores);
        let problem = sync
            .apply(Problem::new(model, catalog, Constraint::new(1.0, 1.0)?))?
            .at_loads(&loads);
        let shape = problem.stage_shape(0, last, ty, None, None);
        let predicted = shape.throughput(k);
        let sync = shape.time(k) - shape.single_unit_time();
        println!(
            "predicted (one stage, {workers} x {name}, host load {loads:?}): {predicted:.0} samples/s = {k} x {} / ({:.2} ms compute + {:.2} ms sync); measured/predicted = {:.2}{}",
            shape.batch,
            shape.compute * 1e3,
            sync * 1e3,
            measured / predicted,
            if oversubscribed {
                " (more threads than the host's cores: the model stops at a full host)"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// This process's worker of a job started by `coconet-launch`; worker 0 evaluates the
/// model on the held-out split (through the remote table) and reports the job.
fn train_processes(
    data: &std::path::Path,
    threads: usize,
    epochs: u64,
    batch: usize,
    shards: usize,
) -> Result<()> {
    if threads > 0 {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global()?;
    }
    let d = Dataset::open(data)?;
    let mut process = CtrProcess::from_env(
        CtrDnn::new(CtrDnnConfig::default())?,
        shards,
        ParamServerConfig::default(),
        AdamConfig::default(),
    )?;
    let (worker, workers) = process.worker();
    let report = process.train(&loader(data, &d, batch, worker, workers)?, epochs)?;
    if worker == 0 {
        let eval = evaluate(
            process.model(),
            process.table(),
            &data.join(&d.heldout),
            FORMAT,
        )?;
        let dense = process.dense_times();
        let ms = |t: std::time::Duration| t.as_secs_f64() * 1e3 / report.steps as f64;
        println!(
            "{workers} worker processes x {} ({shards} serving the table; {} steps, {:.2} s): \
             {:.0} samples/s; per step {:.2} ms, of which the dense fused step {:.2} ms",
            type_name(threads),
            report.steps,
            report.seconds,
            workers as f64 * report.samples_per_second(),
            report.seconds * 1e3 / report.steps as f64,
            ms(dense.copy_in + dense.step + dense.copy_out),
        );
        println!(
            "held-out AUC {:.4} (optimum {:.4}), log loss {:.4} (optimum {:.4})",
            eval.auc, d.optimal_auc, eval.log_loss, d.optimal_log_loss
        );
    }
    process.finish()?;
    Ok(())
}

/// The thread count of a local resource type `cpu-{T}t`.
fn threads_of(name: &str) -> Result<usize> {
    name.strip_prefix("cpu-")
        .and_then(|t| t.strip_suffix('t'))
        .and_then(|t| t.parse().ok())
        .filter(|&t| t > 0)
        .ok_or_else(|| {
            format!("resource type `{name}` is not a local worker kind `cpu-<threads>t`").into()
        })
}

fn lcm(a: usize, b: usize) -> usize {
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    a / gcd(a, b) * b
}

/// The plan `scheduler` makes for `throughput` samples/s over `epochs` of the data set
/// at `data`, on the profiled model and catalogue, the dense step priced by `sync`.
fn choose(
    data: &std::path::Path,
    model: &std::path::Path,
    catalog: &std::path::Path,
    throughput: f64,
    epochs: u64,
    scheduler: &str,
    sync: SyncPricing,
) -> Result<(Problem, schedulers::Outcome)> {
    let d = Dataset::open(data)?;
    let samples = (d.train.len() * d.config.rows_per_file) as f64 * epochs as f64;
    let problem = sync.apply(coconet_hetero::load(
        model,
        catalog,
        Some(Constraint::new(throughput, samples)?),
    )?)?;
    let outcome = schedulers::named(scheduler)?.schedule(&problem, &SearchConfig::default())?;
    Ok((problem, outcome))
}

/// How `train --throughput` runs.
struct PlanRun {
    throughput: f64,
    scheduler: String,
    epochs: u64,
    in_flight: usize,
    checkpoint: Option<PathBuf>,
    checkpoint_every: u64,
    sync: SyncPricing,
}

/// Plans for `throughput` and runs the plan: stages of the planner's types and unit
/// counts, micro-batches of the model's batch size, `in_flight` times the stages'
/// replica counts' least common multiple per step.
fn run_plan(
    data: &std::path::Path,
    run: &PlanRun,
    model_toml: &std::path::Path,
    catalog_toml: &std::path::Path,
) -> Result<()> {
    let d = Dataset::open(data)?;
    let epochs = run.epochs;
    let plan = planned(data, run, model_toml, catalog_toml)?;
    let stages: Vec<StagePlan> = plan.stages.iter().map(|p| p.0).collect();
    let (micro, batch) = (plan.micro, plan.batch);
    let ps = table()?;
    let mut pipe = CtrPipeline::new(
        CtrDnn::new(CtrDnnConfig::default())?,
        &ps,
        &stages,
        micro,
        AdamConfig::default(),
    )?;
    let global = loader(data, &d, batch * micro, 0, 1)?;
    let report = match &run.checkpoint {
        None => pipe.train(&global, epochs, None)?,
        Some(path) => {
            if path.exists() {
                pipe.restore(path)?;
                let p = pipe.progress();
                println!(
                    "resumed from {} at epoch {}, batch {} (step {})",
                    path.display(),
                    p.epoch,
                    p.batch,
                    p.steps
                );
            }
            let mut total = coconet_heterps::train::TrainReport::default();
            loop {
                let part = pipe.train(&global, epochs, Some(run.checkpoint_every.max(1)))?;
                pipe.save(path)?;
                total.steps += part.steps;
                total.samples += part.samples;
                total.seconds += part.seconds;
                total.losses.extend(part.losses);
                if pipe.progress().epoch >= epochs {
                    break total;
                }
            }
        }
    };
    let eval = evaluate(pipe.model(), &ps, &data.join(&d.heldout), FORMAT)?;
    println!(
        "\nran {} steps of {micro} micro-batches x {batch} ({} samples, {:.2} s): {:.0} samples/s measured, {:.0} predicted (measured/predicted {:.2})",
        report.steps,
        report.samples,
        report.seconds,
        report.samples_per_second(),
        plan.predicted,
        report.samples_per_second() / plan.predicted
    );
    for (s, ((st, predicted), busy)) in plan.stages.iter().zip(pipe.stage_seconds()).enumerate() {
        let alone = report.samples as f64 / busy;
        println!(
            "  stage {s} (layers {}..={}, {} x cpu-{}t): busy {:.2} s = {alone:.0} samples/s on its own, predicted {predicted:.0} (ratio {:.2})",
            st.first,
            st.last,
            st.replicas,
            st.threads,
            busy,
            alone / predicted
        );
    }
    println!(
        "held-out AUC {:.4} (optimum {:.4}), log loss {:.4} (optimum {:.4})",
        eval.auc, d.optimal_auc, eval.log_loss, d.optimal_log_loss
    );
    Ok(())
}

/// The plan `run.scheduler` makes for `run.throughput` (its report printed): stages of
/// the planner's types and unit counts, micro-batches of the model's batch size,
/// `run.in_flight` times the stages' replica counts' least common multiple per step.
fn planned(
    data: &std::path::Path,
    run: &PlanRun,
    model_toml: &std::path::Path,
    catalog_toml: &std::path::Path,
) -> Result<SharedPlan> {
    let (problem, outcome) = choose(
        data,
        model_toml,
        catalog_toml,
        run.throughput,
        run.epochs,
        &run.scheduler,
        run.sync,
    )?;
    if problem.has_per_type_batches() {
        return Err(format!(
            "{}: the runner steps every stage with the model's batch ({}); per-type batch sizes ([batch_sizes]) are for planning only",
            model_toml.display(),
            problem.model.batch_size
        )
        .into());
    }
    print!("{}", report::plan_report(&problem, &outcome));
    let mut stages = Vec::new();
    for st in &outcome.evaluation.stages {
        let plan = StagePlan {
            first: st.stage.first,
            last: st.stage.last,
            replicas: usize::try_from(st.units)?,
            threads: threads_of(&problem.catalog.types[st.stage.ty].name)?,
        };
        stages.push((plan, st.throughput));
    }
    let micro = stages.iter().fold(1, |m, s| lcm(m, s.0.replicas)) * run.in_flight.max(1);
    Ok(SharedPlan {
        batch: problem.model.batch_size as usize,
        stages,
        micro,
        predicted: outcome.evaluation.throughput,
    })
}

/// The plan as process 0 tells the others.
struct SharedPlan {
    /// Records per micro-batch.
    batch: usize,
    /// Each stage and its predicted rate (samples/s).
    stages: Vec<(StagePlan, f64)>,
    micro: usize,
    /// The plan's predicted rate.
    predicted: f64,
}

impl SharedPlan {
    /// As text: `batch micro predicted`, then one line per stage (`first last replicas
    /// threads predicted`).
    fn to_text(&self) -> String {
        let mut t = format!("{} {} {}", self.batch, self.micro, self.predicted);
        for (s, x) in &self.stages {
            t += &format!("\n{} {} {} {} {x}", s.first, s.last, s.replicas, s.threads);
        }
        t
    }

    fn parse(text: &str) -> Result<SharedPlan> {
        let bad = || format!("process 0's plan is garbled: {text:?}");
        let mut lines = text.lines();
        let head: Vec<&str> = lines.next().ok_or_else(bad)?.split(' ').collect();
        let [batch, micro, predicted] = head[..] else {
            return Err(bad().into());
        };
        let mut stages = Vec::new();
        for l in lines {
            let w: Vec<&str> = l.split(' ').collect();
            let [first, last, replicas, threads, x] = w[..] else {
                return Err(bad().into());
            };
            stages.push((
                StagePlan {
                    first: first.parse()?,
                    last: last.parse()?,
                    replicas: replicas.parse()?,
                    threads: threads.parse()?,
                },
                x.parse()?,
            ));
        }
        Ok(SharedPlan {
            batch: batch.parse()?,
            stages,
            micro: micro.parse()?,
            predicted: predicted.parse()?,
        })
    }
}

/// This process's replica of the plan for `run.throughput`, in a job started by
/// `coconet-launch` with one process per replica: process 0 plans (and prints the plan),
/// every process runs its stage's replica, and each reports its stage's measured
/// throughput beside the prediction; process 0 the whole run's and the held-out AUC.
fn run_plan_processes(
    data: &std::path::Path,
    run: &PlanRun,
    model_toml: &std::path::Path,
    catalog_toml: &std::path::Path,
    shards: usize,
) -> Result<()> {
    use coconet_heterps::{CtrStageProcess, stage_role};
    use coconet_runtime::launch::LaunchEnv;
    let env = LaunchEnv::from_env()?;
    let mut store = env.connect()?;
    let d = Dataset::open(data)?;
    let text = if env.rank == 0 {
        let text = planned(data, run, model_toml, catalog_toml)?.to_text();
        store.set("heterps/plan", text.as_bytes())?;
        text
    } else {
        String::from_utf8(store.get("heterps/plan", env.timeout)?)?
    };
    let SharedPlan {
        batch,
        stages: planned,
        micro,
        predicted,
    } = SharedPlan::parse(&text)?;
    let stages: Vec<StagePlan> = planned.iter().map(|p| p.0).collect();
    let Some((stage, replica)) = stage_role(&stages, env.rank) else {
        return Err(format!(
            "the plan has {} replicas, one per process; this job has {} processes",
            coconet_heterps::stage_processes(&stages),
            env.world_size
        )
        .into());
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(stages[stage].threads)
        .build_global()?;
    let mut process = CtrStageProcess::from_env(
        CtrDnn::new(CtrDnnConfig::default())?,
        &stages,
        micro,
        shards,
        ParamServerConfig::default(),
        AdamConfig::default(),
        run.checkpoint.as_deref(),
    )?;
    if let Some(dir) = &run.checkpoint
        && process.progress().steps > 0
        && env.rank == 0
    {
        let p = process.progress();
        println!(
            "resumed from {} at epoch {}, batch {} (step {})",
            dir.display(),
            p.epoch,
            p.batch,
            p.steps
        );
    }
    let k0 = stages[0].replicas;
    let files = d.train.len();
    if env.rank == 0 && !files.is_multiple_of(k0) {
        println!(
            "note: {files} files do not divide among the first stage's {k0} replicas; every \
             epoch ends when the shortest share does ({} files), the rest of the longer \
             shares unread: write a multiple of {k0} files to train on every record",
            files / k0
        );
    }
    let share = if stage == 0 {
        Some(loader(data, &d, batch * micro / k0, replica, k0)?)
    } else {
        None
    };
    let report = match &run.checkpoint {
        None => process.train(share.as_ref(), run.epochs, None)?,
        Some(dir) => {
            let mut total = coconet_heterps::train::TrainReport::default();
            while !process.done() {
                let part = process.train(
                    share.as_ref(),
                    run.epochs,
                    Some(run.checkpoint_every.max(1)),
                )?;
                process.save(dir)?;
                total.steps += part.steps;
                total.samples += part.samples;
                total.seconds += part.seconds;
                total.losses.extend(part.losses);
            }
            total
        }
    };
    // Every replica of a stage sees 1/k of the records; the stage's own rate is the
    // records of all of them over one replica's busy time.
    let seen = report.samples as f64 * stages[stage].replicas as f64;
    let alone = seen / process.busy_seconds().max(1e-9);
    println!(
        "stage {stage} replica {replica} (layers {}..={}, cpu-{}t): busy {:.2} s = {alone:.0} samples/s on its own, predicted {:.0} (ratio {:.2})",
        stages[stage].first,
        stages[stage].last,
        stages[stage].threads,
        process.busy_seconds(),
        planned[stage].1,
        alone / planned[stage].1
    );
    if env.rank == 0 {
        let measured = seen / report.seconds.max(1e-9);
        println!(
            "\nran {} steps of {micro} micro-batches x {batch} on {} processes ({:.0} samples, {:.2} s): {measured:.0} samples/s measured, {predicted:.0} predicted (measured/predicted {:.2})",
            report.steps,
            env.world_size,
            seen,
            report.seconds,
            measured / predicted
        );
    }
    if process.gather_model()? {
        let table = process.table().ok_or("process 0 reads the table")?;
        let eval = evaluate(process.model(), table, &data.join(&d.heldout), FORMAT)?;
        println!(
            "held-out AUC {:.4} (optimum {:.4}), log loss {:.4} (optimum {:.4})",
            eval.auc, d.optimal_auc, eval.log_loss, d.optimal_log_loss
        );
    }
    process.finish()?;
    Ok(())
}
