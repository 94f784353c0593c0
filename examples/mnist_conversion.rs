//! candle's own `mnist-training` example converted to coconet's data-parallel trainer, as
//! a candle user would do it, and measured against the original: its CNN (two 5×5
//! convolutions with max-pooling, then 1024 → 1024 → 10; 1.1M parameters) on 28×28
//! images with candle-nn's AdamW, against the same loop made data parallel with
//! `coconet::candle` at P = 1, 2 and 4 (each rank's forward and backward pass on a thread
//! of its own, one fused AdamW step over 1/P of the parameters per rank).
//!
//! `cargo run --release --features candle,examples-data --example mnist_conversion`
//! (`-- --steps N`, default 30). The images are scikit-learn's handwritten digits scaled
//! up from 8×8 to MNIST's 28×28 (MNIST itself needs a download).
//!
//! Checks, and exits non-zero if one fails:
//! - at every P, the loss after every step equals the original loop's within 1 %
//!   (relative): the gradients are summed in another order, and Adam turns the rounding
//!   noise of near-zero gradients (the blank borders of the images) into whole
//!   learning-rate steps, so the curves part slowly (1.4e-3 after 30 steps here; a
//!   random start once parted them by 2.9e-3 in ten);
//! - every replica ends with bitwise the same weights;
//! - the conversion changes at most 25 lines of the training function's body (21 now;
//!   rustfmt'd, counted from this
//!   file's own source: the lines of `train_coconet` that `train_candle` does not have).
//!
//! Prints the lines changed and, per P, the median step (forward + backward + optimizer)
//! and the median optimizer step alone: candle's `AdamW::step` against coconet's fused
//! step (copies in and out included), and the optimizer state per rank.

/// candle allocates every tensor afresh (README, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use coconet_example_models::replicas as support;

use candle_core::{DType, Device, Tensor};
use candle_nn::{Conv2d, Linear, Optimizer, VarBuilder, VarMap};
use coconet::candle::{AdamWConfig, DataParallel, TrainError, for_each_rank, replicate, shard};
use std::time::{Duration, Instant};

const BATCH: usize = 64;
const LR: f64 = 1e-3;
const TOLERANCE: f32 = 1e-2;
const MAX_CHANGED: usize = 25;

/// candle's `mnist-training` CNN (without its dropout, so that runs compare step by step).
struct ConvNet {
    conv1: Conv2d,
    conv2: Conv2d,
    fc1: Linear,
    fc2: Linear,
}

impl ConvNet {
    fn new(vs: VarBuilder) -> candle_core::Result<ConvNet> {
        Ok(ConvNet {
            conv1: candle_nn::conv2d(1, 32, 5, Default::default(), vs.pp("c1"))?,
            conv2: candle_nn::conv2d(32, 64, 5, Default::default(), vs.pp("c2"))?,
            fc1: candle_nn::linear(1024, 1024, vs.pp("fc1"))?,
            fc2: candle_nn::linear(1024, 10, vs.pp("fc2"))?,
        })
    }

    fn forward(&self, xs: &Tensor) -> candle_core::Result<Tensor> {
        let b = xs.dim(0)?;
        xs.reshape((b, 1, 28, 28))?
            .apply(&self.conv1)?
            .max_pool2d(2)?
            .apply(&self.conv2)?
            .max_pool2d(2)?
            .flatten_from(1)?
            .apply(&self.fc1)?
            .relu()?
            .apply(&self.fc2)
    }
}

/// The digits as MNIST-shaped data: 28×28 pixels in [0, 1] (nearest of the 8×8), labels.
fn images() -> candle_core::Result<(Tensor, Tensor)> {
    let d = smartcore::dataset::digits::load_dataset();
    let n = d.num_samples;
    let mut x = Vec::with_capacity(n * 784);
    for i in 0..n {
        for row in 0..28 {
            for col in 0..28 {
                x.push(d.data[i * 64 + row * 8 / 28 * 8 + col * 8 / 28] / 16.0);
            }
        }
    }
    let y: Vec<u32> = d.target.iter().map(|&t| t as u32).collect();
    Ok((
        Tensor::from_vec(x, (n, 784), &Device::Cpu)?,
        Tensor::from_vec(y, n, &Device::Cpu)?,
    ))
}

