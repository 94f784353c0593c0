//! The example programs, each with its arguments and a plain-Rust reference: compiled
//! once here for the tests, examples and benches that run them. Only the binaries
//! (`coconet-mpi-check`, `coconet-gpu-bench`) include this file as a module: a binary
//! cannot use a crate that depends on its own package.

pub mod adam;
pub mod data;
pub mod lamb;
pub mod megatron;
pub mod pipeline;
pub mod sgd;
