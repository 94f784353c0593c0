// A checker error reports the program's own mistake only: the function, its handles and
// its `Args` are still emitted, so the code that uses them (and rust-analyzer) still
// resolves them.
use coconet::prelude::*;

#[coconet]
fn step(g: Tensor<f32, Local, [N]>, w: Tensor<f32, Replicated, [N]>, lr: f32) {
    let grad = all_reduce(Sum, g);
    let w1 = update(w, w - lr * grda);
}

fn main() {
    let program = step();
    let _ = program.w.id();
    let _args = step::Args {
        N: 4,
        g: TensorArg::PerRank(vec![vec![0.0; 4]]),
        w: TensorArg::Global(vec![0.0; 4]),
        lr: 0.1,
    };
}
