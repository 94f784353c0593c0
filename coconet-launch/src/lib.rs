//! # coconet-launch: multi-process jobs, the launcher and the rendezvous store
//!
//! The CPU backend runs every rank as a thread of one process; the CUDA backend (one
//! process per GPU, possibly on several machines) cannot. Its ranks are separate
//! processes that must be started together, must find each other before NCCL can connect
//! them (rank 0 creates the NCCL unique id; everyone else needs its bytes), and must be
//! stopped together when one fails — otherwise the survivors block forever in their next
//! collective. This module provides both halves:
//!
//! - `launch` (the `coconet-launch` binary, its command line [`cli`]; feature `launcher`): starts `--nproc-per-node` ranks per node
//!   with torchrun's options and environment variables, watches them, and when any rank
//!   exits abnormally kills the others and reports which rank failed and how.
//! - [`Store`] / `StoreServer` (feature `launcher`, tokio): a small TCP key-value store with blocking waits
//!   (`set`, `get`, `wait`, `add`, `barrier`), hosted by node 0's launcher at
//!   `MASTER_ADDR:MASTER_PORT`, through which ranks exchange bootstrap bytes. Every
//!   operation has a timeout and returns a [`StoreError`] rather than hanging.
//! - [`LaunchEnv`]: a rank's view of what the launcher told it.
//! - [`Heartbeat`]: a rank telling the launcher it is alive (`--heartbeat-timeout`);
//!   coconet's process backends beat at every run.
//!
//! A rank's side, e.g. sharing the NCCL unique id:
//!
//! ```no_run
//! use coconet_launch::LaunchEnv;
//! # fn nccl_unique_id() -> Vec<u8> { vec![0; 128] }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let env = LaunchEnv::from_env()?; // RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...
//! let mut store = env.connect()?;
//! if env.rank == 0 {
//!     store.set("nccl/unique_id", &nccl_unique_id())?;
//! }
//! let id = store.get("nccl/unique_id", env.timeout)?;
//! store.barrier("ready", env.world_size, env.timeout)?;
//! # let _ = id; Ok(()) }
//! ```
//!
//! Launching MPI jobs stays with `mpirun`.

#[cfg(feature = "launcher")]
pub mod cli;
mod env;
mod heartbeat;
#[cfg(feature = "launcher")]
mod launcher;
mod launchers;
mod protocol;
#[cfg(feature = "launcher")]
mod server;
#[cfg(feature = "launcher")]
mod signals;
mod store;

pub use coconet_trust::{
    INSECURE_NO_SECRET, JOB_SECRET, JOB_SECRET_FILE, JobSecret, SecretError, SecretSource,
};
pub use env::{
    DEFAULT_TIMEOUT, EnvError, LOCAL_RANK, LOCAL_WORLD_SIZE, LaunchEnv, MASTER_ADDR, MASTER_PORT,
    RANK, RENDEZVOUS_TIMEOUT, WORLD_SIZE,
};
pub use heartbeat::{BEAT_INTERVAL, HEARTBEAT_TIMEOUT, Heartbeat};
#[cfg(feature = "launcher")]
pub use launcher::{DEFAULT_GRACE, LaunchConfig, LaunchError, RankExit, launch};
pub use launchers::{LAUNCHED_BY_COCONET, Launcher};
#[cfg(feature = "launcher")]
pub use server::{DEFAULT_QUOTA, StoreServer};
pub use store::{BARRIER_PREFIX, LAUNCH_PREFIX, Store, StoreError};

/// What coconet's process backends (`coconet-cpu`'s TCP transport) use of a rank's side:
/// the beating thread they drive, the launcher's note of the first failure, the parser of
/// `--heartbeat-timeout`. Not a stable API.
#[doc(hidden)]
pub mod for_backends {
    pub use crate::env::parse_seconds;
    pub use crate::heartbeat::{Beater, Pace};
    pub use crate::store::FIRST_FAILURE;
}
