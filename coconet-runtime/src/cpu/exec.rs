//! One rank's execution of a plan: the per-rank context (its view of every rank's
//! memory) and the dispatch of steps.

use super::array::{Array, Mapping};
use super::kernel::{self, Kernel};
use super::memory::Raw;
use super::sync::World;
use super::{collective, fused, ops};
use crate::RuntimeError;
use crate::plan::{BufferRef, Plan, Step, Storage};
use coconet_core::{Op, ValueId};
use std::collections::HashMap;
use std::time::Instant;

/// Raw views of one rank's buffers.
#[derive(Debug, Clone, Default)]
pub struct RankRaw {
    pub inputs: HashMap<ValueId, Raw>,
    pub slots: Vec<Raw>,
}

/// What a rank's run did: its trace, and how many of the plan's steps it finished (a
/// run succeeds only if every rank finished every step).
#[derive(Debug, Clone)]
pub struct RankDone {
    pub spans: Vec<Span>,
    pub steps: usize,
}

/// One step as it ran on one rank, for traces.
#[derive(Debug, Clone)]
pub struct Span {
    pub name: String,
    pub start_us: f64,
    pub dur_us: f64,
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
        rs: ValueId,
        members: &[ValueId],
        matmul: Option<ValueId>,
        at: &str,
    ) -> Result<(), RuntimeError>;
}

/// Rank threads reading and writing each other's buffers.
pub struct SharedMemory;

impl Comm for SharedMemory {
    fn collective(&self, ctx: &Ctx, v: ValueId, at: &str) -> Result<(), RuntimeError> {
        collective::run(ctx, v, at)
    }

    fn fused(
        &self,
        ctx: &Ctx,
        rs: ValueId,
        members: &[ValueId],
        matmul: Option<ValueId>,
        at: &str,
    ) -> Result<(), RuntimeError> {
        fused::run(ctx, rs, members, matmul, at)
    }
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
}

impl Ctx<'_> {
    /// The flag stamp of the next overlap step: strictly increasing over the overlaps
    /// of a run and over runs.
    pub fn next_stamp(&mut self) -> u64 {
        let per_run = self
            .plan
            .steps()
            .iter()
            .filter(|s| matches!(s, Step::Overlap { .. }))
            .count() as u64;
        self.overlaps += 1;
        (self.epoch - 1) * per_run + self.overlaps
    }
}

impl Ctx<'_> {
    /// Ranks per group.
    pub fn q(&self) -> usize {
        self.plan.group_size
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
        kernel::origin(self.plan.shape(m), layout, self.q(), self.rank % self.q())
    }

    /// The barrier at the start or end of `step`.
    pub fn barrier(&self, at: &str) -> Result<(), RuntimeError> {
        self.world.barrier(self.rank, at)
    }
}

/// Runs every step of the plan on this rank; returns the trace.
pub fn run_rank(
    ctx: &mut Ctx,
    labels: &[String],
    epoch_start: Instant,
    trace: bool,
    fault: Option<super::Fault>,
) -> Result<RankDone, RuntimeError> {
    let mut spans = Vec::new();
    let plan = ctx.plan;
    for (i, step) in plan.steps().iter().enumerate() {
        match fault {
            Some(super::Fault::Panic { rank, step }) if rank == ctx.rank && step == i => {
                panic!("injected fault before step {i}")
            }
            Some(super::Fault::Vanish { rank, step }) if rank == ctx.rank && step == i => {
                return Ok(RankDone { spans, steps: i });
            }
            Some(super::Fault::Stall { rank, step }) if rank == ctx.rank && step == i => {
                std::thread::sleep(ctx.world.timeout().saturating_mul(2));
            }
            _ => {}
        }
        let t0 = Instant::now();
        exec_step(ctx, step, &labels[i])?;
        if trace {
            spans.push(Span {
                name: labels[i].clone(),
                start_us: (t0 - epoch_start).as_secs_f64() * 1e6,
                dur_us: t0.elapsed().as_secs_f64() * 1e6,
            });
        }
    }
    Ok(RankDone {
        spans,
        steps: plan.steps().len(),
    })
}

fn exec_step(ctx: &mut Ctx, step: &Step, at: &str) -> Result<(), RuntimeError> {
    let p = ctx.plan.program();
    match step {
        Step::Uniform(vs) => uniform_values(p, vs, ctx.scalars, &mut ctx.uniform),
        Step::Kernel(ms) => {
            if ctx.holds(ms[0], ctx.rank) {
                let shape = ctx.local_shape(ms[0], ctx.rank);
                Kernel::new(ctx, &[], ms, shape).run();
            }
        }
        Step::Op(v) => {
            if p.node(*v).op.is_communication() {
                ctx.comm.collective(ctx, *v, at)?;
            } else if ctx.holds(*v, ctx.rank) {
                ops::run(ctx, *v);
            }
        }
        Step::FusedAllReduce {
            reduce_scatter,
            members,
        } => ctx.comm.fused(ctx, *reduce_scatter, members, None, at)?,
        Step::Overlap { matmul, consumer } => {
            let Step::FusedAllReduce {
                reduce_scatter,
                members,
            } = &**consumer
            else {
                unreachable!("overlap consumers are fused all-reduces")
            };
            ctx.epoch_stamp = ctx.next_stamp();
            ctx.comm
                .fused(ctx, *reduce_scatter, members, Some(*matmul), at)?;
        }
        Step::Commit { target, update } => {
            if ctx.holds(*target, ctx.rank) {
                let data = ctx.read(*update);
                let raw = ctx.mem[ctx.rank].inputs[target];
                raw.store(0, &data);
            }
        }
    }
    Ok(())
}

/// Computes scalar stages `vs` (scalar inputs, literals and arithmetic on them) on the
/// host, rounded to their dtypes, into `uniform`.
pub fn uniform_values(
    p: &coconet_core::Program,
    vs: &[ValueId],
    scalars: &HashMap<ValueId, f64>,
    uniform: &mut HashMap<ValueId, f64>,
) {
    for &v in vs {
        let node = p.node(v);
        let x = match node.op {
            Op::ScalarInput => scalars[&v],
            Op::Literal(x) => x,
            ref op => {
                let args: Vec<f64> = op.operands().iter().map(|o| uniform[o]).collect();
                match *op {
                    Op::Unary(u, _) => u.eval(args[0]),
                    Op::Binary(b, a, _) => b.eval(args[0], args[1], p.node(a).ty.dtype.is_int()),
                    Op::Select(..) => {
                        if args[0] != 0.0 {
                            args[1]
                        } else {
                            args[2]
                        }
                    }
                    Op::Cast(_) => args[0],
                    _ => unreachable!("uniform stages are scalar arithmetic"),
                }
            }
        };
        uniform.insert(v, node.ty.dtype.round(x));
    }
}
