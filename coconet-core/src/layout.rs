//! How a logical tensor is stored on the ranks of its group.

use std::fmt;
use std::ops::Range;

/// Storage layout of a value across the ranks of its process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Every rank holds the whole tensor; all copies are bitwise identical.
    Replicated,
    /// Every rank holds a whole-shape tensor with its own values (gradients, partial sums).
    Local,
    /// Split along dim `d` into one contiguous block per rank (see [`block_range`]).
    Sliced(usize),
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Replicated => f.write_str("Replicated"),
            Layout::Local => f.write_str("Local"),
            Layout::Sliced(d) => write!(f, "Sliced({d})"),
        }
    }
}

/// The rows of a dim of length `len` held by rank `r` of `parts` ranks.
///
/// With `len = q·parts + rem`, ranks `r < rem` get `q + 1` rows and the others `q`, in rank
/// order; sizes need not divide, and a rank may hold zero rows when `len < parts`.
///
/// ```
/// use coconet_core::block_range;
/// // N = 10 over P = 4: blocks of 3, 3, 2, 2.
/// let blocks: Vec<_> = (0..4).map(|r| block_range(10, 4, r)).collect();
/// assert_eq!(blocks, vec![0..3, 3..6, 6..8, 8..10]);
/// ```
pub fn block_range(len: usize, parts: usize, r: usize) -> Range<usize> {
    let q = len / parts;
    let rem = len % parts;
    let start = r * q + r.min(rem);
    let size = q + usize::from(r < rem);
    start..start + size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_the_dim_in_order() {
        for len in 0..40 {
            for parts in 1..9 {
                let mut next = 0;
                for r in 0..parts {
                    let b = block_range(len, parts, r);
                    assert_eq!(b.start, next);
                    assert!(b.len() == len / parts || b.len() == len / parts + 1);
                    next = b.end;
                }
                assert_eq!(next, len);
            }
        }
    }
}
