//! The MPI backend (cargo feature `mpi`): one rank per process over Open MPI, running the
//! same plans and the same kernels as the CPU backend. Only communication differs:
//!
//! - all-reduce and reduce-scatter are an all-to-all of blocks followed by a reduction
//!   of my block in rank order (then an all-gather for all-reduce) — deterministic, so
//!   results are bitwise those of the reference interpreter and of rank threads (MPI's
//!   own reductions do not promise an order);
//! - the fused all-reduce goes round by round (128 kernel chunks each): all-to-all of
//!   round k, the fused computation on it, all-gather of its results;
//! - other collectives gather every rank's operand and compute the result locally.
//!
//! Data travels as f64 (exact for every dtype; twice the bytes of f32).
//!
//! Not done yet: overlapping chunk k+1's communication with chunk k's computation
//! (non-blocking MPI), and overlapping a matmul with its collective (the matmul runs
//! first).

use crate::RuntimeError;
use crate::cpu::collective::general;
use crate::cpu::exec::{Comm, Ctx, RankRaw, run_rank};
use crate::cpu::kernel::{Kernel, round};
use crate::cpu::memory::Buffer;
use crate::cpu::sync::World;
use crate::cpu::{ops, value_on};
use crate::plan::Plan;
use coconet_core::interp::tensor::numel;
use coconet_core::{Bindings, Element, Layout, Op, ReduceOp, ValueId, bind_inputs, block_range};
use mpi::Count;
use mpi::datatype::{Partition, PartitionMut};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Communication between processes through MPI.
pub struct Mpi {
    world: SimpleCommunicator,
}

/// An MPI count or displacement; MPI counts are `i32`.
fn count(n: usize) -> Result<Count, RuntimeError> {
    Count::try_from(n).map_err(|_| {
        RuntimeError::Plan(format!(
            "{n} elements or bytes exceed what one MPI message can address (2^31 - 1); \
             split the tensor"
        ))
    })
}

