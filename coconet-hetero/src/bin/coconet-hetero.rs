//! `coconet-hetero plan|compare|pareto`: the HeterPS planner on TOML inputs.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use coconet_hetero::schedulers::{self, Optimality, SearchConfig, StopFlag};
use coconet_hetero::{
    Constraint, InputError, Objective, PlanError, Problem, Rental, SyncModel, Transfers, pareto,
    report,
};
use indicatif::{ProgressBar, ProgressStyle};
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Parser)]
#[command(
    name = "coconet-hetero",
    version,
    about = "HeterPS: cheapest heterogeneous plan for a required throughput"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct Inputs {
    /// Model TOML.
    #[arg(long)]
    model: PathBuf,
    /// Catalogue TOML.
    #[arg(long)]
    catalog: PathBuf,
    /// Required throughput, samples/s (overrides the model file's [constraint]).
    #[arg(long, allow_negative_numbers = true)]
    throughput: Option<f64>,
    /// Total samples (overrides the model file's [constraint]).
    #[arg(long, allow_negative_numbers = true)]
    samples: Option<f64>,
    /// Epochs, with --dataset-size, instead of --samples.
    #[arg(long, allow_negative_numbers = true)]
    epochs: Option<f64>,
    /// Samples per epoch, with --epochs.
    #[arg(long, allow_negative_numbers = true)]
    dataset_size: Option<f64>,
    /// Seed of the randomised schedulers.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Cost-model evaluations per heuristic scheduler.
    #[arg(long, default_value_t = 2000)]
    budget: usize,
    /// What a plan's cost is charged for: `duration`, the job's real duration at the
    /// plan's own throughput (the paper's), or `required-rate`, the job fed at the
    /// required throughput for N / X_req.
    #[arg(long, default_value = "duration", value_parser = ["duration", "required-rate"])]
    objective: String,
    /// A stage's boundary transfers: `serial` (after its compute, the paper's) or
    /// `overlapped` (beside it: the slower of the two bounds the stage).
    #[arg(long, default_value = "serial", value_parser = ["serial", "overlapped"])]
    transfers: String,
    /// Fraction of a stage's compute its data-parallel synchronisation hides behind, 0 to
    /// 1 (0: none, the paper's; 0.67: the all-reduce runs during the backward pass).
    #[arg(long, default_value_t = 0.0)]
    sync_overlap: f64,
    /// How a stage's replicas synchronise their dense parameters: `ring`, an all-reduce
    /// after every batch (the paper's), or `async-server`, pushed and pulled through the
    /// parameter server without waiting (Paddle HeterPS's asynchronous mode; the
    /// catalogue needs a `[parameter_server]`, which then holds the dense parameters too).
    #[arg(long, default_value = "ring", value_parser = ["ring", "async-server"])]
    sync: String,
    /// How units are rented: `instances`, whole instances of each type's
    /// `units_per_instance` with the idle units paid (what a cloud rents), or `units`,
    /// every unit singly (the paper's per-unit prices). The same for a catalogue that
    /// declares no instance sizes.
    #[arg(long, default_value = "instances", value_parser = ["instances", "units"])]
    rental: String,
    /// How many units the schedulers that search plans (greedy, genetic, bayes, random,
    /// cpu-first, rl, exhaustive) rent for each: `min`, the fewest that meet the required
    /// throughput (the paper's plan space), or `best`, under the duration objective the
    /// counts that make the plan cheapest, as `dp` chooses them (more units can pay for
    /// themselves by finishing sooner): `compare` then measures the searches alone, in
    /// dp's space of units. The same under `required-rate`, where the fewest are cheapest.
    #[arg(long, default_value = "min", value_parser = ["min", "best"])]
    units: String,
    /// How the schedulers that assign a type per layer (greedy, genetic, bayes, random,
    /// cpu-first) cut an assignment into stages: `runs`, each run of one type one stage
    /// (the paper's plan space), or `best`, at its cheapest cuts and units, by dp
    /// restricted to the assignment's types: `compare` then measures the searches alone,
    /// in dp's plan space (rl already cuts runs itself; exhaustive has its own space).
    #[arg(long, default_value = "runs", value_parser = ["runs", "best"])]
    cuts: String,
    /// Work after which the exact DP (every phase: pricing, the coarse table, the label
    /// search, the lower bounds, each throughput step of the duration objective) stops and
    /// prints its best plan with a proven lower bound and the gap to it (0: no limit).
    /// Counted in units that do not depend on the machine — 1e8 to 2.5e8 a second on a
    /// 2-core VM — so that a plan, its bound and whether it is proven are the same on a
    /// loaded machine as on a quiet one. The search still finds its first plan within
    /// the caps (bounded by its own budgets) before this limit stops it.
    #[arg(long, default_value_t = schedulers::DEFAULT_WORK_LIMIT as f64, value_parser = work, allow_negative_numbers = true)]
    work_limit: f64,
    /// Wall-clock seconds after which the exact DP stops likewise (0: no limit): a cap
    /// on the run's time, the one limit whose effect depends on the machine's load.
    /// SIGINT or SIGTERM (Ctrl-C) stops the DP at once the same way, and the planner
    /// exits with 130 or 143 after printing the plan.
    #[arg(long, default_value_t = schedulers::DEFAULT_TIME_LIMIT_S as f64, value_parser = seconds, allow_negative_numbers = true)]
    time_limit: f64,
    /// Print each better plan the exact DP finds to stderr as it searches (its cost and
    /// throughput).
    #[arg(long)]
    progress: bool,
    /// `TYPE=SAMPLES`: the batch one replica on TYPE steps with, instead of the model's
    /// (repeatable; overrides the model file's [batch_sizes]). Layer times keep the
    /// type's fixed per-layer overhead and scale the rest with the batch.
    #[arg(long = "batch-size", value_name = "TYPE=SAMPLES")]
    batch_sizes: Vec<String>,
    /// Microseconds each message between two stages takes besides its bytes (overrides
    /// the catalogue's `link_latency_us`).
    #[arg(long, allow_negative_numbers = true)]
    link_latency_us: Option<f64>,
    /// `TYPE=GB/s`: the rate one unit of TYPE reads training samples at; the first
    /// stage then loads the model's `input_bytes` per batch (repeatable; overrides the
    /// catalogue's `data_bandwidth_gbs`).
    #[arg(long = "data-bandwidth", value_name = "TYPE=GBS")]
    data_bandwidths: Vec<String>,
    /// Batches whose activations every stage keeps at once (GPipe's micro-batches; the
    /// stage count bounds 1F1B's): a replica's memory holds that many batches'
    /// activations. 1: the paper's model.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    in_flight: u32,
    /// A policy pre-trained on this catalogue (the `rl_pretrain` example's output) for the
    /// rl scheduler to start from and fine-tune, instead of fresh weights.
    #[arg(long)]
    rl_policy: Option<PathBuf>,
}

