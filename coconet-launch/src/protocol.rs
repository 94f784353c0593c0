//! The store's wire protocol: small, length-prefixed, binary.
//!
//! Written by hand rather than borrowed from a serialisation crate because it has six
//! requests and six answers, and because both ends must bound every allocation a peer can
//! ask for (a stray client that is not a store client must produce a clear error, never a
//! gigabyte allocation).
//!
//! # Framing
//!
//! Every message, in both directions, is one *frame* of coconet's frame codec
//! ([`coconet_trust::frame`], [`FORMAT`]): a `u32` little-endian length `n` followed by
//! `n` payload bytes, `n <= MAX_FRAME` (64 MiB). A payload starts with a
//! one-byte tag; the fields that follow use three encodings:
//!
//! - `u64` / `i64`: 8 bytes little-endian;
//! - `bytes`: a `u32` little-endian length, then that many bytes;
//! - `str`: `bytes` holding UTF-8.
//!
//! A payload must be consumed exactly: trailing bytes are a protocol error.
//!
//! # Requests (client → server)
//!
//! | tag | request  | fields                                    | answer                    |
//! |-----|----------|-------------------------------------------|---------------------------|
//! | 0   | Hello    | 4 bytes `CCNS`, `u64` version             | Ok, or Error              |
//! | 1   | Set      | `str` key, `bytes` value                  | Ok                        |
//! | 2   | Get      | `str` key, `u64` timeout (ms)             | Value, or Timeout         |
//! | 3   | Wait     | `u64` count, `count` × `str` key, `u64` timeout (ms) | Ok, or Timeout |
//! | 4   | Add      | `str` key, `i64` delta                    | Int, or Error             |
//! | 5   | TryGet   | `str` key                                 | Value, or Missing         |
//!
//! The first request on a connection must be Hello; the server answers Error and closes
//! the connection if the magic or the version differs.
//!
//! # Answers (server → client)
//!
//! | tag | answer  | fields                                   |
//! |-----|---------|------------------------------------------|
//! | 0   | Ok      |                                          |
//! | 1   | Value   | `bytes` value                            |
//! | 2   | Int     | `i64` the counter's new value            |
//! | 3   | Timeout | `str` the first key still missing        |
//! | 4   | Missing |                                          |
//! | 5   | Error   | `str` message                            |
//!
//! Get and Wait block *in the server* until the keys exist or their timeout passes, so a
//! waiting client costs no polling traffic. Add keeps a counter as its decimal text (so a
//! Get of a counter reads `b"3"`); Add on a value that is not such a number is an Error.

use coconet_trust::frame::{Format, Layout};
use std::fmt;
use std::io::{self, Read, Write};

/// The four bytes a client's Hello starts with.
pub(crate) const MAGIC: [u8; 4] = *b"CCNS";
/// The protocol version this build speaks.
pub(crate) const VERSION: u64 = 1;
/// The largest payload either side accepts (64 MiB).
pub(crate) const MAX_FRAME: usize = 64 << 20;

/// A client's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// Opens a connection.
    Hello { magic: [u8; 4], version: u64 },
    /// Stores `value` under `key`, replacing any earlier value.
    Set { key: String, value: Vec<u8> },
    /// The value of `key`, waiting up to `timeout_ms` for it to be set.
    Get { key: String, timeout_ms: u64 },
    /// Waits up to `timeout_ms` until every key exists.
    Wait { keys: Vec<String>, timeout_ms: u64 },
    /// Adds `delta` to the counter `key` (absent = 0) and answers its new value.
    Add { key: String, delta: i64 },
    /// The value of `key` if it exists now.
    TryGet { key: String },
    /// Removes `key`; answers whether it existed (`Int` 1 or 0).
    Delete { key: String },
}

/// The server's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Response {
    /// Done.
    Ok,
    /// A key's value.
    Value(Vec<u8>),
    /// A counter's new value.
    Int(i64),
    /// The wait ended with this key still missing.
    Timeout { missing: String },
    /// The key does not exist (TryGet).
    Missing,
    /// The request was refused.
    Error(String),
}

