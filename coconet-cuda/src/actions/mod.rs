//! The action list: what one rank does, in order — host scalars, kernel launches over
//! position ranges, matmul rows, transfers posted as groups, and the events between the
//! streams. It is the CUDA path's central data structure: the exchanged and the mapped
//! planners build it ([`crate::actions::exchanged`], [`crate::actions::mapped`]), the stream race
//! check replays it ([`crate::actions::stream_check`]), and every executor runs it. Here too: the
//! memory regions each action touches, which the planners and the check both reason on.

pub(crate) mod exchanged;
pub(crate) mod mapped;
#[cfg(debug_assertions)]
pub(crate) mod stream_check;

use crate::codegen::{Arg, Launch, MatMul, PtrArg, PtrUse};
use crate::devices::Device;
use coconet_core::{ValueId, block_range};
use coconet_plan::RuntimeError;
use coconet_plan::plan::{BufferRef, Plan};
use std::collections::HashMap;

/// Where a transfer's bytes are on this rank.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place {
    /// In one of the rank's buffers, at a byte offset.
    Own(BufferRef, usize),
    /// In the staging buffer, at a byte offset.
    Staging(usize),
}

/// One transfer of an exchange, as this rank sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Move {
    pub peer: usize,
    pub place: Place,
    pub bytes: usize,
}

/// One thing a rank does, in order.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// Computes these host scalars.
    Uniform(Vec<ValueId>),
    /// Posts these transfers as one group on the transfers' stream.
    Exchange {
        sends: Vec<Move>,
        recvs: Vec<Move>,
        at: String,
    },
    /// Launches a kernel over positions `lo..hi`.
    Launch {
        launch: Launch,
        lo: usize,
        hi: usize,
        /// Staging byte offset of element `lo` of pointer `k` of argument `a`, for
        /// pointers into peers' memory.
        staged: HashMap<(usize, usize), usize>,
    },
    /// Later transfers wait for the kernels launched so far.
    TransfersWaitKernels,
    /// Later kernels wait for the transfers posted so far.
    KernelsWaitTransfers,
    /// Later matmuls wait for the kernels launched so far.
    WaitKernels,
    /// Rows of a matmul.
    Gemm(MatMul, std::ops::Range<usize>),
    /// Later kernels wait for the matmuls so far.
    BlockDone,
    /// Every rank's kernels so far finish before any rank's later kernels start (ranks
    /// whose kernels address each other's memory directly).
    Barrier,
}

impl Action {
    /// Places the events between the device's streams that this action stands for
    /// (nothing for other actions). Both executors order their streams through it.
    pub(crate) fn order_streams<D: Device>(&self, device: &D) -> Result<(), RuntimeError> {
        match self {
            Action::TransfersWaitKernels => device.transfers_wait_kernels(),
            Action::KernelsWaitTransfers => device.kernels_wait_transfers(),
            Action::WaitKernels => device.wait_kernels(),
            Action::BlockDone => {
                device.block_done()?;
                device.wait_block()
            }
            _ => Ok(()),
        }
    }
}

/// A region of a rank's memory a launch touches: (rank, buffer — `None` for the
/// scratch —, elements `start..end`).
pub(crate) type Region = (usize, Option<BufferRef>, usize, usize);

fn whole(rank: usize, buffer: Option<BufferRef>) -> Region {
    (rank, buffer, 0, usize::MAX)
}

/// Every memory access of launch `l` over `lo..hi`: (argument, pointer of the
/// argument, region, whether it writes).
pub(crate) fn accesses(l: &Launch, lo: usize, hi: usize) -> Vec<(usize, usize, Region, bool)> {
    let mut out = vec![];
    let at = |p: &PtrArg| (p.rank, Some(p.buffer), p.offset + lo, p.offset + hi);
    for (a, arg) in l.args.iter().enumerate() {
        match arg {
            Arg::Reads(ps) => out.extend(ps.iter().enumerate().map(|(k, p)| (a, k, at(p), false))),
            Arg::Writes(ps) => out.extend(ps.iter().enumerate().map(|(k, p)| (a, k, at(p), true))),
            Arg::Ptr(p, f) => match f {
                PtrUse::ReadsAt => out.push((a, 0, at(p), false)),
                PtrUse::WritesAt => out.push((a, 0, at(p), true)),
                PtrUse::ReadsFixed(n) => out.push((
                    a,
                    0,
                    (p.rank, Some(p.buffer), p.offset, p.offset + n),
                    false,
                )),
                PtrUse::Any => {
                    out.push((a, 0, whole(p.rank, Some(p.buffer)), false));
                    out.push((a, 0, whole(p.rank, Some(p.buffer)), true));
                }
            },
            Arg::Scratch { rank, .. } => {
                out.push((a, 0, whole(*rank, None), false));
                out.push((a, 0, whole(*rank, None), true));
            }
            Arg::Range | Arg::I64(_) | Arg::Uniform(_) => {}
        }
    }
    out
}

/// The regions launch `l` over `lo..hi` reads and writes.
pub(crate) fn regions(l: &Launch, lo: usize, hi: usize) -> (Vec<Region>, Vec<Region>) {
    let (mut reads, mut writes) = (vec![], vec![]);
    for (_, _, r, w) in accesses(l, lo, hi) {
        if w { &mut writes } else { &mut reads }.push(r);
    }
    (reads, writes)
}

/// The regions rows `rows` of matmul `m` read (its operands) and write (its result).
pub(crate) fn gemm_accesses(m: &MatMul, rows: &std::ops::Range<usize>) -> [(Region, bool); 3] {
    let region = |p: &PtrArg, start: usize, end: usize| {
        (m.rank, Some(p.buffer), p.offset + start, p.offset + end)
    };
    [
        (region(&m.a, rows.start * m.k, rows.end * m.k), false),
        (region(&m.b, 0, m.k * m.n), false),
        (region(&m.out, rows.start * m.n, rows.end * m.n), true),
    ]
}

pub(crate) fn overlaps(a: &Region, b: &Region) -> bool {
    a.0 == b.0 && a.1 == b.1 && a.2 < b.3 && b.2 < a.3
}

/// Bytes per element of buffer `b`.
pub(crate) fn buffer_size(plan: &Plan, b: BufferRef) -> usize {
    plan.buffer_dtype(b).size_bytes()
}

/// Block `c` of an overlap step: the first-dim rows its matmuls compute, and for each
/// fused launch the positions `lo..hi` of its own that those rows finish (`lo == hi`
/// where none).
pub(crate) fn overlap_block(
    matmuls: &[MatMul],
    blocks: usize,
    fused: &[Launch],
    rows: &[(usize, usize)],
    c: usize,
) -> (std::ops::Range<usize>, Vec<(usize, usize)>) {
    let first = matmuls
        .first()
        .map(|m| m.m / m.rows_per_block.max(1))
        .unwrap_or(0);
    let r = block_range(first, blocks, c);
    let positions = fused
        .iter()
        .zip(rows)
        .map(|(l, &(start_row, inner))| {
            let rows_mine = l.hi / inner.max(1);
            let lo = r.start.clamp(start_row, start_row + rows_mine) - start_row;
            let hi = r.end.clamp(start_row, start_row + rows_mine) - start_row;
            (lo * inner, hi.max(lo) * inner)
        })
        .collect();
    (r, positions)
}
