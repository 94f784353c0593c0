use coconet::prelude::*;

#[coconet]
fn step(a: Tensor<f32, Replicated, [N]>, b: Tensor<f32, Replicated, [M]>) {
    let c = a + b;
    c
}

fn main() {}
