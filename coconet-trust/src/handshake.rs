//! The mutual challenge–response every coconet connection runs before job data.
//!
//! ```text
//! client → server  Hello      magic "CCN-AUTH", version, has-secret, nonce_c (32 B)
//! server → client  Challenge  magic, version, has-secret, nonce_s (32 B),
//!                             HMAC(K, "server" | purpose | nonce_c | nonce_s)
//! client → server  Proof      HMAC(K, "client" | purpose | nonce_c | nonce_s)
//! server → client  Verdict    1 accepted, 0 refused
//! ```
//!
//! `K` is the [`JobSecret`]; `purpose` names the service and the connection (the store,
//! "rank 2 → rank 0 of group g"), so a proof made for one cannot open another. Both nonces
//! are fresh per connection, so recorded proofs cannot be replayed, and the role labels
//! keep a server's proof from being reflected as a client's. Verification is constant
//! time (RustCrypto's `hmac`). The server proves itself first, so a client never sends a
//! byte of job data to a stranger's port; the server accepts none before the verdict.
//!
//! [`client`] and [`server`] run it over a blocking [`TcpStream`] within a deadline;
//! [`ClientHandshake`] / [`ServerHandshake`] are the same steps without I/O, for a server
//! on an async runtime.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use thiserror::Error;

use crate::JobSecret;

/// The eight bytes both greetings start with.
const MAGIC: [u8; 8] = *b"CCN-AUTH";
/// The handshake's version.
const VERSION: u8 = 1;
const NONCE: usize = 32;
const TAG: usize = 32;

/// Bytes of the client's Hello.
pub const HELLO_LEN: usize = 8 + 1 + 1 + NONCE;
/// Bytes of the server's Challenge.
pub const CHALLENGE_LEN: usize = 8 + 1 + 1 + NONCE + TAG;
/// Bytes of the client's Proof.
pub const PROOF_LEN: usize = TAG;
/// How long a handshake may take by default: far longer than one round trip on any
/// network a job runs on, short enough that a silent stranger soon frees its slot.
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(10);
/// The mode byte of a Challenge that is a refusal before any proof (the server is full):
/// a `u16` length and that many bytes of UTF-8 reason follow instead of nonce and tag.
const TURNED_AWAY: u8 = 0xff;
/// The longest reason a turned-away client reads.
const MAX_REASON: usize = 1024;
/// The server's verdict byte when it accepts the client.
pub const ACCEPTED: u8 = 1;
/// The server's verdict byte when it refuses the client.
pub const REFUSED: u8 = 0;

/// Why a handshake did not let a peer in (or this process into a peer).
#[derive(Debug, Error)]
pub enum AuthError {
    /// The connection failed, closed or passed its deadline mid-handshake.
    #[error("{}", stopped(step, source))]
    Io {
        /// Which message was being sent or awaited.
        step: &'static str,
        /// What the OS said (a timeout is `WouldBlock`/`TimedOut`).
        source: io::Error,
    },
    /// The peer does not speak the handshake at all.
    #[error(
        "the peer is not a coconet process (its {step} does not start with coconet's handshake)"
    )]
    NotCoconet {
        /// The message that was wrong.
        step: &'static str,
    },
    /// The peer speaks another version of it.
    #[error("the peer speaks handshake version {theirs}, this build {VERSION}")]
    Version {
        /// The peer's version.
        theirs: u8,
    },
    /// One side runs without a job secret and the other with one.
    #[error("{}", mismatch(*.peer_has_secret))]
    Mismatch {
        /// Whether the peer holds a secret (and so this process does not).
        peer_has_secret: bool,
    },
    /// The peer's MAC does not verify: it holds another secret, or is not the service
    /// (or connection) this process meant to reach.
    #[error(
        "the peer does not hold this job's secret (another job, or a stranger), or is not `{purpose}`"
    )]
    WrongSecret {
        /// What this side expected to reach or be reached for.
        purpose: String,
    },
    /// The server turned this process away before the handshake (it serves as many
    /// connections as it may).
    #[error("the peer turned this process away: {reason}")]
    TurnedAway {
        /// The server's reason.
        reason: String,
    },
    /// The server refused this process's proof.
    #[error("the peer refused this process's proof of the job secret")]
    Refused,
}

