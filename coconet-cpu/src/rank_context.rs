//! What a rank thread sees while it runs a plan: its view of every rank's memory, the
//! plan, the communicator, and the values computed on the host. Every step's code (the
//! kernels, collectives, the fused all-reduce, the other ops) reads and writes through
//! it; the dispatcher (`exec.rs`) builds it and runs the steps.

use super::array::{Array, Mapping};
use super::sync::World;
use coconet_core::ValueId;
use coconet_plan::RuntimeError;
use coconet_plan::host::memory::Raw;
use coconet_plan::plan::{
    BufferRef, FusedAllGather, FusedAllReduce, Plan, PlanStep, Storage, logical_origin,
};
use std::collections::HashMap;

/// Raw views of one rank's buffers.
#[derive(Debug, Clone, Default)]
pub struct RankRaw {
    pub inputs: HashMap<ValueId, Raw>,
    pub slots: Vec<Raw>,
}

/// How ranks communicate: shared memory between rank threads ([`SharedMemory`]), or a
/// message-passing library between processes (the `mpi` feature). Everything else a rank
/// does — kernels, matmuls, reductions — is the same code.
pub trait Comm {
    /// Runs collective `v` (every rank calls it).
    fn collective(&self, ctx: &Ctx, v: ValueId, at: &str) -> Result<(), RuntimeError>;

    /// Runs a fused all-reduce (optionally overlapped with a matmul).
    fn fused(
        &self,
        ctx: &Ctx,
        f: &FusedAllReduce,
        matmul: Option<ValueId>,
        at: &str,
    ) -> Result<(), RuntimeError>;

    /// Runs a kernel whose results go straight to every peer (every rank calls it).
    fn fused_gather(&self, ctx: &Ctx, f: &FusedAllGather, at: &str) -> Result<(), RuntimeError>;
}

/// What a rank thread sees.
pub struct Ctx<'a> {
    pub plan: &'a Plan,
    pub comm: &'a dyn Comm,
    pub rank: usize,
    pub world: &'a World,
    pub mem: &'a [RankRaw],
    pub scalars: &'a HashMap<ValueId, f64>,
    pub uniform: HashMap<ValueId, f64>,
    pub epoch: u64,
    /// Overlap steps run so far in this run: with the epoch, it stamps chunk flags so
    /// each overlap of each run waits for its own flags (flags are never reset).
    pub overlaps: u64,
    /// The stamp of the overlap step running now.
    pub epoch_stamp: u64,
    /// Elements per kernel chunk ([`super::RunOptions::chunk`]).
    pub chunk: usize,
}

impl Ctx<'_> {
    /// The flag stamp of the next overlap step: strictly increasing over the overlaps
    /// of a run and over runs.
    pub fn next_stamp(&mut self) -> u64 {
        let per_run = self
            .plan
            .steps()
            .iter()
            .filter(|s| matches!(s, PlanStep::Overlap { .. }))
            .count() as u64;
        self.overlaps += 1;
        (self.epoch - 1) * per_run + self.overlaps
    }
}

impl Ctx<'_> {
    /// Ranks per group.
    pub fn q(&self) -> usize {
        self.plan.group_size()
    }

    /// World ranks holding values placed like `v`.
    pub fn holders(&self, v: ValueId) -> std::ops::Range<usize> {
        self.plan.holders(v)
    }

    /// Whether rank `r` holds `v`.
    pub fn holds(&self, v: ValueId, r: usize) -> bool {
        self.holders(v).contains(&r)
    }

    /// The shape of `v`'s data on rank `r`.
    pub fn local_shape(&self, v: ValueId, r: usize) -> Vec<usize> {
        self.plan.local_shape(v, r)
    }

    /// The raw buffer behind `v` on rank `r`, if it has one of its own.
    pub fn raw(&self, v: ValueId, r: usize) -> Option<Raw> {
        match self.plan.storage(v)? {
            Storage::Input(t) => self.mem[r].inputs.get(&t).copied(),
            Storage::Slot(s) => Some(self.mem[r].slots[s]),
            _ => None,
        }
    }

    /// `v`'s data on rank `r` as a strided array (None for uniforms and registers).
    pub fn array(&self, v: ValueId, r: usize) -> Option<Array> {
        let view = self.plan.view(v, r)?;
        Some(Array {
            raw: self.raw_of(view.buffer, r)?,
            view,
        })
    }

    /// The raw buffer behind a buffer reference on rank `r`.
    pub fn raw_of(&self, b: BufferRef, r: usize) -> Option<Raw> {
        match b {
            BufferRef::Input(t) => self.mem[r].inputs.get(&t).copied(),
            BufferRef::Slot(s) => Some(self.mem[r].slots[s]),
        }
    }

    /// `v`'s data on rank `r`.
    pub fn read_rank(&self, v: ValueId, r: usize) -> Vec<f64> {
        if let Some(x) = self.uniform.get(&v) {
            return vec![*x];
        }
        match self.array(v, r) {
            Some(a) => a.read(),
            None => panic!(
                "plan bug: `{}` is read but has no storage",
                self.plan.program().label(v)
            ),
        }
    }

    /// My data of `v`.
    pub fn read(&self, v: ValueId) -> Vec<f64> {
        self.read_rank(v, self.rank)
    }

    /// Writes my data of `v` (already rounded to its dtype).
    pub fn write(&self, v: ValueId, data: &[f64]) {
        match self.raw(v, self.rank) {
            Some(raw) => raw.store(0, data),
            None => panic!(
                "plan bug: `{}` is written but has no buffer",
                self.plan.program().label(v)
            ),
        }
    }

    /// How stage `m`'s operand `o` maps onto `m`'s iteration space `out` on this rank.
    pub fn operand_mapping(&self, m: ValueId, o: ValueId, out: &[usize]) -> Mapping {
        if let Some(x) = self.uniform.get(&o) {
            return Mapping::Splat(*x);
        }
        let p = self.plan.program();
        let view = self
            .plan
            .operand_view(m, o, self.rank)
            .unwrap_or_else(|| panic!("plan bug: operand `{}` has no storage", p.label(o)));
        let raw = self
            .raw_of(view.buffer, self.rank)
            .unwrap_or_else(|| panic!("plan bug: operand `{}` has no buffer", p.label(o)));
        Mapping::onto(&Array { raw, view }, out)
    }

    /// Where stage `m` stores its chunks (None: register only).
    pub fn store_mapping(&self, m: ValueId, _out: &[usize]) -> Option<Mapping> {
        match self.plan.storage(m)? {
            Storage::Input(_) | Storage::Slot(_) => Some(Mapping::Contiguous {
                raw: self.raw(m, self.rank)?,
                base: 0,
            }),
            _ => None,
        }
    }

    /// Logical origin of `m`'s local block (for dropout's logical indices).
    pub fn logical_origin(&self, m: ValueId) -> (usize, usize, Vec<usize>) {
        let layout = self.plan.program().node(m).ty.layout;
        logical_origin(self.plan.shape(m), layout, self.q(), self.rank % self.q())
    }

    /// The barrier at the start or end of `step`.
    pub fn barrier(&self, at: &str) -> Result<(), RuntimeError> {
        self.world.barrier(self.rank, at)
    }
}