/// Batch `step` of the images (a fixed walk through them).
fn batch(x: &Tensor, y: &Tensor, step: usize) -> candle_core::Result<(Tensor, Tensor)> {
    let at = step * BATCH % (x.dim(0)? - BATCH);
    Ok((x.narrow(0, at, BATCH)?, y.narrow(0, at, BATCH)?))
}

/// What a run measured.
struct Run {
    losses: Vec<f32>,
    steps: Vec<Duration>,
    optimizer: Vec<Duration>,
    state_bytes: usize,
    replicas_equal: bool,
}

// ---- the original training loop (candle's mnist-training, shortened) ----
fn train_candle(varmap: &VarMap, x: &Tensor, y: &Tensor, steps: usize) -> candle_core::Result<Run> {
    let model = ConvNet::new(VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu))?;
    let params = candle_nn::ParamsAdamW {
        lr: LR,
        ..Default::default()
    };
    let mut opt = candle_nn::AdamW::new(varmap.all_vars(), params)?;
    let mut run = Run::new();
    for step in 0..steps {
        let start = Instant::now();
        let (bx, by) = batch(x, y, step)?;
        let loss = candle_nn::loss::cross_entropy(&model.forward(&bx)?, &by)?;
        let grads = loss.backward()?;
        let t = Instant::now();
        opt.step(&grads)?;
        run.optimizer.push(t.elapsed());
        run.steps.push(start.elapsed());
        run.losses.push(loss.to_scalar::<f32>()?);
    }
    run.state_bytes = 2 * varmap
        .all_vars()
        .iter()
        .map(|v| v.elem_count() * 4)
        .sum::<usize>();
    Ok(run)
}
// ---- end ----

// ---- the same loop, data parallel with coconet ----
fn train_coconet(
    varmap: &VarMap,
    x: &Tensor,
    y: &Tensor,
    steps: usize,
    ranks: usize,
) -> Result<Run, TrainError> {
    let replicas = replicate(varmap, ranks)?;
    let models = replicas
        .iter()
        .map(|m| ConvNet::new(VarBuilder::from_varmap(m, DType::F32, &Device::Cpu)))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let params = AdamWConfig {
        lr: LR,
        ..Default::default()
    };
    let mut opt = DataParallel::from_varmaps(&replicas, params)?;
    let mut run = Run::new();
    for step in 0..steps {
        let start = Instant::now();
        let (bx, by) = batch(x, y, step)?;
        let losses = for_each_rank(ranks, |r| {
            let rows = shard(BATCH, r, ranks);
            Ok(candle_nn::loss::cross_entropy(
                &models[r].forward(&bx.narrow(0, rows.start, rows.len())?)?,
                &by.narrow(0, rows.start, rows.len())?,
            )?)
        })?;
        let grads = for_each_rank(ranks, |r| Ok(losses[r].backward()?))?;
        let t = Instant::now();
        opt.step(&grads)?;
        run.optimizer.push(t.elapsed());
        run.steps.push(start.elapsed());
        let loss = losses
            .iter()
            .map(|l| l.to_scalar::<f32>())
            .sum::<candle_core::Result<f32>>()?;
        run.losses.push(loss / ranks as f32);
    }
    run.state_bytes = opt.state_bytes_per_rank();
    run.replicas_equal = replicas.windows(2).all(|w| bits(&w[0]) == bits(&w[1]));
    Ok(run)
}
// ---- end ----

impl Run {
    fn new() -> Run {
        Run {
            losses: Vec::new(),
            steps: Vec::new(),
            optimizer: Vec::new(),
            state_bytes: 0,
            replicas_equal: true,
        }
    }
}

