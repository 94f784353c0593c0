//! TCP as a [`Transport`]: every process of the job connected to every other, so that
//! one rank per process runs without MPI — under `coconet-launch`, torchrun, or any
//! launcher that provides the rendezvous store.
//!
//! Each connection's threads are fed with the collectives' parts in the order they are
//! posted (every process posts the same collectives in the same order), so collectives
//! progress by themselves while the kernel computes. The bytes move on one of two data
//! paths ([`DataPath`]): through the socket ([`stream`]), or, between processes on one
//! host, copied once straight from the sender's memory ([`single_copy`]), the socket
//! carrying only offers and acknowledgements. Every message carries the collective's
//! sequence number, the step it belongs to and its length: processes that run
//! different plans, or a rank that stopped early, are an error naming the steps, never
//! misread bytes. Every wait has a deadline ([`Tcp::set_timeout`]); a peer that closes
//! its connection (it stopped, failed or was killed) with a collective outstanding fails
//! the run at once. After a failure the transport moves nothing more: the job reports
//! the error.

mod shared;
mod single_copy;
mod stream;

use super::transport::Transport;
use super::transport::link::{Bytes, Flight, Link, Parts};
use coconet_launch::HEARTBEAT_TIMEOUT;
use coconet_launch::for_backends::{Beater, Pace};
use coconet_launch::{LaunchEnv, Store};
use coconet_plan::RuntimeError;
use coconet_trust::gate::Gate;
use coconet_trust::{JobSecret, handshake, refusals};
pub(crate) use shared::END_OF_RUN;
use shared::{Latch, Part, Shared, publish_first, tag};
use single_copy::Connection;
use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Kernel chunks per round of a fused all-reduce over TCP (measured on loopback: 4
/// processes, 2^22 elements; over single-copy connections 128 was within 4 %).
pub const TCP_ROUND_CHUNKS: usize = 32;

/// How long a collective waits for its peers by default (as rank threads do).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The greeting a connecting process sends: magic, group hash, its rank, the group size.
const MAGIC: u64 = u64::from_le_bytes(*b"coco-tcp");

/// Connections to every other process of a job (see the module docs).
pub struct Tcp {
    rank: usize,
    size: usize,
    /// Per peer (none for this rank): the queues of its sending and receiving threads
    /// (stream path), or its single-copy connection.
    peers: Vec<Option<Peer>>,
    shared: Arc<Shared>,
    timeout: Duration,
    /// Collectives posted so far; every message is stamped with its collective's number.
    posted: AtomicU64,
    /// Whether every connection uses the single-copy path.
    single_copy: bool,
    /// Whether jobs may put their buffers in memory shared with the peers.
    share: bool,
    /// Each peer's process id where it runs on this host (none for this rank).
    pids: Vec<Option<i32>>,
    /// Each rank's host: the lowest rank that copies once to and from it (every rank
    /// its own where the stream path was asked for).
    hosts: Vec<usize>,
    /// When the single-copy connections were last progressed (nanoseconds since
    /// `since`): polls closer together than [`POLL_EVERY`] do nothing.
    looked: AtomicU64,
    since: Instant,
}

/// The shortest time between two progressions by [`Flight::poll`]: the kernel loop polls
/// every flight after every chunk (a few microseconds apart), and each look at the
/// sockets is a system call. Measured (2 processes, Adam 2^24, run): every poll 20.0 ms,
/// 20 µs 18.9, 100 µs 18.1–18.9, 400 µs 18.5–18.9; 4 processes at 2^22 within noise.
const POLL_EVERY: Duration = Duration::from_micros(100);

struct Peer {
    outbox: Option<Sender<Part>>,
    inbox: Option<Sender<Part>>,
    /// The connection on the single-copy path (no queues, no threads), where it is.
    single: Option<Connection>,
    threads: Vec<JoinHandle<()>>,
}

/// How the connections of a group move a collective's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataPath {
    /// Through the socket: two copies per byte (into the kernel and out), between any
    /// two hosts.
    Stream,
    /// Where two processes run on one Linux host and may read each other's memory, the
    /// receiver copies the bytes straight from the sender's buffer (`process_vm_readv`:
    /// one copy; the socket carries only small offers and acknowledgements); every
    /// other connection of the group uses the stream.
    SingleCopy,
    /// Where every connection of the group copies once (every process on one host), a
    /// job puts its buffers in memory the processes share (POSIX shared memory) and
    /// its steps read and write the peers' buffers directly, as rank threads do: no
    /// byte of a step goes through the connections. Otherwise as
    /// [`DataPath::SingleCopy`]. The default.
    SharedMemory,
}

