use coconet::prelude::*;

#[coconet]
fn step(a: Tensor<f32, Replicated, [N]>, b: Tensor<f16, Replicated, [N]>) {
    let c = a + b;
    c
}

fn main() {}
