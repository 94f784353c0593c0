//! `train_gpt`'s character GPT trained on a GPU: candle on CUDA runs the forward and
//! backward passes, coconet's fused AdamW steps the weights in the GPU memory candle holds
//! them in — every `Var` and gradient lent in place, one piece per parameter tensor, the
//! step queued on candle's stream; nothing goes through the host.
//!
//! Needs the `candle-cuda` feature (candle's CUDA kernels are built with the CUDA toolkit
//! of `scripts/gpu/setup-cuda13.sh`; see `scripts/gpu/candle-cuda.md`) and a GPU:
//! `CANDLE_CUDA=1 scripts/gpu/build-bundle.sh` bundles it and `gpu-bringup.sh` runs it
//! (`train` in the tests phase, `--bench` in the bench phase).
//!
//! `train_gpt_cuda` checks, and exits non-zero if one fails:
//! - with P = 1 and 2 replicas on GPU 0 (virtual ranks of one device), the loss after
//!   every step equals candle-nn's AdamW on the same GPU at the same global batch within
//!   1e-4 relative (as `train_gpt` on the CPU: the gradients are summed in another order
//!   and AdamW's constants rounded differently);
//! - every replica ends with bitwise the same weights;
//! - the loss falls below 2.2.
//!
//! `train_gpt_cuda --bench` trains a model of GPT-2 small's shape (12 layers, width 768,
//! 12 heads: ~85M parameters in 150 tensors; context 256, batch 8) with candle-nn's AdamW
//! and with coconet's step, in interleaved rounds, and prints per step: forward and
//! backward, the optimizer step (between device synchronisations), the whole step and
//! tokens per second. `benches/gpt_torch.py` trains the same shape with torch's
//! `AdamW(fused=True)` for the comparison (the bring-up runs both).

use coconet_example_models::replicas as support;

use coconet_example_models::gpt;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Var};
use candle_nn::{Optimizer, VarBuilder, VarMap};
use coconet::candle::{AdamWConfig, DataParallel};
use gpt::{Corpus, Gpt, Shape};
use std::time::{Duration, Instant};
use support::{deviation, weight_bits};

const TEXT: &str = include_str!("data/sonnets.txt");
const TOLERANCE: f32 = 1e-4;
const MAX_FINAL_LOSS: f32 = 2.2;

/// The model's and the run's sizes.
#[derive(Clone, Copy)]
struct Config {
    shape: (usize, usize, usize, usize),
    batch: usize,
    steps: usize,
    lr: f64,
}

/// `train_gpt`'s training run.
const TRAIN: Config = Config {
    shape: (2, 64, 4, 32),
    batch: 16,
    steps: 200,
    lr: 3e-3,
};

/// GPT-2 small's layers, width and heads (its vocabulary is the sonnets' characters).
const BENCH: Config = Config {
    shape: (12, 768, 12, 256),
    batch: 8,
    steps: 24,
    lr: 3e-4,
};

fn shape(c: &Config, vocab: usize) -> Shape {
    let (layers, width, heads, context) = c.shape;
    Shape {
        layers,
        width,
        heads,
        context,
        vocab,
    }
}

/// A template model with deterministic weights, on the CPU.
fn template(c: &Config, vocab: usize) -> candle_core::Result<VarMap> {
    let vm = VarMap::new();
    let _ = Gpt::new(
        &shape(c, vocab),
        VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu),
    )?;
    support::initialise(&vm, 1, |name, var| gpt::init_bound(name, var.dims()))?;
    Ok(vm)
}

/// A model on `gpu` with the template's weights, and its parameters in name order.
fn replica(
    c: &Config,
    vocab: usize,
    template: &VarMap,
    gpu: &Device,
) -> candle_core::Result<(Gpt, Vec<Var>)> {
    support::replica_on(gpu, template, |vb| Gpt::new(&shape(c, vocab), vb))
}

/// Rank `r`'s loss and gradients on its shard of batch `step` (inputs moved to `gpu`).
fn forward_backward(
    c: &Config,
    corpus: &Corpus,
    model: &Gpt,
    step: usize,
    (r, ranks): (usize, usize),
    gpu: &Device,
) -> candle_core::Result<(f32, GradStore)> {
    let shard = c.batch / ranks;
    let (x, y) = corpus.batch(c.shape.3, step, r * shard, (r + 1) * shard)?;
    let l = model.loss(&x.to_device(gpu)?, &y.to_device(gpu)?)?;
    Ok((l.to_scalar::<f32>()?, l.backward()?))
}

