//! The synchronisation of a [`World`](super::sync::World) whose ranks are processes
//! sharing memory (a job's buffers in an MPI-3 shared-memory window): its barrier,
//! chunk flags and failure mark are atomics in that memory, which every process maps.
//! A futex-backed lock or condition variable cannot be shared between processes here
//! (Rust's are process-private), so waiters watch, then sleep in short naps until the
//! deadline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long a waiting process naps between looks once watching gave up: short against
/// a step that moves data, long enough that P processes on fewer cores leave them to
/// the ranks still working.
pub(crate) const NAP: Duration = Duration::from_micros(50);

/// Word indices of the shared region: arrivals at the current barrier, its generation,
/// the failure mark (0: none; else the failed rank + 1, plus [`LATE`] when a peer gave
/// up waiting for it), then each rank's last barrier generation + 1 (to
/// name the missing), then the chunk flags.
const COUNT: usize = 0;
const GENERATION: usize = 1;
const FAILED: usize = 2;
const HEADER: usize = 3;
/// The failure mark's flag for a rank its peers gave up waiting for.
const LATE: u64 = 1 << 32;

/// Why a rank failed, as the shared mark says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Its own step failed (its process has the error).
    Failed(usize),
    /// A peer waited for it past the deadline (stuck, or gone).
    Late(usize),
}
/// A view of the synchronisation words every process of the job maps.
#[derive(Debug)]
pub(crate) struct ProcessSync {
    words: *const AtomicU64,
    ranks: usize,
    flags: usize,
}

// SAFETY: the words are atomics in memory that outlives the world (the job keeps the
// shared memory until after its world is gone); atomics may be used from any thread.
unsafe impl Send for ProcessSync {}
// SAFETY: as above.
unsafe impl Sync for ProcessSync {}

impl ProcessSync {
    /// The bytes the region needs for `ranks` ranks and `flags` chunk flags.
    pub(crate) fn bytes(ranks: usize, flags: usize) -> usize {
        (HEADER + ranks + flags) * 8
    }

    /// The region at `at`, which one process zeroed before any other used it.
    ///
    /// # Safety
    /// `at` must be 8-byte aligned, hold [`ProcessSync::bytes`] bytes shared by every
    /// process of the job, and stay valid while the view is used.
    pub(crate) unsafe fn new(at: *mut u8, ranks: usize, flags: usize) -> ProcessSync {
        ProcessSync {
            words: at.cast::<AtomicU64>().cast_const(),
            ranks,
            flags,
        }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(
            i < HEADER + self.ranks + self.flags,
            "a synchronisation word"
        );
        // SAFETY: `i` is inside the region (checked above), which `new`'s caller
        // keeps valid; AtomicU64 has u64's layout.
        unsafe { &*self.words.add(i) }
    }

    /// The current barrier generation.
    pub(crate) fn generation(&self) -> u64 {
        self.word(GENERATION).load(Ordering::Acquire)
    }

    /// `rank` arrives at the barrier of `generation`; true if it was the last (the
    /// barrier is then complete and the generation moved on).
    pub(crate) fn arrive(&self, rank: usize, generation: u64) -> bool {
        self.word(HEADER + rank)
            .store(generation + 1, Ordering::Relaxed);
        if self.word(COUNT).fetch_add(1, Ordering::AcqRel) + 1 == self.ranks as u64 {
            // Nobody arrives at the next barrier before seeing the new generation, so
            // the count is reset before anyone adds to it again.
            self.word(COUNT).store(0, Ordering::Relaxed);
            self.word(GENERATION)
                .store(generation + 1, Ordering::Release);
            return true;
        }
        false
    }

    /// The ranks that have not arrived at the barrier of `generation`.
    pub(crate) fn missing(&self, generation: u64) -> Vec<usize> {
        (0..self.ranks)
            .filter(|&r| self.word(HEADER + r).load(Ordering::Relaxed) != generation + 1)
            .collect()
    }

    /// The first failure, if a rank has failed.
    pub(crate) fn failed(&self) -> Option<Failure> {
        let mark = self.word(FAILED).load(Ordering::Acquire);
        let rank = (mark & (LATE - 1)).checked_sub(1)? as usize;
        Some(match mark & LATE {
            0 => Failure::Failed(rank),
            _ => Failure::Late(rank),
        })
    }

    /// Records the failure (the first one stays).
    pub(crate) fn fail(&self, failure: Failure) {
        let mark = match failure {
            Failure::Failed(r) => r as u64 + 1,
            Failure::Late(r) => (r as u64 + 1) | LATE,
        };
        let _ = self
            .word(FAILED)
            .compare_exchange(0, mark, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Whether chunk flag `i` is ready for `epoch`.
    pub(crate) fn is_raised(&self, i: usize, epoch: u64) -> bool {
        assert!(i < self.flags, "chunk flag {i} of {}", self.flags);
        self.word(HEADER + self.ranks + i).load(Ordering::Acquire) >= epoch
    }

    /// Marks chunk flag `i` ready for `epoch`.
    pub(crate) fn raise(&self, i: usize, epoch: u64) {
        assert!(i < self.flags, "chunk flag {i} of {}", self.flags);
        self.word(HEADER + self.ranks + i)
            .store(epoch, Ordering::Release);
    }
}
