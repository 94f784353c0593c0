use coconet::prelude::*;

#[coconet]
fn step(g: Tensor<f8, Local, [N]>) {
    let g1 = all_reduce(Sum, g);
    g1
}

fn main() {}
