//! What one rank of a job with separate memories does, in order: which launches of the
//! virtual-rank program are its own, which exchanges stage its peers' regions before
//! them and send its results after them, and how they are ordered between the kernels'
//! stream and the transfers' stream.
//!
//! Launches of a step are grouped into *phases*: a launch that reads or overwrites what
//! an earlier launch of the phase writes starts a new phase (the copy after a fused
//! all-reduce reads what peers' fused kernels wrote); within a phase all reads of peers'
//! memory happen first, then the kernels, then all writes into peers' memory.
//!
//! A large phase is *pipelined*: its positions are cut into chunks, and while the
//! kernels of chunk c run, the transfers' stream sends the results of chunk c − 1 and
//! stages the sources of chunk c + 1 (the chunked NCCL path of a fused all-reduce:
//! reduce-scatter-like exchange → fused kernel → all-gather-like exchange, overlapped).
//! A phase is cut only where the chunks touch disjoint memory — checked on the regions
//! every launch reads and writes — so reordering them cannot change a result.
//!
//! Every rank derives the whole sequence from the whole program (which every process
//! generates identically), so each send meets the matching receive in order.

use crate::actions::{Action, Move, Place, Region, buffer_size, overlap_block, overlaps, regions};
use crate::codegen::{Arg, CudaProgram, GpuStep, Launch, MatMul, Mode, PtrUse};
use coconet_core::ValueId;
use coconet_plan::RuntimeError;
use coconet_plan::plan::{BufferRef, Plan};
use std::collections::HashMap;

/// How a rank cuts the exchanges of a large phase into chunks that overlap its kernels.
///
/// ```
/// use coconet_cuda::Pipelining;
/// // The default: chunks of about 4 MiB per transfer, at most 16 per phase.
/// assert_eq!(Pipelining::default().chunk_bytes, 4 << 20);
/// // No pipelining: exchange, kernels, exchange, one after another.
/// assert_eq!(Pipelining::OFF.max_chunks, 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pipelining {
    /// Bytes a chunk's largest transfer aims at (NCCL moves small messages slowly, so
    /// chunks stay large).
    pub chunk_bytes: usize,
    /// The most chunks a phase is cut into.
    pub max_chunks: usize,
}

impl Pipelining {
    /// One chunk per phase: exchange, kernels, exchange, in sequence.
    pub const OFF: Pipelining = Pipelining {
        chunk_bytes: usize::MAX,
        max_chunks: 1,
    };
}

impl Default for Pipelining {
    /// 4 MiB per transfer, at most 16 chunks. Not yet tuned on a GPU.
    fn default() -> Self {
        Pipelining {
            chunk_bytes: 4 << 20,
            max_chunks: 16,
        }
    }
}

/// A launch over positions `lo..hi`.
type Item = (Launch, usize, usize);

/// Splits launches into phases: a launch starts a new phase when it reads or writes a
/// region an earlier launch of the phase writes.
fn phases(items: Vec<Item>) -> Vec<Vec<Item>> {
    let mut out: Vec<Vec<Item>> = vec![];
    let mut written: Vec<Region> = vec![];
    for (l, lo, hi) in items {
        let (reads, writes) = regions(&l, lo, hi);
        let conflict = reads
            .iter()
            .chain(&writes)
            .any(|r| written.iter().any(|w| overlaps(r, w)));
        if conflict || out.is_empty() {
            out.push(vec![]);
            written.clear();
        }
        written.extend(writes);
        out.last_mut().expect("a phase").push((l, lo, hi));
    }
    out
}

/// The positions a chunk boundary of `l` must be a multiple of (from `lo`), or `None`
/// when its positions cannot be cut (block-level and single-thread kernels, or memory
/// it may touch anywhere).
fn granule(l: &Launch) -> Option<usize> {
    let anywhere = l
        .args
        .iter()
        .any(|a| matches!(a, Arg::Ptr(_, PtrUse::Any) | Arg::Scratch { .. }));
    match l.mode {
        _ if anywhere => None,
        // A multiple of four keeps vector loads aligned from chunk to chunk.
        Mode::Elements | Mode::Vector => Some(256),
        Mode::Rows(h) => Some(h.max(1)),
        Mode::Threads(_) | Mode::Blocks => None,
    }
}

