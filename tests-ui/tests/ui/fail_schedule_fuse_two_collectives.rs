//! A fusion group with two unrelated collectives.
use coconet::prelude::*;

#[coconet(schedule(fused = [fuse([a, b, c])]))]
fn two(x: Tensor<f32, Local, [N]>) {
    let a = all_reduce(Sum, x);
    let b = all_reduce(Max, x);
    let c = a + b;
    c
}

fn main() {}
