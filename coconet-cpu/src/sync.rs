//! Synchronisation of rank threads: a barrier that fails fast, per-chunk flags with
//! epochs, and the failure state that turns one rank's error or panic into an error on
//! every rank within a bounded time.
//!
//! A barrier waiter first watches the generation without the lock for a short while
//! ([`WATCH`]: a few spins, then yielding its core) — a step's barriers are usually
//! microseconds apart, and a futex sleep and wake-up costs more than that — and then
//! blocks on a condition variable (never spins forever), so P may exceed the number of
//! cores; every wait has a deadline and gives up with [`RuntimeError::Timeout`].
//!
//! The ranks of a world may also be processes sharing memory: the barrier, the flags
//! and the failure mark then live in that memory ([`ProcessSync`]), a barrier's waiters
//! sleep on a futex there instead of a condition variable, and each process keeps its
//! own failure message.

use super::shared_memory_sync::{Failure, NAP, ProcessSync};
use coconet_plan::RuntimeError;
use coconet_plan::plan::{Plan, PlanStep};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a barrier waiter watches for the last arrival before it blocks: the spread
/// of a step's ranks' arrivals on a busy machine, small against any step that moves
/// data.
const WATCH: Duration = Duration::from_micros(100);

/// The longest a process sleeps at a time waiting for a barrier in shared memory before
/// it looks for failures again (the last arrival wakes it sooner).
const SLEEP: Duration = Duration::from_millis(1);

/// Busy-wait iterations before a watching waiter starts yielding its core.
const SPINS: u32 = 64;

