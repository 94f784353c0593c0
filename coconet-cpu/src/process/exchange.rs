//! Collectives between processes, over any [`Transport`](super::Transport): the same
//! plans and kernels as rank threads, only the data movement differs.
//!
//! - all-reduce and reduce-scatter are an all-to-all of blocks followed by a reduction
//!   of my block in rank order (then an all-gather for all-reduce) — deterministic, so
//!   results are bitwise those of the reference interpreter and of rank threads (MPI's
//!   own reductions do not promise an order);
//! - the fused all-reduce goes round by round ([`ROUND_CHUNKS`](super::ROUND_CHUNKS) kernel chunks each),
//!   pipelined with non-blocking collectives: while round k is reduced (rank order) and
//!   updated from one receive buffer, round k + 1's all-to-all fills the other, and round
//!   k - 1's all-gathers send its results straight into every rank's destination from
//!   the other of a second pair of buffers (round k - 2's completes first); the kernel
//!   polls the requests in flight between chunks (Open MPI moves non-blocking
//!   collectives only inside MPI calls). Every process runs the same rounds (the largest
//!   block's) and posts the same collectives in the same order, with empty parts where
//!   its block is done or it is outside the group;
//! - the fused all-gather (a kernel whose results go to every process) runs the same
//!   rounds without the all-to-all: its kernel reads my block from memory;
//! - a matmul producing the fused all-reduce's operand (an `ol(MM, ...)` schedule) runs
//!   on its own thread, by blocks of its first dim as on rank threads, in the order the
//!   rounds send them: each round's all-to-all is posted once its rows are written;
//! - other collectives gather every rank's operand and compute the result locally.
//!
//! Non-fused all-reduces, reduce-scatters and all-gathers along dim 0 move the tensors'
//! own bytes too ([`plain`](super::plain)); other collectives move data as f64 (exact for
//! every dtype).
//!
//! Not done yet: point-to-point reductions (a ring) instead of the all-to-all, and
//! overlap for the non-fused collectives.

use super::relay::Hosts;
use super::transport::link::{Bytes, Flight, Link, Parts};
use super::transport::{all_gather_f64, check_size, displs};
use crate::array::Mapping;
use crate::collective::{general, reduce_f32_slices};
use crate::exec::{Comm, Ctx};
use crate::folds::Folds;
use crate::fused::commit_gathered;
use crate::kernel::{Kernel, Reduction, round};
use crate::local_ops;
use coconet_core::Collective;
use coconet_core::DType;
use coconet_core::numerics::tensor::numel;
use coconet_core::{Layout, Op, ReduceOp, ValueId, block_range};
use coconet_plan::RuntimeError;
use coconet_plan::host::matmul::MatMul;
use coconet_plan::host::memory::{Buffer, Raw};
use coconet_plan::plan::{FusedAllGather, FusedAllReduce, Gather};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::mpsc::{Receiver, Sender};
use std::thread::{Scope, ScopedJoinHandle};

/// Communication between the processes of a job through a transport.
pub(crate) struct Processes<'a> {
    pub link: &'a dyn Link,
    /// Kernel chunks per round of a fused all-reduce.
    pub round_chunks: usize,
    /// Buffers kept from earlier runs.
    pub scratch: &'a Scratch,
}

/// The fused all-reduce's receive and result buffers, kept from one run to the next: a
/// training loop runs the same plan every step, and fresh buffers of megabytes cost a
/// page fault (and a page cleared) per 4 KiB every time. Every element of a buffer taken
/// here is written before it is read.
#[derive(Debug, Default)]
pub(crate) struct Scratch(RefCell<Vec<Buffer>>);

impl Scratch {
    /// A buffer of `len` elements of `dtype` (one kept, or a new one).
    pub(super) fn take(&self, dtype: DType, len: usize) -> Buffer {
        let mut kept = self.0.borrow_mut();
        match kept.iter().position(|b| b.dtype == dtype && b.len == len) {
            Some(i) => kept.swap_remove(i),
            None => Buffer::zeros(dtype, len),
        }
    }

    /// Keeps `buffers` for the next run.
    pub(super) fn keep(&self, buffers: impl IntoIterator<Item = Buffer>) {
        self.0.borrow_mut().extend(buffers);
    }
}

