//! The parameter-server protocol's frames, in coconet's frame codec
//! ([`coconet_trust::frame`]): a kind, the words `a` and `b`, the numbers of keys and of
//! values, then a body of the keys, the values and a text, little-endian. Requests and
//! answers are frames; every request gets one answer (`OK` with its data, or `ERROR` with
//! a message), in order.

use coconet_trust::frame::{self, Format, Head, Layout};
use std::io::{Read, Write};

/// Request kinds (client → server) and answer kinds (server → client).
pub(crate) mod kind {
    /// `a` = this worker, `b` = the number of workers, `text` = the row size.
    pub const HELLO: u8 = 1;
    /// `keys` → `values`: the rows (a new row reads as its initial values; pushes
    /// create rows), counted as traffic.
    pub const PULL: u8 = 2;
    /// `keys` → `values`: the rows, never created.
    pub const LOOKUP: u8 = 3;
    /// `a` = the step, `b` = the scale's bits, `keys` and `values` = row gradients;
    /// answered once every worker's push of the step is applied.
    pub const PUSH: u8 = 4;
    /// → `keys` and `values` (the rows, then their accumulators), sorted by key.
    pub const EXPORT: u8 = 5;
    /// A request served.
    pub const OK: u8 = 100;
    /// A request refused: `text` says why.
    pub const ERROR: u8 = 101;
}

/// The most elements a frame may carry per field: a garbled header is an error, not an
/// allocation of everything.
const MAX_ELEMENTS: u64 = 1 << 32;

/// The protocol's frames: kind, `a`, `b`, the number of keys, the number of values.
const FORMAT: Format = Format {
    peer: "parameter server",
    layout: Layout::Words(4),
    kinds: &[
        kind::HELLO,
        kind::PULL,
        kind::LOOKUP,
        kind::PUSH,
        kind::EXPORT,
        kind::OK,
        kind::ERROR,
    ],
    // Keys, values and text of MAX_ELEMENTS each.
    max_body: (13 * MAX_ELEMENTS) as usize,
};

/// One message of the protocol.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Frame {
    pub kind: u8,
    pub a: u64,
    pub b: u64,
    pub keys: Vec<u64>,
    pub values: Vec<f32>,
    pub text: String,
}

impl Frame {
    pub fn new(kind: u8) -> Frame {
        Frame {
            kind,
            ..Frame::default()
        }
    }

    /// An `ERROR` answer.
    pub fn error(message: impl Into<String>) -> Frame {
        Frame {
            kind: kind::ERROR,
            text: message.into(),
            ..Frame::default()
        }
    }

    /// Writes the frame as one buffer (one system call for small frames).
    pub fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        let words = [
            self.a,
            self.b,
            self.keys.len() as u64,
            self.values.len() as u64,
        ];
        let len = 8 * self.keys.len() + 4 * self.values.len() + self.text.len();
        let mut buf = FORMAT.encode_head(self.kind, &words, len)?;
        buf.reserve_exact(len);
        self.keys
            .iter()
            .for_each(|k| buf.extend_from_slice(&k.to_le_bytes()));
        self.values
            .iter()
            .for_each(|v| buf.extend_from_slice(&v.to_le_bytes()));
        buf.extend_from_slice(self.text.as_bytes());
        w.write_all(&buf)?;
        w.flush()
    }

    /// Reads one frame.
    pub fn read(r: &mut impl Read) -> std::io::Result<Frame> {
        let f = FORMAT.read(r)?;
        Frame::decode(f.kind, f.words, f.body)
    }

    /// Reads one frame from `stream`, waiting for its header as long as it takes (a
    /// worker may be idle between requests) and for the rest at most `deadline` (a peer
    /// that stalls mid-frame is dropped, not waited for).
    pub fn read_within(
        stream: &mut std::net::TcpStream,
        deadline: std::time::Duration,
    ) -> std::io::Result<Frame> {
        let head: Head = FORMAT.read_head(stream)?;
        stream.set_read_timeout(Some(deadline))?;
        let body = FORMAT.read_body(stream, &head);
        stream.set_read_timeout(None)?;
        Frame::decode(head.kind, head.words, body?)
    }

    /// The frame a codec frame carries: its keys, values and text.
    fn decode(
        kind: u8,
        [a, b, keys, values]: [u64; frame::MAX_WORDS],
        body: Vec<u8>,
    ) -> std::io::Result<Frame> {
        let text = (body.len() as u64)
            .checked_sub(8 * keys.min(MAX_ELEMENTS) + 4 * values.min(MAX_ELEMENTS))
            .filter(|_| keys <= MAX_ELEMENTS && values <= MAX_ELEMENTS);
        let Some(text) = text else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a frame announcing {keys} keys and {values} values in {} bytes \
                     (not a coconet parameter server?)",
                    body.len()
                ),
            ));
        };
        let (k, rest) = body.split_at(8 * keys as usize);
        let (v, t) = rest.split_at(4 * values as usize);
        debug_assert_eq!(t.len() as u64, text);
        Ok(Frame {
            kind,
            a,
            b,
            keys: k
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            values: v
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            text: String::from_utf8_lossy(t).into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_reads_back_as_written_and_a_garbled_header_is_an_error() {
        let f = Frame {
            kind: kind::PUSH,
            a: 7,
            b: 0.5f32.to_bits() as u64,
            keys: vec![1, u64::MAX],
            values: vec![1.5, -2.0, f32::MIN_POSITIVE],
            text: "dim=9".into(),
        };
        let mut buf = Vec::new();
        f.write(&mut buf).unwrap();
        assert_eq!(Frame::read(&mut &buf[..]).unwrap(), f);
        let mut garbled = buf.clone();
        garbled[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = Frame::read(&mut &garbled[..]).unwrap_err();
        assert!(
            e.to_string().contains("not a coconet parameter server"),
            "{e}"
        );
        // A frame cut short is an error, not a hang or a short frame.
        assert!(Frame::read(&mut &buf[..buf.len() - 1]).is_err());
    }
}
