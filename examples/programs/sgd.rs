//! Data-parallel SGD: average-free gradient all-reduce, then `w -= lr * g`.

use coconet::prelude::*;

/// One SGD step: the Local gradients of all ranks are summed, and every rank applies the
/// same update to its Replicated copy of the weights.
#[coconet]
pub fn sgd(g: Tensor<f32, Local, [N]>, w: Tensor<f32, Replicated, [N]>, lr: f32) {
    let g1 = all_reduce(Sum, g);
    let w1 = update(w, w - lr * g1);
}

/// Plain-Rust SGD on one process: `grads[r]` is rank r's gradient.
pub fn sgd_reference(grads: &[Vec<f32>], w: &[f32], lr: f32) -> Vec<f32> {
    (0..w.len())
        .map(|i| {
            let g: f32 = grads.iter().map(|g| g[i]).sum();
            w[i] - lr * g
        })
        .collect()
}