impl Processes<'_> {
    fn size(&self) -> usize {
        self.link.size()
    }

    /// The transport's failure, if a collective failed.
    pub(super) fn check(&self) -> Result<(), RuntimeError> {
        self.link.failure().map_or(Ok(()), Err)
    }
}

/// My data of `x` as one plain buffer of its dtype: its own where it is one, else a copy
/// in `keep` (a value computed elsewhere, or an input bound in pieces).
pub(super) fn contiguous(ctx: &Ctx, x: ValueId, dtype: DType, keep: &mut Buffer) -> Raw {
    match ctx.raw(x, ctx.rank) {
        Some(r) if !r.is_pieced() => r,
        Some(r) => {
            *keep = Buffer::zeros(dtype, r.len());
            // SAFETY: the caller keeps `keep` for as long as it uses the view.
            let copy = unsafe { keep.raw() };
            r.copy_all_to(&copy);
            copy
        }
        None => {
            *keep = Buffer::from_f64(dtype, &ctx.read(x));
            // SAFETY: as above.
            unsafe { keep.raw() }
        }
    }
}

/// `acc` = the op-reduction, in f64 and rank order, of positions `off..off + acc.len()`
/// of the `q` consecutive blocks of `n` elements in `recv` (`tmp` as long as `acc`).
pub(super) fn reduce_received(
    op: ReduceOp,
    recv: &Raw,
    (q, n): (usize, usize),
    off: usize,
    acc: &mut [f64],
    tmp: &mut [f64],
) {
    recv.load(off, acc);
    for t in 1..q {
        recv.load(t * n + off, tmp);
        acc.iter_mut()
            .zip(&*tmp)
            .for_each(|(a, b)| *a = op.combine(*a, *b));
    }
    acc.iter_mut().for_each(|a| *a = op.finish(*a, q));
}

impl Comm for Processes<'_> {
    fn collective(&self, ctx: &Ctx, v: ValueId, at: &str) -> Result<(), RuntimeError> {
        self.link.enter(at);
        let p = ctx.plan.program();
        let node = p.node(v);
        let me = ctx.rank;
        let holds = ctx.holds(v, me);
        match node.op {
            // Collectives keep their operand's dtype (the builder gives them its type),
            // so these move the tensors' own bytes.
            Op::Collective(Collective::AllReduce(op), x)
            | Op::Collective(Collective::ReduceScatter(op, 0), x)
                if !p.node(x).ty.is_scalar() =>
            {
                let group: Vec<usize> = ctx.holders(x).collect();
                let full = ctx.local_shape(x, group[0]);
                // Blocks of the flat array (all-reduce) or of dim 0 (reduce-scatter).
                let (rows, inner, gather) = match node.op {
                    Op::Collective(Collective::AllReduce(_), _) => (numel(&full), 1, true),
                    _ => (full[0], numel(&full[1..]), false),
                };
                return self.reduce_plain(ctx, op, (x, v), (rows, inner), gather);
            }
            Op::Collective(Collective::AllGather, x)
                if p.node(x).ty.layout == Layout::Sliced(0) =>
            {
                let full = ctx.plan.shape(v);
                return self.gather_plain(ctx, (x, v), (full[0], numel(&full[1..])));
            }
            ref op => {
                let x = op.operands()[0];
                let mine = if ctx.holds(x, me) {
                    ctx.read(x)
                } else {
                    vec![]
                };
                let all = all_gather_f64(self.link, &mine)?;
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
        f: &FusedAllReduce,
        matmul: Option<ValueId>,
        at: &str,
    ) -> Result<(), RuntimeError> {
        self.link.enter(at);
        let me = ctx.rank;
        let x = f.operand;
        // A matmul producing the reduced tensor in a buffer runs alongside the rounds;
        // any other runs first.
        let overlap =
            matmul.filter(|&mm| mm == x && ctx.holds(mm, me) && ctx.raw(mm, me).is_some());
        if let Some(mm) = matmul
            && ctx.holds(mm, me)
            && overlap.is_none()
        {
            local_ops::run(ctx, mm);
        }
        let pass = Pass {
            head: Some((f.reduce_scatter, x, f.op)),
            shaped: x,
            space: f.reduce_scatter,
            kernel: &f.kernel,
            reductions: &f.reductions,
            gathers: &f.gathers,
        };
        self.fused_rounds(ctx, &pass, overlap)?;
        // A failed transport abandoned some rounds: what was gathered is not the result.
        self.check()?;
        commit_gathered(ctx, &f.gathers);
        Ok(())
    }

    fn fused_gather(&self, ctx: &Ctx, f: &FusedAllGather, at: &str) -> Result<(), RuntimeError> {
        self.link.enter(at);
        let sent = f.gathers[0].sent;
        let pass = Pass {
            head: None,
            shaped: sent,
            space: f.kernel[0],
            kernel: &f.kernel,
            reductions: &[],
            gathers: &f.gathers,
        };
        self.fused_rounds(ctx, &pass, None)?;
        self.check()?;
        commit_gathered(ctx, &f.gathers);
        Ok(())
    }
}

/// A fused pass between processes: a fused all-reduce (reduce-scatter first) or a fused
/// all-gather (no reduction: the kernel reads my block from memory).
struct Pass<'f> {
    /// The reduce-scatter, its operand and operation.
    head: Option<(ValueId, ValueId, ReduceOp)>,
    /// The value whose dim-0 blocks the ranks compute (the operand, or a gathered stage).
    shaped: ValueId,
    /// The value whose local shape is the kernel's iteration space.
    space: ValueId,
    kernel: &'f [ValueId],
    reductions: &'f [ValueId],
    gathers: &'f [Gather],
}

