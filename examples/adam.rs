//! Data-parallel Adam on 4 simulated ranks, checked against plain Rust.
//!
//! `cargo run --release --example adam`

use coconet_example_programs::adam as program;
use coconet_example_programs::data;

use program::AdamParams;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const RANKS: usize = 4;
    let n = 4099;
    let hp = AdamParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        step: 3,
    };
    let p = program::adam();
    print!("{}", p.program());

    let grads: Vec<Vec<f32>> = (0..RANKS).map(|r| data::uniform_f32(r as u64, n)).collect();
    let w = data::uniform_f32(10, n);
    let m: Vec<f32> = data::uniform_f32(11, n).iter().map(|x| x * 0.1).collect();
    let v: Vec<f32> = data::uniform_f32(12, n)
        .iter()
        .map(|x| x.abs() * 0.01)
        .collect();
    let run = p.interpret(RANKS, program::adam_args(&grads, &w, &m, &v, hp))?;
    let (w1, m1, v1) = program::adam_reference(&grads, &w, &m, &v, hp);
    let mut worst = 0f64;
    for (name, want) in [("w", w1), ("m", m1), ("v", v1)] {
        let got: Vec<f32> = run.final_input(name)?;
        let f = |x: &[f32]| x.iter().map(|&a| a as f64).collect::<Vec<_>>();
        let err = data::max_rel_err(&f(&got), &f(&want));
        println!(
            "adam on {RANKS} ranks, N = {n}: `{name}` max relative error vs plain Rust = {err:.2e}"
        );
        worst = worst.max(err);
    }
    if worst > 1e-5 {
        return Err(format!("adam differs from the plain-Rust reference ({worst:e})").into());
    }
    Ok(())
}
