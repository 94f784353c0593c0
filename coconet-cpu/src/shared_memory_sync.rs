//! The synchronisation of a [`World`](super::sync::World) whose ranks are processes
//! sharing memory (a job's buffers in an MPI-3 window or POSIX shared memory): its
//! barrier, chunk flags and failure mark are atomics in that memory, which every
//! process maps. Rust's locks and condition variables are process-private, so a
//! barrier's waiters watch, then sleep on a futex of the generation word itself (the
//! last arrival wakes them), a millisecond at a time; a flag's waiters nap. Where the
//! peers' processes can be watched (pidfds on Linux), a waiter also notices one that
//! exited, at once instead of at the deadline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long a flag's waiter naps between looks once watching gave up: short against
/// a step that moves data, long enough that P processes on fewer cores leave them to
/// the ranks still working.
pub(crate) const NAP: Duration = Duration::from_micros(50);

/// Word indices of the shared region: arrivals at the current barrier, its generation,
/// the failure mark (0: none; else the failed rank + 1, plus [`LATE`] when a peer gave
/// up waiting for it or [`GONE`] when its process exited), then each rank's last
/// barrier generation + 1 (to name the missing), then each rank's posted value (see
/// [`ProcessSync::post`]), then whether each rank has departed (see
/// [`ProcessSync::depart`]), then the chunk flags.
const COUNT: usize = 0;
const GENERATION: usize = 1;
const FAILED: usize = 2;
const HEADER: usize = 3;
/// The failure mark's flag for a rank its peers gave up waiting for.
const LATE: u64 = 1 << 32;
/// The failure mark's flag for a rank whose process exited.
const GONE: u64 = 2 << 32;
/// The failure mark's bits that hold the rank.
const RANK: u64 = LATE - 1;

/// Why a rank failed, as the shared mark says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Its own step failed (its process has the error).
    Failed(usize),
    /// A peer waited for it past the deadline (stuck, or gone).
    Late(usize),
    /// Its process exited.
    Gone(usize),
}

impl Failure {
    /// The rank that failed.
    pub(crate) fn rank(self) -> usize {
        let (Failure::Failed(r) | Failure::Late(r) | Failure::Gone(r)) = self;
        r
    }
}

/// A view of the synchronisation words every process of the job maps.
#[derive(Debug)]
pub(crate) struct ProcessSync {
    words: *const AtomicU64,
    ranks: usize,
    flags: usize,
    /// Each rank's process where it can be watched: a descriptor that becomes readable
    /// once the process exits (Linux pidfds).
    watched: Vec<(usize, std::os::fd::OwnedFd)>,
}

// SAFETY: the words are atomics in memory that outlives the world (the job keeps the
// shared memory until after its world is gone); atomics may be used from any thread.
unsafe impl Send for ProcessSync {}
// SAFETY: as above.
unsafe impl Sync for ProcessSync {}