/// Every weight's bits, in the order of the parameters' names.
fn bits(varmap: &VarMap) -> Vec<u32> {
    coconet::candle::named_vars(varmap)
        .iter()
        .flat_map(|(_, v)| {
            v.as_tensor()
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .unwrap_or_default()
        })
        .map(f32::to_bits)
        .collect()
}

/// The lines of function `name`'s body in this file (its signature left out), up to its
/// end marker.
fn body(source: &str, name: &str) -> Vec<String> {
    let signature = source
        .find(&format!("fn {name}("))
        .expect("the function is in this file");
    let start = signature + source[signature..].find("{\n").expect("its body") + 2;
    let end = start
        + source[start..]
            .find("// ---- end ----")
            .expect("its end marker");
    source[start..end]
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

fn median(times: &[Duration]) -> f64 {
    let mut t = times.to_vec();
    t.sort();
    t.get(t.len() / 2).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let steps = args
        .iter()
        .position(|a| a == "--steps")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(30);
    // What the conversion changes: train_coconet's lines that train_candle lacks.
    let source = include_str!("mnist_conversion.rs");
    let mut original = body(source, "train_candle");
    let converted = body(source, "train_coconet");
    let mut changed = 0;
    for line in &converted {
        match original.iter().position(|l| l == line) {
            Some(i) => {
                original.remove(i);
            }
            None => changed += 1,
        }
    }
    println!(
        "conversion: {changed} of {} lines of the training function's body changed",
        converted.len()
    );
    let (x, y) = images()?;
    let varmap = VarMap::new();
    let _ = ConvNet::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    // Seeded weights (uniform in ±1/√fan_in, as candle-nn draws them), so every run
    // trains the same.
    support::initialise(&varmap, 1, |_, var| {
        let dims = var.dims();
        let fan_in: usize = match dims.len() {
            1 => dims[0],
            _ => dims[1..].iter().product(),
        };
        Some(1.0 / (fan_in as f32).sqrt())
    })?;
    let template = replicate(&varmap, 2)?.pop().expect("a copy");
    let params: usize = varmap.all_vars().iter().map(|v| v.elem_count()).sum();
    println!("candle's mnist-training CNN: {params} parameters, batch {BATCH}, {steps} steps");
    let candle = train_candle(
        &replicate(&template, 2)?.pop().expect("a copy"),
        &x,
        &y,
        steps,
    )?;
    println!(
        "{:>22} {:>10} {:>16} {:>14}",
        "", "step ms", "optimizer ms", "state/rank"
    );
    let row = |name: &str, r: &Run| {
        println!(
            "{name:>22} {:>10.2} {:>16.3} {:>14}",
            median(&r.steps),
            median(&r.optimizer),
            r.state_bytes
        );
    };
    row("candle AdamW", &candle);
    let mut failed = changed > MAX_CHANGED;
    for ranks in [1, 2, 4] {
        let run = train_coconet(
            &replicate(&template, 2)?.pop().expect("a copy"),
            &x,
            &y,
            steps,
            ranks,
        )?;
        row(&format!("coconet, P = {ranks}"), &run);
        let worst = run
            .losses
            .iter()
            .zip(&candle.losses)
            .map(|(a, b)| (a - b).abs() / b.abs())
            .fold(0f32, f32::max);
        println!(
            "{:>22} losses within {worst:.1e} of candle's; optimizer step {:.1}x candle's",
            "",
            median(&candle.optimizer) / median(&run.optimizer)
        );
        if worst > TOLERANCE || !run.replicas_equal {
            eprintln!("P = {ranks}: loss off by {worst:e} or replicas differ");
            failed = true;
        }
    }
    if failed {
        eprintln!("a check failed (or the conversion changed more than {MAX_CHANGED} lines)");
        std::process::exit(1);
    }
    Ok(())
}
