//! A fused all-reduce as every backend reads it: the reduce-scatter that starts it, the
//! stages its kernel computes on each reduced chunk, and the all-gathers that end it —
//! split once here, when the plan is lowered, so no executor splits a member list again.
//! A fused all-reduce that cannot be one pass ends with a [`FusedAllGather`].

use coconet_core::Collective;
use coconet_core::{Op, Program, ReduceOp, ValueId};

/// A split all-reduce with computation between its halves, in one pass: every rank
/// reduces its block of the operand from every peer chunk by chunk, runs the kernel on
/// the chunk, stores the sliced results and writes the gathered ones into every peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FusedAllReduce {
    /// The reduce-scatter that starts it (along dim 0; lowering fuses no other).
    pub reduce_scatter: ValueId,
    /// The reduce-scatter's operand: the full tensor every rank of the group contributes.
    pub operand: ValueId,
    /// How the operand's copies are combined.
    pub op: ReduceOp,
    /// The stages the kernel computes on each reduced chunk, in program order: pointwise
    /// stages and the updates of sliced values (the reduce-scatter's value arrives in the
    /// kernel's first register).
    pub kernel: Vec<ValueId>,
    /// Full reductions of kernel stages (on my block: LAMB's partial norms), folded
    /// chunk by chunk in the reference order as the kernel computes them; their operands
    /// need no memory.
    pub reductions: Vec<ValueId>,
    /// The all-gathers that end it, in program order.
    pub gathers: Vec<Gather>,
}

/// An all-gather ending a fused all-reduce: the kernel's register of `sent` goes to the
/// `gather`'s buffer on every peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gather {
    /// The all-gather.
    pub gather: ValueId,
    /// The kernel stage it gathers.
    pub sent: ValueId,
    /// The update that commits the gathered value to an input, if any: the gather writes
    /// that input in place, so the update itself moves nothing.
    pub update: Option<ValueId>,
}

impl FusedAllReduce {
    /// Splits the members of a fused group (in program order, the reduce-scatter
    /// excluded). `None` unless `reduce_scatter` is a reduce-scatter along dim 0.
    pub(crate) fn new(p: &Program, reduce_scatter: ValueId, members: &[ValueId]) -> Option<Self> {
        let Op::Collective(Collective::ReduceScatter(op, 0), operand) = p.node(reduce_scatter).op
        else {
            return None;
        };
        let (stages, gathers) = split_gathers(p, members);
        let (reductions, kernel) = stages
            .into_iter()
            .partition(|&m| matches!(p.node(m).op, Op::ReduceAll(..)));
        Some(FusedAllReduce {
            reduce_scatter,
            operand,
            op,
            kernel,
            reductions,
            gathers,
        })
    }

    /// Every value it computes but the reduce-scatter, in `p`'s (the plan's program's)
    /// order.
    pub fn members(&self, p: &Program) -> Vec<ValueId> {
        let computed: Vec<ValueId> = self
            .kernel
            .iter()
            .chain(&self.reductions)
            .copied()
            .collect();
        in_order(p, &computed, &self.gathers)
    }
}

/// Computation whose results go straight into every peer's buffer: a pointwise kernel
/// over my block and the all-gathers of its sliced results, in one pass. It ends a fused
/// all-reduce that cannot be one pass (LAMB's update, after the trust ratio that needs
/// both norms): the results are never stored in a buffer of mine and read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FusedAllGather {
    /// The stages the kernel computes on each chunk of my block, in program order.
    pub kernel: Vec<ValueId>,
    /// The all-gathers of kernel stages, in program order.
    pub gathers: Vec<Gather>,
}

impl FusedAllGather {
    /// Splits the members of a kernel and the all-gathers of its stages (in program order).
    pub(crate) fn new(p: &Program, members: &[ValueId]) -> Self {
        let (kernel, gathers) = split_gathers(p, members);
        FusedAllGather { kernel, gathers }
    }

    /// Every value it computes, in `p`'s (the plan's program's) order.
    pub fn members(&self, p: &Program) -> Vec<ValueId> {
        in_order(p, &self.kernel, &self.gathers)
    }
}

/// The kernel stages among `members` and the all-gathers (with the updates that commit
/// them) that end the pass.
fn split_gathers(p: &Program, members: &[ValueId]) -> (Vec<ValueId>, Vec<Gather>) {
    let gathers: Vec<Gather> = members
        .iter()
        .filter_map(|&m| match p.node(m).op {
            Op::Collective(Collective::AllGather, sent) => Some(Gather {
                gather: m,
                sent,
                update: members
                    .iter()
                    .copied()
                    .find(|&u| matches!(p.node(u).op, Op::Update { value, .. } if value == m)),
            }),
            _ => None,
        })
        .collect();
    let kernel = members
        .iter()
        .copied()
        .filter(|&m| match p.node(m).op {
            Op::Collective(Collective::AllGather, _) => false,
            Op::Update { value, .. } => !gathers.iter().any(|g| g.gather == value),
            _ => true,
        })
        .collect();
    (kernel, gathers)
}

/// The computed values, the gathers and their updates, in `p`'s order.
fn in_order(p: &Program, computed: &[ValueId], gathers: &[Gather]) -> Vec<ValueId> {
    let mine: std::collections::BTreeSet<ValueId> = computed
        .iter()
        .copied()
        .chain(
            gathers
                .iter()
                .flat_map(|g| [g.gather].into_iter().chain(g.update)),
        )
        .collect();
    p.ids().filter(|v| mine.contains(v)).collect()
}
