//! What a server says about peers it refused and about where it listens.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::JobSecret;

/// Refusals logged in full before the log thins out (a flood must not fill the disk).
const LOGGED_IN_FULL: u64 = 20;

/// Logs (to stderr) that `service` refused `peer` and why. The first refusals are logged
/// one line each; later ones every thousandth, with the count, so a flood of strangers
/// cannot fill the log.
pub fn log_refusal(service: &str, peer: SocketAddr, reason: &dyn std::fmt::Display) {
    static REFUSED: AtomicU64 = AtomicU64::new(0);
    let n = REFUSED.fetch_add(1, Ordering::Relaxed) + 1;
    if n <= LOGGED_IN_FULL {
        eprintln!("coconet: {service} refused a connection from {peer}: {reason}");
    } else if n.is_multiple_of(1000) {
        eprintln!(
            "coconet: {service} refused a connection from {peer}: {reason} ({n} refusals so far in this process)"
        );
    }
}

/// Says once per process and service that `service` listens at `addr`, which other hosts
/// can reach, and what protects it (nothing at all under the opt-out).
pub fn announce_exposure(service: &str, addr: SocketAddr, secret: &JobSecret) {
    if addr.ip().is_loopback() {
        return;
    }
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if !said
        .get_or_insert_with(HashSet::new)
        .insert(service.to_string())
    {
        return;
    }
    if secret.is_open() {
        eprintln!(
            "coconet: WARNING: {service} listens on {addr}, reachable from other hosts, WITHOUT a job \
             secret (COCONET_INSECURE_NO_SECRET): anyone who reaches it can join the job"
        );
    } else {
        eprintln!(
            "coconet: {service} listens on {addr}, reachable from other hosts: peers must prove the \
             job secret, but traffic is not encrypted (use a trusted network or a tunnel)"
        );
    }
}
