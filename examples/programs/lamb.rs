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
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    step: i32,
) {
    let g1 = all_reduce(Sum, g);
    // Hyper-parameter arithmetic in f64, rounded to f32 once (as in the Adam example).
    let t = cast::<f64>(step);
    let c1 = cast::<f32>(1.0 - beta1);
    let c2 = cast::<f32>(1.0 - beta2);
    let m1 = update(m, cast::<f32>(beta1) * m + c1 * g1);
    let v1 = update(v, cast::<f32>(beta2) * v + c2 * g1 * g1);
    let mhat = m1 / cast::<f32>(1.0 - pow(beta1, t));
    let vhat = v1 / cast::<f32>(1.0 - pow(beta2, t));
    let r = mhat / (sqrt(vhat) + cast::<f32>(eps)) + cast::<f32>(weight_decay) * w;
    let r_norm = norm2(r);
    let w_norm = norm2(w);
    let trust = select(
        w_norm > 0.0,
        select(r_norm > 0.0, w_norm / r_norm, 1.0),
        1.0,
    );
    let w1 = update(w, w - cast::<f32>(lr) * trust * r);
}

/// LAMB hyper-parameters.
#[derive(Clone, Copy)]
pub struct LambParams {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// 1-based step number.
    pub step: i32,
}

impl Default for LambParams {
    /// The LAMB paper's settings with lr = 1e-2 and weight decay 0.01, at the first step.
    fn default() -> LambParams {
        LambParams {
            lr: 1e-2,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-6,
            weight_decay: 0.01,
            step: 1,
        }
    }
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

/// Plain-Rust LAMB (f64 norms and hyper-parameter arithmetic, f32 elsewhere); returns
/// (w, m, v) after the step.
pub fn lamb_reference(
    grads: &[Vec<f32>],
    w: &[f32],
    m: &[f32],
    v: &[f32],
    p: LambParams,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let n = w.len();
    let (mut m1, mut v1, mut r) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    for i in 0..n {
        (m1[i], v1[i], r[i]) = lamb_element(grads, w, m, v, p, i);
    }
    let trust = lamb_trust(w.iter().copied().zip(r.iter().copied()));
    let lr = p.lr as f32;
    let w1 = w
        .iter()
        .zip(&r)
        .map(|(&w, &r)| w - lr * trust * r)
        .collect();
    (w1, m1, v1)
}

/// Plain-Rust LAMB at element `i`: the new m and v and the direction r.
pub fn lamb_element(
    grads: &[Vec<f32>],
    w: &[f32],
    m: &[f32],
    v: &[f32],
    p: LambParams,
    i: usize,
) -> (f32, f32, f32) {
    let (b1, b2) = (p.beta1 as f32, p.beta2 as f32);
    let (c1, c2) = ((1.0 - p.beta1) as f32, (1.0 - p.beta2) as f32);
    let bc1 = (1.0 - p.beta1.powi(p.step)) as f32;
    let bc2 = (1.0 - p.beta2.powi(p.step)) as f32;
    let (eps, wd) = (p.eps as f32, p.weight_decay as f32);
    let g: f32 = grads.iter().map(|g| g[i]).sum();
    let m1 = b1 * m[i] + c1 * g;
    let v1 = b2 * v[i] + c2 * g * g;
    (m1, v1, (m1 / bc1) / ((v1 / bc2).sqrt() + eps) + wd * w[i])
}

/// The trust ratio ‖w‖ / ‖r‖ (1 where either is zero) from every (w, r) pair, the norms
/// in f64 (streamed: a caller need not hold all of r).
pub fn lamb_trust(pairs: impl Iterator<Item = (f32, f32)>) -> f32 {
    let (mut wn, mut rn) = (0f64, 0f64);
    for (w, r) in pairs {
        wn += (w as f64).powi(2);
        rn += (r as f64).powi(2);
    }
    let (wn, rn) = (wn.sqrt() as f32, rn.sqrt() as f32);
    if wn > 0.0 && rn > 0.0 { wn / rn } else { 1.0 }
}
