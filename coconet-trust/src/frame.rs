//! The one frame codec of coconet's TCP protocols (the store, the TCP transport, the
//! parameter servers, the pipeline boundaries).
//!
//! A frame is a fixed-size header, then the body the header announces. A protocol's
//! [`Format`] fixes the header's [`Layout`], the kinds its peers send and the largest
//! body it accepts; the codec refuses anything else before reading the body, and reads
//! a body with memory that follows the bytes that arrive ([`crate::bounded`]), never the
//! length announced. The authentication handshake ([`crate::handshake`]) runs before the
//! first frame on every connection.
//!
//! ```text
//! Layout::Prefix32   u32 body length | body
//! Layout::Words(w)   u8 kind | 7 zero bytes | w × u64 words | u64 body length | body
//! ```
//!
//! All integers are little-endian. [`Format::read`] / [`Format::write`] work on blocking
//! streams; [`Format::head`] parses a header and [`Decoder`] whole frames from bytes fed
//! in whatever pieces they arrive, without I/O, for non-blocking and async readers.

use std::io::{self, Read, Write};

/// The most protocol words a header carries.
pub const MAX_WORDS: usize = 4;

/// How a protocol's header is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A `u32` body length only (the store: its bodies start with their own tag).
    Prefix32,
    /// A kind byte, seven zero bytes, this many `u64` words (at most [`MAX_WORDS`]) and
    /// the `u64` body length.
    Words(usize),
}

/// One protocol's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    /// What a peer of the protocol is, for errors: "not a coconet {peer}?".
    pub peer: &'static str,
    /// The header's layout.
    pub layout: Layout,
    /// The kinds a peer may send (ignored by [`Layout::Prefix32`], which has none).
    pub kinds: &'static [u8],
    /// The largest body either end accepts.
    pub max_body: usize,
}

/// A frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The frame's kind (0 under [`Layout::Prefix32`]).
    pub kind: u8,
    /// The protocol's words (unused ones 0).
    pub words: [u64; MAX_WORDS],
    /// Bytes of the body that follows.
    pub len: usize,
}

/// A whole frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The frame's kind (0 under [`Layout::Prefix32`]).
    pub kind: u8,
    /// The protocol's words (unused ones 0).
    pub words: [u64; MAX_WORDS],
    /// The body.
    pub body: Vec<u8>,
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

impl Format {
    /// Bytes of a header.
    pub const fn head_len(&self) -> usize {
        match self.layout {
            Layout::Prefix32 => 4,
            Layout::Words(w) => 16 + 8 * w,
        }
    }

    fn words(&self) -> usize {
        match self.layout {
            Layout::Prefix32 => 0,
            Layout::Words(w) => w,
        }
    }

    /// Parses a header ([`Format::head_len`] bytes): a kind the protocol does not know,
    /// nonzero padding or a body above the limit is an `InvalidData` error.
    pub fn head(&self, bytes: &[u8]) -> io::Result<Head> {
        assert_eq!(bytes.len(), self.head_len(), "a whole header");
        let peer = self.peer;
        let mut words = [0; MAX_WORDS];
        let (kind, len) = match self.layout {
            Layout::Prefix32 => (
                0,
                u32::from_le_bytes(bytes.try_into().expect("4 bytes")) as u64,
            ),
            Layout::Words(w) => {
                let kind = bytes[0];
                if !self.kinds.contains(&kind) || bytes[1..8].iter().any(|&b| b != 0) {
                    return Err(invalid(format!(
                        "a frame of kind {kind} (padding {:?}), which no coconet {peer} sends \
                         (not a coconet {peer}?)",
                        &bytes[1..8]
                    )));
                }
                for (i, word) in words.iter_mut().take(w).enumerate() {
                    *word = u64_at(bytes, 8 + 8 * i);
                }
                (kind, u64_at(bytes, 8 + 8 * w))
            }
        };
        let max = self.max_body;
        match usize::try_from(len) {
            Ok(len) if len <= max => Ok(Head { kind, words, len }),
            _ => Err(invalid(format!(
                "a frame announces {len} bytes, above the {max}-byte limit \
                 (not a coconet {peer}?)"
            ))),
        }
    }

