//! In-process message queues between the rank threads of [`EmulatedRanks`]: the
//! [`PeerTransport`] that stands in for NCCL between emulated devices, with a timeout that
//! names a stuck peer and a failure that stops every waiter at once.
//!
//! [`EmulatedRanks`]: crate::EmulatedRanks

use crate::devices::emulator::Emulator;
use crate::executors::rank_job::{PeerTransfer, PeerTransport};
use coconet_plan::RuntimeError;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
/// How long a rank waits for a peer's bytes by default before it reports the peer as
/// stuck or gone.
pub const MAILBOX_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Queues {
    /// Messages from rank `.0` to rank `.1`, in the order sent.
    queues: HashMap<(usize, usize), VecDeque<Vec<u8>>>,
    /// The first rank that failed, and why.
    failed: Option<(usize, String)>,
}

/// Message queues between the rank threads of one job.
pub struct Mailboxes {
    state: Mutex<Queues>,
    arrived: Condvar,
    timeout: Duration,
}

impl Mailboxes {
    /// Mailboxes whose receivers wait at most `timeout` for a message.
    pub fn new(timeout: Duration) -> Arc<Mailboxes> {
        Arc::new(Mailboxes {
            state: Mutex::new(Queues::default()),
            arrived: Condvar::new(),
            timeout,
        })
    }

    /// Rank `rank`'s end.
    pub fn rank(self: &Arc<Self>, rank: usize) -> Mailbox {
        Mailbox {
            rank,
            boxes: self.clone(),
        }
    }

    /// Records that `rank` failed, so peers waiting for it stop at once.
    pub fn fail(&self, rank: usize, why: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.failed.get_or_insert((rank, why.to_string()));
        self.arrived.notify_all();
    }
}

/// One rank's end of [`Mailboxes`]: a [`PeerTransport`] for emulated devices (whose device
/// addresses are host addresses).
pub struct Mailbox {
    rank: usize,
    boxes: Arc<Mailboxes>,
}

impl PeerTransport<Emulator> for Mailbox {
    fn exchange(
        &self,
        _device: &Emulator,
        sends: &[PeerTransfer],
        recvs: &[PeerTransfer],
        at: &str,
    ) -> Result<(), RuntimeError> {
        // SAFETY: an emulated device address is the host address of a live buffer.
        unsafe { self.exchange_host(sends, recvs, at) }
    }

    fn barrier(
        &self,
        _device: &Emulator,
        scratch: u64,
        world: usize,
        at: &str,
    ) -> Result<(), RuntimeError> {
        // An empty message to every peer, then one from every peer: emulated kernels
        // have finished when their launch returns, so no rank passes before all arrive.
        let peers: Vec<PeerTransfer> = (0..world)
            .filter(|&p| p != self.rank)
            .map(|peer| PeerTransfer {
                peer,
                address: scratch,
                bytes: 0,
            })
            .collect();
        // SAFETY: no byte is read or written.
        unsafe { self.exchange_host(&peers, &peers, at) }
    }
}