impl Processes<'_> {
    /// A fused pass's rounds, pipelined (see the module docs): round k's all-to-all
    /// lands in one of two receive buffers while round k - 1 is reduced and updated from
    /// the other; round k's results go out from one of two send buffers while round
    /// k + 1 is computed. A pass without a reduce-scatter (a fused all-gather) has no
    /// all-to-all: its kernel reads my block from memory.
    fn fused_rounds(
        &self,
        ctx: &Ctx,
        f: &Pass<'_>,
        overlap: Option<ValueId>,
    ) -> Result<(), RuntimeError> {
        let p = ctx.plan.program();
        let me = ctx.rank;
        // Without a reduce-scatter, the operand stands for the shaped value (never sent).
        let (_, x, _) = f.head.unwrap_or((f.space, f.shaped, ReduceOp::Sum));
        let reduces = f.head.is_some();
        let xdt = p.node(x).ty.dtype;
        let size = if reduces { xdt.size_bytes() } else { 0 };
        let gdts: Vec<DType> = f
            .gathers
            .iter()
            .map(|g| p.node(g.gather).ty.dtype)
            .collect();
        let at = Rounds::new(self, ctx, f, size, &gdts)?;
        let mut compute = at.in_group.then(|| Compute::new(ctx, f, &at));
        // x is sent as contiguous bytes (a copy where it is not in one buffer of mine).
        let mut x_copy = Buffer::zeros(xdt, 0);
        let x_raw = if reduces && at.in_group {
            contiguous(ctx, x, xdt, &mut x_copy)
        } else {
            // SAFETY: `x_copy` lives to the end of the step, beyond every use of `x_raw`.
            unsafe { x_copy.raw() }
        };
        debug_assert!(
            overlap.is_none() || ctx.raw(x, me).is_some_and(|r| !r.is_pieced()),
            "a matmul's output is one buffer, which the rounds write in place"
        );
        let dests = Destinations::new(ctx, f.gathers, &gdts, &at);
        let mut doubles = Doubles::take(self.scratch, &at, xdt, &gdts, reduces);
        let posts = Posts::new(
            self.link,
            &at,
            size,
            &gdts,
            x_raw,
            &dests.raws,
            &mut doubles,
        );
        let mut broken = false;
        std::thread::scope(|scope| {
            let (ready_tx, ready_rx) = std::sync::mpsc::channel::<usize>();
            let producer = overlap.map(|mm| spawn_matmul(scope, ctx, mm, x_raw, &at, ready_tx));
            let mut rows = RowsReady {
                rx: ready_rx,
                ready: if producer.is_some() { 0 } else { at.count },
                count: at.count,
                broken: false,
            };
            posts.pipeline(compute.as_mut(), &mut rows, reduces);
            broken = rows.broken;
            if let Some(h) = producer
                && h.join().is_err()
            {
                broken = true;
            }
        });
        dests.unpack();
        if let Some(compute) = &compute {
            compute.folds.finish(ctx);
        }
        doubles.keep(self.scratch);
        drop((dests, x_copy));
        if broken {
            return Err(RuntimeError::RankFailed {
                rank: me,
                message: "the overlapped matmul panicked".into(),
            });
        }
        Ok(())
    }
}