/// The scheduler called `name`, the rl one with `--rl-policy`'s weights where given.
fn scheduler(name: &str, inputs: &Inputs) -> Result<Box<dyn schedulers::Scheduler>, String> {
    match (&inputs.rl_policy, name) {
        (Some(path), "rl") => Ok(Box::new(schedulers::Reinforce {
            pretrained: Some(Arc::new(
                schedulers::PolicyWeights::load(path).map_err(|e| e.to_string())?,
            )),
            ..schedulers::Reinforce::default()
        })),
        _ => schedulers::named(name),
    }
}

/// `TYPE=VALUE` given to `flag`: the type's index and a finite value > 0.
fn per_type(
    flag: &str,
    given: &str,
    catalog: &coconet_hetero::Catalog,
) -> Result<(usize, f64), String> {
    let (name, value) = given
        .split_once('=')
        .ok_or_else(|| format!("{flag} wants TYPE=VALUE, got `{given}`"))?;
    let t = catalog.index_of(name.trim()).ok_or_else(|| {
        format!(
            "{flag}: unknown resource type `{}` (known: {})",
            name.trim(),
            coconet_hetero::catalog::names(&catalog.types)
        )
    })?;
    let v = value
        .trim()
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v > 0.0)
        .ok_or_else(|| format!("{flag} {given}: the value must be a number > 0, got `{value}`"))?;
    Ok((t, v))
}