/// A malformed frame or payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProtocolError(pub(crate) String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Request {
    /// The payload of this request (without the frame's length prefix).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Request::Hello { magic, version } => {
                out.push(0);
                out.extend_from_slice(magic);
                put_u64(&mut out, *version);
            }
            Request::Set { key, value } => {
                out.push(1);
                put_bytes(&mut out, key.as_bytes());
                put_bytes(&mut out, value);
            }
            Request::Get { key, timeout_ms } => {
                out.push(2);
                put_bytes(&mut out, key.as_bytes());
                put_u64(&mut out, *timeout_ms);
            }
            Request::Wait { keys, timeout_ms } => {
                out.push(3);
                put_u64(&mut out, keys.len() as u64);
                for key in keys {
                    put_bytes(&mut out, key.as_bytes());
                }
                put_u64(&mut out, *timeout_ms);
            }
            Request::Add { key, delta } => {
                out.push(4);
                put_bytes(&mut out, key.as_bytes());
                out.extend_from_slice(&delta.to_le_bytes());
            }
            Request::TryGet { key } => {
                out.push(5);
                put_bytes(&mut out, key.as_bytes());
            }
            Request::Delete { key } => {
                out.push(6);
                put_bytes(&mut out, key.as_bytes());
            }
        }
        out
    }

    /// Parses a payload; every byte must be used (the server's side).
    #[cfg(any(feature = "launcher", test))]
    pub(crate) fn decode(payload: &[u8]) -> Result<Request, ProtocolError> {
        let mut r = Reader { buf: payload };
        let request = match r.u8("request tag")? {
            0 => {
                let magic = r.take(4, "magic")?;
                Request::Hello {
                    magic: [magic[0], magic[1], magic[2], magic[3]],
                    version: r.u64("version")?,
                }
            }
            1 => Request::Set {
                key: r.str("key")?,
                value: r.bytes("value")?.to_vec(),
            },
            2 => Request::Get {
                key: r.str("key")?,
                timeout_ms: r.u64("timeout")?,
            },
            3 => {
                let count = r.u64("key count")?;
                // Each key takes at least 4 bytes: a count beyond that is a lie.
                if count > (r.buf.len() / 4) as u64 {
                    return Err(ProtocolError(format!(
                        "Wait announces {count} keys in a {}-byte payload",
                        payload.len()
                    )));
                }
                let keys = (0..count)
                    .map(|_| r.str("key"))
                    .collect::<Result<Vec<_>, _>>()?;
                Request::Wait {
                    keys,
                    timeout_ms: r.u64("timeout")?,
                }
            }
            4 => Request::Add {
                key: r.str("key")?,
                delta: r.u64("delta")? as i64,
            },
            5 => Request::TryGet { key: r.str("key")? },
            6 => Request::Delete { key: r.str("key")? },
            tag => return Err(ProtocolError(format!("unknown request tag {tag}"))),
        };
        r.finish()?;
        Ok(request)
    }
}

impl Response {
    /// The payload of this answer (without the frame's length prefix; the server's side).
    #[cfg(any(feature = "launcher", test))]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Response::Ok => out.push(0),
            Response::Value(value) => {
                out.push(1);
                put_bytes(&mut out, value);
            }
            Response::Int(n) => {
                out.push(2);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Response::Timeout { missing } => {
                out.push(3);
                put_bytes(&mut out, missing.as_bytes());
            }
            Response::Missing => out.push(4),
            Response::Error(message) => {
                out.push(5);
                put_bytes(&mut out, message.as_bytes());
            }
        }
        out
    }

    /// Parses a payload; every byte must be used.
    pub(crate) fn decode(payload: &[u8]) -> Result<Response, ProtocolError> {
        let mut r = Reader { buf: payload };
        let response = match r.u8("answer tag")? {
            0 => Response::Ok,
            1 => Response::Value(r.bytes("value")?.to_vec()),
            2 => Response::Int(r.u64("counter")? as i64),
            3 => Response::Timeout {
                missing: r.str("missing key")?,
            },
            4 => Response::Missing,
            5 => Response::Error(r.str("message")?),
            tag => return Err(ProtocolError(format!("unknown answer tag {tag}"))),
        };
        r.finish()?;
        Ok(response)
    }
}

/// The store's frames (see the module's documentation), in coconet's one frame codec.
pub(crate) const FORMAT: Format = Format {
    peer: "store",
    layout: Layout::Prefix32,
    kinds: &[],
    max_body: MAX_FRAME,
};

