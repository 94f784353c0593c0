//! Ready-made schedules: the sharded optimizer update (CoCoNet's headline schedule) and
//! the enumeration of every legal candidate schedule of a program — the search space an
//! autotuner times.

use super::error::ScheduleError;
use super::rewrite::users;
use super::scheduled::Schedule;
use crate::Collective;
use crate::{DType, Dim, Layout, Op, Program, ValueId};
use std::collections::{BTreeSet, HashMap};

/// Descendants of `from` that `reorder` can move before it — computations and sends, up
/// to (not through) other collectives and matmuls — and the tensor-valued pointwise
/// computations that feed only them (so the inputs they read can be stored sliced).
fn reorderable_after(p: &Program, from: ValueId) -> Vec<ValueId> {
    let users = users(p);
    let mut set = BTreeSet::new();
    let mut stack = vec![from];
    while let Some(v) = stack.pop() {
        for &u in users.get(&v).map(Vec::as_slice).unwrap_or_default() {
            let op = &p.node(u).op;
            // A scatter takes a slice of a whole value: it stays after the gather.
            let movable = !matches!(op, Op::MatMul(..) | Op::Scatter(..))
                && (!op.is_communication() || matches!(op, Op::Collective(Collective::Send(_), _)));
            if movable && set.insert(u) {
                stack.push(u);
            }
        }
    }
    absorb_feeders(p, &users, &mut set);
    p.ids().filter(|v| set.contains(v)).collect()
}

/// Adds to `set` the pointwise computations whose users are all in it (`beta1 * m`
/// feeding Adam's update; of scalars, only those computed from full reductions, not
/// hyper-parameter arithmetic or other values) and the full reductions of Replicated
/// tensors whose users are all in it (LAMB's `norm2(w)` and `w_norm > 0`: on slices,
/// each rank reads 1/P of `w`), until there are none left.
fn absorb_feeders(
    p: &Program,
    users: &HashMap<ValueId, Vec<ValueId>>,
    set: &mut BTreeSet<ValueId>,
) {
    let from_reductions = from_reductions(p);
    loop {
        let feeders: Vec<ValueId> = set
            .iter()
            .flat_map(|&v| p.node(v).op.operands())
            .filter(|&o| {
                let n = p.node(o);
                !set.contains(&o)
                    && (super::reorder::is_pointwise(&n.op)
                        && (!n.ty.is_scalar() || from_reductions.contains(&o))
                        || replicated_reduction(p, o))
                    && users[&o].iter().all(|u| set.contains(u))
            })
            .collect();
        if feeders.is_empty() {
            return;
        }
        set.extend(feeders);
    }
}

/// The scalars computed from full reductions whose slices the ranks can reduce (of
/// Replicated tensors, or partial ones of sliced values, and their all-reduces), with
/// scalar inputs and literals: LAMB's `w_norm > 0`. A scalar computed from anything else
/// (a Local value's reduction) stays where it is.
fn from_reductions(p: &Program) -> BTreeSet<ValueId> {
    let mut set = BTreeSet::new();
    let mut uniform = BTreeSet::new();
    for v in p.ids() {
        let op = &p.node(v).op;
        match *op {
            Op::ScalarInput | Op::Literal(_) => {
                uniform.insert(v);
            }
            Op::ReduceAll(_, x)
                if replicated_reduction(p, v)
                    || matches!(p.node(x).ty.layout, Layout::Sliced(_)) =>
            {
                set.insert(v);
            }
            Op::Collective(Collective::AllReduce(_), x)
                if p.node(v).ty.is_scalar() && set.contains(&x) =>
            {
                set.insert(v);
            }
            ref op if super::reorder::is_pointwise(op) => {
                let ops = op.operands();
                if ops.iter().all(|o| uniform.contains(o)) {
                    uniform.insert(v);
                } else if p.node(v).ty.is_scalar()
                    && ops.iter().all(|o| uniform.contains(o) || set.contains(o))
                {
                    set.insert(v);
                }
            }
            _ => {}
        }
    }
    set
}

/// Whether `v` is a full reduction of a Replicated f32/f64 tensor that can be split along
/// dim 0. (On slices each rank squares and sums in the tensor's dtype before the
/// all-reduce: an f16 weight's square can overflow where the whole reduction, in f64,
/// does not.)
fn replicated_reduction(p: &Program, v: ValueId) -> bool {
    let Op::ReduceAll(_, x) = p.node(v).op else {
        return false;
    };
    let t = &p.node(x).ty;
    t.layout == Layout::Replicated
        && matches!(t.dtype, DType::F32 | DType::F64)
        && t.shape.0.first().is_some_and(|d| *d != Dim::Const(1))
}

