//! A [`ParamServer`] served to worker processes over TCP.
//!
//! One thread accepts connections, one thread per connection serves its requests. Pulls
//! and lookups are answered at once. Pushes are synchronous steps: the server keeps each
//! worker's push of step t until all `workers` have pushed it, applies them together
//! with [`ParamServer::push_merged`] in worker order — the same arithmetic as the
//! in-process table, whatever order the pushes arrived in — and only then answers them,
//! so no worker pulls step t + 1's rows before step t is applied. A worker that does not
//! push within the deadline fails the step for every worker, naming it.

use super::PURPOSE;
use super::wire::{Frame, kind};
use crate::data::error::DataError;
use crate::data::param_server::ParamServer;
use coconet_trust::{JobSecret, handshake, refusals};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A parameter-server shard serving its table (see the module docs).
pub struct PsServer {
    addr: SocketAddr,
    table: Arc<ParamServer>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

/// The synchronous step being gathered.
struct Steps {
    /// Steps applied so far (step t is applied once `applied == t`).
    applied: u64,
    /// Each worker's push of step `applied + 1`, once it arrived.
    pending: Vec<Option<(Vec<u64>, Vec<f32>)>>,
    /// Why steps stopped (a merge failed, a worker timed out): every later push fails.
    failed: Option<String>,
}

/// What every connection thread shares.
struct Shared {
    table: Arc<ParamServer>,
    workers: usize,
    timeout: Duration,
    steps: Mutex<Steps>,
    applied: Condvar,
    /// Which workers said hello (a second connection claiming one is refused).
    connected: Mutex<Vec<bool>>,
    /// What every connection must prove before its first request.
    secret: JobSecret,
}

impl PsServer {
    /// Serves `table` at `addr` (port 0 picks a free port: see [`PsServer::local_addr`])
    /// to `workers` workers that prove `secret`; a synchronous push waits up to `timeout`
    /// for the others. A connection that does not prove the secret is closed with a log
    /// line naming its address.
    pub fn start(
        addr: impl ToSocketAddrs + std::fmt::Display,
        table: ParamServer,
        workers: usize,
        timeout: Duration,
        secret: &JobSecret,
    ) -> Result<PsServer, DataError> {
        if workers == 0 {
            return Err(DataError::Invalid(
                "a parameter server for no workers".into(),
            ));
        }
        let shown = addr.to_string();
        let io = |e: std::io::Error| DataError::Remote {
            addr: shown.clone(),
            message: format!("cannot serve here: {e}"),
        };
        let listener = TcpListener::bind(&addr).map_err(io)?;
        listener.set_nonblocking(true).map_err(io)?;
        let local = listener.local_addr().map_err(io)?;
        refusals::announce_exposure("a parameter server", local, secret);
        let table = Arc::new(table);
        let shared = Arc::new(Shared {
            table: Arc::clone(&table),
            workers,
            timeout,
            steps: Mutex::new(Steps {
                applied: 0,
                pending: vec![None; workers],
                failed: None,
            }),
            applied: Condvar::new(),
            connected: Mutex::new(vec![false; workers]),
            secret: secret.clone(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name(format!("coconet-ps {local}"))
                .spawn(move || accept(&listener, &shared, &stop))
                .map_err(io)?
        };
        Ok(PsServer {
            addr: local,
            table,
            stop,
            acceptor: Some(acceptor),
        })
    }

    /// The address workers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The table served (its statistics, an export for a checkpoint).
    pub fn table(&self) -> &ParamServer {
        &self.table
    }
}

impl Drop for PsServer {
    /// Stops accepting connections; connections already open are served until their
    /// workers close them.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

/// Connections beyond the workers' own served at once (handshakes under way, a worker
/// reconnecting): each costs a thread, so the rest are turned away.
const SPARE_CONNECTIONS: usize = 64;

fn accept(listener: &TcpListener, shared: &Arc<Shared>, stop: &AtomicBool) {
    let open = Arc::new(AtomicUsize::new(0));
    let limit = shared.workers + SPARE_CONNECTIONS;
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut stream, peer)) => {
                if open.load(Ordering::Acquire) >= limit {
                    let reason = format!("it serves {limit} connections already (its limit)");
                    refusals::log_refusal("a parameter server", peer, &reason);
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
                    let _ = stream.write_all(&handshake::turn_away(&reason));
                    continue;
                }
                open.fetch_add(1, Ordering::AcqRel);
                let (shared, served) = (Arc::clone(shared), Arc::clone(&open));
                let spawned = std::thread::Builder::new()
                    .name("coconet-ps-conn".into())
                    .spawn(move || {
                        serve(stream, peer, &shared);
                        served.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    open.fetch_sub(1, Ordering::AcqRel);
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Serves one worker's connection until it closes, once it proved the job secret.
fn serve(mut stream: TcpStream, peer: SocketAddr, shared: &Shared) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_nodelay(true);
    let limit = handshake::DEFAULT_LIMIT;
    if let Err(e) = handshake::server(&mut stream, &shared.secret, PURPOSE, limit) {
        refusals::log_refusal("a parameter server", peer, &e);
        return;
    }
    let (mut reader, mut writer) = match stream.try_clone() {
        Ok(w) => (stream, w),
        Err(_) => return,
    };
    let mut worker: Option<usize> = None;
    // Once a request's header arrived, its body must arrive within the server's deadline
    // (between requests a worker may stay idle as long as it likes).
    while let Ok(request) = Frame::read_within(&mut reader, shared.timeout) {
        let answer = answer(shared, &mut worker, request);
        if answer.write(&mut writer).is_err() {
            break;
        }
    }
    if let Some(w) = worker {
        shared
            .connected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[w] = false;
    }
}

fn answer(shared: &Shared, worker: &mut Option<usize>, request: Frame) -> Frame {
    let table = &shared.table;
    let rows = |values: Vec<f32>| Frame {
        values,
        ..Frame::new(kind::OK)
    };
    match (request.kind, *worker) {
        (kind::HELLO, None) => match hello(shared, &request) {
            Ok(w) => {
                *worker = Some(w);
                Frame::new(kind::OK)
            }
            Err(e) => Frame::error(e),
        },
        (kind::HELLO, Some(w)) => Frame::error(format!("worker {w} said hello twice")),
        (_, None) => Frame::error("a request before the hello"),
        (kind::PULL, Some(_)) => rows(table.pull(&request.keys)),
        (kind::LOOKUP, Some(_)) => rows(table.lookup(&request.keys)),
        (kind::PUSH, Some(w)) => match push(shared, w, request) {
            Ok(()) => Frame::new(kind::OK),
            Err(e) => Frame::error(e),
        },
        (kind::EXPORT, Some(_)) => {
            let s = table.export();
            let mut values = s.values;
            values.extend_from_slice(&s.accum);
            Frame {
                keys: s.keys,
                values,
                ..Frame::new(kind::OK)
            }
        }
        (k, Some(_)) => Frame::error(format!("unknown request kind {k}")),
    }
}

/// Checks a worker's greeting; returns its index.
fn hello(shared: &Shared, h: &Frame) -> Result<usize, String> {
    let dim = shared.table.config().dim;
    if h.b != shared.workers as u64 {
        return Err(format!(
            "this server serves {} workers, the client says there are {}",
            shared.workers, h.b
        ));
    }
    if h.text != format!("dim={dim}") {
        return Err(format!(
            "this server's rows have {dim} elements, the client expects `{}`",
            h.text
        ));
    }
    let w = usize::try_from(h.a)
        .ok()
        .filter(|&w| w < shared.workers)
        .ok_or_else(|| format!("worker {} of {}", h.a, shared.workers))?;
    let mut connected = shared
        .connected
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if std::mem::replace(&mut connected[w], true) {
        return Err(format!("worker {w} is already connected"));
    }
    Ok(w)
}

/// Worker `w`'s push of a step: kept until every worker's is there, then all applied at
/// once; returns once the step is applied.
fn push(shared: &Shared, w: usize, request: Frame) -> Result<(), String> {
    let step = request.a;
    // A malformed push is refused on its own: it must not fail the step for everyone.
    let dim = shared.table.config().dim;
    if request.values.len() != request.keys.len() * dim {
        return Err(format!(
            "worker {w}'s push of step {step}: {} keys need {} gradient values ({dim} per \
             row), got {}",
            request.keys.len(),
            request.keys.len() * dim,
            request.values.len()
        ));
    }
    let scale = f32::from_bits(request.b as u32);
    if !scale.is_finite() {
        return Err(format!(
            "worker {w}'s push of step {step}: the scale {scale} is not finite"
        ));
    }
    if let Some(i) = request.values.iter().position(|v| !v.is_finite()) {
        return Err(format!(
            "worker {w}'s push of step {step}: the gradient of key {} holds {} (not finite)",
            request.keys[i / dim],
            request.values[i]
        ));
    }
    let deadline = Instant::now().checked_add(shared.timeout);
    let mut steps = shared.steps.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(why) = &steps.failed {
        return Err(why.clone());
    }
    if step != steps.applied + 1 {
        return Err(format!(
            "worker {w} pushed step {step} while the server is at step {}",
            steps.applied + 1
        ));
    }
    if steps.pending[w].is_some() {
        return Err(format!("worker {w} pushed step {step} twice"));
    }
    steps.pending[w] = Some((request.keys, request.values));
    if steps.pending.iter().all(Option::is_some) {
        let pending = std::mem::replace(&mut steps.pending, vec![None; shared.workers]);
        let pushes: Vec<(&[u64], &[f32])> = pending
            .iter()
            .flatten()
            .map(|(k, g)| (&k[..], &g[..]))
            .collect();
        let result = shared.table.push_merged(&pushes, scale);
        match result {
            Ok(()) => steps.applied = step,
            Err(e) => steps.failed = Some(format!("step {step} could not be applied: {e}")),
        }
        shared.applied.notify_all();
    }
    while steps.applied < step && steps.failed.is_none() {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left == Some(Duration::ZERO) {
            let missing: Vec<usize> = (0..shared.workers)
                .filter(|&v| steps.pending[v].is_none())
                .collect();
            steps.failed = Some(format!(
                "workers {missing:?} did not push step {step} within {:.1} s",
                shared.timeout.as_secs_f64()
            ));
            shared.applied.notify_all();
            break;
        }
        steps = match left {
            Some(left) => {
                shared
                    .applied
                    .wait_timeout(steps, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => shared
                .applied
                .wait(steps)
                .unwrap_or_else(PoisonError::into_inner),
        };
    }
    match &steps.failed {
        Some(why) if steps.applied < step => Err(why.clone()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::param_server::ParamServerConfig;

    /// A server for one worker with deadline `timeout`, the worker's connection (the
    /// secret proven, hello said) and the row width.
    fn one_worker(timeout: Duration) -> (PsServer, TcpStream, usize) {
        let table = ParamServer::new(ParamServerConfig::default()).unwrap();
        let dim = table.config().dim;
        let secret = JobSecret::generate().unwrap();
        let server = PsServer::start("127.0.0.1:0", table, 1, timeout, &secret).unwrap();
        let mut s = TcpStream::connect(server.local_addr()).unwrap();
        handshake::client(&mut s, &secret, PURPOSE, Duration::from_secs(5)).unwrap();
        let hello = Frame {
            a: 0,
            b: 1,
            text: format!("dim={dim}"),
            ..Frame::new(kind::HELLO)
        };
        hello.write(&mut s).unwrap();
        assert_eq!(Frame::read(&mut s).unwrap().kind, kind::OK);
        (server, s, dim)
    }

    /// A push whose values do not fit its keys is refused to that worker alone: the step
    /// still completes for everyone once the worker pushes properly.
    #[test]
    fn a_malformed_push_is_refused_without_failing_the_step() {
        let (server, mut s, dim) = one_worker(Duration::from_secs(5));
        let mut call = |f: Frame| {
            f.write(&mut s).unwrap();
            Frame::read(&mut s).unwrap()
        };
        let push = |values: usize| Frame {
            a: 1,
            b: 1.0f32.to_bits() as u64,
            keys: vec![7],
            values: vec![0.5; values],
            ..Frame::new(kind::PUSH)
        };
        let refused = call(push(dim - 1));
        assert_eq!(refused.kind, kind::ERROR);
        assert!(
            refused.text.contains("1 keys need 9 gradient values"),
            "{}",
            refused.text
        );
        let mut nan = push(dim);
        nan.values[3] = f32::NAN;
        let refused = call(nan);
        assert!(refused.text.contains("key 7 holds NaN"), "{}", refused.text);
        let mut infinite_scale = push(dim);
        infinite_scale.b = f32::INFINITY.to_bits() as u64;
        let refused = call(infinite_scale);
        assert!(refused.text.contains("scale inf"), "{}", refused.text);
        assert_eq!(call(push(dim)).kind, kind::OK, "the step still applies");
        assert_eq!(
            server.table().stats().iter().map(|s| s.pushed).sum::<u64>(),
            1
        );
    }

    /// A worker that stalls in the middle of a request is dropped at the server's
    /// deadline, not waited for (its thread is one of a capped few).
    #[test]
    fn a_worker_stalled_mid_request_is_dropped_at_the_deadline() {
        let (_server, mut s, _) = one_worker(Duration::from_millis(300));
        // A pull announcing 1,000 keys, then 8 bytes of them, then nothing.
        let mut bytes = Vec::new();
        Frame {
            keys: vec![1; 1000],
            ..Frame::new(kind::PULL)
        }
        .write(&mut bytes)
        .unwrap();
        use std::io::{Read, Write};
        s.write_all(&bytes[..48 + 8]).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let start = Instant::now();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{rest:?}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }
}
