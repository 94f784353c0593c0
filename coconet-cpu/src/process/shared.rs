//! A job whose processes share memory (every process on one machine, over a transport
//! that can map memory between them: an MPI-3 shared-memory window, or POSIX shared
//! memory between TCP processes). Each process moves its inputs and runtime buffers
//! into its part of the shared memory and learns where its peers' are; the plan then runs with the rank threads' collectives, which read
//! and write the peers' buffers directly, and a world synchronised through atomics in
//! the window. No byte goes through the transport during a step: the copies into and
//! out of message buffers, and the transport's own transfers, are gone.

use super::transport::all_gather_u64;
use super::transport::link::{Link, Shared};
use crate::exec::RankRaw;
use crate::inputs::Inputs;
use crate::shared_memory_sync::ProcessSync;
use crate::sync::World;
use coconet_core::{DType, ValueId};
use coconet_plan::RuntimeError;
use coconet_plan::host::memory::{Buffer, Raw};
use coconet_plan::plan::Plan;
use std::time::Duration;

/// Where each buffer starts in a process's part of the window: a cache line apart, so
/// no two processes' writes share a line.
const ALIGN: usize = 64;

/// What a job needs to run over shared memory.
pub(super) struct SharedJob {
    /// Every rank's buffers, as this process sees them.
    pub mem: Vec<RankRaw>,
    /// The processes' world (barrier and flags in the window).
    pub world: World,
    /// The window (dropped after every buffer placed in it).
    pub memory: Box<dyn Shared>,
}

/// Moves this process's buffers into memory shared by every process of the job (an
/// input bound in pieces as one run of them), where every process may share and can
/// map it; `None` (on every process alike) otherwise. Every process calls it.
///
/// # Safety
/// The buffers must stay alive, unmoved in memory and unreallocated, until the
/// returned window is dropped after them.
pub(super) unsafe fn place(
    link: &dyn Link,
    plan: &Plan,
    inputs: &mut Inputs,
    slots: &mut [Buffer],
    timeout: Duration,
) -> Result<Option<SharedJob>, RuntimeError> {
    let (rank, ranks) = (link.rank(), link.size());
    let mine = &mut inputs.buffers[rank];
    if all_gather_u64(link, &[link.may_share() as u64])?.contains(&0) {
        return Ok(None);
    }
    // Rank 0's part starts with the world's synchronisation words.
    let flags = World::flags_for(plan);
    let mut at = if rank == 0 {
        ProcessSync::bytes(ranks, flags).next_multiple_of(ALIGN)
    } else {
        0
    };
    let mut next = |b: &Buffer| {
        let here = at;
        at += b.word_bytes().next_multiple_of(ALIGN);
        here
    };
    let mut ids: Vec<ValueId> = mine.keys().copied().collect();
    ids.sort();
    let input_at: Vec<usize> = ids.iter().map(|id| next(&mine[id])).collect();
    let slot_at: Vec<usize> = slots.iter().map(&mut next).collect();
    let Some(memory) = link.share(at)? else {
        return Ok(None);
    };
    let base = memory.base(rank);
    for (id, &off) in ids.iter().zip(&input_at) {
        let b = mine.get_mut(id).expect("an input of mine");
        // SAFETY: `off` is this buffer's own 8-aligned range of my part of the window
        // (which holds `at` bytes); the window outlives the buffer (caller's contract).
        unsafe { b.place(base.add(off)) };
    }
    for (b, &off) in slots.iter_mut().zip(&slot_at) {
        // SAFETY: as above.
        unsafe { b.place(base.add(off)) };
    }
    if rank == 0 {
        // SAFETY: the synchronisation words are the start of my part; no process reads
        // them before the exchange below, which follows this.
        unsafe { std::ptr::write_bytes(base, 0, ProcessSync::bytes(ranks, flags)) };
    }
    // Every rank's layout: (value id, offset, length, dtype) per input, then the offset
    // of each runtime buffer; padded to the longest list.
    let mut layout = vec![ids.len() as u64];
    for (id, &off) in ids.iter().zip(&input_at) {
        let b = &mine[id];
        let dtype = DType::ALL
            .iter()
            .position(|&d| d == b.dtype)
            .expect("a dtype");
        layout.extend([id.0 as u64, off as u64, b.len as u64, dtype as u64]);
    }
    layout.extend(slot_at.iter().map(|&o| o as u64));
    let width = all_gather_u64(link, &[layout.len() as u64])?
        .into_iter()
        .max()
        .unwrap_or(0) as usize;
    layout.resize(width, 0);
    let all = all_gather_u64(link, &layout)?;
    let mem = all
        .chunks(width.max(1))
        .enumerate()
        .map(|(s, l)| peer_view(plan, l, memory.base(s), s))
        .collect();
    // SAFETY: rank 0's part starts with the synchronisation words, zeroed before the
    // exchange above, and the window lives as long as the world (the job's contract).
    let mut sync = unsafe { ProcessSync::new(memory.base(0), ranks, flags) };
    sync.watch(&link.processes());
    Ok(Some(SharedJob {
        mem,
        world: World::across_processes(ranks, timeout, sync),
        memory,
    }))
}

/// Rank `s`'s buffers from its layout (see `place`), at its part `base`.
fn peer_view(plan: &Plan, layout: &[u64], base: *mut u8, s: usize) -> RankRaw {
    let n = layout[0] as usize;
    // SAFETY (of the additions): each offset lies inside rank s's part, as it laid out;
    // (of the views) the shared window lives as long as the world that uses them.
    let inputs = layout[1..1 + 4 * n]
        .chunks(4)
        .map(|e| {
            let (at, len, dtype) = (e[1] as usize, e[2] as usize, DType::ALL[e[3] as usize]);
            let raw = unsafe { Raw::from_addr(base.add(at), len, dtype) };
            (ValueId(e[0] as u32), raw)
        })
        .collect();
    let slots = plan
        .slots()
        .iter()
        .zip(&layout[1 + 4 * n..])
        .map(|(slot, &at)| unsafe {
            Raw::from_addr(base.add(at as usize), slot.elements[s], slot.dtype)
        })
        .collect();
    RankRaw { inputs, slots }
}
