//! How an overlapped matmul hands its output to the fused all-reduce: in pieces of rows,
//! computed in an order that feeds every rank's block at once.
//!
//! Each rank's fused all-reduce reduces one block of the output's first dim. A piece is
//! a run of the product's rows (the matmul seen as 2-D) inside one first-dim index, so
//! no piece straddles two blocks; every rank computes its pieces round-robin over the
//! blocks (each block's first piece, then each block's second, ...), so every rank's
//! reduction can start after one piece per block and keeps pace with the matmul. Once the
//! matmul is done, what is left is each block's last piece ([`Pieces::per_block`] of
//! them in a block).

use coconet_core::block_range;
use coconet_core::numerics::tensor::numel;
use std::ops::Range;

/// Pieces a rank's block is split into where it has fewer first-dim indices (each index
/// split into equal runs of rows, fewer where it has fewer rows); a block of more
/// indices has a piece per index. More pieces shorten what is left after the matmul;
/// each costs a flag and a wake-up.
pub const PIECES_PER_BLOCK: usize = 4;

/// The pieces of one overlapped matmul's output (`[d0, ..., n]`) on a group of `q`
/// ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pieces {
    /// The first dim.
    first: usize,
    /// Product rows per first-dim index (the middle dims).
    rows_per_index: usize,
    /// Product rows per piece (the last piece of an index may be shorter).
    rows_per_piece: usize,
    /// Pieces per first-dim index.
    split: usize,
    /// Ranks sharing the first dim's blocks.
    q: usize,
}

impl Pieces {
    /// The pieces of a matmul whose output has logical shape `shape`, reduced by `q`
    /// ranks.
    pub fn new(shape: &[usize], q: usize) -> Pieces {
        let first = shape.first().copied().unwrap_or(1);
        let rows_per_index = match shape.len() {
            0 | 1 => 1,
            l => numel(&shape[1..l - 1]),
        };
        let indices_per_block = first.div_ceil(q.max(1)).max(1);
        let wanted = PIECES_PER_BLOCK.div_ceil(indices_per_block);
        let split = wanted.clamp(1, rows_per_index.max(1));
        let rows_per_piece = rows_per_index.div_ceil(split).max(1);
        Pieces {
            first,
            rows_per_index,
            rows_per_piece,
            split: rows_per_index.div_ceil(rows_per_piece).max(1),
            q: q.max(1),
        }
    }

    /// Flags one rank raises (one per piece).
    pub fn count(&self) -> usize {
        self.first * self.split
    }

    /// The product rows of piece `id`.
    pub fn rows(&self, id: usize) -> Range<usize> {
        let (index, s) = (id / self.split, id % self.split);
        let start = index * self.rows_per_index + s * self.rows_per_piece;
        let end = (start + self.rows_per_piece).min((index + 1) * self.rows_per_index);
        start..end
    }

    /// The piece holding product row `row`.
    pub fn of_row(&self, row: usize) -> usize {
        let per_index = self.rows_per_index.max(1); // (an empty middle dim has no rows)
        (row / per_index) * self.split + (row % per_index) / self.rows_per_piece
    }

    /// Every piece, in the order a rank computes them: round-robin over the blocks.
    pub fn order(&self) -> Vec<usize> {
        let blocks: Vec<Range<usize>> = (0..self.q)
            .map(|j| {
                let b = block_range(self.first, self.q, j);
                b.start * self.split..b.end * self.split
            })
            .collect();
        let longest = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
        (0..longest)
            .flat_map(|t| {
                blocks
                    .iter()
                    .filter(move |b| t < b.len())
                    .map(move |b| b.start + t)
            })
            .collect()
    }

    /// Pieces in the largest block (0 where the first dim is empty): the reduction left
    /// after the matmul is about one of them.
    pub fn per_block(&self) -> usize {
        self.first.div_ceil(self.q) * self.split
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces tile every first-dim index's rows exactly, never straddle two indices,
    /// `of_row` inverts `rows`, and the order visits every piece once, alternating
    /// between blocks.
    #[test]
    fn pieces_tile_the_rows_and_alternate_between_blocks() {
        for (shape, q) in [
            (vec![8, 128, 1024], 2),
            (vec![8, 64, 512], 4),
            (vec![4, 16, 128], 4),
            (vec![5, 3, 7], 2),
            (vec![3, 7], 4),
            (vec![2, 1, 1, 9], 2),
        ] {
            let p = Pieces::new(&shape, q);
            let rows = shape[0] * numel(&shape[1..shape.len() - 1]);
            let mut next = 0;
            for id in 0..p.count() {
                let r = p.rows(id);
                assert_eq!(r.start, next, "{shape:?}: piece {id}");
                assert!(!r.is_empty(), "{shape:?}: piece {id} is empty");
                assert_eq!(
                    r.start / p.rows_per_index,
                    (r.end - 1) / p.rows_per_index,
                    "{shape:?}: piece {id} straddles two indices"
                );
                for row in r.clone() {
                    assert_eq!(p.of_row(row), id);
                }
                next = r.end;
            }
            assert_eq!(next, rows, "{shape:?}");
            let order = p.order();
            let mut sorted = order.clone();
            sorted.sort();
            assert_eq!(sorted, (0..p.count()).collect::<Vec<_>>(), "{shape:?}");
            // The first q pieces computed are the first piece of each block.
            let firsts: Vec<usize> = (0..q)
                .map(|j| block_range(shape[0], q, j))
                .filter(|b| !b.is_empty())
                .map(|b| b.start * p.split)
                .collect();
            assert_eq!(order[..firsts.len()], firsts[..], "{shape:?}");
            assert!(p.per_block() < 2 * PIECES_PER_BLOCK, "{shape:?}");
        }
        // [8, 128, 1024] on 2 ranks: 4 indices per block, each index a piece.
        let p = Pieces::new(&[8, 128, 1024], 2);
        assert_eq!((p.split, p.rows_per_piece, p.per_block()), (1, 128, 4));
        // [4, 16, 128] on 4 ranks: 1 index per block, split in 4 pieces of 4 rows.
        let p = Pieces::new(&[4, 16, 128], 4);
        assert_eq!((p.split, p.rows_per_piece, p.per_block()), (4, 4, 4));
        assert_eq!(p.order()[..5], [0, 4, 8, 12, 1]);
    }
}