/// The chunks phase `items` is cut into: each launch's positions in `chunks` slices
/// (some possibly empty), all slices `c` forming chunk `c`. One chunk when the phase is
/// small, a launch cannot be cut, or the chunks would touch the same memory.
fn chunks(plan: &Plan, items: &[Item], pipelining: Pipelining) -> Vec<Vec<Item>> {
    let one = || vec![items.to_vec()];
    let mut bytes = 0usize;
    let mut granules = vec![];
    for (l, lo, hi) in items {
        let Some(g) = granule(l) else { return one() };
        granules.push(g);
        for a in &l.args {
            if let Arg::Reads(ps) | Arg::Writes(ps) = a {
                for p in ps.iter().filter(|p| p.rank != l.rank) {
                    bytes = bytes.max((hi - lo) * buffer_size(plan, p.buffer));
                }
            }
        }
    }
    let n = bytes
        .div_ceil(pipelining.chunk_bytes.max(1))
        .clamp(1, pipelining.max_chunks.max(1));
    if n == 1 {
        return one();
    }
    let mut out = vec![vec![]; n];
    for ((l, lo, hi), g) in items.iter().zip(granules) {
        let len = (hi - lo).div_ceil(n).next_multiple_of(g).max(g);
        for (c, chunk) in out.iter_mut().enumerate() {
            let (a, b) = ((lo + c * len).min(*hi), (lo + (c + 1) * len).min(*hi));
            if b > a {
                chunk.push((l.clone(), a, b));
            }
        }
    }
    if independent(&out) { out } else { one() }
}

/// Whether no chunk writes memory another chunk reads or writes (so chunks may run in
/// any order, and overlap).
fn independent(chunks: &[Vec<Item>]) -> bool {
    // Per (rank, buffer): (start, end, chunk, writes), swept in start order.
    type Access = (usize, usize, usize, bool);
    let mut by_memory: HashMap<(usize, Option<BufferRef>), Vec<Access>> = HashMap::new();
    for (c, items) in chunks.iter().enumerate() {
        for (l, lo, hi) in items {
            let (reads, writes) = regions(l, *lo, *hi);
            for (r, w) in reads
                .iter()
                .map(|r| (r, false))
                .chain(writes.iter().map(|r| (r, true)))
            {
                by_memory
                    .entry((r.0, r.1))
                    .or_default()
                    .push((r.2, r.3, c, w));
            }
        }
    }
    by_memory.into_values().all(|mut v| {
        v.sort_unstable();
        (0..v.len()).all(|i| {
            v[i + 1..]
                .iter()
                .take_while(|o| o.0 < v[i].1)
                .all(|o| o.2 == v[i].2 || !(o.3 || v[i].3))
        })
    })
}

/// One chunk of a phase as rank `me` runs it: transfers before, its launches, transfers
/// after.
#[derive(Default)]
struct Piece {
    pre: (Vec<Move>, Vec<Move>),
    launches: Vec<Action>,
    post: (Vec<Move>, Vec<Move>),
}

/// Rank `me`'s part of chunk `items`; staging space is taken from `used` on.
fn piece(
    plan: &Plan,
    items: Vec<Item>,
    me: usize,
    at: &str,
    used: &mut usize,
) -> Result<Piece, RuntimeError> {
    let mut p = Piece::default();
    for (l, lo, hi) in items {
        let mut staged = HashMap::new();
        for (a, arg) in l.args.iter().enumerate() {
            let (ps, write) = match arg {
                Arg::Reads(ps) => (ps, false),
                Arg::Writes(ps) => (ps, true),
                Arg::Ptr(ptr, _) if ptr.rank != l.rank => {
                    return Err(RuntimeError::Plan(format!(
                        "{at}: a kernel of rank {} reads rank {}'s memory through a single \
                         pointer; only pointer arrays can be exchanged",
                        l.rank, ptr.rank
                    )));
                }
                _ => continue,
            };
            for (k, ptr) in ps.iter().enumerate() {
                let size = buffer_size(plan, ptr.buffer);
                let bytes = hi.saturating_sub(lo) * size;
                if ptr.rank == l.rank || bytes == 0 {
                    continue;
                }
                if l.rank == me {
                    // 16-byte aligned, so vector loads stay possible.
                    let off = used.next_multiple_of(16);
                    *used = off + bytes;
                    staged.insert((a, k), off);
                    let m = Move {
                        peer: ptr.rank,
                        place: Place::Staging(off),
                        bytes,
                    };
                    if write { &mut p.post.0 } else { &mut p.pre.1 }.push(m);
                } else if ptr.rank == me {
                    let m = Move {
                        peer: l.rank,
                        place: Place::Own(ptr.buffer, (ptr.offset + lo) * size),
                        bytes,
                    };
                    if write { &mut p.post.1 } else { &mut p.pre.0 }.push(m);
                }
            }
        }
        if l.rank == me {
            p.launches.push(Action::Launch {
                launch: l,
                lo,
                hi,
                staged,
            });
        }
    }
    Ok(p)
}

