//! The backend suite on the CUDA backends whose ranks have separate memories, with one
//! rank (cargo feature `cuda`): `Distributed` joined through a store on loopback, its
//! memory exchanged through NCCL or mapped (CUDA IPC; barriers as NCCL all-reduces), and
//! `MultiGpu` (communicators made by `ncclCommInitAll`); the rank's launches on GPU 0,
//! against the reference interpreter. Several ranks need several GPUs (NCCL refuses two ranks on one device);
//! the exchanges between ranks are checked on the host by `backend_cuda_ranks`. Build here,
//! run on a GPU machine (see DEVELOPERS.md).
#![cfg(feature = "cuda")]

#[path = "support/examples.rs"]
mod examples;
use examples::*;

#[macro_use]
#[path = "support/backend_suite.rs"]
mod backend_suite;

use coconet::runtime::cuda::{Distributed, PeerAccess};
use coconet::runtime::launch::{JobSecret, LaunchEnv, StoreServer};
use std::sync::OnceLock;
use std::time::Duration;

/// One rank on GPU 0, its memory mapped (`mapped`: CUDA IPC, with no peer to map) or
/// exchanged through NCCL. Its job answers reads for rank 0, the rank it holds, through
/// the same `JobData` as every other backend's.
fn one_rank(mapped: bool) -> Distributed {
    static SERVER: OnceLock<StoreServer> = OnceLock::new();
    static SECRET: OnceLock<JobSecret> = OnceLock::new();
    let secret = SECRET.get_or_init(|| JobSecret::generate().expect("a secret"));
    let server =
        SERVER.get_or_init(|| StoreServer::bind("127.0.0.1:0", secret.clone()).expect("a store"));
    let env = LaunchEnv {
        launcher: coconet::runtime::launch::Launcher::Coconet,
        rank: 0,
        world_size: 1,
        local_rank: 0,
        local_world_size: Some(1),
        master_addr: server.local_addr().ip().to_string(),
        master_port: server.local_addr().port(),
        timeout: Duration::from_secs(30),
        secret: secret.clone(),
    };
    let store = env.connect().expect("the store");
    let mut d = Distributed::join(store, &env).expect("a CUDA GPU with NCCL");
    d.access = if mapped {
        PeerAccess::Mapped
    } else {
        PeerAccess::default()
    };
    d
}

mod distributed_exchanged {
    use super::*;
    backend_suite!(one_rank(false), [1]);
}

mod distributed_mapped {
    use super::*;
    backend_suite!(one_rank(true), [1]);
}

mod multi_gpu {
    use super::*;
    backend_suite!(
        coconet::runtime::cuda::MultiGpu::new(&[0]).expect("a CUDA GPU with NCCL"),
        [1]
    );
}