/// Where a fused pass's rounds fall, alike on every process (so that all post the same
/// collectives in the same order): the ranks that compute, their dim-0 blocks of the
/// shaped value, and each round's part of each block.
struct Rounds {
    me: usize,
    q: usize,
    /// Processes in the job.
    world: usize,
    /// The ranks holding the shaped value, and whether I am one of them.
    group: Vec<usize>,
    in_group: bool,
    /// The shaped value's dim 0, and its elements per dim-0 row.
    rows: usize,
    inner: usize,
    /// Elements per kernel chunk, and per round: rounds of many kernel chunks (few,
    /// large messages, sent as the tensors' own bytes).
    step: usize,
    len: usize,
    /// Rounds every process runs (the largest block's).
    count: usize,
}

impl Rounds {
    /// The rounds of pass `f`, whose reduce-scatter sends elements of `size` bytes (0:
    /// none) and whose gathers send `gdts`. Fails, on every process alike and before
    /// anything is sent, where a message would exceed what the transport carries.
    fn new(
        pr: &Processes<'_>,
        ctx: &Ctx,
        f: &Pass<'_>,
        size: usize,
        gdts: &[DType],
    ) -> Result<Rounds, RuntimeError> {
        let q = ctx.q();
        let group: Vec<usize> = ctx.holders(f.shaped).collect();
        let full = ctx.plan.shape(f.shaped);
        let mut at = Rounds {
            me: ctx.rank,
            q,
            world: pr.size(),
            in_group: group.contains(&ctx.rank),
            group,
            rows: full[0],
            inner: numel(&full[1..]),
            step: 0,
            len: 0,
            count: 0,
        };
        // Every byte count and displacement is within the whole tensor or q of the
        // largest block: check once, alike on every process, before communicating.
        let widest = gdts.iter().map(|d| d.size_bytes()).fold(size, usize::max);
        let largest = at.block(at.group[0]).len();
        numel(full)
            .max(largest.saturating_mul(q))
            .checked_mul(widest)
            .map_or(check_size(pr.link, usize::MAX), |b| check_size(pr.link, b))?;
        at.step = crate::kernel::step_for(
            ctx.plan.program(),
            f.kernel,
            &ctx.local_shape(f.space, at.group[0]),
            ctx.chunk,
        );
        at.len = at.step.saturating_mul(pr.round_chunks);
        at.count = largest.div_ceil(at.len);
        Ok(at)
    }

    /// Rank s's block of the shaped value (positions in the flat array).
    fn block(&self, s: usize) -> Range<usize> {
        let b = block_range(self.rows, self.q, s % self.q);
        b.start * self.inner..b.end * self.inner
    }

    /// Positions of rank s's block in round k (empty once its block is done).
    fn chunk(&self, k: usize, s: usize) -> Range<usize> {
        let b = self.block(s);
        let lo = (b.start + k * self.len).min(b.end);
        lo..lo.saturating_add(self.len).min(b.end)
    }

    /// Whether rank s exchanges blocks with me (we are both in the group).
    fn live(&self, s: usize) -> bool {
        self.in_group && self.group.contains(&s)
    }

    /// My elements in round k.
    fn mine(&self, k: usize) -> usize {
        if self.in_group {
            self.chunk(k, self.me).len()
        } else {
            0
        }
    }

    /// Byte counts per rank (in range: checked by [`Rounds::new`]).
    fn per_rank(&self, f: impl Fn(usize) -> usize) -> Vec<usize> {
        (0..self.world).map(f).collect()
    }
}

/// Where each gathered value lands: my buffer of it, or scratch where I hold none or
/// mine is in pieces (the transport writes one contiguous destination).
struct Destinations {
    raws: Vec<Raw>,
    /// The scratch buffers: `raws` point into them until every gather has landed.
    _scratch: Vec<Buffer>,
    /// (scratch, my pieced buffer): copied once every round has landed.
    unpack: Vec<(Raw, Raw)>,
}

