//! Reading what a peer announces: memory follows the bytes that arrived.
//!
//! A frame's header says how many bytes follow. Allocating that at once lets one 48-byte
//! header make a process zero-fill and keep gigabytes it will never receive; reading
//! into a buffer that grows as the bytes come (doubling, from 64 KiB) holds at most about
//! twice what the peer actually sent.

use std::io::{self, Read};

/// The first piece of an announced payload read before the buffer grows.
const FIRST: usize = 64 << 10;

/// Reads the `len` bytes a peer announced, growing the buffer as they arrive; a buffer
/// the process cannot hold is an `OutOfMemory` error, not an abort.
pub fn read_announced(r: &mut impl Read, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    while buf.len() < len {
        let start = buf.len();
        let piece = next_piece(start, len);
        grow(&mut buf, piece)?;
        r.read_exact(&mut buf[start..])?;
    }
    Ok(buf)
}

/// How many bytes the next piece of an announced payload of `len` bytes takes, `have`
/// of them read (for readers that are not [`Read`], e.g. async ones).
pub fn next_piece(have: usize, len: usize) -> usize {
    (len - have.min(len)).min(have.max(FIRST))
}

/// Extends `buf` by `piece` zero bytes, or says it cannot.
pub fn grow(buf: &mut Vec<u8>, piece: usize) -> io::Result<()> {
    buf.try_reserve(piece).map_err(|_| {
        io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("{piece} more bytes of a message do not fit in memory"),
        )
    })?;
    buf.resize(buf.len() + piece, 0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that yields `n` bytes and then ends.
    struct Trickle(usize);

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.0);
            buf[..n].fill(7);
            self.0 -= n;
            Ok(n)
        }
    }

    #[test]
    fn the_bytes_announced_arrive_whole() {
        let got = read_announced(&mut Trickle(300_000), 300_000).unwrap();
        assert_eq!(got.len(), 300_000);
        assert!(got.iter().all(|&b| b == 7));
        assert!(read_announced(&mut Trickle(0), 0).unwrap().is_empty());
    }

    #[test]
    fn a_huge_announcement_costs_only_what_arrived() {
        // 16 GiB announced, 100 KiB sent: an error, with at most ~2x what arrived held.
        let mut r = Trickle(100 << 10);
        let mut buf = Vec::new();
        let len = 16usize << 30;
        while buf.len() < len {
            let start = buf.len();
            grow(&mut buf, next_piece(start, len)).unwrap();
            if r.read_exact(&mut buf[start..]).is_err() {
                break;
            }
        }
        assert!(
            buf.capacity() <= 4 * (100 << 10),
            "{} bytes held",
            buf.capacity()
        );
        assert_eq!(
            read_announced(&mut Trickle(100 << 10), len)
                .unwrap_err()
                .kind(),
            io::ErrorKind::UnexpectedEof
        );
    }
}
