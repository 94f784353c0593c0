//! The backend suite on the CUDA backends whose ranks have separate memories, with one
//! rank (cargo feature `cuda`): `Distributed` joined through a store on loopback, its
//! memory exchanged through NCCL or mapped (CUDA IPC; barriers as NCCL all-reduces), and
//! `MultiGpu` (communicators made by `ncclCommInitAll`); the rank's launches on GPU 0,
//! against the reference interpreter. Several ranks need several GPUs (NCCL refuses two ranks on one device);
//! the exchanges between ranks are checked on the host by `backend_cuda_ranks`. Build here,
//! run on a GPU machine (see DEVELOPERS.md).
#![cfg(feature = "cuda")]

use coconet::runtime::cuda::{Distributed, PeerAccess};

/// One rank on GPU 0, its memory mapped (`mapped`: CUDA IPC, with no peer to map) or
/// exchanged through NCCL. Its job answers reads for rank 0, the rank it holds, through
/// the same `JobData` as every other backend's.
fn one_rank(mapped: bool) -> Distributed {
    let mut d = Distributed::single_process().expect("a CUDA GPU with NCCL");
    d.access = if mapped {
        PeerAccess::Mapped
    } else {
        PeerAccess::default()
    };
    d
}

mod distributed_exchanged {
    use super::*;
    coconet_backend_suite::backend_suite!(one_rank(false), [1]);
}

mod distributed_mapped {
    use super::*;
    coconet_backend_suite::backend_suite!(one_rank(true), [1]);
}

mod multi_gpu {
    coconet_backend_suite::backend_suite!(
        coconet::runtime::cuda::MultiGpu::new(&[0]).expect("a CUDA GPU with NCCL"),
        [1]
    );
}