impl Mailbox {
    /// [`PeerTransport::exchange`] for transfers at host addresses.
    ///
    /// # Safety
    /// Every transfer's address must point at `bytes` bytes of live host memory, which
    /// nothing else accesses during the call.
    pub unsafe fn exchange_host(
        &self,
        sends: &[PeerTransfer],
        recvs: &[PeerTransfer],
        at: &str,
    ) -> Result<(), RuntimeError> {
        let b = &self.boxes;
        {
            let mut s = b.state.lock().unwrap_or_else(|e| e.into_inner());
            for t in sends {
                // SAFETY: the caller's promise.
                let bytes = unsafe { std::slice::from_raw_parts(t.address as *const u8, t.bytes) };
                s.queues
                    .entry((self.rank, t.peer))
                    .or_default()
                    .push_back(bytes.to_vec());
            }
            b.arrived.notify_all();
        }
        let start = Instant::now();
        for t in recvs {
            let mut s = b.state.lock().unwrap_or_else(|e| e.into_inner());
            let msg = loop {
                if let Some(m) = s
                    .queues
                    .get_mut(&(t.peer, self.rank))
                    .and_then(VecDeque::pop_front)
                {
                    break m;
                }
                if let Some((rank, why)) = &s.failed {
                    return Err(RuntimeError::RankFailed {
                        rank: *rank,
                        message: why.clone(),
                    });
                }
                let left = b.timeout.saturating_sub(start.elapsed());
                if left.is_zero() {
                    return Err(RuntimeError::Timeout {
                        rank: self.rank,
                        at: at.to_string(),
                        seconds: start.elapsed().as_secs_f64(),
                        missing: vec![t.peer],
                    });
                }
                s = b
                    .arrived
                    .wait_timeout(s, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            };
            if msg.len() != t.bytes {
                return Err(RuntimeError::Plan(format!(
                    "{at}: rank {} expected {} bytes from rank {}, got {} (ranks disagree on \
                     the exchange; were they given different plans?)",
                    self.rank,
                    t.bytes,
                    t.peer,
                    msg.len()
                )));
            }
            // SAFETY: the caller's promise.
            unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), t.address as *mut u8, t.bytes) };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer(peer: usize, data: &mut [u8]) -> PeerTransfer {
        PeerTransfer {
            peer,
            address: data.as_mut_ptr() as u64,
            bytes: data.len(),
        }
    }

    #[test]
    fn bytes_reach_the_peer_in_order() {
        let boxes = Mailboxes::new(Duration::from_secs(5));
        let (a, b) = (boxes.rank(0), boxes.rank(1));
        let (mut x, mut y) = ([1u8, 2, 3], [4u8, 5]);
        let (mut gx, mut gy) = ([0u8; 3], [0u8; 2]);
        // SAFETY: live local arrays.
        unsafe {
            a.exchange_host(&[transfer(1, &mut x), transfer(1, &mut y)], &[], "t")
                .unwrap();
            b.exchange_host(&[], &[transfer(0, &mut gx), transfer(0, &mut gy)], "t")
                .unwrap();
        }
        assert_eq!((gx, gy), ([1, 2, 3], [4, 5]));
    }

    #[test]
    fn a_peer_that_never_sends_is_named_after_the_timeout() {
        let boxes = Mailboxes::new(Duration::from_millis(50));
        let mut buf = [0u8; 4];
        // SAFETY: a live local array.
        let e = unsafe {
            boxes
                .rank(0)
                .exchange_host(&[], &[transfer(2, &mut buf)], "step 3")
        }
        .unwrap_err();
        let RuntimeError::Timeout {
            rank, at, missing, ..
        } = e
        else {
            panic!("{e}")
        };
        assert_eq!((rank, at.as_str(), missing), (0, "step 3", vec![2]));
    }

    #[test]
    fn a_failed_peer_stops_its_waiters_at_once() {
        let boxes = Mailboxes::new(Duration::from_secs(600));
        let waiter = boxes.rank(0);
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 4];
            let start = Instant::now();
            // SAFETY: a live local array.
            let e = unsafe { waiter.exchange_host(&[], &[transfer(1, &mut buf)], "s") };
            (e, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(20));
        boxes.fail(1, "out of memory");
        let (e, waited) = t.join().unwrap();
        assert!(waited < Duration::from_secs(60));
        assert_eq!(e.unwrap_err().to_string(), "rank 1 failed: out of memory");
    }

    #[test]
    fn a_length_mismatch_is_an_error_not_corruption() {
        let boxes = Mailboxes::new(Duration::from_secs(5));
        let (mut x, mut got) = ([7u8; 8], [0u8; 4]);
        // SAFETY: live local arrays.
        let e = unsafe {
            boxes
                .rank(0)
                .exchange_host(&[transfer(1, &mut x)], &[], "s")
                .unwrap();
            boxes
                .rank(1)
                .exchange_host(&[], &[transfer(0, &mut got)], "s")
        };
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("expected 4 bytes from rank 0, got 8")
        );
        assert_eq!(got, [0; 4]);
    }
}
