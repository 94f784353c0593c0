use coconet::prelude::*;

#[coconet]
fn step(
    x: Tensor<f32, Sliced<2>, (B, S, H)>,
    gamma: Tensor<f32, Replicated, [H]>,
    beta: Tensor<f32, Replicated, [H]>,
) {
    let y = layer_norm(x, gamma, beta, 0.00001);
    y
}

fn main() {}
