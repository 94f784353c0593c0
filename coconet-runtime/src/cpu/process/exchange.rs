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
use crate::RuntimeError;
use crate::cpu::collective::{general, reduce_f32_slices};
use crate::cpu::exec::{Comm, Ctx};
use crate::cpu::folds::Folds;
use crate::cpu::fused::commit_gathered;
use crate::cpu::kernel::{Kernel, Reduction, round};
use crate::cpu::ops;
use crate::host::matmul::MatMul;
use crate::host::memory::{Buffer, Raw};
use crate::plan::{FusedAllGather, FusedAllReduce, Gather};
use coconet_core::DType;
use coconet_core::numerics::tensor::numel;
use coconet_core::{Layout, Op, ReduceOp, ValueId, block_range};
use std::cell::RefCell;
use std::collections::VecDeque;

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
            let copy = keep.raw();
            r.copy_all_to(&copy);
            copy
        }
        None => {
            *keep = Buffer::from_f64(dtype, &ctx.read(x));
            keep.raw()
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
            Op::AllReduce(op, x) | Op::ReduceScatter(op, x, 0) if !p.node(x).ty.is_scalar() => {
                let group: Vec<usize> = ctx.holders(x).collect();
                let full = ctx.local_shape(x, group[0]);
                // Blocks of the flat array (all-reduce) or of dim 0 (reduce-scatter).
                let (rows, inner, gather) = match node.op {
                    Op::AllReduce(..) => (numel(&full), 1, true),
                    _ => (full[0], numel(&full[1..]), false),
                };
                return self.reduce_plain(ctx, op, (x, v), (rows, inner), gather);
            }
            Op::AllGather(x) if p.node(x).ty.layout == Layout::Sliced(0) => {
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
            ops::run(ctx, mm);
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
        let (rs, x, op) = f.head.unwrap_or((f.space, f.shaped, ReduceOp::Sum));
        let reduces = f.head.is_some();
        let gathers = f.gathers;
        let q = ctx.q();
        let group: Vec<usize> = ctx.holders(f.shaped).collect();
        let in_group = group.contains(&me);
        let live = |s: usize| in_group && group.contains(&s);
        let full = ctx.plan.shape(f.shaped).to_vec();
        let inner = numel(&full[1..]);
        let block = |s: usize| {
            let b = block_range(full[0], q, s % q);
            b.start * inner..b.end * inner
        };
        let xdt = p.node(x).ty.dtype;
        let size = if reduces { xdt.size_bytes() } else { 0 };
        let gdts: Vec<DType> = gathers.iter().map(|g| p.node(g.gather).ty.dtype).collect();
        // Every byte count and displacement below is within the whole tensor or q of
        // the largest block: check once, alike on every process, before communicating.
        let widest = gdts.iter().map(|d| d.size_bytes()).fold(size, usize::max);
        let largest = block(group[0]).len();
        numel(&full)
            .max(largest.saturating_mul(q))
            .checked_mul(widest)
            .map_or(check_size(self.link, usize::MAX), |b| {
                check_size(self.link, b)
            })?;
        let preset: &[ValueId] = if reduces { &[rs] } else { &[] };
        let mut kernel =
            in_group.then(|| Kernel::new(ctx, preset, f.kernel, ctx.local_shape(f.space, me)));
        let mut folds = kernel.as_ref().map(|k| Folds::new(p, f.reductions, k));
        // Whether to try each round's reduction inside the compiled code: given up after
        // a round whose kernel could not (the same program and buffers every round).
        let mut reduce_in_code = reduces;
        // Rounds of many kernel chunks (few, large messages, sent as the tensors' own
        // bytes); every process runs the same number of rounds (the largest block's).
        let step = crate::cpu::kernel::step_for(
            p,
            f.kernel,
            &ctx.local_shape(f.space, group[0]),
            ctx.chunk,
        );
        let round_len = step.saturating_mul(self.round_chunks);
        let rounds = largest.div_ceil(round_len);
        // Positions of rank s's block in round k (empty once its block is done).
        let chunk = |k: usize, s: usize| {
            let b = block(s);
            let lo = (b.start + k * round_len).min(b.end);
            lo..lo.saturating_add(round_len).min(b.end)
        };
        // x is sent as contiguous bytes (a copy where it is not in one buffer of mine).
        let mut x_copy = Buffer::zeros(xdt, 0);
        let x_raw = if reduces && in_group {
            contiguous(ctx, x, xdt, &mut x_copy)
        } else {
            x_copy.raw()
        };
        debug_assert!(
            overlap.is_none() || ctx.raw(x, me).is_some_and(|r| !r.is_pieced()),
            "a matmul's output is one buffer, which the rounds write in place"
        );
        // Each gather lands in my buffer of its value, or in scratch where I hold none
        // or mine is in pieces (copied into them once every round has landed).
        let mut scratch: Vec<Buffer> = Vec::new();
        let mut unpack: Vec<(Raw, Raw)> = Vec::new();
        let dsts: Vec<Raw> = gathers
            .iter()
            .zip(&gdts)
            .map(|(&Gather { gather: g, .. }, &dt)| match ctx.raw(g, me) {
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
        let received = if in_group && reduces { q } else { 0 };
        let mut recv_bufs: Vec<Buffer> = (0..sets)
            .map(|_| self.scratch.take(xdt, cap * received))
            .collect();
        let recv_raws: Vec<Raw> = recv_bufs.iter_mut().map(Buffer::raw).collect();
        let mut out_bufs: Vec<Vec<Buffer>> = (0..sets)
            .map(|_| gdts.iter().map(|&dt| self.scratch.take(dt, cap)).collect())
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
        let per_rank = |f: &dyn Fn(usize) -> usize| -> Vec<usize> { (0..world).map(f).collect() };
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
                self.link.post_all_to_all(
                    Parts {
                        ptr: x_ptr,
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
        };
        // Across hosts, each round's gathers go in two steps (see `relay`): the whole
        // world gathers, on hosts of equal size.
        let hosts = (group.len() == world)
            .then(|| Hosts::of(self.link))
            .flatten();
        let post_gathers = |k: usize| -> Vec<Box<dyn Flight + '_>> {
            (0..gathers.len())
                .map(|i| {
                    let gsize = gdts[i].size_bytes();
                    let on = |s: usize| group.contains(&s);
                    let out = out_raws[k % 2][i];
                    // SAFETY: the results buffer is not written again before this
                    // gather completes (round k + 2 waits for it); see above for dst.
                    unsafe {
                        let send = out.bytes(0, mine(k)).as_ptr();
                        if let Some(hosts) = &hosts {
                            let at = |s: usize| {
                                let c = chunk(k, s);
                                c.start * gsize..c.end * gsize
                            };
                            let sent = (send, mine(k) * gsize);
                            return hosts.post_first(self.link, me, sent, dst_ptrs[i], &at);
                        }
                        let gc = per_rank(&|s| if on(s) { chunk(k, s).len() * gsize } else { 0 });
                        let gd = per_rank(&|s| if on(s) { chunk(k, s).start * gsize } else { 0 });
                        self.link.post_all_gather(
                            Bytes {
                                ptr: send,
                                len: mine(k) * gsize,
                            },
                            Parts {
                                ptr: dst_ptrs[i],
                                counts: gc,
                                displs: gd,
                            },
                        )
                    }
                })
                .collect()
        };
        // The second step of round k's gathers across hosts, once its first is done.
        let post_relayed = |k: usize| -> Vec<Box<dyn Flight + '_>> {
            let Some(hosts) = &hosts else {
                return Vec::new();
            };
            let mut flights = Vec::new();
            for (i, dt) in gdts.iter().enumerate() {
                let gsize = dt.size_bytes();
                let at = |s: usize| {
                    let c = chunk(k, s);
                    c.start * gsize..c.end * gsize
                };
                for host in hosts.others(me) {
                    // SAFETY: round k's first step has landed in dst; see above.
                    flights
                        .push(unsafe { hosts.post_second(self.link, me, host, dst_ptrs[i], &at) });
                }
            }
            flights
        };
        let rs_store = if reduces {
            ctx.store_mapping(rs, &[])
        } else {
            None
        };
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
            let mut exchange = (reduces && rounds > 0).then(|| {
                rows_for(0);
                post_exchange(0)
            });
            // Each round's gathers: the first step's flights, then the second's.
            type Steps<'f> = (Vec<Box<dyn Flight + 'f>>, Vec<Box<dyn Flight + 'f>>);
            let mut gathering: VecDeque<Steps<'_>> = VecDeque::new();
            for k in 0..rounds {
                drop(exchange.take()); // waits for round k's chunks
                if reduces && k + 1 < rounds {
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
                    // letting MPI progress the requests in flight between chunks. Where
                    // the kernel compiles, this round's reduction runs inside its code,
                    // reading the received blocks where they landed.
                    let sources: Vec<(Raw, usize)> = (0..q).map(|t| (recv, t * n)).collect();
                    let reduction = Reduction {
                        op,
                        sources: &sources,
                        origin: k * round_len,
                        len: n,
                        keep: rs_store.is_some(),
                    };
                    let mut in_code = reduce_in_code
                        .then(|| {
                            let shape = ctx.local_shape(f.space, me);
                            Kernel::reducing(ctx, preset, f.kernel, shape, Some(reduction))
                        })
                        .filter(Kernel::reduces);
                    reduce_in_code = in_code.is_some();
                    let kernel = in_code.as_mut().unwrap_or(kernel);
                    let mut off = 0;
                    while off < n {
                        let len = step.min(n - off);
                        // f32 blocks straight into the f32 register where they can.
                        let direct = !reduces
                            || kernel.reduces()
                            || kernel.f32_register(0, len).is_some_and(|reg| {
                                (0..q)
                                    .map(|t| recv.f32_slice(t * n + off, len))
                                    .collect::<Option<Vec<&[f32]>>>()
                                    .is_some_and(|srcs| reduce_f32_slices(op, &srcs, reg))
                            });
                        if !direct {
                            let acc = &mut acc[..len];
                            reduce_received(op, &recv, (q, n), off, acc, &mut tmp[..len]);
                            kernel.set(0, acc);
                        }
                        let at = k * round_len + off;
                        kernel.chunk(at, len);
                        if let Some(crate::cpu::array::Mapping::Contiguous { raw, base }) =
                            &rs_store
                        {
                            kernel.store(0, len, raw, base + at);
                        }
                        if let Some(folds) = folds.as_mut() {
                            folds.chunk(kernel, len);
                        }
                        for (i, &Gather { sent: y, .. }) in gathers.iter().enumerate() {
                            let src = kernel
                                .index_of(y)
                                .expect("gathered values are fused stages");
                            kernel.store(src, len, &outs[i], off);
                        }
                        off += len;
                        exchange.iter_mut().for_each(|f| f.poll());
                        for (first, second) in gathering.iter_mut() {
                            first.iter_mut().chain(second).for_each(|f| f.poll());
                        }
                    }
                }
                if hosts.is_some()
                    && let Some(last) = gathering.back_mut()
                {
                    last.0.clear(); // round k - 1's first step done
                    last.1 = post_relayed(k - 1);
                }
                gathering.push_back((post_gathers(k), Vec::new()));
            }
            if hosts.is_some()
                && let Some(last) = gathering.back_mut()
            {
                last.0.clear();
                last.1 = post_relayed(rounds - 1);
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
        if let Some(folds) = &folds {
            folds.finish(ctx);
        }
        self.scratch
            .keep(recv_bufs.into_iter().chain(out_bufs.into_iter().flatten()));
        drop((scratch, x_copy));
        if broken {
            return Err(RuntimeError::RankFailed {
                rank: me,
                message: "the overlapped matmul panicked".into(),
            });
        }
        Ok(())
    }
}
