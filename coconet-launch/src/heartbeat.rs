//! Ranks telling their launcher they are alive, and the launcher noticing one that stops.
//!
//! A rank can hang without exiting and without touching the store (a deadlock, a stuck
//! file system, a collective its peers never join): the launcher would wait for it
//! forever, or until `--job-timeout`. With `--heartbeat-timeout`, the launcher watches
//! each rank's beats in the store, and a rank that beat once and then went silent for
//! longer is stopped with the others, named.
//!
//! Beats never sit on a step's path: a thread of the rank's own writes them, on its own
//! store connection with a 2 s deadline, so a stalled store delays beats (with a warning,
//! and a reconnection when it returns), never a step. coconet's process backends
//! (coconet-runtime's `cpu::Tcp` under `--heartbeat-timeout`) beat every second unless a run
//! has been stuck longer than the limit: only a rank's own silence marks it hung. Other
//! rank code notes progress with [`Heartbeat::beat`] (as torchrun's watchdog timers). A
//! rank that never beats is not watched; the launcher counts silence only while it could
//! watch (a launcher or store that was itself stopped does not blame the ranks).

#[cfg(feature = "launcher")]
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::LaunchEnv;
use super::store::{LAUNCH_PREFIX, Store, StoreError};

/// A rank's beats reach the store at most this often (each is one store round trip).
pub const BEAT_INTERVAL: Duration = Duration::from_secs(1);

/// How long one beat's write may take before the store is taken for stalled.
const BEAT_DEADLINE: Duration = Duration::from_secs(2);

/// The store key of `rank`'s beats (a counter, as text).
pub(crate) fn key(rank: usize) -> String {
    format!("{LAUNCH_PREFIX}rank-alive/{rank}")
}

/// The variable through which `coconet-launch --heartbeat-timeout` tells its ranks the
/// limit (seconds): their process backends then beat, and stop beating once a run has
/// been stuck for that long.
pub const HEARTBEAT_TIMEOUT: &str = "COCONET_HEARTBEAT_TIMEOUT";

/// Beats of one rank. [`Heartbeat::beat`] never blocks: it notes progress, and a thread
/// of the heartbeat's own writes a beat to the store at most every [`BEAT_INTERVAL`]
/// when there was progress since the last. A store that stalls or goes away delays the
/// beats, never the caller; the thread warns and reconnects.
///
/// ```no_run
/// use coconet_launch::Heartbeat;
/// # fn evaluate_batch() {}
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let heartbeat = Heartbeat::from_env()?;
/// for _ in 0..1000 {
///     evaluate_batch(); // long work outside coconet's runs
///     heartbeat.beat()?;
/// }
/// # Ok(()) }
/// ```
pub struct Heartbeat {
    beater: Beater,
}

impl Heartbeat {
    /// Beats of `rank` through the store `store` is connected to (on a connection of the
    /// heartbeat's own).
    pub fn new(store: Store, rank: usize) -> Heartbeat {
        Heartbeat {
            beater: Beater::start(store, rank, Pace::OnProgress),
        }
    }

    /// Beats of this rank through the launcher's store (`RANK`, `MASTER_ADDR`, ...).
    pub fn from_env() -> Result<Heartbeat, StoreError> {
        let env = LaunchEnv::from_env()?;
        Ok(Heartbeat::new(env.connect()?, env.rank))
    }

    /// Says this rank is alive: the next beat the heartbeat's thread writes (within
    /// [`BEAT_INTERVAL`]) tells the launcher. Never blocks and never fails (the
    /// `Result` is kept for callers written when it wrote to the store itself).
    pub fn beat(&self) -> Result<(), StoreError> {
        self.beater.progress();
        Ok(())
    }
}

impl std::fmt::Debug for Heartbeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heartbeat")
            .field("rank", &self.beater.state.rank)
            .finish_non_exhaustive()
    }
}

/// When a beater's thread writes a beat.
#[derive(Debug, Clone, Copy)]
pub enum Pace {
    /// When [`Beater::progress`] was called since the last beat (user code's beats).
    OnProgress,
    /// Every interval, unless a run (between [`Beater::run_starts`] and
    /// [`Beater::run_ends`]) has lasted longer than the limit: only a rank stuck in one
    /// step goes silent (coconet's process backends).
    UnlessStuck(Duration),
}

/// What the beating thread and its owner share.
struct BeatState {
    rank: usize,
    pace: Pace,
    stop: AtomicBool,
    /// Progress notes (Pace::OnProgress).
    progress: AtomicU64,
    /// When the current run started, in nanoseconds after `origin` + 1; 0: no run.
    run_since: AtomicU64,
    origin: Instant,
}

/// A thread that writes one rank's beats to the store (see [`Pace`]), on a connection of
/// its own with short deadlines, so that the rank's work never waits for the store.
pub struct Beater {
    state: Arc<BeatState>,
    thread: Option<JoinHandle<()>>,
}

