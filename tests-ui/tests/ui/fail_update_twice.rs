use coconet::prelude::*;

#[coconet]
fn step(g: Tensor<f32, Local, [N]>, w: Tensor<f32, Replicated, [N]>, lr: f32) {
    let g1 = all_reduce(Sum, g);
    let w1 = update(w, w - lr * g1);
    let w2 = update(w, w1 * 0.5);
}

fn main() {}
