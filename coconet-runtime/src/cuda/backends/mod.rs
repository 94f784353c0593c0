//! The CUDA backends users construct: one device with virtual ranks ([`one_device`]), a
//! thread per GPU ([`multi_gpu`]), a process per GPU ([`distributed`]), a thread per
//! emulated device ([`emulated_ranks`]).

#[cfg(feature = "cuda")]
pub(crate) mod distributed;
pub(crate) mod emulated_ranks;
#[cfg(feature = "cuda")]
pub(crate) mod multi_gpu;
pub(crate) mod one_device;
#[cfg(not(feature = "cuda"))]
pub(crate) mod without_cuda;