fn stopped(step: &str, source: &io::Error) -> String {
    match source.kind() {
        io::ErrorKind::UnexpectedEof => {
            format!("the peer closed the connection before the handshake's {step}")
        }
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("no {step} within the handshake's time limit")
        }
        _ => format!("the handshake stopped at its {step}: {source}"),
    }
}

fn mismatch(peer_has_secret: bool) -> &'static str {
    if peer_has_secret {
        "the peer requires a job secret and this process runs without one (set COCONET_JOB_SECRET or COCONET_JOB_SECRET_FILE)"
    } else {
        "the peer runs without a job secret (COCONET_INSECURE_NO_SECRET) and this process holds one: refusing an unauthenticated peer"
    }
}

/// The client's side, between its Hello and its Proof.
pub struct ClientHandshake {
    key: Vec<u8>,
    has_secret: bool,
    purpose: String,
    nonce: [u8; NONCE],
}

impl fmt::Debug for ClientHandshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientHandshake")
            .field("purpose", &self.purpose)
            .finish_non_exhaustive()
    }
}

impl ClientHandshake {
    /// Starts a handshake for `purpose`; returns the Hello to send.
    pub fn start(
        secret: &JobSecret,
        purpose: &str,
    ) -> Result<(ClientHandshake, [u8; HELLO_LEN]), AuthError> {
        let nonce = fresh_nonce("hello")?;
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(&MAGIC);
        hello[8] = VERSION;
        hello[9] = u8::from(!secret.is_open());
        hello[10..].copy_from_slice(&nonce);
        let state = ClientHandshake {
            key: secret.key().to_vec(),
            has_secret: !secret.is_open(),
            purpose: purpose.to_string(),
            nonce,
        };
        Ok((state, hello))
    }

    /// How many more bytes of the Challenge follow its first 10 (`header`): the nonce and
    /// tag, or the reason of a server that turns the client away (whose length is in
    /// the 2 bytes after the header; then pass them to [`ClientHandshake::turned_away`]).
    pub fn is_turned_away(header: &[u8; 10]) -> bool {
        header[..8] == MAGIC && header[9] == TURNED_AWAY
    }

    /// The reason in a turned-away Challenge (the bytes after its 2-byte length).
    pub fn turned_away(reason: &[u8]) -> AuthError {
        AuthError::TurnedAway {
            reason: String::from_utf8_lossy(reason).into_owned(),
        }
    }

    /// Checks the server's Challenge and returns the Proof to send.
    pub fn answer(&self, challenge: &[u8; CHALLENGE_LEN]) -> Result<[u8; PROOF_LEN], AuthError> {
        check_header(&challenge[..10], "challenge", self.has_secret)?;
        let nonce_s: [u8; NONCE] = challenge[10..10 + NONCE].try_into().expect("32 bytes");
        let tag = &challenge[10 + NONCE..];
        if !verify(
            &self.key,
            b"server",
            &self.purpose,
            &self.nonce,
            &nonce_s,
            tag,
        ) {
            return Err(AuthError::WrongSecret {
                purpose: self.purpose.clone(),
            });
        }
        Ok(mac(
            &self.key,
            b"client",
            &self.purpose,
            &self.nonce,
            &nonce_s,
        ))
    }

    /// The server's verdict on the Proof.
    pub fn verdict(byte: u8) -> Result<(), AuthError> {
        if byte == ACCEPTED {
            Ok(())
        } else {
            Err(AuthError::Refused)
        }
    }
}

/// What a server sends instead of a Challenge to a client it will not serve at all (it
/// serves as many connections as it may): the client's error carries `reason`.
pub fn turn_away(reason: &str) -> Vec<u8> {
    let mut cut = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = Vec::with_capacity(12 + cut);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(TURNED_AWAY);
    out.extend_from_slice(&(cut as u16).to_le_bytes());
    out.extend_from_slice(&reason.as_bytes()[..cut]);
    out
}

/// The server's side, between the client's Hello and its Proof.
pub struct ServerHandshake {
    key: Vec<u8>,
    has_secret: bool,
    purpose: String,
    client_has_secret: bool,
    nonce_c: [u8; NONCE],
    nonce_s: [u8; NONCE],
}

impl fmt::Debug for ServerHandshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerHandshake")
            .field("purpose", &self.purpose)
            .finish_non_exhaustive()
    }
}

