//! The bytes a rank publishes in the store so that processes on its machine can map its
//! buffers (CUDA IPC): for every buffer, which one it is and its 64-byte IPC handle.

use coconet_core::ValueId;
use coconet_plan::plan::BufferRef;

/// Bytes of a CUDA IPC memory handle.
pub const HANDLE_BYTES: usize = 64;

/// Bytes of one entry: a tag, the buffer's index, the handle.
const ENTRY: usize = 1 + 8 + HANDLE_BYTES;

/// One buffer and its handle.
pub type Entry = (BufferRef, [u8; HANDLE_BYTES]);

/// The entries as bytes.
pub fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY);
    for (b, handle) in entries {
        let (tag, index) = match *b {
            BufferRef::Input(v) => (0u8, u64::from(v.0)),
            BufferRef::Slot(s) => (1u8, s as u64),
        };
        out.push(tag);
        out.extend(index.to_le_bytes());
        out.extend(handle);
    }
    out
}

/// The entries back from [`encode`]'s bytes; an error says what is wrong with them.
pub fn decode(bytes: &[u8]) -> Result<Vec<Entry>, String> {
    if !bytes.len().is_multiple_of(ENTRY) {
        return Err(format!(
            "{} bytes is not a whole number of {ENTRY}-byte entries",
            bytes.len()
        ));
    }
    bytes
        .chunks_exact(ENTRY)
        .map(|e| {
            let index = u64::from_le_bytes(e[1..9].try_into().expect("eight bytes"));
            let b = match e[0] {
                0 => BufferRef::Input(ValueId(
                    u32::try_from(index).map_err(|_| format!("input index {index} too large"))?,
                )),
                1 => BufferRef::Slot(index as usize),
                t => return Err(format!("unknown buffer tag {t}")),
            };
            Ok((b, e[9..].try_into().expect("64 bytes")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let entries = vec![
            (BufferRef::Input(ValueId(3)), [7u8; HANDLE_BYTES]),
            (BufferRef::Slot(12), [255u8; HANDLE_BYTES]),
        ];
        assert_eq!(decode(&encode(&entries)).unwrap(), entries);
        assert_eq!(decode(&[]).unwrap(), vec![]);
    }

    #[test]
    fn damaged_bytes_are_errors() {
        let mut bytes = encode(&[(BufferRef::Slot(1), [0; HANDLE_BYTES])]);
        assert!(decode(&bytes[1..]).unwrap_err().contains("whole number"));
        bytes[0] = 9;
        assert!(decode(&bytes).unwrap_err().contains("unknown buffer tag 9"));
    }
}
