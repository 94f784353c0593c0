use coconet::prelude::*;

#[coconet]
fn step(g: Tensor<f32, Local, [N]>, step: i32) {
    let t = cast(step);
    let g1 = all_reduce(Sum, g) * t;
    g1
}

fn main() {}
