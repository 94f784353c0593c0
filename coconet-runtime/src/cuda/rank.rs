//! One rank of a job whose ranks have separate memories (a process per GPU, or a GPU per
//! thread): the rank's own buffers on its device, and a [`Transport`] (NCCL, or
//! in-process mailboxes) moving bytes between ranks.
//!
//! It runs the very kernels the virtual-rank executor runs ([`DeviceJob`]), from the same
//! [`CudaProgram`]: a launch that reads or writes a peer's memory reads its peers'
//! regions from a staging buffer filled by an exchange first, and writes its peers'
//! regions into staging sent by an exchange afterwards. So a fused all-reduce becomes
//! "all-to-all of my chunk's sources → fused kernel (reduce in rank order, compute) →
//! all-gather of the results" over point-to-point transfers, every rank's results
//! bitwise those of the reference interpreter (NCCL's own reductions do not promise an
//! order, so they are not used). Byte for byte this moves what a ring reduce-scatter and
//! all-gather move.
//!
//! Every rank derives the same sequence of exchanges from the whole program (which every
//! process generates identically), so each send meets the matching receive in order.
//! Launches of a step are grouped into *phases*: a launch that reads or overwrites what
//! an earlier launch of the phase writes starts a new phase (the copy after a fused
//! all-reduce reads what peers' fused kernels wrote); within a phase all reads of peers'
//! memory happen first, then the kernels, then all writes into peers' memory.
//!
//! [`DeviceJob`]: super::DeviceJob

use super::codegen::{Arg, CudaProgram, GpuStep, Launch, MatMul, PtrArg};
use super::device::Device;
use super::exec::{
    PointerArrays, buffer_dtype, buffer_extent, launch_kernel, overlap_block, read_value,
};
use crate::RuntimeError;
use crate::plan::{BufferRef, Plan};
use coconet_core::{Bindings, DType, Element, ValueId};
use std::collections::HashMap;

/// A transfer of one exchange: `bytes` bytes at device address `address`, to or from
/// rank `peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// The other rank.
    pub peer: usize,
    /// Device address of the first byte.
    pub address: u64,
    /// Length in bytes.
    pub bytes: usize,
}

/// Moves bytes between ranks' device memories, ordered with the rank's kernels.
pub trait Transport<D: Device> {
    /// Posts `sends` and `recvs` as one group (no deadlock whatever the order ranks post
    /// them in): later kernels see the received bytes, and sent memory may be
    /// overwritten by later kernels. Transfers between two ranks match in the order
    /// posted. `at` names the step, for errors.
    fn exchange(
        &self,
        device: &D,
        sends: &[Transfer],
        recvs: &[Transfer],
        at: &str,
    ) -> Result<(), RuntimeError>;
}

/// Where a transfer's bytes are on this rank.
#[derive(Debug, Clone, Copy)]
enum Place {
    /// In one of the rank's buffers, at a byte offset.
    Own(BufferRef, usize),
    /// In the staging buffer, at a byte offset.
    Staging(usize),
}

#[derive(Debug, Clone, Copy)]
struct Move {
    peer: usize,
    place: Place,
    bytes: usize,
}

#[derive(Debug, Clone)]
enum Action {
    Uniform(Vec<ValueId>),
    Exchange {
        sends: Vec<Move>,
        recvs: Vec<Move>,
        at: String,
    },
    Launch {
        launch: Launch,
        lo: usize,
        hi: usize,
        /// Staging byte offset of element `lo` of pointer `k` of argument `a`, for
        /// pointers into peers' memory.
        staged: HashMap<(usize, usize), usize>,
    },
    WaitKernels,
    Gemm(MatMul, std::ops::Range<usize>),
    BlockDone,
}

/// A region of a rank's memory a launch touches: (rank, buffer — `None` for the
/// scratch —, elements `start..end`).
type Region = (usize, Option<BufferRef>, usize, usize);

