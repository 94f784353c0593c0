//! The SGD example program compiles, and agrees with its plain-Rust reference.

#[path = "../../../examples/programs/sgd.rs"]
mod program;

use coconet::prelude::*;

fn main() {
    let p = program::sgd();
    let text = p.program().to_string();
    assert!(text.contains("g1 = all_reduce(Sum, g)"), "{text}");
    assert!(text.contains("w1 = update(w,"), "{text}");
    assert_eq!(p.program().updates().count(), 1);

    let grads = vec![vec![1.0f32, 2.0, 3.0], vec![0.5, -1.0, 4.0]];
    let w = vec![1.0f32, 1.0, 1.0];
    let run = p
        .interpret(
            2,
            program::sgd::Args {
                N: 3,
                g: TensorArg::PerRank(grads.clone()),
                w: TensorArg::Global(w.clone()),
                lr: 0.5,
            },
        )
        .expect("runs");
    let got: Vec<f32> = run.final_input("w").expect("w was updated");
    assert_eq!(got, program::sgd_reference(&grads, &w, 0.5));
}
