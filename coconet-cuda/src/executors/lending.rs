//! What an executor does with memory lent to a run ([`Lent`]): checks it against the
//! plan and the device, puts it in place of the job's buffers (or gathers pieces into
//! them and scatters updated ones back), and remembers which of the job's own buffers
//! the run did not use, so that they are not read or run on as if it had.
//!
//! Both executors use it: the one-device job (every rank's buffers) and a rank job
//! (its own rank's).

use crate::actions::{Action, Place};
use crate::codegen::{Arg, CudaProgram, Mode, PtrUse};
use crate::devices::Device;
use crate::lent::{Lent, LentInput, check_disjoint};
use coconet_core::ValueId;
use coconet_plan::RuntimeError;
use coconet_plan::plan::{BufferRef, Plan};
use std::collections::{HashMap, HashSet};

/// A buffer of a rank: `(rank, buffer)`.
pub(crate) type RankBuffer = (usize, BufferRef);

/// An input lent as several pieces (or to ranks whose peers map the job's own buffers):
/// `(lent address, byte offset in the job's buffer, bytes)` per piece, gathered into the
/// job's buffer before the run and, where the program updates the input, scattered back
/// after it.
struct Gathered {
    at: RankBuffer,
    pieces: Vec<(u64, u64, usize)>,
    updated: bool,
}

/// A piece of a buffer lent in place: its first element in the buffer, its elements and
/// its address.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece {
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) address: u64,
}

/// Lent memory across the runs of one job.
#[derive(Default)]
pub(crate) struct Lending {
    /// The caller's memory standing for buffers during the current run.
    in_place: HashMap<RankBuffer, u64>,
    /// Buffers lent as pieces that every launch reaching them takes segment by segment
    /// (the kernels' segmented twins), during the current run.
    pieced: HashMap<RankBuffer, Vec<Piece>>,
    /// What the current run gathers from pieces.
    gathered: Vec<Gathered>,
    /// Input buffers lent in place in the last run: the job's own copy is not the value
    /// the run used or wrote.
    stale: HashSet<RankBuffer>,
}

impl Lending {
    /// The lent address standing for `b` during the current run.
    pub(crate) fn address(&self, b: RankBuffer) -> Option<u64> {
        self.in_place.get(&b).copied()
    }

    /// The lent pieces standing for `b` during the current run.
    pub(crate) fn pieces(&self, b: RankBuffer) -> Option<&[Piece]> {
        self.pieced.get(&b).map(|p| &p[..])
    }

