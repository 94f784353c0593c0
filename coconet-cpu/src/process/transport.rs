//! How the processes of a job move bytes: the two collectives the process executor
//! needs — an all-to-all and an all-gather of per-rank byte parts, posted non-blocking —
//! which MPI (feature `mpi`) and TCP connections ([`Tcp`](super::Tcp)) implement. The
//! blocking exchanges the executor also uses (counts, fingerprints, f64 operands) are
//! built here from those two, once for every transport.

use coconet_plan::RuntimeError;

/// The transport's contract with the executor, in a module users cannot name: the
/// executor posts raw byte descriptors, which only this crate can promise to keep valid.
pub(crate) mod link {
    use coconet_plan::RuntimeError;
    use std::time::Duration;

    /// Bytes split into per-rank parts: `counts[s]` bytes at `ptr + displs[s]` go to (or
    /// come from) rank s. Owns its counts, not the bytes.
    pub struct Parts {
        pub ptr: *mut u8,
        pub counts: Vec<usize>,
        pub displs: Vec<usize>,
    }

    /// Contiguous bytes sent whole.
    pub struct Bytes {
        pub ptr: *const u8,
        pub len: usize,
    }

    /// A posted collective. Dropping it waits until the transport is done with its
    /// bytes (completed, or failed and abandoned: then [`Link::failure`] says why).
    pub trait Flight {
        /// Lets the transport progress it (Open MPI moves a non-blocking collective's
        /// data only inside MPI calls); a no-op where it progresses by itself.
        fn poll(&mut self) {}
    }

    /// What a part of [`Shared`] memory is rounded up to, and aligned on.
    pub const PAGE: usize = 4096;

    /// Memory every process of the job maps: each process's part, at the address where
    /// this process sees it. Dropping it unmaps it (together with the other processes,
    /// over MPI).
    pub trait Shared: Send {
        /// Where rank `rank`'s part starts in this process (page-aligned).
        fn base(&self, rank: usize) -> *mut u8;
        /// Whether every process must release the memory together (an MPI window is
        /// freed collectively; a POSIX mapping is unmapped alone).
        fn released_together(&self) -> bool {
            false
        }
        /// A peer will never release the memory with this process (`why` says which):
        /// end what would wait for it forever (MPI aborts the job).
        fn abandon(&self, _why: &str) {}
    }

    /// A connection of every process of the job to every other.
    pub trait Link {
        /// This process's rank.
        fn rank(&self) -> usize;
        /// The number of processes.
        fn size(&self) -> usize;
        /// Kernel chunks per round of a fused all-reduce that suit this transport.
        fn round_chunks(&self) -> usize {
            super::ROUND_CHUNKS
        }
        /// The largest byte count one collective may move.
        fn max_message(&self) -> usize;
        /// A run starts: whoever watches the job learns if it then stays stuck (TCP's
        /// heartbeat thread stops beating past the launcher's limit).
        fn alive(&self) {}
        /// The run ended (well or not).
        fn idle(&self) {}
        /// A run failed with `e`: whoever watches the job may learn the cause (TCP
        /// publishes what it saw first-hand for the launcher's verdict).
        fn report(&self, _e: &RuntimeError) {}
        /// Names the step the next collectives belong to (for error messages).
        fn enter(&self, _at: &str) {}
        /// The labels of every step the job may enter (to name a peer's step).
        fn known(&self, _labels: &[String]) {}
        /// Sets how long a collective may wait for its peers.
        fn set_timeout(&mut self, _timeout: Duration) {}
        /// How long a collective may wait for its peers.
        fn timeout(&self) -> Duration;
        /// Posts an all-to-all: `send`'s part s goes to rank s, rank t's part to me
        /// lands in `recv`'s part t.
        ///
        /// # Safety
        /// Until the returned flight is dropped, the bytes `send` describes must stay
        /// valid and unwritten, and those `recv` describes valid and otherwise untouched.
        unsafe fn post_all_to_all(&self, send: Parts, recv: Parts) -> Box<dyn Flight + '_>;
        /// Posts an all-gather: my `send` bytes land in every rank's `recv` part for me.
        ///
        /// # Safety
        /// As for [`Link::post_all_to_all`].
        unsafe fn post_all_gather(&self, send: Bytes, recv: Parts) -> Box<dyn Flight + '_>;
        /// Whether this process may put its buffers in memory shared with its peers
        /// (the job shares memory only if every process may).
        fn may_share(&self) -> bool {
            false
        }
        /// Memory shared by every process of the job, `bytes` of it this process's
        /// part (every process calls it, each with its own size, once all may share),
        /// or `None` where the processes cannot share memory (not all on one machine).
        /// All processes get the same answer.
        fn share(&self, _bytes: usize) -> Result<Option<Box<dyn Shared>>, RuntimeError> {
            Ok(None)
        }
        /// Each rank's host, named by the lowest rank on it (the same on every process):
        /// all-gathers then cross between hosts once per block ([`relay`](
        /// super::super::relay)). Every rank its own host where the transport cannot tell.
        fn hosts(&self) -> Vec<usize> {
            (0..self.size()).collect()
        }
        /// Each rank's process id, where this process can watch it (on this host): a
        /// job in shared memory notices a peer that died while the others wait for it
        /// in the memory. Empty where the transport notices (MPI ends the whole job).
        fn processes(&self) -> Vec<Option<i32>> {
            Vec::new()
        }
        /// Why the transport stopped working (a peer vanished, a deadline passed); it
        /// then moves nothing more. `None` while it works.
        fn failure(&self) -> Option<RuntimeError>;
        /// This process's run failed with `error`: stop the job's peers from waiting
        /// for it where the transport can (TCP closes its connections) and return it.
        fn stopped(&self, error: RuntimeError) -> RuntimeError {
            error
        }
        /// This process panicked during a run: stop the job's peers from waiting for
        /// it (MPI aborts the job; TCP closes its connections) and say so.
        fn panicked(&self, message: &str) -> RuntimeError;
    }
}