impl ServerHandshake {
    /// Reads a client's Hello for `purpose`; a Hello that is not coconet's is an error
    /// (close the connection without answering).
    pub fn new(
        secret: &JobSecret,
        purpose: &str,
        hello: &[u8; HELLO_LEN],
    ) -> Result<ServerHandshake, AuthError> {
        check_protocol(hello, "hello")?;
        Ok(ServerHandshake {
            key: secret.key().to_vec(),
            has_secret: !secret.is_open(),
            purpose: purpose.to_string(),
            client_has_secret: hello[9] != 0,
            nonce_c: hello[10..].try_into().expect("32 bytes"),
            nonce_s: fresh_nonce("challenge")?,
        })
    }

    /// The Challenge to send (sent even to a client whose mode differs, so that it can
    /// say why it was refused).
    pub fn challenge(&self) -> [u8; CHALLENGE_LEN] {
        let mut out = [0u8; CHALLENGE_LEN];
        out[..8].copy_from_slice(&MAGIC);
        out[8] = VERSION;
        out[9] = u8::from(self.has_secret);
        out[10..10 + NONCE].copy_from_slice(&self.nonce_s);
        let tag = mac(
            &self.key,
            b"server",
            &self.purpose,
            &self.nonce_c,
            &self.nonce_s,
        );
        out[10 + NONCE..].copy_from_slice(&tag);
        out
    }

    /// Whether the client holds a secret where this server does not, or the reverse: it
    /// is refused after the Challenge, without waiting for a Proof.
    pub fn mismatch(&self) -> Option<AuthError> {
        (self.client_has_secret != self.has_secret).then_some(AuthError::Mismatch {
            peer_has_secret: self.client_has_secret,
        })
    }

    /// Checks the client's Proof.
    pub fn verify(&self, proof: &[u8; PROOF_LEN]) -> Result<(), AuthError> {
        if let Some(e) = self.mismatch() {
            return Err(e);
        }
        if verify(
            &self.key,
            b"client",
            &self.purpose,
            &self.nonce_c,
            &self.nonce_s,
            proof,
        ) {
            Ok(())
        } else {
            Err(AuthError::WrongSecret {
                purpose: self.purpose.clone(),
            })
        }
    }
}

/// Proves this process to the server at the other end of `stream` and checks the
/// server's proof, within `limit`; the stream's timeouts are restored afterwards.
pub fn client(
    stream: &mut TcpStream,
    secret: &JobSecret,
    purpose: &str,
    limit: Duration,
) -> Result<(), AuthError> {
    with_deadline(stream, limit, |s| {
        let (state, hello) = ClientHandshake::start(secret, purpose)?;
        send(s, &hello, "hello")?;
        let header = receive::<10>(s, "challenge")?;
        if header[..8] != MAGIC {
            return Err(AuthError::NotCoconet { step: "challenge" });
        }
        if ClientHandshake::is_turned_away(&header) {
            let len = u16::from_le_bytes(receive::<2>(s, "challenge")?) as usize;
            let mut reason = vec![0u8; len.min(MAX_REASON)];
            s.read_exact(&mut reason).map_err(|source| AuthError::Io {
                step: "challenge",
                source,
            })?;
            return Err(ClientHandshake::turned_away(&reason));
        }
        let rest = receive::<{ CHALLENGE_LEN - 10 }>(s, "challenge")?;
        let mut challenge = [0u8; CHALLENGE_LEN];
        challenge[..10].copy_from_slice(&header);
        challenge[10..].copy_from_slice(&rest);
        let proof = state.answer(&challenge)?;
        send(s, &proof, "proof")?;
        let [verdict] = receive::<1>(s, "verdict")?;
        ClientHandshake::verdict(verdict)
    })
}

/// Checks the client at the other end of `stream` and proves this process to it, within
/// `limit`; on an error, close the connection (the client was told, where it could be).
pub fn server(
    stream: &mut TcpStream,
    secret: &JobSecret,
    purpose: &str,
    limit: Duration,
) -> Result<(), AuthError> {
    with_deadline(stream, limit, |s| {
        let hello = receive::<HELLO_LEN>(s, "hello")?;
        let state = ServerHandshake::new(secret, purpose, &hello)?;
        send(s, &state.challenge(), "challenge")?;
        if let Some(e) = state.mismatch() {
            return Err(e);
        }
        let proof = receive::<PROOF_LEN>(s, "proof")?;
        let verdict = state.verify(&proof);
        send(
            s,
            &[if verdict.is_ok() { ACCEPTED } else { REFUSED }],
            "verdict",
        )?;
        verdict
    })
}

