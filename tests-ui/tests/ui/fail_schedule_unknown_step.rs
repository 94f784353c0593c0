//! A schedule step that does not exist.
use coconet::prelude::*;

#[coconet(schedule(fast = [splitt(g1)]))]
fn sgd(g: Tensor<f32, Local, [N]>, w: Tensor<f32, Replicated, [N]>, lr: f32) {
    let g1 = all_reduce(Sum, g);
    let w1 = update(w, w - lr * g1);
}

fn main() {}
