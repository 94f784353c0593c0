//! `split` of a stage that is not an all_reduce: the failing step is pointed at.
use coconet::prelude::*;

#[coconet(schedule(fast = [split(g1), split(w1)]))]
fn sgd(g: Tensor<f32, Local, [N]>, w: Tensor<f32, Replicated, [N]>, lr: f32) {
    let g1 = all_reduce(Sum, g);
    let w1 = update(w, w - lr * g1);
}

fn main() {}