/// Runs `f` with `stream`'s read and write timeouts set to what is left of `limit`.
fn with_deadline<T>(
    stream: &mut TcpStream,
    limit: Duration,
    f: impl FnOnce(&mut TcpStream) -> Result<T, AuthError>,
) -> Result<T, AuthError> {
    let io = |source| AuthError::Io {
        step: "setup",
        source,
    };
    let (read, write) = (
        stream.read_timeout().map_err(io)?,
        stream.write_timeout().map_err(io)?,
    );
    let limit = Some(limit.max(Duration::from_millis(1)));
    stream.set_read_timeout(limit).map_err(io)?;
    stream.set_write_timeout(limit).map_err(io)?;
    let result = f(stream);
    stream.set_read_timeout(read).map_err(io)?;
    stream.set_write_timeout(write).map_err(io)?;
    result
}

fn send(stream: &mut impl Write, bytes: &[u8], step: &'static str) -> Result<(), AuthError> {
    stream
        .write_all(bytes)
        .and_then(|()| stream.flush())
        .map_err(|source| AuthError::Io { step, source })
}

fn receive<const N: usize>(
    stream: &mut impl Read,
    step: &'static str,
) -> Result<[u8; N], AuthError> {
    let mut buf = [0u8; N];
    stream
        .read_exact(&mut buf)
        .map_err(|source| AuthError::Io { step, source })?;
    Ok(buf)
}

/// Refuses a greeting that is not coconet's handshake in this version.
fn check_protocol(header: &[u8], step: &'static str) -> Result<(), AuthError> {
    if header[..8] != MAGIC {
        return Err(AuthError::NotCoconet { step });
    }
    if header[8] != VERSION {
        return Err(AuthError::Version { theirs: header[8] });
    }
    Ok(())
}

/// [`check_protocol`], and that the peer holds a secret exactly when this side does.
fn check_header(header: &[u8], step: &'static str, has_secret: bool) -> Result<(), AuthError> {
    check_protocol(header, step)?;
    let peer_has_secret = header[9] != 0;
    if peer_has_secret != has_secret {
        return Err(AuthError::Mismatch { peer_has_secret });
    }
    Ok(())
}

fn fresh_nonce(step: &'static str) -> Result<[u8; NONCE], AuthError> {
    let mut nonce = [0u8; NONCE];
    getrandom::fill(&mut nonce).map_err(|e| AuthError::Io {
        step,
        source: io::Error::other(format!("the system's random source failed: {e}")),
    })?;
    Ok(nonce)
}

type HmacSha256 = Hmac<Sha256>;

fn keyed(key: &[u8], role: &[u8], purpose: &str, nonce_c: &[u8], nonce_s: &[u8]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(b"coconet handshake v1 ");
    m.update(role);
    // Length-prefixed, so no purpose is a prefix of another's encoding.
    m.update(&(purpose.len() as u64).to_le_bytes());
    m.update(purpose.as_bytes());
    m.update(nonce_c);
    m.update(nonce_s);
    m
}

fn mac(key: &[u8], role: &[u8], purpose: &str, nonce_c: &[u8], nonce_s: &[u8]) -> [u8; TAG] {
    keyed(key, role, purpose, nonce_c, nonce_s)
        .finalize()
        .into_bytes()
        .into()
}

