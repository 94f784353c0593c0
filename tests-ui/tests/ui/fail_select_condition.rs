use coconet::prelude::*;

#[coconet]
fn step(x: Tensor<f32, Replicated, [N]>, m: Tensor<f32, Replicated, [N]>) {
    let y = select(m, x, 0.0);
    y
}

fn main() {}
