//! Threads of one process as a [`Transport`]: each thread holds one rank of a job
//! ([`ProcessJob`](super::ProcessJob)) and runs it when *it* is ready — the shape a
//! tensor-parallel model needs, where every rank's forward and backward pass calls the
//! job's collectives from its own thread in the middle of its own work. ([`Job`](
//! crate::Job) runs every rank at once from one caller instead.)
//!
//! The threads share the process's memory, so a job's buffers are placed in one region
//! every rank sees and its steps run with the rank threads' collectives, as over POSIX
//! shared memory between processes: no byte of a step is copied through the link. The
//! link's own collectives (the agreement checks, gathers between runs) go through a
//! board: each rank deposits its parts under the collective's number and takes its own
//! once every rank has deposited.
//!
//! A rank whose run fails or panics ends every peer's wait at once, naming it; a rank
//! whose link is dropped while a peer waits for its part is named too; every other wait
//! ends at the deadline ([`Threads::set_timeout`]), naming the ranks that never came.

use super::transport::Transport;
use super::transport::all_gather_u64;
use super::transport::link::{Bytes, Flight, Link, PAGE, Parts, Shared};
use coconet_plan::RuntimeError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long a collective waits for its peers by default (as rank threads do).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// One rank of a group of threads (see the module docs); made with [`Threads::group`].
pub struct Threads {
    rank: usize,
    board: Arc<Board>,
    /// Collectives this rank posted so far: the key of its next deposit.
    posted: AtomicU64,
    /// How long a collective waits for its peers, in milliseconds.
    timeout_ms: AtomicU64,
}

/// What the ranks of a group exchange through.
struct Board {
    size: usize,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Per collective number: each rank's parts (indexed by destination), once deposited.
    slots: HashMap<u64, Slot>,
    /// Per collective number: the region a `share` of that number made (or could not).
    regions: HashMap<u64, (Option<Arc<Region>>, usize)>,
    /// The first failure: every wait ends with it.
    failure: Option<RuntimeError>,
    /// Ranks whose link was dropped.
    departed: Vec<usize>,
}

struct Slot {
    parts: Vec<Option<Vec<Vec<u8>>>>,
    taken: usize,
}

