//! Data-parallel LAMB on 4 simulated ranks, checked against plain Rust.
//!
//! `cargo run --release --example lamb`

use coconet_example_programs::data;
use coconet_example_programs::lamb as program;

use program::LambParams;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const RANKS: usize = 4;
    let n = 2050;
    let hp = LambParams {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-6,
        weight_decay: 0.01,
        step: 5,
    };
    let p = program::lamb();
    print!("{}", p.program());

    let grads: Vec<Vec<f32>> = (0..RANKS)
        .map(|r| data::uniform_f32(r as u64 + 7, n))
        .collect();
    let w = data::uniform_f32(20, n);
    let m: Vec<f32> = data::uniform_f32(21, n).iter().map(|x| x * 0.1).collect();
    let v: Vec<f32> = data::uniform_f32(22, n)
        .iter()
        .map(|x| x.abs() * 0.01)
        .collect();
    let run = p.interpret(RANKS, program::lamb_args(&grads, &w, &m, &v, hp))?;
    let (w1, m1, v1) = program::lamb_reference(&grads, &w, &m, &v, hp);
    let mut worst = 0f64;
    for (name, want) in [("w", w1), ("m", m1), ("v", v1)] {
        let got: Vec<f32> = run.final_input(name)?;
        let f = |x: &[f32]| x.iter().map(|&a| a as f64).collect::<Vec<_>>();
        let err = data::max_rel_err(&f(&got), &f(&want));
        println!(
            "lamb on {RANKS} ranks, N = {n}: `{name}` max relative error vs plain Rust = {err:.2e}"
        );
        worst = worst.max(err);
    }
    if worst > 1e-5 {
        return Err(format!("lamb differs from the plain-Rust reference ({worst:e})").into());
    }
    Ok(())
}