impl Destinations {
    fn new(ctx: &Ctx, gathers: &[Gather], gdts: &[DType], at: &Rounds) -> Destinations {
        let me = ctx.rank;
        let mut scratch: Vec<Buffer> = Vec::new();
        let mut unpack: Vec<(Raw, Raw)> = Vec::new();
        let raws = gathers
            .iter()
            .zip(gdts)
            .map(|(&Gather { gather: g, .. }, &dt)| match ctx.raw(g, me) {
                Some(d) if ctx.holds(g, me) && !d.is_pieced() => d,
                mine => {
                    let len = match mine {
                        Some(d) if ctx.holds(g, me) => d.len(),
                        _ => at.block(at.group[at.q - 1]).end,
                    };
                    let mut b = Buffer::zeros(dt, len);
                    // SAFETY: `scratch` keeps the buffer (its heap memory does not move
                    // when the buffer does) for as long as the view is used.
                    let r = unsafe { b.raw() };
                    scratch.push(b);
                    if let Some(d) = mine.filter(|_| ctx.holds(g, me)) {
                        unpack.push((r, d));
                    }
                    r
                }
            })
            .collect();
        Destinations {
            raws,
            _scratch: scratch,
            unpack,
        }
    }

    /// Copies what landed in scratch into my buffers in pieces.
    fn unpack(&self) {
        for (from, to) in &self.unpack {
            from.copy_all_to(to);
        }
    }
}

/// A fused pass's double buffers, taken from (and given back to) the kept [`Scratch`]:
/// per set, the received chunks of x (q of my chunk's length) and the results to
/// gather (one buffer per gathered value). Round k uses set k % 2.
struct Doubles {
    recv: Vec<Buffer>,
    outs: Vec<Vec<Buffer>>,
}

impl Doubles {
    fn take(scratch: &Scratch, at: &Rounds, xdt: DType, gdts: &[DType], reduces: bool) -> Doubles {
        let cap = if at.in_group {
            at.block(at.me).len().min(at.len)
        } else {
            0
        };
        let sets = at.count.min(2);
        let received = if at.in_group && reduces { at.q } else { 0 };
        Doubles {
            recv: (0..sets)
                .map(|_| scratch.take(xdt, cap * received))
                .collect(),
            outs: (0..sets)
                .map(|_| gdts.iter().map(|&dt| scratch.take(dt, cap)).collect())
                .collect(),
        }
    }

    /// Keeps the buffers for the next run.
    fn keep(self, scratch: &Scratch) {
        scratch.keep(self.recv.into_iter().chain(self.outs.into_iter().flatten()));
    }
}

/// Each round's gathers: the first step's flights, then the second's (across hosts).
type Steps<'f> = (Vec<Box<dyn Flight + 'f>>, Vec<Box<dyn Flight + 'f>>);

/// Posts a fused pass's collectives, round by round, between raw buffers.
struct Posts<'p> {
    link: &'p dyn Link,
    at: &'p Rounds,
    /// Bytes per element of x (0 without a reduce-scatter).
    size: usize,
    gdts: &'p [DType],
    x_ptr: *mut u8,
    dst_ptrs: Vec<*mut u8>,
    /// The double buffers' views.
    recv: Vec<Raw>,
    outs: Vec<Vec<Raw>>,
    /// Across hosts, each round's gathers go in two steps (see `relay`): where the whole
    /// world gathers, on hosts of equal size.
    hosts: Option<Hosts>,
}

