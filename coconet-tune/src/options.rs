//! How to tune.

use super::machine::{available_memory, default_cache_path, machine_fingerprint};
use std::path::PathBuf;

/// How to tune.
#[derive(Debug, Clone)]
pub struct TuneOptions {
    /// Untimed runs of every contender before the timed rounds (page faults, caches).
    pub warmup: usize,
    /// Timed rounds; each runs every contender once, in an order that rotates.
    pub rounds: usize,
    /// Where choices are cached (`None`: never read nor written). Default:
    /// [`default_cache_path`].
    pub cache: Option<PathBuf>,
    /// What identifies this machine in the cache (default: [`machine_fingerprint`]).
    pub machine: String,
    /// What identifies the backend in the cache, e.g. `cpu` (the variants' labels are
    /// part of the key too).
    pub backend: String,
    /// Bytes the contenders' jobs may hold at once to be timed in interleaved rounds;
    /// past it they are timed one after the other (noted in [`Tuning::notes`](crate::Tuning::notes)).
    /// Default: half the memory available when the options are made.
    pub memory_budget: u64,
}

impl Default for TuneOptions {
    fn default() -> TuneOptions {
        TuneOptions {
            warmup: 2,
            rounds: 7,
            cache: default_cache_path(),
            machine: machine_fingerprint(),
            backend: "cpu".into(),
            memory_budget: available_memory() / 2,
        }
    }
}
