//! Steps with the wrong arguments, and a schedule that is not a list of steps.
use coconet::prelude::*;

#[coconet(schedule(one = [overlap(g1)], two = split))]
fn sgd(g: Tensor<f32, Local, [N]>, w: Tensor<f32, Replicated, [N]>, lr: f32) {
    let g1 = all_reduce(Sum, g);
    let w1 = update(w, w - lr * g1);
}

fn main() {}
