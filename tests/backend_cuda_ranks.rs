//! The backend suite on the CUDA backend's multi-process path (a rank per device, its
//! own memory, bytes exchanged between ranks — NCCL's role), with every rank a thread
//! driving its own host emulator: every example × schedule × P against the reference
//! interpreter, without a GPU.

#[path = "support/examples.rs"]
mod examples;
use examples::*;

#[macro_use]
#[path = "support/backend_suite.rs"]
mod backend_suite;

backend_suite!(coconet::runtime::cuda::EmulatedRanks::default());
