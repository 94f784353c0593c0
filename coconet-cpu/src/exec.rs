//! One rank's execution of a plan: the dispatch of its steps to the kernels, the
//! collectives and the other ops, each running on the rank's [`Ctx`].

use super::kernel::Kernel;
pub use super::rank_context::{Comm, Ctx, RankRaw};
use super::{collective, fused, local_ops};
use coconet_core::ValueId;
use coconet_plan::RuntimeError;
use coconet_plan::plan::{FusedAllGather, FusedAllReduce, PlanStep, uniform_values};
use std::time::Instant;

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

/// Rank threads reading and writing each other's buffers.
pub struct SharedMemory;

impl Comm for SharedMemory {
    fn collective(&self, ctx: &Ctx, v: ValueId, at: &str) -> Result<(), RuntimeError> {
        collective::run(ctx, v, at)
    }

    fn fused(
        &self,
        ctx: &Ctx,
        f: &FusedAllReduce,
        matmul: Option<ValueId>,
        at: &str,
    ) -> Result<(), RuntimeError> {
        fused::run(ctx, f, matmul, at)
    }

    fn fused_gather(&self, ctx: &Ctx, f: &FusedAllGather, at: &str) -> Result<(), RuntimeError> {
        fused::run_gather(ctx, f, at)
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

fn exec_step(ctx: &mut Ctx, step: &PlanStep, at: &str) -> Result<(), RuntimeError> {
    let p = ctx.plan.program();
    match step {
        PlanStep::Uniform(vs) => uniform_values(p, vs, ctx.scalars, &mut ctx.uniform),
        PlanStep::Kernel(ms) => {
            if ctx.holds(ms[0], ctx.rank) {
                let shape = ctx.local_shape(ms[0], ctx.rank);
                Kernel::new(ctx, &[], ms, shape).run();
            }
        }
        PlanStep::Op(v) => {
            if p.node(*v).op.is_communication() {
                ctx.comm.collective(ctx, *v, at)?;
            } else if ctx.holds(*v, ctx.rank) {
                local_ops::run(ctx, *v);
            }
        }
        PlanStep::FusedAllReduce(f) => ctx.comm.fused(ctx, f, None, at)?,
        PlanStep::FusedAllGather(f) => ctx.comm.fused_gather(ctx, f, at)?,
        PlanStep::Overlap { matmul, consumer } => {
            ctx.epoch_stamp = ctx.next_stamp();
            ctx.comm.fused(ctx, consumer, Some(*matmul), at)?;
        }
        PlanStep::Commit { target, update } => {
            if ctx.holds(*target, ctx.rank) {
                let data = ctx.read(*update);
                let raw = ctx.mem[ctx.rank].inputs[target];
                raw.store(0, &data);
            }
        }
    }
    Ok(())
}
