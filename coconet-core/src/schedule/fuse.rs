//! `fuse` and `overlap`: annotations on the final program saying how it executes.
//!
//! **Fusion legality.** A fusion group is a set of stages that becomes one kernel:
//! - every member is a stage of the program (not an input or a literal), in one process
//!   group, and in no other fusion group; no member is a `matmul` (use `overlap`);
//! - the group is convex: no path leaves the group and comes back (that would be a cycle
//!   between the fused kernel and the outside stage);
//! - its communication forms at most one collective: either a single collective
//!   (all_reduce, reduce_scatter, all_gather, broadcast, reduce or send — computation is
//!   applied where the collective's values appear, as in CoCoNet), or one
//!   reduce_scatter with all_gathers and scalar all_reduces that depend on it inside the
//!   group or complete a partial reduction of a sliced value inside the group (a split
//!   all-reduce with computation between its halves; the scalar all-reduces complete
//!   partial norms, as in fused LAMB: ‖r‖ of the reduced values, ‖w‖ of the weights'
//!   slices).
//!
//! **Overlap legality.** `overlap(producer, consumer)` runs a producer and the collective
//! consuming its result concurrently, chunk by chunk (a matmul's row blocks, a
//! collective's chunks):
//! - the producer is a `matmul` or a collective; the consumer is a collective that — or
//!   whose fusion group — reads the producer's result (or its fusion group's);
//! - every stage on both sides is chunk-local: pointwise, dropout (its mask depends on
//!   the logical index only), layer_norm over the last dim (rows are never split between
//!   chunks); a full reduction needs every chunk before any result and is rejected;
//! - each producer and consumer is in at most one overlap (the consumer reads the
//!   producer's result, so both run where that result lives; a `send` producer hands
//!   chunks to the next group's collective).

use super::error::ScheduleError;
use super::fusion::{Fusion, FusionKind, Overlap};
use super::rewrite::users;
use super::scheduled::Schedule;
use crate::Collective;
use crate::{Op, ValueId};
use std::collections::BTreeSet;

