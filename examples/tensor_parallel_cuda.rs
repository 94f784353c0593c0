//! `tensor_parallel`'s GPT on a GPU (feature `candle-cuda`): P rank threads whose shards
//! live on GPU 0, each collective one job of coconet's CUDA backend with the ranks
//! virtual on that GPU, their tensors lent in place (`TensorParallel::gpu`) — nothing
//! through the host. Each rank trains its shard with candle-nn's AdamW.
//!
//! `cargo run --release --features candle-cuda --example tensor_parallel_cuda`
//! (`-- --steps N`; `-- --bench`: the larger model, step times only)
//!
//! Checks, and exits non-zero if one fails: for P = 1, 2 and 4, with the row-parallel
//! epilogue fused into its all-reduce (with and without the layer norms) and
//! sequence-parallel (and at P = 2 with the norms fused and 10 % dropout), the loss after
//! every step equals the single-GPU model's (the same weights and dropout, candle-nn's
//! AdamW) within 1e-4 relative, every rank's losses are the same, and the layers gathered
//! back give the shards' loss.
//!
//! `--bench` prints the median step time (forward, backward, AdamW, between device
//! synchronisations) of the single-GPU model and of P = 2 and 4 virtual ranks with the
//! fused epilogue against the separate calls (interleaved), and the parameter and AdamW
//! bytes per rank. Virtual ranks share one GPU, so they show what fusing the epilogue
//! saves, not what splitting the model over several GPUs gains: that needs as many GPUs.

use coconet_example_models::gpt;

use coconet_example_models::replicas as support;

