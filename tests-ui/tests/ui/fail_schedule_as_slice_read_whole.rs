//! `as_slice` of optimizer state that is still read whole (reorder first).
use coconet::prelude::*;

#[coconet(schedule(sharded = [split(g1), as_slice([m])]))]
fn momentum(
    g: Tensor<f32, Local, [N]>,
    w: Tensor<f32, Replicated, [N]>,
    m: Tensor<f32, Replicated, [N]>,
    lr: f32,
) {
    let g1 = all_reduce(Sum, g);
    let m1 = update(m, 0.9 * m + g1);
    let w1 = update(w, w - lr * m1);
}

fn main() {}