impl DataPath {
    /// `COCONET_TCP_DATA=stream` keeps every connection on the stream path (to compare
    /// the paths, or where reading a peer's memory is not wanted), `single-copy` moves
    /// every byte in messages copied once; anything else, or nothing, is
    /// [`DataPath::SharedMemory`].
    pub fn from_env() -> DataPath {
        match std::env::var("COCONET_TCP_DATA").as_deref() {
            Ok("stream") => DataPath::Stream,
            Ok("single-copy") => DataPath::SingleCopy,
            _ => DataPath::SharedMemory,
        }
    }
}

/// A posted collective: dropping it waits for its parts (up to the deadline, after
/// which the transport fails and the parts are abandoned).
struct TcpFlight<'a> {
    tcp: &'a Tcp,
    latch: Arc<Latch>,
}

impl Flight for TcpFlight<'_> {
    /// Moves the single-copy connections' parts (the stream's threads need nothing).
    fn poll(&mut self) {
        let tcp = self.tcp;
        let now = tcp.since.elapsed().as_nanos() as u64;
        if now.saturating_sub(tcp.looked.load(Ordering::Relaxed)) >= POLL_EVERY.as_nanos() as u64 {
            tcp.progress();
        }
    }
}

impl Drop for TcpFlight<'_> {
    fn drop(&mut self) {
        let deadline = Instant::now().checked_add(self.tcp.timeout);
        if let Err(missing) = self.tcp.finish(&self.latch, deadline) {
            self.tcp.shared.fail(RuntimeError::Timeout {
                rank: self.tcp.rank,
                at: self.tcp.shared.at(),
                seconds: self.tcp.timeout.as_secs_f64(),
                missing,
            });
            // Abandons the single-copy parts; shutting the connections down wakes every
            // thread still on a stream part.
            self.tcp.progress();
            let _ = self.latch.wait(None);
        }
    }
}

/// Process-wide count of groups made by [`Tcp::from_env`], naming each one.
static GROUPS: AtomicUsize = AtomicUsize::new(0);

/// What a data connection's handshake proves: this group, these two ranks.
fn data_port_purpose(group: &str, size: usize, from: usize, to: usize) -> String {
    format!("coconet data port of group `{group}` ({size} ranks): rank {from} -> rank {to}")
}

/// Reads a connecting process's greeting and, where `claim` accepts it (the rank it
/// claims and what its handshake must prove), runs the handshake, all within `limit`:
/// the claimed rank, or why the connection was refused.
fn admit(
    s: &mut TcpStream,
    limit: Duration,
    secret: &JobSecret,
    claim: impl FnOnce(&[u8; 32]) -> Result<(usize, String), String>,
) -> Result<usize, String> {
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(limit.max(Duration::from_millis(1))))
        .map_err(|e| e.to_string())?;
    let mut hello = [0u8; 32];
    s.read_exact(&mut hello)
        .map_err(|e| format!("no greeting within {limit:?}: {e}"))?;
    let (r, purpose) = claim(&hello)?;
    handshake::server(s, secret, &purpose, limit).map_err(|e| e.to_string())?;
    Ok(r)
}

