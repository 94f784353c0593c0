//! Trains a small GPT-style character language model (token and position embeddings,
//! pre-norm transformer blocks with causal multi-head attention and a GELU MLP, a final
//! norm and a linear head) on Shakespeare's sonnets shipped in `examples/data/`, data
//! parallel with candle and coconet: P replicas on P rank threads, each computing
//! gradients on its shard of every batch (forward and backward in its own thread), one
//! fused coconet AdamW step per batch.
//!
//! `cargo run --release --features candle --example train_gpt` (about a minute on 2
//! cores; `-- --bench` trains a larger model for the step-time comparison in
//! BENCHMARKS.md)
//!
//! Checks, and exits non-zero if one fails:
//! - for P = 1, 2 and 4 the loss after every step equals single-process candle training
//!   with candle-nn's AdamW at the same global batch within 1e-4 (relative; the largest
//!   deviation printed is a few 1e-6): the gradients are summed in another order (per
//!   shard, then across ranks) and AdamW's constants are rounded differently (candle
//!   scales by f64 factors, the program computes them in f32), and training amplifies
//!   last-bit differences;
//! - every replica ends with bitwise the same weights;
//! - the loss falls from ln(vocabulary) ≈ 4.0 to below 2.2.
//!
//! Then it times the same optimizer step done the DDP way — the gradients averaged by an
//! all-reduce on the same rank threads, then candle-nn's AdamW on every replica, each in
//! its own thread — against coconet's fused step (both including their copies), in
//! interleaved rounds, and prints the per-step time breakdown, the optimizer state per
//! rank, and a loss-vs-step plot (`target/train_gpt_loss.svg`).
//!
//! With the `mpi` feature, `mpirun -np P target/release/examples/train_gpt --mpi` trains
//! with one replica per process (`DataParallel::mpi`, each process holding only its own
//! gradient and 1/P of the optimizer state); rank 0 checks the loss curve (averaged
//! over processes) against candle's and prints the steps per second. Without MPI,
//! `coconet-launch --nproc-per-node P target/release/examples/train_gpt -- --tcp` does
//! the same with the processes connected by TCP (`DataParallel::tcp`).

/// candle allocates every tensor of every step afresh; glibc's allocator maps and unmaps
/// the large ones each time, and the page faults cost a quarter of forward + backward
/// (README, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use coconet_example_models::replicas as support;

use coconet_example_models::gpt;

use candle_core::backprop::GradStore;
use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::{Optimizer, VarBuilder, VarMap};
use coconet::candle::{AdamWConfig, DataParallel};
use coconet::prelude::*;
use coconet::runtime::Plan;
use coconet::runtime::cpu::{Job, RunOptions};
use gpt::{Corpus, Gpt, Shape};
use indicatif::{ProgressBar, ProgressStyle};
use std::time::{Duration, Instant};
use support::{deviation, weight_bits};

const TEXT: &str = include_str!("data/sonnets.txt");
const TOLERANCE: f32 = 1e-4;
const MAX_FINAL_LOSS: f32 = 2.2;

/// The model's and the run's sizes.
#[derive(Clone, Copy)]
struct Config {
    layers: usize,
    width: usize,
    heads: usize,
    context: usize,
    batch: usize,
    steps: usize,
    lr: f32,
}

const TRAIN: Config = Config {
    layers: 2,
    width: 64,
    heads: 4,
    context: 32,
    batch: 16,
    steps: 200,
    lr: 3e-3,
};

/// A larger model for timing the optimizer step (fewer steps, no loss checks).
const BENCH: Config = Config {
    layers: 4,
    width: 192,
    heads: 6,
    context: 64,
    batch: 16,
    steps: 0,
    lr: 1e-3,
};

/// The model's shape for a run's sizes.
fn shape(c: &Config, vocab: usize) -> Shape {
    Shape {
        layers: c.layers,
        width: c.width,
        heads: c.heads,
        context: c.context,
        vocab,
    }
}

/// A template model with deterministic weights (`GPT_SEED`, default 1).
fn template(c: &Config, vocab: usize) -> candle_core::Result<VarMap> {
    let vm = VarMap::new();
    let _ = Gpt::new(
        &shape(c, vocab),
        VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu),
    )?;
    let seed = std::env::var("GPT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    support::initialise(&vm, seed, |name, var| gpt::init_bound(name, var.dims()))?;
    Ok(vm)
}