impl Threads {
    /// The `size` ranks of a new group, rank r at index r: hand each to its own thread.
    pub fn group(size: usize) -> Vec<Threads> {
        let board = Arc::new(Board {
            size,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        (0..size)
            .map(|rank| Threads {
                rank,
                board: board.clone(),
                posted: AtomicU64::new(0),
                timeout_ms: AtomicU64::new(DEFAULT_TIMEOUT.as_millis() as u64),
            })
            .collect()
    }

    /// This thread's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks in the group.
    pub fn size(&self) -> usize {
        self.board.size
    }

    /// Sets how long a collective waits for its peers (default 60 s) before it fails
    /// naming those that never came.
    pub fn set_timeout(&self, timeout: Duration) {
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self.timeout_ms.store(ms, Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.board
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `e` as the group's failure (unless one came first) and wakes everyone.
    fn fail(&self, e: RuntimeError) -> RuntimeError {
        let mut s = self.lock();
        let first = s.failure.get_or_insert(e).clone();
        drop(s);
        self.board.changed.notify_all();
        first
    }

    /// Deposits my parts (`part(s)`: the bytes for rank s) as the next collective and
    /// copies every rank's part for me into `recv(t)`, once all have deposited.
    ///
    /// # Safety
    /// The pointers `part` and `recv` give must be valid for their lengths.
    unsafe fn exchange(
        &self,
        part: &dyn Fn(usize) -> (*const u8, usize),
        recv: &dyn Fn(usize) -> (*mut u8, usize),
    ) {
        let size = self.board.size;
        let key = self.posted.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract.
        let mine: Vec<Vec<u8>> = (0..size)
            .map(|s| {
                let (ptr, len) = part(s);
                unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec()
            })
            .collect();
        let mut s = self.lock();
        let slot = s.slots.entry(key).or_insert_with(|| Slot {
            parts: vec![None; size],
            taken: 0,
        });
        slot.parts[self.rank] = Some(mine);
        self.board.changed.notify_all();
        let timeout = Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed));
        let start = Instant::now();
        loop {
            if s.failure.is_some() {
                return;
            }
            let missing: Vec<usize> = s.slots[&key]
                .parts
                .iter()
                .enumerate()
                .filter(|(_, p)| p.is_none())
                .map(|(r, _)| r)
                .collect();
            if missing.is_empty() {
                break;
            }
            if let Some(&gone) = missing.iter().find(|r| s.departed.contains(r)) {
                drop(s);
                self.fail(RuntimeError::RankFailed {
                    rank: gone,
                    message: format!(
                        "its thread left the group while rank {} waited for it",
                        self.rank
                    ),
                });
                return;
            }
            let waited = start.elapsed();
            if waited >= timeout {
                drop(s);
                self.fail(RuntimeError::Timeout {
                    rank: self.rank,
                    at: "a collective between rank threads".into(),
                    seconds: waited.as_secs_f64(),
                    missing,
                });
                return;
            }
            s = self
                .board
                .changed
                .wait_timeout(s, timeout - waited)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let slot = s.slots.get_mut(&key).expect("deposited above");
        for (t, parts) in slot.parts.iter().enumerate() {
            let theirs = &parts.as_ref().expect("every rank deposited")[self.rank];
            let (ptr, len) = recv(t);
            let n = len.min(theirs.len());
            // SAFETY: the caller's contract; `n` is within both.
            unsafe { std::ptr::copy_nonoverlapping(theirs.as_ptr(), ptr, n) };
        }
        slot.taken += 1;
        if slot.taken == size {
            s.slots.remove(&key);
        }
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        self.lock().departed.push(self.rank);
        self.board.changed.notify_all();
    }
}

/// A collective of the board: done when posted.
struct Done;

impl Flight for Done {}

/// Memory every rank of the group sees: one zeroed, page-aligned allocation holding
/// every rank's part.
struct Region {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: the region is plain memory, valid on every thread until dropped.
unsafe impl Send for Region {}
// SAFETY: as above; who writes where is the job's concern (as for shared memory
// between processes).
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `Region::new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

impl Region {
    /// `bytes` zeroed bytes aligned on a page, or `None` where the allocation fails.
    fn new(bytes: usize) -> Option<Region> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), PAGE).ok()?;
        // SAFETY: the layout's size is not zero.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(Region { ptr, layout })
    }
}

/// A rank's view of a shared region: where each rank's part starts.
struct View {
    region: Arc<Region>,
    offsets: Vec<usize>,
}

impl Shared for View {
    fn base(&self, rank: usize) -> *mut u8 {
        // SAFETY: every offset lies within the region (sums of the parts before it).
        unsafe { self.region.ptr.add(self.offsets[rank]) }
    }
}

impl Transport for Threads {}

impl Link for Threads {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.board.size
    }

    fn max_message(&self) -> usize {
        isize::MAX as usize
    }

    fn set_timeout(&mut self, timeout: Duration) {
        Threads::set_timeout(self, timeout);
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    unsafe fn post_all_to_all(&self, send: Parts, recv: Parts) -> Box<dyn Flight + '_> {
        // SAFETY: the caller's contract.
        unsafe {
            self.exchange(
                &|s| (send.ptr.add(send.displs[s]).cast_const(), send.counts[s]),
                &|t| (recv.ptr.add(recv.displs[t]), recv.counts[t]),
            );
        }
        Box::new(Done)
    }

    unsafe fn post_all_gather(&self, send: Bytes, recv: Parts) -> Box<dyn Flight + '_> {
        // SAFETY: the caller's contract.
        unsafe {
            self.exchange(&|_| (send.ptr, send.len), &|t| {
                (recv.ptr.add(recv.displs[t]), recv.counts[t])
            });
        }
        Box::new(Done)
    }

    fn may_share(&self) -> bool {
        true
    }

    fn share(&self, bytes: usize) -> Result<Option<Box<dyn Shared>>, RuntimeError> {
        let key = self.posted.load(Ordering::Relaxed);
        let sizes = all_gather_u64(self, &[bytes.max(1).next_multiple_of(PAGE) as u64])?;
        let offsets: Vec<usize> = sizes
            .iter()
            .scan(0usize, |at, &b| {
                let o = *at;
                *at = at.saturating_add(b as usize);
                Some(o)
            })
            .collect();
        let total = sizes
            .iter()
            .try_fold(0usize, |a, &b| a.checked_add(usize::try_from(b).ok()?));
        let mut s = self.lock();
        let size = self.board.size;
        let entry = s
            .regions
            .entry(key)
            .or_insert_with(|| (total.and_then(Region::new).map(Arc::new), 0));
        entry.1 += 1;
        let region = entry.0.clone();
        if entry.1 == size {
            s.regions.remove(&key);
        }
        Ok(region.map(|region| Box::new(View { region, offsets }) as Box<dyn Shared>))
    }

    fn failure(&self) -> Option<RuntimeError> {
        self.lock().failure.clone()
    }

    fn stopped(&self, error: RuntimeError) -> RuntimeError {
        self.fail(error)
    }

    fn panicked(&self, message: &str) -> RuntimeError {
        self.fail(RuntimeError::RankFailed {
            rank: self.rank,
            message: format!("panicked: {message}"),
        })
    }
}

/// A link several jobs of one rank use in turn (a tensor-parallel model runs one job per
/// collective shape over one group): every rank must run the jobs' collectives in the
/// same order. The timeout is the shared link's own (set it before sharing).
impl<L: Transport> Transport for Arc<L> {}

impl<L: Transport> Link for Arc<L> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn round_chunks(&self) -> usize {
        (**self).round_chunks()
    }
    fn max_message(&self) -> usize {
        (**self).max_message()
    }
    fn alive(&self) {
        (**self).alive();
    }
    fn idle(&self) {
        (**self).idle();
    }
    fn report(&self, e: &RuntimeError) {
        (**self).report(e);
    }
    fn enter(&self, at: &str) {
        (**self).enter(at);
    }
    fn known(&self, labels: &[String]) {
        (**self).known(labels);
    }
    fn timeout(&self) -> Duration {
        (**self).timeout()
    }
    unsafe fn post_all_to_all(&self, send: Parts, recv: Parts) -> Box<dyn Flight + '_> {
        // SAFETY: the caller's contract, passed on.
        unsafe { (**self).post_all_to_all(send, recv) }
    }
    unsafe fn post_all_gather(&self, send: Bytes, recv: Parts) -> Box<dyn Flight + '_> {
        // SAFETY: the caller's contract, passed on.
        unsafe { (**self).post_all_gather(send, recv) }
    }
    fn may_share(&self) -> bool {
        (**self).may_share()
    }
    fn share(&self, bytes: usize) -> Result<Option<Box<dyn Shared>>, RuntimeError> {
        (**self).share(bytes)
    }
    fn processes(&self) -> Vec<Option<i32>> {
        (**self).processes()
    }
    fn hosts(&self) -> Vec<usize> {
        (**self).hosts()
    }
    fn failure(&self) -> Option<RuntimeError> {
        (**self).failure()
    }
    fn stopped(&self, error: RuntimeError) -> RuntimeError {
        (**self).stopped(error)
    }
    fn panicked(&self, message: &str) -> RuntimeError {
        (**self).panicked(message)
    }
}
