//! A pipeline-parallel boundary: group 0 all-reduces its partial activations, applies
//! bias, dropout and a residual, and sends the result to group 1 rank by rank.

use coconet::core::numerics::philox::{dropout_bits, dropout_threshold};
use coconet::prelude::*;

/// Two pipeline groups; the stage output crosses from group 0 to group 1.
#[coconet(groups = 2)]
pub fn pipeline(
    x: Tensor<f32, Local, (B, H)>,
    b: Tensor<f32, Replicated, [H]>,
    r: Tensor<f32, Replicated, (B, H)>,
    seed: i64,
) {
    let sum = all_reduce(Sum, x);
    let y = dropout(sum + b, 0.1, seed) + r;
    let out = send(y, Next);
    out
}

/// Plain-Rust stage output: `xs[i]` is the Local input of rank i of group 0.
pub fn pipeline_reference(xs: &[Vec<f32>], b: &[f32], r: &[f32], seed: u64) -> Vec<f32> {
    let h = b.len();
    let threshold = dropout_threshold(0.1f32 as f64);
    (0..r.len())
        .map(|i| {
            let s: f32 = xs.iter().map(|x| x[i]).sum();
            let keep = dropout_bits(seed, i as u64) as u64 >= threshold;
            let d = if keep {
                (s + b[i % h]) / (1.0 - 0.1f32)
            } else {
                0.0
            };
            d + r[i]
        })
        .collect()
}