fn adamw(c: &Config) -> candle_nn::ParamsAdamW {
    candle_nn::ParamsAdamW {
        lr: c.lr,
        ..candle_nn::ParamsAdamW::default()
    }
}

fn coconet_adamw(c: &Config) -> AdamWConfig {
    AdamWConfig {
        lr: c.lr,
        ..AdamWConfig::default()
    }
}

/// candle on the GPU with candle-nn's AdamW: the loss after every step.
fn reference(
    c: &Config,
    corpus: &Corpus,
    template: &VarMap,
    gpu: &Device,
) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    let (model, vars) = replica(c, corpus.vocab.len(), template, gpu)?;
    let mut opt = candle_nn::AdamW::new(vars, adamw(c))?;
    let mut losses = Vec::with_capacity(c.steps);
    for step in 0..c.steps {
        let (l, grads) = forward_backward(c, corpus, &model, step, (0, 1), gpu)?;
        opt.step(&grads)?;
        losses.push(l);
    }
    Ok(losses)
}

/// `ranks` replicas on `gpu` stepped by coconet: the loss curve (averaged over ranks)
/// and whether every replica ends with the same weights.
fn data_parallel(
    c: &Config,
    corpus: &Corpus,
    template: &VarMap,
    gpu: &Device,
    ranks: usize,
) -> Result<(Vec<f32>, bool), Box<dyn std::error::Error>> {
    let (models, vars): (Vec<Gpt>, Vec<Vec<Var>>) = (0..ranks)
        .map(|_| replica(c, corpus.vocab.len(), template, gpu))
        .collect::<candle_core::Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let mut trainer = DataParallel::new(vars.clone(), coconet_adamw(c))?;
    let mut losses = Vec::with_capacity(c.steps);
    for step in 0..c.steps {
        let mut total = 0.0;
        let mut grads = Vec::with_capacity(ranks);
        // One GPU: the replicas' passes queue on one stream, one after another.
        for (r, model) in models.iter().enumerate() {
            let (l, g) = forward_backward(c, corpus, model, step, (r, ranks), gpu)?;
            total += l;
            grads.push(g);
        }
        trainer.step(&grads)?;
        losses.push(total / ranks as f32);
    }
    let first = weight_bits(&vars[0])?;
    let mut equal = true;
    for v in &vars[1..] {
        equal &= weight_bits(v)? == first;
    }
    Ok((losses, equal))
}

/// The checked training run.
fn train(corpus: &Corpus, gpu: &Device) -> Result<(), Box<dyn std::error::Error>> {
    let c = TRAIN;
    let template = template(&c, corpus.vocab.len())?;
    let want = reference(&c, corpus, &template, gpu)?;
    println!(
        "candle AdamW on the GPU: loss {:.3} → {:.3}",
        want[0],
        want[want.len() - 1]
    );
    let mut failures = Vec::new();
    for ranks in [1, 2] {
        let (losses, equal) = data_parallel(&c, corpus, &template, gpu, ranks)?;
        let dev = deviation(&losses, &want, 0.0);
        let last = losses[losses.len() - 1];
        println!(
            "coconet, P = {ranks} on one GPU: loss {:.3} → {last:.3}, largest deviation from \
             candle {dev:.2e}, replicas {}",
            losses[0],
            if equal { "bitwise equal" } else { "DIFFER" }
        );
        if dev > TOLERANCE {
            failures.push(format!(
                "P = {ranks}: loss deviates {dev:.2e} from candle's"
            ));
        }
        if !equal {
            failures.push(format!("P = {ranks}: replicas' weights differ"));
        }
        if last.is_nan() || last >= MAX_FINAL_LOSS {
            failures.push(format!("P = {ranks}: final loss {last:.3}"));
        }
    }
    if failures.is_empty() {
        println!("trained on the GPU: every P matches candle and every replica agrees");
        Ok(())
    } else {
        Err(failures.join("; ").into())
    }
}

/// Per-step times of one contender, ms.
#[derive(Default)]
struct Times {
    forward_backward: Vec<f64>,
    optimizer: Vec<f64>,
}

