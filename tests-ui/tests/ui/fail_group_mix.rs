use coconet::prelude::*;

#[coconet(groups = 2)]
fn step(a: Tensor<f32, Replicated, [N]>, b: Tensor<f32, Replicated, [N], Group<1>>) {
    let c = a + b;
    c
}

fn main() {}
