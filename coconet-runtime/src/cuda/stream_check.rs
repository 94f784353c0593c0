//! A race detector for one rank's actions. On a GPU, kernels, NCCL transfers and cuBLAS
//! matmuls run on three streams, ordered only by the events the actions place between
//! them; the emulator runs everything in order, so a missing event would go unseen in
//! tests without a GPU. This replays the actions with a vector clock per stream and
//! reports two accesses to the same bytes, one a write, on different streams with no
//! event chain between them. It also reports a kernel touching a peer's memory that was
//! not staged. Debug builds check every rank's actions when a job is prepared.

use super::exchange_plan::{Action, Place, accesses, buffer_size};
use crate::plan::{BufferRef, Plan};
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
    stream: usize,
    /// The stream's clock when the access was issued.
    clock: [u64; 3],
    action: usize,
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
            let place = |m: &super::exchange_plan::Move, write| match m.place {
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
            let (a0, a1) = bytes(
                m.a.offset + rows.start * m.k,
                m.a.offset + rows.end * m.k,
                size,
            );
            let (b0, b1) = bytes(m.b.offset, m.b.offset + m.k * m.n, size);
            let (o0, o1) = bytes(
                m.out.offset + rows.start * m.n,
                m.out.offset + rows.end * m.n,
                size,
            );
            let out = vec![
                (Memory::Buffer(m.rank, m.a.buffer), a0, a1, false),
                (Memory::Buffer(m.rank, m.b.buffer), b0, b1, false),
                (Memory::Buffer(m.rank, m.out.buffer), o0, o1, true),
            ];
            (MATMULS, out)
        }
        Action::Uniform(_)
        | Action::TransfersWaitKernels
        | Action::KernelsWaitTransfers
        | Action::WaitKernels
        | Action::BlockDone => return Ok(None),
    }))
}

/// Checks rank `me`'s `actions` (every rank's, `None`, with virtual ranks) for races
/// between streams (see the module doc).
pub(super) fn check(plan: &Plan, actions: &[Action], me: Option<usize>) -> Result<(), String> {
    let mut clocks = [[0u64; 3]; 3];
    let join = |clocks: &mut [[u64; 3]; 3], waiter: usize, waited: usize| {
        let w = clocks[waited];
        for (c, x) in clocks[waiter].iter_mut().zip(w) {
            *c = (*c).max(x);
        }
    };
    let mut seen: HashMap<Memory, Vec<Access>> = HashMap::new();
    for (i, a) in actions.iter().enumerate() {
        match a {
            Action::TransfersWaitKernels => join(&mut clocks, TRANSFERS, KERNELS),
            Action::KernelsWaitTransfers => join(&mut clocks, KERNELS, TRANSFERS),
            Action::WaitKernels => join(&mut clocks, MATMULS, KERNELS),
            Action::BlockDone => join(&mut clocks, KERNELS, MATMULS),
            _ => {}
        }
        let Some((stream, touched)) = touches(plan, a, me)? else {
            continue;
        };
        clocks[stream][stream] += 1;
        let now = clocks[stream];
        for (mem, start, end, write) in touched {
            let list = seen.entry(mem).or_default();
            // Accesses every stream has waited for can no longer race.
            list.retain(|p| clocks.iter().any(|c| c[p.stream] < p.clock[p.stream]));
            let race = list.iter().find(|p| {
                p.stream != stream
                    && (p.write || write)
                    && p.start < end
                    && start < p.end
                    && p.clock[p.stream] > now[p.stream]
            });
            if let Some(p) = race {
                return Err(format!(
                    "{}: action {} ({} on the {} stream) and action {i} ({} on the {} \
                     stream) touch bytes {}..{} of {mem:?} with no event between them",
                    me.map_or("virtual ranks".to_string(), |me| format!("rank {me}")),
                    p.action,
                    if p.write { "a write" } else { "a read" },
                    NAMES[p.stream],
                    if write { "a write" } else { "a read" },
                    NAMES[stream],
                    start.max(p.start),
                    end.min(p.end),
                ));
            }
            list.push(Access {
                start,
                end,
                write,
                stream,
                clock: now,
                action: i,
            });
        }
    }
    Ok(())
}