impl ProcessSync {
    /// The bytes the region needs for `ranks` ranks and `flags` chunk flags.
    pub(crate) fn bytes(ranks: usize, flags: usize) -> usize {
        (HEADER + 3 * ranks + flags) * 8
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
            watched: Vec::new(),
        }
    }

    /// Watches the processes `pids` names (by rank; `None`: not watchable), where the
    /// system can.
    pub(crate) fn watch(&mut self, pids: &[Option<i32>]) {
        #[cfg(target_os = "linux")]
        for (rank, pid) in pids.iter().enumerate() {
            use std::os::fd::FromRawFd;
            let Some(pid) = *pid else { continue };
            // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
            if let Ok(fd) = i32::try_from(fd)
                && fd >= 0
            {
                // SAFETY: a descriptor just opened, owned by nothing else.
                self.watched
                    .push((rank, unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }));
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = pids;
    }

    /// A watched rank whose process has exited, if any (without waiting).
    pub(crate) fn gone(&self) -> Option<usize> {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let mut polled: Vec<libc::pollfd> = self
                .watched
                .iter()
                .map(|(_, fd)| libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: `polled` holds `len` pollfds; a timeout of 0 does not wait.
            let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, 0) };
            if n > 0 {
                return polled
                    .iter()
                    .zip(&self.watched)
                    .find(|(p, _)| p.revents != 0)
                    .map(|(_, (rank, _))| *rank);
            }
        }
        None
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(
            i < HEADER + 3 * self.ranks + self.flags,
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
        self.rank_word(0, rank)
            .store(generation + 1, Ordering::Relaxed);
        if self.word(COUNT).fetch_add(1, Ordering::AcqRel) + 1 == self.ranks as u64 {
            // Nobody arrives at the next barrier before seeing the new generation, so
            // the count is reset before anyone adds to it again.
            self.word(COUNT).store(0, Ordering::Relaxed);
            self.word(GENERATION)
                .store(generation + 1, Ordering::Release);
            self.wake();
            return true;
        }
        false
    }

    /// The generation word's low half, which waiters sleep on (a futex).
    #[cfg(all(target_os = "linux", target_endian = "little"))]
    fn futex(&self) -> *const u32 {
        std::ptr::from_ref(self.word(GENERATION)).cast::<u32>()
    }

    /// Wakes every process sleeping in [`ProcessSync::sleep_past`].
    fn wake(&self) {
        #[cfg(all(target_os = "linux", target_endian = "little"))]
        // SAFETY: a futex wake on a word of the shared region (not private: the
        // sleepers are other processes).
        unsafe {
            libc::syscall(libc::SYS_futex, self.futex(), libc::FUTEX_WAKE, i32::MAX);
        }
    }

    /// Sleeps until the barrier generation moves on from `generation` (woken by the last
    /// arrival), for at most `most`: a futex on the generation word shared by the
    /// processes, so a sleeper wakes at once, as rank threads on a condition variable
    /// do; elsewhere a nap of `most`.
    pub(crate) fn sleep_past(&self, generation: u64, most: Duration) {
        #[cfg(all(target_os = "linux", target_endian = "little"))]
        {
            let ts = libc::timespec {
                tv_sec: most.as_secs().try_into().unwrap_or(libc::time_t::MAX),
                tv_nsec: most.subsec_nanos().into(),
            };
            // SAFETY: FUTEX_WAIT reads the word (returning at once if it no longer
            // holds the generation's low half) and sleeps at most `ts`.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.futex(),
                    libc::FUTEX_WAIT,
                    generation as u32,
                    &raw const ts,
                );
            }
        }
        #[cfg(not(all(target_os = "linux", target_endian = "little")))]
        {
            let _ = generation;
            std::thread::sleep(most);
        }
    }

    /// The ranks that have not arrived at the barrier of `generation`.
    pub(crate) fn missing(&self, generation: u64) -> Vec<usize> {
        (0..self.ranks)
            .filter(|&r| self.rank_word(0, r).load(Ordering::Relaxed) != generation + 1)
            .collect()
    }

    /// The first failure, if a rank has failed.
    pub(crate) fn failed(&self) -> Option<Failure> {
        let mark = self.word(FAILED).load(Ordering::Acquire);
        let rank = (mark & RANK).checked_sub(1)? as usize;
        Some(match mark & !RANK {
            LATE => Failure::Late(rank),
            GONE => Failure::Gone(rank),
            _ => Failure::Failed(rank),
        })
    }

    /// Records the failure (the first one stays).
    pub(crate) fn fail(&self, failure: Failure) {
        let rank = failure.rank() as u64 + 1;
        let mark = match failure {
            Failure::Failed(_) => rank,
            Failure::Late(_) => rank | LATE,
            Failure::Gone(_) => rank | GONE,
        };
        let _ = self
            .word(FAILED)
            .compare_exchange(0, mark, Ordering::AcqRel, Ordering::Acquire);
        self.wake();
    }

    /// Posts `rank`'s value for its peers to read after the next barrier (a value
    /// every process must agree on). A rank posts again only after a later barrier,
    /// which its peers reach after reading.
    pub(crate) fn post(&self, rank: usize, value: u64) {
        self.rank_word(1, rank).store(value, Ordering::Release);
    }

    /// The value `rank` posted last.
    pub(crate) fn posted(&self, rank: usize) -> u64 {
        self.rank_word(1, rank).load(Ordering::Acquire)
    }

    /// Marks `rank` as done with the shared memory for good (it is about to release
    /// it); independent of the barrier, whose counts a failed run may leave uneven.
    pub(crate) fn depart(&self, rank: usize) {
        self.rank_word(2, rank).store(1, Ordering::Release);
    }

    /// The ranks that have not departed.
    pub(crate) fn staying(&self) -> Vec<usize> {
        (0..self.ranks)
            .filter(|&r| self.rank_word(2, r).load(Ordering::Acquire) == 0)
            .collect()
    }

    /// Rank `rank`'s word of kind `kind` after the header: 0 its last barrier, 1 its
    /// posted value, 2 whether it departed.
    fn rank_word(&self, kind: usize, rank: usize) -> &AtomicU64 {
        assert!(rank < self.ranks, "rank {rank} of {}", self.ranks);
        self.word(HEADER + kind * self.ranks + rank)
    }

    /// Chunk flag `i`'s word (after the header and the three words of each rank).
    fn flag(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.flags, "chunk flag {i} of {}", self.flags);
        self.word(HEADER + 3 * self.ranks + i)
    }

    /// Whether chunk flag `i` is ready for `epoch`.
    pub(crate) fn is_raised(&self, i: usize, epoch: u64) -> bool {
        self.flag(i).load(Ordering::Acquire) >= epoch
    }

    /// Marks chunk flag `i` ready for `epoch`.
    pub(crate) fn raise(&self, i: usize, epoch: u64) {
        self.flag(i).store(epoch, Ordering::Release);
    }
}
