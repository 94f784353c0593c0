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

use coconet::runtime::cuda::{Distributed, DistributedJob, PeerAccess};
use coconet::runtime::launch::{LaunchEnv, StoreServer};
use coconet::runtime::{Backend, RuntimeError};
use std::sync::OnceLock;
use std::time::Duration;

/// `Distributed` as rank 0 of a one-rank job, its results read by rank.
struct OneRank(Distributed);

/// A job of [`OneRank`].
struct OneRankJob(DistributedJob);

impl OneRankJob {
    fn local<T: coconet::core::Element>(
        &self,
        v: impl Into<coconet::core::ValueId>,
        rank: usize,
    ) -> Option<Vec<T>> {
        if rank == 0 { self.0.local(v) } else { None }
    }

    fn final_input_local<T: coconet::core::Element>(
        &self,
        name: &str,
        rank: usize,
    ) -> Result<Vec<T>, RuntimeError> {
        match rank {
            0 => self.0.final_input_local(name),
            _ => Err(RuntimeError::Read(format!(
                "rank {rank} is not in this job"
            ))),
        }
    }
}

impl Backend for OneRank {
    type Job = OneRankJob;

    fn prepare(
        &self,
        plan: &coconet::runtime::Plan,
        bindings: &coconet::core::Bindings,
    ) -> Result<OneRankJob, RuntimeError> {
        self.0.prepare(plan, bindings).map(OneRankJob)
    }

    fn run(&self, job: &mut OneRankJob) -> Result<(), RuntimeError> {
        self.0.run(&mut job.0)
    }
}

/// One rank on GPU 0, its memory mapped (`mapped`: CUDA IPC, with no peer to map) or
/// exchanged through NCCL.
fn one_rank(mapped: bool) -> OneRank {
    static SERVER: OnceLock<StoreServer> = OnceLock::new();
    let server = SERVER.get_or_init(|| StoreServer::bind("127.0.0.1:0").expect("a store"));
    let env = LaunchEnv {
        rank: 0,
        world_size: 1,
        local_rank: 0,
        local_world_size: Some(1),
        master_addr: server.local_addr().ip().to_string(),
        master_port: server.local_addr().port(),
        timeout: Duration::from_secs(30),
    };
    let store = env.connect().expect("the store");
    let mut d = Distributed::join(store, &env).expect("a CUDA GPU with NCCL");
    d.access = if mapped {
        PeerAccess::Mapped
    } else {
        PeerAccess::default()
    };
    OneRank(d)
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
