use coconet::prelude::*;

#[coconet]
fn step(g: Tensor<f32, Local, [N]>, w: Tensor<f32, Replicated, [N]>, lr: f32) {
    let w1 = update(w, w - lr * g);
}

fn main() {}