#[derive(Subcommand)]
enum Command {
    /// Plan with one scheduler and print the scheduling and provisioning plans.
    Plan {
        #[command(flatten)]
        inputs: Inputs,
        /// Scheduler: dp, exhaustive, rl, greedy, genetic, bayes, random, cpu-first.
        #[arg(long, default_value = "dp")]
        scheduler: String,
    },
    /// Run every scheduler at an equal evaluation budget and print a table.
    Compare {
        #[command(flatten)]
        inputs: Inputs,
    },
    /// Sweep the throughput constraint with the exact DP; write the frontier as CSV and SVG.
    Pareto {
        #[command(flatten)]
        inputs: Inputs,
        /// Lowest throughput of the sweep, samples/s.
        #[arg(long, allow_negative_numbers = true)]
        from: f64,
        /// Highest throughput of the sweep, samples/s.
        #[arg(long, allow_negative_numbers = true)]
        to: f64,
        /// Number of log-spaced points.
        #[arg(long, default_value_t = 40)]
        points: usize,
        /// Output prefix: writes PREFIX.csv and PREFIX.svg.
        #[arg(long, default_value = "pareto")]
        out: PathBuf,
    },
}

/// An input error in words; for a file of the other kind, which flag it goes with.
fn input_error(e: InputError) -> String {
    match &e {
        InputError::WrongKind {
            found, expected, ..
        } => {
            let flag = |kind: &str| {
                if kind == "catalogue" {
                    "--catalog"
                } else {
                    "--model"
                }
            };
            format!(
                "{e}: give it with {}, and a {expected} with {}",
                flag(found),
                flag(expected)
            )
        }
        _ => e.to_string(),
    }
}

fn load(inputs: &Inputs, need_throughput: bool) -> Result<Problem, String> {
    let catalog = coconet_hetero::Catalog::load(&inputs.catalog).map_err(input_error)?;
    let model = coconet_hetero::Model::load(&inputs.model, &catalog).map_err(input_error)?;
    let samples = match (inputs.samples, inputs.epochs, inputs.dataset_size) {
        (Some(s), None, None) => Some(s),
        (None, Some(e), Some(d)) => Some(e * d),
        (None, None, None) => None,
        _ => return Err("give either --samples or both --epochs and --dataset-size".into()),
    };
    let (mut model, mut catalog) = (model, catalog);
    for given in &inputs.batch_sizes {
        let (t, b) = per_type("--batch-size", given, &catalog)?;
        if model.batch_sizes.is_empty() {
            model.batch_sizes = vec![model.batch_size; catalog.len()];
        }
        model.batch_sizes[t] = b;
    }
    for given in &inputs.data_bandwidths {
        let (t, gbs) = per_type("--data-bandwidth", given, &catalog)?;
        catalog.types[t].data_bandwidth = Some(gbs * coconet_hetero::catalog::GBPS);
    }
    if !inputs.data_bandwidths.is_empty() && model.input_bytes == 0.0 {
        eprintln!(
            "note: {} gives no input_bytes, so --data-bandwidth has nothing to load",
            inputs.model.display()
        );
    }
    if let Some(us) = inputs.link_latency_us {
        if !(us.is_finite() && us >= 0.0) {
            return Err(format!("--link-latency-us must be a number >= 0, not {us}"));
        }
        catalog.link_latency = us * 1e-6;
    }
    let base = model.constraint;
    let throughput = inputs
        .throughput
        .or(base.map(|c| c.throughput))
        .or((!need_throughput).then_some(1.0));
    let samples = samples.or(base.map(|c| c.samples));
    let (Some(throughput), Some(samples)) = (throughput, samples) else {
        return Err(format!(
            "{}: no [constraint] in the model file; give --throughput and --samples (or --epochs and --dataset-size)",
            inputs.model.display()
        ));
    };
    let constraint = Constraint::new(throughput, samples).map_err(|e| e.to_string())?;
    let objective = match inputs.objective.as_str() {
        "duration" => Objective::Duration,
        _ => Objective::RequiredRate,
    };
    let transfers = match inputs.transfers.as_str() {
        "overlapped" => Transfers::Overlapped,
        _ => Transfers::Serial,
    };
    let rental = match inputs.rental.as_str() {
        "units" => Rental::Units,
        _ => Rental::Instances,
    };
    let sync = match inputs.sync.as_str() {
        "async-server" => SyncModel::AsyncServer,
        _ => SyncModel::Ring,
    };
    if !(0.0..=1.0).contains(&inputs.sync_overlap) {
        return Err(format!(
            "--sync-overlap is a fraction of the compute, 0 to 1, not {}",
            inputs.sync_overlap
        ));
    }
    Ok(Problem::try_new(model, catalog, constraint)
        .map_err(|e| e.to_string())?
        .with_objective(objective)
        .with_transfers(transfers)
        .with_sync_overlap(inputs.sync_overlap)
        .with_sync(sync)
        .with_rental(rental)
        .with_in_flight(inputs.in_flight))
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(&format!("{what} [{{bar:40}}] {{pos}}/{{len}} {{elapsed}}"))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

/// Units of work, 0 or more (a whole number, `1e9` notation allowed).
fn work(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=1.8e19).contains(&x) && x.fract() == 0.0 => Ok(x),
        _ => Err(format!(
            "`{s}` is not a whole number of work units from 0 to 1.8e19"
        )),
    }
}

