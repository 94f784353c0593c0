use coconet::prelude::*;

#[coconet]
fn step(x: Tensor<f32, Local, (B, H)>) {
    let y = all_reduce(Sum, x);
    let out = send(y, Next);
    out
}

fn main() {}
