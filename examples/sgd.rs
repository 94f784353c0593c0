//! Data-parallel SGD on 4 simulated ranks, checked against plain Rust.
//!
//! `cargo run --release --example sgd`

use coconet_example_programs::data;
use coconet_example_programs::sgd as program;

use coconet::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const RANKS: usize = 4;
    let n = 1003; // does not divide by 4
    let p = program::sgd();
    print!("{}", p.program());

    let grads: Vec<Vec<f32>> = (0..RANKS).map(|r| data::uniform_f32(r as u64, n)).collect();
    let w = data::uniform_f32(100, n);
    let run = p.interpret(
        RANKS,
        program::sgd::Args {
            N: n,
            g: TensorArg::PerRank(grads.clone()),
            w: TensorArg::Global(w.clone()),
            lr: 0.01,
        },
    )?;
    let got: Vec<f32> = run.final_input("w")?;
    let want = program::sgd_reference(&grads, &w, 0.01);
    let err = data::max_rel_err(&to_f64(&got), &to_f64(&want));
    println!("sgd on {RANKS} ranks, N = {n}: max relative error vs plain Rust = {err:.2e}");
    if err > 1e-6 {
        return Err(format!("sgd result differs from the plain-Rust reference ({err:e})").into());
    }
    Ok(())
}

fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}