impl<'p> Posts<'p> {
    fn new(
        link: &'p dyn Link,
        at: &'p Rounds,
        size: usize,
        gdts: &'p [DType],
        x: Raw,
        dsts: &[Raw],
        doubles: &mut Doubles,
    ) -> Posts<'p> {
        // SAFETY (for the byte pointers): x is only read during the step; the receive,
        // result and scratch buffers are ours; each destination region (a rank's chunk
        // of one round) is written by one all-gather only, which no kernel chunk reads
        // (kernels read my block at the round being computed, gathers in flight write
        // earlier rounds).
        let x_ptr = unsafe { x.bytes(0, x.len()) }.as_ptr().cast_mut();
        let dst_ptrs = dsts
            .iter()
            .map(|d| unsafe { d.bytes_mut() }.as_mut_ptr())
            .collect();
        let hosts = (at.group.len() == at.world)
            .then(|| Hosts::of(link))
            .flatten();
        Posts {
            link,
            at,
            size,
            gdts,
            x_ptr,
            dst_ptrs,
            // SAFETY: the caller's `Doubles` outlive the posts, which are this step's.
            recv: doubles
                .recv
                .iter_mut()
                .map(|b| unsafe { b.raw() })
                .collect(),
            outs: doubles
                .outs
                .iter_mut()
                .map(|set| set.iter_mut().map(|b| unsafe { b.raw() }).collect())
                .collect(),
            hosts,
        }
    }

    /// Runs the rounds with, in flight, the next round's exchange and the last two
    /// rounds' gathers. Every process posts them in the same order: A0, A1, G0, A2, G1,
    /// A3, G2, ... (`compute`: my part, where I am in the group).
    fn pipeline(&self, mut compute: Option<&mut Compute<'_>>, rows: &mut RowsReady, reduces: bool) {
        let rounds = self.at.count;
        let mut exchange = (reduces && rounds > 0).then(|| {
            rows.wait(0);
            self.exchange(0)
        });
        let mut gathering: VecDeque<Steps<'p>> = VecDeque::new();
        for k in 0..rounds {
            drop(exchange.take()); // waits for round k's chunks
            if reduces && k + 1 < rounds {
                rows.wait(k + 1);
                exchange = Some(self.exchange(k + 1));
            }
            if gathering.len() == 2 {
                drop(gathering.pop_front()); // round k - 2 sent: its results buffer is free
            }
            if let Some(compute) = compute.as_mut() {
                // Lets the transport progress the requests in flight (Open MPI moves
                // non-blocking collectives only inside MPI calls).
                let mut poll = || {
                    exchange.iter_mut().for_each(|f| f.poll());
                    for (first, second) in gathering.iter_mut() {
                        first.iter_mut().chain(second).for_each(|f| f.poll());
                    }
                };
                let (recv, outs) = (self.recv[k % 2], &self.outs[k % 2]);
                compute.round(k, self.at.mine(k), recv, outs, &mut poll);
            }
            if self.hosts.is_some()
                && let Some(last) = gathering.back_mut()
            {
                last.0.clear(); // round k - 1's first step done
                last.1 = self.relayed(k - 1);
            }
            gathering.push_back((self.gathers(k), Vec::new()));
        }
        if self.hosts.is_some()
            && let Some(last) = gathering.back_mut()
        {
            last.0.clear();
            last.1 = self.relayed(rounds - 1);
        }
        drop(gathering);
    }

    /// Posts round k's all-to-all: to each rank in the group, its chunk of my x; into
    /// round k's receive buffer, my chunk from each.
    fn exchange(&self, k: usize) -> Box<dyn Flight + 'p> {
        let (at, size) = (self.at, self.size);
        let n = at.mine(k);
        let sc = at.per_rank(|s| {
            if at.live(s) {
                at.chunk(k, s).len() * size
            } else {
                0
            }
        });
        let sd = at.per_rank(|s| {
            if at.live(s) {
                at.chunk(k, s).start * size
            } else {
                0
            }
        });
        let rc = at.per_rank(|t| if at.live(t) { n * size } else { 0 });
        let rd = displs(&rc);
        let recv = self.recv[k % 2];
        // SAFETY: `recv` is untouched until the exchange completes (the next
        // round's exchange uses the other buffer); see `Posts::new` for x.
        unsafe {
            let rptr = recv.bytes_mut().as_mut_ptr();
            self.link.post_all_to_all(
                Parts {
                    ptr: self.x_ptr,
                    counts: sc,
                    displs: sd,
                },
                Parts {
                    ptr: rptr,
                    counts: rc,
                    displs: rd,
                },
            )
        }
    }

    /// Posts round k's gathers (across hosts, their first step): my results of the
    /// round, from its results buffer, to every rank's destination.
    fn gathers(&self, k: usize) -> Vec<Box<dyn Flight + 'p>> {
        let at = self.at;
        let mine = at.mine(k);
        (0..self.gdts.len())
            .map(|i| {
                let gsize = self.gdts[i].size_bytes();
                let on = |s: usize| at.group.contains(&s);
                let out = self.outs[k % 2][i];
                // SAFETY: the results buffer is not written again before this
                // gather completes (round k + 2 waits for it); see `Posts::new` for dst.
                unsafe {
                    let send = out.bytes(0, mine).as_ptr();
                    if let Some(hosts) = &self.hosts {
                        let range = |s: usize| {
                            let c = at.chunk(k, s);
                            c.start * gsize..c.end * gsize
                        };
                        let sent = (send, mine * gsize);
                        return hosts.post_first(self.link, at.me, sent, self.dst_ptrs[i], &range);
                    }
                    let gc = at.per_rank(|s| {
                        if on(s) {
                            at.chunk(k, s).len() * gsize
                        } else {
                            0
                        }
                    });
                    let gd = at.per_rank(|s| {
                        if on(s) {
                            at.chunk(k, s).start * gsize
                        } else {
                            0
                        }
                    });
                    self.link.post_all_gather(
                        Bytes {
                            ptr: send,
                            len: mine * gsize,
                        },
                        Parts {
                            ptr: self.dst_ptrs[i],
                            counts: gc,
                            displs: gd,
                        },
                    )
                }
            })
            .collect()
    }

    /// The second step of round k's gathers across hosts, once its first is done.
    fn relayed(&self, k: usize) -> Vec<Box<dyn Flight + 'p>> {
        let Some(hosts) = &self.hosts else {
            return Vec::new();
        };
        let at = self.at;
        let mut flights = Vec::new();
        for (i, dt) in self.gdts.iter().enumerate() {
            let gsize = dt.size_bytes();
            let range = |s: usize| {
                let c = at.chunk(k, s);
                c.start * gsize..c.end * gsize
            };
            for host in hosts.others(at.me) {
                // SAFETY: round k's first step has landed in dst; see `Posts::new`.
                flights.push(unsafe {
                    hosts.post_second(self.link, at.me, host, self.dst_ptrs[i], &range)
                });
            }
        }
        flights
    }
}

