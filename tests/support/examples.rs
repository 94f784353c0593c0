//! The example programs (`examples/programs/`, the `coconet-example-programs` crate),
//! under the names the test files use: `#[path = "support/examples.rs"] mod examples;
//! use examples::*;`. Each test file uses some of them.

#![allow(unused_imports)]

pub use coconet_example_programs::{
    adam as adam_program, data, lamb as lamb_program, megatron as megatron_program,
    pipeline as pipeline_program, sgd as sgd_program,
};
