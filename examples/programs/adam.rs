//! Data-parallel Adam (Kingma & Ba): bias-corrected moments, eps outside the sqrt.

use coconet::prelude::*;

/// One Adam step on a Replicated parameter tensor with Replicated optimizer state.
///
/// Two schedules are named in the attribute and checked at compile time: the recipe
/// `sharded_update`, and the same schedule written step by step.
#[coconet(schedule(
    sharded = sharded_update(g1, [m, v]),
    by_steps = [split(g1), reorder(g1), as_slice([m, v]), fuse_all_reduce(g1_rs)],
))]
pub fn adam(
    g: Tensor<f32, Local, [N]>,
    w: Tensor<f32, Replicated, [N]>,
    m: Tensor<f32, Replicated, [N]>,
    v: Tensor<f32, Replicated, [N]>,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    step: i32,
) {
    let g1 = all_reduce(Sum, g);
    let m1 = update(m, beta1 * m + (1.0 - beta1) * g1);
    let v1 = update(v, beta2 * v + (1.0 - beta2) * g1 * g1);
    let t = cast::<f32>(step);
    let mhat = m1 / (1.0 - pow(beta1, t));
    let vhat = v1 / (1.0 - pow(beta2, t));
    let w1 = update(w, w - lr * mhat / (sqrt(vhat) + eps));
}

/// Adam hyper-parameters.
#[derive(Clone, Copy)]
pub struct AdamParams {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// 1-based step number.
    pub step: i32,
}

/// The program's arguments: rank r's gradient is `grads[r]`; w, m, v are whole tensors.
pub fn adam_args(grads: &[Vec<f32>], w: &[f32], m: &[f32], v: &[f32], p: AdamParams) -> adam::Args {
    adam::Args {
        N: w.len(),
        g: TensorArg::PerRank(grads.to_vec()),
        w: TensorArg::Global(w.to_vec()),
        m: TensorArg::Global(m.to_vec()),
        v: TensorArg::Global(v.to_vec()),
        lr: p.lr,
        beta1: p.beta1,
        beta2: p.beta2,
        eps: p.eps,
        step: p.step,
    }
}

/// Plain-Rust Adam in f32; returns (w, m, v) after the step.
pub fn adam_reference(
    grads: &[Vec<f32>],
    w: &[f32],
    m: &[f32],
    v: &[f32],
    p: AdamParams,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut w1, mut m1, mut v1) = (w.to_vec(), m.to_vec(), v.to_vec());
    let bc1 = 1.0 - p.beta1.powi(p.step);
    let bc2 = 1.0 - p.beta2.powi(p.step);
    for i in 0..w.len() {
        let g: f32 = grads.iter().map(|g| g[i]).sum();
        m1[i] = p.beta1 * m[i] + (1.0 - p.beta1) * g;
        v1[i] = p.beta2 * v[i] + (1.0 - p.beta2) * g * g;
        let (mhat, vhat) = (m1[i] / bc1, v1[i] / bc2);
        w1[i] = w[i] - p.lr * mhat / (vhat.sqrt() + p.eps);
    }
    (w1, m1, v1)
}