fn replica(c: &Config, vocab: usize, template: &VarMap) -> candle_core::Result<(Gpt, Vec<Var>)> {
    support::replica(template, |vb| Gpt::new(&shape(c, vocab), vb))
}

fn progress(steps: usize, label: &str) -> ProgressBar {
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    bar
}

/// Single-process candle training with candle-nn's AdamW: the loss after every step.
fn reference(c: &Config, corpus: &Corpus, template: &VarMap) -> candle_core::Result<Vec<f32>> {
    let (model, vars) = replica(c, corpus.vocab.len(), template)?;
    let params = candle_nn::ParamsAdamW {
        lr: f64::from(c.lr),
        ..candle_nn::ParamsAdamW::default()
    };
    let mut opt = candle_nn::AdamW::new(vars, params)?;
    let bar = progress(c.steps, "candle");
    let mut losses = Vec::new();
    for step in 0..c.steps {
        let (x, y) = corpus.batch(c.context, step, 0, c.batch)?;
        let l = model.loss(&x, &y)?;
        opt.backward_step(&l)?;
        losses.push(l.to_scalar::<f32>()?);
        bar.inc(1);
        bar.set_message(format!("loss {:.3}", losses[step]));
    }
    bar.finish_and_clear();
    Ok(losses)
}

/// Every rank's loss and gradients on its shard of batch `step` with `models[r]` (its
/// replica, or one model they all share), each rank in its own thread.
fn forward_backward(
    c: &Config,
    corpus: &Corpus,
    models: &[&Gpt],
    step: usize,
) -> candle_core::Result<(f32, Vec<GradStore>)> {
    let shard = c.batch / models.len();
    let results: Vec<candle_core::Result<(f32, GradStore)>> = std::thread::scope(|s| {
        let handles: Vec<_> = models
            .iter()
            .enumerate()
            .map(|(r, &model)| {
                s.spawn(move || {
                    let (x, y) = corpus.batch(c.context, step, r * shard, (r + 1) * shard)?;
                    let l = model.loss(&x, &y)?;
                    Ok((l.to_scalar::<f32>()?, l.backward()?))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("replica thread"))
            .collect()
    });
    let mut total = 0.0;
    let mut grads = Vec::with_capacity(models.len());
    for r in results {
        let (l, g) = r?;
        total += l;
        grads.push(g);
    }
    Ok((total / models.len() as f32, grads))
}

struct Run {
    losses: Vec<f32>,
    replicas_equal: bool,
    forward_backward: Duration,
    trainer: DataParallel,
    sample: String,
}

/// Data-parallel training on `ranks` replicas with coconet's fused AdamW step.
fn data_parallel(
    c: &Config,
    corpus: &Corpus,
    template: &VarMap,
    ranks: usize,
) -> Result<Run, Box<dyn std::error::Error>> {
    let vocab = corpus.vocab.len();
    let (models, vars): (Vec<Gpt>, Vec<Vec<Var>>) = (0..ranks)
        .map(|_| replica(c, vocab, template))
        .collect::<candle_core::Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let config = AdamWConfig {
        lr: f64::from(c.lr),
        ..AdamWConfig::default()
    };
    let mut trainer = DataParallel::new(vars.clone(), config)?;
    let bar = progress(c.steps, &format!("P = {ranks}"));
    let mut losses = Vec::new();
    let mut fb = Duration::ZERO;
    for step in 0..c.steps {
        let t = Instant::now();
        let refs: Vec<&Gpt> = models.iter().collect();
        let (loss, grads) = forward_backward(c, corpus, &refs, step)?;
        fb += t.elapsed();
        trainer.step(&grads)?;
        losses.push(loss);
        bar.inc(1);
        bar.set_message(format!("loss {loss:.3}"));
    }
    bar.finish_and_clear();
    let first = weight_bits(&vars[0])?;
    let mut replicas_equal = true;
    for v in &vars[1..] {
        replicas_equal &= weight_bits(v)? == first;
    }
    Ok(Run {
        losses,
        replicas_equal,
        forward_backward: fb,
        trainer,
        sample: generate(c, corpus, &models[0], "Shall I ", 120)?,
    })
}

/// Greedy continuation of `prompt` by `model`.
fn generate(
    c: &Config,
    corpus: &Corpus,
    model: &Gpt,
    prompt: &str,
    count: usize,
) -> candle_core::Result<String> {
    let mut ids: Vec<u32> = Vec::new();
    for ch in prompt.chars() {
        ids.push(corpus.vocab.binary_search(&ch).unwrap_or(0) as u32);
    }
    let mut out = prompt.to_string();
    for _ in 0..count {
        let window = &ids[ids.len().saturating_sub(c.context)..];
        let padded: Vec<u32> = std::iter::repeat_n(0, c.context - window.len())
            .chain(window.iter().copied())
            .collect();
        let x = Tensor::from_vec(padded, (1, c.context), &Device::Cpu)?;
        let logits = model.forward(&x)?.get(0)?.get(c.context - 1)?;
        let next = logits.argmax(D::Minus1)?.to_scalar::<u32>()?;
        ids.push(next);
        out.push(corpus.vocab[next as usize]);
    }
    Ok(out)
}

/// The gradients' average over ranks, as a torch DDP user gets it: one all-reduce.
#[coconet]
fn average(g: Tensor<f32, Local, [N]>) {
    all_reduce(Avg, g)
}

/// The DDP way on rank threads: all-reduce of the gradients (coconet's ring on the same
/// rank threads), then candle-nn's AdamW on every replica, each in its own thread.
struct Ddp {
    job: Job,
    average: coconet::core::ValueId,
    optimizers: Vec<candle_nn::AdamW>,
    vars: Vec<Vec<Var>>,
}

impl Ddp {
    fn new(c: &Config, vars: Vec<Vec<Var>>) -> Result<Ddp, Box<dyn std::error::Error>> {
        let sizes: Vec<usize> = vars[0].iter().map(|v| v.elem_count()).collect();
        let n = sizes.iter().sum();
        let pieces: Vec<Vec<Vec<f32>>> = vars
            .iter()
            .map(|_| sizes.iter().map(|&k| vec![0.0; k]).collect())
            .collect();
        let p = average();
        let bindings = Bindings::new()
            .dim("N", n)
            .tensor("g", Binding::per_rank_pieces(&pieces));
        let plan = Plan::lower(
            &coconet::core::schedule::Schedule::new(p.program()),
            vars.len(),
            bindings.dims(),
        )?;
        let job = Job::new(&plan, &bindings, RunOptions::default())?;
        let params = candle_nn::ParamsAdamW {
            lr: f64::from(c.lr),
            ..candle_nn::ParamsAdamW::default()
        };
        let optimizers = vars
            .iter()
            .map(|v| candle_nn::AdamW::new(v.clone(), params.clone()))
            .collect::<candle_core::Result<_>>()?;
        Ok(Ddp {
            job,
            average: p.program().outputs()[0],
            optimizers,
            vars,
        })
    }

    fn step(&mut self, grads: &mut [GradStore]) -> Result<(), Box<dyn std::error::Error>> {
        for (r, (vars, store)) in self.vars.iter().zip(grads.iter()).enumerate() {
            for (i, v) in vars.iter().enumerate() {
                let g = store.get(v.as_tensor()).ok_or("missing gradient")?;
                let g = g.flatten_all()?.to_vec1::<f32>()?;
                self.job.piece_mut::<f32>("g", r, i)?.copy_from_slice(&g);
            }
        }
        self.job.run()?;
        for (r, (vars, store)) in self.vars.iter().zip(grads.iter_mut()).enumerate() {
            let avg = self
                .job
                .try_local::<f32>(self.average, r)?
                .ok_or("no average")?;
            let mut at = 0;
            for v in vars {
                let k = v.elem_count();
                let t = Tensor::from_slice(&avg[at..at + k], v.shape(), &Device::Cpu)?;
                store.insert(v.as_tensor(), t);
                at += k;
            }
        }
        let results: Vec<candle_core::Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .optimizers
                .iter_mut()
                .zip(grads.iter())
                .map(|(opt, g)| s.spawn(move || opt.step(g)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("optimizer thread"))
                .collect()
        });
        for r in results {
            r?;
        }
        Ok(())
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// What [`compare_ddp`] measured.
struct Comparison {
    /// coconet's step per training step, copies included (median of rounds), ms.
    ours: f64,
    /// The same with one model shared by the rank threads, ms.
    shared: f64,
    /// The DDP way's, ms.
    theirs: f64,
    /// Where coconet's time went (copy in, step, copy out), ms per step over all rounds.
    parts: [f64; 3],
    /// Optimizer-state bytes per rank: coconet's, the DDP way's.
    state: (usize, usize),
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [i, s, o] = self.parts;
        write!(
            f,
            "coconet fused {:.3} ms (copies in {i:.3}, step {s:.3}, copies out {o:.3}; one \
             shared model: {:.3} ms), all-reduce + candle AdamW per replica {:.3} ms ({:.2}× \
             ours); optimizer state per rank {} vs {} bytes",
            self.ours,
            self.shared,
            self.theirs,
            self.theirs / self.ours,
            self.state.0,
            self.state.1
        )
    }
}

/// Times coconet's fused step against the DDP way at P = `ranks`, in `rounds`
/// interleaved rounds of 5 steps each.
fn compare_ddp(
    c: &Config,
    corpus: &Corpus,
    template: &VarMap,
    ranks: usize,
    rounds: usize,
) -> Result<Comparison, Box<dyn std::error::Error>> {
    let vocab = corpus.vocab.len();
    let make = || -> candle_core::Result<(Vec<Gpt>, Vec<Vec<Var>>)> {
        Ok((0..ranks)
            .map(|_| replica(c, vocab, template))
            .collect::<candle_core::Result<Vec<_>>>()?
            .into_iter()
            .unzip())
    };
    let (ours, our_vars) = make()?;
    let (theirs, their_vars) = make()?;
    let (one, one_vars) = replica(c, vocab, template)?;
    let n: usize = our_vars[0].iter().map(|v| v.elem_count()).sum();
    let mut trainer = DataParallel::new(
        our_vars,
        AdamWConfig {
            lr: f64::from(c.lr),
            ..AdamWConfig::default()
        },
    )?;
    let mut shared = DataParallel::shared(
        one_vars,
        ranks,
        AdamWConfig {
            lr: f64::from(c.lr),
            ..AdamWConfig::default()
        },
    )?;
    let mut ddp = Ddp::new(c, their_vars)?;
    let (ours, theirs): (Vec<&Gpt>, Vec<&Gpt>) = (ours.iter().collect(), theirs.iter().collect());
    let one = vec![&one; ranks];
    let (mut a, mut b, mut d) = (Vec::new(), Vec::new(), Vec::new());
    let bar = progress(rounds, "DDP vs us");
    let mut step = 0;
    for _ in 0..rounds {
        let mut t_ours = Duration::ZERO;
        let mut t_theirs = Duration::ZERO;
        let mut t_shared = Duration::ZERO;
        for _ in 0..5 {
            let (_, grads) = forward_backward(c, corpus, &ours, step)?;
            let t = Instant::now();
            trainer.step(&grads)?;
            t_ours += t.elapsed();
            let (_, grads) = forward_backward(c, corpus, &one, step)?;
            let t = Instant::now();
            shared.step(&grads)?;
            t_shared += t.elapsed();
            let (_, mut grads) = forward_backward(c, corpus, &theirs, step)?;
            let t = Instant::now();
            ddp.step(&mut grads)?;
            t_theirs += t.elapsed();
            step += 1;
        }
        a.push(t_ours.as_secs_f64() * 1e3 / 5.0);
        b.push(t_theirs.as_secs_f64() * 1e3 / 5.0);
        d.push(t_shared.as_secs_f64() * 1e3 / 5.0);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let t = trainer.times();
    let ms = |d: Duration| d.as_secs_f64() * 1e3 / (5 * rounds) as f64;
    Ok(Comparison {
        ours: median(a),
        shared: median(d),
        theirs: median(b),
        parts: [ms(t.copy_in), ms(t.step), ms(t.copy_out)],
        state: (trainer.state_bytes_per_rank(), 2 * 4 * n),
    })
}

/// The loss curves as an SVG line plot.
fn plot(path: &str, curves: &[(String, Vec<f32>)]) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    if let Some(dir) = std::path::Path::new(path).parent() {
        std::fs::create_dir_all(dir)?;
    }
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let steps = curves.iter().map(|(_, l)| l.len()).max().unwrap_or(1);
    let top = curves
        .iter()
        .flat_map(|(_, l)| l.iter().copied())
        .fold(0.0f32, f32::max);
    let mut chart = ChartBuilder::on(&root)
        .caption("train_gpt: loss per step", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0..steps, 0f32..top * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("cross-entropy")
        .draw()?;
    let colours = [BLACK, RED, BLUE, GREEN];
    for (i, (label, losses)) in curves.iter().enumerate() {
        let colour = colours[i % colours.len()];
        chart
            .draw_series(LineSeries::new(
                losses.iter().enumerate().map(|(s, &l)| (s, l)),
                colour.stroke_width(if i == 0 { 3 } else { 1 }),
            ))?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// One replica per process (this process is `rank` of `ranks`): trains with the trainer
/// `prepare` makes from this replica's `Var`s, gathers every process's losses with
/// `gather` (in rank order), and on rank 0 checks the averaged loss curve against
/// single-process candle training and prints the steps per second.
fn train_process(
    corpus: &Corpus,
    (rank, ranks): (usize, usize),
    over: &str,
    prepare: impl FnOnce(Vec<Var>, AdamWConfig) -> Result<DataParallel, Box<dyn std::error::Error>>,
    gather: impl FnOnce(&[f32]) -> Result<Vec<Vec<f32>>, Box<dyn std::error::Error>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let c = TRAIN;
    if !c.batch.is_multiple_of(ranks) {
        return Err(format!(
            "the batch of {} does not split over {ranks} processes",
            c.batch
        )
        .into());
    }
    let vocab = corpus.vocab.len();
    let template = template(&c, vocab)?;
    let (model, vars) = replica(&c, vocab, &template)?;
    let config = AdamWConfig {
        lr: f64::from(c.lr),
        ..AdamWConfig::default()
    };
    let mut trainer = prepare(vars, config)?;
    let shard = c.batch / ranks;
    let (mut mine, mut fb) = (Vec::new(), Duration::ZERO);
    let start = Instant::now();
    for step in 0..c.steps {
        let t = Instant::now();
        let (x, y) = corpus.batch(c.context, step, rank * shard, (rank + 1) * shard)?;
        let l = model.loss(&x, &y)?;
        mine.push(l.to_scalar::<f32>()?);
        let grads = l.backward()?;
        fb += t.elapsed();
        trainer.step(&[grads])?;
    }
    let elapsed = start.elapsed();
    let all = gather(&mine)?;
    if rank != 0 {
        return Ok(());
    }
    let losses: Vec<f32> = (0..c.steps)
        .map(|s| all.iter().map(|l| l[s]).sum::<f32>() / ranks as f32)
        .collect();
    let t = trainer.times();
    let ms = |d: Duration| d.as_secs_f64() * 1e3 / c.steps as f64;
    println!(
        "{ranks} processes over {over}: loss {:.3} → {:.3}, {:.1} steps/s; per step on rank \
         0: forward/backward {:.2} ms, copies in {:.3} ms, coconet step {:.3} ms, copies \
         out {:.3} ms; optimizer state {} bytes per rank",
        losses[0],
        losses[losses.len() - 1],
        c.steps as f64 / elapsed.as_secs_f64(),
        ms(fb),
        ms(t.copy_in),
        ms(t.step),
        ms(t.copy_out),
        trainer.state_bytes_per_rank()
    );
    let want = reference(&c, corpus, &template)?;
    let dev = deviation(&losses, &want, 0.0);
    println!("largest loss deviation from candle {dev:.2e}");
    if dev > TOLERANCE {
        return Err(format!("the loss deviates {dev:.2e} from candle's").into());
    }
    println!("trained: {ranks} processes match candle");
    Ok(())
}

/// One replica per MPI process (`mpirun -np P ... --mpi`).
#[cfg(feature = "mpi")]
fn over_mpi(corpus: &Corpus) -> Result<(), Box<dyn std::error::Error>> {
    use mpi::traits::*;
    let universe = mpi::initialize().ok_or("MPI is already initialised")?;
    let world = universe.world();
    let (ranks, rank) = (world.size() as usize, world.rank() as usize);
    train_process(
        corpus,
        (rank, ranks),
        "MPI",
        |vars, config| Ok(DataParallel::mpi(vars, world.duplicate(), config)?),
        |mine| {
            let mut all = vec![0.0f32; mine.len() * ranks];
            world.all_gather_into(mine, &mut all[..]);
            Ok(all.chunks(mine.len()).map(<[f32]>::to_vec).collect())
        },
    )
}

/// One replica per process started by `coconet-launch` (or torchrun), connected by TCP
/// (`coconet-launch --nproc-per-node P target/release/examples/train_gpt -- --tcp`).
fn over_tcp(corpus: &Corpus) -> Result<(), Box<dyn std::error::Error>> {
    use coconet::runtime::cpu::Tcp;
    use coconet::runtime::launch::LaunchEnv;
    let env = LaunchEnv::from_env()?;
    train_process(
        corpus,
        (env.rank, env.world_size),
        "TCP",
        |vars, config| Ok(DataParallel::tcp(vars, Tcp::from_env()?, config)?),
        |mine| {
            let bytes: Vec<u8> = mine.iter().flat_map(|x| x.to_le_bytes()).collect();
            let all = env.connect()?.all_gather(
                "train_gpt/losses",
                env.rank,
                env.world_size,
                &bytes,
                env.timeout,
            )?;
            Ok(all
                .iter()
                .map(|b| {
                    b.chunks_exact(4)
                        .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                        .collect()
                })
                .collect())
        },
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let corpus = Corpus::new(TEXT);
    let vocab = corpus.vocab.len();
    if std::env::args().any(|a| a == "--tcp") {
        return over_tcp(&corpus);
    }
    if std::env::args().any(|a| a == "--mpi") {
        #[cfg(feature = "mpi")]
        return over_mpi(&corpus);
        #[cfg(not(feature = "mpi"))]
        return Err("--mpi needs the `mpi` feature".into());
    }
    if std::env::args().any(|a| a == "--bench") {
        let c = BENCH;
        let template = template(&c, vocab)?;
        let params: usize = replica(&c, vocab, &template)?
            .1
            .iter()
            .map(|v| v.elem_count())
            .sum();
        println!(
            "bench model: {} layers, width {}, {params} parameters, batch {} × {} tokens",
            c.layers, c.width, c.batch, c.context
        );
        for ranks in [1, 2, 4] {
            let m = compare_ddp(&c, &corpus, &template, ranks, 9)?;
            println!("P = {ranks}, optimizer step per training step: {m}");
        }
        return Ok(());
    }
    let c = TRAIN;
    let template = template(&c, vocab)?;
    println!(
        "sonnets: {} characters, vocabulary {vocab}; {} layers, width {}, {} heads, \
         context {}, global batch {} sequences, {} steps",
        corpus.ids.len(),
        c.layers,
        c.width,
        c.heads,
        c.context,
        c.batch,
        c.steps
    );
    let want = reference(&c, &corpus, &template)?;
    println!(
        "candle AdamW, one process: loss {:.3} → {:.3}",
        want[0],
        want.last().copied().unwrap_or(f32::NAN)
    );
    let mut failures = Vec::new();
    let mut curves = vec![("candle AdamW, one process".to_string(), want.clone())];
    for ranks in [1, 2, 4] {
        let run = data_parallel(&c, &corpus, &template, ranks)?;
        let dev = deviation(&run.losses, &want, 0.0);
        let t = run.trainer.times();
        let steps = run.trainer.steps().max(1) as f64;
        let ms = |d: Duration| d.as_secs_f64() * 1e3 / steps;
        println!(
            "P = {ranks}: loss {:.3} → {:.3}, largest deviation from candle {dev:.2e}; per \
             step: forward/backward {:.2} ms, copies in {:.3} ms, coconet step {:.3} ms, \
             copies out {:.3} ms",
            run.losses[0],
            run.losses.last().copied().unwrap_or(f32::NAN),
            ms(run.forward_backward),
            ms(t.copy_in),
            ms(t.step),
            ms(t.copy_out),
        );
        if ranks == 4 {
            println!("  sample: {:?}", run.sample);
        }
        if dev > TOLERANCE {
            failures.push(format!(
                "P = {ranks}: loss deviates {dev:.2e} from candle's"
            ));
        }
        if !run.replicas_equal {
            failures.push(format!("P = {ranks}: replicas' weights differ"));
        }
        let last = run.losses.last().copied().unwrap_or(f32::NAN);
        if last.is_nan() || last >= MAX_FINAL_LOSS {
            failures.push(format!("P = {ranks}: final loss {last:.3}"));
        }
        curves.push((format!("coconet, P = {ranks}"), run.losses));
    }
    let m = compare_ddp(&c, &corpus, &template, 4, 3)?;
    println!("P = 4, optimizer step per training step: {m}");
    let path = "target/train_gpt_loss.svg";
    plot(path, &curves)?;
    println!("loss curves: {path}");
    if failures.is_empty() {
        println!("trained: every P matches candle and every replica agrees");
        Ok(())
    } else {
        Err(failures.join("; ").into())
    }
}
