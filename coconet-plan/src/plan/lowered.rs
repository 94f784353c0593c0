//! The plan itself: a lowered schedule — its steps in order, where every value lives,
//! the runtime buffers — which is all a backend reads (lowering adds its constructors in
//! `lower.rs`, buffer geometry its methods in `geometry.rs`).

use super::fused::{FusedAllGather, FusedAllReduce};
use super::overlap::Pieces;
use coconet_core::{DType, Program, Schedule, ValueId};
use std::collections::{BTreeMap, HashMap};

/// Where a value lives on a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// The caller's buffer of this tensor input (also where in-place updates write).
    Input(ValueId),
    /// A runtime-allocated buffer.
    Slot(usize),
    /// My block along `dim` of another value (a `scatter`): no storage of its own.
    View {
        /// The viewed value.
        of: ValueId,
        /// The sliced dim.
        dim: usize,
    },
    /// A scalar computed from scalar inputs and literals: the same on every rank.
    Uniform,
    /// Lives in registers inside its kernel only.
    Register,
}

/// A runtime-allocated buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Element type.
    pub dtype: DType,
    /// Elements on each rank (0 where the rank does not hold it).
    pub elements: Vec<usize>,
}

/// One step of the plan; every rank executes every step in order (ranks outside a
/// value's group skip its computation but take part in barriers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanStep {
    /// Scalars computed from scalar inputs and literals.
    Uniform(Vec<ValueId>),
    /// Pointwise stages evaluated together over chunks of one iteration space.
    Kernel(Vec<ValueId>),
    /// One operation that is not pointwise (matmul, reductions, layer norm, collectives).
    Op(ValueId),
    /// A split all-reduce with computation between its halves, in one pass.
    FusedAllReduce(FusedAllReduce),
    /// A kernel whose results go straight to every peer (all-gathers), in one pass.
    FusedAllGather(FusedAllGather),
    /// A matmul whose row chunks feed a fused all-reduce as they are produced.
    Overlap {
        /// The matmul.
        matmul: ValueId,
        /// The fused all-reduce consuming its rows.
        consumer: FusedAllReduce,
    },
    /// Copies an update's value into its input at the end (when it could not be
    /// written in place).
    Commit {
        /// The updated input.
        target: ValueId,
        /// The update node (its slot holds the new value).
        update: ValueId,
    },
}

/// A schedule lowered for a number of ranks and bound dims.
#[derive(Debug, Clone)]
pub struct Plan {
    pub(crate) schedule: Schedule,
    pub(crate) ranks: usize,
    pub(crate) group_size: usize,
    pub(crate) dims: BTreeMap<String, usize>,
    pub(crate) shapes: HashMap<ValueId, Vec<usize>>,
    pub(crate) steps: Vec<PlanStep>,
    pub(crate) storage: HashMap<ValueId, Storage>,
    pub(crate) slots: Vec<Slot>,
    /// Values whose slot a later value took over (value → the later value): their
    /// memory holds someone else's data after a run.
    pub(crate) overwritten: HashMap<ValueId, ValueId>,
}

impl Plan {
    /// The scheduled program's value that `v` denotes. Handles of the unscheduled
    /// program (`p.g1`) stay valid after `split` or `reorder` replaced the node: the
    /// scheduled program's value of the same name holds the same logical value.
    pub fn resolve(&self, v: ValueId) -> Result<ValueId, crate::RuntimeError> {
        resolve(&self.schedule, v)
    }

    /// Why `v` cannot be read after a run, if it cannot: it lived only in registers or
    /// as a scalar, or a later value took over its memory (both backends and users ask
    /// before reading a value's memory).
    pub fn unreadable(&self, v: ValueId) -> Option<String> {
        let p = self.program();
        let mut at = v;
        loop {
            match self.storage(at) {
                Some(Storage::View { of, .. }) => at = of,
                Some(Storage::Input(_)) => return None,
                Some(Storage::Slot(_)) => break,
                Some(Storage::Uniform | Storage::Register) | None => {
                    return Some(format!(
                        "`{}` is not kept in memory (it lives only inside its kernel); lower with Plan::lower_observing to keep it",
                        p.label(v)
                    ));
                }
            }
        }
        self.overwritten.get(&at).map(|later| {
            format!(
                "`{}` is not kept: its memory was reused by `{}` later in the run; lower with Plan::lower_observing to keep it",
                p.label(v),
                p.label(*later)
            )
        })
    }

    /// The tensor input named `name` (an error naming it when there is none: results
    /// are read by name).
    pub fn tensor_input(&self, name: &str) -> Result<ValueId, crate::RuntimeError> {
        let p = self.program();
        p.find(name)
            .filter(|&id| p.node(id).op == coconet_core::Op::TensorInput)
            .ok_or_else(|| crate::RuntimeError::Read(format!("`{name}` is not a tensor input")))
    }

