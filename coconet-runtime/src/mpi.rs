//! The MPI backend (cargo feature `mpi`): one rank per process over Open MPI, running the
//! same plans and the same kernels as the CPU backend. Only communication differs:
//!
//! - all-reduce and reduce-scatter are an all-to-all of blocks followed by a reduction
//!   of my block in rank order (then an all-gather for all-reduce) — deterministic, so
//!   results are bitwise those of the reference interpreter and of rank threads (MPI's
//!   own reductions do not promise an order);
//! - the fused all-reduce goes round by round ([`ROUND_CHUNKS`] kernel chunks each),
//!   pipelined with non-blocking MPI: while round k is reduced (rank order) and updated
//!   from one receive buffer, round k + 1's all-to-all fills the other, and round
//!   k - 1's all-gathers send its results straight into every rank's destination from
//!   the other of a second pair of buffers (round k - 2's completes first); the kernel
//!   polls the requests in flight between chunks (Open MPI moves non-blocking
//!   collectives only inside MPI calls). Every process runs the same rounds (the largest
//!   block's) and posts the same collectives in the same order, with empty parts where
//!   its block is done or it is outside the group;
//! - a matmul producing the fused all-reduce's operand (an `ol(MM, ...)` schedule) runs
//!   on its own thread, by blocks of its first dim as on rank threads, in the order the
//!   rounds send them: each round's all-to-all is posted once its rows are written;
//! - other collectives gather every rank's operand and compute the result locally.
//!
//! Non-fused collectives move data as f64 (exact for every dtype; twice the bytes of
//! f32); the fused all-reduce moves the tensors' own bytes.
//!
//! Not done yet: non-blocking point-to-point reductions (a ring) instead of the
//! all-to-all, and overlap for the non-fused collectives.

