//! Click logs in the Criteo text format, the data CTR-DNN is defined on.
//!
//! One ad impression per line, 40 tab-separated fields: the click label (`0`/`1`), 13
//! integer count features (`I1`..`I13`) and 26 categorical features (`C1`..`C26`, 32-bit
//! hashes written as 8 hex digits); any feature may be empty (missing). Why this format
//! and not Parquet: it is what the Criteo click logs and PaddleRec's CTR-DNN reader use,
//! it streams line by line with errors that name a line, and it needs no columnar
//! dependency (arrow/parquet add minutes to every clean build).
//!
//! Parsing follows PaddleRec: a categorical value is hashed together with its slot into
//! one shared embedding table of [`ClickLogFormat::vocabulary`] rows (a missing value
//! gets its slot's own "missing" row), and a count `x` becomes `ln(1 + max(x, 0))`
//! (missing counts are 0).

use std::fmt::Write as _;

/// Integer count features per record.
pub const DENSE_FEATURES: usize = 13;
/// Categorical features per record (embedding lookups).
pub const SPARSE_SLOTS: usize = 26;
/// Fields per line: the label, the counts, the categories.
const FIELDS: usize = 1 + DENSE_FEATURES + SPARSE_SLOTS;

/// How a line's fields become model inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClickLogFormat {
    /// Rows of the shared embedding table the categories are hashed into.
    pub vocabulary: u64,
}

impl Default for ClickLogFormat {
    /// PaddleRec's CTR-DNN table: 1,000,001 rows.
    fn default() -> Self {
        ClickLogFormat {
            vocabulary: 1_000_001,
        }
    }
}

/// Records parsed into the arrays a model reads, row-major.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// Click labels, 0.0 or 1.0, one per record.
    pub labels: Vec<f32>,
    /// `ln(1 + count)`, [`DENSE_FEATURES`] per record.
    pub dense: Vec<f32>,
    /// Embedding-table keys, [`SPARSE_SLOTS`] per record.
    pub keys: Vec<u64>,
}

impl Batch {
    /// Records in the batch.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the batch has no record.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The records `range` of the batch, as a batch of their own.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Batch {
        Batch {
            labels: self.labels[range.clone()].to_vec(),
            dense: self.dense[range.start * DENSE_FEATURES..range.end * DENSE_FEATURES].to_vec(),
            keys: self.keys[range.start * SPARSE_SLOTS..range.end * SPARSE_SLOTS].to_vec(),
        }
    }

    /// The batch cut into `parts` consecutive batches whose sizes differ by at most one
    /// (a global batch dealt to data-parallel workers).
    pub fn split(&self, parts: usize) -> Vec<Batch> {
        let parts = parts.max(1);
        let (n, mut start) = (self.len(), 0);
        (0..parts)
            .map(|p| {
                let size = n / parts + usize::from(p < n % parts);
                start += size;
                self.slice(start - size..start)
            })
            .collect()
    }

    /// An empty batch with room for `records`.
    pub fn with_capacity(records: usize) -> Batch {
        Batch {
            labels: Vec::with_capacity(records),
            dense: Vec::with_capacity(records * DENSE_FEATURES),
            keys: Vec::with_capacity(records * SPARSE_SLOTS),
        }
    }
}

/// FNV-1a: a hash that is the same on every machine and Rust version (the keys of a
/// checkpointed table must not change under it).
fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325 ^ seed;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl ClickLogFormat {
    /// The table key of categorical value `value` (empty: missing) in slot `slot`.
    pub fn key(&self, slot: usize, value: &str) -> u64 {
        fnv1a(slot as u64 + 1, value.as_bytes()) % self.vocabulary.max(1)
    }

    /// Parses one line (without its newline) and appends the record to `batch`; on an
    /// error `batch` is unchanged and the message says which field is wrong.
    pub fn parse_line(&self, line: &str, batch: &mut Batch) -> Result<(), String> {
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() != FIELDS {
            return Err(format!(
                "expected {FIELDS} tab-separated fields (label, {DENSE_FEATURES} counts, {SPARSE_SLOTS} categories), found {}",
                fields.len()
            ));
        }
        let label = match fields[0] {
            "0" => 0.0,
            "1" => 1.0,
            other => return Err(format!("label must be 0 or 1, found {other:?}")),
        };
        let mut dense = [0f32; DENSE_FEATURES];
        for (j, (d, f)) in dense
            .iter_mut()
            .zip(&fields[1..=DENSE_FEATURES])
            .enumerate()
        {
            if !f.is_empty() {
                let x: i64 = f
                    .parse()
                    .map_err(|_| format!("count I{} must be an integer, found {f:?}", j + 1))?;
                *d = (x.max(0) as f64).ln_1p() as f32;
            }
        }
        let mut keys = [0u64; SPARSE_SLOTS];
        for (s, (k, f)) in keys
            .iter_mut()
            .zip(&fields[1 + DENSE_FEATURES..])
            .enumerate()
        {
            if !f.is_empty() && (f.len() > 16 || !f.bytes().all(|b| b.is_ascii_hexdigit())) {
                return Err(format!(
                    "category C{} must be hex digits, found {f:?}",
                    s + 1
                ));
            }
            *k = self.key(s, f);
        }
        batch.labels.push(label);
        batch.dense.extend_from_slice(&dense);
        batch.keys.extend_from_slice(&keys);
        Ok(())
    }
}