/// The stages of the fused all-reduce that starts at `rs`: everything computed from it
/// up to and including the all-gathers that end it (and the updates they write).
fn fused_all_reduce_members(s: &Schedule, rs: ValueId) -> Vec<ValueId> {
    let p = s.program();
    let users = users(p);
    let mut members = BTreeSet::from([rs]);
    let mut stack = vec![rs];
    while let Some(v) = stack.pop() {
        let gathered = matches!(p.node(v).op, Op::Collective(Collective::AllGather, _));
        for &u in users.get(&v).map(Vec::as_slice).unwrap_or_default() {
            let op = &p.node(u).op;
            // After an all-gather only its in-place update belongs to the kernel.
            let take = if gathered {
                matches!(op, Op::Update { .. })
            } else {
                !matches!(op, Op::MatMul(..))
                    && (!op.is_communication()
                        || matches!(op, Op::Collective(Collective::AllGather, _))
                        || (matches!(op, Op::Collective(Collective::AllReduce(_), _))
                            && p.node(u).ty.is_scalar()))
            };
            if take && members.insert(u) {
                stack.push(u);
            }
        }
    }
    absorb_feeders(p, &users, &mut members);
    // The partial reductions the computation completes (LAMB's ‖w‖ on slices): their
    // all-reduce, the partial reduction and what feeds it, so the pass that reduces the
    // gradients also folds them.
    loop {
        let more: Vec<ValueId> = members
            .iter()
            .flat_map(|&v| p.node(v).op.operands())
            .filter(|o| {
                let op = &p.node(*o).op;
                let sliced_reduction = |v: ValueId| {
                    matches!(p.node(v).op, Op::ReduceAll(_, x)
                        if matches!(p.node(x).ty.layout, Layout::Sliced(_)))
                };
                let partial = match *op {
                    Op::Collective(Collective::AllReduce(_), x) => {
                        p.node(*o).ty.is_scalar() && sliced_reduction(x)
                    }
                    _ => sliced_reduction(*o),
                };
                partial && !members.contains(o) && users[o].iter().all(|u| members.contains(u))
            })
            .collect();
        if more.is_empty() {
            break;
        }
        members.extend(more);
        absorb_feeders(p, &users, &mut members);
    }
    p.ids().filter(|v| members.contains(v)).collect()
}

/// CoCoNet's sharded update of all-reduce `ar`: `split` it, `reorder` the computations
/// after it onto slices, store the optimizer `state` sliced (`as_slice`, 1/P memory), and
/// `fuse` reduce-scatter, computation and all-gathers into one fused all-reduce.
pub fn sharded_update(
    program: &Program,
    ar: impl Into<ValueId>,
    state: &[ValueId],
) -> Result<Schedule, ScheduleError> {
    let mut s = sharded(program, ar.into(), state)?;
    let rs = s.fused_rs.take().expect("set by sharded");
    s.schedule.fuse_all_reduce(rs)?;
    Ok(s.schedule.named("fuse(RS-C-AG)"))
}

impl Schedule {
    /// [`Schedule::reorder`] of every computation after all-gather `ag` that can move
    /// before it: its descendants up to the next collective or matmul, and the
    /// tensor-valued pointwise computations that only feed them.
    pub fn reorder_all(
        &mut self,
        ag: impl Into<ValueId>,
    ) -> Result<super::Reordered, ScheduleError> {
        let ag = self.stage("reorder", ag)?;
        let comps = reorderable_after(&self.program, ag);
        self.reorder(&comps, ag)
    }

    /// [`Schedule::fuse`] of the split all-reduce that starts at reduce-scatter `rs`: the
    /// computation that follows it, up to and including the all-gathers that end it
    /// (and the updates they write), and the pointwise computations that only feed it.
    pub fn fuse_all_reduce(&mut self, rs: impl Into<ValueId>) -> Result<usize, ScheduleError> {
        let rs = self.stage("fuse", rs)?;
        if !matches!(
            self.program.node(rs).op,
            Op::Collective(Collective::ReduceScatter(..), _)
        ) {
            return Err(ScheduleError::new(
                "fuse",
                format!("{} is not a reduce_scatter", self.label(rs)),
            ));
        }
        let members = fused_all_reduce_members(self, rs);
        self.fuse(&members)
    }
}

