//! What a process's connections share: the first failure, the store, the heartbeat, the
//! step labels, and the parts queued for the connection threads.

use coconet_launch::for_backends::{Beater, FIRST_FAILURE};
use coconet_launch::{LAUNCH_PREFIX, Store};
use coconet_plan::RuntimeError;
use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The step label of the check that every process finished its run (see
/// `ProcessJob::run`): a peer's message for it while this process is mid-run means the
/// peer stopped early.
pub(crate) const END_OF_RUN: &str = "the end of the run";

/// What the connection threads share with the job.
pub(super) struct Shared {
    pub(super) rank: usize,
    /// Every connection, to shut them all down at the first failure (which wakes every
    /// thread blocked on one).
    pub(super) streams: Vec<TcpStream>,
    /// The first failure, and whether this process saw it first-hand (a lost connection
    /// is hearsay: the peer that closed it may only have reacted to another failure).
    pub(super) failure: Mutex<Option<(RuntimeError, bool)>>,
    /// A connection to the store, where the first first-hand failure of the group is
    /// published, so that every process names the same culprit.
    pub(super) store: Mutex<Option<Store>>,
    /// The store key of that failure.
    pub(super) failure_key: String,
    /// This process's heartbeat (under `--heartbeat-timeout`): a thread of its own that
    /// beats unless a run is stuck; runs only note when they start and end.
    pub(super) beater: Mutex<Option<Beater>>,
    /// The step being run: its label and its tag (a hash of the label, the same in
    /// every process), stamped on its messages.
    pub(super) at: Mutex<(String, u64)>,
    /// The labels of the tags seen, to name a peer's step in errors.
    pub(super) labels: Mutex<HashMap<u64, String>>,
}

impl Shared {
    /// Records the first failure, publishes it where this process saw it first-hand,
    /// and stops all traffic (peers then see their connections to this process close).
    pub(super) fn fail(&self, e: RuntimeError) {
        self.record(e, true);
    }

    /// Tells the heartbeat thread, if there is one, with `note`.
    pub(super) fn with_beater(&self, note: impl FnOnce(&Beater)) {
        if let Some(beater) = self
            .beater
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            note(beater);
        }
    }

    /// [`Shared::fail`] for a lost connection.
    pub(super) fn lost(&self, e: RuntimeError) {
        self.record(e, false);
    }

    pub(super) fn record(&self, e: RuntimeError, first_hand: bool) {
        let mut f = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        if f.is_some() {
            return;
        }
        if first_hand {
            self.publish(&e);
        }
        *f = Some((e, first_hand));
        for s in &self.streams {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Publishes `e` as the group's failure unless another process did first (before
    /// any connection closes, so a peer that sees one close finds it).
    pub(super) fn publish(&self, e: &RuntimeError) {
        let (culprit, message) = match e {
            RuntimeError::RankFailed { rank, message } => (*rank, message.clone()),
            RuntimeError::Timeout { missing, .. } => {
                (missing.first().copied().unwrap_or(self.rank), e.to_string())
            }
            _ => (self.rank, e.to_string()),
        };
        let mut store = self.store.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(store) = store.as_mut()
            && matches!(store.add(&format!("{}/count", self.failure_key), 1), Ok(1))
        {
            let _ = store.set(
                &self.failure_key,
                format!("{culprit}\n{message}").as_bytes(),
            );
            publish_first(store, culprit, &message);
        }
    }

    /// The failure to report: a lost connection is replaced by the group's published
    /// failure, when one appears soon enough.
    pub(super) fn failure(&self) -> Option<RuntimeError> {
        let (e, first_hand) = self
            .failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()?;
        if first_hand {
            return Some(e);
        }
        let mut store = self.store.lock().unwrap_or_else(PoisonError::into_inner);
        let published = store
            .as_mut()?
            .get(&self.failure_key, Duration::from_secs(2))
            .ok()
            .map(|v| String::from_utf8_lossy(&v).to_string());
        let Some((culprit, message)) = published.as_deref().and_then(|p| p.split_once('\n')) else {
            return Some(e);
        };
        match culprit.parse() {
            Ok(rank) => Some(RuntimeError::RankFailed {
                rank,
                message: format!("{message} (reported by another process)"),
            }),
            Err(_) => Some(e),
        }
    }

    /// The error of a lost connection to `peer` (it closed, or the socket failed).
    pub(super) fn lost_peer(&self, peer: usize, e: &dyn std::fmt::Display) -> RuntimeError {
        RuntimeError::RankFailed {
            rank: peer,
            message: format!(
                "rank {} lost its connection to rank {peer} at `{}` ({e}): rank {peer} \
                 stopped, failed or was killed",
                self.rank,
                self.at()
            ),
        }
    }

    /// Checks that what `peer` sends for `part` (its collective, step tag and length)
    /// is what this process expects: processes at different steps or with different
    /// plans are an error naming them, never misread bytes.
    pub(super) fn check_arrival(
        &self,
        peer: usize,
        part: &Part,
        collective: u64,
        step: u64,
        len: u64,
    ) -> Result<(), RuntimeError> {
        let me = self.rank;
        if step != part.step {
            // The processes are at different steps: the one at the end of its run
            // stopped early (or they run different plans).
            let (theirs, mine) = (self.label(step), self.label(part.step));
            let culprit = if mine == END_OF_RUN { me } else { peer };
            return Err(RuntimeError::RankFailed {
                rank: culprit,
                message: format!(
                    "rank {me} is at `{mine}` but rank {peer} sent data for `{theirs}`: the \
                     processes run different plans, or rank {culprit} stopped part-way"
                ),
            });
        }
        if collective != part.collective || len != part.len as u64 {
            return Err(RuntimeError::RankFailed {
                rank: peer,
                message: format!(
                    "rank {peer} sent {len} bytes of its collective #{collective} where rank \
                     {me} expected {} bytes of #{} at `{}`: the processes run different plans \
                     or bindings",
                    part.len,
                    part.collective,
                    self.at()
                ),
            });
        }
        Ok(())
    }

    pub(super) fn failed(&self) -> bool {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    pub(super) fn at(&self) -> String {
        self.at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .clone()
    }

    pub(super) fn label(&self, tag: u64) -> String {
        self.labels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&tag)
            .cloned()
            .unwrap_or_else(|| "a step this process never ran".into())
    }
}

/// One part of a posted collective for one connection thread: bytes to send from, or
/// to receive into (an address: the poster keeps the bytes valid until the collective's
/// flight is dropped, which waits for every part).
pub(super) struct Part {
    pub(super) addr: usize,
    pub(super) len: usize,
    pub(super) collective: u64,
    /// The tag of the step posting it.
    pub(super) step: u64,
    pub(super) latch: Arc<Latch>,
}

/// Counts a collective's parts down; remembers whose receives are outstanding.
pub(super) struct Latch {
    pub(super) state: Mutex<(usize, Vec<usize>)>,
    pub(super) done: Condvar,
}

impl Latch {
    pub(super) fn new(parts: usize, receiving_from: Vec<usize>) -> Latch {
        Latch {
            state: Mutex::new((parts, receiving_from)),
            done: Condvar::new(),
        }
    }

    /// One part is finished (or abandoned); `from` names the peer of a receive.
    pub(super) fn finish(&self, from: Option<usize>) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.0 -= 1;
        if let Some(peer) = from {
            s.1.retain(|&p| p != peer);
        }
        if s.0 == 0 {
            self.done.notify_all();
        }
    }

    /// Whether every part is finished.
    pub(super) fn done(&self) -> bool {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).0 == 0
    }

    /// The peers still owing data.
    pub(super) fn missing(&self) -> Vec<usize> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clone()
    }

    /// Waits until every part is finished or `deadline` passes; on a deadline, the
    /// peers still owing data.
    pub(super) fn wait(&self, deadline: Option<Instant>) -> Result<(), Vec<usize>> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while s.0 > 0 {
            match deadline {
                None => s = self.done.wait(s).unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(s.1.clone());
                    }
                    s = self
                        .done
                        .wait_timeout(s, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
        Ok(())
    }
}

/// Publishes, for the launcher's verdict, the job's first failure seen first-hand across
/// its groups (the first to claim it wins).
pub(super) fn publish_first(store: &mut Store, culprit: usize, message: &str) {
    let first = format!("{LAUNCH_PREFIX}{FIRST_FAILURE}");
    if matches!(store.add(&format!("{first}/count"), 1), Ok(1)) {
        let _ = store.set(&first, format!("rank {culprit}: {message}").as_bytes());
    }
}

/// The tag of a step: a hash of its label (equal in every process of a job).
pub(super) fn tag(at: &str) -> u64 {
    let mut h = DefaultHasher::new();
    at.hash(&mut h);
    h.finish()
}
