use coconet::prelude::*;

#[coconet]
fn step(s: Tensor<f32, Sliced<0>, [N]>, l: Tensor<f32, Local, [N]>) {
    let y = s + l;
    y
}

fn main() {}
