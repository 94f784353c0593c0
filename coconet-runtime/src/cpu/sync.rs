//! Synchronisation of rank threads: a barrier that fails fast, per-chunk flags with
//! epochs, and the failure state that turns one rank's error or panic into an error on
//! every rank within a bounded time.
//!
//! Waits block on a condition variable (never spin forever), so P may exceed the number
//! of cores; every wait has a deadline and gives up with [`RuntimeError::Timeout`].

use crate::RuntimeError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
struct State {
    arrived: usize,
    /// Which ranks have arrived in the current generation.
    present: Vec<bool>,
    generation: u64,
    /// The first failure: (rank, message).
    failed: Option<(usize, String)>,
}

/// Shared by the rank threads of one run.
#[derive(Debug)]
pub struct World {
    ranks: usize,
    state: Mutex<State>,
    changed: Condvar,
    timeout: Duration,
    /// Per-chunk readiness flags (value = epoch in which the chunk became ready).
    flags: Vec<AtomicU64>,
}

impl World {
    /// A world of `ranks` ranks with `flags` chunk flags; waits give up after `timeout`.
    pub fn new(ranks: usize, flags: usize, timeout: Duration) -> World {
        World {
            ranks,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            timeout,
            flags: (0..flags).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A rank that panicked while holding the lock leaves valid state behind (every
        // update is a single assignment), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long a rank waits for its peers.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Records that `rank` failed; every waiting rank wakes up and returns an error.
    pub fn fail(&self, rank: usize, message: String) {
        let mut s = self.lock();
        if s.failed.is_none() {
            s.failed = Some((rank, message));
        }
        drop(s);
        self.changed.notify_all();
    }

    /// The first failure, if any.
    pub fn failure(&self) -> Option<RuntimeError> {
        self.lock()
            .failed
            .clone()
            .map(|(rank, message)| RuntimeError::RankFailed { rank, message })
    }

    /// Time left until `deadline` (`Some(None)`: no deadline), `None` once it passed.
    fn left(&self, deadline: Option<Instant>) -> Option<Option<Duration>> {
        match deadline {
            None => Some(None),
            Some(d) => {
                let now = Instant::now();
                (now < d).then(|| Some(d - now))
            }
        }
    }

    /// Waits for a change, at most `left` (forever if `None`).
    fn wait<'a>(
        &self,
        s: std::sync::MutexGuard<'a, State>,
        left: Option<Duration>,
    ) -> std::sync::MutexGuard<'a, State> {
        match left {
            Some(d) => {
                self.changed
                    .wait_timeout(s, d)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => self.changed.wait(s).unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Gives up waiting: records and returns the timeout (naming the missing ranks).
    /// The failure is recorded against the first missing rank — the culprit — so that
    /// the run's error names it, not the rank that waited.
    fn give_up(&self, rank: usize, at: &str, missing: Vec<usize>) -> RuntimeError {
        let culprit = missing.first().copied().unwrap_or(rank);
        let e = RuntimeError::Timeout {
            rank,
            at: at.to_string(),
            seconds: self.timeout.as_secs_f64(),
            missing,
        };
        self.fail(culprit, e.to_string());
        e
    }

    /// Waits until every rank has arrived (or one has failed).
    pub fn barrier(&self, rank: usize, at: &str) -> Result<(), RuntimeError> {
        let mut s = self.lock();
        if let Some((r, m)) = &s.failed {
            return Err(RuntimeError::RankFailed {
                rank: *r,
                message: m.clone(),
            });
        }
        let generation = s.generation;
        s.arrived += 1;
        if s.present.len() != self.ranks {
            s.present = vec![false; self.ranks];
        }
        s.present[rank] = true;
        if s.arrived == self.ranks {
            s.arrived = 0;
            s.present.iter_mut().for_each(|p| *p = false);
            s.generation += 1;
            drop(s);
            self.changed.notify_all();
            return Ok(());
        }
        // A timeout too long to add to now (Duration::MAX) means no deadline.
        let deadline = Instant::now().checked_add(self.timeout);
        loop {
            if let Some((r, m)) = &s.failed {
                return Err(RuntimeError::RankFailed {
                    rank: *r,
                    message: m.clone(),
                });
            }
            if s.generation != generation {
                return Ok(());
            }
            let Some(left) = self.left(deadline) else {
                let missing = (0..self.ranks).filter(|&r| !s.present[r]).collect();
                drop(s);
                return Err(self.give_up(rank, at, missing));
            };
            s = self.wait(s, left);
        }
    }

    /// Marks chunk flag `i` ready for `epoch`.
    pub fn raise(&self, i: usize, epoch: u64) {
        self.flags[i].store(epoch, Ordering::Release);
        // Take the lock so a waiter cannot miss the notification between its check and
        // its wait.
        drop(self.lock());
        self.changed.notify_all();
    }

    /// Waits until chunk flag `i`, raised by rank `producer`, has reached `epoch`.
    pub fn wait_flag(
        &self,
        rank: usize,
        producer: usize,
        i: usize,
        epoch: u64,
        at: &str,
    ) -> Result<(), RuntimeError> {
        if self.flags[i].load(Ordering::Acquire) >= epoch {
            return Ok(());
        }
        let deadline = Instant::now().checked_add(self.timeout);
        let mut s = self.lock();
        loop {
            if let Some((r, m)) = &s.failed {
                return Err(RuntimeError::RankFailed {
                    rank: *r,
                    message: m.clone(),
                });
            }
            if self.flags[i].load(Ordering::Acquire) >= epoch {
                return Ok(());
            }
            let Some(left) = self.left(deadline) else {
                drop(s);
                return Err(self.give_up(rank, at, vec![producer]));
            };
            s = self.wait(s, left);
        }
    }
}
