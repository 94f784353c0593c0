//! The single-copy data path, for processes on one Linux host: the socket carries only
//! small messages — an *offer* (where the sender's bytes lie) and an *acknowledgement* —
//! and the receiver copies the bytes straight from the sender's memory into its own
//! (cross-memory attach, `process_vm_readv`): one copy instead of the stream's two
//! (into the kernel's socket buffer and out), with no per-byte work on the sender.
//! Open MPI moves on-node data the same way.
//!
//! The receiver pulls, the sender never writes into a peer: a failed or abandoned
//! collective can then only leave the *reader's* receive buffer unfinished, and the reader
//! reports the failure (its acknowledgement or the next collective fails); no process's
//! memory is written by another.
//!
//! No thread of its own: the process that posts a collective moves it, whenever it
//! polls a flight (between kernel chunks) or waits for one ([`Connection::progress`]:
//! read what arrived, copy what was offered for a posted receive, acknowledge, finish
//! what was acknowledged). Every process waiting on a collective progresses all its
//! connections, so every offer is eventually taken, whatever order the processes post
//! and wait in; nothing wakes a thread per message.
//!
//! Whether a connection uses it is decided once, when the group connects
//! ([`negotiate`]): each process reads a random probe word from each peer's memory; only
//! where both directions read the right word (same host, permission to read the peer:
//! same user, no seccomp or Yama rule against it) does the pair use this path; elsewhere
//! the stream path.

use super::shared::{Part, Shared};
use coconet_plan::RuntimeError;
use coconet_trust::frame::{Decoder, Format, Layout};
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A message: where the sender's bytes of a part lie.
const OFFER: u8 = 1;
/// A message: the receiver has copied an offered part.
const ACK: u8 = 2;

/// The single-copy path's messages, in coconet's frame codec: a kind and four words
/// (collective, step tag, length, address), no body.
const FORMAT: Format = Format {
    peer: "rank",
    layout: Layout::Words(4),
    kinds: &[OFFER, ACK],
    max_body: 0,
};

/// One single-copy connection: its socket (non-blocking) and the parts in flight on it.
pub(super) struct Connection {
    peer: usize,
    /// The peer's process id.
    pid: i32,
    /// The socket's descriptor, to wait on.
    #[cfg(unix)]
    fd: std::os::fd::RawFd,
    state: Mutex<State>,
}

struct State {
    stream: TcpStream,
    /// Messages read but not yet whole.
    partial: Decoder,
    /// Messages not yet written (the socket was full).
    unsent: Vec<u8>,
    /// The peer's offers not yet matched with a posted receive, in its posting order.
    offers: VecDeque<Offer>,
    /// Posted receives from the peer not yet matched with its offer, in posting order.
    receives: VecDeque<Part>,
    /// Offered parts waiting for their acknowledgements, in offering order.
    awaiting: VecDeque<Part>,
    /// The peer closed the connection.
    closed: bool,
}

/// An offer from the peer: `len` bytes at `addr` in its memory for its collective.
struct Offer {
    collective: u64,
    step: u64,
    len: u64,
    addr: u64,
}

/// Why progress stopped: the error, and whether this process saw it first-hand.
type Stop = (RuntimeError, bool);