impl Tcp {
    /// Connects this process to the others of the job a launcher started
    /// (`coconet-launch`, torchrun: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`),
    /// through its rendezvous store. Every process calls it; the n-th call in each
    /// process joins the n-th group, so processes must make their groups in the same
    /// order (use [`Tcp::connect`] to name them).
    pub fn from_env() -> Result<Tcp, RuntimeError> {
        let env = LaunchEnv::from_env().map_err(|e| RuntimeError::Connect(e.to_string()))?;
        let mut store = env
            .connect()
            .map_err(|e| RuntimeError::Connect(e.to_string()))?;
        let n = GROUPS.fetch_add(1, Ordering::Relaxed);
        let mut tcp = Tcp::connect(
            &mut store,
            env.rank,
            env.world_size,
            &format!("group-{n}"),
            env.timeout,
        )?;
        if let Ok(limit) = std::env::var(HEARTBEAT_TIMEOUT) {
            let limit = coconet_launch::for_backends::parse_seconds(&limit).map_err(|e| {
                RuntimeError::Connect(format!("{HEARTBEAT_TIMEOUT}={limit:?} is invalid: {e}"))
            })?;
            tcp.start_heartbeat(limit)?;
        }
        Ok(tcp)
    }

    /// Beats this process's heartbeat for the launcher's `--heartbeat-timeout` watch
    /// ([`Tcp::from_env`] does when the launcher asks): a thread of its own, on a store
    /// connection of its own, beats every second unless a run has been stuck longer than
    /// `limit`, so only a rank stuck in a step goes silent — a stalled store delays the
    /// beats (with a warning), never a run.
    pub fn start_heartbeat(&mut self, limit: Duration) -> Result<(), RuntimeError> {
        let store = self
            .shared
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|s| (s.addr().to_string(), s.secret().clone()));
        let Some((addr, secret)) = store else {
            return Err(RuntimeError::Connect("the transport has no store".into()));
        };
        let own = Store::connect(&addr, &secret, self.timeout)
            .map_err(|e| RuntimeError::Connect(e.to_string()))?;
        *self
            .shared
            .beater
            .lock()
            .unwrap_or_else(PoisonError::into_inner) =
            Some(Beater::start(own, self.rank, Pace::UnlessStuck(limit)));
        Ok(())
    }

    /// Connects process `rank` of `size` to the others of group `name` (all call it with
    /// the same name and size), exchanging listening addresses through `store` and
    /// waiting up to `timeout` for everyone; the data path is
    /// [`DataPath::from_env`]'s.
    pub fn connect(
        store: &mut Store,
        rank: usize,
        size: usize,
        name: &str,
        timeout: Duration,
    ) -> Result<Tcp, RuntimeError> {
        Tcp::connect_with(store, rank, size, name, timeout, DataPath::from_env())
    }

    /// [`Tcp::connect`] with the data path chosen by the caller: a pair of processes
    /// copies once only where both choose [`DataPath::SingleCopy`] (and can), else it
    /// uses the stream.
    pub fn connect_with(
        store: &mut Store,
        rank: usize,
        size: usize,
        name: &str,
        timeout: Duration,
        path: DataPath,
    ) -> Result<Tcp, RuntimeError> {
        if size == 0 || rank >= size {
            return Err(RuntimeError::Connect(format!(
                "rank {rank} is not a rank of a group of {size} processes"
            )));
        }
        let fail = |what: String| RuntimeError::Connect(format!("group `{name}`: {what}"));
        // Listen on the interface that reaches the store: peers reach it the same way.
        let ip = store
            .local_addr()
            .map_err(|e| fail(format!("no local address towards the store: {e}")))?
            .ip();
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| fail(format!("cannot listen on {ip}: {e}")))?;
        let me = listener
            .local_addr()
            .map_err(|e| fail(format!("no listening address: {e}")))?;
        refusals::announce_exposure("the ranks' data ports", me, store.secret());
        store
            .set(&address_key(name, rank), me.to_string().as_bytes())
            .map_err(|e| fail(e.to_string()))?;
        let joining = Joining {
            name,
            rank,
            size,
            group: {
                let mut h = DefaultHasher::new();
                name.hash(&mut h);
                h.finish()
            },
            timeout,
            start: Instant::now(),
        };
        let mut streams: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
        // Lower ranks listen for me; I listen for higher ranks.
        joining.dial(store, &mut streams)?;
        joining.accept(store, &listener, &mut streams)?;
        // The transport's own connection to the store, to publish and read failures,
        // with a short deadline: a failing step must not wait long on a stalled or
        // unreachable store.
        let own = Store::connect(store.addr(), store.secret(), timeout)
            .map_err(|e| fail(e.to_string()))?
            .with_deadline(Duration::from_secs(3));
        let deadline = Instant::now().checked_add(joining.left());
        let pids = single_copy::negotiate(&mut streams, path != DataPath::Stream, deadline)
            .map_err(fail)?;
        let mut tcp = Tcp::start(
            rank,
            streams,
            pids.clone(),
            own,
            format!("coconet/tcp/{name}/failure"),
        )?;
        tcp.share = path == DataPath::SharedMemory;
        // The processes that copy once between themselves share a host: each names its
        // host by the lowest such rank, and all learn every rank's.
        let low = (0..size)
            .find(|&r| r == rank || pids[r].is_some())
            .unwrap_or(rank);
        tcp.hosts = super::transport::all_gather_u64(&tcp, &[low as u64])
            .map_err(|e| fail(e.to_string()))?
            .into_iter()
            .map(|h| h as usize)
            .collect();
        tcp.pids = pids;
        Ok(tcp)
    }

    /// Starts every connection: the two threads of one on the stream path (one on the
    /// single-copy path has none).
    fn start(
        rank: usize,
        streams: Vec<Option<TcpStream>>,
        pids: Vec<Option<i32>>,
        store: Store,
        failure_key: String,
    ) -> Result<Tcp, RuntimeError> {
        let size = streams.len();
        let mut clones = Vec::new();
        for s in streams.iter().flatten() {
            let _ = s.set_nodelay(true);
            clones.push(s.try_clone().map_err(|e| {
                RuntimeError::Connect(format!("cannot share a connection with a thread: {e}"))
            })?);
        }
        let shared = Arc::new(Shared {
            rank,
            streams: clones,
            failure: Mutex::new(None),
            store: Mutex::new(Some(store)),
            failure_key,
            beater: Mutex::new(None),
            at: Mutex::new((String::new(), 0)),
            labels: Mutex::new(HashMap::new()),
        });
        let mut peers = Vec::with_capacity(size);
        for (peer, stream) in streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                peers.push(None);
                continue;
            };
            let clone = || {
                stream.try_clone().map_err(|e| {
                    RuntimeError::Connect(format!("cannot share a connection with a thread: {e}"))
                })
            };
            let reader = clone()?;
            let (outbox, out_rx) = channel();
            let (inbox, in_rx) = channel();
            let (s1, s2) = (Arc::clone(&shared), Arc::clone(&shared));
            let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
                std::thread::Builder::new()
                    .name(name)
                    .spawn(f)
                    .map_err(|e| RuntimeError::Connect(format!("cannot start a thread: {e}")))
            };
            let (single, threads) = match pids[peer] {
                None => (
                    None,
                    vec![
                        spawn(
                            format!("coconet-tcp-send-{peer}"),
                            Box::new(move || stream::send_parts(&s1, peer, stream, out_rx)),
                        )?,
                        spawn(
                            format!("coconet-tcp-recv-{peer}"),
                            Box::new(move || stream::receive_parts(&s2, peer, reader, in_rx)),
                        )?,
                    ],
                ),
                Some(pid) => {
                    let conn = Connection::new(peer, pid, stream).map_err(|e| {
                        RuntimeError::Connect(format!("cannot set up the connection: {e}"))
                    })?;
                    drop((s1, s2, reader, out_rx, in_rx));
                    (Some(conn), Vec::new())
                }
            };
            let queues = single.is_none();
            peers.push(Some(Peer {
                outbox: queues.then_some(outbox),
                inbox: queues.then_some(inbox),
                single,
                threads,
            }));
        }
        let single_copy = peers.iter().flatten().all(|p| p.single.is_some());
        Ok(Tcp {
            rank,
            size,
            peers,
            shared,
            timeout: DEFAULT_TIMEOUT,
            posted: AtomicU64::new(0),
            single_copy,
            share: false,
            pids: Vec::new(),
            hosts: (0..size).collect(),
            looked: AtomicU64::new(0),
            since: Instant::now(),
        })
    }

    /// This process's rank in the group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Each rank's host, named by its lowest rank, as the connections found them (ranks
    /// that copy once between themselves share a host; each rank its own where the
    /// stream path was asked for). Where every host holds the same number (two or
    /// more) of consecutive ranks, all-gathers cross between hosts once per block.
    pub fn hosts(&self) -> &[usize] {
        &self.hosts
    }

    /// Whether every connection moves bytes on the single-copy path
    /// ([`DataPath::SingleCopy`] chosen, and possible between every pair).
    pub fn single_copy(&self) -> bool {
        self.single_copy
    }

    /// How long a collective waits for its peers before the run fails (default
    /// 60 s, as rank threads; `Duration::MAX` waits forever).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The single-copy connections.
    fn singles(&self) -> Vec<&Connection> {
        self.peers
            .iter()
            .flatten()
            .filter_map(|p| p.single.as_ref())
            .collect()
    }

    /// Moves what the single-copy connections can move now (one look at which sockets
    /// have something to read).
    fn progress(&self) {
        let singles = self.singles();
        if singles.is_empty() {
            return;
        }
        self.looked
            .store(self.since.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let readable = single_copy::wait(&singles, Duration::ZERO);
        for (conn, readable) in singles.into_iter().zip(readable) {
            conn.progress(&self.shared, readable);
        }
    }

    /// Waits until `latch`'s parts are finished, moving the single-copy connections'
    /// parts meanwhile; on a deadline, the peers still owing data.
    fn finish(&self, latch: &Latch, deadline: Option<Instant>) -> Result<(), Vec<usize>> {
        let singles = self.singles();
        if singles.is_empty() {
            return latch.wait(deadline);
        }
        // Stream parts (finished by threads) do not wake a wait on the sockets: look
        // often while the group has any.
        let look = if singles.len() + 1 == self.size {
            Duration::from_millis(50)
        } else {
            Duration::from_millis(1)
        };
        loop {
            self.progress();
            if latch.done() {
                return Ok(());
            }
            let left = deadline.map_or(look, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return Err(latch.missing());
            }
            let busy: Vec<&Connection> = singles.iter().copied().filter(|c| c.busy()).collect();
            if busy.is_empty() {
                let _ = latch.wait(Some(Instant::now() + left.min(look)));
            } else {
                let _ = single_copy::wait(&busy, left.min(look));
            }
        }
    }

    /// Posts one collective: `send_part(s)` bytes to each peer s, `recv_part(t)` bytes
    /// from each peer t; my own part is copied at once.
    ///
    /// # Safety
    /// As for [`Link::post_all_to_all`].
    unsafe fn post(
        &self,
        send_part: &dyn Fn(usize) -> (*const u8, usize),
        recv_part: &dyn Fn(usize) -> (*mut u8, usize),
    ) -> Box<dyn Flight + '_> {
        let collective = self.posted.fetch_add(1, Ordering::Relaxed);
        let step = self
            .shared
            .at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1;
        let (src, n) = send_part(self.rank);
        let (dst, m) = recv_part(self.rank);
        debug_assert_eq!(n, m, "my part to myself has one size");
        // SAFETY: both are the caller's valid bytes; `copy` allows them to overlap.
        unsafe { std::ptr::copy(src, dst, n.min(m)) };
        let others: Vec<usize> = (0..self.size).filter(|&s| s != self.rank).collect();
        let latch = Arc::new(Latch::new(2 * others.len(), others.clone()));
        for &s in &others {
            let peer = self.peers[s]
                .as_ref()
                .expect("a connection to every other rank");
            let (src, n) = send_part(s);
            let (dst, m) = recv_part(s);
            let part = |addr: usize, len: usize| Part {
                addr,
                len,
                collective,
                step,
                latch: Arc::clone(&latch),
            };
            if let Some(conn) = &peer.single {
                conn.post(&self.shared, part(src as usize, n), part(dst as usize, m));
                continue;
            }
            // A closed queue means the thread is gone: count the part as abandoned.
            for (queue, p, from) in [
                (&peer.outbox, part(src as usize, n), None),
                (&peer.inbox, part(dst as usize, m), Some(s)),
            ] {
                if let Some(Err(e)) = queue.as_ref().map(|q| q.send(p)) {
                    self.shared.lost(RuntimeError::RankFailed {
                        rank: s,
                        message: format!("the connection to rank {s} is closed"),
                    });
                    e.0.latch.finish(from);
                }
            }
        }
        Box::new(TcpFlight { tcp: self, latch })
    }
}