    /// The header of a frame of `kind` with `words` and a `len`-byte body; a body above
    /// the limit is an `InvalidInput` error.
    pub fn encode_head(&self, kind: u8, words: &[u64], len: usize) -> io::Result<Vec<u8>> {
        assert_eq!(words.len(), self.words(), "the protocol's words");
        if len > self.max_body {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a {len}-byte message exceeds the coconet {}'s {}-byte limit",
                    self.peer, self.max_body
                ),
            ));
        }
        let mut head = Vec::with_capacity(self.head_len());
        match self.layout {
            Layout::Prefix32 => head.extend_from_slice(&(len as u32).to_le_bytes()),
            Layout::Words(_) => {
                head.push(kind);
                head.extend_from_slice(&[0; 7]);
                for w in words.iter().chain([&(len as u64)]) {
                    head.extend_from_slice(&w.to_le_bytes());
                }
            }
        }
        Ok(head)
    }

    /// A whole frame: its header, then `body`'s pieces one after the other.
    pub fn encode(&self, kind: u8, words: &[u64], body: &[&[u8]]) -> io::Result<Vec<u8>> {
        let len = body.iter().map(|b| b.len()).sum();
        let mut frame = self.encode_head(kind, words, len)?;
        frame.reserve_exact(len);
        body.iter().for_each(|b| frame.extend_from_slice(b));
        Ok(frame)
    }

    /// Writes a frame in one write, then flushes.
    pub fn write(
        &self,
        w: &mut impl Write,
        kind: u8,
        words: &[u64],
        body: &[&[u8]],
    ) -> io::Result<()> {
        w.write_all(&self.encode(kind, words, body)?)?;
        w.flush()
    }

    /// Reads a header.
    pub fn read_head(&self, r: &mut impl Read) -> io::Result<Head> {
        let mut head = [0u8; 16 + 8 * MAX_WORDS];
        let head = &mut head[..self.head_len()];
        r.read_exact(head)?;
        self.head(head)
    }

    /// Reads the body `head` announces, memory following the bytes that arrive.
    pub fn read_body(&self, r: &mut impl Read, head: &Head) -> io::Result<Vec<u8>> {
        crate::bounded::read_announced(r, head.len)
    }

    /// Reads a whole frame.
    pub fn read(&self, r: &mut impl Read) -> io::Result<Frame> {
        let head = self.read_head(r)?;
        let body = self.read_body(r, &head)?;
        Ok(Frame {
            kind: head.kind,
            words: head.words,
            body,
        })
    }
}

/// Whole frames from bytes fed as they arrive, without I/O: memory holds only the bytes
/// fed and not yet taken as frames, whatever length a header announces.
#[derive(Debug)]
pub struct Decoder {
    format: &'static Format,
    pending: Vec<u8>,
    /// Bytes at the front of `pending` already taken as frames.
    taken: usize,
}

impl Decoder {
    /// A decoder of `format`'s frames.
    pub fn new(format: &'static Format) -> Decoder {
        Decoder {
            format,
            pending: Vec::new(),
            taken: 0,
        }
    }