/// Appends an exchange (when it moves anything); returns whether it did.
fn exchange(out: &mut Vec<Action>, (sends, recvs): (Vec<Move>, Vec<Move>), at: &str) -> bool {
    if sends.is_empty() && recvs.is_empty() {
        return false;
    }
    out.push(Action::Exchange {
        sends,
        recvs,
        at: at.to_string(),
    });
    true
}

/// Appends the pieces of one phase, pipelined: while chunk c's kernels run, the
/// transfers' stream sends chunk c − 1's results and stages chunk c + 1's sources.
fn pipeline(out: &mut Vec<Action>, pieces: Vec<Piece>, at: &str) {
    let exchanges = pieces.iter().any(|p| {
        !(p.pre.0.is_empty() && p.pre.1.is_empty() && p.post.0.is_empty() && p.post.1.is_empty())
    });
    if !exchanges {
        out.extend(pieces.into_iter().flat_map(|p| p.launches));
        return;
    }
    // Transfers read and write memory the phase's earlier kernels used.
    out.push(Action::TransfersWaitKernels);
    let mut pieces = pieces;
    let n = pieces.len();
    let pre0 = std::mem::take(&mut pieces[0].pre);
    if exchange(out, pre0, at) {
        out.push(Action::KernelsWaitTransfers);
    }
    for c in 0..n {
        out.append(&mut pieces[c].launches);
        if c + 1 < n {
            let pre = std::mem::take(&mut pieces[c + 1].pre);
            if exchange(out, pre, at) {
                out.push(Action::KernelsWaitTransfers);
            }
        }
        let post = std::mem::take(&mut pieces[c].post);
        if !(post.0.is_empty() && post.1.is_empty()) {
            out.push(Action::TransfersWaitKernels);
            exchange(out, post, at);
        }
    }
    // Later kernels read what came in, and may overwrite what went out.
    out.push(Action::KernelsWaitTransfers);
}

/// The program's work in execution order, as both planners (exchanged here, mapped in
/// [`mapped_plan`](crate::actions::mapped)) see it.
pub(crate) enum Work {
    /// Host scalars.
    Uniform(Vec<ValueId>),
    /// Every rank's launches over their positions, in order.
    Launches(Vec<Item>),
    /// Rows of every rank's matmuls. `first`: the first block of its step, which waits
    /// for the kernels before it; later blocks of an overlapped matmul do not, so they
    /// run while the collective works on earlier blocks.
    Gemms(Vec<(MatMul, std::ops::Range<usize>)>, bool),
}