use link::{Bytes, Link, Parts};

/// Kernel chunks per round of a fused all-reduce, by default: rounds of about a hundred
/// thousand elements make few, large messages, and still many rounds to pipeline on
/// large tensors. 32 won every one of six interleaved tunings of Adam and LAMB at 2^24
/// over Open MPI on one machine (by 2–8 % over 128; BENCHMARKS.md); `tune_processes`
/// chooses per job.
pub const ROUND_CHUNKS: usize = 32;

/// A way for the processes of a job to talk: MPI (`mpi::topology::SimpleCommunicator`,
/// feature `mpi`) or [`Tcp`](super::Tcp). Implemented only in this crate.
pub trait Transport: link::Link {}

/// Byte displacements of consecutive parts.
pub(crate) fn displs(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |acc, &c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}

/// An error when `bytes` exceed what one collective of `link` can move.
pub(crate) fn check_size(link: &dyn Link, bytes: usize) -> Result<(), RuntimeError> {
    if bytes > link.max_message() {
        return Err(RuntimeError::Plan(format!(
            "{bytes} bytes exceed what one message between processes can carry \
             ({}); split the tensor",
            link.max_message()
        )));
    }
    Ok(())
}

/// Waits for `flight`, then reports the transport's failure, if any.
fn finish(link: &dyn Link, flight: Box<dyn link::Flight + '_>) -> Result<(), RuntimeError> {
    drop(flight);
    link.failure().map_or(Ok(()), Err)
}

fn as_bytes(data: &[f64]) -> &[u8] {
    // SAFETY: f64 has no padding and every byte pattern of u8 is valid.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), std::mem::size_of_val(data)) }
}

fn as_bytes_mut(data: &mut [f64]) -> &mut [u8] {
    // SAFETY: as above; any bytes written are some f64 (possibly a NaN).
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast(), std::mem::size_of_val(data)) }
}

/// Every rank's `mine` (`each` u64s from every rank), in rank order.
pub fn all_gather_u64(link: &dyn Link, mine: &[u64]) -> Result<Vec<u64>, RuntimeError> {
    let q = link.size();
    let mut all = vec![0u64; mine.len() * q];
    let width = std::mem::size_of_val(mine);
    check_size(link, width * q)?;
    // SAFETY: both buffers outlive the flight, which `finish` drops before returning.
    unsafe {
        let send = Bytes {
            ptr: mine.as_ptr().cast(),
            len: width,
        };
        let recv = Parts {
            ptr: all.as_mut_ptr().cast(),
            counts: vec![width; q],
            displs: (0..q).map(|s| s * width).collect(),
        };
        finish(link, link.post_all_gather(send, recv))?;
    }
    Ok(all)
}

/// Every rank's `data` (an empty slice from ranks without it), in rank order.
pub fn all_gather_f64(link: &dyn Link, data: &[f64]) -> Result<Vec<Vec<f64>>, RuntimeError> {
    let counts: Vec<usize> = all_gather_u64(link, &[data.len() as u64])?
        .into_iter()
        .map(|c| c as usize)
        .collect();
    let bytes: Vec<usize> = counts.iter().map(|c| c * 8).collect();
    check_size(link, bytes.iter().sum())?;
    let d = displs(&bytes);
    let mut buf = vec![0.0; counts.iter().sum()];
    // SAFETY: as in `all_gather_u64`.
    unsafe {
        let send = Bytes {
            ptr: as_bytes(data).as_ptr(),
            len: data.len() * 8,
        };
        let recv = Parts {
            ptr: as_bytes_mut(&mut buf).as_mut_ptr(),
            counts: bytes,
            displs: d.clone(),
        };
        finish(link, link.post_all_gather(send, recv))?;
    }
    Ok(counts
        .iter()
        .zip(&d)
        .map(|(&c, &o)| buf[o / 8..o / 8 + c].to_vec())
        .collect())
}

/// Checks that every process has the same labelled values as rank 0 (every process
/// calls it; all return the same answer): an error names the first rank and the first
/// thing that differs.
pub(crate) fn agree(link: &dyn Link, mine: &[(String, u64)]) -> Result<(), RuntimeError> {
    // First every rank's count and first value (whether it bound its inputs), so that
    // ranks with a failed binding or another program are named without exchanging
    // vectors of different lengths.
    let header = [mine.len() as u64, mine.first().map_or(0, |(_, v)| *v)];
    let headers = all_gather_u64(link, &header)?;
    if headers.chunks(2).any(|h| h != header) {
        let all: Vec<Vec<u64>> = headers
            .chunks(2)
            .map(|h| {
                let mut v = vec![0; h[0] as usize];
                if let Some(first) = v.first_mut() {
                    *first = h[1];
                }
                v
            })
            .collect();
        return coconet_plan::agreement::compare(mine, &all);
    }
    let values: Vec<u64> = mine.iter().map(|(_, v)| *v).collect();
    if values.is_empty() {
        return Ok(());
    }
    let all = all_gather_u64(link, &values)?;
    let all: Vec<Vec<u64>> = all.chunks(values.len()).map(<[u64]>::to_vec).collect();
    coconet_plan::agreement::compare(mine, &all)
}