    /// Checks `bindings` against the plan (the dims it was lowered for, then every input
    /// exactly as the reference interpreter checks them) and lays the inputs out per rank.
    /// Backends call it before allocating anything, so a bad binding changes nothing.
    pub fn bind<'a>(
        &self,
        bindings: &'a coconet_core::Bindings,
    ) -> Result<coconet_core::BoundInputs<'a>, crate::RuntimeError> {
        self.check_dims(bindings)?;
        Ok(coconet_core::bind_inputs(
            self.program(),
            self.ranks,
            bindings,
        )?)
    }

    /// The bindings must give the dims the plan was lowered for.
    fn check_dims(&self, bindings: &coconet_core::Bindings) -> Result<(), crate::RuntimeError> {
        if bindings.dims() == &self.dims {
            return Ok(());
        }
        Err(crate::RuntimeError::Plan(format!(
            "the plan was lowered for dims {:?}, but the bindings give {:?}",
            self.dims,
            bindings.dims()
        )))
    }

    /// [`Plan::bind`] for a process that runs rank `rank` only: only that rank's data
    /// is laid out, and inputs may be bound for this rank alone
    /// ([`TensorArg::ThisRank`](coconet_core::interp::TensorArg::ThisRank)).
    pub fn bind_rank<'a>(
        &self,
        bindings: &'a coconet_core::Bindings,
        rank: usize,
    ) -> Result<coconet_core::BoundInputs<'a>, crate::RuntimeError> {
        self.check_dims(bindings)?;
        Ok(coconet_core::bind_rank_inputs(
            self.program(),
            self.ranks,
            rank,
            bindings,
        )?)
    }

    /// The program the plan executes.
    pub fn program(&self) -> &Program {
        self.schedule.program()
    }

    /// The schedule it was lowered from.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The symbolic dimensions' values the plan was lowered for.
    pub fn dims(&self) -> &BTreeMap<String, usize> {
        &self.dims
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The steps, in execution order.
    pub fn steps(&self) -> &[PlanStep] {
        &self.steps
    }

    /// Where a value lives.
    pub fn storage(&self, v: ValueId) -> Option<Storage> {
        self.storage.get(&v).copied()
    }

    /// The runtime-allocated buffers.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// Bytes of runtime-allocated buffers on the busiest rank (inputs not counted).
    pub fn slot_bytes(&self) -> usize {
        (0..self.ranks)
            .map(|r| {
                self.slots
                    .iter()
                    .map(|s| s.elements[r] * s.dtype.size_bytes())
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0)
    }

    /// Bytes of runtime-allocated buffers over all ranks (an error if the sum does not
    /// fit in memory's address space).
    pub fn total_slot_bytes(&self) -> Result<usize, crate::RuntimeError> {
        self.slots
            .iter()
            .flat_map(|s| {
                s.elements
                    .iter()
                    .map(|&n| n.checked_mul(s.dtype.size_bytes()))
            })
            .try_fold(0usize, |sum, b| sum.checked_add(b?))
            .ok_or_else(|| {
                crate::RuntimeError::Plan(format!(
                    "the runtime buffers of `{}` on {} ranks exceed the address space",
                    self.program().name(),
                    self.ranks
                ))
            })
    }

    /// The values stored in runtime buffer `slot`, by name (for messages).
    pub fn slot_users(&self, slot: usize) -> String {
        let p = self.program();
        let mut names: Vec<String> = p
            .ids()
            .filter(|v| self.storage(*v) == Some(Storage::Slot(slot)))
            .map(|v| format!("`{}`", p.label(v)))
            .collect();
        names.dedup();
        names.join(", ")
    }

    /// How an overlapped `matmul` hands its output to the fused all-reduce (see
    /// [`PIECES_PER_BLOCK`](crate::plan::PIECES_PER_BLOCK)).
    pub fn overlap_pieces(&self, matmul: ValueId) -> Pieces {
        Pieces::new(self.shape(matmul), self.group_size)
    }

    /// The logical shape of a value.
    pub fn shape(&self, v: ValueId) -> &[usize] {
        &self.shapes[&v]
    }

    /// A one-line description of a step, for traces and printing.
    pub fn describe(&self, step: &PlanStep) -> String {
        let p = self.program();
        let names = |vs: &[ValueId]| {
            vs.iter()
                .map(|&v| p.label(v))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match step {
            PlanStep::Uniform(vs) => format!("scalars [{}]", names(vs)),
            PlanStep::Kernel(vs) => format!("kernel [{}]", names(vs)),
            PlanStep::Op(v) => format!("{} {}", p.node(*v).op.name(), p.label(*v)),
            PlanStep::FusedAllReduce(f) => format!(
                "fused all-reduce {} [{}]",
                p.label(f.reduce_scatter),
                names(&f.members(p))
            ),
            PlanStep::FusedAllGather(f) => {
                format!("fused all-gather [{}]", names(&f.members(p)))
            }
            PlanStep::Overlap { matmul, consumer } => {
                format!(
                    "overlap {} with {}",
                    p.label(*matmul),
                    self.describe(&PlanStep::FusedAllReduce(consumer.clone()))
                )
            }
            PlanStep::Commit { target, .. } => format!("commit {}", p.label(*target)),
        }
    }
}

/// [`Plan::resolve`] on a schedule (also for the values a plan is lowered to observe).
pub(crate) fn resolve(schedule: &Schedule, v: ValueId) -> Result<ValueId, crate::RuntimeError> {
    let p = schedule.program();
    if p.get(v).is_some() {
        return Ok(v);
    }
    let original = schedule.original();
    let Some(_) = original.get(v) else {
        return Err(crate::RuntimeError::Read(format!(
            "{v} is not a value of `{}`",
            p.name()
        )));
    };
    let label = original.label(v);
    p.find(&label).ok_or_else(|| {
        crate::RuntimeError::Read(format!(
            "`{label}` is not computed by the schedule `{}` ({}): its transformations \
                 replaced it; read one of the scheduled program's values instead",
            schedule.name(),
            schedule.steps().join(", ")
        ))
    })
}
