//! The backend suite on the CUDA backend's multi-process path (a rank per device, its
//! own memory, bytes exchanged between ranks — NCCL's role), with every rank a thread
//! driving its own host emulator: every example × schedule × P against the reference
//! interpreter, without a GPU. Exchanges are cut into chunks of a few hundred bytes, so
//! the pipelined order (chunk c + 1's sources staged and chunk c's results sent around
//! chunk c's kernels) is what runs wherever a phase can be cut.

use coconet::runtime::cuda::{EmulatedRanks, PeerAccess, Pipelining};

coconet_backend_suite::backend_suite!(EmulatedRanks {
    access: PeerAccess::Exchanged(Pipelining {
        chunk_bytes: 256,
        max_chunks: 4,
    }),
    ..Default::default()
});
