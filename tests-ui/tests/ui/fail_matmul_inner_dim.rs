use coconet::prelude::*;

#[coconet]
fn step(x: Tensor<f32, Replicated, (B, H)>, w: Tensor<f32, Replicated, (K, H)>) {
    let y = matmul(x, w);
    y
}

fn main() {}
