use coconet::prelude::*;

#[coconet]
fn step(x: Tensor<f32, Sliced<1>, (B, H)>) {
    let y = all_reduce(Sum, x);
    y
}

fn main() {}
