//! The stream data path: a collective's bytes travel through the socket, behind a
//! header (collective, step, length) — two copies (into the kernel and out), between any
//! two hosts.

use super::shared::{Part, Shared};
use crate::RuntimeError;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc::Receiver;

/// Messages up to this size are sent with their header in one write.
const SMALL: usize = 64 << 10;

/// The header of a message: its collective's number, its step's tag, its length.
fn header(part: &Part) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(&part.collective.to_le_bytes());
    h[8..16].copy_from_slice(&part.step.to_le_bytes());
    h[16..].copy_from_slice(&(part.len as u64).to_le_bytes());
    h
}

/// Bytes of a message header.
const HEADER: usize = 24;

/// A connection's sending thread: writes each part, header first, in posting order.
pub(super) fn send_parts(
    shared: &Shared,
    peer: usize,
    mut stream: TcpStream,
    parts: Receiver<Part>,
) {
    for part in parts {
        if !shared.failed() {
            // SAFETY: the poster keeps these bytes valid and unwritten until the part is
            // finished (its flight waits for it).
            let data = unsafe { std::slice::from_raw_parts(part.addr as *const u8, part.len) };
            let head = header(&part);
            let written = if part.len <= SMALL {
                let mut msg = Vec::with_capacity(HEADER + part.len);
                msg.extend_from_slice(&head);
                msg.extend_from_slice(data);
                stream.write_all(&msg)
            } else {
                stream
                    .write_all(&head)
                    .and_then(|()| stream.write_all(data))
            };
            if let Err(e) = written {
                shared.lost(shared.lost_peer(peer, &e));
            }
        }
        part.latch.finish(None);
    }
}

/// A connection's receiving thread: reads each expected part, checking its header.
pub(super) fn receive_parts(
    shared: &Shared,
    peer: usize,
    mut stream: TcpStream,
    parts: Receiver<Part>,
) {
    for part in parts {
        if !shared.failed() {
            match receive(shared, peer, &mut stream, &part) {
                Ok(()) => {}
                Err((e, true)) => shared.fail(e),
                Err((e, false)) => shared.lost(e),
            }
        }
        part.latch.finish(Some(peer));
    }
}

fn receive(
    shared: &Shared,
    peer: usize,
    stream: &mut TcpStream,
    part: &Part,
) -> Result<(), (RuntimeError, bool)> {
    let lost = |e: std::io::Error| (shared.lost_peer(peer, &e), false);
    let mut head = [0u8; HEADER];
    stream.read_exact(&mut head).map_err(lost)?;
    let word = |i: usize| u64::from_le_bytes(head[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    shared
        .check_arrival(peer, part, word(0), word(1), word(2))
        .map_err(|e| (e, true))?;
    // SAFETY: the poster keeps these bytes valid and untouched by anything else until
    // the part is finished (its flight waits for it).
    let into = unsafe { std::slice::from_raw_parts_mut(part.addr as *mut u8, part.len) };
    stream.read_exact(into).map_err(lost)
}
