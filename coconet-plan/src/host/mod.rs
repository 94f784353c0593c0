//! Host memory and host arithmetic that more than one backend runs on: typed buffers with
//! raw views ([`memory`]) and rank-local matrix products ([`matmul`]). The CPU backend
//! computes with them; the CUDA backend's host emulator stands in for device memory and
//! cuBLAS with them.

pub mod matmul;
pub mod memory;