/// Writes `payload` as one frame.
pub(crate) fn write_frame(w: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    FORMAT.write(w, 0, &[], &[payload])
}

/// Reads one frame's payload. A length above [`MAX_FRAME`] is an `InvalidData` error;
/// memory follows the bytes that arrive, not the length announced.
pub(crate) fn read_frame(r: &mut impl Read) -> io::Result<Vec<u8>> {
    Ok(FORMAT.read(r)?.body)
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    // Frames are capped at MAX_FRAME (< 4 GiB) when written, so the length fits.
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// A cursor over a payload that names the field it failed on.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ProtocolError> {
        if self.buf.len() < n {
            return Err(ProtocolError(format!(
                "truncated payload: {what} needs {n} bytes, {} left",
                self.buf.len()
            )));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &str) -> Result<u8, ProtocolError> {
        Ok(self.take(1, what)?[0])
    }

    fn u64(&mut self, what: &str) -> Result<u64, ProtocolError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn bytes(&mut self, what: &str) -> Result<&'a [u8], ProtocolError> {
        let b = self.take(4, what)?;
        let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        self.take(len, what)
    }

    fn str(&mut self, what: &str) -> Result<String, ProtocolError> {
        let b = self.bytes(what)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| ProtocolError(format!("{what} is not valid UTF-8")))
    }

    fn finish(&self) -> Result<(), ProtocolError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ProtocolError(format!(
                "{} unexpected bytes after the message",
                self.buf.len()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_answers_round_trip() {
        let requests = [
            Request::Hello {
                magic: MAGIC,
                version: VERSION,
            },
            Request::Set {
                key: "nccl/unique_id".into(),
                value: (0..=255).collect(),
            },
            Request::Get {
                key: "k".into(),
                timeout_ms: 1500,
            },
            Request::Wait {
                keys: vec!["a".into(), "".into(), "ü".into()],
                timeout_ms: u64::MAX,
            },
            Request::Add {
                key: "n".into(),
                delta: -7,
            },
            Request::TryGet { key: "x".into() },
        ];
        for request in requests {
            assert_eq!(Request::decode(&request.encode()), Ok(request));
        }
        let answers = [
            Response::Ok,
            Response::Value(vec![0, 1, 2]),
            Response::Int(i64::MIN),
            Response::Timeout {
                missing: "rank/3".into(),
            },
            Response::Missing,
            Response::Error("no".into()),
        ];
        for answer in answers {
            assert_eq!(Response::decode(&answer.encode()), Ok(answer));
        }
    }

    #[test]
    fn the_encoding_is_the_documented_one() {
        let set = Request::Set {
            key: "ab".into(),
            value: vec![9],
        };
        assert_eq!(set.encode(), vec![1, 2, 0, 0, 0, b'a', b'b', 1, 0, 0, 0, 9]);
        let mut frame = Vec::new();
        write_frame(&mut frame, &[7, 8]).unwrap();
        assert_eq!(frame, vec![2, 0, 0, 0, 7, 8]);
        assert_eq!(read_frame(&mut &frame[..]).unwrap(), vec![7, 8]);
    }

    #[test]
    fn malformed_payloads_are_errors_not_panics() {
        assert!(Request::decode(&[]).unwrap_err().0.contains("truncated"));
        assert!(Request::decode(&[42]).unwrap_err().0.contains("tag 42"));
        // A Set whose value claims 1000 bytes.
        let lying = [1, 1, 0, 0, 0, b'k', 0xe8, 0x03, 0, 0, 1];
        assert!(Request::decode(&lying).unwrap_err().0.contains("value"));
        // A Wait that announces 2^40 keys.
        let mut wait = vec![3];
        wait.extend_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(Request::decode(&wait).unwrap_err().0.contains("keys"));
        // Trailing bytes.
        let mut ok = Response::Ok.encode();
        ok.push(0);
        assert!(Response::decode(&ok).unwrap_err().0.contains("unexpected"));
        // Invalid UTF-8 in a key.
        let bad_key = [5, 1, 0, 0, 0, 0xff];
        assert!(Request::decode(&bad_key).unwrap_err().0.contains("UTF-8"));
        // An absurd frame length is refused before allocating.
        let huge = [0xff, 0xff, 0xff, 0xff];
        let err = read_frame(&mut &huge[..]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