/// The regions launch `l` over `lo..hi` reads and writes. A single pointer (a kernel
/// operand, always the launching rank's) counts as the whole buffer, read and written.
fn regions(l: &Launch, lo: usize, hi: usize) -> (Vec<Region>, Vec<Region>) {
    let (mut reads, mut writes) = (vec![], vec![]);
    for a in &l.args {
        match a {
            Arg::Reads(ps) => reads.extend(
                ps.iter()
                    .map(|p| (p.rank, Some(p.buffer), p.offset + lo, p.offset + hi)),
            ),
            Arg::Writes(ps) => writes.extend(
                ps.iter()
                    .map(|p| (p.rank, Some(p.buffer), p.offset + lo, p.offset + hi)),
            ),
            Arg::Ptr(p) => {
                reads.push((p.rank, Some(p.buffer), 0, usize::MAX));
                writes.push((p.rank, Some(p.buffer), 0, usize::MAX));
            }
            Arg::Scratch { rank, .. } => {
                reads.push((*rank, None, 0, usize::MAX));
                writes.push((*rank, None, 0, usize::MAX));
            }
            Arg::Range | Arg::I64(_) | Arg::Uniform(_) => {}
        }
    }
    (reads, writes)
}

fn overlaps(a: &Region, b: &Region) -> bool {
    a.0 == b.0 && a.1 == b.1 && a.2 < b.3 && b.2 < a.3
}

/// Splits launches (with their ranges) into phases: a launch starts a new phase when it
/// reads or writes a region an earlier launch of the phase writes.
fn phases(items: Vec<(Launch, usize, usize)>) -> Vec<Vec<(Launch, usize, usize)>> {
    let mut out: Vec<Vec<(Launch, usize, usize)>> = vec![];
    let mut written: Vec<Region> = vec![];
    for (l, lo, hi) in items {
        let (reads, writes) = regions(&l, lo, hi);
        let conflict = reads
            .iter()
            .chain(&writes)
            .any(|r| written.iter().any(|w| overlaps(r, w)));
        if conflict || out.is_empty() {
            out.push(vec![]);
            written.clear();
        }
        written.extend(writes);
        out.last_mut().expect("a phase").push((l, lo, hi));
    }
    out
}

/// Translates the whole program into rank `me`'s actions; returns them and the staging
/// bytes they need.
fn actions(
    plan: &Plan,
    program: &CudaProgram,
    me: usize,
) -> Result<(Vec<Action>, usize), RuntimeError> {
    let mut out = vec![];
    let mut staging = 0usize;
    let mut phase = |out: &mut Vec<Action>,
                     items: Vec<(Launch, usize, usize)>,
                     at: &str|
     -> Result<(), RuntimeError> {
        for items in phases(items) {
            let (mut pre_s, mut pre_r, mut post_s, mut post_r) = (vec![], vec![], vec![], vec![]);
            let mut mine = vec![];
            let mut used = 0usize;
            for (l, lo, hi) in items {
                let mut staged = HashMap::new();
                for (a, arg) in l.args.iter().enumerate() {
                    let (ps, write) = match arg {
                        Arg::Reads(ps) => (ps, false),
                        Arg::Writes(ps) => (ps, true),
                        Arg::Ptr(p) if p.rank != l.rank => {
                            return Err(RuntimeError::Plan(format!(
                                "{at}: a kernel of rank {} reads rank {}'s memory through a \
                                 single pointer; only pointer arrays can be exchanged",
                                l.rank, p.rank
                            )));
                        }
                        _ => continue,
                    };
                    for (k, p) in ps.iter().enumerate() {
                        let size = buffer_size(plan, p.buffer);
                        let bytes = hi.saturating_sub(lo) * size;
                        if p.rank == l.rank || bytes == 0 {
                            continue;
                        }
                        if l.rank == me {
                            // 16-byte aligned, so vector loads stay possible.
                            let off = used.next_multiple_of(16);
                            used = off + bytes;
                            staged.insert((a, k), off);
                            let m = Move {
                                peer: p.rank,
                                place: Place::Staging(off),
                                bytes,
                            };
                            if write { &mut post_s } else { &mut pre_r }.push(m);
                        } else if p.rank == me {
                            let m = Move {
                                peer: l.rank,
                                place: Place::Own(p.buffer, (p.offset + lo) * size),
                                bytes,
                            };
                            if write { &mut post_r } else { &mut pre_s }.push(m);
                        }
                    }
                }
                if l.rank == me {
                    mine.push(Action::Launch {
                        launch: l,
                        lo,
                        hi,
                        staged,
                    });
                }
            }
            staging = staging.max(used);
            if !pre_s.is_empty() || !pre_r.is_empty() {
                out.push(Action::Exchange {
                    sends: pre_s,
                    recvs: pre_r,
                    at: at.to_string(),
                });
            }
            out.extend(mine);
            if !post_s.is_empty() || !post_r.is_empty() {
                out.push(Action::Exchange {
                    sends: post_s,
                    recvs: post_r,
                    at: at.to_string(),
                });
            }
        }
        Ok(())
    };
    for (step, gs) in plan.steps().iter().zip(&program.steps) {
        let at = plan.describe(step);
        match gs {
            GpuStep::Uniform(vs) => out.push(Action::Uniform(vs.clone())),
            GpuStep::Launch(ls) => {
                let items = ls.iter().map(|l| (l.clone(), l.lo, l.hi)).collect();
                phase(&mut out, items, &at)?;
            }
            GpuStep::MatMul(ms) => {
                out.push(Action::WaitKernels);
                for m in ms.iter().filter(|m| m.rank == me) {
                    out.push(Action::Gemm(m.clone(), 0..m.m));
                }
                out.push(Action::BlockDone);
            }
            GpuStep::Overlap {
                matmuls,
                blocks,
                fused,
                rows,
            } => {
                out.push(Action::WaitKernels);
                for c in 0..*blocks {
                    let (r, positions) = overlap_block(matmuls, *blocks, fused, rows, c);
                    for m in matmuls.iter().filter(|m| m.rank == me) {
                        let per = m.rows_per_block;
                        out.push(Action::Gemm(m.clone(), r.start * per..r.end * per));
                    }
                    out.push(Action::BlockDone);
                    let items = fused
                        .iter()
                        .zip(positions)
                        .filter(|(_, (lo, hi))| hi > lo)
                        .map(|(l, (lo, hi))| (l.clone(), lo, hi))
                        .collect();
                    phase(&mut out, items, &at)?;
                }
            }
        }
    }
    Ok((out, staging))
}

