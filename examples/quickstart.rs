//! The README's main job: write Adam as a `#[coconet]` program, print the checked
//! program, run it on 4 simulated ranks with the reference interpreter, and check the
//! result against a plain-Rust Adam.
//!
//! `cargo run --release --example quickstart`

#[allow(dead_code)]
#[path = "programs/data.rs"]
mod data;
#[path = "programs/adam.rs"]
mod program;

use coconet::prelude::*;
use program::AdamParams;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const RANKS: usize = 4;
    let n = 1 << 14 | 3; // uneven on purpose
    let hp = AdamParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        step: 1,
    };

    // 1. The program, checked at compile time: dtype, layout and shape of every stage.
    let adam = program::adam();
    println!("{}", adam.program());
    println!(
        "(typed handles: `adam.g1` is stage {}, `adam.w1` is stage {}; \
         Graphviz: coconet::core::to_dot(adam.program()))\n",
        adam.g1.id(),
        adam.w1.id()
    );

    // 2. Run it on 4 ranks: each rank has its own gradient, all share w, m, v.
    let grads: Vec<Vec<f32>> = (0..RANKS).map(|r| data::uniform_f32(r as u64, n)).collect();
    let w = data::uniform_f32(10, n);
    let m = vec![0.0f32; n];
    let v = vec![0.0f32; n];
    let start = Instant::now();
    let run = adam.interpret(
        RANKS,
        program::adam::Args {
            N: n,
            g: TensorArg::PerRank(grads.clone()),
            w: TensorArg::Global(w.clone()),
            m: TensorArg::Global(m.clone()),
            v: TensorArg::Global(v.clone()),
            lr: hp.lr,
            beta1: hp.beta1,
            beta2: hp.beta2,
            eps: hp.eps,
            step: hp.step,
        },
    )?;
    let elapsed = start.elapsed();

    // 3. Check: every rank holds bitwise the same new weights, equal to plain-Rust Adam.
    let (w_ref, _, _) = program::adam_reference(&grads, &w, &m, &v, hp);
    let w_new: Vec<f32> = run.final_input("w")?;
    for r in 1..RANKS {
        let same = run.local::<f32>(adam.w1, r) == run.local::<f32>(adam.w1, 0);
        if !same {
            return Err(format!("rank {r}'s weights differ from rank 0's").into());
        }
    }
    let f = |x: &[f32]| x.iter().map(|&a| a as f64).collect::<Vec<_>>();
    let err = data::max_rel_err(&f(&w_new), &f(&w_ref));
    println!(
        "ran adam on {RANKS} ranks (reference interpreter), N = {n}, in {:.1} ms",
        elapsed.as_secs_f64() * 1e3
    );
    println!("replicated weights identical on all ranks: yes");
    println!("max relative error vs plain-Rust Adam: {err:.2e}");
    if err > 1e-5 {
        return Err(format!("adam differs from the plain-Rust reference ({err:e})").into());
    }
    println!("check passed");
    Ok(())
}