/// Appends one record as a line (with its newline): `counts` and `categories` may be
/// missing (`None`, written as an empty field).
pub fn write_record(
    out: &mut String,
    click: bool,
    counts: &[Option<i64>; DENSE_FEATURES],
    categories: &[Option<u32>; SPARSE_SLOTS],
) {
    out.push(if click { '1' } else { '0' });
    for c in counts {
        out.push('\t');
        if let Some(c) = c {
            let _ = write!(out, "{c}");
        }
    }
    for c in categories {
        out.push('\t');
        if let Some(c) = c {
            let _ = write!(out, "{c:08x}");
        }
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line() -> String {
        let mut out = String::new();
        let mut counts = [Some(3); DENSE_FEATURES];
        counts[2] = None;
        counts[4] = Some(-1);
        let mut cats = [Some(0xdead_beef); SPARSE_SLOTS];
        cats[7] = None;
        write_record(&mut out, true, &counts, &cats);
        out
    }

    #[test]
    fn a_written_record_parses_back() {
        let text = line();
        assert!(text.ends_with('\n'));
        let fmt = ClickLogFormat { vocabulary: 97 };
        let mut b = Batch::default();
        fmt.parse_line(text.trim_end(), &mut b).unwrap();
        assert_eq!(b.labels, [1.0]);
        assert_eq!(b.dense[0], (4f64).ln() as f32);
        assert_eq!(b.dense[2], 0.0, "missing count");
        assert_eq!(b.dense[4], 0.0, "negative count clamps to 0");
        assert_eq!(b.keys[0], fmt.key(0, "deadbeef"));
        assert_eq!(
            b.keys[7],
            fmt.key(7, ""),
            "missing category: its slot's own row"
        );
        assert!(b.keys.iter().all(|&k| k < 97));
        let mut five = Batch::default();
        for _ in 0..5 {
            fmt.parse_line(text.trim_end(), &mut five).unwrap();
        }
        let parts = five.split(2);
        assert_eq!((parts[0].len(), parts[1].len()), (3, 2));
        assert_eq!(parts[1], five.slice(3..5));
        assert_eq!(parts[1].slice(1..2), b, "every record is the one parsed");
        assert_eq!(five.split(7).iter().map(Batch::len).sum::<usize>(), 5);
        // The same value in two slots is two rows (almost surely, with 1,000,001 rows).
        let big = ClickLogFormat::default();
        assert_ne!(big.key(0, "deadbeef"), big.key(1, "deadbeef"));
    }

    #[test]
    fn malformed_lines_say_which_field() {
        let fmt = ClickLogFormat::default();
        let mut b = Batch::default();
        let good = line();
        let good = good.trim_end();
        let cases = [
            ("1\t2".to_string(), "expected 40 tab-separated fields"),
            (good.replacen('1', "2", 1), "label must be 0 or 1"),
            (
                good.replacen("\t3\t", "\tx\t", 1),
                "count I1 must be an integer",
            ),
            (
                good.replacen("deadbeef", "nothex!!", 1),
                "category C1 must be hex",
            ),
        ];
        for (text, want) in cases {
            let e = fmt.parse_line(&text, &mut b).unwrap_err();
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        }
        assert!(b.is_empty(), "a bad line appends nothing");
    }
}
