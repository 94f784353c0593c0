//! The TCP connections between the replicas of neighbouring pipeline stages when each
//! replica is a process: activations go forward and gradients back on one connection
//! per pair of replicas that share a micro-batch (micro-batch `m` runs on replica
//! `m mod k_s` of every stage `s`).
//!
//! Each connection's incoming frames are read by a thread of their own into a queue, so
//! a replica never blocks a neighbour's writes however the two interleave; a replica
//! reads each micro-batch's frame from the queue of the neighbour that runs it, and every
//! sender sends in ascending micro-batch order, so each queue holds its frames in the
//! order they are read. Rendezvous (listening addresses) goes through the job's store.

use super::HeterpsError;
use super::replica::ReplicaEnd;
use candle_core::{Device, Tensor};
use coconet_runtime::launch::Store;
use coconet_trust::JobSecret;
use coconet_trust::frame::{self, Format, Layout};
use coconet_trust::gate::Gate;
use coconet_trust::{handshake, refusals};
use std::collections::BTreeMap;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// Frame kinds.
pub(super) const ACTIVATION: u8 = 1;
pub(super) const GRADIENT: u8 = 2;
/// The first stage's replicas are done training: no more steps.
pub(super) const END: u8 = 3;
/// The first stage's replicas stop for now (a checkpoint); more steps follow.
pub(super) const PAUSE: u8 = 4;

/// The first bytes on every connection, so a stray connection is refused.
const MAGIC: u64 = 0x636f_636f_7069_7065; // "cocopipe"
/// The most elements a frame may announce (a garbled header is an error, not an
/// allocation of everything).
const MAX_ELEMENTS: u64 = 1 << 28;
/// The most dims a frame's tensor has.
const MAX_DIMS: u64 = 8;

/// The boundary's frames, in coconet's frame codec: kind, micro-batch, weight, the
/// numbers of dims and of labels; the body holds the dims, the labels and the values.
const FORMAT: Format = Format {
    peer: "pipeline peer",
    layout: Layout::Words(4),
    kinds: &[ACTIVATION, GRADIENT, END, PAUSE],
    max_body: (8 * MAX_DIMS + 2 * 4 * MAX_ELEMENTS) as usize,
};

/// What a boundary connection's handshake proves: this pipeline, these two replicas.
fn pipeline_purpose(name: &str, (s, r): (usize, usize), (to_s, to_r): (usize, usize)) -> String {
    format!("coconet pipeline `{name}`: stage {s} replica {r} -> stage {to_s} replica {to_r}")
}

/// One message between neighbouring replicas.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Frame {
    pub kind: u8,
    /// The micro-batch's index in the step.
    pub micro: u64,
    /// Its records' share of the global batch.
    pub weight: f64,
    pub dims: Vec<u64>,
    /// The records' labels (activations only: the last stage's loss needs them).
    pub labels: Vec<f32>,
    pub data: Vec<f32>,
}

impl Frame {
    /// A frame carrying `tensor`.
    pub fn of(kind: u8, micro: usize, tensor: &Tensor) -> Result<Frame, ReplicaEnd> {
        let fail = |e: candle_core::Error| {
            ReplicaEnd::Failed(HeterpsError::Mismatch(format!(
                "micro-batch {micro}'s tensor: {e}"
            )))
        };
        Ok(Frame {
            kind,
            micro: micro as u64,
            dims: tensor.dims().iter().map(|&d| d as u64).collect(),
            data: tensor
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(fail)?,
            ..Frame::default()
        })
    }

    /// The tensor the frame carries.
    pub fn tensor(self) -> Result<Tensor, HeterpsError> {
        let dims: Vec<usize> = self.dims.iter().map(|&d| d as usize).collect();
        let elements = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if elements != Some(self.data.len()) {
            return Err(HeterpsError::Mismatch(format!(
                "micro-batch {}'s frame has {} values for dims {dims:?}",
                self.micro,
                self.data.len()
            )));
        }
        Tensor::from_vec(self.data, dims, &Device::Cpu).map_err(|e| {
            HeterpsError::Mismatch(format!("micro-batch {}'s tensor: {e}", self.micro))
        })
    }