/// A number of seconds, 0 or more (and less than a year).
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=3.2e7).contains(&x) => Ok(x),
        _ => Err(format!("`{s}` is not a number of seconds from 0 to 3.2e7")),
    }
}

fn config(inputs: &Inputs, progress: Option<&ProgressBar>, stop: Option<StopFlag>) -> SearchConfig {
    SearchConfig {
        seed: inputs.seed,
        budget: inputs.budget,
        progress: progress.map(|b| {
            let b = b.clone();
            Arc::new(move |done: usize, _| b.set_position(done as u64)) as schedulers::Progress
        }),
        work_limit: (inputs.work_limit > 0.0).then_some(inputs.work_limit as u64),
        time_limit: (inputs.time_limit > 0.0).then(|| Duration::from_secs_f64(inputs.time_limit)),
        stop,
        found: inputs.progress.then(|| {
            Arc::new(|o: &schedulers::Outcome| {
                eprintln!(
                    "{}: a plan at {} reaching {} samples/s; searching on (Ctrl-C stops and prints the best plan)",
                    o.scheduler,
                    report::money(o.evaluation.cost),
                    coconet_hetero::constraint::rate(o.evaluation.throughput)
                )
            }) as schedulers::Found
        }),
        units: if inputs.units == "best" {
            schedulers::Units::Best
        } else {
            schedulers::Units::Min
        },
        cuts: if inputs.cuts == "best" {
            schedulers::Cuts::Best
        } else {
            schedulers::Cuts::Runs
        },
    }
}

/// SIGINT and SIGTERM set the returned flag to their number, which stops the exact DP
/// with its best plan; a second one ends the process at once (128 + its number).
fn stop_on_signals() -> Result<StopFlag, String> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let stop = StopFlag::default();
    let seen = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        // In this order: the second signal finds `seen` set and exits.
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&seen))
            .and_then(|_| signal_hook::flag::register(sig, Arc::clone(&seen)))
            .and_then(|_| signal_hook::flag::register_usize(sig, Arc::clone(&stop), sig as usize))
            .map_err(|e| format!("cannot handle signal {sig}: {e}"))?;
    }
    Ok(stop)
}

/// What `compare` measures its gaps against.
#[derive(Clone, Copy)]
enum Reference {
    /// The optimum dp proved, in dollars.
    Optimum(f64),
    /// A lower bound on the optimum dp proved without reaching it, in dollars.
    Bound(f64),
}

impl Reference {
    /// The dollars gaps are taken against.
    fn cost(self) -> f64 {
        match self {
            Reference::Optimum(c) | Reference::Bound(c) => c,
        }
    }
}

/// dp's proven optimum, or short of one the lower bound it proved; `None` without either
/// (or with one of $0, against which no gap is a number).
fn gap_reference(dp: Option<&Result<schedulers::Outcome, PlanError>>) -> Option<Reference> {
    let o = dp?.as_ref().ok()?;
    let reference = match o.optimality {
        Optimality::Proven => Reference::Optimum(o.evaluation.cost),
        _ => Reference::Bound(o.lower_bound?),
    };
    (reference.cost() > 0.0 && reference.cost().is_finite()).then_some(reference)
}

/// Why the planner ends without success.
enum Stop {
    /// An error, in words.
    Error(String),
    /// Stopped by this signal after printing its best plan.
    Signal(usize),
}

impl From<String> for Stop {
    fn from(e: String) -> Self {
        Stop::Error(e)
    }
}

