//! What one rank does when its kernels address its peers' memory directly (GPUs of one
//! machine with peer access or CUDA IPC, or emulated devices in one process): the
//! virtual-rank program's own launches and matmuls, with *barriers* wherever a launch or
//! matmul touches memory that another rank's work since the last barrier touched (one
//! of the two writing). With virtual ranks one stream orders everything; here each rank
//! has its own, so a barrier stands in for that order between ranks. Nothing is
//! exchanged and nothing staged: the fused all-reduce reads its chunk from every peer and
//! writes its results into every peer, as on one GPU.

use crate::actions::exchanged::{Work, walk};
use crate::actions::{Action, Region, accesses, gemm_accesses, overlaps};
use crate::codegen::{CudaProgram, Launch, MatMul};
use coconet_plan::RuntimeError;
use coconet_plan::plan::Plan;
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

/// Appends rows of every rank's matmuls (rank `me`'s only), after a barrier when one
/// needs it. They wait for the kernels before them when `first` (see [`Work::Gemms`])
/// or after a barrier.
fn gemms(
    out: &mut Vec<Action>,
    since: &mut SinceBarrier,
    me: usize,
    gemms: Vec<(MatMul, std::ops::Range<usize>)>,
    first: bool,
) {
    let accs: Vec<[(Region, bool); 3]> = gemms
        .iter()
        .map(|(m, rows)| gemm_accesses(m, rows))
        .collect();
    let barrier = gemms
        .iter()
        .zip(&accs)
        .any(|((m, _), a)| since.conflicts(m.rank, a));
    if barrier {
        out.push(Action::Barrier);
        since.0.clear();
    }
    if first || barrier {
        out.push(Action::WaitKernels);
    }
    for ((m, rows), a) in gemms.into_iter().zip(accs) {
        since.add(m.rank, a);
        if m.rank == me {
            out.push(Action::Gemm(m, rows));
        }
    }
    // Later kernels wait for the matmuls.
    out.push(Action::BlockDone);
}

/// Rank `me`'s actions when ranks address each other's memory. A run starts with a
/// barrier (no rank writes into a peer still reading the last run's results) and ends
/// with one (a rank's results include every peer's writes when its run returns).
pub(crate) fn mapped_actions(
    plan: &Plan,
    program: &CudaProgram,
    me: usize,
) -> Result<Vec<Action>, RuntimeError> {
    let mut out = vec![Action::Barrier];
    let mut since = SinceBarrier::default();
    walk(plan, program, |work, _| {
        match work {
            Work::Uniform(vs) => out.push(Action::Uniform(vs)),
            Work::Launches(items) => {
                for (l, lo, hi) in &items {
                    launch(&mut out, &mut since, me, (l, *lo, *hi));
                }
            }
            Work::Gemms(all, first) => gemms(&mut out, &mut since, me, all, first),
        }
        Ok(())
    })?;
    out.push(Action::Barrier);
    Ok(out)
}
