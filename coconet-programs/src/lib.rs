//! # coconet-programs: the built-in optimizer programs
//!
//! The programs the data-parallel trainer runs, each on gradients
//! averaged over ranks: AdamW as candle-nn computes it (bias-corrected moments, decoupled
//! weight decay) and SGD with momentum as torch computes it; each also with global-norm
//! clipping of the averaged gradient as torch's `clip_grad_norm_` does it (scale by
//! `min(max_norm / (‖g‖ + 1e-6), 1)`). Clipping is a separate program rather than a
//! flag because the norm is a cross-rank reduction in the middle of the fused step: a
//! program without it does one pass over each rank's slice, one with it two.

use coconet_macros::coconet;

/// The library as the programs' generated code names it (`#[coconet(crate = crate::cn)]`):
/// this crate sits below the `coconet` facade.
mod cn {
    pub(crate) use coconet_core as core;
}

/// One AdamW step on the model's parameters (all of them, as one tensor of `N` elements
/// bound as pieces), after averaging each rank's gradient.
#[coconet(crate = crate::cn)]
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

/// [`adamw()`] on the averaged gradient clipped to global norm `max_norm`.
#[coconet(crate = crate::cn)]
pub fn adamw_clipped(
    g: Tensor<f32, Local, [N]>,
    w: Tensor<f32, Replicated, [N]>,
    m: Tensor<f32, Replicated, [N]>,
    v: Tensor<f32, Replicated, [N]>,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    max_norm: f32,
    step: i32,
) {
    let g0 = all_reduce(Avg, g);
    let g1 = g0 * min(max_norm / (norm2(g0) + 1e-6), 1.0);
    let m1 = update(m, beta1 * m + (1.0 - beta1) * g1);
    let v1 = update(v, beta2 * v + (1.0 - beta2) * g1 * g1);
    let t = cast::<f32>(step);
    let mhat = m1 / (1.0 - pow(beta1, t));
    let vhat = v1 / (1.0 - pow(beta2, t));
    let decayed = w * (1.0 - lr * weight_decay);
    let w1 = update(w, decayed - lr * (mhat / (sqrt(vhat) + eps)));
}

/// SGD with momentum (torch's: `d = g + wd·w`, `buf = μ·buf + d`, step along `buf`, or
/// along `d + μ·buf` when `nesterov` is 1; no dampening). The first step's `buf` is `d`,
/// as torch's, because `buf` starts at zero.
#[coconet(crate = crate::cn)]
pub fn sgd(
    g: Tensor<f32, Local, [N]>,
    w: Tensor<f32, Replicated, [N]>,
    buf: Tensor<f32, Replicated, [N]>,
    lr: f32,
    momentum: f32,
    weight_decay: f32,
    nesterov: f32,
) {
    let d = all_reduce(Avg, g) + weight_decay * w;
    let b1 = update(buf, momentum * buf + d);
    let dir = (1.0 - nesterov) * b1 + nesterov * (d + momentum * b1);
    let w1 = update(w, w - lr * dir);
}

/// [`sgd()`] on the averaged gradient clipped to global norm `max_norm`.
#[coconet(crate = crate::cn)]
pub fn sgd_clipped(
    g: Tensor<f32, Local, [N]>,
    w: Tensor<f32, Replicated, [N]>,
    buf: Tensor<f32, Replicated, [N]>,
    lr: f32,
    momentum: f32,
    weight_decay: f32,
    nesterov: f32,
    max_norm: f32,
) {
    let g0 = all_reduce(Avg, g);
    let d = g0 * min(max_norm / (norm2(g0) + 1e-6), 1.0) + weight_decay * w;
    let b1 = update(buf, momentum * buf + d);
    let dir = (1.0 - nesterov) * b1 + nesterov * (d + momentum * b1);
    let w1 = update(w, w - lr * dir);
}

