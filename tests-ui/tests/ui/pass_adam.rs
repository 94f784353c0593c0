//! The Adam example program compiles and contains its collective and three updates.

#[allow(dead_code)]
#[path = "../../../examples/programs/adam.rs"]
mod program;

fn main() {
    let p = program::adam();
    let text = p.program().to_string();
    assert!(text.contains("g1 = all_reduce(Sum, g)"), "{text}");
    assert!(text.contains("t = cast(step)"), "{text}");
    assert!(text.contains("pow("), "{text}");
    assert!(text.contains("sqrt("), "{text}");
    assert_eq!(p.program().updates().count(), 3, "{text}");
    assert!(p.program().find("w1").is_some());
}