/// The store key rank r of group `name` publishes its listening address under.
fn address_key(name: &str, r: usize) -> String {
    format!("coconet/tcp/{name}/{r}")
}

/// Process `rank` of `size` joining group `name` (see [`Tcp::connect_with`]): it
/// connects to every lower rank and accepts every higher one, all within `timeout` of
/// `start`.
struct Joining<'a> {
    name: &'a str,
    rank: usize,
    size: usize,
    /// A hash of the group's name, in every greeting.
    group: u64,
    timeout: Duration,
    start: Instant,
}

impl Joining<'_> {
    fn fail(&self, what: String) -> RuntimeError {
        RuntimeError::Connect(format!("group `{}`: {what}", self.name))
    }

    /// Time left of the timeout.
    fn left(&self) -> Duration {
        self.timeout.saturating_sub(self.start.elapsed())
    }

    /// What I send first to a rank I connect to: who I am, in which group of how many.
    fn greeting(&self) -> Vec<u8> {
        [MAGIC, self.group, self.rank as u64, self.size as u64]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>()
    }

    /// Connects to every lower rank at the address it published, greets it and proves
    /// the job secret.
    fn dial(
        &self,
        store: &mut Store,
        streams: &mut [Option<TcpStream>],
    ) -> Result<(), RuntimeError> {
        let (rank, name, size) = (self.rank, self.name, self.size);
        for (r, slot) in streams.iter_mut().enumerate().take(rank) {
            let addr = store
                .get(&address_key(name, r), self.left())
                .map_err(|e| self.fail(format!("rank {r} never published its address: {e}")))?;
            let addr = String::from_utf8_lossy(&addr).to_string();
            let sock: SocketAddr = addr.parse().map_err(|e| {
                self.fail(format!("rank {r} published a bad address {addr:?}: {e}"))
            })?;
            let mut s = connect_retrying(sock, self.left())
                .map_err(|e| self.fail(format!("cannot connect to rank {r} at {addr}: {e}")))?;
            s.write_all(&self.greeting())
                .map_err(|e| self.fail(format!("cannot greet rank {r} at {addr}: {e}")))?;
            let limit = self.left().min(handshake::DEFAULT_LIMIT);
            handshake::client(
                &mut s,
                store.secret(),
                &data_port_purpose(name, size, rank, r),
                limit,
            )
            .map_err(|e| {
                self.fail(format!(
                    "rank {r} at {addr} did not let rank {rank} in: {e}"
                ))
            })?;
            *slot = Some(s);
        }
        Ok(())
    }

    /// Accepts every higher rank on `listener`. Whoever cannot say which rank of this
    /// group it is and prove the job secret for that claim is refused, and the group
    /// goes on waiting for its own ranks; each connection is checked on a thread of its
    /// own, so a silent one holds up nothing.
    fn accept(
        &self,
        store: &Store,
        listener: &TcpListener,
        streams: &mut [Option<TcpStream>],
    ) -> Result<(), RuntimeError> {
        let (rank, size, group) = (self.rank, self.size, self.group);
        listener
            .set_nonblocking(true)
            .map_err(|e| self.fail(e.to_string()))?;
        let gate = Gate::new(format!("rank {rank}'s data port (group `{}`)", self.name));
        while streams[rank + 1..].iter().any(Option::is_none) {
            match listener.accept() {
                Ok((s, from)) => {
                    let (secret, name) = (store.secret().clone(), self.name.to_string());
                    let limit = self.left().min(handshake::DEFAULT_LIMIT);
                    gate.check(s, from, move |s| {
                        admit(s, limit, &secret, |hello| {
                            claimed(hello, (group, size), rank, &name)
                        })
                    });
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(self.fail(format!("accepting a peer: {e}"))),
            }
            let admitted = gate.admitted();
            for (r, s, from) in admitted {
                if streams[r].is_some() {
                    return Err(self.fail(format!(
                        "{from} proved the job secret as rank {r}, which is connected already \
                         (two processes with one rank?)"
                    )));
                }
                s.set_read_timeout(None)
                    .map_err(|e| self.fail(e.to_string()))?;
                streams[r] = Some(s);
            }
            if streams[rank + 1..].iter().all(Option::is_some) {
                break;
            }
            if self.left().is_zero() {
                let missing: Vec<usize> =
                    (rank + 1..size).filter(|&r| streams[r].is_none()).collect();
                return Err(self.fail(format!(
                    "ranks {missing:?} did not connect within {:.1} s",
                    self.timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }
}

/// The rank a peer's greeting `hello` claims, and the purpose its proof of the secret
/// must name; an error where it is not a higher rank of this group (`group`: the hash
/// of `name`, of `size` ranks) connecting to `rank`.
fn claimed(
    hello: &[u8],
    (group, size): (u64, usize),
    rank: usize,
    name: &str,
) -> Result<(usize, String), String> {
    let word = |i: usize| u64::from_le_bytes(hello[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    if word(0) != MAGIC || word(1) != group || word(3) != size as u64 {
        return Err("not a process of this group (another job or \
                    group on this store?)"
            .to_string());
    }
    let r = word(2) as usize;
    if r <= rank || r >= size {
        return Err(format!(
            "it claims rank {r}, which cannot connect to rank {rank}"
        ));
    }
    Ok((r, data_port_purpose(name, size, r, rank)))
}

/// Connects to `addr`, retrying while nothing listens there yet, for up to `timeout`.
fn connect_retrying(addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let start = Instant::now();
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(1))) {
            Ok(s) => return Ok(s),
            Err(e) if left.is_zero() => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(10).min(left)),
        }
    }
}

impl Transport for Tcp {}

impl Link for Tcp {
    fn rank(&self) -> usize {
        self.rank
    }

    /// Where every connection copies once (every process on this host) and
    /// [`DataPath::SharedMemory`] was chosen.
    fn may_share(&self) -> bool {
        self.share && self.single_copy && cfg!(target_os = "linux")
    }

    fn share(
        &self,
        bytes: usize,
    ) -> Result<Option<Box<dyn super::transport::link::Shared>>, RuntimeError> {
        #[cfg(target_os = "linux")]
        return super::posix_shm::share(self, bytes);
        #[cfg(not(target_os = "linux"))]
        return Ok(None);
    }

    fn hosts(&self) -> Vec<usize> {
        Tcp::hosts(self).to_vec()
    }

    fn processes(&self) -> Vec<Option<i32>> {
        let mut pids = self.pids.clone();
        if let Some(me) = pids.get_mut(self.rank) {
            *me = i32::try_from(std::process::id()).ok();
        }
        pids
    }

    fn size(&self) -> usize {
        self.size
    }

    fn max_message(&self) -> usize {
        isize::MAX as usize
    }

    fn round_chunks(&self) -> usize {
        TCP_ROUND_CHUNKS
    }

    fn alive(&self) {
        self.shared.with_beater(Beater::run_starts);
    }

    fn idle(&self) {
        self.shared.with_beater(Beater::run_ends);
    }

    fn known(&self, labels: &[String]) {
        let mut known = self
            .shared
            .labels
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for at in labels {
            known.entry(tag(at)).or_insert_with(|| at.clone());
        }
    }

    fn enter(&self, at: &str) {
        let tag = tag(at);
        let mut s = self
            .shared
            .at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if s.1 != tag || s.0 != at {
            *s = (at.to_string(), tag);
            self.shared
                .labels
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(tag)
                .or_insert_with(|| at.to_string());
        }
    }

    fn set_timeout(&mut self, timeout: Duration) {
        Tcp::set_timeout(self, timeout);
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    unsafe fn post_all_to_all(&self, send: Parts, recv: Parts) -> Box<dyn Flight + '_> {
        // SAFETY: the caller's contract.
        unsafe {
            self.post(
                &|s| (send.ptr.add(send.displs[s]).cast_const(), send.counts[s]),
                &|t| (recv.ptr.add(recv.displs[t]), recv.counts[t]),
            )
        }
    }

    unsafe fn post_all_gather(&self, send: Bytes, recv: Parts) -> Box<dyn Flight + '_> {
        // SAFETY: the caller's contract.
        unsafe {
            self.post(&|_| (send.ptr, send.len), &|t| {
                (recv.ptr.add(recv.displs[t]), recv.counts[t])
            })
        }
    }

    fn failure(&self) -> Option<RuntimeError> {
        self.shared.failure()
    }

    /// Closes every connection, so that peers fail at once naming this rank.
    fn stopped(&self, error: RuntimeError) -> RuntimeError {
        self.shared.fail(error.clone());
        error
    }

    fn report(&self, e: &RuntimeError) {
        // Only what this process saw first-hand: a peer that missed a deadline, or its
        // own failure (a failure heard from the world's mark names its culprit already).
        let published = self
            .shared
            .failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|(_, first_hand)| *first_hand);
        if published {
            // Recorded first-hand, so `publish` already offered it to the launcher.
            return;
        }
        let culprit = match e {
            RuntimeError::Timeout { missing, .. } => missing.first().copied(),
            RuntimeError::RankFailed { rank, .. } if *rank == self.rank => Some(self.rank),
            _ => None,
        };
        let mut store = self
            .shared
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let (Some(culprit), Some(store)) = (culprit, store.as_mut()) {
            publish_first(store, culprit, &e.to_string());
        }
    }

    /// Closes every connection, so that peers fail at once naming this rank.
    fn panicked(&self, message: &str) -> RuntimeError {
        let e = RuntimeError::RankFailed {
            rank: self.rank,
            message: format!("panicked: {message}"),
        };
        self.shared.fail(e.clone());
        e
    }
}

impl Drop for Tcp {
    fn drop(&mut self) {
        // Closing the queues ends the threads (no part is in flight: flights borrow the
        // transport and wait for their parts).
        for peer in self.peers.iter_mut().flatten() {
            peer.outbox.take();
            peer.inbox.take();
            for t in peer.threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}
