//! A Megatron-LM row-parallel layer: the input is sliced along its hidden dim and the
//! weight along its rows, so each rank's matmul is a partial sum that an all-reduce
//! completes; then bias, dropout, residual and layer norm — all kept (the original
//! CoCoNet example dropped them).

use coconet::core::numerics::philox::{dropout_bits, dropout_threshold};
use coconet::prelude::*;

/// Row-parallel linear layer + bias + dropout + residual + layer norm, in f16.
#[coconet]
pub fn megatron(
    x: Tensor<f16, Sliced<2>, (B, S, H)>,
    w: Tensor<f16, Sliced<0>, (H, H)>,
    b: Tensor<f16, Replicated, [H]>,
    r: Tensor<f16, Replicated, (B, S, H)>,
    gamma: Tensor<f16, Replicated, [H]>,
    beta: Tensor<f16, Replicated, [H]>,
    seed: i64,
) {
    let partial = matmul(x, w);
    let sum = all_reduce(Sum, partial);
    let dropped = dropout(sum + b, 0.1, seed);
    let out = layer_norm(dropped + r, gamma, beta, 0.00001);
    out
}

/// Deterministic arguments for `[B, S, H]`: uniform data in [-1, 1) as f16, the inputs
/// seeded 1 to 6 (needs the sibling `data` module).
pub fn megatron_args(b: usize, s: usize, h: usize, seed: i64) -> megatron::Args {
    let half = |k, n| {
        TensorArg::Global(
            super::data::uniform(k, n)
                .into_iter()
                .map(f16::from_f64)
                .collect(),
        )
    };
    megatron::Args {
        B: b,
        S: s,
        H: h,
        x: half(1, b * s * h),
        w: half(2, h * h),
        b: half(3, h),
        r: half(4, b * s * h),
        gamma: half(5, h),
        beta: half(6, h),
        seed,
    }
}

/// Inputs of the plain-Rust reference (whole tensors, row-major).
pub struct MegatronInputs<'a> {
    /// `[B·S, H]` activations.
    pub x: &'a [f64],
    /// `[H, H]` weight.
    pub w: &'a [f64],
    /// `[H]` bias.
    pub b: &'a [f64],
    /// `[B·S, H]` residual.
    pub r: &'a [f64],
    /// `[H]` layer-norm scale.
    pub gamma: &'a [f64],
    /// `[H]` layer-norm shift.
    pub beta: &'a [f64],
}

/// Plain-Rust layer in f64 (dropout mask from the documented Philox rule).
pub fn megatron_reference(
    inp: &MegatronInputs,
    rows: usize,
    h: usize,
    p: f64,
    seed: u64,
) -> Vec<f64> {
    let threshold = dropout_threshold(p);
    let mut out = vec![0.0; rows * h];
    for i in 0..rows {
        let mut y = vec![0.0; h];
        for (j, yj) in y.iter_mut().enumerate() {
            let mm: f64 = (0..h).map(|k| inp.x[i * h + k] * inp.w[k * h + j]).sum();
            let idx = (i * h + j) as u64;
            let keep = dropout_bits(seed, idx) as u64 >= threshold;
            let d = if keep {
                (mm + inp.b[j]) / (1.0 - p)
            } else {
                0.0
            };
            *yj = d + inp.r[i * h + j];
        }
        let mean = y.iter().sum::<f64>() / h as f64;
        let var = y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / h as f64;
        for j in 0..h {
            out[i * h + j] = (y[j] - mean) / (var + 1e-5).sqrt() * inp.gamma[j] + inp.beta[j];
        }
    }
    out
}