/// Calls `visit` on the program's work in order, with the description of its step. An
/// overlapped matmul comes block by block, each block's rows followed by the fused
/// launches over the rows it finished.
pub(crate) fn walk(
    plan: &Plan,
    program: &CudaProgram,
    mut visit: impl FnMut(Work, &str) -> Result<(), RuntimeError>,
) -> Result<(), RuntimeError> {
    for (step, gs) in plan.steps().iter().zip(&program.steps) {
        let at = plan.describe(step);
        match gs {
            GpuStep::Uniform(vs) => visit(Work::Uniform(vs.clone()), &at)?,
            GpuStep::Launch(ls) => {
                let items = ls.iter().map(|l| (l.clone(), l.lo, l.hi)).collect();
                visit(Work::Launches(items), &at)?;
            }
            GpuStep::MatMul(ms) => {
                let all = ms.iter().map(|m| (m.clone(), 0..m.m)).collect();
                visit(Work::Gemms(all, true), &at)?;
            }
            GpuStep::Overlap {
                matmuls,
                blocks,
                fused,
                rows,
            } => {
                for c in 0..*blocks {
                    let (r, positions) = overlap_block(matmuls, *blocks, fused, rows, c);
                    let gemms = matmuls
                        .iter()
                        .map(|m| {
                            let per = m.rows_per_block;
                            (m.clone(), r.start * per..r.end * per)
                        })
                        .collect();
                    visit(Work::Gemms(gemms, c == 0), &at)?;
                    let items = fused
                        .iter()
                        .zip(positions)
                        .filter(|(_, (lo, hi))| hi > lo)
                        .map(|(l, (lo, hi))| (l.clone(), lo, hi))
                        .collect();
                    visit(Work::Launches(items), &at)?;
                }
            }
        }
    }
    Ok(())
}

