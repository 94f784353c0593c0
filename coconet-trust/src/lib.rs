//! Who may join a coconet job, and what it may believe.
//!
//! A multi-process job listens on several sockets: the rendezvous store, each rank's data
//! port, HeterPS's parameter servers and pipeline boundaries. Anything that can reach a
//! port could otherwise join: read and set the store's keys, or send its bytes as a rank's
//! gradients. This crate is the one place that decides who belongs:
//!
//! - [`JobSecret`]: a per-job key the launcher creates (or takes from the environment or
//!   a file, for jobs that span hosts) and hands to its ranks. Running without one is an
//!   explicit opt-out ([`JobSecret::insecure_open`]).
//! - [`handshake`]: the mutual challenge–response every connection runs before a byte of
//!   job data: each side proves it holds the secret with an HMAC-SHA256 over fresh nonces
//!   from both sides and the connection's purpose, so a proof can be neither replayed nor
//!   reflected nor carried to another service. It costs one round trip and two MACs at
//!   connect time and nothing on the step.
//! - [`bounded`]: reading what a peer announces with memory that follows the bytes that
//!   arrived, never the length announced.
//! - [`frame`]: the one frame codec of the TCP protocols (header, bounded body, per-protocol
//!   kinds and limit), blocking or fed bytes without I/O.
//! - [`gate`]: a rendezvous's incoming connections checked each on its own thread, so a
//!   silent stranger cannot hold the door for the job's own peers.
//! - [`refusals`]: the log line naming a refused peer, and the one warning that a service
//!   listens beyond loopback.
//!
//! What it does not do: encrypt. Someone who can read or alter the traffic on the path
//! (not merely connect) sees the data and could hijack an authenticated connection; run
//! jobs across hosts on a network you trust, or inside a VPN/WireGuard tunnel.

pub mod bounded;
pub mod frame;
pub mod gate;
pub mod handshake;
pub mod refusals;
mod secret;

pub use handshake::AuthError;
pub use secret::{
    INSECURE_NO_SECRET, JOB_SECRET, JOB_SECRET_FILE, JobSecret, SecretError, SecretSource,
};
