//! A worker's view of a table whose shards other processes serve ([`PsServer`]s): rows
//! are placed on servers by a hash of their key, requests to several servers are sent
//! together and answered in parallel.
//!
//! [`PsServer`]: super::PsServer

use super::PURPOSE;
use super::wire::{Frame, kind};
use crate::data::error::DataError;
use crate::data::mix::mix;
use crate::data::param_server::TableSnapshot;
use crate::data::table::EmbeddingTable;
use coconet_trust::{JobSecret, handshake};
use std::net::TcpStream;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// An embedding table served by other processes, as one worker of a synchronous job sees
/// it (see the module docs).
pub struct RemoteTable {
    servers: Vec<Server>,
    dim: usize,
    /// Steps pushed so far by this worker.
    steps: Mutex<u64>,
}

struct Server {
    addr: String,
    stream: Mutex<TcpStream>,
}

impl RemoteTable {
    /// Connects worker `worker` of `workers` to the servers at `addrs` (every worker
    /// passes them in the same order: a row's server is chosen by its position), for
    /// rows of `dim`, retrying for up to `timeout` while a server is not up yet; every
    /// answer is then awaited up to `timeout` (a push waits for the slowest worker).
    /// Each server and this worker prove `secret` to each other first.
    pub fn connect(
        addrs: &[String],
        worker: usize,
        workers: usize,
        dim: usize,
        timeout: Duration,
        secret: &JobSecret,
    ) -> Result<RemoteTable, DataError> {
        if addrs.is_empty() {
            return Err(DataError::Invalid(
                "a remote table needs at least one server".into(),
            ));
        }
        let mut servers = Vec::with_capacity(addrs.len());
        for addr in addrs {
            let mut stream = connect(addr, timeout)?;
            let fail = |e: std::io::Error| DataError::Remote {
                addr: addr.clone(),
                message: e.to_string(),
            };
            let limit = timeout.min(handshake::DEFAULT_LIMIT);
            handshake::client(&mut stream, secret, PURPOSE, limit).map_err(|e| {
                DataError::Remote {
                    addr: addr.clone(),
                    message: format!("the parameter server did not let this worker in: {e}"),
                }
            })?;
            stream.set_nodelay(true).map_err(fail)?;
            stream.set_read_timeout(Some(timeout)).map_err(fail)?;
            servers.push(Server {
                addr: addr.clone(),
                stream: Mutex::new(stream),
            });
        }
        let table = RemoteTable {
            servers,
            dim,
            steps: Mutex::new(0),
        };
        let hello = Frame {
            a: worker as u64,
            b: workers as u64,
            text: format!("dim={dim}"),
            ..Frame::new(kind::HELLO)
        };
        table.everywhere(&|_| hello.clone())?;
        Ok(table)
    }

    /// The server holding `key`'s row.
    pub fn server_of(&self, key: u64) -> usize {
        RemoteTable::server_for(key, self.servers.len())
    }

    /// The server holding `key`'s row in a table served by `servers` servers (what a
    /// server restoring its part of a checkpoint keeps).
    pub fn server_for(key: u64, servers: usize) -> usize {
        (mix(0x7ab1e, key, 0) % servers.max(1) as u64) as usize
    }

    /// This worker's part of one synchronous step: the gradients `grads` of the rows
    /// `keys` (`dim` per key), scaled by `scale` once summed over the workers. Every
    /// server gets a push (an empty one where this worker touched none of its rows) and
    /// answers once every worker's push of the step is applied.
    pub fn push(&self, keys: &[u64], grads: &[f32], scale: f32) -> Result<(), DataError> {
        if grads.len() != keys.len() * self.dim {
            return Err(DataError::Invalid(format!(
                "{} keys need {} gradient values, got {}",
                keys.len(),
                keys.len() * self.dim,
                grads.len()
            )));
        }
        let mut steps = self.steps.lock().unwrap_or_else(PoisonError::into_inner);
        let groups = self.by_server(keys);
        let dim = self.dim;
        self.everywhere(&|s| Frame {
            a: *steps + 1,
            b: scale.to_bits() as u64,
            keys: groups[s].iter().map(|&i| keys[i]).collect(),
            values: groups[s]
                .iter()
                .flat_map(|&i| grads[i * dim..(i + 1) * dim].iter().copied())
                .collect(),
            ..Frame::new(kind::PUSH)
        })?;
        *steps += 1;
        Ok(())
    }

