//! Compile-time errors of `#[coconet]`: every class of checker error is reported with a
//! span on the offending tokens (snapshots in `tests/ui/*.stderr`). Only failing cases:
//! trybuild then runs `cargo check`, which builds no code for the dependencies; the
//! programs that must compile and run are `tests/programs.rs`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail_*.rs");
}