    /// Writes the frame as one buffer.
    pub fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        let words = [
            self.micro,
            self.weight.to_bits(),
            self.dims.len() as u64,
            self.labels.len() as u64,
        ];
        let len = 8 * self.dims.len() + 4 * (self.labels.len() + self.data.len());
        let mut buf = FORMAT.encode_head(self.kind, &words, len)?;
        buf.reserve_exact(len);
        self.dims
            .iter()
            .for_each(|x| buf.extend_from_slice(&x.to_le_bytes()));
        self.labels
            .iter()
            .chain(&self.data)
            .for_each(|x| buf.extend_from_slice(&x.to_le_bytes()));
        w.write_all(&buf)?;
        w.flush()
    }

    /// Reads one frame.
    pub fn read(r: &mut impl Read) -> std::io::Result<Frame> {
        // Memory follows the bytes that arrive, not the length the header announces.
        let frame::Frame { kind, words, body } = FORMAT.read(r)?;
        let [micro, weight, dims, labels] = words;
        let values = (body.len() as u64)
            .checked_sub(8 * dims.min(MAX_DIMS) + 4 * labels.min(MAX_ELEMENTS))
            .filter(|rest| rest % 4 == 0 && rest / 4 <= MAX_ELEMENTS);
        let values = match values {
            Some(rest) if dims <= MAX_DIMS && labels <= MAX_ELEMENTS => rest / 4,
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "a frame announcing {dims} dims and {labels} labels in {} bytes \
                         (not a coconet pipeline peer?)",
                        body.len()
                    ),
                ));
            }
        };
        let (d, rest) = body.split_at(8 * dims as usize);
        let (l, v) = rest.split_at(4 * labels as usize);
        debug_assert_eq!(v.len() as u64, 4 * values);
        let f32s = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        Ok(Frame {
            kind,
            micro,
            weight: f64::from_bits(weight),
            dims: d
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            labels: f32s(l),
            data: f32s(v),
        })
    }
}

/// A neighbouring replica: the connection's writing end and the queue its frames are
/// read into.
struct Peer {
    writer: TcpStream,
    inbox: Receiver<Result<Frame, String>>,
}

/// This replica's connections to the previous and the next stage's replicas.
pub(super) struct Neighbours {
    /// This replica's stage (for messages).
    stage: usize,
    /// By replica index of the previous / next stage.
    prev: BTreeMap<usize, Peer>,
    next: BTreeMap<usize, Peer>,
    timeout: Duration,
}

/// Where the next stage's replicas' frames come from and go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Prev,
    Next,
}