    /// Every row and its optimizer state, from every server, sorted by key.
    pub fn export(&self) -> Result<TableSnapshot, DataError> {
        let answers = self.everywhere(&|_| Frame::new(kind::EXPORT))?;
        let mut rows: Vec<(u64, &[f32], &[f32])> = Vec::new();
        for (s, a) in answers.iter().enumerate() {
            let n = a.keys.len() * self.dim;
            if a.values.len() != 2 * n {
                return Err(self.garbled(s, "an export"));
            }
            let (values, accum) = a.values.split_at(n);
            rows.extend(a.keys.iter().enumerate().map(|(i, &k)| {
                let row = i * self.dim..(i + 1) * self.dim;
                (k, &values[row.clone()], &accum[row])
            }));
        }
        rows.sort_unstable_by_key(|r| r.0);
        Ok(TableSnapshot {
            dim: self.dim,
            keys: rows.iter().map(|r| r.0).collect(),
            values: rows.iter().flat_map(|r| r.1.iter().copied()).collect(),
            accum: rows.iter().flat_map(|r| r.2.iter().copied()).collect(),
        })
    }

    /// Positions of `keys` grouped by server.
    fn by_server(&self, keys: &[u64]) -> Vec<Vec<usize>> {
        let mut groups = vec![Vec::new(); self.servers.len()];
        for (i, &k) in keys.iter().enumerate() {
            groups[self.server_of(k)].push(i);
        }
        groups
    }

    fn garbled(&self, s: usize, what: &str) -> DataError {
        DataError::Remote {
            addr: self.servers[s].addr.clone(),
            message: format!("the answer to {what} does not fit the request"),
        }
    }

    /// Sends `request(s)` to every server, then reads every answer (the servers work in
    /// parallel); an `ERROR` answer or a lost connection is an error naming the server.
    fn everywhere(&self, request: &dyn Fn(usize) -> Frame) -> Result<Vec<Frame>, DataError> {
        let streams: Vec<_> = self
            .servers
            .iter()
            .map(|s| s.stream.lock().unwrap_or_else(PoisonError::into_inner))
            .collect();
        let remote = |s: usize, message: String| DataError::Remote {
            addr: self.servers[s].addr.clone(),
            message,
        };
        for (s, mut stream) in streams.iter().enumerate().map(|(s, st)| (s, &**st)) {
            request(s)
                .write(&mut stream)
                .map_err(|e| remote(s, format!("lost the connection ({e})")))?;
        }
        let mut answers = Vec::with_capacity(streams.len());
        for (s, mut stream) in streams.iter().enumerate().map(|(s, st)| (s, &**st)) {
            let a = Frame::read(&mut stream).map_err(|e| {
                remote(
                    s,
                    format!("no answer ({e}): the server stopped, or a step took too long"),
                )
            })?;
            if a.kind != kind::OK {
                return Err(remote(s, a.text));
            }
            answers.push(a);
        }
        Ok(answers)
    }

    /// Reads `keys`' rows with `op` (pull or lookup), each from its server.
    fn rows(&self, keys: &[u64], op: u8) -> Result<Vec<f32>, DataError> {
        let groups = self.by_server(keys);
        let answers = self.everywhere(&|s| Frame {
            keys: groups[s].iter().map(|&i| keys[i]).collect(),
            ..Frame::new(op)
        })?;
        let dim = self.dim;
        let mut out = vec![0.0; keys.len() * dim];
        for (s, (group, a)) in groups.iter().zip(&answers).enumerate() {
            if a.values.len() != group.len() * dim {
                return Err(self.garbled(s, "a pull"));
            }
            for (j, &i) in group.iter().enumerate() {
                out[i * dim..(i + 1) * dim].copy_from_slice(&a.values[j * dim..(j + 1) * dim]);
            }
        }
        Ok(out)
    }
}

impl EmbeddingTable for RemoteTable {
    fn dim(&self) -> usize {
        self.dim
    }

    fn pull(&self, keys: &[u64]) -> Result<Vec<f32>, DataError> {
        self.rows(keys, kind::PULL)
    }

    fn lookup(&self, keys: &[u64]) -> Result<Vec<f32>, DataError> {
        self.rows(keys, kind::LOOKUP)
    }
}

/// Connects to `addr`, retrying while nothing listens there yet, for up to `timeout`.
fn connect(addr: &str, timeout: Duration) -> Result<TcpStream, DataError> {
    let start = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if start.elapsed() >= timeout => {
                return Err(DataError::Remote {
                    addr: addr.to_string(),
                    message: format!("cannot connect within {:.1} s: {e}", timeout.as_secs_f64()),
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