/// Round by round, whether the overlapped matmul has written the rows a round sends.
struct RowsReady {
    rx: Receiver<usize>,
    /// Rounds whose rows are written (all of them without a matmul).
    ready: usize,
    count: usize,
    /// Whether the matmul's thread died.
    broken: bool,
}

impl RowsReady {
    /// Waits until round r's rows of x are written. If the matmul thread died, goes on
    /// (every process must post every round) and fails at the end.
    fn wait(&mut self, r: usize) {
        while self.ready <= r {
            match self.rx.recv() {
                Ok(done) => self.ready = done + 1,
                Err(_) => (self.ready, self.broken) = (self.count, true),
            }
        }
    }
}

/// Runs the overlapped matmul `mm`, writing x through `x`, on its own thread: dim-0
/// blocks of its output (as the rank threads compute them, so results agree bitwise)
/// in the order the rounds send them, reporting on `ready` each round whose rows are
/// all written.
fn spawn_matmul<'scope>(
    scope: &'scope Scope<'scope, '_>,
    ctx: &Ctx,
    mm: ValueId,
    x: Raw,
    at: &'scope Rounds,
    ready: Sender<usize>,
) -> ScopedJoinHandle<'scope, ()> {
    let p = ctx.plan.program();
    let me = ctx.rank;
    let Op::MatMul(a, b) = p.node(mm).op else {
        unreachable!("overlap producers are matmuls")
    };
    let (sa, sb) = (ctx.local_shape(a, me), ctx.local_shape(b, me));
    let (av, bv) = (ctx.read(a), ctx.read(b));
    let dtype = p.node(mm).ty.dtype;
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
            x.store(rows.start * n, &buf);
        };
        for r in 0..at.count {
            for &s in &at.group {
                let c = at.chunk(r, s);
                if !c.is_empty() {
                    (c.start / at.inner..c.end.div_ceil(at.inner)).for_each(&mut block_of);
                }
            }
            let _ = ready.send(r);
        }
        (0..sa[0]).for_each(block_of);
    })
}

/// My part of a fused pass's computation: each round, the received blocks reduced in
/// rank order and the fused kernel run over them, chunk by chunk.
struct Compute<'a> {
    ctx: &'a Ctx<'a>,
    f: &'a Pass<'a>,
    /// The reduce-scatter (the kernel's preset value), where the pass has one.
    rs: Option<ValueId>,
    op: ReduceOp,
    kernel: Kernel,
    folds: Folds,
    /// Whether to try each round's reduction inside the compiled code: given up after
    /// a round whose kernel could not (the same program and buffers every round).
    reduce_in_code: bool,
    /// Where the reduce-scatter's result is kept, if anywhere.
    rs_store: Option<Mapping>,
    q: usize,
    step: usize,
    round_len: usize,
    /// f64 room for one chunk's reduction.
    acc: Vec<f64>,
    tmp: Vec<f64>,
}

