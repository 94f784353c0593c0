//! A step naming a value that does not exist at that point.
use coconet::prelude::*;

#[coconet(schedule(fast = [split(g1), fuse_all_reduce(g1_reduce_scatter)]))]
fn sgd(g: Tensor<f32, Local, [N]>, w: Tensor<f32, Replicated, [N]>, lr: f32) {
    let g1 = all_reduce(Sum, g);
    let w1 = update(w, w - lr * g1);
}

fn main() {}
