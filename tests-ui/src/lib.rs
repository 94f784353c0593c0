//! No code: the crate holds the UI tests of `#[coconet]` (`tests/ui.rs`). trybuild
//! compiles each case in a project that depends on this crate's dev-dependencies, so
//! keeping them to the facade without default features (no HeterPS, no candle) and
//! trybuild saves CI minutes of compiling dependencies the cases never use.
