//! The backend suite on a real GPU (cargo feature `cuda`): every example × schedule ×
//! P virtual ranks on GPU 0 against the reference interpreter. Build here, run on a GPU
//! machine (see DEVELOPERS.md):
//!
//! ```text
//! cargo test --release --features cuda --test backend_cuda --no-run
//! ```
#![cfg(feature = "cuda")]

#[allow(dead_code)]
#[path = "../examples/programs/adam.rs"]
mod adam_program;
#[allow(dead_code)]
#[path = "../examples/programs/data.rs"]
mod data;
#[allow(dead_code)]
#[path = "../examples/programs/lamb.rs"]
mod lamb_program;
#[allow(dead_code)]
#[path = "../examples/programs/megatron.rs"]
mod megatron_program;
#[allow(dead_code)]
#[path = "../examples/programs/pipeline.rs"]
mod pipeline_program;
#[allow(dead_code)]
#[path = "../examples/programs/sgd.rs"]
mod sgd_program;

#[macro_use]
#[path = "support/backend_suite.rs"]
mod backend_suite;

backend_suite!(coconet::runtime::cuda::Cuda::new(0).expect("a CUDA GPU"));
