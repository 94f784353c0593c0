//! The parameter server across processes: [`PsServer`] serves a [`ParamServer`]'s rows
//! (one shard of the job's table) over TCP, and a worker reads and updates the table
//! through a [`RemoteTable`] connected to every server. Every connection proves the
//! job's [`JobSecret`](coconet_trust::JobSecret) both ways before a row moves. Synchronous steps give the same
//! rows as one in-process table (see [`PsServer`]).
//!
//! [`ParamServer`]: super::ParamServer

/// What a parameter server's handshake proves (see [`coconet_trust::handshake`]).
const PURPOSE: &str = "coconet parameter server";

mod client;
mod server;
mod wire;

pub use client::RemoteTable;
pub use server::PsServer;
