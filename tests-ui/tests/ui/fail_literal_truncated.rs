use coconet::prelude::*;

#[coconet]
fn step(w: Tensor<f16, Replicated, [N]>, t: i32) {
    let x = w + 1e-8;
    let u = t + 0.5;
}

fn main() {}