fn run(cli: Cli) -> Result<(), Stop> {
    match cli.command {
        Command::Plan { inputs, scheduler } => {
            if inputs.rl_policy.is_some() && scheduler != "rl" {
                return Err(Stop::Error(format!(
                    "--rl-policy is for the rl scheduler, not `{scheduler}`"
                )));
            }
            let pb = load(&inputs, true)?;
            let s = self::scheduler(&scheduler, &inputs)?;
            let progress = (scheduler == "rl").then(|| bar(inputs.budget as u64, "rl"));
            // Only the exact DP stops on request; the others end as signals end a process.
            let stop = (scheduler == "dp").then(stop_on_signals).transpose()?;
            let result = s.schedule(&pb, &config(&inputs, progress.as_ref(), stop.clone()));
            let signal = stop.map_or(0, |s| s.load(Ordering::Relaxed));
            let out = result.map_err(|e| match signal {
                0 => e.to_string(),
                _ => format!("{e} (stopped by signal {signal})"),
            })?;
            if let Some(p) = progress {
                p.finish_and_clear();
            }
            print!("{}", report::plan_report(&pb, &out));
            if signal != 0 {
                return Err(Stop::Signal(signal));
            }
        }
        Command::Compare { inputs } => {
            let pb = load(&inputs, true)?;
            println!(
                "model {}, required {} samples/s, budget {} evaluations, seed {}, units {}, cuts {}",
                pb.model.name,
                coconet_hetero::constraint::rate(pb.constraint.throughput),
                inputs.budget,
                inputs.seed,
                inputs.units,
                inputs.cuts
            );
            println!("cost model: {}", report::cost_terms(&pb));
            let mut rows = Vec::new();
            for name in schedulers::names() {
                let s = scheduler(&name, &inputs)?;
                let progress = (s.name() == "rl").then(|| bar(inputs.budget as u64, "rl"));
                let start = Instant::now();
                let r = s.schedule(&pb, &config(&inputs, progress.as_ref(), None));
                let secs = start.elapsed().as_secs_f64();
                if let Some(p) = progress {
                    p.finish_and_clear();
                }
                rows.push((s.name().to_string(), r, secs));
            }
            let dp = rows.iter().find(|r| r.0 == "dp").map(|r| &r.1);
            let reference = gap_reference(dp);
            println!(
                "{:<11} {:>14} {:>9} {:>12} {:>12}  status",
                "scheduler",
                "cost",
                match reference {
                    Some(Reference::Bound(_)) => "gap % LB",
                    _ => "gap %",
                },
                "evaluations",
                "time ms"
            );
            for (name, r, secs) in &rows {
                match r {
                    Ok(o) => {
                        let gap = reference.map_or("—".to_string(), |r| {
                            format!("{:.2}", (o.evaluation.cost / r.cost() - 1.0) * 100.0)
                        });
                        println!(
                            "{:<11} {:>14} {:>9} {:>12} {:>12.1}  {}",
                            name,
                            report::money(o.evaluation.cost),
                            gap,
                            o.evaluations,
                            secs * 1e3,
                            report::optimality(&o.optimality)
                        );
                    }
                    Err(e) => println!("{name:<11} {e}"),
                }
            }
            match (reference, dp) {
                (Some(Reference::Optimum(_)), _) => {}
                (Some(Reference::Bound(b)), _) => println!(
                    "(gap % LB: gap % of a lower bound on the optimum ({}), as dp did not prove an \
                     optimum; each plan's real gap to the optimum is at most the one shown)",
                    report::money(b)
                ),
                (None, Some(Ok(_))) => {
                    println!("(no gaps: dp proved neither an optimum nor a lower bound above $0)")
                }
                (None, _) => println!("(no gaps: dp found no plan)"),
            }
        }
        Command::Pareto {
            inputs,
            from,
            to,
            points,
            out,
        } => {
            let pb = load(&inputs, false)?;
            if !(from > 0.0 && to >= from && points >= 1) {
                return Err(Stop::Error(format!(
                    "need 0 < --from <= --to and --points >= 1 (got {from}, {to}, {points})"
                )));
            }
            let progress = bar(points as u64, "sweep");
            let frontier =
                pareto::sweep(&pb, from, to, points, |i| progress.set_position(i as u64));
            progress.finish_and_clear();
            let csv = out.with_extension("csv");
            let svg = out.with_extension("svg");
            std::fs::write(&csv, pareto::to_csv(&pb, &frontier))
                .map_err(|e| format!("{}: {e}", csv.display()))?;
            pareto::plot(&pb, &frontier, &svg)?;
            println!(
                "{} points ({} feasible) written to {} and {}",
                frontier.len(),
                frontier.iter().filter(|p| p.plan.is_some()).count(),
                csv.display(),
                svg.display()
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Stop::Error(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
        Err(Stop::Signal(signal)) => {
            eprintln!(
                "stopped by signal {signal}: the plan above is the best found, with the bound proved so far"
            );
            ExitCode::from(128u8.saturating_add(signal.min(127) as u8))
        }
    }
}