/// Fuses the computations among `stages` (collectives, matmuls and the updates that
/// write a collective's result left out) into one kernel: an unfused schedule still runs
/// its optimizer as one pass over the data after the collective, as Apex FusedAdam and
/// torch's `fused=True` do, so comparing against it measures what fusing the collective
/// itself gains. Where the computation cannot be one group (LAMB's norms are all-reduced
/// between its two halves), each run of it between two collectives is fused on its own;
/// a run that cannot be fused is left as it is.
fn fuse_computation(s: &mut Schedule, stages: &[ValueId]) {
    let p = s.program();
    let communicated = |v: ValueId| p.node(v).op.is_communication();
    let member: Vec<bool> = stages
        .iter()
        .map(|&v| match p.node(v).op {
            Op::MatMul(..) => false,
            Op::Update { value, .. } => !communicated(value),
            ref op => !op.is_communication(),
        })
        .collect();
    let members: Vec<ValueId> = stages
        .iter()
        .zip(&member)
        .filter_map(|(&v, &m)| m.then_some(v))
        .collect();
    // A failed fuse leaves the schedule as it was.
    if members.len() < 2 || s.fuse(&members).is_ok() {
        return;
    }
    let mut runs: Vec<Vec<ValueId>> = vec![Vec::new()];
    for (&v, &m) in stages.iter().zip(&member) {
        if m {
            runs.last_mut().expect("never empty").push(v);
        } else if !runs.last().expect("never empty").is_empty() {
            runs.push(Vec::new());
        }
    }
    for run in runs.iter().filter(|r| r.len() > 1) {
        let _ = s.fuse(run);
    }
}

struct Sharded {
    schedule: Schedule,
    fused_rs: Option<ValueId>,
}

/// split → reorder → as_slice, not fused (the `RS-C-AG` schedule).
fn sharded(program: &Program, ar: ValueId, state: &[ValueId]) -> Result<Sharded, ScheduleError> {
    let mut s = Schedule::new(program);
    let (rs, ag) = s.split(ar)?;
    if !reorderable_after(s.program(), ag).is_empty() {
        s.reorder_all(ag)?;
    }
    if !state.is_empty() {
        s.as_slice(state)?;
    }
    Ok(Sharded {
        schedule: s.named("RS-C-AG"),
        fused_rs: Some(rs),
    })
}

/// Every legal candidate schedule of a program with one all-reduce to transform (the
/// first one; programs with several are enumerated per all-reduce in turn):
///
/// - `AR-C` (`MM-AR-C` after a matmul, `AR-C-P2P` before a send): as written, the
///   computation after each all-reduce fused into one kernel where it can be;
/// - `RS-C-AG` (`MM-RS-C-AG`, `RS-C-P2P-AG`): split, reorder, `as_slice(state)`, the
///   computation on the slices fused into one kernel where it can be;
/// - `fuse(RS-C-AG)`: the same as one fused all-reduce (`fuse(RS-C)-P2P-AG` when a send
///   separates the halves);
/// - `ol(MM, fuse(RS-C-AG))` when the all-reduce reads a matmul: the fused all-reduce
///   overlapped with the matmul;
/// - `fuse(RS-C-P2P) + ol(P2P, AG)` when the reordered computation ends in a `send`.
///
/// Candidates whose preconditions fail (e.g. a `state` tensor that cannot be sliced in
/// this program) are left out, so every returned schedule is legal.
pub fn candidates(program: &Program, state: &[ValueId]) -> Vec<Schedule> {
    candidates_explained(program, state).0
}