use crate::JobData;
use crate::RuntimeError;
use crate::agreement;
use crate::cpu::collective::general;
use crate::cpu::exec::{Comm, Ctx, RankRaw, run_rank};
use crate::cpu::inputs::{Inputs, allocated, lend};
use crate::cpu::kernel::{Kernel, round};
use crate::cpu::matmul::MatMul;
use crate::cpu::memory::Buffer;
use crate::cpu::memory::Raw;
use crate::cpu::sync::World;
use crate::cpu::{ops, value_on};
use crate::plan::Plan;
use coconet_core::DType;
use coconet_core::interp::tensor::numel;
use coconet_core::{Bindings, Element, Layout, Op, ReduceOp, ValueId, block_range};
use mpi::Count;
use mpi::datatype::{
    AsDatatype, Collection, Equivalence, Partition, PartitionMut, Partitioned, PartitionedBuffer,
    PartitionedBufferMut, Pointer, PointerMut,
};
use mpi::request::{Request, StaticScope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::time::{Duration, Instant};

/// Communication between processes through MPI.
pub struct Mpi {
    world: SimpleCommunicator,
    /// Kernel chunks per round of a fused all-reduce.
    round_chunks: usize,
}

/// Kernel chunks per round of a fused all-reduce, by default: rounds of a few hundred
/// thousand elements make few, large messages, and still several rounds to pipeline on
/// large tensors.
pub const ROUND_CHUNKS: usize = 128;

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

    /// Checks that every process has the same labelled values as rank 0 (every process
    /// calls it; all return the same answer): an error names the first rank and the
    /// first thing that differs.
    fn agree(&self, mine: &[(String, u64)]) -> Result<(), RuntimeError> {
        // First every rank's count and first value (whether it bound its inputs), so
        // that ranks with a failed binding or another program are named without
        // exchanging vectors of different lengths.
        let header = [mine.len() as u64, mine.first().map_or(0, |(_, v)| *v)];
        let mut headers = vec![0u64; 2 * self.size()];
        self.world.all_gather_into(&header[..], &mut headers[..]);
        if headers.chunks(2).any(|h| h != header) {
            let all: Vec<Vec<u64>> = headers
                .chunks(2)
                .map(|h| {
                    let mut v = vec![0; h[0] as usize];
                    if let Some(first) = v.first_mut() {
                        *first = h[1];
                    }
                    v
                })
                .collect();
            return agreement::compare(mine, &all);
        }
        let values: Vec<u64> = mine.iter().map(|(_, v)| *v).collect();
        let mut all = vec![0u64; values.len() * self.size()];
        self.world.all_gather_into(&values[..], &mut all[..]);
        let all: Vec<Vec<u64>> = all
            .chunks(values.len().max(1))
            .map(<[u64]>::to_vec)
            .collect();
        agreement::compare(mine, &all)
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

    /// Posts a non-blocking all-to-all of bytes (`send.counts[s]` bytes at
    /// `send.displs[s]` to rank s; `recv.counts[t]` bytes from rank t at
    /// `recv.displs[t]`).
    ///
    /// # Safety
    /// Until the returned flight is dropped, the bytes `send` describes must stay valid
    /// and unwritten, and those `recv` describes valid and otherwise untouched.
    unsafe fn post_all_to_all(&self, send: Parts, recv: Parts) -> Flight<Parts> {
        let (send, recv) = (Box::into_raw(Box::new(send)), Box::into_raw(Box::new(recv)));
        // SAFETY: the descriptors live until `Flight::drop` has waited for the request
        // (the 'static lifetimes are never relied on past that point); the bytes are
        // the caller's contract.
        let req = unsafe {
            self.world
                .immediate_all_to_all_varcount_into(StaticScope, &*send, &mut *recv)
        };
        Flight {
            req: Some(req),
            send,
            recv,
        }
    }

    /// Posts a non-blocking all-gather of bytes (`recv.counts[t]` bytes from rank t land
    /// at `recv.displs[t]`).
    ///
    /// # Safety
    /// As for [`Mpi::post_all_to_all`].
    unsafe fn post_all_gather(&self, send: Bytes, recv: Parts) -> Flight<Bytes> {
        let (send, recv) = (Box::into_raw(Box::new(send)), Box::into_raw(Box::new(recv)));
        // SAFETY: as in `post_all_to_all`.
        let req = unsafe {
            self.world
                .immediate_all_gather_varcount_into(StaticScope, &*send, &mut *recv)
        };
        Flight {
            req: Some(req),
            send,
            recv,
        }
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
        let Op::ReduceScatter(_, x, 0) = p.node(rs).op else {
            unreachable!("plan: fused all-reduces start with a dim-0 reduce-scatter")
        };
        // A matmul producing the reduced tensor in a buffer runs alongside the rounds;
        // any other runs first.
        let overlap =
            matmul.filter(|&mm| mm == x && ctx.holds(mm, me) && ctx.raw(mm, me).is_some());
        if let Some(mm) = matmul
            && ctx.holds(mm, me)
            && overlap.is_none()
        {
            ops::run(ctx, mm);
        }
        self.fused_rounds(ctx, rs, members, overlap)?;
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

impl Mpi {
    /// The fused all-reduce's rounds, pipelined (see the module docs): round k's
    /// all-to-all lands in one of two receive buffers while round k - 1 is reduced and
    /// updated from the other; round k's results go out from one of two send buffers
    /// while round k + 1 is computed.
    fn fused_rounds(
        &self,
        ctx: &Ctx,
        rs: ValueId,
        members: &[ValueId],
        overlap: Option<ValueId>,
    ) -> Result<(), RuntimeError> {
        let p = ctx.plan.program();
        let me = ctx.rank;
        let Op::ReduceScatter(op, x, 0) = p.node(rs).op else {
            unreachable!("plan: fused all-reduces start with a dim-0 reduce-scatter")
        };
        let q = ctx.q();
        let group: Vec<usize> = ctx.holders(x).collect();
        let in_group = group.contains(&me);
        let live = |s: usize| in_group && group.contains(&s);
        let full = ctx.plan.shape(x).to_vec();
        let inner = numel(&full[1..]);
        let block = |s: usize| {
            let b = block_range(full[0], q, s % q);
            b.start * inner..b.end * inner
        };
        let (gathers, in_kernel) = crate::cpu::fused::split_members(p, members);
        let xdt = p.node(x).ty.dtype;
        let size = xdt.size_bytes();
        let gdts: Vec<DType> = gathers.iter().map(|&(g, _)| p.node(g).ty.dtype).collect();
        // Every byte count and displacement below is within the whole tensor or q of
        // the largest block: check once, alike on every process, before communicating.
        let widest = gdts.iter().map(|d| d.size_bytes()).fold(size, usize::max);
        let largest = block(group[0]).len();
        numel(&full)
            .max(largest.saturating_mul(q))
            .checked_mul(widest)
            .map_or(Err(count(usize::MAX).unwrap_err()), count)?;
        let mut kernel =
            in_group.then(|| Kernel::new(ctx, &[rs], &in_kernel, ctx.local_shape(rs, me)));
        // Rounds of many kernel chunks (few, large messages, sent as the tensors' own
        // bytes); every process runs the same number of rounds (the largest block's).
        let step = crate::cpu::kernel::step_for(p, &in_kernel, &ctx.local_shape(rs, group[0]));
        let round_len = step.saturating_mul(self.round_chunks);
        let rounds = largest.div_ceil(round_len);
        // Positions of rank s's block in round k (empty once its block is done).
        let chunk = |k: usize, s: usize| {
            let b = block(s);
            let lo = (b.start + k * round_len).min(b.end);
            lo..lo.saturating_add(round_len).min(b.end)
        };
        // x is sent as contiguous bytes: a copy where it is not in one buffer of mine
        // (computed elsewhere, or an input bound as pieces).
        let mut x_copy = Buffer::zeros(xdt, 0);
        let x_raw = match ctx.raw(x, me) {
            Some(r) if !r.is_pieced() => r,
            Some(r) => {
                debug_assert!(overlap.is_none(), "a matmul's output is never pieced");
                x_copy = Buffer::zeros(xdt, r.len());
                let copy = x_copy.raw();
                r.copy_all_to(&copy);
                copy
            }
            None => {
                if in_group {
                    x_copy = Buffer::from_f64(xdt, &ctx.read(x));
                }
                x_copy.raw()
            }
        };
        // Each gather lands in my buffer of its value, or in scratch where I hold none
        // or mine is in pieces (copied into them once every round has landed).
        let mut scratch: Vec<Buffer> = Vec::new();
        let mut unpack: Vec<(Raw, Raw)> = Vec::new();
        let dsts: Vec<Raw> = gathers
            .iter()
            .zip(&gdts)
            .map(|(&(g, _), &dt)| match ctx.raw(g, me) {
                Some(d) if ctx.holds(g, me) && !d.is_pieced() => d,
                mine => {
                    let len = match mine {
                        Some(d) if ctx.holds(g, me) => d.len(),
                        _ => block(group[q - 1]).end,
                    };
                    let mut b = Buffer::zeros(dt, len);
                    let r = b.raw();
                    scratch.push(b);
                    if let Some(d) = mine.filter(|_| ctx.holds(g, me)) {
                        unpack.push((r, d));
                    }
                    r
                }
            })
            .collect();
        // Double buffers: received chunks of x, and the results to gather.
        let cap = if in_group {
            block(me).len().min(round_len)
        } else {
            0
        };
        let sets = rounds.min(2);
        let mut recv_bufs: Vec<Buffer> = (0..sets)
            .map(|_| Buffer::zeros(xdt, cap * if in_group { q } else { 0 }))
            .collect();
        let recv_raws: Vec<Raw> = recv_bufs.iter_mut().map(Buffer::raw).collect();
        let mut out_bufs: Vec<Vec<Buffer>> = (0..sets)
            .map(|_| gdts.iter().map(|&dt| Buffer::zeros(dt, cap)).collect())
            .collect();
        let out_raws: Vec<Vec<Raw>> = out_bufs
            .iter_mut()
            .map(|set| set.iter_mut().map(Buffer::raw).collect())
            .collect();
        // SAFETY (for the byte pointers): x is only read during the step; the receive,
        // result and scratch buffers are ours; each destination region (a rank's chunk
        // of one round) is written by one all-gather only, which no kernel chunk reads
        // (kernels read my block at the round being computed, gathers in flight write
        // earlier rounds).
        let x_ptr = unsafe { x_raw.bytes(0, x_raw.len()) }.as_ptr().cast_mut();
        let dst_ptrs: Vec<*mut u8> = dsts
            .iter()
            .map(|d| unsafe { d.bytes_mut() }.as_mut_ptr())
            .collect();
        let world = self.size();
        // Byte counts per rank (in range: checked above).
        let per_rank = |f: &dyn Fn(usize) -> usize| -> Vec<Count> {
            (0..world).map(|s| f(s) as Count).collect()
        };
        let mine = |k: usize| if in_group { chunk(k, me).len() } else { 0 };
        let post_exchange = |k: usize| {
            let n = mine(k);
            let sc = per_rank(&|s| if live(s) { chunk(k, s).len() * size } else { 0 });
            let sd = per_rank(&|s| if live(s) { chunk(k, s).start * size } else { 0 });
            let rc = per_rank(&|t| if live(t) { n * size } else { 0 });
            let rd = displs(&rc);
            let recv = recv_raws[k % 2];
            // SAFETY: `recv` is untouched until the exchange completes (the next
            // round's exchange uses the other buffer); see above for x.
            unsafe {
                let rptr = recv.bytes_mut().as_mut_ptr();
                self.post_all_to_all(Parts::new(x_ptr, sc, sd), Parts::new(rptr, rc, rd))
            }
        };
        let post_gathers = |k: usize| -> Vec<Flight<Bytes>> {
            (0..gathers.len())
                .map(|i| {
                    let gsize = gdts[i].size_bytes();
                    let on = |s: usize| group.contains(&s);
                    let gc = per_rank(&|s| if on(s) { chunk(k, s).len() * gsize } else { 0 });
                    let gd = per_rank(&|s| if on(s) { chunk(k, s).start * gsize } else { 0 });
                    let out = out_raws[k % 2][i];
                    // SAFETY: the results buffer is not written again before this
                    // gather completes (round k + 2 waits for it); see above for dst.
                    unsafe {
                        let send = Bytes {
                            ptr: out.bytes(0, mine(k)).as_ptr(),
                            len: (mine(k) * gsize) as Count,
                        };
                        self.post_all_gather(send, Parts::new(dst_ptrs[i], gc, gd))
                    }
                })
                .collect()
        };
        let rs_store = ctx.store_mapping(rs, &[]);
        let (mut acc, mut tmp) = (vec![0.0; step], vec![0.0; step]);
        let mut broken = false;
        std::thread::scope(|scope| {
            // The overlapped matmul, on its own thread: dim-0 blocks of its output (as
            // the rank threads compute them, so results agree bitwise) in the order
            // the rounds send them, reporting each round whose rows are all written.
            let (ready_tx, ready_rx) = std::sync::mpsc::channel::<usize>();
            let producer = overlap.map(|mm| {
                let Op::MatMul(a, b) = p.node(mm).op else {
                    unreachable!("overlap producers are matmuls")
                };
                let (sa, sb) = (ctx.local_shape(a, me), ctx.local_shape(b, me));
                let (av, bv) = (ctx.read(a), ctx.read(b));
                let dtype = p.node(mm).ty.dtype;
                let (chunk, group) = (&chunk, &group);
                scope.spawn(move || {
                    let (k, n) = (sb[0], sb[1]);
                    let rows_per = numel(&sa[1..sa.len() - 1]);
                    let mut buf = vec![0.0; rows_per * n];
                    let mut done = vec![false; sa[0]];
                    let product = MatMul::new(dtype, &av, &bv, k, n);
                    let mut block_of = |i: usize| {
                        if std::mem::replace(&mut done[i], true) {
                            return;
                        }
                        let rows = i * rows_per..(i + 1) * rows_per;
                        product.rows(rows.clone(), &mut buf);
                        x_raw.store(rows.start * n, &buf);
                    };
                    for r in 0..rounds {
                        for &s in group {
                            let c = chunk(r, s);
                            if !c.is_empty() {
                                (c.start / inner..c.end.div_ceil(inner)).for_each(&mut block_of);
                            }
                        }
                        let _ = ready_tx.send(r);
                    }
                    (0..sa[0]).for_each(block_of);
                })
            });
            // Waits until round r's rows of x are written (at once without a matmul). If
            // the matmul thread died, goes on (every process must post every round) and
            // fails at the end.
            let mut ready = if producer.is_some() { 0 } else { rounds };
            let mut rows_for = |r: usize| {
                while ready <= r {
                    match ready_rx.recv() {
                        Ok(done) => ready = done + 1,
                        Err(_) => (ready, broken) = (rounds, true),
                    }
                }
            };
            // In flight: the next round's exchange, and the last two rounds' gathers.
            // Every process posts them in the same order: A0, A1, G0, A2, G1, A3, G2, ...
            let mut exchange = (rounds > 0).then(|| {
                rows_for(0);
                post_exchange(0)
            });
            let mut gathering: VecDeque<Vec<Flight<Bytes>>> = VecDeque::new();
            for k in 0..rounds {
                drop(exchange.take()); // waits for round k's chunks
                if k + 1 < rounds {
                    rows_for(k + 1);
                    exchange = Some(post_exchange(k + 1));
                }
                if gathering.len() == 2 {
                    drop(gathering.pop_front()); // round k - 2 sent: its results buffer is free
                }
                let n = mine(k);
                let (recv, outs) = (recv_raws[k % 2], &out_raws[k % 2]);
                if let Some(kernel) = kernel.as_mut() {
                    // Reduce in rank order and run the fused computation, chunk by chunk,
                    // letting MPI progress the requests in flight between chunks.
                    let mut off = 0;
                    while off < n {
                        let len = step.min(n - off);
                        let acc = &mut acc[..len];
                        recv.load(off, acc);
                        for t in 1..q {
                            recv.load(t * n + off, &mut tmp[..len]);
                            acc.iter_mut()
                                .zip(&tmp[..len])
                                .for_each(|(a, b)| *a = op.combine(*a, *b));
                        }
                        acc.iter_mut().for_each(|a| *a = op.finish(*a, q));
                        kernel.set(0, acc);
                        let at = k * round_len + off;
                        if let Some(crate::cpu::array::Mapping::Contiguous { raw, base }) =
                            &rs_store
                        {
                            kernel.store(0, len, raw, base + at);
                        }
                        kernel.chunk(at, len);
                        for (i, &(_, y)) in gathers.iter().enumerate() {
                            let src = kernel
                                .index_of(y)
                                .expect("gathered values are fused stages");
                            kernel.store(src, len, &outs[i], off);
                        }
                        off += len;
                        exchange.iter_mut().for_each(Flight::poll);
                        gathering.iter_mut().flatten().for_each(Flight::poll);
                    }
                }
                gathering.push_back(post_gathers(k));
            }
            drop(gathering);
            if let Some(h) = producer
                && h.join().is_err()
            {
                broken = true;
            }
        });
        for (from, to) in &unpack {
            from.copy_all_to(to);
        }
        drop((recv_bufs, out_bufs, scratch, x_copy));
        if broken {
            return Err(RuntimeError::RankFailed {
                rank: me,
                message: "the overlapped matmul panicked".into(),
            });
        }
        Ok(())
    }
}

/// Bytes of a buffer split into per-rank parts (byte counts and displacements), as one
/// side of a non-blocking collective. It owns its counts, which MPI reads until the
/// collective completes, but not the bytes.
struct Parts {
    ptr: *mut u8,
    counts: Vec<Count>,
    displs: Vec<Count>,
}

impl Parts {
    fn new(ptr: *mut u8, counts: Vec<Count>, displs: Vec<Count>) -> Parts {
        Parts {
            ptr,
            counts,
            displs,
        }
    }
}

/// Contiguous bytes sent whole by a non-blocking all-gather.
struct Bytes {
    ptr: *const u8,
    len: Count,
}

// SAFETY: both describe `u8` data at `ptr`: MPI reads (or, for `Parts`, writes) there the
// byte counts they report, at their displacements; keeping those bytes valid is the
// poster's contract (see `Mpi::post_all_to_all`).
unsafe impl Pointer for Parts {
    fn pointer(&self) -> *const c_void {
        self.ptr.cast()
    }
}
// SAFETY: as above.
unsafe impl PointerMut for Parts {
    fn pointer_mut(&mut self) -> *mut c_void {
        self.ptr.cast()
    }
}
// SAFETY: as above.
unsafe impl AsDatatype for Parts {
    type Out = <u8 as Equivalence>::Out;
    fn as_datatype(&self) -> Self::Out {
        u8::equivalent_datatype()
    }
}
impl Partitioned for Parts {
    fn counts(&self) -> &[Count] {
        &self.counts
    }
    fn displs(&self) -> &[Count] {
        &self.displs
    }
}
impl PartitionedBuffer for Parts {}
impl PartitionedBufferMut for Parts {}
// SAFETY: as above.
unsafe impl Pointer for Bytes {
    fn pointer(&self) -> *const c_void {
        self.ptr.cast()
    }
}
// SAFETY: as above.
unsafe impl Collection for Bytes {
    fn count(&self) -> Count {
        self.len
    }
}
// SAFETY: as above.
unsafe impl AsDatatype for Bytes {
    type Out = <u8 as Equivalence>::Out;
    fn as_datatype(&self) -> Self::Out {
        u8::equivalent_datatype()
    }
}
// SAFETY: as above.
unsafe impl mpi::datatype::Buffer for Bytes {}

/// A posted non-blocking collective with its two descriptors, which stay put (boxed)
/// until it completes: dropping a flight waits for it, then frees them.
struct Flight<S: 'static> {
    req: Option<Request<'static, Parts, StaticScope>>,
    send: *mut S,
    recv: *mut Parts,
}

impl<S> Flight<S> {
    /// Lets MPI progress the collective (Open MPI moves a non-blocking collective's
    /// data only inside MPI calls); notes when it has completed.
    fn poll(&mut self) {
        if let Some(r) = self.req.take() {
            self.req = r.test().err();
        }
    }
}

impl<S> Drop for Flight<S> {
    fn drop(&mut self) {
        if let Some(r) = self.req.take() {
            r.wait_without_status();
        }
        // SAFETY: both came from `Box::into_raw` at posting, and MPI is done with them.
        unsafe {
            drop(Box::from_raw(self.send));
            drop(Box::from_raw(self.recv));
        }
    }
}

/// A plan bound to this process's rank of an MPI job: prepared once, run every
/// iteration (the training-loop API of [`cpu::Job`](crate::cpu::Job), for this rank).
pub struct MpiJob {
    plan: Plan,
    comm: Mpi,
    rank: usize,
    inputs: Inputs,
    slots: Vec<Buffer>,
    /// Raw views of this rank's buffers (other ranks' entries empty), made once.
    mem: Vec<RankRaw>,
    world: World,
    epoch: u64,
    /// Each step's description (made once).
    labels: Vec<String>,
    /// Why the last run failed: the buffers are then neither run nor read again.
    failed: Option<String>,
    /// A failure to inject (tests of failure handling).
    fault: Option<crate::cpu::Fault>,
}

impl MpiJob {
    /// Binds this process's rank: `bindings` needs this rank's data only (Local and
    /// Sliced inputs as [`Binding::this_rank`](coconet_core::Binding::this_rank), or as
    /// every rank's data of which only this rank's is kept; Replicated inputs whole), so
    /// memory per process is O(N), not O(P·N). Every process calls it: the processes
    /// then check that they agree (program, dims, dtypes, scalars, Replicated inputs)
    /// and all fail, naming the first rank that differs from rank 0, if they do not.
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
        // A process whose bindings are bad still takes part in the agreement check, so
        // that its peers fail with it instead of waiting for it in the first run.
        let prepared = Self::allocate(plan, bindings, rank);
        let comm = Mpi {
            world,
            round_chunks: ROUND_CHUNKS,
        };
        let mine = match &prepared {
            Ok((inputs, _)) => {
                let buffers = &inputs.buffers[rank];
                let replicated = |id: ValueId, h: &mut DefaultHasher| match buffers.get(&id) {
                    Some(b) => {
                        b.hash_contents(h);
                        true
                    }
                    None => false,
                };
                agreement::fingerprint(plan, &replicated, &inputs.scalars)
            }
            Err(_) => agreement::failed_to_bind(),
        };
        let agreement = comm.agree(&mine);
        let (mut inputs, mut slots) = prepared?;
        agreement?;
        let mut mem = vec![RankRaw::default(); plan.ranks];
        mem[rank] = RankRaw {
            inputs: inputs.buffers[rank]
                .iter_mut()
                .map(|(&k, b)| (k, b.raw()))
                .collect(),
            slots: slots.iter_mut().map(Buffer::raw).collect(),
        };
        Ok(MpiJob {
            labels: plan.steps().iter().map(|s| plan.describe(s)).collect(),
            plan: plan.clone(),
            comm,
            rank,
            inputs,
            slots,
            mem,
            world: World::new(1, 0, Duration::from_secs(1)),
            epoch: 0,
            failed: None,
            fault: None,
        })
    }

    /// This rank's inputs and runtime buffers.
    fn allocate(
        plan: &Plan,
        bindings: &Bindings,
        rank: usize,
    ) -> Result<(Inputs, Vec<Buffer>), RuntimeError> {
        let inputs = Inputs::allocate(plan, plan.bind_rank(bindings, rank)?)?;
        let mut slots = Vec::with_capacity(plan.slots.len());
        for (i, s) in plan.slots.iter().enumerate() {
            let what = || format!("runtime buffer {i} ({}) on rank {rank}", plan.slot_users(i));
            let n = s.elements[rank];
            slots.push(allocated(Buffer::try_zeros(s.dtype, n), what, n, s.dtype)?);
        }
        Ok((inputs, slots))
    }

    /// Sets the kernel chunks per pipelined round of fused all-reduces (at least 1;
    /// default [`ROUND_CHUNKS`]). Results do not depend on it; every process of the job
    /// must set the same value.
    pub fn set_round_chunks(&mut self, chunks: usize) {
        self.comm.round_chunks = chunks.max(1);
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Makes this rank fail on purpose in the next runs (to test failure handling: a
    /// panic aborts the whole MPI job with the rank and the message).
    pub fn inject_fault(&mut self, fault: Option<crate::cpu::Fault>) {
        self.fault = fault;
    }

    /// An error once a run has failed (the buffers may be half updated).
    fn usable(&self) -> Result<(), RuntimeError> {
        match &self.failed {
            None => Ok(()),
            Some(e) => Err(RuntimeError::Plan(format!(
                "an earlier run failed ({e}); the job's buffers are undefined — prepare a new job"
            ))),
        }
    }

    /// Runs the plan once (every process of the job must call it). The processes first
    /// check that they run with the same scalars (one small all-gather): a step counter
    /// or learning rate set differently on one process is an error naming it.
    pub fn run(&mut self) -> Result<(), RuntimeError> {
        self.usable()?;
        let scalars = agreement::scalar_fingerprint(&self.plan, &self.inputs.scalars);
        let result = self.comm.agree(&scalars).and_then(|()| {
            self.epoch += 1;
            let mut ctx = Ctx {
                plan: &self.plan,
                comm: &self.comm,
                rank: self.rank,
                world: &self.world,
                mem: &self.mem,
                scalars: &self.inputs.scalars,
                uniform: HashMap::new(),
                epoch: self.epoch,
                overlaps: 0,
                epoch_stamp: 0,
            };
            let fault = self.fault;
            let step = std::panic::AssertUnwindSafe(|| {
                run_rank(&mut ctx, &self.labels, Instant::now(), false, fault).map(drop)
            });
            match std::panic::catch_unwind(step) {
                Ok(result) => result,
                // Peers wait for this rank in MPI calls that have no deadline: unwinding
                // into MPI_Finalize would hang the whole job. Abort it, saying why.
                Err(panic) => {
                    let msg = crate::error::panic_message(&*panic);
                    eprintln!(
                        "coconet: rank {} panicked during a run ({msg}); aborting the MPI job",
                        self.rank
                    );
                    self.comm.world.abort(1)
                }
            }
        });
        if let Err(e) = &result {
            self.failed = Some(e.to_string());
        }
        result
    }

    /// Runs once with this rank's input `name` read straight from `data` (in its dtype)
    /// instead of the job's buffer — the gradient needs no copy into the job. Only inputs
    /// the program never updates can be lent.
    pub fn run_with<T: Element>(&mut self, name: &str, data: &[T]) -> Result<(), RuntimeError> {
        self.run_with_pieces(name, &[data])
    }

    /// [`MpiJob::run_with`] from several slices read as their concatenation (a model's
    /// gradient tensors, in parameter order).
    pub fn run_with_pieces<T: Element>(
        &mut self,
        name: &str,
        pieces: &[&[T]],
    ) -> Result<(), RuntimeError> {
        self.usable()?;
        let id = self.plan.tensor_input(name)?;
        let lent = lend(&self.plan, &self.inputs, name, self.rank, pieces)?;
        let saved = self.mem[self.rank].inputs.insert(id, lent.raw);
        let result = self.run();
        if let Some(own) = saved {
            self.mem[self.rank].inputs.insert(id, own);
        }
        result
    }

    /// This rank's data of tensor input `name`, borrowed in its own dtype (`rank` must
    /// be this process's).
    pub fn input<T: Element>(&self, name: &str, rank: usize) -> Result<&[T], RuntimeError> {
        self.usable()?;
        self.inputs.view(&self.plan, name, rank)
    }

    /// This rank's buffer of tensor input `name`, to write the next run's data into.
    pub fn input_mut<T: Element>(
        &mut self,
        name: &str,
        rank: usize,
    ) -> Result<&mut [T], RuntimeError> {
        self.usable()?;
        self.inputs.view_mut(&self.plan, name, rank)
    }

    /// Piece `piece` of this rank's buffer of input `name`, borrowed.
    pub fn piece<T: Element>(
        &self,
        name: &str,
        rank: usize,
        piece: usize,
    ) -> Result<&[T], RuntimeError> {
        self.usable()?;
        self.inputs.piece(&self.plan, name, rank, piece)
    }

    /// Piece `piece` of this rank's buffer of input `name`, to write.
    pub fn piece_mut<T: Element>(
        &mut self,
        name: &str,
        rank: usize,
        piece: usize,
    ) -> Result<&mut [T], RuntimeError> {
        self.usable()?;
        self.inputs.piece_mut(&self.plan, name, rank, piece)
    }

    /// Writes the whole logical tensor `data` into this rank's buffer of input `name`
    /// (its block of a Sliced input).
    pub fn write_input<T: Element>(&mut self, name: &str, data: &[T]) -> Result<(), RuntimeError> {
        self.usable()?;
        self.inputs.write_global(&self.plan, name, data)
    }
}

/// Reads answer for this process's rank (`None` for the others); scalars set here must
/// be set to the same values on every process (the next run checks).
impl JobData for MpiJob {
    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn rank_value(&self, v: ValueId, rank: usize) -> Result<Option<Vec<f64>>, RuntimeError> {
        self.usable()?;
        if rank != self.rank {
            return Ok(None);
        }
        Ok(value_on(
            &self.plan,
            v,
            self.rank,
            &|t| Some(self.inputs.buffers[self.rank].get(&t)?.to_f64()),
            &|s| Some(self.slots[s].to_f64()),
        ))
    }

    fn write_rank_bytes(
        &mut self,
        name: &str,
        rank: usize,
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        self.usable()?;
        if rank != self.rank {
            return Err(RuntimeError::Read(format!(
                "rank {rank}'s data is in another process (this is rank {})",
                self.rank
            )));
        }
        self.inputs.write_bytes(&self.plan, name, rank, bytes)
    }

    fn set_scalar_value(&mut self, id: ValueId, value: f64) -> Result<(), RuntimeError> {
        self.inputs.scalars.insert(id, value);
        Ok(())
    }
}
