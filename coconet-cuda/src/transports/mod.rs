//! How ranks with separate memories move bytes: NCCL between GPUs ([`nccl`]), CUDA IPC
//! handles shared through the launcher's store ([`ipc_table`]), in-process mailboxes
//! between emulated devices ([`mailboxes`]).

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) mod ipc_table;
pub(crate) mod mailboxes;
#[cfg(feature = "cuda")]
pub(crate) mod nccl;
