//! The pipeline example program compiles with two groups; its output lives in group 1.

#[allow(dead_code)]
#[path = "../../../examples/programs/pipeline.rs"]
mod program;

use coconet::core::Placement;

fn main() {
    let p = program::pipeline();
    let prog = p.program();
    let text = prog.to_string();
    assert!(text.starts_with("program pipeline (2 groups)"), "{text}");
    assert!(text.contains("sum = all_reduce(Sum, x)"), "{text}");
    assert!(text.contains("out = send(y, Next)"), "{text}");
    let out = prog.find("out").unwrap();
    assert_eq!(prog.node(out).ty.placement, Placement::Group(1));
    assert_eq!(prog.outputs(), &[out]);
}