/// The sum over ranks of each rank's `x`, written into `y` on every rank: the all-reduce
/// of a tensor-parallel layer (the row-parallel forward, the column-parallel backward).
#[coconet(crate = crate::cn)]
pub fn tp_sum(x: Tensor<f32, Local, [N]>, y: Tensor<f32, Replicated, [N]>) {
    let y1 = update(y, all_reduce(Sum, x));
}

/// The elementwise maximum over ranks of each rank's `x`, into `y` on every rank (the
/// vocabulary-parallel cross-entropy's row maxima).
#[coconet(crate = crate::cn)]
pub fn tp_max(x: Tensor<f32, Local, [N]>, y: Tensor<f32, Replicated, [N]>) {
    let y1 = update(y, all_reduce(Max, x));
}

/// Every rank's block of `x`, concatenated in rank order into `y` on every rank
/// (gathering a tensor-parallel layer's shards back into the whole weight).
#[coconet(crate = crate::cn)]
pub fn tp_gather(x: Tensor<f32, Sliced<0>, [N]>, y: Tensor<f32, Replicated, [N]>) {
    let y1 = update(y, all_gather(x));
}

/// A row-parallel layer's epilogue fused into its all-reduce: `r + (Σ_ranks p + b)` —
/// the partial products summed, the bias added, then the residual, each element once
/// (the reduce-scatter's block on each rank, then the all-gather).
#[coconet(crate = crate::cn)]
pub fn tp_bias_residual(
    p: Tensor<f32, Local, (T, H)>,
    b: Tensor<f32, Replicated, [H]>,
    r: Tensor<f32, Replicated, (T, H)>,
    y: Tensor<f32, Replicated, (T, H)>,
) {
    let s = all_reduce(Sum, p);
    let y1 = update(y, r + (s + b));
}

/// The sum over ranks of each rank's `x`, this rank's block of it (dim 0) into `y`: the
/// sequence-parallel variant's reduce-scatter (a row-parallel layer's forward).
#[coconet(crate = crate::cn)]
pub fn tp_reduce_scatter(x: Tensor<f32, Local, [N]>, y: Tensor<f32, Sliced<0>, [N]>) {
    let y1 = update(y, reduce_scatter(Sum, x));
}

/// [`tp_bias_residual()`] with dropout on the layer's output before the residual:
/// `r + dropout(Σ_ranks p + b, drop, seed)` (Megatron's bias-dropout-add), the mask a
/// function of each element's index in the whole `[T, H]` tensor.
#[coconet(crate = crate::cn)]
pub fn tp_bias_dropout_residual(
    p: Tensor<f32, Local, (T, H)>,
    b: Tensor<f32, Replicated, [H]>,
    r: Tensor<f32, Replicated, (T, H)>,
    y: Tensor<f32, Replicated, (T, H)>,
    drop: f32,
    seed: i64,
) {
    let s = all_reduce(Sum, p);
    let y1 = update(y, r + dropout(s + b, drop, seed));
}

/// [`tp_bias_dropout_residual()`] with the layer norm that follows it fused in too (the
/// paper's whole Megatron epilogue): `x = r + dropout(Σ_ranks p + b, drop, seed)` into
/// `y` (the residual stream) and `layer_norm(x, gamma, beta)` into `n` (the next
/// sublayer's input), each rank normalising only its block of the rows between the
/// reduce-scatter and the all-gather.
#[coconet(crate = crate::cn)]
pub fn tp_bias_dropout_residual_norm(
    p: Tensor<f32, Local, (T, H)>,
    b: Tensor<f32, Replicated, [H]>,
    r: Tensor<f32, Replicated, (T, H)>,
    gamma: Tensor<f32, Replicated, [H]>,
    beta: Tensor<f32, Replicated, [H]>,
    y: Tensor<f32, Replicated, (T, H)>,
    n: Tensor<f32, Replicated, (T, H)>,
    drop: f32,
    seed: i64,
) {
    let s = all_reduce(Sum, p);
    let x = r + dropout(s + b, drop, seed);
    let y1 = update(y, x);
    let n1 = update(n, layer_norm(x, gamma, beta, 0.00001));
}
