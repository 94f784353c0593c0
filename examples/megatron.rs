//! A Megatron row-parallel layer (f16) on 4 simulated ranks, checked against plain Rust.
//!
//! `cargo run --release --example megatron`

use coconet_example_programs::data;
use coconet_example_programs::megatron as program;

use coconet::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const RANKS: usize = 4;
    let (b, s, h) = (2, 3, 18); // H = 18 does not divide by 4
    let seed = 42;
    let p = program::megatron();
    print!("{}", p.program());

    let half = |v: Vec<f64>| v.into_iter().map(f16::from_f64).collect::<Vec<_>>();
    let back = |v: &[f16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    let x = half(data::uniform(1, b * s * h));
    let w = half(data::uniform(2, h * h).iter().map(|v| v * 0.3).collect());
    let bias = half(data::uniform(3, h));
    let r = half(data::uniform(4, b * s * h));
    let gamma = half(data::uniform(5, h).iter().map(|v| 1.0 + 0.5 * v).collect());
    let beta = half(data::uniform(6, h));
    let run = p.interpret(
        RANKS,
        program::megatron::Args {
            B: b,
            S: s,
            H: h,
            x: TensorArg::Global(x.clone()),
            w: TensorArg::Global(w.clone()),
            b: TensorArg::Global(bias.clone()),
            r: TensorArg::Global(r.clone()),
            gamma: TensorArg::Global(gamma.clone()),
            beta: TensorArg::Global(beta.clone()),
            seed,
        },
    )?;
    let got: Vec<f16> = run.logical(p.out)?;
    let inputs = program::MegatronInputs {
        x: &back(&x),
        w: &back(&w),
        b: &back(&bias),
        r: &back(&r),
        gamma: &back(&gamma),
        beta: &back(&beta),
    };
    let p_drop = f16::from_f64(0.1).to_f64();
    let want = program::megatron_reference(&inputs, b * s, h, p_drop, seed as u64);
    let err = back(&got)
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    println!(
        "megatron on {RANKS} ranks, [B, S, H] = [{b}, {s}, {h}]: max abs error vs plain Rust (f64) = {err:.2e}"
    );
    if err > 0.05 {
        return Err(format!("megatron differs from the plain-Rust reference ({err:e})").into());
    }
    Ok(())
}