use candle_core::{DType, Device, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use coconet::candle::parallel::{Dropout, TensorParallel};
use gpt::{Corpus, Epilogue, Gpt, ParallelGpt, Shape};
use std::time::{Duration, Instant};

const TEXT: &str = include_str!("data/sonnets.txt");
const TOLERANCE: f32 = 1e-4;
const LR: f64 = 3e-3;
const BATCH: usize = 16;
const DROPOUT: Dropout = Dropout { p: 0.1, seed: 7 };

/// The padded vocabulary splits evenly over up to 4 ranks.
fn shape(bench: bool, vocab: usize) -> Shape {
    let vocab = vocab.next_multiple_of(4);
    let (layers, width, heads, context) = if bench {
        (4, 512, 8, 128)
    } else {
        (2, 64, 4, 32)
    };
    Shape {
        layers,
        width,
        heads,
        context,
        vocab,
    }
}

fn params() -> ParamsAdamW {
    ParamsAdamW {
        lr: LR,
        ..Default::default()
    }
}

/// Parameter and AdamW state bytes of `vars`.
fn bytes(vars: &[Var]) -> usize {
    3 * vars.iter().map(|v| v.elem_count() * 4).sum::<usize>()
}

/// The losses and step times of one training run, and its bytes per rank.
struct Run {
    losses: Vec<f32>,
    times: Vec<Duration>,
    bytes: usize,
}

type Outcome<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// `f` (a training step: its loss), timed between device synchronisations.
fn timed(
    gpu: &Device,
    f: impl FnOnce() -> candle_core::Result<f32>,
) -> candle_core::Result<(f32, Duration)> {
    gpu.synchronize()?;
    let t = Instant::now();
    let loss = f()?;
    gpu.synchronize()?;
    Ok((loss, t.elapsed()))
}

/// A model on `gpu` with `template`'s weights and dropout `d`, and its parameters.
fn on_gpu(
    template: &VarMap,
    s: &Shape,
    d: Option<Dropout>,
    gpu: &Device,
) -> candle_core::Result<(Gpt, Vec<Var>)> {
    let (mut model, vars) = support::replica_on(gpu, template, |vb| Gpt::new(s, vb))?;
    model.dropout = d;
    Ok((model, vars))
}

/// The whole model on the GPU with candle-nn's AdamW.
fn single(
    template: &VarMap,
    corpus: &Corpus,
    s: &Shape,
    (steps, d): (usize, Option<Dropout>),
    gpu: &Device,
) -> Outcome<Run> {
    let (model, vars) = on_gpu(template, s, d, gpu)?;
    let bytes = bytes(&vars);
    let mut opt = AdamW::new(vars, params())?;
    let (mut losses, mut times) = (Vec::new(), Vec::new());
    for step in 0..steps {
        let (x, y) = corpus.batch(s.context, step, 0, BATCH)?;
        let (x, y) = (x.to_device(gpu)?, y.to_device(gpu)?);
        let (loss, t) = timed(gpu, || {
            let loss = model.loss(&x, &y)?;
            opt.backward_step(&loss)?;
            loss.to_scalar::<f32>()
        })?;
        losses.push(loss);
        times.push(t);
    }
    Ok(Run {
        losses,
        times,
        bytes,
    })
}

/// Rank `tp.rank()`'s training of its shard of `template`'s model on the GPU, and how
/// far the gathered model's loss on the first batch is from the shards' (relative).
fn train_rank(
    template: &VarMap,
    corpus: &Corpus,
    s: &Shape,
    steps: usize,
    tp: &TensorParallel,
    (fused, sequence, d): (Epilogue, bool, Option<Dropout>),
    gpu: &Device,
) -> Outcome<(Run, f32)> {
    let (whole, _) = on_gpu(template, s, d, gpu)?;
    let mut model = ParallelGpt::shard(&whole, tp)?;
    drop(whole);
    model.epilogue = fused;
    model.sequence_parallel = sequence;
    let bytes = bytes(&model.vars);
    let mut opt = AdamW::new(model.vars.clone(), params())?;
    let (mut losses, mut times) = (Vec::new(), Vec::new());
    for step in 0..steps {
        let (x, y) = corpus.batch(s.context, step, 0, BATCH)?;
        let (x, y) = (x.to_device(gpu)?, y.to_device(gpu)?);
        let (loss, t) = timed(gpu, || {
            let loss = model.loss(&x, &y)?;
            let mut grads = loss.backward()?;
            model.sum_partial_gradients(&mut grads)?;
            opt.step(&grads)?;
            loss.to_scalar::<f32>()
        })?;
        losses.push(loss);
        times.push(t);
    }
    let (x, y) = corpus.batch(s.context, 0, 0, BATCH)?;
    let (x, y) = (x.to_device(gpu)?, y.to_device(gpu)?);
    let shards: f32 = model.loss(&x, &y)?.to_scalar()?;
    let gathered: f32 = model.gather()?.loss(&x, &y)?.to_scalar()?;
    Ok((
        Run {
            losses,
            times,
            bytes,
        },
        (gathered - shards).abs() / shards,
    ))
}

/// The model sharded over `ranks` rank threads on the GPU: rank 0's run (every rank's
/// losses checked equal to rank 0's) and the gathered model's deviation.
fn parallel(
    template: &VarMap,
    corpus: &Corpus,
    s: &Shape,
    steps: usize,
    (ranks, fused, sequence, d): (usize, Epilogue, bool, Option<Dropout>),
) -> Outcome<(Run, f32)> {
    let group = TensorParallel::gpu(ranks, 0)?;
    let runs: Vec<Outcome<(Run, f32)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = group
            .into_iter()
            .map(|tp| {
                scope.spawn(move || {
                    let gpu = Device::new_cuda(0)?;
                    train_rank(template, corpus, s, steps, &tp, (fused, sequence, d), &gpu)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    });
    let runs = runs.into_iter().collect::<Outcome<Vec<_>>>()?;
    for (r, (run, _)) in runs.iter().enumerate() {
        if run.losses != runs[0].0.losses {
            return Err(format!("P = {ranks}: rank {r}'s losses differ from rank 0's").into());
        }
    }
    Ok(runs.into_iter().next().expect("rank 0"))
}

fn median(times: &[Duration]) -> Duration {
    let mut t = times.to_vec();
    t.sort();
    t.get(t.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Outcome<()> {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.iter().any(|a| a == "--bench");
    let steps = args
        .iter()
        .position(|a| a == "--steps")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(if bench { 10 } else { 100 });
    let gpu = Device::new_cuda(0)?;
    let corpus = Corpus::new(TEXT);
    let s = shape(bench, corpus.vocab.len());
    println!(
        "GPT on GPU 0: {} layers, width {}, {} heads, context {}, vocabulary {} (padded), \
         batch {BATCH}, {steps} steps",
        s.layers, s.width, s.heads, s.context, s.vocab
    );
    // Seeded weights (as `tensor_parallel`'s), kept on the CPU as every model's start.
    let template = VarMap::new();
    let _ = Gpt::new(
        &s,
        VarBuilder::from_varmap(&template, DType::F32, &Device::Cpu),
    )?;
    support::initialise(&template, 1, |name, var| gpt::init_bound(name, var.dims()))?;
    let one = single(&template, &corpus, &s, (steps, None), &gpu)?;
    let base = median(&one.times);
    println!(
        "{:>6} {:>12} {:>10} {:>14}",
        "ranks", "step (ms)", "vs P=1", "bytes/rank"
    );
    println!(
        "{:>6} {:>12.2} {:>10} {:>14}   one GPU, candle",
        1,
        ms(base),
        "1.00",
        one.bytes
    );
    let mut failed = false;
    for ranks in [1, 2, 4] {
        if bench {
            if ranks == 1 {
                continue;
            }
            // The fused epilogue (with and without the norms) against the separate calls,
            // interleaved over two rounds.
            let (mut fused, mut separate, mut norms, mut bytes) =
                (Vec::new(), Vec::new(), Vec::new(), 0);
            for _round in 0..2 {
                for (f, times) in [
                    (Epilogue::Fused, &mut fused),
                    (Epilogue::Separate, &mut separate),
                    (Epilogue::FusedWithNorm, &mut norms),
                ] {
                    let (run, _) =
                        parallel(&template, &corpus, &s, steps, (ranks, f, false, None))?;
                    times.extend(run.times.into_iter().skip(2));
                    bytes = run.bytes;
                }
            }
            let (f, sep, n) = (median(&fused), median(&separate), median(&norms));
            println!(
                "{ranks:>6} {:>12.2} {:>10.2} {:>14}   virtual ranks, the layer norms fused in \
                 too ({:.2}x the separate calls)",
                ms(n),
                base.as_secs_f64() / n.as_secs_f64(),
                bytes,
                sep.as_secs_f64() / n.as_secs_f64()
            );
            println!(
                "{ranks:>6} {:>12.2} {:>10.2} {:>14}   virtual ranks, fused epilogue; separate \
                 calls {:.2} ms ({:.2}x)",
                ms(f),
                base.as_secs_f64() / f.as_secs_f64(),
                bytes,
                ms(sep),
                sep.as_secs_f64() / f.as_secs_f64()
            );
            continue;
        }
        // Fused, sequence-parallel, and (at P = 2) fused with dropout against the single
        // GPU's model with the same dropout.
        let mut variants = vec![
            (Epilogue::Fused, false, None),
            (Epilogue::FusedWithNorm, false, None),
            (Epilogue::Separate, true, None),
        ];
        if ranks == 2 {
            variants.push((Epilogue::FusedWithNorm, false, Some(DROPOUT)));
        }
        for (fused, sequence, d) in variants {
            let reference = match d {
                None => None,
                Some(_) => Some(single(&template, &corpus, &s, (steps, d), &gpu)?),
            };
            let want = reference.as_ref().unwrap_or(&one);
            let variant = (ranks, fused, sequence, d);
            let (run, gathered) = parallel(&template, &corpus, &s, steps, variant)?;
            let worst = run
                .losses
                .iter()
                .zip(&want.losses)
                .map(|(a, b)| (a - b).abs() / b.abs())
                .fold(0f32, f32::max);
            let what = match (fused, sequence, d) {
                (_, true, _) => "sequence-parallel",
                (_, _, Some(_)) => "layer norms fused too, dropout 0.1",
                (Epilogue::FusedWithNorm, ..) => "layer norms fused too",
                _ => "fused epilogue",
            };
            println!(
                "{ranks:>6} {:>12.2} {:>10.2} {:>14}   {what}; losses within {worst:.2e}, \
                 gathered {gathered:.1e}",
                ms(median(&run.times)),
                base.as_secs_f64() / median(&run.times).as_secs_f64(),
                run.bytes,
            );
            // Written so that a NaN fails too.
            let finite = run.losses.iter().all(|l| l.is_finite());
            if !(finite && worst <= TOLERANCE && gathered <= 1e-5) {
                eprintln!(
                    "P = {ranks}, {what}: not the single GPU's model (losses {worst:.2e}, \
                     gathered {gathered:.2e})"
                );
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
    println!("tensor_parallel_cuda: ok");
    Ok(())
}
