//! A two-group pipeline boundary on 4 simulated ranks, checked against plain Rust.
//!
//! `cargo run --release --example pipeline`

use coconet_example_programs::data;
use coconet_example_programs::pipeline as program;

use coconet::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const RANKS: usize = 4; // two groups of two
    let (b, h) = (5, 7);
    let seed = 9;
    let p = program::pipeline();
    print!("{}", p.program());

    let xs: Vec<Vec<f32>> = (0..RANKS / 2)
        .map(|i| data::uniform_f32(i as u64, b * h))
        .collect();
    let bias = data::uniform_f32(30, h);
    let r = data::uniform_f32(31, b * h);
    let run = p.interpret(
        RANKS,
        program::pipeline::Args {
            B: b,
            H: h,
            x: TensorArg::PerRank(xs.clone()),
            b: TensorArg::Global(bias.clone()),
            r: TensorArg::Global(r.clone()),
            seed,
        },
    )?;
    let want = program::pipeline_reference(&xs, &bias, &r, seed as u64);
    let mut worst = 0f64;
    for rank in 0..RANKS {
        let got: Option<Vec<f32>> = run.local(p.out, rank);
        match (rank < RANKS / 2, got) {
            (true, None) => println!("rank {rank} (group 0): sent its stage output"),
            (false, Some(got)) => {
                let f = |x: &[f32]| x.iter().map(|&a| a as f64).collect::<Vec<_>>();
                let err = data::max_rel_err(&f(&got), &f(&want));
                println!(
                    "rank {rank} (group 1): received the stage output, max relative error = {err:.2e}"
                );
                worst = worst.max(err);
            }
            (in_group0, got) => {
                return Err(format!(
                    "rank {rank}: group 0 = {in_group0}, holds output = {}",
                    got.is_some()
                )
                .into());
            }
        }
    }
    if worst > 1e-6 {
        return Err(format!("pipeline differs from the plain-Rust reference ({worst:e})").into());
    }
    Ok(())
}
