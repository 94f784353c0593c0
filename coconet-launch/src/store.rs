//! The store's client: blocking calls for rank code.
//!
//! Ranks of a multi-process job must agree on a few bytes before they can talk to each
//! other at all — the NCCL unique id that rank 0 creates, CUDA IPC handles of peer
//! buffers, "everyone is ready" — and they have nothing to agree *over* yet. The store is
//! that bootstrap channel: a key-value map served over TCP by the launcher of node 0 at
//! `MASTER_ADDR:MASTER_PORT` (torchrun's "c10d" convention), which every rank connects to.
//!
//! The client is deliberately blocking (plain `std::net`): rank code is ordinary
//! synchronous training code with no async runtime. Every call has a deadline and every
//! failure is a [`StoreError`] naming the operation, the key and how long it waited; no
//! call panics or waits forever, even if the server vanishes.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use thiserror::Error;

use coconet_trust::{AuthError, JobSecret, handshake};

use super::env::{EnvError, LaunchEnv};
use super::protocol::{self, MAGIC, Request, Response, VERSION};

/// What the store's handshake proves (see [`coconet_trust::handshake`]).
pub(crate) const STORE_PURPOSE: &str = "coconet rendezvous store";

/// How much longer than a server-side wait the client waits for the answer before it
/// declares the connection dead.
const ANSWER_GRACE: Duration = Duration::from_secs(5);

/// The key prefix the launchers use in the store; rank code should not write under it.
pub const LAUNCH_PREFIX: &str = "coconet/launch/";

/// The key (under [`LAUNCH_PREFIX`]) where the first failure a rank's process backend saw
/// first-hand is published, for the launcher's verdict.
pub const FIRST_FAILURE: &str = "first-failure";

/// The key prefix [`Store::barrier`] uses; other code should not write under it.
pub const BARRIER_PREFIX: &str = "coconet/barrier/";

/// Why a store operation failed.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The server could not listen on its address.
    #[error("could not start the rendezvous store on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// What the OS said.
        source: io::Error,
    },
    /// No store answered at the address within the timeout.
    #[error(
        "could not connect to the rendezvous store at {addr} within {waited:.1?}: {source} (is the launcher of node 0 running, and MASTER_ADDR/MASTER_PORT right?)"
    )]
    Connect {
        /// The address tried.
        addr: String,
        /// How long connecting was retried.
        waited: Duration,
        /// The last failure.
        source: io::Error,
    },
    /// A wait ended before the key was set.
    #[error("store {op} of key {} timed out after {waited:.1?}", shown(key))]
    Timeout {
        /// The operation (`get`, `wait`).
        op: &'static str,
        /// The (first) key still missing.
        key: String,
        /// How long it waited.
        waited: Duration,
    },
    /// A barrier's other participants did not all arrive in time.
    #[error(
        "barrier {} timed out after {waited:.1?}: {arrived} of {world_size} ranks arrived",
        shown(name)
    )]
    BarrierTimeout {
        /// The barrier's name.
        name: String,
        /// How many had arrived when it gave up.
        arrived: i64,
        /// How many were expected.
        world_size: usize,
        /// The timeout it was given.
        waited: Duration,
    },
    /// More participants arrived at a barrier than its size.
    #[error(
        "barrier {}: {arrived} ranks arrived but its size is {world_size} (do the ranks agree on the world size?)",
        shown(name)
    )]
    BarrierOverflow {
        /// The barrier's name.
        name: String,
        /// How many arrived.
        arrived: i64,
        /// The size this rank passed.
        world_size: usize,
    },
    /// The connection failed while an operation was under way.
    #[error("lost the connection to the rendezvous store at {addr} during {op}: {source}")]
    Io {
        /// The server's address.
        addr: String,
        /// The operation.
        op: &'static str,
        /// What the OS said.
        source: io::Error,
    },
    /// An earlier failure left this connection in an unknown state.
    #[error(
        "the connection to the rendezvous store at {addr} failed earlier; connect again to use the store"
    )]
    Broken {
        /// The server's address.
        addr: String,
    },
    /// The store and this process did not prove the same job secret to each other.
    #[error("the rendezvous store at {addr} did not let this process in: {source}")]
    Auth {
        /// The server's address.
        addr: String,
        /// What the handshake found.
        source: AuthError,
    },
    /// The peer is not a store, or spoke the protocol wrongly.
    #[error("protocol error with the rendezvous store at {addr}: {detail}")]
    Protocol {
        /// The server's address.
        addr: String,
        /// What was wrong.
        detail: String,
    },
    /// The server refused the request.
    #[error("the rendezvous store refused {op} of key {}: {message}", shown(key))]
    Rejected {
        /// The operation.
        op: &'static str,
        /// Its key.
        key: String,
        /// The server's reason.
        message: String,
    },
    /// Rank 0 must host the store (its launcher does not) and this build cannot.
    #[error(
        "rank 0 of a job started by {launcher} hosts the rendezvous store, which needs coconet's `launcher` feature (or start the job with coconet-launch)"
    )]
    CannotHost {
        /// The launcher that started the job.
        launcher: super::Launcher,
    },
    /// The launch environment variables are missing or invalid.
    #[error(transparent)]
    Env(#[from] EnvError),
}