fn displs(counts: &[Count]) -> Vec<Count> {
    counts
        .iter()
        .scan(0, |acc, &c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}

impl Mpi {
    fn size(&self) -> usize {
        self.world.size() as usize
    }

    /// Every rank's `data` (an empty slice from ranks without it), in rank order.
    fn all_gather(&self, data: &[f64]) -> Result<Vec<Vec<f64>>, RuntimeError> {
        let mut counts: Vec<Count> = vec![0; self.size()];
        self.world
            .all_gather_into(&count(data.len())?, &mut counts[..]);
        if counts.iter().map(|&c| c as usize).sum::<usize>() > Count::MAX as usize {
            return Err(count(usize::MAX).unwrap_err());
        }
        Ok(self.all_gather_counted(data, &counts))
    }

    /// [`Mpi::all_gather`] when every rank's count is known.
    fn all_gather_counted(&self, data: &[f64], counts: &[Count]) -> Vec<Vec<f64>> {
        let d = displs(counts);
        let total: usize = counts.iter().map(|&c| c as usize).sum();
        let mut buf = vec![0.0; total];
        {
            let mut part = PartitionMut::new(&mut buf[..], counts, &d[..]);
            self.world.all_gather_varcount_into(data, &mut part);
        }
        counts
            .iter()
            .zip(&d)
            .map(|(&c, &o)| buf[o as usize..(o + c) as usize].to_vec())
            .collect()
    }

    /// Sends `send[ranges[s]]` to each rank s; receives `n` elements from each rank of
    /// `group` (in rank order, concatenated).
    fn all_to_all(
        &self,
        send: &[f64],
        ranges: &[std::ops::Range<usize>],
        recv_from: &[usize],
        n: usize,
    ) -> Result<Vec<f64>, RuntimeError> {
        let sc = ranges
            .iter()
            .map(|r| count(r.len()))
            .collect::<Result<Vec<_>, _>>()?;
        let sd = ranges
            .iter()
            .map(|r| count(r.start))
            .collect::<Result<Vec<_>, _>>()?;
        count(n * recv_from.len())?;
        let mut rc: Vec<Count> = vec![0; self.size()];
        for &t in recv_from {
            rc[t] = count(n)?;
        }
        let rd = displs(&rc);
        let mut recv = vec![0.0; n * recv_from.len()];
        {
            let part = Partition::new(send, &sc[..], &sd[..]);
            let mut rpart = PartitionMut::new(&mut recv[..], &rc[..], &rd[..]);
            self.world.all_to_all_varcount_into(&part, &mut rpart);
        }
        Ok(recv)
    }
}

/// Reduces `q` consecutive blocks of `n` elements of `recv`, in order.
fn reduce_blocks(op: ReduceOp, recv: &[f64], q: usize, n: usize) -> Vec<f64> {
    let mut acc = recv[..n].to_vec();
    for t in 1..q {
        for (a, b) in acc.iter_mut().zip(&recv[t * n..(t + 1) * n]) {
            *a = op.combine(*a, *b);
        }
    }
    acc.iter_mut().for_each(|a| *a = op.finish(*a, q));
    acc
}

impl Comm for Mpi {
    fn collective(&self, ctx: &Ctx, v: ValueId, _at: &str) -> Result<(), RuntimeError> {
        let p = ctx.plan.program();
        let node = p.node(v);
        let me = ctx.rank;
        let holds = ctx.holds(v, me);
        let q = ctx.q();
        match node.op {
            Op::AllReduce(op, x) | Op::ReduceScatter(op, x, 0) if !p.node(x).ty.is_scalar() => {
                let group: Vec<usize> = ctx.holders(x).collect();
                let in_group = group.contains(&me);
                let full = ctx.local_shape(x, group[0]);
                // Blocks of the flat array (all-reduce) or of dim 0 (reduce-scatter).
                let (rows, inner) = match node.op {
                    Op::AllReduce(..) => (numel(&full), 1),
                    _ => (full[0], numel(&full[1..])),
                };
                let block = |s: usize| {
                    let b = block_range(rows, q, s % q);
                    b.start * inner..b.end * inner
                };
                let data = if in_group { ctx.read(x) } else { vec![] };
                let ranges: Vec<_> = (0..self.size())
                    .map(|s| {
                        if in_group && group.contains(&s) {
                            block(s)
                        } else {
                            0..0
                        }
                    })
                    .collect();
                let n = if in_group { block(me).len() } else { 0 };
                let recv_from: Vec<usize> = if in_group { group.clone() } else { vec![] };
                let recv = self.all_to_all(&data, &ranges, &recv_from, n)?;
                let mut mine = if in_group {
                    reduce_blocks(op, &recv, q, n)
                } else {
                    vec![]
                };
                round(node.ty.dtype, &mut mine);
                if matches!(node.op, Op::ReduceScatter(..)) {
                    if holds {
                        ctx.write(v, &mine);
                    }
                } else {
                    let all = self.all_gather(&mine)?;
                    if holds {
                        let out: Vec<f64> =
                            group.iter().flat_map(|&s| all[s].iter().copied()).collect();
                        ctx.write(v, &out);
                    }
                }
            }
            Op::AllGather(x) if p.node(x).ty.layout == Layout::Sliced(0) => {
                let mine = if ctx.holds(x, me) {
                    ctx.read(x)
                } else {
                    vec![]
                };
                let all = self.all_gather(&mine)?;
                if holds {
                    let out: Vec<f64> = ctx
                        .holders(x)
                        .flat_map(|s| all[s].iter().copied())
                        .collect();
                    ctx.write(v, &out);
                }
            }
            ref op => {
                let x = op.operands()[0];
                let mine = if ctx.holds(x, me) {
                    ctx.read(x)
                } else {
                    vec![]
                };
                let all = self.all_gather(&mine)?;
                if holds {
                    let mut out = general(ctx, v, &|_, s| all[s].clone())?;
                    round(node.ty.dtype, &mut out);
                    ctx.write(v, &out);
                }
            }
        }
        Ok(())
    }

    fn fused(
        &self,
        ctx: &Ctx,
        rs: ValueId,
        members: &[ValueId],
        matmul: Option<ValueId>,
        _at: &str,
    ) -> Result<(), RuntimeError> {
        let p = ctx.plan.program();
        let me = ctx.rank;
        if let Some(mm) = matmul
            && ctx.holds(mm, me)
        {
            ops::run(ctx, mm);
        }
        let Op::ReduceScatter(op, x, 0) = p.node(rs).op else {
            unreachable!("plan: fused all-reduces start with a dim-0 reduce-scatter")
        };
        let q = ctx.q();
        let group: Vec<usize> = ctx.holders(x).collect();
        let in_group = group.contains(&me);
        let full = ctx.plan.shape(x).to_vec();
        let inner = numel(&full[1..]);
        let block = |s: usize| {
            let b = block_range(full[0], q, s % q);
            b.start * inner..b.end * inner
        };
        let (gathers, in_kernel) = crate::cpu::fused::split_members(p, members);
        let mut kernel =
            in_group.then(|| Kernel::new(ctx, &[rs], &in_kernel, ctx.local_shape(rs, me)));
        // Rounds of many kernel chunks (few, large messages, sent as the tensors' own
        // bytes); every process runs the same number of rounds (the largest block's).
        let step = crate::cpu::kernel::step_for(p, &in_kernel, &ctx.local_shape(rs, group[0]));
        let round_len = step * 128;
        let rounds = block(group[0]).len().div_ceil(round_len);
        let xdt = p.node(x).ty.dtype;
        let mut x_copy = Buffer::zeros(xdt, 0);
        let x_raw = match ctx.raw(x, me) {
            Some(r) => r,
            None => {
                if in_group {
                    x_copy = Buffer::from_f64(xdt, &ctx.read(x));
                }
                x_copy.raw()
            }
        };
        let rs_store = ctx.store_mapping(rs, &[]);
        let mut tmp = vec![0.0; step];
        for k in 0..rounds {
            let chunk = |s: usize| {
                let b = block(s);
                let lo = (b.start + k * round_len).min(b.end);
                lo..(lo + round_len).min(b.end)
            };
            let live = |s: usize| in_group && group.contains(&s);
            let n = if in_group { chunk(me).len() } else { 0 };
            // All-to-all: my x's chunk of every peer's block, in bytes.
            let size = xdt.size_bytes();
            let per_rank = |f: &dyn Fn(usize) -> usize| -> Result<Vec<Count>, RuntimeError> {
                (0..self.size()).map(|s| count(f(s))).collect()
            };
            let sc = per_rank(&|s| if live(s) { chunk(s).len() * size } else { 0 })?;
            let sd = per_rank(&|s| if live(s) { chunk(s).start * size } else { 0 })?;
            let rc = per_rank(&|t| if live(t) { n * size } else { 0 })?;
            let rd = displs(&rc);
            let mut recv = Buffer::zeros(xdt, n * if in_group { q } else { 0 });
            let recv_raw = recv.raw();
            {
                // SAFETY: x is only read during the step; `recv` is ours alone.
                let send = unsafe { x_raw.bytes(0, x_raw.len()) };
                let part = Partition::new(send, &sc[..], &sd[..]);
                let rbytes = unsafe { recv_raw.bytes_mut() };
                let mut rpart = PartitionMut::new(rbytes, &rc[..], &rd[..]);
                self.world.all_to_all_varcount_into(&part, &mut rpart);
            }
            // Reduce in rank order and run the fused computation, chunk by chunk.
            let mut outs: Vec<Buffer> = gathers
                .iter()
                .map(|&(g, _)| Buffer::zeros(p.node(g).ty.dtype, n))
                .collect();
            if let Some(kernel) = kernel.as_mut() {
                let mut off = 0;
                while off < n {
                    let len = step.min(n - off);
                    let acc = &mut kernel.reg_mut(0)[..len];
                    recv_raw.load(off, acc);
                    for t in 1..q {
                        recv_raw.load(t * n + off, &mut tmp[..len]);
                        acc.iter_mut()
                            .zip(&tmp[..len])
                            .for_each(|(a, b)| *a = op.combine(*a, *b));
                    }
                    acc.iter_mut().for_each(|a| *a = op.finish(*a, q));
                    round(p.node(rs).ty.dtype, acc);
                    let at = k * round_len + off;
                    if let Some(crate::cpu::array::Mapping::Contiguous { raw, base }) = &rs_store {
                        raw.store(base + at, acc);
                    }
                    kernel.chunk(at, len);
                    for (i, &(_, y)) in gathers.iter().enumerate() {
                        let src = kernel
                            .index_of(y)
                            .expect("gathered values are fused stages");
                        outs[i].raw().store(off, &kernel.reg(src)[..len]);
                    }
                    off += len;
                }
            }
            // All-gather each result straight into every rank's destination buffer.
            for (i, &(g, _)) in gathers.iter().enumerate() {
                let gsize = p.node(g).ty.dtype.size_bytes();
                let counts = per_rank(&|s| {
                    if group.contains(&s) {
                        chunk(s).len() * gsize
                    } else {
                        0
                    }
                })?;
                let gd = per_rank(&|s| {
                    if group.contains(&s) {
                        chunk(s).start * gsize
                    } else {
                        0
                    }
                })?;
                let mut scratch = Buffer::zeros(p.node(g).ty.dtype, 0);
                let dst = match ctx.raw(g, me) {
                    Some(d) if ctx.holds(g, me) => d,
                    _ => {
                        scratch = Buffer::zeros(p.node(g).ty.dtype, block(group[q - 1]).end);
                        scratch.raw()
                    }
                };
                let out_raw = outs[i].raw();
                // SAFETY: `outs[i]` is ours; each rank's destination regions are
                // disjoint and only this collective writes them during the step.
                let send = unsafe { out_raw.bytes(0, out_raw.len()) };
                let rbytes = unsafe { dst.bytes_mut() };
                let mut rpart = PartitionMut::new(rbytes, &counts[..], &gd[..]);
                self.world.all_gather_varcount_into(send, &mut rpart);
                drop(scratch);
            }
        }
        for &m in members {
            if let Op::Update { value, .. } = p.node(m).op
                && matches!(p.node(value).op, Op::AllGather(_))
                && ctx.plan.storage(m) != ctx.plan.storage(value)
                && ctx.holds(m, me)
            {
                let d = ctx.read(value);
                ctx.write(m, &d);
            }
        }
        Ok(())
    }
}

/// A plan bound to this process's rank of an MPI job.
pub struct MpiJob {
    plan: Plan,
    comm: Mpi,
    rank: usize,
    inputs: HashMap<ValueId, Buffer>,
    slots: Vec<Buffer>,
    scalars: HashMap<ValueId, f64>,
    world: World,
    epoch: u64,
}

impl MpiJob {
    /// Binds this process's rank of `bindings` (which every process passes whole; all
    /// bindings are validated, as the interpreter does, before anything runs).
    pub fn new(
        plan: &Plan,
        bindings: &Bindings,
        world: SimpleCommunicator,
    ) -> Result<MpiJob, RuntimeError> {
        if world.size() as usize != plan.ranks {
            return Err(RuntimeError::Plan(format!(
                "the plan is for {} ranks but the MPI job has {} processes",
                plan.ranks,
                world.size()
            )));
        }
        let rank = world.rank() as usize;
        let bound = bind_inputs(plan.program(), plan.ranks, bindings)?;
        let p = plan.program();
        let inputs = bound
            .tensors
            .iter()
            .map(|(&id, per_rank)| {
                let data = per_rank[rank].as_deref().unwrap_or(&[]);
                (id, Buffer::from_f64(p.node(id).ty.dtype, data))
            })
            .collect();
        let slots = plan
            .slots
            .iter()
            .map(|s| Buffer::zeros(s.dtype, s.elements[rank]))
            .collect();
        Ok(MpiJob {
            plan: plan.clone(),
            comm: Mpi { world },
            rank,
            inputs,
            slots,
            scalars: bound.scalars,
            world: World::new(1, 0, Duration::from_secs(1)),
            epoch: 0,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Runs the plan once (every process of the job must call it).
    pub fn run(&mut self) -> Result<(), RuntimeError> {
        self.epoch += 1;
        let mut mem = vec![RankRaw::default(); self.plan.ranks];
        mem[self.rank] = RankRaw {
            inputs: self.inputs.iter_mut().map(|(&k, b)| (k, b.raw())).collect(),
            slots: self.slots.iter_mut().map(Buffer::raw).collect(),
        };
        let mut ctx = Ctx {
            plan: &self.plan,
            comm: &self.comm,
            rank: self.rank,
            world: &self.world,
            mem: &mem,
            scalars: &self.scalars,
            uniform: HashMap::new(),
            epoch: self.epoch,
            overlaps: 0,
            epoch_stamp: 0,
        };
        run_rank(&mut ctx, Instant::now(), false, None).map(drop)
    }

    /// This rank's data of `v` after the last run.
    pub fn local<T: Element>(&self, v: impl Into<ValueId>) -> Option<Vec<T>> {
        let data = value_on(
            &self.plan,
            v.into(),
            self.rank,
            &|t| Some(self.inputs.get(&t)?.to_f64()),
            &|s| Some(self.slots[s].to_f64()),
        )?;
        Some(data.into_iter().map(T::from_f64).collect())
    }

    /// This rank's data of input `name` after the last run.
    pub fn final_input_local<T: Element>(&self, name: &str) -> Result<Vec<T>, RuntimeError> {
        let p = self.plan.program();
        let id = p
            .find(name)
            .filter(|&id| p.node(id).op == Op::TensorInput)
            .ok_or_else(|| RuntimeError::Read(format!("`{name}` is not a tensor input")))?;
        self.local(id)
            .ok_or_else(|| RuntimeError::Read(format!("rank {} does not hold `{name}`", self.rank)))
    }
}