    /// Checks the entries of `lent` for the ranks this executor runs (`mine`) and
    /// prepares the run: `held(rank, buffer)` says whether this executor holds a buffer;
    /// `in_place` whether kernels may address lent memory directly (not where peers map
    /// the job's own buffers); `unsegmentable` the buffers some step reaches other than
    /// through an elementwise kernel's positions (pieces of those are gathered). Refuses
    /// a run that would use a stale buffer of an input the program updates. Nothing is
    /// queued.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn begin<D: Device>(
        &mut self,
        device: &D,
        plan: &Plan,
        lent: &Lent<'_>,
        mine: &dyn Fn(usize) -> bool,
        held: &dyn Fn(RankBuffer) -> bool,
        in_place: bool,
        unsegmentable: &HashSet<RankBuffer>,
    ) -> Result<(), RuntimeError> {
        check_disjoint(lent)?;
        let updated = |id: ValueId| plan.program().updates().any(|(t, _)| t == id);
        let mut direct = HashMap::new();
        let mut pieced = HashMap::new();
        let mut gathered = Vec::new();
        let mut seen = HashSet::new();
        for e in lent.entries.iter().filter(|e| mine(e.rank)) {
            let id = plan.tensor_input(&e.input)?;
            let key = (e.rank, BufferRef::Input(id));
            if !seen.insert(key) {
                return Err(RuntimeError::Lend(format!(
                    "`{}` on rank {} is lent twice",
                    e.input, e.rank
                )));
            }
            let pieces = check_pieces(device, plan, e, id, held(key))?;
            match &pieces[..] {
                [(at, 0, _)] if in_place => {
                    direct.insert(key, *at);
                }
                _ if in_place && !unsegmentable.contains(&key) => {
                    let size = plan.buffer_dtype(key.1).size_bytes() as u64;
                    let ps = pieces
                        .iter()
                        .map(|&(address, offset, bytes)| Piece {
                            start: (offset / size) as usize,
                            len: bytes / size as usize,
                            address,
                        })
                        .collect();
                    pieced.insert(key, ps);
                }
                _ => gathered.push(Gathered {
                    at: key,
                    pieces,
                    updated: updated(id),
                }),
            }
        }
        if let Some(&(r, b)) = self.stale.iter().find(|&&(r, b)| {
            mine(r)
                && !direct.contains_key(&(r, b))
                && !pieced.contains_key(&(r, b))
                && !gathered.iter().any(|g| g.at == (r, b))
                && matches!(b, BufferRef::Input(id) if updated(id))
        }) {
            let BufferRef::Input(id) = b else {
                unreachable!("only inputs are lent")
            };
            return Err(RuntimeError::Lend(format!(
                "`{}` on rank {r} was lent in the last run, which updated it in the lent \
                 memory: the job's own copy is stale. Lend it again, or write it first",
                plan.program().label(id)
            )));
        }
        self.in_place = direct;
        self.pieced = pieced;
        self.gathered = gathered;
        Ok(())
    }

    /// Copies the pieces into the job's buffers (`own` gives their addresses).
    pub(crate) fn gather<D: Device>(
        &self,
        device: &D,
        own: &dyn Fn(RankBuffer) -> Result<u64, RuntimeError>,
    ) -> Result<(), RuntimeError> {
        for g in &self.gathered {
            let base = own(g.at)?;
            for &(at, offset, bytes) in &g.pieces {
                device.copy(base + offset, at, bytes)?;
            }
        }
        Ok(())
    }

    /// Copies the updated inputs' pieces back to the caller's memory.
    pub(crate) fn scatter<D: Device>(
        &self,
        device: &D,
        own: &dyn Fn(RankBuffer) -> Result<u64, RuntimeError>,
    ) -> Result<(), RuntimeError> {
        for g in self.gathered.iter().filter(|g| g.updated) {
            let base = own(g.at)?;
            for &(at, offset, bytes) in &g.pieces {
                device.copy(at, base + offset, bytes)?;
            }
        }
        Ok(())
    }

    /// Orders the run's work after `after` (the caller's event) and the lent memory's
    /// streams.
    pub(crate) fn order<D: Device>(
        device: &D,
        lent: &Lent<'_>,
        after: Option<&D::Event>,
    ) -> Result<(), RuntimeError> {
        if let Some(e) = after {
            device.wait_event(e)?;
        }
        device.after_lenders(lent)
    }

    /// Ends a run whose queuing gave `queued`: what was lent in place is stale from now
    /// on, a failure is kept in `failed` (the buffers may hold part of a step); returns
    /// the event the run's work ends at, the lent memory's streams waiting for it.
    pub(crate) fn finish<D: Device>(
        &mut self,
        device: &D,
        lent: &Lent<'_>,
        queued: Result<(), RuntimeError>,
        failed: &mut Option<String>,
    ) -> Result<D::Event, RuntimeError> {
        self.end(queued.is_ok());
        if let Err(e) = &queued {
            *failed = Some(e.to_string());
        }
        queued?;
        let done = device.record()?;
        device.release_lenders(lent, &done)?;
        Ok(done)
    }

    /// Ends the run: what was lent in place is stale in the job from now on (where the
    /// run was queued; a failed run leaves the job unusable anyway).
    fn end(&mut self, queued: bool) {
        let mut lent: Vec<RankBuffer> = self.in_place.drain().map(|(k, _)| k).collect();
        lent.extend(self.pieced.drain().map(|(k, _)| k));
        let gathered: Vec<Gathered> = std::mem::take(&mut self.gathered);
        if queued {
            // Gathered buffers hold the run's values again.
            for g in gathered {
                self.stale.remove(&g.at);
            }
            self.stale.extend(lent);
        }
    }

    /// Refuses reads of a buffer lent in place in the last run.
    pub(crate) fn check_read(
        &self,
        plan: &Plan,
        v: ValueId,
        rank: usize,
    ) -> Result<(), RuntimeError> {
        if let Some(view) = plan.view(v, rank)
            && self.stale.contains(&(rank, view.buffer))
        {
            return Err(RuntimeError::Read(format!(
                "`{}` on rank {rank} lives in the memory lent for the last run; read it there",
                plan.program().label(v)
            )));
        }
        Ok(())
    }

    /// The job's own buffer `b` was written: its value is current again.
    pub(crate) fn written(&mut self, b: RankBuffer) {
        self.stale.remove(&b);
    }
}

