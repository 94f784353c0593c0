//! Admission of a rendezvous's incoming connections, each checked on a thread of its own.
//!
//! A rank waiting for its peers accepts connections one by one; if it read each greeting
//! and ran each handshake in turn, a stranger that connects and says nothing would hold
//! the door for the whole handshake limit, and a few such connections would keep the job's
//! own peers out until the rendezvous times out. The gate checks every connection on its
//! own thread (at most [`MAX_PENDING`] at once) and hands the caller only the admitted.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};

use crate::refusals;

/// Connections checked at once; more are refused (and logged) until some finish.
pub const MAX_PENDING: usize = 64;

/// A connection that passed its check: the claim, the stream, the peer.
type Checked<T> = (T, TcpStream, SocketAddr);

/// Checks incoming connections concurrently (see the module docs).
#[derive(Debug)]
pub struct Gate<T> {
    service: String,
    sender: Sender<Checked<T>>,
    results: Receiver<Checked<T>>,
    pending: Arc<AtomicUsize>,
}

impl<T: Send + 'static> Gate<T> {
    /// A gate for `service` (named in the log line of each refusal).
    pub fn new(service: impl Into<String>) -> Gate<T> {
        let (sender, results) = channel();
        Gate {
            service: service.into(),
            sender,
            results,
            pending: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Checks `stream` (accepted from `from`) with `check` on a thread of its own: what
    /// it returns (the peer's claim, once its handshake passed) is handed out by
    /// [`Gate::admitted`], or its reason is logged (by that thread, whenever the check
    /// ends) and the connection closed. `check`
    /// must bound its own time (read deadlines).
    pub fn check(
        &self,
        mut stream: TcpStream,
        from: SocketAddr,
        check: impl FnOnce(&mut TcpStream) -> Result<T, String> + Send + 'static,
    ) {
        if self.pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            let reason = format!("{MAX_PENDING} connections are being checked already");
            refusals::log_refusal(&self.service, from, &reason);
            return;
        }
        let (sender, pending) = (self.sender.clone(), Arc::clone(&self.pending));
        let service = self.service.clone();
        let spawned = std::thread::Builder::new()
            .name("coconet-gate".into())
            .spawn(move || {
                match check(&mut stream) {
                    // The rendezvous may have ended (and dropped the gate): nobody to tell.
                    Ok(claim) => drop(sender.send((claim, stream, from))),
                    // Logged here, so a refusal after the rendezvous is logged too.
                    Err(reason) => refusals::log_refusal(&service, from, &reason),
                }
                pending.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            refusals::log_refusal(&self.service, from, &format!("no thread to check it: {e}"));
        }
    }

    /// The connections admitted since the last call (claim, stream, peer), in the order
    /// their checks ended.
    pub fn admitted(&self) -> Vec<Checked<T>> {
        let mut out = Vec::new();
        loop {
            match self.results.try_recv() {
                Ok(checked) => out.push(checked),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return out,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    #[test]
    fn a_silent_connection_does_not_hold_up_the_next() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let gate: Gate<u8> = Gate::new("a test port");
        let check = |s: &mut TcpStream| {
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b).map_err(|e| e.to_string())?;
            if b[0] == 7 {
                Ok(b[0])
            } else {
                Err(format!("said {}", b[0]))
            }
        };
        let _silent = TcpStream::connect(addr).unwrap();
        let (s, from) = listener.accept().unwrap();
        gate.check(s, from, check);
        let mut wrong = TcpStream::connect(addr).unwrap();
        wrong.write_all(&[1]).unwrap();
        let (s, from) = listener.accept().unwrap();
        gate.check(s, from, check);
        let mut member = TcpStream::connect(addr).unwrap();
        member.write_all(&[7]).unwrap();
        let (s, from) = listener.accept().unwrap();
        gate.check(s, from, check);
        let start = Instant::now();
        let mut got = Vec::new();
        while got.is_empty() && start.elapsed() < Duration::from_secs(2) {
            got = gate.admitted();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            got.len(),
            1,
            "the member is let in while the silent one is checked"
        );
        assert_eq!(got[0].0, 7);
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
    }
}
