//! A race detector for one rank's actions. On a GPU, kernels, NCCL transfers and cuBLAS
//! matmuls run on three streams, ordered only by the events the actions place between
//! them; the emulator runs everything in order, so a missing event would go unseen in
//! tests without a GPU. This replays the actions with a vector clock per stream and
//! reports two accesses to the same bytes, one a write, on different streams with no
//! event chain between them. It also reports a kernel touching a peer's memory that was
//! not staged. Debug builds check every rank's actions when a job is prepared.

use crate::actions::{Action, Move, Place, accesses, buffer_size, gemm_accesses};
use coconet_plan::plan::{BufferRef, Plan};
use std::collections::HashMap;

/// The streams of a GPU, as indices into a vector clock.
const KERNELS: usize = 0;
const TRANSFERS: usize = 1;
const MATMULS: usize = 2;
const NAMES: [&str; 3] = ["kernels'", "transfers'", "matmuls'"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Memory {
    /// A rank's buffer.
    Buffer(usize, BufferRef),
    /// A rank's scratch.
    Scratch(usize),
    /// The staging buffer of the rank whose actions these are.
    Staging,
}

/// Bytes `start..end` of a memory, read or written.
type Touch = (Memory, usize, usize, bool);

struct Access {
    start: usize,
    end: usize,
    write: bool,
    /// The stream, as an index into the clocks (3 per rank).
    stream: usize,
    /// The stream's clock when the access was issued.
    clock: Vec<u64>,
    /// The action's index in its rank's list, for the report.
    action: usize,
}

/// Vector clocks of every rank's three streams, and the accesses not yet ordered before
/// everything.
struct Replay {
    clocks: Vec<Vec<u64>>,
    seen: HashMap<Memory, Vec<Access>>,
    /// The rank whose streams are clocks 0..3.
    first_rank: usize,
    /// Streams some action runs on: an access every one of them has waited for can no
    /// longer race (streams never used would otherwise keep every access alive).
    used: Vec<bool>,
}

impl Replay {
    /// A replay of ranks `first_rank..first_rank + lists.len()`, rank
    /// `first_rank + k` running `lists[k]`.
    fn new(
        plan: &Plan,
        first_rank: usize,
        lists: &[&[Action]],
        me: Option<usize>,
    ) -> Result<Replay, String> {
        let n = 3 * lists.len();
        let mut used = vec![false; n];
        for (k, list) in lists.iter().enumerate() {
            for a in list.iter() {
                if let Some((stream, _)) = touches(plan, a, me)? {
                    used[3 * k + stream] = true;
                }
            }
        }
        Ok(Replay {
            clocks: vec![vec![0; n]; n],
            seen: HashMap::new(),
            first_rank,
            used,
        })
    }

    /// Stream `waiter` waits for everything stream `waited` was issued so far.
    fn join(&mut self, waiter: usize, waited: usize) {
        let w = self.clocks[waited].clone();
        for (c, x) in self.clocks[waiter].iter_mut().zip(w) {
            *c = (*c).max(x);
        }
    }

    /// Every rank's kernels' stream waits for every other's (a barrier).
    fn barrier(&mut self) {
        let ranks = self.clocks.len() / 3;
        let mut all = vec![0; self.clocks.len()];
        for r in 0..ranks {
            for (a, &x) in all.iter_mut().zip(&self.clocks[3 * r + KERNELS]) {
                *a = (*a).max(x);
            }
        }
        for r in 0..ranks {
            self.clocks[3 * r + KERNELS] = all.clone();
        }
    }

    /// Rank `rank` waits for all its streams (the end of a run): its later work on any
    /// stream comes after all its earlier work.
    fn synchronize(&mut self, rank: usize) {
        let rank = rank - self.first_rank;
        let mut all = vec![0; self.clocks.len()];
        for s in 3 * rank..3 * rank + 3 {
            for (a, &x) in all.iter_mut().zip(&self.clocks[s]) {
                *a = (*a).max(x);
            }
        }
        for s in 3 * rank..3 * rank + 3 {
            self.clocks[s] = all.clone();
        }
    }

    /// Replays action `i` of rank `rank` (whose actions address memory as `me` says).
    fn action(
        &mut self,
        plan: &Plan,
        a: &Action,
        (rank, i): (usize, usize),
        me: Option<usize>,
    ) -> Result<(), String> {
        let base = 3 * (rank - self.first_rank);
        match a {
            Action::TransfersWaitKernels => self.join(base + TRANSFERS, base + KERNELS),
            Action::KernelsWaitTransfers => self.join(base + KERNELS, base + TRANSFERS),
            Action::WaitKernels => self.join(base + MATMULS, base + KERNELS),
            Action::BlockDone => self.join(base + KERNELS, base + MATMULS),
            _ => {}
        }
        let Some((stream, touched)) = touches(plan, a, me)? else {
            return Ok(());
        };
        let stream = base + stream;
        self.clocks[stream][stream] += 1;
        let now = self.clocks[stream].clone();
        for (mem, start, end, write) in touched {
            let (clocks, used) = (&self.clocks, &self.used);
            let list = self.seen.entry(mem).or_default();
            // Accesses every stream has waited for can no longer race.
            list.retain(|p| {
                clocks
                    .iter()
                    .zip(used)
                    .any(|(c, &u)| u && c[p.stream] < p.clock[p.stream])
            });
            let race = list.iter().find(|p| {
                p.stream != stream
                    && (p.write || write)
                    && p.start < end
                    && start < p.end
                    && p.clock[p.stream] > now[p.stream]
            });
            if let Some(p) = race {
                let what = |w| if w { "a write" } else { "a read" };
                let p_rank = self.first_rank + p.stream / 3;
                return Err(format!(
                    "action {} of rank {p_rank} ({} on its {} stream) and action {i} of rank {rank} \
                     ({} on its {} stream) touch bytes {}..{} of {mem:?} with no event \
                     between them",
                    p.action,
                    what(p.write),
                    NAMES[p.stream % 3],
                    what(write),
                    NAMES[stream % 3],
                    start.max(p.start),
                    end.min(p.end),
                ));
            }
            list.push(Access {
                start,
                end,
                write,
                stream,
                clock: now.clone(),
                action: i,
            });
        }
        Ok(())
    }
}

fn bytes(start: usize, end: usize, size: usize) -> (usize, usize) {
    (start.saturating_mul(size), end.saturating_mul(size))
}

/// What action `a` touches, on which stream; `None` for events and host work.
fn touches(
    plan: &Plan,
    a: &Action,
    me: Option<usize>,
) -> Result<Option<(usize, Vec<Touch>)>, String> {
    Ok(Some(match a {
        Action::Launch {
            launch,
            lo,
            hi,
            staged,
        } => {
            let mut out = vec![];
            for (arg, k, (rank, buffer, start, end), write) in accesses(launch, *lo, *hi) {
                if start >= end {
                    continue;
                }
                if let Some(&off) = staged.get(&(arg, k)) {
                    let size = buffer.map_or(8, |b| buffer_size(plan, b));
                    out.push((Memory::Staging, off, off + (hi - lo) * size, write));
                } else if me.is_some_and(|me| rank != me) {
                    return Err(format!(
                        "a kernel of rank {} touches rank {rank}'s memory, which was not \
                         staged",
                        launch.rank
                    ));
                } else {
                    let (mem, size) = match buffer {
                        Some(b) => (Memory::Buffer(rank, b), buffer_size(plan, b)),
                        None => (Memory::Scratch(rank), 8),
                    };
                    let (s, e) = bytes(start, end, size);
                    out.push((mem, s, e, write));
                }
            }
            (KERNELS, out)
        }
        Action::Exchange { sends, recvs, .. } => {
            let me = me.ok_or_else(|| "an exchange between virtual ranks".to_string())?;
            let place = |m: &Move, write| match m.place {
                Place::Own(b, off) => (Memory::Buffer(me, b), off, off + m.bytes, write),
                Place::Staging(off) => (Memory::Staging, off, off + m.bytes, write),
            };
            let out = sends
                .iter()
                .map(|m| place(m, false))
                .chain(recvs.iter().map(|m| place(m, true)))
                .collect();
            (TRANSFERS, out)
        }
        Action::Gemm(m, rows) => {
            let size = m.dtype.size_bytes();
            let out = gemm_accesses(m, rows)
                .into_iter()
                .map(|((rank, b, start, end), write)| {
                    let (s, e) = bytes(start, end, size);
                    (
                        Memory::Buffer(rank, b.expect("matmul operands are buffers")),
                        s,
                        e,
                        write,
                    )
                })
                .collect();
            (MATMULS, out)
        }
        Action::Uniform(_)
        | Action::TransfersWaitKernels
        | Action::KernelsWaitTransfers
        | Action::WaitKernels
        | Action::BlockDone
        | Action::Barrier => return Ok(None),
    }))
}

/// Checks rank `me`'s `actions` (every rank's, `None`, with virtual ranks) for races
/// between streams (see the module doc).
pub(crate) fn check(plan: &Plan, actions: &[Action], me: Option<usize>) -> Result<(), String> {
    let rank = me.unwrap_or(0);
    let mut replay = Replay::new(plan, rank, &[actions], me)?;
    for (i, a) in actions.iter().enumerate() {
        replay.action(plan, a, (rank, i), me)?;
    }
    Ok(())
}

/// Checks the actions of every rank of a job whose kernels address each other's memory
/// directly (`lists[r]` is rank `r`'s), meeting at barriers: the streams of all ranks,
/// ordered by events within a rank and by barriers between them. Two runs are replayed,
/// ordered only by each rank waiting for its own streams in between (as separate
/// processes are), so a run's first kernels must not race with peers' last ones.
pub(crate) fn check_mapped(plan: &Plan, lists: &[Vec<Action>]) -> Result<(), String> {
    let ranks = lists.len();
    let segments: Vec<Vec<&[Action]>> = lists
        .iter()
        .map(|l| l.split(|a| matches!(a, Action::Barrier)).collect())
        .collect();
    let count = segments.first().map_or(0, Vec::len);
    if let Some(r) = segments.iter().position(|s| s.len() != count) {
        return Err(format!(
            "rank {r} meets {} barriers, rank 0 {}",
            segments[r].len() - 1,
            count - 1
        ));
    }
    let all: Vec<&[Action]> = lists.iter().map(Vec::as_slice).collect();
    let mut replay = Replay::new(plan, 0, &all, None)?;
    for _run in 0..2 {
        let mut offsets = vec![0usize; ranks];
        for k in 0..count {
            for (r, segs) in segments.iter().enumerate() {
                for (j, a) in segs[k].iter().enumerate() {
                    replay.action(plan, a, (r, offsets[r] + j), None)?;
                }
                offsets[r] += segs[k].len() + 1;
            }
            if k + 1 < count {
                replay.barrier();
            }
        }
        for r in 0..ranks {
            replay.synchronize(r);
        }
    }
    Ok(())
}
