use coconet::prelude::*;

#[coconet]
fn step(
    g: Tensor<f32, Local, [N]>,
    h: Tensor<f16, Local, [N]>,
    s: Tensor<f32, Sliced<0>, [N]>,
    w: Tensor<f32, Replicated, [N]>,
    lr: f32,
) {
    let g1 = all_reduce(Sum, s);
    let mixed = g + h;
    let gathered = all_gather(g);
    let bad = s + g;
    let unknown = sqrtt(w);
    let w1 = update(w, w - lr * missing);
    let mixed = w * 2.0;
    bad
}

fn main() {}
