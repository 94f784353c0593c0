//! Data-parallel LAMB (You et al.): Adam's direction plus weight decay, scaled per tensor
//! by the trust ratio ‖w‖ / ‖r‖.

use coconet::prelude::*;

/// One LAMB step on one parameter tensor (norms are per tensor).
#[coconet]
pub fn lamb(
    g: Tensor<f32, Local, [N]>,
    w: Tensor<f32, Replicated, [N]>,
    m: Tensor<f32, Replicated, [N]>,
    v: Tensor<f32, Replicated, [N]>,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    step: i32,
) {
    let g1 = all_reduce(Sum, g);
    let m1 = update(m, beta1 * m + (1.0 - beta1) * g1);
    let v1 = update(v, beta2 * v + (1.0 - beta2) * g1 * g1);
    let t = cast::<f32>(step);
    let mhat = m1 / (1.0 - pow(beta1, t));
    let vhat = v1 / (1.0 - pow(beta2, t));
    let r = mhat / (sqrt(vhat) + eps) + weight_decay * w;
    let r_norm = norm2(r);
    let w_norm = norm2(w);
    let trust = select(
        w_norm > 0.0,
        select(r_norm > 0.0, w_norm / r_norm, 1.0),
        1.0,
    );
    let w1 = update(w, w - lr * trust * r);
}

/// LAMB hyper-parameters.
#[derive(Clone, Copy)]
pub struct LambParams {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// 1-based step number.
    pub step: i32,
}

/// The program's arguments: rank r's gradient is `grads[r]`; w, m, v are whole tensors.
pub fn lamb_args(grads: &[Vec<f32>], w: &[f32], m: &[f32], v: &[f32], p: LambParams) -> lamb::Args {
    lamb::Args {
        N: w.len(),
        g: TensorArg::PerRank(grads.to_vec()),
        w: TensorArg::Global(w.to_vec()),
        m: TensorArg::Global(m.to_vec()),
        v: TensorArg::Global(v.to_vec()),
        lr: p.lr,
        beta1: p.beta1,
        beta2: p.beta2,
        eps: p.eps,
        weight_decay: p.weight_decay,
        step: p.step,
    }
}

/// Plain-Rust LAMB (f64 norms, f32 elsewhere); returns (w, m, v) after the step.
pub fn lamb_reference(
    grads: &[Vec<f32>],
    w: &[f32],
    m: &[f32],
    v: &[f32],
    p: LambParams,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let n = w.len();
    let (mut m1, mut v1, mut r) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    let bc1 = 1.0 - p.beta1.powi(p.step);
    let bc2 = 1.0 - p.beta2.powi(p.step);
    for i in 0..n {
        let g: f32 = grads.iter().map(|g| g[i]).sum();
        m1[i] = p.beta1 * m[i] + (1.0 - p.beta1) * g;
        v1[i] = p.beta2 * v[i] + (1.0 - p.beta2) * g * g;
        r[i] = (m1[i] / bc1) / ((v1[i] / bc2).sqrt() + p.eps) + p.weight_decay * w[i];
    }
    let norm = |x: &[f32]| x.iter().map(|&a| (a as f64).powi(2)).sum::<f64>().sqrt() as f32;
    let (wn, rn) = (norm(w), norm(&r));
    let trust = if wn > 0.0 && rn > 0.0 { wn / rn } else { 1.0 };
    let w1 = (0..n).map(|i| w[i] - p.lr * trust * r[i]).collect();
    (w1, m1, v1)
}
