use coconet::prelude::*;

#[coconet]
fn step(g: Tensor<f32, Local, [N]>, lr: f32) {
    let g1 = all_reduce(Sum, g);
    let g2 = update(g1, g1 * lr);
}

fn main() {}