/// Rank `rank` of a plan bound to inputs on its own device.
pub struct RankJob<D: Device> {
    plan: Plan,
    program: CudaProgram,
    rank: usize,
    buffers: HashMap<BufferRef, D::Buffer>,
    staging: D::Buffer,
    scratch: D::Buffer,
    scalars: HashMap<ValueId, f64>,
    uniform: HashMap<ValueId, f64>,
    actions: Vec<Action>,
    grid: Option<u32>,
    arrays: PointerArrays<D::Buffer>,
}

impl<D: Device> RankJob<D> {
    /// Binds rank `rank`'s part of `bindings` (every rank passes the same, whole
    /// bindings; all of them are checked, as the interpreter does) and allocates its
    /// buffers on `device`. `grid` caps the blocks per launch (`None`: as many as the
    /// work wants).
    pub fn new(
        device: &D,
        plan: &Plan,
        program: CudaProgram,
        bindings: &Bindings,
        rank: usize,
        grid: Option<u32>,
    ) -> Result<RankJob<D>, RuntimeError> {
        if rank >= plan.ranks() {
            return Err(RuntimeError::Plan(format!(
                "rank {rank} does not exist: the plan is for {} ranks",
                plan.ranks()
            )));
        }
        let p = plan.program();
        let bound = plan.bind(bindings)?;
        let (actions, staging) = actions(plan, &program, rank)?;
        let mut buffers = HashMap::new();
        for (&id, per_rank) in &bound.tensors {
            if let Some(d) = &per_rank[rank] {
                buffers.insert(BufferRef::Input(id), device.upload(p.node(id).ty.dtype, d)?);
            }
        }
        for (s, slot) in plan.slots().iter().enumerate() {
            buffers.insert(
                BufferRef::Slot(s),
                device.zeros(slot.dtype, slot.elements[rank])?,
            );
        }
        let scratch = device.zeros(DType::F64, program.scratch)?;
        Ok(RankJob {
            plan: plan.clone(),
            program,
            rank,
            buffers,
            staging: device.zeros(DType::I64, staging.div_ceil(8))?,
            scratch,
            scalars: bound.scalars,
            uniform: HashMap::new(),
            actions,
            grid,
            arrays: PointerArrays::new(),
        })
    }

    /// This job's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The generated program (every rank's launches; this rank runs its own).
    pub fn program(&self) -> &CudaProgram {
        &self.program
    }

    fn own(&self, device: &D, b: BufferRef, byte_offset: usize) -> Result<u64, RuntimeError> {
        let buf = self.buffers.get(&b).ok_or_else(|| {
            RuntimeError::Plan(format!(
                "rank {} has no buffer {b:?} (a value outside its group)",
                self.rank
            ))
        })?;
        Ok(device.address(buf) + byte_offset as u64)
    }