impl Schedule {
    /// Fuses `stages` into one kernel; returns the index of the fusion group.
    pub fn fuse(&mut self, stages: &[ValueId]) -> Result<usize, ScheduleError> {
        const T: &str = "fuse";
        let p = &self.program;
        if stages.len() < 2 {
            return Err(ScheduleError::new(
                T,
                "a fusion group needs at least two stages",
            ));
        }
        let mut members = BTreeSet::new();
        for &s in stages {
            let s = self.stage(T, s)?;
            let node = p.node(s);
            if matches!(node.op, Op::TensorInput | Op::ScalarInput | Op::Literal(_)) {
                return Err(ScheduleError::new(
                    T,
                    format!("{} is an input, not a stage", self.label(s)),
                ));
            }
            if matches!(node.op, Op::MatMul(..)) {
                return Err(ScheduleError::new(
                    T,
                    format!(
                        "{} is a matmul; it is not fused into pointwise kernels or collectives — \
                         overlap it with its consumer instead",
                        self.label(s)
                    ),
                ));
            }
            if let Some(g) = self.fusion_of(s) {
                return Err(ScheduleError::new(
                    T,
                    format!("{} is already in fusion group {g}", self.label(s)),
                ));
            }
            members.insert(s);
        }
        // A kernel runs in one process group; a send belongs to both of its groups
        // (computation fuses into it on the sending or the receiving side).
        let groups_of = |v: ValueId| -> BTreeSet<String> {
            let node = p.node(v);
            let mut g = BTreeSet::from([format!("{}", node.ty.placement)]);
            if let Op::Collective(Collective::Send(_), x) = node.op {
                g.insert(format!("{}", p.node(x).ty.placement));
            }
            g
        };
        let mut common: Option<BTreeSet<String>> = None;
        for &m in &members {
            let g = groups_of(m);
            if g.contains("all groups") {
                continue;
            }
            common = Some(match common {
                None => g,
                Some(c) => c.intersection(&g).cloned().collect(),
            });
        }
        if common.as_ref().is_some_and(BTreeSet::is_empty) {
            let all: BTreeSet<String> = members.iter().flat_map(|&m| groups_of(m)).collect();
            return Err(ScheduleError::new(
                T,
                format!(
                    "the stages live in different process groups ({}); a kernel runs in one",
                    all.into_iter().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        if let Some(v) = cycle_through(p, &members) {
            return Err(ScheduleError::new(
                T,
                format!(
                    "fusing would create a cycle: {} depends on a fused stage and a fused stage \
                     depends on it",
                    self.label(v)
                ),
            ));
        }
        let kind = self.collective_kind(&members)?;
        self.fusions.push(Fusion { members, kind });
        let names: Vec<String> = stages.iter().map(|&s| p.label(s)).collect();
        self.steps.push(format!("fuse([{}])", names.join(", ")));
        Ok(self.fusions.len() - 1)
    }

    fn collective_kind(&self, members: &BTreeSet<ValueId>) -> Result<FusionKind, ScheduleError> {
        let p = &self.program;
        let comms: Vec<ValueId> = members
            .iter()
            .copied()
            .filter(|&s| p.node(s).op.is_communication())
            .collect();
        match comms.as_slice() {
            [] => return Ok(FusionKind::Computation),
            [c] => return Ok(FusionKind::Collective(*c)),
            _ => {}
        }
        let rs: Vec<ValueId> = comms
            .iter()
            .copied()
            .filter(|&c| {
                matches!(
                    p.node(c).op,
                    Op::Collective(Collective::ReduceScatter(..), _)
                )
            })
            .collect();
        let describe = || {
            comms
                .iter()
                .map(|&c| format!("{} ({})", self.label(c), p.node(c).op.name()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let [rs] = rs.as_slice() else {
            return Err(ScheduleError::new(
                "fuse",
                format!(
                    "a fused kernel holds one collective, but these stages contain {}: {}",
                    comms.len(),
                    describe()
                ),
            ));
        };
        for &c in &comms {
            let node = p.node(c);
            let fits = match node.op {
                Op::Collective(Collective::ReduceScatter(..), _) => c == *rs,
                Op::Collective(Collective::AllGather, _) => true,
                Op::Collective(Collective::AllReduce(_), _) => node.ty.is_scalar(),
                _ => false,
            };
            let completes_partial = match node.op {
                Op::Collective(Collective::AllReduce(_), x) => {
                    members.contains(&x)
                        && matches!(p.node(x).op, Op::ReduceAll(_, y)
                            if matches!(p.node(y).ty.layout, crate::Layout::Sliced(_)))
                }
                _ => false,
            };
            let depends = c == *rs || depends_within(p, members, c, *rs) || completes_partial;
            if !fits || !depends {
                return Err(ScheduleError::new(
                    "fuse",
                    format!(
                        "a fused kernel holds one collective; {} ({}) is not part of the \
                         split all-reduce started by {} (all collectives here: {})",
                        self.label(c),
                        node.op.name(),
                        self.label(*rs),
                        describe()
                    ),
                ));
            }
        }
        Ok(FusionKind::AllReduce {
            reduce_scatter: *rs,
        })
    }

    /// Runs `producer` (a matmul or a collective) and the collective `consumer` that
    /// reads its result concurrently, chunk by chunk. See the module docs for the rules.
    pub fn overlap(
        &mut self,
        producer: impl Into<ValueId>,
        consumer: impl Into<ValueId>,
    ) -> Result<(), ScheduleError> {
        const T: &str = "overlap";
        let producer = self.stage(T, producer)?;
        let consumer = self.stage(T, consumer)?;
        let p = &self.program;
        let pnode = p.node(producer);
        if !matches!(pnode.op, Op::MatMul(..)) && !pnode.op.is_communication() {
            return Err(ScheduleError::new(
                T,
                format!(
                    "the producer {} is {}; overlap pipelines the chunks of a matmul or a \
                     collective",
                    self.label(producer),
                    super::error::article(pnode.op.name())
                ),
            ));
        }
        let cnode = p.node(consumer);
        let side = |v: ValueId| -> BTreeSet<ValueId> {
            match self.fusion_of(v) {
                Some(g) => self.fusions[g].members.clone(),
                None => BTreeSet::from([v]),
            }
        };
        let (pside, cside) = (side(producer), side(consumer));
        let reads = cside
            .iter()
            .any(|&m| p.node(m).op.operands().iter().any(|o| pside.contains(o)));
        if !cnode.op.is_communication()
            || consumer == producer
            || !pside.is_disjoint(&cside)
            || !reads
        {
            return Err(ScheduleError::new(
                T,
                format!(
                    "the consumer {} must be a collective (or fused into one) that reads the \
                     result of {}",
                    self.label(consumer),
                    self.label(producer)
                ),
            ));
        }
        for &m in pside.iter().chain(&cside) {
            if matches!(p.node(m).op, Op::ReduceAll(..)) {
                return Err(ScheduleError::new(
                    T,
                    format!(
                        "{} is a full reduction, which needs every chunk before any result: \
                         its kernel cannot run chunk by chunk",
                        self.label(m)
                    ),
                ));
            }
        }
        for o in &self.overlaps {
            if o.consumer == consumer || o.producer == producer {
                return Err(ScheduleError::new(
                    T,
                    format!(
                        "{} -> {} is already overlapped",
                        self.label(o.producer),
                        self.label(o.consumer)
                    ),
                ));
            }
        }
        self.overlaps.push(Overlap { producer, consumer });
        self.steps.push(format!(
            "overlap({}, {})",
            p.label(producer),
            p.label(consumer)
        ));
        Ok(())
    }
}

/// A stage outside `members` that depends on a member and that a member depends on.
fn cycle_through(p: &crate::Program, members: &BTreeSet<ValueId>) -> Option<ValueId> {
    let users = users(p);
    let walk = |next: &dyn Fn(ValueId) -> Vec<ValueId>| {
        let mut seen: BTreeSet<ValueId> = BTreeSet::new();
        let mut stack: Vec<ValueId> = members.iter().copied().collect();
        while let Some(v) = stack.pop() {
            for u in next(v) {
                if seen.insert(u) {
                    stack.push(u);
                }
            }
        }
        seen
    };
    let descendants = walk(&|v| users.get(&v).cloned().unwrap_or_default());
    let ancestors = walk(&|v| p.node(v).op.operands());
    p.ids()
        .find(|v| !members.contains(v) && descendants.contains(v) && ancestors.contains(v))
}

/// Whether `v` depends on `on` through members of the group.
fn depends_within(
    p: &crate::Program,
    members: &BTreeSet<ValueId>,
    v: ValueId,
    on: ValueId,
) -> bool {
    let mut stack = vec![v];
    let mut seen = BTreeSet::new();
    while let Some(x) = stack.pop() {
        for o in p.node(x).op.operands() {
            if o == on {
                return true;
            }
            if members.contains(&o) && seen.insert(o) {
                stack.push(o);
            }
        }
    }
    false
}
