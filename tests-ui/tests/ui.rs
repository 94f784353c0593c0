//! Compile-time behaviour of `#[coconet]`: every example program (and a program using
//! every operation) compiles and runs, and every class of checker error is reported with
//! a span on the offending tokens (snapshots in `tests/ui/*.stderr`).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass_*.rs");
    t.compile_fail("tests/ui/fail_*.rs");
}
