//! The parameter-server protocol's frames: one fixed header (kind, two words, three
//! lengths), then the keys, the values and a text, little-endian. Requests and answers
//! are frames; every request gets one answer (`OK` with its data, or `ERROR` with a
//! message), in order.

use coconet_trust::bounded::read_announced;
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

const HEADER: usize = 48;

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
        let mut buf = Vec::with_capacity(
            HEADER + 8 * self.keys.len() + 4 * self.values.len() + self.text.len(),
        );
        buf.push(self.kind);
        buf.extend_from_slice(&[0; 7]);
        for x in [
            self.a,
            self.b,
            self.keys.len() as u64,
            self.values.len() as u64,
            self.text.len() as u64,
        ] {
            buf.extend_from_slice(&x.to_le_bytes());
        }
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
        let mut head = [0u8; HEADER];
        r.read_exact(&mut head)?;
        Frame::read_after(r, head)
    }

    /// Reads one frame from `stream`, waiting for its header as long as it takes (a
    /// worker may be idle between requests) and for the rest at most `deadline` (a peer
    /// that stalls mid-frame is dropped, not waited for).
    pub fn read_within(
        stream: &mut std::net::TcpStream,
        deadline: std::time::Duration,
    ) -> std::io::Result<Frame> {
        let mut head = [0u8; HEADER];
        stream.read_exact(&mut head)?;
        stream.set_read_timeout(Some(deadline))?;
        let frame = Frame::read_after(stream, head);
        stream.set_read_timeout(None)?;
        frame
    }

    /// The rest of a frame whose header is `head`.
    fn read_after(r: &mut impl Read, head: [u8; HEADER]) -> std::io::Result<Frame> {
        let word = |i: usize| u64::from_le_bytes(head[8 + 8 * i..16 + 8 * i].try_into().unwrap());
        let (keys, values, text) = (word(2), word(3), word(4));
        if keys > MAX_ELEMENTS || values > MAX_ELEMENTS || text > MAX_ELEMENTS {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a frame announcing {keys} keys, {values} values and {text} bytes of text \
                     (not a coconet parameter server?)"
                ),
            ));
        }
        // Memory follows the bytes that arrive, not the lengths the header announces.
        let mut bytes = |n: u64, size: u64| read_announced(r, (n * size) as usize);
        let k = bytes(keys, 8)?;
        let v = bytes(values, 4)?;
        let t = bytes(text, 1)?;
        Ok(Frame {
            kind: head[0],
            a: word(0),
            b: word(1),
            keys: k
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            values: v
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            text: String::from_utf8_lossy(&t).into_owned(),
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
