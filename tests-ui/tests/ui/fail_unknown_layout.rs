use coconet::prelude::*;

#[coconet]
fn step(g: Tensor<f32, Sharded, [N]>) {
    let g1 = all_reduce(Sum, g);
    g1
}

fn main() {}