/// [`candidates`], and why each candidate that was left out is not legal (e.g. "RS-C-AG
/// for `g1`: as_slice: `g` is Local ..."), so a short list is never a mystery.
pub fn candidates_explained(program: &Program, state: &[ValueId]) -> (Vec<Schedule>, Vec<String>) {
    let mut skipped = Vec::new();
    let has_send = program
        .ids()
        .any(|v| matches!(program.node(v).op, Op::Collective(Collective::Send(_), _)));
    let ars: Vec<ValueId> = program
        .ids()
        .filter(|&v| {
            matches!(
                program.node(v).op,
                Op::Collective(Collective::AllReduce(_), _)
            ) && !program.node(v).ty.is_scalar()
        })
        .collect();
    let after_matmul = ars.first().is_some_and(|&ar| match program.node(ar).op {
        Op::Collective(Collective::AllReduce(_), x) => matches!(program.node(x).op, Op::MatMul(..)),
        _ => false,
    });
    let as_written = match (after_matmul, has_send) {
        (true, _) => "MM-AR-C",
        (false, true) => "AR-C-P2P",
        (false, false) => "AR-C",
    };
    let mut written = Schedule::new(program);
    for &ar in &ars {
        let after = reorderable_after(written.program(), ar);
        fuse_computation(&mut written, &after);
    }
    let mut out = vec![written.named(as_written)];
    for ar in ars {
        let label = program.label(ar);
        let Sharded { schedule, fused_rs } = match sharded(program, ar, state) {
            Ok(s) => s,
            Err(e) => {
                skipped.push(format!("RS-C-AG and its fusions for `{label}`: {e}"));
                continue;
            }
        };
        let rs = fused_rs.expect("set");
        let Op::Collective(Collective::AllReduce(_), input) = program.node(ar).op else {
            unreachable!()
        };
        let matmul = matches!(program.node(input).op, Op::MatMul(..)).then_some(input);
        let prefix = if matmul.is_some() { "MM-" } else { "" };
        let plain = if has_send { "RS-C-P2P-AG" } else { "RS-C-AG" };
        let mut unfused = schedule.clone();
        let on_slices = fused_all_reduce_members(&unfused, rs);
        fuse_computation(&mut unfused, &on_slices);
        out.push(unfused.named(format!("{prefix}{plain}")));
        let mut fused = schedule.clone();
        let fuse = fused.fuse_all_reduce(rs);
        if let Err(e) = &fuse {
            skipped.push(format!("fuse(RS-C-AG) for `{label}`: {e}"));
        }
        if fuse.is_ok() {
            let name = if has_send {
                "fuse(RS-C)-P2P-AG"
            } else {
                "fuse(RS-C-AG)"
            };
            out.push(fused.clone().named(name));
            if let Some(mm) = matmul {
                let mut ol = fused.clone();
                match ol.overlap(mm, rs) {
                    Ok(_) => out.push(ol.named("ol(MM, fuse(RS-C-AG))")),
                    Err(e) => skipped.push(format!("ol(MM, fuse(RS-C-AG)) for `{label}`: {e}")),
                }
            }
        }
        if let Some(s) = send_pipeline(&schedule, rs) {
            out.push(s);
        }
    }
    (out, skipped)
}

/// For a reordered program whose computation ends in a `send`: fuse the computation
/// into the send, and overlap reduce-scatter → fused send → all-gather.
fn send_pipeline(schedule: &Schedule, rs: ValueId) -> Option<Schedule> {
    let p = schedule.program();
    let users = users(p);
    let send = p
        .ids()
        .find(|&v| matches!(p.node(v).op, Op::Collective(Collective::Send(_), _)))?;
    // Computations between the reduce-scatter and the send, and the send.
    let mut members: Vec<ValueId> = p
        .ids()
        .filter(|&v| {
            v != rs
                && !p.node(v).op.is_communication()
                && !matches!(
                    p.node(v).op,
                    Op::TensorInput | Op::ScalarInput | Op::Literal(_)
                )
                && depends(p, v, rs)
                && depends(p, send, v)
        })
        .collect();
    members.push(send);
    let ag = users
        .get(&send)?
        .iter()
        .copied()
        .find(|&u| matches!(p.node(u).op, Op::Collective(Collective::AllGather, _)))?;
    let mut s = schedule.clone();
    s.fuse(&members).ok()?;
    s.overlap(rs, send).ok()?;
    s.overlap(send, ag).ok()?;
    Some(s.named("ol(RS, fuse(C-P2P), AG)"))
}

/// Whether `v` depends on `on`.
fn depends(p: &Program, v: ValueId, on: ValueId) -> bool {
    let mut stack = vec![v];
    let mut seen = BTreeSet::new();
    while let Some(x) = stack.pop() {
        if x == on {
            return true;
        }
        for o in p.node(x).op.operands() {
            if seen.insert(o) {
                stack.push(o);
            }
        }
    }
    false
}
