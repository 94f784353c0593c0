//! The stream data path: a collective's bytes travel through the socket as the body of a
//! frame (coconet's frame codec: collective, step, length) — two copies (into the kernel
//! and out), between any two hosts.

use super::shared::{Part, Shared};
use coconet_plan::RuntimeError;
use coconet_trust::frame::{Format, Layout};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc::Receiver;

/// Messages up to this size are sent with their header in one write.
const SMALL: usize = 64 << 10;

/// The kind of the stream path's one frame: a part of a collective.
const DATA: u8 = 1;

/// The stream path's frames, in coconet's frame codec: the collective's number and its
/// step's tag in the header, the part's bytes as the body (read straight into the
/// posted receive, whose length the header must match).
const FORMAT: Format = Format {
    peer: "rank",
    layout: Layout::Words(2),
    kinds: &[DATA],
    max_body: isize::MAX as usize,
};

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
            let words = [part.collective, part.step];
            let written = if part.len <= SMALL {
                FORMAT
                    .encode(DATA, &words, &[data])
                    .and_then(|msg| stream.write_all(&msg))
            } else {
                FORMAT
                    .encode_head(DATA, &words, part.len)
                    .and_then(|head| stream.write_all(&head))
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
    let head = FORMAT.read_head(stream).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidData {
            // Not a frame of a coconet rank: first-hand.
            let message = format!("rank {peer} sent {e}: another program on this connection?");
            (
                RuntimeError::RankFailed {
                    rank: peer,
                    message,
                },
                true,
            )
        } else {
            lost(e)
        }
    })?;
    let [collective, step, ..] = head.words;
    shared
        .check_arrival(peer, part, collective, step, head.len as u64)
        .map_err(|e| (e, true))?;
    // SAFETY: the poster keeps these bytes valid and untouched by anything else until
    // the part is finished (its flight waits for it).
    let into = unsafe { std::slice::from_raw_parts_mut(part.addr as *mut u8, part.len) };
    stream.read_exact(into).map_err(lost)
}
