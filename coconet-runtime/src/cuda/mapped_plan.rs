//! What one rank does when its kernels address its peers' memory directly (GPUs of one
//! machine with peer access or CUDA IPC, or emulated devices in one process): the
//! virtual-rank program's own launches and matmuls, with *barriers* wherever a launch or
//! matmul touches memory that another rank's work since the last barrier touched (one
//! of the two writing). With virtual ranks one stream orders everything; here each rank
//! has its own, so a barrier stands in for that order between ranks. Nothing is
//! exchanged and nothing staged: the fused all-reduce reads its chunk from every peer and
//! writes its results into every peer, as on one GPU.

use super::codegen::{CudaProgram, GpuStep, Launch, MatMul};
use super::exchange_plan::{Action, Region, accesses, gemm_accesses, overlaps};
use super::exec::overlap_block;
use std::collections::HashMap;

/// Accesses by every rank since the last barrier: (launching rank, region, writes).
#[derive(Default)]
struct SinceBarrier(Vec<(usize, Region, bool)>);

impl SinceBarrier {
    /// Whether work of `rank` touching `accs` must wait for other ranks' work so far.
    fn conflicts(&self, rank: usize, accs: &[(Region, bool)]) -> bool {
        accs.iter().any(|(r, w)| {
            self.0
                .iter()
                .any(|(other, s, sw)| *other != rank && (*w || *sw) && overlaps(r, s))
        })
    }

    fn add(&mut self, rank: usize, accs: impl IntoIterator<Item = (Region, bool)>) {
        self.0.extend(accs.into_iter().map(|(r, w)| (rank, r, w)));
    }
}

/// Appends a launch (rank `me`'s only), after a barrier when it needs one.
fn launch(
    out: &mut Vec<Action>,
    since: &mut SinceBarrier,
    me: usize,
    (l, lo, hi): (&Launch, usize, usize),
) {
    let accs: Vec<(Region, bool)> = accesses(l, lo, hi)
        .into_iter()
        .map(|(_, _, r, w)| (r, w))
        .collect();
    if since.conflicts(l.rank, &accs) {
        out.push(Action::Barrier);
        since.0.clear();
    }
    since.add(l.rank, accs);
    if l.rank == me {
        out.push(Action::Launch {
            launch: l.clone(),
            lo,
            hi,
            staged: HashMap::new(),
        });
    }
}

/// Appends rows `rows(m)` of every rank's matmuls (rank `me`'s only), after a barrier
/// when one needs it. They wait for the kernels before them when `wait` (the start of a
/// step) or after a barrier; later blocks of an overlapped matmul do not, so they run
/// while the collective works on earlier blocks.
fn gemms(
    out: &mut Vec<Action>,
    since: &mut SinceBarrier,
    me: usize,
    ms: &[MatMul],
    rows: impl Fn(&MatMul) -> std::ops::Range<usize>,
    wait: bool,
) {
    let accs: Vec<(usize, [(Region, bool); 3])> = ms
        .iter()
        .map(|m| (m.rank, gemm_accesses(m, &rows(m))))
        .collect();
    let barrier = accs.iter().any(|(r, a)| since.conflicts(*r, a));
    if barrier {
        out.push(Action::Barrier);
        since.0.clear();
    }
    if wait || barrier {
        out.push(Action::WaitKernels);
    }
    for (m, (r, a)) in ms.iter().zip(accs) {
        since.add(r, a);
        if m.rank == me {
            out.push(Action::Gemm(m.clone(), rows(m)));
        }
    }
    // Later kernels wait for the matmuls.
    out.push(Action::BlockDone);
}

/// Rank `me`'s actions when ranks address each other's memory. A run starts with a
/// barrier (no rank writes into a peer still reading the last run's results) and ends
/// with one (a rank's results include every peer's writes when its run returns).
pub(super) fn mapped_actions(program: &CudaProgram, me: usize) -> Vec<Action> {
    let mut out = vec![Action::Barrier];
    let mut since = SinceBarrier::default();
    for gs in &program.steps {
        match gs {
            GpuStep::Uniform(vs) => out.push(Action::Uniform(vs.clone())),
            GpuStep::Launch(ls) => {
                for l in ls {
                    launch(&mut out, &mut since, me, (l, l.lo, l.hi));
                }
            }
            GpuStep::MatMul(ms) => gemms(&mut out, &mut since, me, ms, |m| 0..m.m, true),
            GpuStep::Overlap {
                matmuls,
                blocks,
                fused,
                rows,
            } => {
                for c in 0..*blocks {
                    let (r, positions) = overlap_block(matmuls, *blocks, fused, rows, c);
                    let rows = |m: &MatMul| r.start * m.rows_per_block..r.end * m.rows_per_block;
                    gemms(&mut out, &mut since, me, matmuls, rows, c == 0);
                    for (l, (lo, hi)) in fused.iter().zip(positions) {
                        if hi > lo {
                            launch(&mut out, &mut since, me, (l, lo, hi));
                        }
                    }
                }
            }
        }
    }
    out.push(Action::Barrier);
    out
}