/// A key as error messages show it: quoted, and cut after 100 characters with its
/// length (a message must not carry a 64 MiB key).
pub(crate) fn shown(key: &str) -> String {
    const MAX: usize = 100;
    match key.char_indices().nth(MAX) {
        None => format!("{key:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &key[..cut], key.len()),
    }
}

/// A connection to the rendezvous store.
///
/// Each rank holds one. Operations that wait (`get`, `wait`, `barrier`) take their own
/// timeout; the others (`set`, `add`, `try_get`) use the timeout given to
/// [`Store::connect`] as the deadline for the server's answer.
pub struct Store {
    stream: TcpStream,
    addr: String,
    secret: JobSecret,
    io_timeout: Duration,
    broken: bool,
    /// How many times this client has entered each named barrier.
    barrier_rounds: HashMap<String, u64>,
    /// This client's entries into each all-gather key (the round of its next gather).
    gather_rounds: HashMap<String, u64>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("addr", &self.addr)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

/// The rank's way to its job's store (here rather than beside [`LaunchEnv`], so the
/// environment does not depend on the store that depends on it).
impl LaunchEnv {
    /// Connects to the job's store, retrying for up to [`LaunchEnv::timeout`] while it
    /// starts. Under a launcher that hosts no store (torchrun, `srun`, `mpirun`), rank 0
    /// first starts one in this process at `MASTER_ADDR:MASTER_PORT` (it lives as long
    /// as the process; needs coconet's `launcher` feature).
    pub fn connect(&self) -> Result<Store, StoreError> {
        if self.rank == 0 && !self.launcher.hosts_store() {
            host_store(self)?;
        }
        Store::connect(self.store_addr(), &self.secret, self.timeout)
    }
}

/// Starts the job's store in this process (rank 0 under a launcher that hosts none), once.
#[cfg(feature = "launcher")]
fn host_store(env: &LaunchEnv) -> Result<(), StoreError> {
    use std::sync::Mutex;
    static HOSTED: Mutex<Vec<(String, super::StoreServer)>> = Mutex::new(Vec::new());
    let addr = env.store_addr();
    let mut hosted = HOSTED.lock().unwrap_or_else(|p| p.into_inner());
    if !hosted.iter().any(|(a, _)| *a == addr) {
        let server = super::StoreServer::bind(addr.as_str(), env.secret.clone())?;
        hosted.push((addr, server));
    }
    Ok(())
}

#[cfg(not(feature = "launcher"))]
fn host_store(env: &LaunchEnv) -> Result<(), StoreError> {
    Err(StoreError::CannotHost {
        launcher: env.launcher,
    })
}

impl Store {
    /// Connects to the store at `addr` (`"host:port"` or a [`SocketAddr`]), retrying for up
    /// to `timeout` while nothing listens there yet (ranks may start before the server),
    /// and proves `secret` to it (and checks the store's proof) before any request.
    pub fn connect(
        addr: impl ToSocketAddrs + fmt::Display,
        secret: &JobSecret,
        timeout: Duration,
    ) -> Result<Store, StoreError> {
        let shown = addr.to_string();
        let start = Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            let remaining = timeout.saturating_sub(start.elapsed());
            let attempt = match addr.to_socket_addrs() {
                Ok(addrs) => connect_any(addrs.collect(), remaining),
                Err(e) => Err(e),
            };
            let attempt: Result<std::convert::Infallible, io::Error> = match attempt {
                // A store turning clients away (at its limits) may take this one soon.
                Ok(stream) => match Store::handshake(stream, shown.clone(), secret, timeout) {
                    Err(StoreError::Auth {
                        source: AuthError::TurnedAway { reason },
                        ..
                    }) => Err(io::Error::other(format!(
                        "the store turned it away: {reason}"
                    ))),
                    done => return done,
                },
                Err(e) => Err(e),
            };
            let Err(source) = attempt;
            let remaining = timeout.saturating_sub(start.elapsed());
            if remaining.is_zero() {
                return Err(StoreError::Connect {
                    addr: shown,
                    waited: start.elapsed(),
                    source,
                });
            }
            std::thread::sleep(pause.min(remaining));
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Connects to the store named by the launch environment (`MASTER_ADDR`,
    /// `MASTER_PORT`), waiting up to its rendezvous timeout.
    pub fn from_env() -> Result<Store, StoreError> {
        LaunchEnv::from_env()?.connect()
    }

    fn handshake(
        mut stream: TcpStream,
        addr: String,
        secret: &JobSecret,
        timeout: Duration,
    ) -> Result<Store, StoreError> {
        let _ = stream.set_nodelay(true);
        let limit = timeout.clamp(Duration::from_secs(1), handshake::DEFAULT_LIMIT);
        if let Err(source) = handshake::client(&mut stream, secret, STORE_PURPOSE, limit) {
            return Err(StoreError::Auth { addr, source });
        }
        let mut store = Store {
            stream,
            addr,
            secret: secret.clone(),
            io_timeout: timeout.max(Duration::from_secs(1)),
            broken: false,
            barrier_rounds: HashMap::new(),
            gather_rounds: HashMap::new(),
        };
        let hello = Request::Hello {
            magic: MAGIC,
            version: VERSION,
        };
        match store.call("connect", &hello, Duration::ZERO) {
            Ok(Response::Ok) => Ok(store),
            Ok(Response::Error(message)) => Err(StoreError::Protocol {
                addr: store.addr.clone(),
                detail: message,
            }),
            Ok(other) => Err(store.unexpected(&other)),
            Err(StoreError::Io { source, .. }) => Err(StoreError::Protocol {
                addr: store.addr.clone(),
                detail: format!(
                    "no valid answer to the greeting ({source}); is this a coconet store?"
                ),
            }),
            Err(e) => Err(e),
        }
    }

    /// This end's address of the connection to the store: the address of the interface
    /// through which this machine reaches the store (and, presumably, its peers).
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.stream.local_addr()
    }

    /// The server's address as given to [`Store::connect`].
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// This connection with `deadline` as the limit on every answer that is not a wait
    /// (a heartbeat's connection gives up on a stalled store in seconds).
    pub fn with_deadline(mut self, deadline: Duration) -> Store {
        self.io_timeout = deadline.max(Duration::from_millis(100));
        self
    }

    /// The job secret this connection proved: the one the job's other connections (data
    /// ports, parameter servers) prove too.
    pub fn secret(&self) -> &JobSecret {
        &self.secret
    }

    /// Stores `value` under `key` (replacing an earlier value) and wakes everyone waiting
    /// for it.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let request = Request::Set {
            key: key.to_string(),
            value: value.to_vec(),
        };
        match self.call("set", &request, Duration::ZERO)? {
            Response::Ok => Ok(()),
            other => Err(self.answer_error("set", key, other)),
        }
    }

    /// The value of `key`, waiting up to `timeout` for some client to set it.
    pub fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        let request = Request::Get {
            key: key.to_string(),
            timeout_ms: millis(timeout),
        };
        match self.call("get", &request, timeout)? {
            Response::Value(v) => Ok(v),
            Response::Timeout { missing } => Err(StoreError::Timeout {
                op: "get",
                key: missing,
                waited: timeout,
            }),
            other => Err(self.answer_error("get", key, other)),
        }
    }

    /// The value of `key` if it is set now, without waiting.
    pub fn try_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let request = Request::TryGet {
            key: key.to_string(),
        };
        match self.call("try_get", &request, Duration::ZERO)? {
            Response::Value(v) => Ok(Some(v)),
            Response::Missing => Ok(None),
            other => Err(self.answer_error("try_get", key, other)),
        }
    }

    /// Removes `key` (a key nobody needs any more: the store keeps every key until it is
    /// deleted or the job ends); returns whether it existed.
    pub fn delete(&mut self, key: &str) -> Result<bool, StoreError> {
        let request = Request::Delete {
            key: key.to_string(),
        };
        match self.call("delete", &request, Duration::ZERO)? {
            Response::Int(n) => Ok(n != 0),
            other => Err(self.answer_error("delete", key, other)),
        }
    }

    /// Waits up to `timeout` until every one of `keys` is set; the timeout error names a
    /// key that is still missing.
    pub fn wait(&mut self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        let request = Request::Wait {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            timeout_ms: millis(timeout),
        };
        match self.call("wait", &request, timeout)? {
            Response::Ok => Ok(()),
            Response::Timeout { missing } => Err(StoreError::Timeout {
                op: "wait",
                key: missing,
                waited: timeout,
            }),
            other => {
                let key = keys.first().copied().unwrap_or_default();
                Err(self.answer_error("wait", key, other))
            }
        }
    }

    /// Adds `delta` to the counter `key` (an unset key counts as 0) and returns the new
    /// value, atomically with respect to other clients. `add(key, 0)` reads a counter.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let request = Request::Add {
            key: key.to_string(),
            delta,
        };
        match self.call("add", &request, Duration::ZERO)? {
            Response::Int(n) => Ok(n),
            other => Err(self.answer_error("add", key, other)),
        }
    }

    /// Every rank's `value`, in rank order: each of `world_size` ranks publishes its own
    /// under `{key}/{round}/{rank}` and reads the others' (waiting up to `timeout` in all;
    /// the timeout error names a rank's key that is missing). Used to share what every
    /// rank must know of every other (CUDA IPC handles, capabilities to agree on).
    ///
    /// A key can be reused, as a barrier's name: the k-th `all_gather(key, ..)` of every
    /// rank meets the k-th of the others (`round` = k). The last rank to finish reading a
    /// round deletes its keys, so repeated gathers do not pile values up in the store.
    pub fn all_gather(
        &mut self,
        key: &str,
        rank: usize,
        world_size: usize,
        value: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let start = Instant::now();
        let counter = self.gather_rounds.entry(key.to_string()).or_insert(0);
        let round = *counter;
        *counter += 1;
        let base = format!("{key}/{round}");
        self.set(&format!("{base}/{rank}"), value)?;
        let all = (0..world_size)
            .map(|r| {
                if r == rank {
                    Ok(value.to_vec())
                } else {
                    let left = timeout.saturating_sub(start.elapsed());
                    self.get(&format!("{base}/{r}"), left)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let read = self.add(&format!("{base}/read"), 1)?;
        if read == i64::try_from(world_size).unwrap_or(i64::MAX) {
            for r in 0..world_size {
                self.delete(&format!("{base}/{r}"))?;
            }
            self.delete(&format!("{base}/read"))?;
        }
        Ok(all)
    }

    /// Blocks until `world_size` clients have entered the barrier `name`, or fails after
    /// `timeout` with an error saying how many arrived.
    ///
    /// A name can be reused: each client counts its own entries into `name`, so the k-th
    /// `barrier("step", ..)` of every rank meets the k-th of the others. Ranks must
    /// therefore enter the same barriers in the same order, as with any collective.
    pub fn barrier(
        &mut self,
        name: &str,
        world_size: usize,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let start = Instant::now();
        let counter = self.barrier_rounds.entry(name.to_string()).or_insert(0);
        let round = *counter;
        *counter += 1;
        let base = format!("{BARRIER_PREFIX}{name}/{round}");
        let arrived_key = format!("{base}/arrived");
        let done_key = format!("{base}/done");
        let arrived = self.add(&arrived_key, 1)?;
        let expected = i64::try_from(world_size).unwrap_or(i64::MAX);
        if arrived > expected {
            return Err(StoreError::BarrierOverflow {
                name: name.to_string(),
                arrived,
                world_size,
            });
        }
        if arrived == expected {
            self.set(&done_key, b"")?;
            // Everyone has left the previous round (they all arrived at this one): its
            // keys are garbage. (A barrier's keys would otherwise pile up forever.)
            if let Some(previous) = round.checked_sub(1) {
                let old = format!("{BARRIER_PREFIX}{name}/{previous}");
                self.delete(&format!("{old}/arrived"))?;
                self.delete(&format!("{old}/done"))?;
            }
        }
        let remaining = timeout.saturating_sub(start.elapsed());
        match self.wait(&[&done_key], remaining) {
            Ok(()) => Ok(()),
            Err(StoreError::Timeout { .. }) => {
                let arrived = self.add(&arrived_key, 0)?;
                Err(StoreError::BarrierTimeout {
                    name: name.to_string(),
                    arrived,
                    world_size,
                    waited: timeout,
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Sends one request and reads its answer. `server_wait` is how long the server may
    /// legitimately take (its own timeout); the socket waits that plus a grace period, or
    /// the connect timeout for requests that do not wait.
    fn call(
        &mut self,
        op: &'static str,
        request: &Request,
        server_wait: Duration,
    ) -> Result<Response, StoreError> {
        if self.broken {
            return Err(StoreError::Broken {
                addr: self.addr.clone(),
            });
        }
        let payload = request.encode();
        if payload.len() > protocol::MAX_FRAME {
            return Err(StoreError::Rejected {
                op,
                key: request_key(request),
                message: format!(
                    "the request is {} bytes, above the store's {}-byte limit",
                    payload.len(),
                    protocol::MAX_FRAME
                ),
            });
        }
        let read_timeout = if server_wait.is_zero() {
            self.io_timeout
        } else {
            server_wait.saturating_add(ANSWER_GRACE)
        };
        let result = (|| {
            self.stream.set_write_timeout(Some(self.io_timeout))?;
            protocol::write_frame(&mut self.stream, &payload)?;
            self.stream.set_read_timeout(Some(read_timeout))?;
            protocol::read_frame(&mut self.stream)
        })();
        let answer = match result {
            Ok(answer) => answer,
            Err(source) => {
                self.broken = true;
                let source = if source.kind() == io::ErrorKind::UnexpectedEof {
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the store closed the connection (did the launcher of node 0 stop?)",
                    )
                } else {
                    source
                };
                return Err(StoreError::Io {
                    addr: self.addr.clone(),
                    op,
                    source,
                });
            }
        };
        Response::decode(&answer).map_err(|e| {
            self.broken = true;
            StoreError::Protocol {
                addr: self.addr.clone(),
                detail: e.to_string(),
            }
        })
    }

    fn answer_error(&mut self, op: &'static str, key: &str, answer: Response) -> StoreError {
        match answer {
            Response::Error(message) => StoreError::Rejected {
                op,
                key: key.to_string(),
                message,
            },
            other => self.unexpected(&other),
        }
    }

    fn unexpected(&mut self, answer: &Response) -> StoreError {
        self.broken = true;
        StoreError::Protocol {
            addr: self.addr.clone(),
            detail: format!("unexpected answer {answer:?}"),
        }
    }
}

/// Tries each resolved address once, within `budget`.
fn connect_any(addrs: Vec<SocketAddr>, budget: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the address resolved to nothing");
    for addr in addrs {
        let budget = budget.clamp(Duration::from_millis(10), Duration::from_secs(2));
        match TcpStream::connect_timeout(&addr, budget) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn request_key(request: &Request) -> String {
    match request {
        Request::Set { key, .. }
        | Request::Get { key, .. }
        | Request::Add { key, .. }
        | Request::TryGet { key }
        | Request::Delete { key } => key.clone(),
        Request::Wait { keys, .. } => keys.first().cloned().unwrap_or_default(),
        Request::Hello { .. } => String::new(),
    }
}
