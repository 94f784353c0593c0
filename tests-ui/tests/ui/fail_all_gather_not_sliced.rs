use coconet::prelude::*;

#[coconet]
fn step(g: Tensor<f32, Local, [N]>) {
    let g1 = all_gather(g);
    g1
}

fn main() {}
