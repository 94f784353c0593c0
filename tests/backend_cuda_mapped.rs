//! The backend suite on ranks that address each other's memory directly (GPUs of one
//! machine with peer access): every rank a thread with its own emulated device, its
//! kernels reading and writing peers' buffers through mapped addresses, ranks meeting at
//! barriers where one's work touches what another's touched. Every example × schedule ×
//! P against the reference interpreter, without a GPU; debug builds also replay all
//! ranks' streams and barriers together and fail on an unordered pair of accesses.

use coconet::runtime::cuda::{EmulatedRanks, PeerAccess};

coconet_backend_suite::backend_suite!(EmulatedRanks {
    access: PeerAccess::Mapped,
    ..Default::default()
});
