//! The LAMB example program compiles: norms, the trust-ratio selects and three updates.

#[allow(dead_code)]
#[path = "../../../examples/programs/lamb.rs"]
mod program;

fn main() {
    let p = program::lamb();
    let text = p.program().to_string();
    assert!(text.contains("g1 = all_reduce(Sum, g)"), "{text}");
    assert!(text.contains("r_norm = norm2(r)"), "{text}");
    assert!(text.contains("w_norm = norm2(w)"), "{text}");
    assert!(text.contains("trust = select("), "{text}");
    assert_eq!(p.program().updates().count(), 3, "{text}");
}
