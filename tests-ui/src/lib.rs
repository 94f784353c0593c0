//! No code: the crate holds the compile-time tests of `#[coconet]` — the errors
//! (`tests/ui.rs`, trybuild) and the programs it must accept (`tests/programs.rs`).
//! trybuild checks each failing case in a project that depends on this crate's
//! dev-dependencies, so keeping them to the facade without default features (no HeterPS,
//! no candle) and trybuild saves CI minutes of checking dependencies the cases never use.
