use coconet::prelude::*;

#[coconet]
fn step(g: Tensor<f32, Local, [N]>, lr: f32) {
    let g1 = all_reduce(Sum, g);
    let g1 = g1 * lr;
    g1
}

fn main() {}