impl Times {
    fn push(&mut self, (forward_backward, optimizer): (f64, f64)) {
        self.forward_backward.push(forward_backward);
        self.optimizer.push(optimizer);
    }
}

fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// What a step (or the program) ends with.
type Outcome = Result<(), Box<dyn std::error::Error>>;

/// One training step, timed: forward and backward, then `optimizer_step`, each between
/// device synchronisations (ms).
fn timed_step(
    c: &Config,
    corpus: &Corpus,
    model: &Gpt,
    step: usize,
    gpu: &Device,
    optimizer_step: &mut dyn FnMut(&GradStore) -> Outcome,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    gpu.synchronize()?;
    let t = Instant::now();
    let (_, grads) = forward_backward(c, corpus, model, step, (0, 1), gpu)?;
    gpu.synchronize()?;
    let fb = ms(t.elapsed());
    let t = Instant::now();
    optimizer_step(&grads)?;
    gpu.synchronize()?;
    Ok((fb, ms(t.elapsed())))
}

/// candle-nn's AdamW against coconet's step (launched one by one and as a CUDA graph) on
/// a GPT-2-small-shaped model, interleaved.
fn bench(corpus: &Corpus, gpu: &Device) -> Result<(), Box<dyn std::error::Error>> {
    let c = BENCH;
    let vocab = corpus.vocab.len();
    let template = template(&c, vocab)?;
    let (theirs, their_vars) = replica(&c, vocab, &template, gpu)?;
    let (ours, our_vars) = replica(&c, vocab, &template, gpu)?;
    let params: usize = our_vars.iter().map(|v| v.elem_count()).sum();
    println!(
        "bench model: {} layers, width {}, {} heads, {params} parameters in {} tensors; \
         batch {} × {} tokens, f32",
        c.shape.0,
        c.shape.1,
        c.shape.2,
        our_vars.len(),
        c.batch,
        c.shape.3
    );
    let (graphed, graphed_vars) = replica(&c, vocab, &template, gpu)?;
    let mut candle_opt = candle_nn::AdamW::new(their_vars, adamw(&c))?;
    let mut trainer = DataParallel::new(vec![our_vars], coconet_adamw(&c))?;
    let mut graph_trainer = DataParallel::new(vec![graphed_vars], coconet_adamw(&c))?;
    graph_trainer.use_cuda_graph(true)?;
    let (mut a, mut b, mut g) = (Times::default(), Times::default(), Times::default());
    let warm_up = 3;
    for step in 0..c.steps + warm_up {
        let candle_times = timed_step(&c, corpus, &theirs, step, gpu, &mut |g| {
            Ok(candle_opt.step(g)?)
        })?;
        let coconet_times = timed_step(&c, corpus, &ours, step, gpu, &mut |g| {
            Ok(trainer.step(std::slice::from_ref(g))?)
        })?;
        let graph_times = timed_step(&c, corpus, &graphed, step, gpu, &mut |g| {
            Ok(graph_trainer.step(std::slice::from_ref(g))?)
        })?;
        if step >= warm_up {
            a.push(candle_times);
            b.push(coconet_times);
            g.push(graph_times);
        }
    }
    let tokens = (c.batch * c.shape.3) as f64;
    let line = |name: &str, t: &Times| {
        let (fb, opt) = (median(&t.forward_backward), median(&t.optimizer));
        println!(
            "RESULT {name}: forward+backward {fb:.2} ms, optimizer step {opt:.3} ms, step \
             {:.2} ms, {:.0} tokens/s",
            fb + opt,
            tokens / (fb + opt) * 1e3
        );
        opt
    };
    let theirs_opt = line("candle AdamW", &a);
    let ours_opt = line("coconet fused AdamW", &b);
    line("coconet fused AdamW as a CUDA graph", &g);
    println!(
        "RESULT optimizer step: coconet {:.2}x candle's AdamW ({} timed steps each, medians)",
        theirs_opt / ours_opt,
        c.steps
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let corpus = Corpus::new(TEXT);
    let gpu = Device::new_cuda(0)
        .map_err(|e| format!("train_gpt_cuda needs a CUDA GPU (device 0): {e}"))?;
    if std::env::args().any(|a| a == "--bench") {
        bench(&corpus, &gpu)
    } else {
        train(&corpus, &gpu)
    }
}