    fn place(&self, device: &D, p: Place) -> Result<u64, RuntimeError> {
        match p {
            Place::Own(b, off) => self.own(device, b, off),
            Place::Staging(off) => Ok(device.address(&self.staging) + off as u64),
        }
    }

    fn transfers(&self, device: &D, ms: &[Move]) -> Result<Vec<Transfer>, RuntimeError> {
        ms.iter()
            .map(|m| {
                Ok(Transfer {
                    peer: m.peer,
                    address: self.place(device, m.place)?,
                    bytes: m.bytes,
                })
            })
            .collect()
    }

    /// Runs this rank's part of every step once; every rank of the job must run too.
    pub fn run<T: Transport<D> + ?Sized>(
        &mut self,
        device: &D,
        transport: &T,
    ) -> Result<(), RuntimeError> {
        self.uniform.clear();
        for i in 0..self.actions.len() {
            match &self.actions[i] {
                Action::Uniform(vs) => {
                    let vs = vs.clone();
                    crate::cpu::exec::uniform_values(
                        self.plan.program(),
                        &vs,
                        &self.scalars,
                        &mut self.uniform,
                    );
                }
                Action::Exchange { sends, recvs, at } => {
                    let (s, r) = (
                        self.transfers(device, sends)?,
                        self.transfers(device, recvs)?,
                    );
                    transport.exchange(device, &s, &r, at)?;
                }
                Action::Launch {
                    launch,
                    lo,
                    hi,
                    staged,
                } => {
                    let staging = device.address(&self.staging);
                    launch_kernel(
                        device,
                        &self.plan,
                        launch,
                        (*lo, *hi),
                        self.grid,
                        &self.uniform,
                        device.address(&self.scratch),
                        &self.arrays,
                        &mut |a, k, p: &PtrArg| match staged.get(&(a, k)) {
                            // Pointer `k` indexed by positions lo..hi: element `lo`
                            // is the staged region's first (the address below it is
                            // never dereferenced).
                            Some(&off) => Ok((staging + off as u64)
                                .wrapping_sub((*lo * buffer_size(&self.plan, p.buffer)) as u64)),
                            None => {
                                let size = buffer_size(&self.plan, p.buffer);
                                self.own(device, p.buffer, p.offset * size)
                            }
                        },
                    )?;
                }
                Action::WaitKernels => device.wait_kernels()?,
                Action::Gemm(m, rows) => {
                    let size = m.dtype.size_bytes();
                    let (a, b, o) = (
                        self.own(device, m.a.buffer, m.a.offset * size)?,
                        self.own(device, m.b.buffer, m.b.offset * size)?,
                        self.own(device, m.out.buffer, m.out.offset * size)?,
                    );
                    device.gemm(m, a, b, o, rows.clone())?;
                }
                Action::BlockDone => {
                    device.block_done()?;
                    device.wait_block()?;
                }
            }
        }
        device.synchronize()
    }

    /// This rank's data of `v` after the last run, as f64 (`None` where the rank does
    /// not hold it).
    pub fn values(&self, device: &D, v: ValueId) -> Result<Option<Vec<f64>>, RuntimeError> {
        read_value(device, &self.plan, v, self.rank, &self.uniform, &|b| {
            self.buffers.get(&b)
        })
    }

    /// This rank's data of tensor input `name` after the last run (updates included).
    pub fn input_values(&self, device: &D, name: &str) -> Result<Vec<f64>, RuntimeError> {
        let id = self.plan.tensor_input(name)?;
        let b = self.buffers.get(&BufferRef::Input(id)).ok_or_else(|| {
            RuntimeError::Read(format!("rank {} does not hold `{name}`", self.rank))
        })?;
        let (dtype, n) = buffer_extent(&self.plan, BufferRef::Input(id), self.rank);
        device.download(b, dtype, n)
    }

    /// [`RankJob::values`] as `T` (`None` where the rank does not hold `v` or it is not
    /// kept).
    pub fn local<T: Element>(&self, device: &D, v: ValueId) -> Option<Vec<T>> {
        let data = self.values(device, v).ok()??;
        Some(data.into_iter().map(T::from_f64).collect())
    }

