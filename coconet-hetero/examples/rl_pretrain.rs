//! Pre-trains the RL scheduler's policy across random instances on the shipped
//! catalogue and writes its weights, for `rl_bench`'s `rl:pretrained=PATH` (and
//! [`Reinforce::pretrained`]) to fine-tune per instance.
//!
//! `cargo run --release -p coconet-hetero --features rl --example rl_pretrain -- [instances] [updates] [out] [entropy] [lr]`
//!
//! The instances are random variants of the shipped models, none of them a shipped case:
//! a random depth (transformers keep their embedding and head around 2 to all of their
//! blocks), every layer's times, activations, parameters and memory scaled by
//! independent log-normal factors (σ = 0.4 for times and 0.3 for sizes), and a
//! throughput log-uniform over 1/5 to 5 times one of the model's benchmark levels.
//! Defaults: 150 instances, 20 updates each, `target/rl-policy.safetensors`, the
//! planner's entropy bonus and learning rate.

use std::time::Instant;

use coconet_hetero::schedulers::Reinforce;
use coconet_hetero::{Constraint, LayerKind, Problem};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

use cases::CASES as MODELS;
use coconet_hetero::instances::cases;

/// A random variant of `base` (see the module docs).
fn variant(base: &Problem, levels: &[f64; 3], rng: &mut ChaCha8Rng) -> Problem {
    let times = Normal::new(0.0f64, 0.4).expect("finite σ");
    let sizes = Normal::new(0.0f64, 0.3).expect("finite σ");
    let mut model = base.model.clone();
    let blocks: Vec<usize> = (0..model.layers.len())
        .filter(|&l| model.layers[l].kind == LayerKind::Transformer)
        .collect();
    if blocks.len() > 2 {
        // Keep a random number of blocks, from 2 to all.
        let keep = rng.random_range(2..=blocks.len());
        let drop: Vec<usize> = blocks[keep..].to_vec();
        let mut l = 0;
        model.layers.retain(|_| {
            l += 1;
            !drop.contains(&(l - 1))
        });
    }
    for layer in &mut model.layers {
        for t in 0..layer.time.len() {
            let f = times.sample(rng).exp();
            layer.time[t] *= f;
            layer.time_loaded[t] *= f;
        }
        let s = sizes.sample(rng).exp();
        layer.activation_bytes *= sizes.sample(rng).exp();
        layer.dense_param_bytes *= sizes.sample(rng).exp();
        layer.memory_bytes *= s;
        layer.activation_memory_bytes = (layer.activation_memory_bytes * s).min(layer.memory_bytes);
    }
    let level = levels[rng.random_range(0..levels.len())];
    let x = level * rng.random_range(-5f64.ln()..5f64.ln()).exp();
    Problem::try_new(
        model,
        base.catalog.clone(),
        Constraint::new(x, base.constraint.samples).expect("positive throughput"),
    )
    .expect("a variant keeps the model's shape")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let instances: usize = args.first().map_or(Ok(150), |s| s.parse())?;
    let updates: usize = args.get(1).map_or(Ok(20), |s| s.parse())?;
    let out = args
        .get(2)
        .cloned()
        .unwrap_or_else(|| "target/rl-policy.safetensors".into());
    let entropy: f64 = args
        .get(3)
        .map_or(Ok(Reinforce::default().entropy), |s| s.parse())?;
    let learning_rate: f64 = args
        .get(4)
        .map_or(Ok(Reinforce::default().learning_rate), |s| s.parse())?;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/data");
    let bases: Vec<(Problem, [f64; 3])> = MODELS
        .iter()
        .map(|(m, levels)| {
            coconet_hetero::load(
                format!("{dir}/{m}.toml"),
                format!("{dir}/catalog.toml"),
                None,
            )
            .map(|pb| (pb, *levels))
        })
        .collect::<Result<_, _>>()?;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let problems: Vec<(usize, Problem)> = (0..instances)
        .map(|_| {
            let m = rng.random_range(0..bases.len());
            (m, variant(&bases[m].0, &bases[m].1, &mut rng))
        })
        .collect();
    let start = Instant::now();
    let trainer = Reinforce {
        entropy,
        learning_rate,
        ..Reinforce::default()
    };
    let weights = trainer.pretrain(problems.iter().map(|(_, pb)| pb), updates, 11, |i, best| {
        let (m, pb) = &problems[i];
        println!(
            "{i:4} {:13} {:3} layers at {:.3e}/s: best {best:.4e} ({:.0} s)",
            MODELS[*m].0,
            pb.num_layers(),
            pb.constraint.throughput,
            start.elapsed().as_secs_f64()
        );
    })?;
    weights.save(&out)?;
    println!(
        "wrote {out}: {instances} instances x {updates} updates in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
