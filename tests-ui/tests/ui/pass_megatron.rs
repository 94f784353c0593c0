//! The Megatron example program compiles; the matmul of two Sliced operands is a Local
//! partial sum, and the all-reduce makes it Replicated.

#[allow(dead_code)]
#[path = "../../../examples/programs/data.rs"]
mod data;
#[allow(dead_code)]
#[path = "../../../examples/programs/megatron.rs"]
mod program;

use coconet::prelude::*;

fn main() {
    let p = program::megatron();
    let prog = p.program();
    let text = prog.to_string();
    assert!(text.contains("partial = matmul(x, w)"), "{text}");
    assert!(text.contains("sum = all_reduce(Sum, partial)"), "{text}");
    assert!(text.contains("dropout("), "{text}");
    assert!(text.contains("out = layer_norm("), "{text}");
    let ty = |name: &str| &prog.node(prog.find(name).expect(name)).ty;
    assert_eq!(ty("partial").layout, Layout::Local);
    assert_eq!(ty("sum").layout, Layout::Replicated);
    assert_eq!(ty("out").dtype, DType::F16);
    assert_eq!(prog.outputs(), &[prog.find("out").unwrap()]);
}