impl Neighbours {
    /// Connects replica `replica` of stage `stage` (stages of `replicas[s]` replicas,
    /// `micro_batches` per step) to its neighbours in the job `name`: it listens for the
    /// previous stage's replicas (its address in `store`) and connects to the next's,
    /// waiting up to `timeout` for each.
    pub fn connect(
        store: &mut Store,
        name: &str,
        replicas: &[usize],
        (stage, replica): (usize, usize),
        micro_batches: usize,
        timeout: Duration,
    ) -> Result<Neighbours, HeterpsError> {
        let fail = |what: String| {
            HeterpsError::Mismatch(format!(
                "pipeline `{name}`, stage {stage} replica {replica}: {what}"
            ))
        };
        let mine: Vec<usize> = (replica..micro_batches).step_by(replicas[stage]).collect();
        // The replicas of stage s that my micro-batches go through.
        let peers_in = |s: usize| -> Vec<usize> {
            let mut v: Vec<usize> = mine.iter().map(|m| m % replicas[s]).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let listener = if stage > 0 {
            let ip = store
                .local_addr()
                .map_err(|e| fail(format!("no local address towards the store: {e}")))?
                .ip();
            let l = TcpListener::bind(SocketAddr::new(ip, 0))
                .map_err(|e| fail(format!("cannot listen on {ip}: {e}")))?;
            let at = l
                .local_addr()
                .map_err(|e| fail(format!("no listening address: {e}")))?;
            refusals::announce_exposure("the pipeline boundaries", at, store.secret());
            store
                .set(
                    &address_key(name, stage, replica),
                    at.to_string().as_bytes(),
                )
                .map_err(|e| fail(e.to_string()))?;
            Some(l)
        } else {
            None
        };
        let me = Replica {
            name,
            stage,
            replica,
            timeout,
            fail: &fail,
        };
        let next = if stage + 1 < replicas.len() {
            me.dial_next(store, &peers_in(stage + 1))?
        } else {
            BTreeMap::new()
        };
        let prev = match listener {
            Some(listener) => me.accept_prev(store, &listener, &peers_in(stage - 1))?,
            None => BTreeMap::new(),
        };
        Ok(Neighbours {
            stage,
            prev,
            next,
            timeout,
        })
    }

    /// The peer `r` of `side`.
    fn peer(&mut self, side: Side, r: usize) -> &mut Peer {
        let peers = match side {
            Side::Prev => &mut self.prev,
            Side::Next => &mut self.next,
        };
        peers
            .get_mut(&r)
            .expect("every micro-batch's neighbour is connected")
    }

    /// Names the neighbour `r` of `side`.
    fn name(&self, side: Side, r: usize) -> String {
        let s = match side {
            Side::Prev => self.stage - 1,
            Side::Next => self.stage + 1,
        };
        format!("stage {s} replica {r}")
    }

    /// Sends `frame` to replica `r` of `side`.
    pub fn send(&mut self, side: Side, r: usize, frame: &Frame) -> Result<(), ReplicaEnd> {
        let name = self.name(side, r);
        frame
            .write(&mut self.peer(side, r).writer)
            .map_err(|e| ReplicaEnd::NeighbourStopped(format!("{name} stopped: {e}")))
    }

    /// The next frame from replica `r` of `side`.
    pub fn receive(&mut self, side: Side, r: usize) -> Result<Frame, ReplicaEnd> {
        let (name, timeout) = (self.name(side, r), self.timeout);
        match self.peer(side, r).inbox.recv_timeout(timeout) {
            Ok(Ok(frame)) => Ok(frame),
            Ok(Err(e)) => Err(ReplicaEnd::NeighbourStopped(format!("{name} stopped: {e}"))),
            Err(RecvTimeoutError::Timeout) => {
                Err(ReplicaEnd::Failed(HeterpsError::Mismatch(format!(
                    "{name} sent nothing for {:.0} s (stopped or hung)",
                    timeout.as_secs_f64()
                ))))
            }
            Err(RecvTimeoutError::Disconnected) => Err(ReplicaEnd::NeighbourStopped(format!(
                "{name}'s connection closed"
            ))),
        }
    }

    /// Tells every next-stage replica that training ends ([`END`]) or pauses
    /// ([`PAUSE`]) at `(epoch, batch)` of the first stage's data (in the frame's dims).
    pub fn stop(&mut self, kind: u8, (epoch, batch): (u64, u64)) -> Result<(), ReplicaEnd> {
        let end = Frame {
            kind,
            dims: vec![epoch, batch],
            ..Frame::default()
        };
        let next: Vec<usize> = self.next.keys().copied().collect();
        next.into_iter()
            .try_for_each(|r| self.send(Side::Next, r, &end))
    }

    /// The previous stage's replicas this one exchanges micro-batches with.
    pub fn prev_replicas(&self) -> Vec<usize> {
        self.prev.keys().copied().collect()
    }

    /// Closes every connection (neighbours waiting on this replica see it stop at once).
    pub fn shutdown(&self) {
        for p in self.prev.values().chain(self.next.values()) {
            let _ = p.writer.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for Neighbours {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The store key replica r of stage s of pipeline `name` publishes its address under.
fn address_key(name: &str, s: usize, r: usize) -> String {
    format!("heterps/pipe/{name}/{s}/{r}")
}

/// A replica connecting to its neighbours (see [`Neighbours::connect`]).
struct Replica<'a> {
    name: &'a str,
    stage: usize,
    replica: usize,
    timeout: Duration,
    /// The error naming this pipeline and replica.
    fail: &'a dyn Fn(String) -> HeterpsError,
}

impl Replica<'_> {
    /// Connects to the next stage's replicas `peers`, greets each and proves the job
    /// secret.
    fn dial_next(
        &self,
        store: &mut Store,
        peers: &[usize],
    ) -> Result<BTreeMap<usize, Peer>, HeterpsError> {
        let (name, stage, replica, timeout, fail) =
            (self.name, self.stage, self.replica, self.timeout, self.fail);
        let mut next = BTreeMap::new();
        for &r in peers {
            let at = store
                .get(&address_key(name, stage + 1, r), timeout)
                .map_err(|e| fail(format!("stage {} replica {r}: {e}", stage + 1)))?;
            let at = String::from_utf8_lossy(&at).into_owned();
            let mut stream = TcpStream::connect(&at).map_err(|e| {
                fail(format!(
                    "cannot reach stage {} replica {r} at {at}: {e}",
                    stage + 1
                ))
            })?;
            let hello: Vec<u8> = [MAGIC, stage as u64, replica as u64]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            stream
                .write_all(&hello)
                .map_err(|e| fail(format!("stage {} replica {r}: {e}", stage + 1)))?;
            let proves = pipeline_purpose(name, (stage, replica), (stage + 1, r));
            let limit = timeout.min(handshake::DEFAULT_LIMIT);
            handshake::client(&mut stream, store.secret(), &proves, limit).map_err(|e| {
                fail(format!(
                    "stage {} replica {r} at {at} did not let it in: {e}",
                    stage + 1
                ))
            })?;
            next.insert(r, peer(stream, fail)?);
        }
        Ok(next)
    }

    /// Accepts the previous stage's replicas `expected` on `listener`. Whoever does not
    /// greet as an expected neighbour and prove the job secret for that claim is
    /// refused; the stage goes on waiting. Each connection is checked on a thread of its
    /// own, so a silent one holds up nothing.
    fn accept_prev(
        &self,
        store: &Store,
        listener: &TcpListener,
        expected: &[usize],
    ) -> Result<BTreeMap<usize, Peer>, HeterpsError> {
        let (stage, replica, timeout, fail) = (self.stage, self.replica, self.timeout, self.fail);
        let mut prev = BTreeMap::new();
        let deadline = Instant::now() + timeout;
        listener
            .set_nonblocking(true)
            .map_err(|e| fail(e.to_string()))?;
        let gate = Gate::new(format!(
            "pipeline `{}` stage {stage} replica {replica}",
            self.name
        ));
        while prev.len() < expected.len() {
            match listener.accept() {
                Ok((stream, from)) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let limit = left.clamp(Duration::from_millis(1), handshake::DEFAULT_LIMIT);
                    let (secret, expected) = (store.secret().clone(), expected.to_vec());
                    let name = self.name.to_string();
                    gate.check(stream, from, move |stream| {
                        greeted(stream, limit, &secret, &expected, (&name, stage, replica))
                    });
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(fail(format!("accepting a connection: {e}"))),
            }
            for (r, stream, _) in gate.admitted() {
                if prev.contains_key(&r) {
                    return Err(fail(format!(
                        "stage {} replica {r} connected twice (two processes with one role?)",
                        stage - 1
                    )));
                }
                stream
                    .set_read_timeout(None)
                    .map_err(|e| fail(e.to_string()))?;
                prev.insert(r, peer(stream, fail)?);
            }
            if prev.len() == expected.len() {
                break;
            }
            if Instant::now() > deadline {
                let missing: Vec<usize> = expected
                    .iter()
                    .copied()
                    .filter(|r| !prev.contains_key(r))
                    .collect();
                return Err(fail(format!(
                    "stage {} replicas {missing:?} did not connect within {:.0} s",
                    stage - 1,
                    timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(prev)
    }
}

/// The replica of the previous stage `stream` comes from, once it has greeted as one
/// of `expected` and proved the job secret for replica `replica` of `stage` of pipeline
/// `name` within `limit`; else why not.
fn greeted(
    stream: &mut TcpStream,
    limit: Duration,
    secret: &JobSecret,
    expected: &[usize],
    (name, stage, replica): (&str, usize, usize),
) -> Result<usize, String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    let mut hello = [0u8; 24];
    stream
        .read_exact(&mut hello)
        .map_err(|e| format!("no greeting within {limit:?}: {e}"))?;
    let word = |i: usize| u64::from_le_bytes(hello[8 * i..8 * i + 8].try_into().unwrap());
    let (s, r) = (word(1) as usize, word(2) as usize);
    if word(0) != MAGIC || s + 1 != stage || !expected.contains(&r) {
        return Err("not a neighbour this replica expects".to_string());
    }
    let proves = pipeline_purpose(name, (s, r), (stage, replica));
    handshake::server(stream, secret, &proves, limit).map_err(|e| e.to_string())?;
    Ok(r)
}

/// A connected neighbour: its frames read on a thread of their own.
fn peer(stream: TcpStream, fail: &dyn Fn(String) -> HeterpsError) -> Result<Peer, HeterpsError> {
    let _ = stream.set_nodelay(true);
    let reader = stream
        .try_clone()
        .map_err(|e| fail(format!("cannot share a connection: {e}")))?;
    let (tx, inbox) = channel();
    std::thread::Builder::new()
        .name("coconet-pipe-reader".into())
        .spawn(move || {
            let mut r = BufReader::with_capacity(1 << 16, reader);
            loop {
                let frame = Frame::read(&mut r).map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => "it closed the connection".to_string(),
                    _ => e.to_string(),
                });
                let last = frame.is_err();
                if tx.send(frame).is_err() || last {
                    break;
                }
            }
        })
        .map_err(|e| fail(format!("cannot start a reader thread: {e}")))?;
    Ok(Peer {
        writer: stream,
        inbox,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_a_garbled_header_is_an_error() {
        let f = Frame {
            kind: ACTIVATION,
            micro: 7,
            weight: 0.25,
            dims: vec![2, 3],
            labels: vec![1.0, 0.0],
            data: (0..6).map(|x| x as f32).collect(),
        };
        let mut buf = Vec::new();
        f.write(&mut buf).unwrap();
        assert_eq!(Frame::read(&mut &buf[..]).unwrap(), f);
        let mut garbled = buf.clone();
        garbled[24..32].copy_from_slice(&1000u64.to_le_bytes());
        let e = Frame::read(&mut &garbled[..]).unwrap_err().to_string();
        assert!(e.contains("1000 dims"), "{e}");
        assert!(Frame::read(&mut &buf[..10]).is_err(), "a short frame");
    }
}