    /// Adds bytes that arrived.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.taken > 0 && self.taken >= self.pending.len() / 2 {
            self.pending.drain(..self.taken);
            self.taken = 0;
        }
        self.pending.extend_from_slice(bytes);
    }

    /// The next whole frame, if it has arrived; a header the format refuses is an
    /// error (the connection is then unusable).
    pub fn next_frame(&mut self) -> io::Result<Option<Frame>> {
        let at = &self.pending[self.taken..];
        let head_len = self.format.head_len();
        if at.len() < head_len {
            return Ok(None);
        }
        let head = self.format.head(&at[..head_len])?;
        let Some(body) = at.get(head_len..head_len + head.len) else {
            return Ok(None);
        };
        let frame = Frame {
            kind: head.kind,
            words: head.words,
            body: body.to_vec(),
        };
        self.taken += head_len + head.len;
        Ok(Some(frame))
    }

    /// Bytes fed and not yet taken as frames (part of a frame, if not 0).
    pub fn buffered(&self) -> usize {
        self.pending.len() - self.taken
    }

    /// Bytes the decoder holds.
    pub fn capacity(&self) -> usize {
        self.pending.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORDS: Format = Format {
        peer: "test peer",
        layout: Layout::Words(2),
        kinds: &[1, 2],
        max_body: 1 << 40,
    };
    const PREFIX: Format = Format {
        peer: "store",
        layout: Layout::Prefix32,
        kinds: &[],
        max_body: 64 << 20,
    };

    fn frame(kind: u8, words: [u64; 2], body: &[u8]) -> Frame {
        Frame {
            kind,
            words: [words[0], words[1], 0, 0],
            body: body.to_vec(),
        }
    }

    #[test]
    fn frames_read_back_as_written() {
        let mut wire = Vec::new();
        WORDS
            .write(&mut wire, 2, &[7, u64::MAX], &[b"ab", b"", b"c"])
            .unwrap();
        WORDS.write(&mut wire, 1, &[0, 0], &[]).unwrap();
        assert_eq!(wire.len(), 2 * 32 + 3);
        assert_eq!(&wire[..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&wire[24..32], &3u64.to_le_bytes());
        let mut r = &wire[..];
        assert_eq!(WORDS.read(&mut r).unwrap(), frame(2, [7, u64::MAX], b"abc"));
        assert_eq!(WORDS.read(&mut r).unwrap(), frame(1, [0, 0], b""));
        assert!(r.is_empty());
        let mut store = Vec::new();
        PREFIX.write(&mut store, 0, &[], &[&[7, 8]]).unwrap();
        assert_eq!(store, [2, 0, 0, 0, 7, 8]);
        assert_eq!(PREFIX.read(&mut &store[..]).unwrap().body, [7, 8]);
    }

    #[test]
    fn a_truncated_frame_is_an_error() {
        let wire = WORDS.encode(1, &[3, 4], &[&[9; 100]]).unwrap();
        for cut in [0, 1, 31, 32, 131] {
            let e = WORDS.read(&mut &wire[..cut]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "cut at {cut}");
        }
        let mut d = Decoder::new(&WORDS);
        d.feed(&wire[..131]);
        assert!(d.next_frame().unwrap().is_none());
        assert_eq!(d.buffered(), 131);
    }

    #[test]
    fn a_huge_announced_length_costs_only_what_arrived() {
        // 1 TiB announced (within the limit), 100 KiB sent.
        let mut wire = WORDS.encode_head(1, &[0, 0], 1 << 40).unwrap();
        wire.extend(vec![5u8; 100 << 10]);
        let e = WORDS.read(&mut &wire[..]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let mut d = Decoder::new(&WORDS);
        d.feed(&wire);
        assert!(d.next_frame().unwrap().is_none());
        assert!(
            d.capacity() <= 2 * wire.len(),
            "{} bytes held",
            d.capacity()
        );
        // Above the limit: refused before a byte of the body is read.
        let big = WORDS.encode_head(1, &[0, 0], 1 << 40).unwrap();
        let mut over = big.clone();
        over[24..32].copy_from_slice(&((1u64 << 40) + 1).to_le_bytes());
        let e = WORDS.read(&mut &over[..]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("not a coconet test peer"), "{e}");
        let e = PREFIX.read(&mut &[0xff; 4][..]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("not a coconet store"), "{e}");
        // Nor may a writer send one.
        let e = PREFIX
            .encode(0, &[], &[&vec![0; (64 << 20) + 1]])
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_wrong_kind_or_padding_is_refused() {
        let mut wire = WORDS.encode(1, &[0, 0], &[]).unwrap();
        wire[0] = 3;
        let e = WORDS.read(&mut &wire[..]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("kind 3"), "{e}");
        wire[0] = 1;
        wire[5] = 1;
        assert!(WORDS.read(&mut &wire[..]).is_err());
        let mut d = Decoder::new(&WORDS);
        d.feed(&wire);
        assert_eq!(
            d.next_frame().unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn a_frame_split_across_reads_decodes_whole() {
        let mut wire = WORDS.encode(2, &[1, 2], &[b"hello"]).unwrap();
        wire.extend(WORDS.encode(1, &[3, 4], &[b"!"]).unwrap());
        for split in 1..wire.len() {
            let mut d = Decoder::new(&WORDS);
            let mut got = Vec::new();
            for piece in [&wire[..split], &wire[split..]] {
                d.feed(piece);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(
                got,
                [frame(2, [1, 2], b"hello"), frame(1, [3, 4], b"!")],
                "split at {split}"
            );
            assert_eq!(d.buffered(), 0);
        }
        // Byte by byte through a blocking reader.
        struct OneByOne<'a>(&'a [u8]);
        impl Read for OneByOne<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(self.0.len()).min(1);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut r = OneByOne(&wire);
        assert_eq!(WORDS.read(&mut r).unwrap(), frame(2, [1, 2], b"hello"));
        assert_eq!(WORDS.read(&mut r).unwrap(), frame(1, [3, 4], b"!"));
    }
}