    /// [`RankJob::input_values`] as `T`.
    pub fn final_input_local<T: Element>(
        &self,
        device: &D,
        name: &str,
    ) -> Result<Vec<T>, RuntimeError> {
        Ok(self
            .input_values(device, name)?
            .into_iter()
            .map(T::from_f64)
            .collect())
    }
}

fn buffer_size(plan: &Plan, b: BufferRef) -> usize {
    buffer_dtype(plan, b).size_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use coconet_core::*;

    fn all_reduce_plan(n: usize) -> Plan {
        let mut b = ProgramBuilder::new("sum");
        let x = b
            .tensor_input(
                "x",
                DType::F32,
                Layout::Local,
                Shape::new(vec![Dim::sym("N")]),
                0,
            )
            .unwrap();
        b.all_reduce(ReduceOp::Sum, x).unwrap();
        let p = b.finish();
        let dims = Bindings::new().dim("N", n);
        Plan::lower(&Schedule::new(&p), 2, dims.dims()).unwrap()
    }

    fn summary(ms: &[Move]) -> Vec<(usize, usize)> {
        ms.iter().map(|m| (m.peer, m.bytes)).collect()
    }

    #[test]
    fn an_all_reduce_exchanges_sources_before_and_results_after_the_kernel() {
        let plan = all_reduce_plan(10);
        let program = CudaProgram::generate(&plan).unwrap();
        for me in 0..2 {
            let (acts, staging) = actions(&plan, &program, me).unwrap();
            let kinds: Vec<&str> = acts
                .iter()
                .map(|a| match a {
                    Action::Exchange { .. } => "exchange",
                    Action::Launch { .. } => "launch",
                    _ => "other",
                })
                .collect();
            assert_eq!(kinds, ["exchange", "launch", "exchange"], "rank {me}");
            let (
                Action::Exchange { sends, recvs, .. },
                Action::Exchange {
                    sends: s2,
                    recvs: r2,
                    ..
                },
            ) = (&acts[0], &acts[2])
            else {
                unreachable!()
            };
            // Five f32 per chunk: my peer's chunk of x goes to it, its copy of my
            // chunk comes to me; afterwards my result goes out, its result comes in.
            assert_eq!(summary(sends), [(1 - me, 20)]);
            assert_eq!(summary(recvs), [(1 - me, 20)]);
            assert_eq!(summary(s2), [(1 - me, 20)]);
            assert_eq!(summary(r2), [(1 - me, 20)]);
            // Staged: the peer's source chunk and, 16-byte aligned, the result for it.
            assert_eq!(staging, 32 + 20);
        }
    }

    fn collect(rank: usize, reads: Vec<PtrArg>, writes: Vec<PtrArg>) -> (Launch, usize, usize) {
        let l = Launch {
            rank,
            kernel: 0,
            lo: 0,
            hi: 4,
            mode: super::super::codegen::Mode::Elements,
            args: vec![Arg::Range, Arg::Reads(reads), Arg::Writes(writes)],
        };
        (l, 0, 4)
    }

    fn at(rank: usize, slot: usize, offset: usize) -> PtrArg {
        PtrArg {
            rank,
            buffer: BufferRef::Slot(slot),
            offset,
        }
    }

    #[test]
    fn a_launch_reading_what_the_phase_wrote_starts_a_new_phase() {
        // Rank 0 writes rank 1's slot 1 [0, 4); rank 1 then reads it: two phases.
        let w = collect(0, vec![at(0, 0, 0)], vec![at(1, 1, 0)]);
        let r = collect(1, vec![at(1, 1, 0)], vec![at(1, 2, 0)]);
        assert_eq!(phases(vec![w.clone(), r]).len(), 2);
        // Reading elements [4, 8) of it does not conflict.
        let r = collect(1, vec![at(1, 1, 4)], vec![at(1, 2, 0)]);
        assert_eq!(phases(vec![w.clone(), r]).len(), 1);
        // Overwriting what it wrote does.
        let w2 = collect(1, vec![at(1, 0, 0)], vec![at(1, 1, 2)]);
        assert_eq!(phases(vec![w.clone(), w2]).len(), 2);
        // Overwriting what an earlier launch only read does not: reads come first.
        let w3 = collect(1, vec![at(1, 3, 0)], vec![at(0, 0, 0)]);
        assert_eq!(phases(vec![w, w3]).len(), 1);
    }
}
