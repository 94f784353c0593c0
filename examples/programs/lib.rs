//! The example programs, each with its arguments and a plain-Rust reference: compiled
//! once here for the tests, examples and benches that run them. The binaries
//! (`coconet-mpi-check`, `coconet-gpu-bench`) and the UI tests include the files
//! themselves (a binary cannot use a crate that depends on its own package; a UI test
//! checks that the file compiles on its own).

pub mod adam;
pub mod data;
pub mod lamb;
pub mod megatron;
pub mod pipeline;
pub mod sgd;
