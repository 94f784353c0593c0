//! The parameter server across processes: [`PsServer`] serves a [`ParamServer`]'s rows
//! (one shard of the job's table) over TCP, and a worker reads and updates the table
//! through a [`RemoteTable`] connected to every server. Synchronous steps give the same
//! rows as one in-process table (see [`PsServer`]).
//!
//! [`ParamServer`]: super::ParamServer

mod client;
mod server;
mod wire;

pub use client::RemoteTable;
pub use server::PsServer;
