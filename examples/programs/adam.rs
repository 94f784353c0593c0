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
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    step: i32,
) {
    let g1 = all_reduce(Sum, g);
    // Hyper-parameter arithmetic in f64, each coefficient rounded to f32 once (as torch
    // does on the host): 1 − β₂ from an f32 β₂ would be off by 1.3e-5.
    let t = cast::<f64>(step);
    let b1 = cast::<f32>(beta1);
    let b2 = cast::<f32>(beta2);
    let c1 = cast::<f32>(1.0 - beta1);
    let c2 = cast::<f32>(1.0 - beta2);
    let bc1 = cast::<f32>(1.0 - pow(beta1, t));
    let bc2 = cast::<f32>(1.0 - pow(beta2, t));
    let m1 = update(m, b1 * m + c1 * g1);
    let v1 = update(v, b2 * v + c2 * g1 * g1);
    let mhat = m1 / bc1;
    let vhat = v1 / bc2;
    let w1 = update(
        w,
        w - cast::<f32>(lr) * mhat / (sqrt(vhat) + cast::<f32>(eps)),
    );
}

/// Adam hyper-parameters.
#[derive(Clone, Copy)]
pub struct AdamParams {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// 1-based step number.
    pub step: i32,
}

impl Default for AdamParams {
    /// torch's defaults with lr = 1e-3, at the first step.
    fn default() -> AdamParams {
        AdamParams {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            step: 1,
        }
    }
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

/// Plain-Rust Adam in f32 (hyper-parameter arithmetic in f64, as torch's); returns
/// (w, m, v) after the step.
pub fn adam_reference(
    grads: &[Vec<f32>],
    w: &[f32],
    m: &[f32],
    v: &[f32],
    p: AdamParams,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut w1, mut m1, mut v1) = (w.to_vec(), m.to_vec(), v.to_vec());
    let (b1, b2) = (p.beta1 as f32, p.beta2 as f32);
    let (c1, c2) = ((1.0 - p.beta1) as f32, (1.0 - p.beta2) as f32);
    let bc1 = (1.0 - p.beta1.powi(p.step)) as f32;
    let bc2 = (1.0 - p.beta2.powi(p.step)) as f32;
    let (lr, eps) = (p.lr as f32, p.eps as f32);
    for i in 0..w.len() {
        let g: f32 = grads.iter().map(|g| g[i]).sum();
        m1[i] = b1 * m[i] + c1 * g;
        v1[i] = b2 * v[i] + c2 * g * g;
        let (mhat, vhat) = (m1[i] / bc1, v1[i] / bc2);
        w1[i] = w[i] - lr * mhat / (vhat.sqrt() + eps);
    }
    (w1, m1, v1)
}

/// Adam in f64 throughout on the same f32 data: the exact answer an f32 Adam is judged
/// against (returns w after the step, in f64).
pub fn adam_exact(grads: &[Vec<f32>], w: &[f32], m: &[f32], v: &[f32], p: AdamParams) -> Vec<f64> {
    let bc1 = 1.0 - p.beta1.powi(p.step);
    let bc2 = 1.0 - p.beta2.powi(p.step);
    (0..w.len())
        .map(|i| {
            let g: f64 = grads.iter().map(|g| g[i] as f64).sum();
            let m1 = p.beta1 * m[i] as f64 + (1.0 - p.beta1) * g;
            let v1 = p.beta2 * v[i] as f64 + (1.0 - p.beta2) * g * g;
            w[i] as f64 - p.lr * (m1 / bc1) / ((v1 / bc2).sqrt() + p.eps)
        })
        .collect()
}
