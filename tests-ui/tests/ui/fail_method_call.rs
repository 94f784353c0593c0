use coconet::prelude::*;

#[coconet]
fn step(g: Tensor<f32, Local, [N]>) {
    let g1 = all_reduce(Sum, g);
    let r = g1.sqrt();
    r
}

fn main() {}
