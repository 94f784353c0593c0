//! The backend suite on a real GPU (cargo feature `cuda`): every example × schedule ×
//! P virtual ranks on GPU 0 against the reference interpreter. Build here, run on a GPU
//! machine (see DEVELOPERS.md):
//!
//! ```text
//! cargo test --release --features cuda --test backend_cuda --no-run
//! ```
#![cfg(feature = "cuda")]

#[path = "support/examples.rs"]
mod examples;
use examples::*;

#[macro_use]
#[path = "support/backend_suite.rs"]
mod backend_suite;

backend_suite!(coconet::runtime::cuda::Cuda::new(0).expect("a CUDA GPU"));