/// Waits for `ready` without blocking, for at most [`WATCH`]: spinning [`SPINS`] times,
/// then yielding the core (to the threads still on their way when they outnumber the
/// cores). Whether `ready` became true; if not, the caller blocks on its condition
/// variable.
pub(crate) fn watch(ready: impl Fn() -> bool) -> bool {
    for _ in 0..SPINS {
        if ready() {
            return true;
        }
        std::hint::spin_loop();
    }
    let start = Instant::now();
    while start.elapsed() < WATCH {
        if ready() {
            return true;
        }
        std::thread::yield_now();
    }
    ready()
}

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
    /// `State::generation`, readable without the lock (written under it).
    generation: AtomicU64,
    /// Whether `State::failed` is set, readable without the lock.
    failed: AtomicBool,
    /// The synchronisation shared with the other processes, where ranks are processes.
    shared: Option<ProcessSync>,
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
            generation: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            shared: None,
        }
    }

    /// The chunk flags `plan` needs: one per piece of every rank's overlapped matmul
    /// (the largest overlap step's).
    pub(crate) fn flags_for(plan: &Plan) -> usize {
        plan.steps()
            .iter()
            .filter_map(|s| match s {
                PlanStep::Overlap { matmul, .. } => {
                    Some(plan.ranks() * plan.overlap_pieces(*matmul).count())
                }
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// A world whose ranks are processes synchronising through `shared` (its flags are
    /// there too).
    pub(crate) fn across_processes(ranks: usize, timeout: Duration, shared: ProcessSync) -> World {
        World {
            shared: Some(shared),
            ..World::new(ranks, 0, timeout)
        }
    }

    /// Sets how long a rank waits for its peers.
    pub(crate) fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
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
        self.record(Failure::Failed(rank), message);
    }

    /// Records the first failure, here and where the other processes see it.
    fn record(&self, failure: Failure, message: String) {
        let rank = failure.rank();
        let mut s = self.lock();
        if s.failed.is_none() {
            s.failed = Some((rank, message));
            self.failed.store(true, Ordering::Release);
        }
        if let Some(shared) = &self.shared {
            shared.fail(failure);
        }
        drop(s);
        self.changed.notify_all();
    }

    /// The first failure, if any.
    pub fn failure(&self) -> Option<RuntimeError> {
        let mine = self.lock().failed.clone();
        let (rank, message) = mine.or_else(|| {
            Some(match self.shared.as_ref()?.failed()? {
                Failure::Failed(r) => (r, "its step failed (its process reports why)".into()),
                Failure::Late(r) => (r, "a peer waited for it past the deadline".into()),
                Failure::Gone(r) => (r, "its process exited".into()),
            })
        })?;
        Some(RuntimeError::RankFailed { rank, message })
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
        self.record(Failure::Late(culprit), e.to_string());
        e
    }

    /// Where the ranks are processes sharing memory: whether every rank has the same
    /// `value` as rank 0 (each posts its own, then a barrier at `at`, then each reads
    /// all: every rank gets the same answer). Ranks must meet at another barrier before
    /// agreeing again (a run's last one), so that no rank posts its next value before
    /// every peer has read this one. `Ok(None)` elsewhere (rank threads share their
    /// inputs; message-passing processes agree through their transport).
    pub(crate) fn agree(
        &self,
        rank: usize,
        value: u64,
        at: &str,
    ) -> Result<Option<bool>, RuntimeError> {
        let Some(shared) = &self.shared else {
            return Ok(None);
        };
        shared.post(rank, value);
        self.barrier(rank, at)?;
        let first = shared.posted(0);
        Ok(Some((1..self.ranks).all(|r| shared.posted(r) == first)))
    }

    /// Where the ranks are processes sharing memory: marks `rank` as leaving the job
    /// for good and waits, at most `most`, until every rank has, or a peer's process
    /// has exited. The ranks still there, if any (empty elsewhere). A failed run's
    /// peers meet here before releasing memory they must release together, where a
    /// peer that never comes would otherwise hold them forever.
    pub(crate) fn depart(&self, rank: usize, most: Duration) -> Vec<usize> {
        let Some(shared) = &self.shared else {
            return Vec::new();
        };
        shared.depart(rank);
        // (No deadline where `most` reaches past what an Instant holds.)
        let deadline = Instant::now().checked_add(most);
        loop {
            let staying = shared.staying();
            if staying.is_empty() {
                return staying;
            }
            if let Some(gone) = shared.gone() {
                return vec![gone];
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return staying;
            }
            std::thread::sleep(SLEEP);
        }
    }

    /// Waits until every rank has arrived (or one has failed).
    pub fn barrier(&self, rank: usize, at: &str) -> Result<(), RuntimeError> {
        if let Some(shared) = &self.shared {
            if let Some(e) = self.failure() {
                return Err(e);
            }
            let generation = shared.generation();
            if shared.arrive(rank, generation) {
                return Ok(());
            }
            let ready = || shared.generation() != generation;
            let sleep = || shared.sleep_past(generation, SLEEP);
            return self.nap_until(rank, at, &ready, &sleep, &|| shared.missing(generation));
        }
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
            self.generation.store(s.generation, Ordering::Release);
            drop(s);
            self.changed.notify_all();
            return Ok(());
        }
        drop(s);
        // The last arrival publishes the new generation (Release) after every rank's
        // arrival under the lock, so seeing it (Acquire) orders this rank after all of
        // them, as taking the lock would.
        if self.watch(generation) {
            return Ok(());
        }
        let mut s = self.lock();
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

    /// Watches, without the lock, for the barrier's generation to move on from
    /// `generation` (see [`watch`]). True when the barrier completed with no failure;
    /// otherwise the caller checks under the lock, and blocks if nothing changed.
    fn watch(&self, generation: u64) -> bool {
        watch(|| self.has_failed() || self.generation.load(Ordering::Acquire) != generation)
            && !self.has_failed()
    }

    /// Waits across processes until `ready`, watching, then sleeping a while at a time
    /// (`sleep`); fails with the first failure or a peer's exit, or names `missing()` at
    /// the deadline.
    fn nap_until(
        &self,
        rank: usize,
        at: &str,
        ready: &dyn Fn() -> bool,
        sleep: &dyn Fn(),
        missing: &dyn Fn() -> Vec<usize>,
    ) -> Result<(), RuntimeError> {
        // What completed completes, even if a rank failed after it.
        if watch(|| self.has_failed() || ready()) && ready() {
            return Ok(());
        }
        let deadline = Instant::now().checked_add(self.timeout);
        let mut looked: Option<Instant> = None;
        loop {
            if ready() {
                return Ok(());
            }
            if let Some(e) = self.failure() {
                return Err(e);
            }
            // A peer's process that exited never arrives: look every millisecond or so.
            if looked.is_none_or(|t| t.elapsed() >= SLEEP)
                && let Some(r) = self.shared.as_ref().and_then(|s| {
                    looked = Some(Instant::now());
                    s.gone()
                })
            {
                self.record(Failure::Gone(r), format!("rank {r}'s process exited"));
                return Err(self.failure().expect("a failure just recorded"));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(self.give_up(rank, at, missing()));
            }
            sleep();
        }
    }

    /// Whether a rank has failed this run (without waiting).
    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
            || self.shared.as_ref().is_some_and(|s| s.failed().is_some())
    }

    /// Whether chunk flag `i` is ready for `epoch` (without waiting).
    pub fn is_raised(&self, i: usize, epoch: u64) -> bool {
        match &self.shared {
            Some(shared) => shared.is_raised(i, epoch),
            None => self.flags[i].load(Ordering::Acquire) >= epoch,
        }
    }

    /// Marks chunk flag `i` ready for `epoch`.
    pub fn raise(&self, i: usize, epoch: u64) {
        if let Some(shared) = &self.shared {
            return shared.raise(i, epoch);
        }
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
        if self.shared.is_some() {
            let sleep = || std::thread::sleep(NAP);
            let ready = || self.is_raised(i, epoch);
            return self.nap_until(rank, at, &ready, &sleep, &|| vec![producer]);
        }
        // A peer's piece is usually a moment away: watch before blocking (see [`watch`]).
        if watch(|| self.has_failed() || self.is_raised(i, epoch)) && !self.has_failed() {
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
            if self.is_raised(i, epoch) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Every rank sees every other rank's writes from before a barrier once it is past
    /// it, whether it passed by watching or by blocking (8 ranks: more than the cores).
    #[test]
    fn a_barrier_orders_every_rank_after_all_arrivals() {
        let ranks = 8;
        let world = World::new(ranks, 0, Duration::from_secs(30));
        let arrived = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for rank in 0..ranks {
                let (world, arrived) = (&world, &arrived);
                scope.spawn(move || {
                    for round in 0..500 {
                        arrived.fetch_add(1, Ordering::Relaxed);
                        world.barrier(rank, "round").unwrap();
                        assert!(arrived.load(Ordering::Relaxed) >= ranks * (round + 1));
                        world.barrier(rank, "check").unwrap();
                    }
                });
            }
        });
        assert_eq!(arrived.load(Ordering::Relaxed), ranks * 500);
    }

    /// A rank that fails while the others wait at a barrier (watching or blocked) makes
    /// every one of them return its failure, at once.
    #[test]
    fn a_failure_reaches_every_waiting_rank() {
        for delay in [Duration::ZERO, Duration::from_millis(50)] {
            let world = World::new(4, 0, Duration::from_secs(30));
            let start = Instant::now();
            let results: Vec<_> = std::thread::scope(|scope| {
                let waiting: Vec<_> = (0..3)
                    .map(|rank| {
                        let world = &world;
                        scope.spawn(move || world.barrier(rank, "step"))
                    })
                    .collect();
                std::thread::sleep(delay);
                world.fail(3, "rank 3's kernel failed".into());
                waiting.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for r in results {
                let e = r.expect_err("a failed rank's peers must not pass the barrier");
                assert!(e.to_string().contains("rank 3's kernel failed"), "{e}");
            }
            assert!(start.elapsed() < Duration::from_secs(10));
        }
    }

    /// Ranks that are processes: each with its own world over one region (as each
    /// process maps the shared window) pass barriers in step, agree on posted values,
    /// see each other's flags, and learn of a failure at once. Rank threads agree on
    /// nothing there (`None`).
    #[test]
    fn worlds_sharing_a_region_synchronise_as_one() {
        let (ranks, flags) = (4, 2);
        let threads = World::new(ranks, 0, Duration::from_secs(1));
        assert_eq!(threads.agree(0, 1, "agree").unwrap(), None);
        let mut region = vec![0u64; ProcessSync::bytes(ranks, flags) / 8];
        let at = region.as_mut_ptr() as usize;
        let arrived = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for rank in 0..ranks {
                let arrived = &arrived;
                scope.spawn(move || {
                    // SAFETY: the region is zeroed, holds the words, and outlives the scope.
                    let sync = unsafe { ProcessSync::new(at as *mut u8, ranks, flags) };
                    let world = World::across_processes(ranks, Duration::from_secs(30), sync);
                    for round in 0..300 {
                        arrived.fetch_add(1, Ordering::Relaxed);
                        world.barrier(rank, "round").unwrap();
                        assert!(arrived.load(Ordering::Relaxed) >= ranks * (round + 1));
                        world.barrier(rank, "check").unwrap();
                    }
                    // Agreement rounds, a barrier after each (as a run's last one):
                    // every rank sees the same answer, and rank 2 differing in some.
                    for round in 0..60u64 {
                        let differs = round % 7 == 3;
                        let value = if differs && rank == 2 { 99 } else { round };
                        let same = world.agree(rank, value, "agree").unwrap();
                        assert_eq!(same, Some(!differs), "round {round}");
                        world.barrier(rank, "end of run").unwrap();
                    }
                    match rank {
                        0 => world.raise(1, 7),
                        _ => world.wait_flag(rank, 0, 1, 7, "a piece").unwrap(),
                    }
                    assert!(!world.is_raised(0, 1));
                    world.barrier(rank, "before").unwrap();
                    if rank == 3 {
                        world.fail(3, "rank 3's kernel failed".into());
                    } else {
                        let e = world.barrier(rank, "after").expect_err("rank 3 failed");
                        assert!(e.to_string().contains("rank 3 failed"), "{e}");
                    }
                });
            }
        });
        drop(region);
    }

    /// A process that never arrives is named after the timeout, and the others learn of
    /// it through the shared failure mark.
    #[test]
    fn a_missing_process_is_named_after_the_timeout() {
        let mut region = vec![0u64; ProcessSync::bytes(3, 0) / 8];
        let at = region.as_mut_ptr().cast::<u8>();
        // SAFETY: as above (one thread at a time here).
        let world = || unsafe {
            World::across_processes(3, Duration::from_millis(50), ProcessSync::new(at, 3, 0))
        };
        let (zero, one) = (world(), world());
        std::thread::scope(|scope| {
            let waiting = scope.spawn(|| one.barrier(1, "step 3"));
            let first = zero.barrier(0, "step 3").expect_err("rank 2 never arrives");
            let second = waiting.join().unwrap().expect_err("rank 2 never arrives");
            // The first to give up names the missing rank; the other may learn it from
            // the mark.
            let named = |e: &RuntimeError| {
                matches!(e, RuntimeError::Timeout { missing, .. } if missing == &[2])
                    || matches!(e, RuntimeError::RankFailed { rank: 2, .. })
            };
            assert!(named(&first) && named(&second), "{first} / {second}");
            assert!(
                [&first, &second]
                    .iter()
                    .any(|e| matches!(e, RuntimeError::Timeout { .. }))
            );
        });
        drop(region);
    }

    /// Departing processes wait for each other at most as long as they are told (no
    /// deadline at all for a duration no Instant holds), name the rank that never
    /// came, and pass at once once every rank has departed; rank threads never wait.
    #[test]
    fn departing_processes_name_the_one_that_stays() {
        let mut region = vec![0u64; ProcessSync::bytes(3, 0) / 8];
        let at = region.as_mut_ptr().cast::<u8>();
        // SAFETY: as above (one thread at a time here).
        let world = || unsafe {
            World::across_processes(3, Duration::from_secs(60), ProcessSync::new(at, 3, 0))
        };
        let (zero, one, two) = (world(), world(), world());
        let start = Instant::now();
        assert_eq!(zero.depart(0, Duration::from_millis(30)), [1, 2]);
        assert_eq!(one.depart(1, Duration::from_millis(30)), [2]);
        assert!(start.elapsed() >= Duration::from_millis(60));
        assert!(two.depart(2, Duration::MAX).is_empty());
        assert!(zero.depart(0, Duration::MAX).is_empty());
        let threads = World::new(3, 0, Duration::from_secs(1));
        assert!(threads.depart(0, Duration::MAX).is_empty());
        drop(region);
    }

    /// A peer whose process exits while the others wait for it in shared memory is
    /// named at once (its pidfd), not at the deadline.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_peer_process_that_exits_is_named_before_the_deadline() {
        let mut region = vec![0u64; ProcessSync::bytes(2, 0) / 8];
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .expect("sleep runs");
        // SAFETY: the region is zeroed, holds the words, and outlives the world.
        let mut sync = unsafe { ProcessSync::new(region.as_mut_ptr().cast(), 2, 0) };
        sync.watch(&[None, i32::try_from(child.id()).ok()]);
        let world = World::across_processes(2, Duration::from_secs(60), sync);
        let start = Instant::now();
        let e = world
            .barrier(0, "step 1")
            .expect_err("rank 1's process exited");
        assert!(
            matches!(&e, RuntimeError::RankFailed { rank: 1, .. })
                && e.to_string().contains("exited"),
            "{e}"
        );
        assert!(start.elapsed() < Duration::from_secs(30));
        child.wait().expect("the child is reaped");
        drop(world);
        drop(region);
    }

    /// A rank that never arrives is named after the timeout.
    #[test]
    fn a_missing_rank_is_named_after_the_timeout() {
        let world = World::new(2, 0, Duration::from_millis(50));
        let e = world
            .barrier(0, "step 3")
            .expect_err("rank 1 never arrives");
        assert!(
            matches!(&e, RuntimeError::Timeout { missing, .. } if missing == &[1]),
            "{e}"
        );
    }
}