impl Connection {
    /// A connection to rank `peer`, process `pid`, over `stream`.
    pub(super) fn new(peer: usize, pid: i32, stream: TcpStream) -> std::io::Result<Connection> {
        stream.set_nonblocking(true)?;
        Ok(Connection {
            peer,
            pid,
            #[cfg(unix)]
            fd: std::os::fd::AsRawFd::as_raw_fd(&stream),
            state: Mutex::new(State {
                stream,
                partial: Decoder::new(&FORMAT),
                unsent: Vec::new(),
                offers: VecDeque::new(),
                receives: VecDeque::new(),
                awaiting: VecDeque::new(),
                closed: false,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Posts one collective's parts with the peer: `send` is offered, `receive` waits
    /// for the peer's offer.
    pub(super) fn post(&self, shared: &Shared, send: Part, receive: Part) {
        let mut s = self.state();
        if s.closed || shared.failed() {
            drop(s);
            if !shared.failed() {
                shared.lost(shared.lost_peer(self.peer, &"it closed its connection"));
            }
            send.latch.finish(None);
            receive.latch.finish(Some(self.peer));
            return;
        }
        s.unsent.extend_from_slice(&message(
            OFFER,
            [
                send.collective,
                send.step,
                send.len as u64,
                send.addr as u64,
            ],
        ));
        s.awaiting.push_back(send);
        s.receives.push_back(receive);
        drop(s);
        self.progress(shared, false);
    }

    /// Moves what can move without waiting: writes pending messages, reads what
    /// arrived (if the socket is `readable`), copies offered bytes into posted receives
    /// and acknowledges them, finishes acknowledged parts. After a failure, abandons
    /// every part in flight.
    pub(super) fn progress(&self, shared: &Shared, readable: bool) {
        let mut s = self.state();
        let outcome = if shared.failed() {
            Ok(())
        } else {
            self.step(shared, &mut s, readable)
        };
        match outcome {
            Ok(()) => {}
            Err((e, true)) => shared.fail(e),
            Err((e, false)) => shared.lost(e),
        }
        if shared.failed() {
            for part in s.receives.drain(..) {
                part.latch.finish(Some(self.peer));
            }
            for part in s.awaiting.drain(..) {
                part.latch.finish(None);
            }
        }
    }

    fn step(&self, shared: &Shared, s: &mut State, readable: bool) -> Result<(), Stop> {
        let lost = |e: &dyn std::fmt::Display| (shared.lost_peer(self.peer, e), false);
        flush(s).map_err(|e| lost(&e))?;
        // A reset connection ends as a closed one does: a failure only with something
        // outstanding (below).
        let (ended, why) = match readable.then(|| read_available(s)) {
            None | Some(Ok(false)) => (false, None),
            Some(Ok(true)) => (true, None),
            Some(Err(e)) => (true, Some(e)),
        };
        let stranger = |what: &dyn std::fmt::Display| {
            let peer = self.peer;
            let message = format!("rank {peer} sent {what}: another program on this connection?");
            (
                RuntimeError::RankFailed {
                    rank: peer,
                    message,
                },
                true,
            )
        };
        while let Some(m) = s.partial.next_frame().map_err(|e| stranger(&e))? {
            let [collective, step, len, addr] = m.words;
            match m.kind {
                OFFER => s.offers.push_back(Offer {
                    collective,
                    step,
                    len,
                    addr,
                }),
                ACK => match s.awaiting.pop_front() {
                    Some(part) if part.collective == collective => part.latch.finish(None),
                    other => {
                        if let Some(part) = other {
                            part.latch.finish(None);
                        }
                        return Err((
                            RuntimeError::RankFailed {
                                rank: self.peer,
                                message: format!(
                                    "rank {} acknowledged collective #{collective}, which rank \
                                     {} did not offer it: the processes run different plans",
                                    self.peer, shared.rank
                                ),
                            },
                            true,
                        ));
                    }
                },
                kind => return Err(stranger(&format!("a message of unknown kind {kind}"))),
            }
        }
        while !s.receives.is_empty() && !s.offers.is_empty() {
            let (part, offer) = (&s.receives[0], &s.offers[0]);
            shared
                .check_arrival(self.peer, part, offer.collective, offer.step, offer.len)
                .map_err(|e| (e, true))?;
            // SAFETY: the poster keeps these bytes valid and untouched by anything else
            // until the part is finished (its flight waits for it).
            let into = unsafe { std::slice::from_raw_parts_mut(part.addr as *mut u8, part.len) };
            read_remote(self.pid, offer.addr as usize, into)
                .map_err(|e| lost(&format!("reading its memory: {e}")))?;
            let ack = message(ACK, [offer.collective, 0, 0, 0]);
            s.unsent.extend_from_slice(&ack);
            s.offers.pop_front();
            let part = s.receives.pop_front().expect("a receive was matched");
            part.latch.finish(Some(self.peer));
        }
        flush(s).map_err(|e| lost(&e))?;
        if ended {
            s.closed = true;
            // A peer that finished its last collective closes its connection when it
            // drops its transport: only a closing with something outstanding fails.
            if !s.receives.is_empty() || !s.awaiting.is_empty() {
                return Err(match why {
                    Some(e) => lost(&e),
                    None => lost(&"it closed its connection"),
                });
            }
        }
        Ok(())
    }

    /// Whether a part is in flight on this connection.
    pub(super) fn busy(&self) -> bool {
        let s = self.state();
        !s.receives.is_empty() || !s.awaiting.is_empty()
    }
}

/// Reads what arrived into `s.partial`; whether the peer closed the connection.
fn read_available(s: &mut State) -> std::io::Result<bool> {
    let mut buf = [0u8; 4096];
    loop {
        match s.stream.read(&mut buf) {
            Ok(0) => return Ok(true),
            Ok(n) => s.partial.feed(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes what the socket takes of the pending messages.
fn flush(s: &mut State) -> std::io::Result<()> {
    while !s.unsent.is_empty() {
        match s.stream.write(&s.unsent) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => {
                s.unsent.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Waits until one of `conns` has something to read (or room to write what it could
/// not), at most `timeout` (zero: only looks); which ones have something to read (or
/// were closed or failed).
#[cfg(unix)]
pub(super) fn wait(conns: &[&Connection], timeout: Duration) -> Vec<bool> {
    let mut fds: Vec<libc::pollfd> = conns
        .iter()
        .map(|c| libc::pollfd {
            fd: c.fd,
            events: if c.state().unsent.is_empty() {
                libc::POLLIN
            } else {
                libc::POLLIN | libc::POLLOUT
            },
            revents: 0,
        })
        .collect();
    let ms = if timeout.is_zero() {
        0
    } else {
        i32::try_from(timeout.as_millis().max(1)).unwrap_or(i32::MAX)
    };
    // SAFETY: `fds` is a valid array of `fds.len()` pollfds for the call's duration.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        // Interrupted, or out of memory: read every socket (reading is harmless).
        return vec![true; conns.len()];
    }
    fds.iter()
        .map(|f| f.revents & !libc::POLLOUT != 0)
        .collect()
}

#[cfg(not(unix))]
pub(super) fn wait(conns: &[&Connection], timeout: Duration) -> Vec<bool> {
    std::thread::sleep(timeout.min(Duration::from_millis(1)));
    vec![true; conns.len()]
}

fn message(kind: u8, words: [u64; 4]) -> Vec<u8> {
    FORMAT
        .encode_head(kind, &words, 0)
        .expect("a message without a body is within the limit")
}

fn words<const N: usize>(bytes: &[u8]) -> [u64; N] {
    std::array::from_fn(|i| {
        u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    })
}

/// Copies `into.len()` bytes at `from` in process `pid`'s memory into `into`.
#[cfg(target_os = "linux")]
fn read_remote(pid: i32, from: usize, into: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < into.len() {
        let left = into.len() - done;
        let local = libc::iovec {
            iov_base: into[done..].as_mut_ptr().cast(),
            iov_len: left,
        };
        let remote = libc::iovec {
            iov_base: (from + done) as *mut libc::c_void,
            iov_len: left,
        };
        // SAFETY: `local` is this process's writable memory of `left` bytes; the kernel
        // checks the remote range and fails (EFAULT) rather than read outside it.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        match n {
            n if n > 0 => done += n as usize,
            0 => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the peer's memory ended",
                ));
            }
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn read_remote(_pid: i32, _from: usize, _into: &mut [u8]) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Decides, per connection, whether the pair uses this path (see the module docs): every
/// process calls it once its connections are made, with `wanted` false to keep every
/// connection on the stream path. The peer's process id where a connection uses it.
pub(super) fn negotiate(
    streams: &mut [Option<TcpStream>],
    wanted: bool,
    deadline: Option<Instant>,
) -> Result<Vec<Option<i32>>, String> {
    // A word no other process can guess, read back by the peers.
    let probe = Box::new({
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    });
    let me = [
        u64::from(std::process::id()),
        std::ptr::from_ref::<u64>(&probe) as u64,
        *probe,
        u64::from(wanted),
    ];
    let mine: Vec<u8> = me.iter().flat_map(|w| w.to_le_bytes()).collect();
    // No deadline (a timeout too long to add to now) waits as long as it takes.
    let timed = |s: &TcpStream| {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        s.set_read_timeout(left.map(|l| l.max(Duration::from_millis(1))))
    };
    let mut readable = vec![false; streams.len()];
    let mut pids = vec![None; streams.len()];
    for s in streams.iter_mut().flatten() {
        s.write_all(&mine)
            .map_err(|e| format!("cannot offer to read memory: {e}"))?;
    }
    for (peer, s) in streams.iter_mut().enumerate() {
        let Some(s) = s else { continue };
        timed(s).map_err(|e| e.to_string())?;
        let mut theirs = [0u8; 32];
        s.read_exact(&mut theirs)
            .map_err(|e| format!("rank {peer} did not say whether it shares memory: {e}"))?;
        let [pid, addr, value, wants] = words(&theirs);
        let mut word = [0u8; 8];
        readable[peer] = wanted
            && wants == 1
            && i32::try_from(pid).is_ok_and(|pid| {
                read_remote(pid, addr as usize, &mut word).is_ok()
                    && u64::from_le_bytes(word) == value
            });
        pids[peer] = i32::try_from(pid).ok();
    }
    for (peer, s) in streams.iter_mut().enumerate() {
        if let Some(s) = s {
            s.write_all(&[u8::from(readable[peer])])
                .map_err(|e| format!("cannot answer rank {peer}: {e}"))?;
        }
    }
    for (peer, s) in streams.iter_mut().enumerate() {
        let Some(s) = s else { continue };
        let mut answer = [0u8];
        s.read_exact(&mut answer)
            .map_err(|e| format!("rank {peer} did not answer whether it read memory: {e}"))?;
        s.set_read_timeout(None).map_err(|e| e.to_string())?;
        if !(readable[peer] && answer[0] == 1) {
            pids[peer] = None;
        }
    }
    drop(probe);
    Ok(pids)
}