fn verify(
    key: &[u8],
    role: &[u8],
    purpose: &str,
    nonce_c: &[u8],
    nonce_s: &[u8],
    tag: &[u8],
) -> bool {
    keyed(key, role, purpose, nonce_c, nonce_s)
        .verify_slice(tag)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Runs the server's side on a thread and the client's here.
    fn pair(
        server_secret: JobSecret,
        server_purpose: &'static str,
        client_secret: &JobSecret,
        client_purpose: &str,
    ) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server_side = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            server(
                &mut s,
                &server_secret,
                server_purpose,
                Duration::from_secs(5),
            )
        });
        let mut s = TcpStream::connect(addr).unwrap();
        let client_result = client(
            &mut s,
            client_secret,
            client_purpose,
            Duration::from_secs(5),
        );
        drop(s);
        (client_result, server_side.join().unwrap())
    }

    #[test]
    fn holders_of_the_secret_get_in() {
        let secret = JobSecret::generate().unwrap();
        let (c, s) = pair(secret.clone(), "store", &secret, "store");
        c.unwrap();
        s.unwrap();
        let open = JobSecret::insecure_open();
        let (c, s) = pair(open.clone(), "store", &open, "store");
        c.unwrap();
        s.unwrap();
    }

    #[test]
    fn another_secret_is_refused_on_both_sides() {
        let (c, s) = pair(
            JobSecret::generate().unwrap(),
            "store",
            &JobSecret::generate().unwrap(),
            "store",
        );
        assert!(matches!(c, Err(AuthError::WrongSecret { .. })), "{c:?}");
        // The client stopped at the server's proof, so the server never got one.
        assert!(
            matches!(s, Err(AuthError::Io { step: "proof", .. })),
            "{s:?}"
        );
    }

    #[test]
    fn a_proof_for_another_purpose_opens_nothing() {
        let secret = JobSecret::generate().unwrap();
        let (c, _) = pair(secret.clone(), "tcp/g/1->0", &secret, "tcp/g/2->0");
        let c = c.unwrap_err().to_string();
        assert!(c.contains("tcp/g/2->0"), "{c}");
    }

    #[test]
    fn a_stranger_without_a_secret_is_told_and_refused() {
        let secret = JobSecret::generate().unwrap();
        let (c, s) = pair(secret, "store", &JobSecret::insecure_open(), "store");
        let c = c.unwrap_err().to_string();
        assert!(c.contains("requires a job secret"), "{c}");
        assert!(
            matches!(
                s,
                Err(AuthError::Mismatch {
                    peer_has_secret: false
                })
            ),
            "{s:?}"
        );
        // And a server without one refuses a client with one.
        let (c, _) = pair(
            JobSecret::insecure_open(),
            "store",
            &JobSecret::generate().unwrap(),
            "store",
        );
        assert!(
            c.unwrap_err()
                .to_string()
                .contains("runs without a job secret")
        );
    }

    #[test]
    fn a_forged_proof_is_refused_by_the_server() {
        // A client that follows the protocol but makes up its proof.
        let secret = JobSecret::generate().unwrap();
        let (server_state_hello, hello) = ClientHandshake::start(&secret, "store").unwrap();
        let server = ServerHandshake::new(&secret, "store", &hello).unwrap();
        let challenge = server.challenge();
        let mut proof = server_state_hello.answer(&challenge).unwrap();
        server.verify(&proof).unwrap();
        proof[0] ^= 1;
        assert!(matches!(
            server.verify(&proof),
            Err(AuthError::WrongSecret { .. })
        ));
        // The server's own proof, reflected back as a client's, is refused too.
        let reflected: [u8; PROOF_LEN] = challenge[10 + NONCE..].try_into().unwrap();
        assert!(server.verify(&reflected).is_err());
    }

    #[test]
    fn a_silent_or_foreign_peer_ends_the_handshake_within_its_limit() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let silent = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_millis(600));
            drop(s);
        });
        let mut s = TcpStream::connect(addr).unwrap();
        let start = std::time::Instant::now();
        let e = client(
            &mut s,
            &JobSecret::generate().unwrap(),
            "store",
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                AuthError::Io {
                    step: "challenge",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(start.elapsed() < Duration::from_millis(550));
        silent.join().unwrap();

        // A full server's reason reaches the client.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let full = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(&turn_away("it serves 4096 connections already"))
                .unwrap();
        });
        let mut s = TcpStream::connect(addr).unwrap();
        let e = client(
            &mut s,
            &JobSecret::generate().unwrap(),
            "store",
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("turned this process away: it serves 4096"),
            "{e}"
        );
        full.join().unwrap();

        let hello = [b'x'; HELLO_LEN];
        let e = ServerHandshake::new(&JobSecret::generate().unwrap(), "store", &hello).unwrap_err();
        assert!(e.to_string().contains("not a coconet process"), "{e}");
    }
}