impl<'a> Compute<'a> {
    fn new(ctx: &'a Ctx<'a>, f: &'a Pass<'a>, at: &Rounds) -> Compute<'a> {
        let (rs, op) = match f.head {
            Some((rs, _, op)) => (Some(rs), op),
            None => (None, ReduceOp::Sum),
        };
        let kernel = Kernel::new(
            ctx,
            rs.as_slice(),
            f.kernel,
            ctx.local_shape(f.space, ctx.rank),
        );
        let folds = Folds::new(ctx.plan.program(), f.reductions, &kernel);
        Compute {
            ctx,
            f,
            rs,
            op,
            kernel,
            folds,
            reduce_in_code: rs.is_some(),
            rs_store: rs.and_then(|rs| ctx.store_mapping(rs, &[])),
            q: at.q,
            step: at.step,
            round_len: at.len,
            acc: vec![0.0; at.step],
            tmp: vec![0.0; at.step],
        }
    }

    /// Round k, my `n` elements: reduces in rank order and runs the fused computation,
    /// chunk by chunk, storing the values to gather into `outs`; `poll` between chunks.
    /// Where the kernel compiles, the round's reduction runs inside its code, reading
    /// the received blocks in `recv` where they landed.
    fn round(&mut self, k: usize, n: usize, recv: Raw, outs: &[Raw], poll: &mut dyn FnMut()) {
        let (ctx, f, op, q) = (self.ctx, self.f, self.op, self.q);
        let sources: Vec<(Raw, usize)> = (0..q).map(|t| (recv, t * n)).collect();
        let reduction = Reduction {
            op,
            sources: &sources,
            origin: k * self.round_len,
            len: n,
            keep: self.rs_store.is_some(),
        };
        let mut in_code = self
            .reduce_in_code
            .then(|| {
                let shape = ctx.local_shape(f.space, ctx.rank);
                Kernel::reducing(ctx, self.rs.as_slice(), f.kernel, shape, Some(reduction))
            })
            .filter(Kernel::reduces);
        self.reduce_in_code = in_code.is_some();
        let kernel = in_code.as_mut().unwrap_or(&mut self.kernel);
        let reduces = self.rs.is_some();
        let mut off = 0;
        while off < n {
            let len = self.step.min(n - off);
            if reduces && !kernel.reduces() {
                let (acc, tmp) = (&mut self.acc[..len], &mut self.tmp[..len]);
                preset_reduced(kernel, op, recv, (q, n), (off, len), acc, tmp);
            }
            let at = k * self.round_len + off;
            kernel.chunk(at, len);
            if let Some(Mapping::Contiguous { raw, base }) = &self.rs_store {
                kernel.store(0, len, raw, base + at);
            }
            self.folds.chunk(kernel, len);
            for (i, &Gather { sent: y, .. }) in f.gathers.iter().enumerate() {
                let src = kernel
                    .index_of(y)
                    .expect("gathered values are fused stages");
                kernel.store(src, len, &outs[i], off);
            }
            off += len;
            poll();
        }
    }
}

/// Sets the kernel's first register (the reduce-scatter) to positions `off..off + len`
/// of the reduction of the `q` received blocks of `n` elements in `recv`: f32 blocks
/// straight into the f32 register where they can, else in f64 through `acc`.
fn preset_reduced(
    kernel: &mut Kernel,
    op: ReduceOp,
    recv: Raw,
    (q, n): (usize, usize),
    (off, len): (usize, usize),
    acc: &mut [f64],
    tmp: &mut [f64],
) {
    let direct = kernel.f32_register(0, len).is_some_and(|reg| {
        (0..q)
            .map(|t| recv.f32_slice(t * n + off, len))
            .collect::<Option<Vec<&[f32]>>>()
            .is_some_and(|srcs| reduce_f32_slices(op, &srcs, reg))
    });
    if !direct {
        reduce_received(op, &recv, (q, n), off, acc, tmp);
        kernel.set(0, acc);
    }
}
