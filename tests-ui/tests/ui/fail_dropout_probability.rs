use coconet::prelude::*;

#[coconet]
fn step(x: Tensor<f32, Replicated, [N]>, seed: i64) {
    let y = dropout(x, 1.5, seed);
    y
}

fn main() {}
