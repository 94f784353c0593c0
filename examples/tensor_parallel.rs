//! Trains the character GPT of `train_gpt` on Shakespeare's sonnets tensor-parallel —
//! Megatron-LM's model parallelism with `coconet::candle::parallel`: the token embedding
//! and the output head split by vocabulary (the logits never gathered), attention by
//! heads, the MLP by hidden features — on P rank threads, each rank with candle-nn's
//! AdamW on its own shard of the weights.
//!
//! `cargo run --release --features candle --example tensor_parallel`
//! (`-- --bench`: a larger model, step times only; `-- --steps N`)
//!
//! Checks, and exits non-zero if one fails:
//! - for P = 2 and 4, plain, sequence-parallel (layer norms and residuals on each
//!   rank's block of the tokens) and with the matmuls overlapped with their all-reduces
//!   (its first 40 steps), the loss after every step equals the single-device model's (the same weights,
//!   candle-nn's AdamW) within 1e-4 relative: the sums over ranks add the partial
//!   products in another order than one matmul, and training amplifies the last bits;
//! - the loss falls from about ln(vocabulary) ≈ 4.0 to below 2.5;
//! - the layers gathered back after training are the single-device model's shape and
//!   give the same loss as the shards.
//!
//! Prints the median step time (forward, backward, AdamW) and the parameter and AdamW
//! state bytes per rank for P = 1 (the plain candle model), 2 and 4.
//!
//! `coconet-launch --nproc-per-node P target/release/examples/tensor_parallel -- --tcp`
//! (`--bench` for the larger model): one rank per process over TCP, the separate calls
//! against the matmuls overlapped with their all-reduces (`benches/tp_two_hosts.sh` runs
//! it on two namespaced hosts joined by a rate-limited link).

/// candle allocates every tensor of every step afresh (see `train_gpt`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use coconet_example_models::gpt;

use coconet_example_models::replicas as support;

