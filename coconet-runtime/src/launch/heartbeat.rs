//! Ranks telling their launcher they are alive, and the launcher noticing one that stops.
//!
//! A rank can hang without exiting and without touching the store (a deadlock, a stuck
//! file system, a collective its peers never join): the launcher would wait for it
//! forever, or until `--job-timeout`. With `--heartbeat-timeout`, the launcher watches
//! each rank's beats in the store, and a rank that beat once and then went silent for
//! longer is stopped with the others, named. coconet's process backends beat at every
//! run ([`ProcessJob::run`](crate::cpu::ProcessJob::run) over [`Tcp`](crate::cpu::Tcp));
//! other rank code beats with [`Heartbeat::beat`] (as torchrun's watchdog timers). A rank
//! that never beats is not watched.

#[cfg(feature = "launcher")]
use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::LaunchEnv;
use super::store::{LAUNCH_PREFIX, Store, StoreError};

/// A rank's beats reach the store at most this often (each is one store round trip).
pub const BEAT_INTERVAL: Duration = Duration::from_secs(1);

/// The store key of `rank`'s beats (a counter, as text).
pub(crate) fn key(rank: usize) -> String {
    format!("{LAUNCH_PREFIX}rank-alive/{rank}")
}

/// Beats of one rank. Cheap to call often: a beat reaches the store at most every
/// [`BEAT_INTERVAL`].
///
/// ```no_run
/// use coconet_runtime::launch::Heartbeat;
/// # fn evaluate_batch() {}
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut heartbeat = Heartbeat::from_env()?;
/// for _ in 0..1000 {
///     evaluate_batch(); // long work outside coconet's runs
///     heartbeat.beat()?;
/// }
/// # Ok(()) }
/// ```
pub struct Heartbeat {
    store: Store,
    beats: Beats,
}

impl Heartbeat {
    /// Beats of `rank` through `store`.
    pub fn new(store: Store, rank: usize) -> Heartbeat {
        Heartbeat {
            store,
            beats: Beats::new(rank),
        }
    }

    /// Beats of this rank through the launcher's store (`RANK`, `MASTER_ADDR`, ...).
    pub fn from_env() -> Result<Heartbeat, StoreError> {
        let env = LaunchEnv::from_env()?;
        Ok(Heartbeat::new(env.connect()?, env.rank))
    }

    /// Says this rank is alive (a store write, unless one was sent within the last
    /// [`BEAT_INTERVAL`]).
    pub fn beat(&mut self) -> Result<(), StoreError> {
        self.beats.beat(&mut self.store)
    }
}

/// One rank's beat counter and when it last reached the store (also kept by the TCP
/// transport, which beats through its own store connection).
#[derive(Debug)]
pub(crate) struct Beats {
    rank: usize,
    count: u64,
    last: Option<Instant>,
}

impl Beats {
    pub(crate) fn new(rank: usize) -> Beats {
        Beats {
            rank,
            count: 0,
            last: None,
        }
    }

    /// Writes the next beat to `store`, unless one went within [`BEAT_INTERVAL`].
    pub(crate) fn beat(&mut self, store: &mut Store) -> Result<(), StoreError> {
        if self.last.is_some_and(|t| t.elapsed() < BEAT_INTERVAL) {
            return Ok(());
        }
        self.count += 1;
        store.set(&key(self.rank), self.count.to_string().as_bytes())?;
        self.last = Some(Instant::now());
        Ok(())
    }
}

impl std::fmt::Debug for Heartbeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heartbeat")
            .field("store", &self.store.addr())
            .field("beats", &self.beats)
            .finish()
    }
}

/// The launcher's view of its ranks' beats: for each rank that has beaten, its last
/// value and when it changed.
#[cfg(feature = "launcher")]
#[derive(Debug, Default)]
pub(crate) struct Watch {
    seen: HashMap<usize, (Vec<u8>, Instant)>,
}

#[cfg(feature = "launcher")]
impl Watch {
    /// Reads the beats of `ranks` (those still running) and returns a rank silent for
    /// longer than `timeout`, with how long it has been silent.
    pub(crate) fn silent(
        &mut self,
        store: &mut Store,
        ranks: impl IntoIterator<Item = usize>,
        timeout: Duration,
    ) -> Result<Option<(usize, Duration)>, StoreError> {
        let now = Instant::now();
        for rank in ranks {
            let Some(beat) = store.try_get(&key(rank))? else {
                continue;
            };
            match self.seen.get_mut(&rank) {
                Some((last, since)) if *last == beat => {
                    let silent = now.duration_since(*since);
                    if silent > timeout {
                        return Ok(Some((rank, silent)));
                    }
                }
                Some(entry) => *entry = (beat, now),
                None => {
                    self.seen.insert(rank, (beat, now));
                }
            }
        }
        Ok(None)
    }
}
