//! The store's server: a key-value map that clients can wait on.
//!
//! It runs on a single-threaded tokio runtime in a thread of its own, because it must
//! serve many connections that mostly *wait* (a Get for a key no rank has set yet, a
//! barrier) while the process that hosts it — the launcher — does blocking work of its
//! own (spawning and watching ranks). One task per connection; waiting requests sleep on
//! a [`Notify`] that every Set and Add wakes, so waiting costs nothing until something
//! changes. The wire format is described in the `protocol` module.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener as StdListener, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use coconet_trust::frame::Decoder;
use coconet_trust::handshake::{self, ServerHandshake};
use coconet_trust::{AuthError, JobSecret, refusals};

use super::protocol::{self, MAGIC, Request, Response, VERSION};
use super::store::{STORE_PURPOSE, StoreError};

/// The longest a single server-side wait may last (a client asking for more is capped).
const MAX_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long a new connection may take to prove the job secret, and then to greet.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections served at once; more are refused with a reason (each costs a descriptor,
/// and the soft limit is often 1,024: the server raises it to the hard limit).
const MAX_CONNECTIONS: usize = 4096;

/// Connections from one address that have not proven the job secret yet: more are turned
/// away, so that strangers on one host cannot fill the server's connections.
const MAX_UNPROVEN_PER_PEER: usize = 64;

/// Once a request's length has arrived, how long its bytes may take (between requests a
/// client may stay idle as long as it likes).
const REQUEST_DEADLINE: Duration = Duration::from_secs(60);

/// The most bytes of keys and values a store holds by default (bootstrap bytes, addresses,
/// counters, gathered scalars: far less in any job; see [`StoreServer::bind_with_quota`]).
pub const DEFAULT_QUOTA: usize = 1 << 30;

/// A running store server; dropping it (or [`StoreServer::shutdown`]) stops it and closes
/// every connection.
///
/// ```
/// use coconet_launch::{JobSecret, Store, StoreServer};
/// use std::time::Duration;
/// let secret = JobSecret::generate().unwrap();
/// let server = StoreServer::bind("127.0.0.1:0", secret.clone()).unwrap();
/// let mut a = Store::connect(server.local_addr(), &secret, Duration::from_secs(5)).unwrap();
/// let mut b = Store::connect(server.local_addr(), &secret, Duration::from_secs(5)).unwrap();
/// a.set("nccl/unique_id", &[1, 2, 3]).unwrap();
/// assert_eq!(b.get("nccl/unique_id", Duration::from_secs(5)).unwrap(), vec![1, 2, 3]);
/// ```
#[derive(Debug)]
pub struct StoreServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Binds `addr` (port 0 picks a free port; see [`StoreServer::local_addr`]) and starts
    /// serving in a background thread, to clients that prove `secret` (each connection
    /// runs [`coconet_trust::handshake`] first; a client that does not is refused with a
    /// log line naming its address). Binding happens before this returns, so an address
    /// in use is reported here.
    pub fn bind(
        addr: impl ToSocketAddrs + std::fmt::Display,
        secret: JobSecret,
    ) -> Result<StoreServer, StoreError> {
        StoreServer::bind_with_quota(addr, secret, DEFAULT_QUOTA)
    }

    /// [`StoreServer::bind`] holding at most `quota` bytes of keys and values: a set that
    /// would pass it is refused with an error naming the quota.
    pub fn bind_with_quota(
        addr: impl ToSocketAddrs + std::fmt::Display,
        secret: JobSecret,
        quota: usize,
    ) -> Result<StoreServer, StoreError> {
        let shown = addr.to_string();
        let bind_err = |source| StoreError::Bind {
            addr: shown.clone(),
            source,
        };
        raise_descriptor_limit();
        let listener = StdListener::bind(&addr).map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        refusals::announce_exposure("the rendezvous store", local, &secret);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(bind_err)?;
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("coconet-store {local}"))
            .spawn(move || runtime.block_on(serve(listener, secret, quota, stopped)))
            .map_err(bind_err)?;
        Ok(StoreServer {
            addr: local,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address the server listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server and waits for its thread; clients see their connection close.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// The keys and values, and the bytes they hold.
#[derive(Default)]
struct Entries {
    map: HashMap<String, Vec<u8>>,
    /// Bytes of every key and value held.
    bytes: usize,
}

impl Entries {
    fn get(&self, key: &str) -> Option<&Vec<u8>> {
        self.map.get(key)
    }

    fn contains_key(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Stores `value` under `key` if the store stays within `quota` bytes.
    fn insert(&mut self, key: String, value: Vec<u8>, quota: usize) -> Result<(), String> {
        let old = self.map.get(&key).map_or(0, |v| key.len() + v.len());
        let held = self.bytes - old + key.len() + value.len();
        if held > quota {
            return Err(format!(
                "the store would hold {held} bytes, above its {quota}-byte quota (it holds {})",
                self.bytes
            ));
        }
        self.bytes = held;
        self.map.insert(key, value);
        Ok(())
    }

    fn remove(&mut self, key: &str) -> bool {
        match self.map.remove_entry(key) {
            Some((k, v)) => {
                self.bytes -= k.len() + v.len();
                true
            }
            None => false,
        }
    }
}

/// The map and the signal that it changed.
struct State {
    entries: Mutex<Entries>,
    changed: Notify,
    /// The most bytes of keys and values the store holds.
    quota: usize,
}

impl State {
    fn new(quota: usize) -> State {
        State {
            entries: Mutex::default(),
            changed: Notify::new(),
            quota,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // A panic while holding the lock cannot leave the map half-updated (each update
        // is one insert), so a poisoned lock is still safe to use.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until every key exists or `deadline` passes; `Err(key)` names one still missing.
    async fn wait_for(&self, keys: &[String], deadline: Instant) -> Result<(), String> {
        loop {
            // Created before the check, so a Set between the check and the await still
            // wakes it.
            let changed = self.changed.notified();
            let missing = {
                let map = self.lock();
                keys.iter().find(|k| !map.contains_key(k)).cloned()
            };
            let Some(missing) = missing else {
                return Ok(());
            };
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(missing);
            }
        }
    }

    async fn answer(&self, request: Request) -> Response {
        match request {
            Request::Hello { .. } => Response::Error("Hello sent twice".into()),
            Request::Set { key, value } => {
                if let Err(message) = self.lock().insert(key, value, self.quota) {
                    return Response::Error(message);
                }
                self.changed.notify_waiters();
                Response::Ok
            }
            Request::Get { key, timeout_ms } => {
                match self
                    .wait_for(std::slice::from_ref(&key), deadline(timeout_ms))
                    .await
                {
                    Ok(()) => match self.lock().get(&key) {
                        Some(v) => Response::Value(v.clone()),
                        // Deleted between the wait and the read.
                        None => Response::Missing,
                    },
                    Err(missing) => Response::Timeout { missing },
                }
            }
            Request::Wait { keys, timeout_ms } => {
                match self.wait_for(&keys, deadline(timeout_ms)).await {
                    Ok(()) => Response::Ok,
                    Err(missing) => Response::Timeout { missing },
                }
            }
            Request::Add { key, delta } => {
                let answer = {
                    let mut map = self.lock();
                    let current = match map.get(&key) {
                        None => Ok(0i64),
                        Some(v) => std::str::from_utf8(v)
                            .ok()
                            .and_then(|s| s.parse::<i64>().ok())
                            .ok_or_else(|| {
                                format!(
                                    "key {} holds a value that is not a counter",
                                    super::store::shown(&key)
                                )
                            }),
                    };
                    match current.and_then(|c| {
                        c.checked_add(delta).ok_or_else(|| {
                            format!("counter {} would overflow", super::store::shown(&key))
                        })
                    }) {
                        Ok(n) => match map.insert(key, n.to_string().into_bytes(), self.quota) {
                            Ok(()) => Response::Int(n),
                            Err(message) => Response::Error(message),
                        },
                        Err(message) => Response::Error(message),
                    }
                };
                if matches!(answer, Response::Int(_)) {
                    self.changed.notify_waiters();
                }
                answer
            }
            Request::TryGet { key } => match self.lock().get(&key) {
                Some(v) => Response::Value(v.clone()),
                None => Response::Missing,
            },
            Request::Delete { key } => Response::Int(i64::from(self.lock().remove(&key))),
        }
    }
}

fn deadline(timeout_ms: u64) -> Instant {
    let wait = Duration::from_millis(timeout_ms).min(MAX_WAIT);
    Instant::now() + wait
}

/// Connections from each address that have not proven the secret yet.
#[derive(Default)]
struct Unproven(Mutex<HashMap<IpAddr, usize>>);

impl Unproven {
    /// Counts a connection from `ip` as unproven, unless it has too many already.
    fn enter(self: &Arc<Self>, ip: IpAddr) -> Option<UnprovenGuard> {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(ip).or_insert(0);
        if *n >= MAX_UNPROVEN_PER_PEER {
            return None;
        }
        *n += 1;
        Some(UnprovenGuard(Arc::clone(self), ip))
    }
}

/// One unproven connection, counted until dropped.
struct UnprovenGuard(Arc<Unproven>, IpAddr);

impl Drop for UnprovenGuard {
    fn drop(&mut self) {
        let mut counts = self.0.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.1);
            }
        }
    }
}

async fn serve(
    listener: StdListener,
    secret: JobSecret,
    quota: usize,
    mut stopped: oneshot::Receiver<()>,
) {
    let secret = Arc::new(secret);
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(_) => return,
    };
    let state = Arc::new(State::new(quota));
    let open = Arc::new(AtomicUsize::new(0));
    let unproven = Arc::new(Unproven::default());
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => {
                if let Ok((mut stream, peer)) = accepted {
                    let _ = stream.set_nodelay(true);
                    let full = open.load(Ordering::Relaxed) >= MAX_CONNECTIONS;
                    let guard = if full { None } else { unproven.enter(peer.ip()) };
                    let Some(guard) = guard else {
                        // Refused with a reason, rather than starving the server of
                        // descriptors so that real clients cannot connect.
                        let message = if full {
                            format!(
                                "the store serves {MAX_CONNECTIONS} connections already (its \
                                 limit); {peer} was refused"
                            )
                        } else {
                            format!(
                                "{} has {MAX_UNPROVEN_PER_PEER} connections that have not \
                                 proven the job secret yet (the limit per address)",
                                peer.ip()
                            )
                        };
                        refusals::log_refusal("the rendezvous store", peer, &message);
                        tokio::spawn(async move {
                            let _ = stream.write_all(&handshake::turn_away(&message)).await;
                        });
                        continue;
                    };
                    open.fetch_add(1, Ordering::Relaxed);
                    let (state, open) = (Arc::clone(&state), Arc::clone(&open));
                    let secret = Arc::clone(&secret);
                    tokio::spawn(async move {
                        connection(stream, peer, &secret, guard, state).await;
                        open.fetch_sub(1, Ordering::Relaxed);
                    });
                } else {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
    // Returning drops the runtime with it (in `bind`'s thread), which cancels every
    // connection task and closes its socket.
}

/// Serves one client until it disconnects or breaks the protocol, once it proved the
/// job secret.
async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    secret: &JobSecret,
    unproven: UnprovenGuard,
    state: Arc<State>,
) {
    let proven = tokio::time::timeout(HELLO_TIMEOUT, prove(&mut stream, secret)).await;
    drop(unproven);
    let refusal = match proven {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!(
            "it did not complete the handshake within {HELLO_TIMEOUT:?}"
        )),
    };
    if let Some(reason) = refusal {
        refusals::log_refusal("the rendezvous store", peer, &reason);
        return;
    }
    let _ = serve_connection(&mut stream, &state).await;
}

/// The server's side of [`coconet_trust::handshake`] on the async stream.
async fn prove(stream: &mut TcpStream, secret: &JobSecret) -> Result<(), AuthError> {
    let io = |step| move |source| AuthError::Io { step, source };
    let mut hello = [0u8; handshake::HELLO_LEN];
    stream.read_exact(&mut hello).await.map_err(io("hello"))?;
    let state = ServerHandshake::new(secret, STORE_PURPOSE, &hello)?;
    stream
        .write_all(&state.challenge())
        .await
        .map_err(io("challenge"))?;
    if let Some(e) = state.mismatch() {
        return Err(e);
    }
    let mut proof = [0u8; handshake::PROOF_LEN];
    stream.read_exact(&mut proof).await.map_err(io("proof"))?;
    let verdict = state.verify(&proof);
    let byte = if verdict.is_ok() {
        handshake::ACCEPTED
    } else {
        handshake::REFUSED
    };
    stream.write_all(&[byte]).await.map_err(io("verdict"))?;
    verdict
}

async fn serve_connection(stream: &mut TcpStream, state: &State) -> io::Result<()> {
    let mut decoder = Decoder::new(&protocol::FORMAT);
    // A connection that does not greet in time is closed: idle sockets must not hold
    // the server's descriptors.
    let Ok(hello) = tokio::time::timeout(HELLO_TIMEOUT, read_request(stream, &mut decoder)).await
    else {
        let message = format!("no greeting within {HELLO_TIMEOUT:?}");
        return write_response(stream, &Response::Error(message)).await;
    };
    let hello = hello?;
    match hello {
        Ok(Request::Hello { magic, version }) if magic == MAGIC && version == VERSION => {
            write_response(stream, &Response::Ok).await?;
        }
        Ok(Request::Hello { magic, version }) if magic == MAGIC => {
            let message =
                format!("client speaks store protocol version {version}, this server {VERSION}");
            return write_response(stream, &Response::Error(message)).await;
        }
        _ => {
            let message = "not a coconet store client (expected Hello first)".to_string();
            return write_response(stream, &Response::Error(message)).await;
        }
    }
    loop {
        let request = match read_request(stream, &mut decoder).await? {
            Ok(r) => r,
            Err(e) => {
                return write_response(stream, &Response::Error(e.to_string())).await;
            }
        };
        let answer = state.answer(request).await;
        write_response(stream, &answer).await?;
    }
}

/// Reads a client's next request, waiting for its first byte as long as it takes and for
/// the rest at most [`REQUEST_DEADLINE`]; `decoder` keeps what arrived of the next.
async fn read_request(
    stream: &mut TcpStream,
    decoder: &mut Decoder,
) -> io::Result<Result<Request, protocol::ProtocolError>> {
    let mut buf = [0u8; 16 << 10];
    let mut deadline = None;
    loop {
        // Memory follows the bytes that arrive, not the length announced.
        if let Some(frame) = decoder.next_frame()? {
            return Ok(Request::decode(&frame.body));
        }
        if decoder.buffered() > 0 && deadline.is_none() {
            deadline = Some(Instant::now() + REQUEST_DEADLINE);
        }
        let n = match deadline {
            None => stream.read(&mut buf).await?,
            Some(at) => tokio::time::timeout_at(at, stream.read(&mut buf))
                .await
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "a request ({} bytes so far) did not arrive within {REQUEST_DEADLINE:?}",
                            decoder.buffered()
                        ),
                    )
                })??,
        };
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        decoder.feed(&buf[..n]);
    }
}

async fn write_response(stream: &mut TcpStream, response: &Response) -> io::Result<()> {
    let frame = protocol::FORMAT.encode(0, &[], &[&response.encode()])?;
    stream.write_all(&frame).await?;
    stream.flush().await
}

/// Raises this process's soft limit on open descriptors to its hard limit, so that a
/// store serving many ranks is not refused descriptors at 1,024 (best effort).
fn raise_descriptor_limit() {
    // SAFETY: getrlimit/setrlimit read and write the struct passed, nothing else.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