use candle_core::{DType, Device, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use coconet::candle::parallel::TensorParallel;
use gpt::{Corpus, Epilogue, Gpt, ParallelGpt, Shape};
use std::time::{Duration, Instant};

const TEXT: &str = include_str!("data/sonnets.txt");
const TOLERANCE: f32 = 1e-4;
const MAX_FINAL_LOSS: f32 = 2.5;
const LR: f64 = 3e-3;
const BATCH: usize = 16;
/// Steps the overlapped variant trains when checked (not under `--bench`).
const OVERLAP_STEPS: usize = 40;

/// The padded vocabulary splits evenly over up to 4 ranks (as Megatron pads it).
fn shape(bench: bool, vocab: usize) -> Shape {
    let vocab = vocab.next_multiple_of(4);
    match bench {
        false => Shape {
            layers: 2,
            width: 64,
            heads: 4,
            context: 32,
            vocab,
        },
        true => Shape {
            layers: 4,
            width: 256,
            heads: 8,
            context: 64,
            vocab,
        },
    }
}

/// The losses and step times of one training run.
struct Run {
    losses: Vec<f32>,
    times: Vec<Duration>,
    /// Parameter and AdamW state bytes on one rank.
    bytes: usize,
}

fn params() -> ParamsAdamW {
    ParamsAdamW {
        lr: LR,
        ..Default::default()
    }
}

fn bytes(vars: &[Var]) -> usize {
    // The weights, then AdamW's two moments of each.
    3 * vars.iter().map(|v| v.elem_count() * 4).sum::<usize>()
}

/// The plain candle model on one device.
fn single(model: &Gpt, vars: Vec<Var>, corpus: &Corpus, s: &Shape, steps: usize) -> Run {
    let bytes = bytes(&vars);
    let mut opt = AdamW::new(vars, params()).expect("AdamW");
    let (mut losses, mut times) = (Vec::new(), Vec::new());
    for step in 0..steps {
        let start = Instant::now();
        let (x, y) = corpus.batch(s.context, step, 0, BATCH).expect("a batch");
        let loss = model.loss(&x, &y).expect("forward");
        opt.backward_step(&loss).expect("backward and step");
        times.push(start.elapsed());
        losses.push(loss.to_scalar().expect("a loss"));
    }
    Run {
        losses,
        times,
        bytes,
    }
}

/// Rank `tp.rank()`'s training of its shard of `start` for `steps` steps (the variant:
/// the epilogue fused, sequence-parallel, the matmuls overlapped in so many chunks), and
/// how far the gathered model's loss on the first batch is from the shards' (relative).
fn train_rank(
    start: &Gpt,
    corpus: &Corpus,
    s: &Shape,
    steps: usize,
    tp: &TensorParallel,
    (fused, sequence, overlap): (Epilogue, bool, Option<usize>),
) -> (Run, f32) {
    let mut model = ParallelGpt::shard(start, tp).expect("a shard");
    if let Some(chunks) = overlap {
        model = model.with_overlap(chunks);
    }
    if overlap.is_none() {
        model.epilogue = fused;
    }
    model.sequence_parallel = sequence;
    let bytes = bytes(&model.vars);
    let mut opt = AdamW::new(model.vars.clone(), params()).expect("AdamW");
    let (mut losses, mut times) = (Vec::new(), Vec::new());
    for step in 0..steps {
        let t0 = Instant::now();
        let (x, y) = corpus.batch(s.context, step, 0, BATCH).expect("a batch");
        let loss = model.loss(&x, &y).expect("forward");
        let mut grads = loss.backward().expect("backward");
        model
            .sum_partial_gradients(&mut grads)
            .expect("the partial gradients");
        opt.step(&grads).expect("AdamW");
        times.push(t0.elapsed());
        losses.push(loss.to_scalar().expect("a loss"));
    }
    // The whole model gathered back on every rank: the same loss as the shards' on a
    // batch.
    let (x, y) = corpus.batch(s.context, 0, 0, BATCH).expect("a batch");
    let whole = model.gather().expect("the gathered model");
    let shards: f32 = model.loss(&x, &y).expect("forward").to_scalar().expect("");
    let gathered: f32 = whole
        .loss(&x, &y)
        .expect("forward")
        .to_scalar()
        .expect("a loss");
    let gathered = (gathered - shards).abs() / shards;
    let run = Run {
        losses,
        times,
        bytes,
    };
    (run, gathered)
}

/// The model sharded over `ranks` rank threads, each training its shard; rank 0's run
/// (every rank's loss is checked equal to rank 0's) and how far the gathered model's
/// loss on the first batch is from the shards' (relative).
fn parallel(
    start: &Gpt,
    corpus: &Corpus,
    s: &Shape,
    steps: usize,
    (ranks, fused, sequence, overlap): (usize, Epilogue, bool, Option<usize>),
) -> (Run, f32) {
    let runs: Vec<(Run, f32)> = std::thread::scope(|scope| {
        let handles: Vec<_> = TensorParallel::threads(ranks)
            .into_iter()
            .map(|tp| {
                scope.spawn(move || {
                    train_rank(start, corpus, s, steps, &tp, (fused, sequence, overlap))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    });
    for (r, (run, _)) in runs.iter().enumerate() {
        assert_eq!(
            run.losses, runs[0].0.losses,
            "rank {r}'s losses differ from rank 0's"
        );
    }
    runs.into_iter().next().expect("rank 0")
}

/// One rank per process connected by TCP (`coconet-launch --nproc-per-node P
/// target/release/examples/tensor_parallel -- --tcp [--bench]`, or one process per host
/// with `--nnodes`): the separate calls against the matmuls overlapped with their
/// all-reduces (4 chunks), interleaved over two rounds; rank 0 prints the median step
/// times, and every rank checks that both variants' losses agree within 1e-4.
fn over_tcp(start: &Gpt, corpus: &Corpus, s: &Shape, steps: usize) -> Result<(), String> {
    use coconet::runtime::cpu::Tcp;
    let tcp = Tcp::from_env().map_err(|e| e.to_string())?;
    let tp = TensorParallel::tcp(tcp);
    let mut times = [Vec::new(), Vec::new()];
    let mut losses: [Vec<f32>; 2] = [Vec::new(), Vec::new()];
    for _round in 0..2 {
        for (i, overlap) in [None, Some(4)].into_iter().enumerate() {
            let (run, _) = train_rank(
                start,
                corpus,
                s,
                steps,
                &tp,
                (Epilogue::Separate, false, overlap),
            );
            times[i].extend(run.times);
            losses[i] = run.losses;
        }
    }
    let worst = losses[0]
        .iter()
        .zip(&losses[1])
        .map(|(a, b)| (a - b).abs() / b.abs())
        .fold(0f32, f32::max);
    if worst > TOLERANCE {
        return Err(format!(
            "rank {}: the overlapped losses differ from the separate calls' by {worst:.2e}",
            tp.rank()
        ));
    }
    if tp.rank() == 0 {
        let (separate, overlapped) = (median(&times[0]), median(&times[1]));
        println!(
            "{} processes over TCP, median step: separate calls {:.2} ms, matmuls overlapped \
             with their all-reduces (4 chunks) {:.2} ms ({:.2}x); losses agree within \
             {worst:.1e}",
            tp.size(),
            separate.as_secs_f64() * 1e3,
            overlapped.as_secs_f64() * 1e3,
            separate.as_secs_f64() / overlapped.as_secs_f64()
        );
    }
    Ok(())
}

/// The `--bench` rows of P = `ranks`: the fused epilogue (with and without the layer
/// norms) against the separate calls and the matmuls overlapped with their all-reduces
/// (4 row chunks), interleaved over two rounds, then the sequence-parallel variant; step
/// times relative to P = 1's `base`.
fn bench_row(start: &Gpt, corpus: &Corpus, s: &Shape, steps: usize, ranks: usize, base: Duration) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    // The fused epilogue against the separate calls and the matmuls overlapped
    // with their all-reduces (4 row chunks), interleaved.
    let mut times = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    let mut bytes = 0;
    for _round in 0..2 {
        for (i, (fused, overlap)) in [
            (Epilogue::Separate, None),
            (Epilogue::Fused, None),
            (Epilogue::Separate, Some(4)),
            (Epilogue::FusedWithNorm, None),
        ]
        .into_iter()
        .enumerate()
        {
            let variant = (ranks, fused, false, overlap);
            let (run, _) = parallel(start, corpus, s, steps, variant);
            times[i].extend(run.times);
            bytes = run.bytes;
        }
    }
    let (separate, fused) = (median(&times[0]), median(&times[1]));
    let (overlapped, with_norm) = (median(&times[2]), median(&times[3]));
    println!(
        "{ranks:>6} {:>12.2} {:>10.2} {:>14}   fused epilogue; separate calls {:.2} ms ({:.2}x)",
        ms(fused),
        base.as_secs_f64() / fused.as_secs_f64(),
        bytes,
        ms(separate),
        separate.as_secs_f64() / fused.as_secs_f64()
    );
    println!(
        "{ranks:>6} {:>12.2} {:>10.2} {:>14}   matmuls overlapped with their all-reduces \
         (4 chunks; {:.2}x the separate calls)",
        ms(overlapped),
        base.as_secs_f64() / overlapped.as_secs_f64(),
        bytes,
        separate.as_secs_f64() / overlapped.as_secs_f64()
    );
    println!(
        "{ranks:>6} {:>12.2} {:>10.2} {:>14}   the layer norms fused in too ({:.2}x the \
         separate calls)",
        ms(with_norm),
        base.as_secs_f64() / with_norm.as_secs_f64(),
        bytes,
        separate.as_secs_f64() / with_norm.as_secs_f64()
    );
    let (run, _) = parallel(
        start,
        corpus,
        s,
        steps,
        (ranks, Epilogue::Separate, true, None),
    );
    let t = median(&run.times);
    println!(
        "{ranks:>6} {:>12.2} {:>10.2} {:>14}   sequence-parallel",
        ms(t),
        base.as_secs_f64() / t.as_secs_f64(),
        run.bytes
    );
}

fn median(times: &[Duration]) -> Duration {
    let mut t = times.to_vec();
    t.sort();
    t.get(t.len() / 2).copied().unwrap_or_default()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.iter().any(|a| a == "--bench");
    let steps = args
        .iter()
        .position(|a| a == "--steps")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(if bench { 10 } else { 200 });
    let corpus = Corpus::new(TEXT);
    let s = shape(bench, corpus.vocab.len());
    println!(
        "RAYON_NUM_THREADS={} (candle's matmuls: 1 runs each rank's on its own thread)",
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "unset".into())
    );
    println!(
        "GPT: {} layers, width {}, {} heads, context {}, vocabulary {} (padded), batch {BATCH}, {steps} steps",
        s.layers, s.width, s.heads, s.context, s.vocab
    );
    let varmap = VarMap::new();
    let model = Gpt::new(
        &s,
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    )?;
    // Seeded weights (as `train_gpt`'s), so every run trains the same.
    support::initialise(&varmap, 1, |name, var| gpt::init_bound(name, var.dims()))?;
    // The starting weights, kept apart: training changes `varmap`'s Vars.
    let start = model.map_params(&|p| p.copy())?;
    if args.iter().any(|a| a == "--tcp") {
        return Ok(over_tcp(&start, &corpus, &s, steps)?);
    }
    let one = single(&model, varmap.all_vars(), &corpus, &s, steps);
    let mut failed = false;
    println!(
        "{:>6} {:>12} {:>10} {:>14}",
        "ranks", "step (ms)", "vs P=1", "bytes/rank"
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let base = median(&one.times);
    println!(
        "{:>6} {:>12.2} {:>10} {:>14}",
        1,
        ms(base),
        "1.00",
        one.bytes
    );
    for ranks in [2, 4] {
        if bench {
            bench_row(&start, &corpus, &s, steps, ranks, base);
            continue;
        }
        for (fused, sequence, overlap) in [
            (Epilogue::Fused, false, None),
            (Epilogue::FusedWithNorm, false, None),
            (Epilogue::Separate, true, None),
            (Epilogue::Separate, false, Some(4)),
        ] {
            let variant = (ranks, fused, sequence, overlap);
            // The overlapped layers compute what the plain ones do (the tests check every
            // gradient): the first OVERLAP_STEPS steps' losses show it here.
            let steps = if overlap.is_some() {
                steps.min(OVERLAP_STEPS)
            } else {
                steps
            };
            let (run, gathered) = parallel(&start, &corpus, &s, steps, variant);
            println!(
                "{ranks:>6} {:>12.2} {:>10.2} {:>14}{}",
                ms(median(&run.times)),
                base.as_secs_f64() / median(&run.times).as_secs_f64(),
                run.bytes,
                match (fused, sequence, overlap) {
                    (_, true, _) => "   sequence-parallel",
                    (_, _, Some(_)) => "   matmuls overlapped with their all-reduces (4 chunks)",
                    (Epilogue::FusedWithNorm, ..) =>
                        "   the layer norms fused into the all-reduces too",
                    _ => "",
                }
            );
            let worst = run
                .losses
                .iter()
                .zip(&one.losses)
                .map(|(a, b)| (a - b).abs() / b.abs())
                .fold(0f32, f32::max);
            if worst > TOLERANCE {
                eprintln!(
                    "P = {ranks}: a loss differs from the single device's by {worst:.2e} (relative)"
                );
                failed = true;
            } else {
                println!("       losses within {worst:.2e} of the single device's at every step");
            }
            if gathered > 1e-5 {
                eprintln!(
                    "P = {ranks}: the gathered model's loss differs from the shards' by {gathered:.2e}"
                );
                failed = true;
            } else {
                println!(
                    "       the model gathered back gives the shards' loss within {gathered:.1e}"
                );
            }
        }
    }
    if !bench {
        let last = *one.losses.last().unwrap_or(&f32::MAX);
        println!(
            "loss {:.3} -> {last:.3}",
            one.losses.first().unwrap_or(&0.0)
        );
        if last > MAX_FINAL_LOSS {
            eprintln!("the loss ended at {last}, above {MAX_FINAL_LOSS}");
            failed = true;
        }
    }
    if failed {
        std::process::exit(1);
    }
    Ok(())
}
