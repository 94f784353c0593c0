//! The optimizer program the data-parallel trainer runs: AdamW as candle-nn computes it
//! (bias-corrected moments, decoupled weight decay), on gradients averaged over ranks.

use crate::prelude::*;

/// One AdamW step on the model's parameters (all of them, as one tensor of `N` elements
/// bound as pieces), after averaging each rank's gradient.
#[coconet]
pub fn adamw(
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
    let g1 = all_reduce(Avg, g);
    let m1 = update(m, beta1 * m + (1.0 - beta1) * g1);
    let v1 = update(v, beta2 * v + (1.0 - beta2) * g1 * g1);
    let t = cast::<f32>(step);
    let mhat = m1 / (1.0 - pow(beta1, t));
    let vhat = v1 / (1.0 - pow(beta2, t));
    let decayed = w * (1.0 - lr * weight_decay);
    let w1 = update(w, decayed - lr * (mhat / (sqrt(vhat) + eps)));
}