impl Beater {
    /// Starts beating `rank`'s heartbeat through `store` (the thread's from now on).
    pub fn start(store: Store, rank: usize, pace: Pace) -> Beater {
        let state = Arc::new(BeatState {
            rank,
            pace,
            stop: AtomicBool::new(false),
            progress: AtomicU64::new(0),
            run_since: AtomicU64::new(0),
            origin: Instant::now(),
        });
        let shared = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name(format!("coconet-heartbeat {rank}"))
            .spawn(move || beat_loop(store, &shared))
            .ok();
        if thread.is_none() {
            eprintln!(
                "coconet: rank {rank} could not start its heartbeat thread: it will not beat"
            );
        }
        Beater { state, thread }
    }

    /// Notes progress (Pace::OnProgress).
    pub fn progress(&self) {
        self.state.progress.fetch_add(1, Ordering::Relaxed);
    }

    /// A run starts (Pace::UnlessStuck).
    pub fn run_starts(&self) {
        let now = self.state.origin.elapsed().as_nanos() as u64 + 1;
        self.state.run_since.store(now, Ordering::Relaxed);
    }

    /// The run ended.
    pub fn run_ends(&self) {
        self.state.run_since.store(0, Ordering::Relaxed);
    }
}

impl Drop for Beater {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for Beater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Beater")
            .field("rank", &self.state.rank)
            .field("pace", &self.state.pace)
            .finish_non_exhaustive()
    }
}

/// The beating thread: every interval, a beat if the pace says so; a failed write drops
/// the connection (warning once per outage) and the next interval reconnects.
fn beat_loop(store: Store, state: &BeatState) {
    let (addr, secret) = (store.addr().to_string(), store.secret().clone());
    let mut store = Some(store.with_deadline(BEAT_DEADLINE));
    let (mut count, mut seen) = (0u64, 0u64);
    let mut outage: Option<Instant> = None;
    while !state.stop.load(Ordering::Relaxed) {
        let due = match state.pace {
            Pace::OnProgress => {
                let now = state.progress.load(Ordering::Relaxed);
                std::mem::replace(&mut seen, now) != now
            }
            Pace::UnlessStuck(limit) => match state.run_since.load(Ordering::Relaxed) {
                0 => true,
                since => {
                    let since = Duration::from_nanos(since - 1);
                    state.origin.elapsed().saturating_sub(since) <= limit
                }
            },
        };
        if due {
            let attempt = Instant::now();
            if store.is_none() {
                store = Store::connect(&addr, &secret, BEAT_DEADLINE)
                    .ok()
                    .map(|s| s.with_deadline(BEAT_DEADLINE));
            }
            let written = store.as_mut().map(|s| {
                count += 1;
                s.set(&key(state.rank), count.to_string().as_bytes())
            });
            match written {
                Some(Ok(())) => {
                    if let Some(since) = outage.take() {
                        eprintln!(
                            "coconet: rank {} reaches the store at {addr} again (its heartbeat \
                             was delayed {:.1?}; the rank's work was not)",
                            state.rank,
                            since.elapsed()
                        );
                    }
                }
                failed => {
                    store = None;
                    if outage.is_none() {
                        outage = Some(attempt);
                        let why = match failed {
                            Some(Err(e)) => e.to_string(),
                            _ => "cannot connect".to_string(),
                        };
                        eprintln!(
                            "coconet: warning: rank {} cannot beat its heartbeat through the \
                             store at {addr} ({why}); retrying every {BEAT_INTERVAL:?} — the \
                             rank's work goes on",
                            state.rank
                        );
                    }
                }
            }
        }
        std::thread::park_timeout(BEAT_INTERVAL);
    }
}

/// The launcher's view of its ranks' beats: for each rank that has beaten, its last
/// value and when it changed.
#[cfg(feature = "launcher")]
#[derive(Debug, Default)]
pub(crate) struct Watch {
    seen: HashMap<usize, (Vec<u8>, Instant)>,
    /// When the last look ended.
    looked: Option<Instant>,
}

/// A pause in the watch itself longer than this (the launcher or its store was stopped,
/// or the store answered that slowly) restarts every rank's silence: the ranks may have
/// beaten all along.
#[cfg(feature = "launcher")]
const WATCH_GAP: Duration = Duration::from_secs(2);

#[cfg(feature = "launcher")]
impl Watch {
    /// Reads the beats of `ranks` (those still running) and returns a rank silent for
    /// longer than `timeout`, with how long it has been silent — silence the watch saw
    /// throughout, not across a pause of its own.
    pub(crate) fn silent(
        &mut self,
        store: &mut Store,
        ranks: impl IntoIterator<Item = usize>,
        timeout: Duration,
    ) -> Result<Option<(usize, Duration)>, StoreError> {
        let start = Instant::now();
        let mut beats = Vec::new();
        for rank in ranks {
            if let Some(beat) = store.try_get(&key(rank))? {
                beats.push((rank, beat));
            }
        }
        let now = Instant::now();
        let paused = self
            .looked
            .is_some_and(|t| start.duration_since(t) > WATCH_GAP)
            || now.duration_since(start) > WATCH_GAP;
        self.looked = Some(now);
        if paused {
            for (_, since) in self.seen.values_mut() {
                *since = now;
            }
        }
        for (rank, beat) in beats {
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
