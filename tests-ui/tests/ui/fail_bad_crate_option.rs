use coconet::prelude::*;

#[coconet(crate = "coconet")]
fn quoted(g: Tensor<f32, Local, [N]>) {
    let g1 = all_reduce(Sum, g);
    g1
}

#[coconet(crate = coconet::core::Program::<f32>)]
fn generic(g: Tensor<f32, Local, [N]>) {
    let g1 = all_reduce(Sum, g);
    g1
}

#[coconet(crate = 1 + 1)]
fn not_a_path(g: Tensor<f32, Local, [N]>) {
    let g1 = all_reduce(Sum, g);
    g1
}

fn main() {}