/// Translates the whole program into actions: rank `me`'s (`Some`) in a job whose ranks
/// have separate memories, or every rank's (`None`) on one device with virtual ranks,
/// where peers' memory is addressed directly and nothing is exchanged. Returns them and
/// the staging bytes they need.
pub(crate) fn actions(
    plan: &Plan,
    program: &CudaProgram,
    me: Option<usize>,
    pipelining: Pipelining,
) -> Result<(Vec<Action>, usize), RuntimeError> {
    let mut out = vec![];
    let mut staging = 0usize;
    walk(plan, program, |work, at| {
        match work {
            Work::Uniform(vs) => out.push(Action::Uniform(vs)),
            Work::Launches(items) => {
                let Some(me) = me else {
                    // One device: every rank's launches in order on one stream.
                    out.extend(items.into_iter().map(|(launch, lo, hi)| Action::Launch {
                        launch,
                        lo,
                        hi,
                        staged: HashMap::new(),
                    }));
                    return Ok(());
                };
                for items in phases(items) {
                    let mut used = 0usize;
                    let pieces = chunks(plan, &items, pipelining)
                        .into_iter()
                        .map(|chunk| piece(plan, chunk, me, at, &mut used))
                        .collect::<Result<Vec<_>, _>>()?;
                    staging = staging.max(used);
                    pipeline(&mut out, pieces, at);
                }
            }
            Work::Gemms(gemms, first) => {
                // Matmuls wait for the kernels before them; later kernels for the
                // matmuls.
                if first {
                    out.push(Action::WaitKernels);
                }
                out.extend(
                    gemms
                        .into_iter()
                        .filter(|(m, _)| me.is_none_or(|me| m.rank == me))
                        .map(|(m, rows)| Action::Gemm(m, rows)),
                );
                out.push(Action::BlockDone);
            }
        }
        Ok(())
    })?;
    // Debug builds (the tests) replay the actions against the streams' events.
    #[cfg(debug_assertions)]
    crate::actions::stream_check::check(plan, &out, me)
        .map_err(|e| RuntimeError::Plan(format!("internal error, please report it: {e}")))?;
    Ok((out, staging))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::PtrArg;
    use coconet_core::*;

    fn all_reduce_plan(n: usize) -> Plan {
        let mut b = ProgramBuilder::new("sum");
        let x = b
            .tensor_input(
                "x",
                DType::F32,
                Layout::Local,
                Shape::new(vec![Dim::sym("N")]),
                0,
            )
            .unwrap();
        b.all_reduce(ReduceOp::Sum, x).unwrap();
        let p = b.finish();
        let dims = Bindings::new().dim("N", n);
        Plan::lower(&Schedule::new(&p), 2, dims.dims()).unwrap()
    }

    fn summary(ms: &[Move]) -> Vec<(usize, usize)> {
        ms.iter().map(|m| (m.peer, m.bytes)).collect()
    }

    /// The kinds of `acts`: `x` exchange, `L` launch, `t` transfers wait for kernels,
    /// `k` kernels wait for transfers, `?` anything else.
    fn kinds(acts: &[Action]) -> String {
        acts.iter()
            .map(|a| match a {
                Action::Exchange { .. } => 'x',
                Action::Launch { .. } => 'L',
                Action::TransfersWaitKernels => 't',
                Action::KernelsWaitTransfers => 'k',
                _ => '?',
            })
            .collect()
    }

    fn exchanges(acts: &[Action]) -> Vec<(&[Move], &[Move])> {
        acts.iter()
            .filter_map(|a| match a {
                Action::Exchange { sends, recvs, .. } => Some((&sends[..], &recvs[..])),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_all_reduce_exchanges_sources_before_and_results_after_the_kernel() {
        let plan = all_reduce_plan(10);
        let program = CudaProgram::generate(&plan).unwrap();
        for me in 0..2 {
            let (acts, staging) = actions(&plan, &program, Some(me), Pipelining::OFF).unwrap();
            assert_eq!(kinds(&acts), "txkLtxk", "rank {me}");
            let ex = exchanges(&acts);
            // Five f32 per chunk: my peer's chunk of x goes to it, its copy of my
            // chunk comes to me; afterwards my result goes out, its result comes in.
            for (sends, recvs) in ex {
                assert_eq!(summary(sends), [(1 - me, 20)]);
                assert_eq!(summary(recvs), [(1 - me, 20)]);
            }
            // Staged: the peer's source chunk and, 16-byte aligned, the result for it.
            assert_eq!(staging, 32 + 20);
        }
    }

    #[test]
    fn a_large_all_reduce_is_pipelined_in_chunks() {
        // 2048 positions per rank, 8 KiB per transfer; 2 KiB chunks: four of 512.
        let plan = all_reduce_plan(4096);
        let program = CudaProgram::generate(&plan).unwrap();
        let small = Pipelining {
            chunk_bytes: 2048,
            max_chunks: 16,
        };
        for me in 0..2 {
            let (acts, staging) = actions(&plan, &program, Some(me), small).unwrap();
            // Sources of chunk c + 1 are staged, and results of chunk c sent, after
            // chunk c's kernel is launched (so they overlap it on a GPU).
            assert_eq!(kinds(&acts), "txkLxktxLxktxLxktxLtxk", "rank {me}");
            let launches: Vec<(usize, usize)> = acts
                .iter()
                .filter_map(|a| match a {
                    Action::Launch { lo, hi, .. } => Some((*lo, *hi)),
                    _ => None,
                })
                .collect();
            // Positions are within the rank's chunk (its pointers carry the offset).
            assert_eq!(
                launches,
                [(0, 512), (512, 1024), (1024, 1536), (1536, 2048)]
            );
            for (sends, recvs) in exchanges(&acts) {
                assert_eq!(summary(sends), [(1 - me, 2048)]);
                assert_eq!(summary(recvs), [(1 - me, 2048)]);
            }
            // Every chunk has its own staging (no chunk waits for another's to drain).
            assert_eq!(staging, 8 * 2048);
            // What goes out of my buffer: the peer's chunk of x, in order.
            let sent: Vec<usize> = exchanges(&acts)
                .iter()
                .flat_map(|(s, _)| s.iter())
                .filter_map(|m| match m.place {
                    Place::Own(_, off) => Some(off),
                    Place::Staging(_) => None,
                })
                .collect();
            let peer = (1 - me) * 2048 * 4;
            assert_eq!(sent, [peer, peer + 2048, peer + 4096, peer + 6144]);
        }
        // Pipelining off: one chunk.
        let (acts, _) = actions(&plan, &program, Some(0), Pipelining::OFF).unwrap();
        assert_eq!(kinds(&acts), "txkLtxk");
    }

    /// Every event of a pipelined phase is needed: without any one of them, two streams
    /// touch the same bytes unordered.
    #[cfg(debug_assertions)]
    #[test]
    fn the_stream_check_finds_a_race_when_any_event_is_dropped() {
        let plan = all_reduce_plan(4096);
        let program = CudaProgram::generate(&plan).unwrap();
        let small = Pipelining {
            chunk_bytes: 2048,
            max_chunks: 16,
        };
        let (acts, _) = actions(&plan, &program, Some(0), small).unwrap();
        crate::actions::stream_check::check(&plan, &acts, Some(0)).unwrap();
        let events: Vec<usize> = (0..acts.len())
            .filter(|&i| {
                matches!(
                    acts[i],
                    Action::TransfersWaitKernels | Action::KernelsWaitTransfers
                )
            })
            .collect();
        assert_eq!(events.len(), 10);
        // The first and the last order the phase after earlier kernels and before later
        // ones; there are none here (the ranks suite fails without either).
        for &i in &events[1..9] {
            let mut dropped = acts.clone();
            dropped.remove(i);
            let Err(e) = crate::actions::stream_check::check(&plan, &dropped, Some(0)) else {
                panic!("no race without event {i} of {}", kinds(&acts));
            };
            assert!(e.contains("with no event between them"), "{e}");
        }
    }

    #[test]
    fn chunks_that_would_touch_the_same_memory_are_not_cut() {
        let plan = all_reduce_plan(4096);
        let x = BufferRef::Input(plan.tensor_input("x").unwrap());
        let ptr = |rank| PtrArg {
            rank,
            buffer: x,
            offset: 0,
        };
        let small = Pipelining {
            chunk_bytes: 1024,
            max_chunks: 4,
        };
        // Reads the peer's x, writes its own x at the same positions.
        let launch = |mode, whole_read: bool| {
            let mut args = vec![
                Arg::Range,
                Arg::Reads(vec![ptr(1)]),
                Arg::Ptr(ptr(0), PtrUse::WritesAt),
            ];
            if whole_read {
                args.push(Arg::Ptr(ptr(0), PtrUse::ReadsFixed(2048)));
            }
            let l = Launch {
                rank: 0,
                kernel: 0,
                lo: 0,
                hi: 2048,
                mode,
                args,
            };
            (l, 0, 2048)
        };
        assert_eq!(
            chunks(&plan, &[launch(Mode::Vector, false)], small).len(),
            4
        );
        // Reading all of what the chunks write: chunk 0 would see chunk 1's old data
        // or new data depending on the order, so the phase stays whole.
        assert_eq!(chunks(&plan, &[launch(Mode::Vector, true)], small).len(), 1);
        // Block-level kernels are never cut.
        assert_eq!(
            chunks(&plan, &[launch(Mode::Blocks, false)], small).len(),
            1
        );
        // Rows are cut at row boundaries.
        let rows = chunks(&plan, &[launch(Mode::Rows(300), false)], small);
        let bounds: Vec<(usize, usize)> = rows.iter().map(|c| (c[0].1, c[0].2)).collect();
        assert_eq!(bounds, [(0, 600), (600, 1200), (1200, 1800), (1800, 2048)]);
    }

    fn collect(rank: usize, reads: Vec<PtrArg>, writes: Vec<PtrArg>) -> (Launch, usize, usize) {
        let l = Launch {
            rank,
            kernel: 0,
            lo: 0,
            hi: 4,
            mode: Mode::Elements,
            args: vec![Arg::Range, Arg::Reads(reads), Arg::Writes(writes)],
        };
        (l, 0, 4)
    }

    fn at(rank: usize, slot: usize, offset: usize) -> PtrArg {
        PtrArg {
            rank,
            buffer: BufferRef::Slot(slot),
            offset,
        }
    }

    #[test]
    fn a_launch_reading_what_the_phase_wrote_starts_a_new_phase() {
        // Rank 0 writes rank 1's slot 1 [0, 4); rank 1 then reads it: two phases.
        let w = collect(0, vec![at(0, 0, 0)], vec![at(1, 1, 0)]);
        let r = collect(1, vec![at(1, 1, 0)], vec![at(1, 2, 0)]);
        assert_eq!(phases(vec![w.clone(), r]).len(), 2);
        // Reading elements [4, 8) of it does not conflict.
        let r = collect(1, vec![at(1, 1, 4)], vec![at(1, 2, 0)]);
        assert_eq!(phases(vec![w.clone(), r]).len(), 1);
        // Overwriting what it wrote does.
        let w2 = collect(1, vec![at(1, 0, 0)], vec![at(1, 1, 2)]);
        assert_eq!(phases(vec![w.clone(), w2]).len(), 2);
        // Overwriting what an earlier launch only read does not: reads come first.
        let w3 = collect(1, vec![at(1, 3, 0)], vec![at(0, 0, 0)]);
        assert_eq!(phases(vec![w, w3]).len(), 1);
    }
}