/// The error of every use of a job after a failed run.
pub(crate) fn after_failure(why: &str) -> RuntimeError {
    RuntimeError::Plan(format!(
        "an earlier run failed ({why}); the job's buffers are undefined — prepare a new job"
    ))
}

/// Checks one lent entry (input `id`; `held` whether the rank's buffer is here): dtype,
/// memory and extent of every piece, and their total against the rank's buffer.
/// Returns `(address, byte offset, bytes)` per piece.
fn check_pieces<D: Device>(
    device: &D,
    plan: &Plan,
    e: &LentInput<'_>,
    id: ValueId,
    held: bool,
) -> Result<Vec<(u64, u64, usize)>, RuntimeError> {
    let (name, rank) = (&e.input, e.rank);
    if !held {
        return Err(RuntimeError::Lend(if rank >= plan.ranks() {
            crate::lent::no_such_rank(rank, plan.ranks())
        } else {
            format!("rank {rank} does not hold `{name}`")
        }));
    }
    let (dtype, n) = plan.buffer_extent(BufferRef::Input(id), rank);
    let mut offset = 0u64;
    let mut total = 0usize;
    let mut out = Vec::with_capacity(e.pieces.len());
    for (k, piece) in e.pieces.iter().enumerate() {
        let which = if e.pieces.len() == 1 {
            format!("`{name}` on rank {rank}")
        } else {
            format!("piece {k} of `{name}` on rank {rank}")
        };
        if piece.dtype != dtype {
            return Err(RuntimeError::Lend(format!(
                "{which} is {:?} memory; `{name}` holds {dtype:?}",
                piece.dtype
            )));
        }
        if piece.memory != device.memory() {
            return Err(RuntimeError::Lend(format!(
                "{which} is in {}; the job runs on {}",
                piece.memory,
                device.memory()
            )));
        }
        device
            .check_lent(piece.address, piece.bytes())
            .map_err(|why| RuntimeError::Lend(format!("{which}: {why}")))?;
        total += piece.len;
        out.push((piece.address, offset, piece.bytes()));
        offset += piece.bytes() as u64;
    }
    if total != n {
        return Err(RuntimeError::Lend(format!(
            "`{name}` on rank {rank} holds {n} elements ({:?}); {total} lent",
            plan.local_shape(id, rank)
        )));
    }
    Ok(out)
}

/// The buffers some action reaches other than through an elementwise kernel's positions
/// (a matmul, an exchange, a reduction, a broadcast operand): lent pieces of those are
/// gathered into the job's buffer, since no segment table can stand for them. `rank` is
/// the rank whose exchanges these are (a rank job's).
pub(crate) fn unsegmentable(
    actions: &[Action],
    program: &CudaProgram,
    rank: Option<usize>,
) -> HashSet<RankBuffer> {
    let mut out = HashSet::new();
    for a in actions {
        match a {
            Action::Launch { launch: l, .. } => {
                let twin = program.kernels[l.kernel].segments.is_some()
                    && matches!(l.mode, Mode::Elements | Mode::Vector)
                    && matches!(l.args.first(), Some(Arg::Range));
                for arg in &l.args {
                    match arg {
                        Arg::Ptr(_, PtrUse::ReadsAt | PtrUse::WritesAt) if twin => {}
                        Arg::Reads(_) | Arg::Writes(_) if twin => {}
                        Arg::Ptr(p, _) => {
                            out.insert((p.rank, p.buffer));
                        }
                        Arg::Reads(ps) | Arg::Writes(ps) => {
                            out.extend(ps.iter().map(|p| (p.rank, p.buffer)));
                        }
                        Arg::Range | Arg::I64(_) | Arg::Uniform(_) | Arg::Scratch { .. } => {}
                    }
                }
            }
            Action::Gemm(m, _) => {
                out.extend([m.a, m.b, m.out].iter().map(|p| (m.rank, p.buffer)));
            }
            Action::Exchange { sends, recvs, .. } => {
                for mv in sends.iter().chain(recvs) {
                    if let (Place::Own(b, _), Some(r)) = (mv.place, rank) {
                        out.insert((r, b));
                    }
                }
            }
            Action::Uniform(_)
            | Action::TransfersWaitKernels
            | Action::KernelsWaitTransfers
            | Action::WaitKernels
            | Action::BlockDone
            | Action::Barrier => {}
        }
    }
    out
}
