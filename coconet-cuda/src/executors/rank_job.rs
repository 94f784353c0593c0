//! One rank of a job whose ranks have separate memories (a process per GPU, or a GPU per
//! thread): the rank's own buffers on its device, and a [`PeerTransport`] (NCCL, or
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
//! Which exchanges happen when, and how large phases are pipelined, is
//! [`exchange_plan`](crate::actions::exchanged)'s part; this file runs it.
//!
//! [`DeviceJob`]: crate::DeviceJob

use crate::actions::exchanged::{Pipelining, actions};
use crate::actions::mapped::mapped_actions;
use crate::actions::{Action, Move, Place, buffer_size};
use crate::codegen::{CudaProgram, PtrArg};
use crate::devices::Device;
use crate::executors::device_job::{PointerArrays, Pointers, kernel_call};
use crate::executors::launch_graph::{GraphStats, LaunchGraphs};
use crate::executors::lending::{Lending, RankBuffer, after_failure, unsegmentable};
use crate::executors::reads::{copy_checked, read_raw, read_value};
use crate::lent::{DeviceSlice, Lent};
use coconet_core::{Bindings, DType, ValueId};
use coconet_plan::RuntimeError;
use coconet_plan::plan::{BufferRef, Plan};
use std::collections::{HashMap, HashSet};

/// A transfer of one exchange: `bytes` bytes at device address `address`, to or from
/// rank `peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerTransfer {
    /// The other rank.
    pub peer: usize,
    /// Device address of the first byte.
    pub address: u64,
    /// Length in bytes.
    pub bytes: usize,
}

/// Moves bytes between ranks' device memories.
pub trait PeerTransport<D: Device> {
    /// Posts `sends` and `recvs` as one group (no deadlock whatever the order ranks post
    /// them in), on the device's transfers' stream: ordered after the kernels of the
    /// last [`Device::transfers_wait_kernels`], and before the kernels after the next
    /// [`Device::kernels_wait_transfers`]. Transfers between two ranks match in the
    /// order posted. `at` names the step, for errors.
    fn exchange(
        &self,
        device: &D,
        sends: &[PeerTransfer],
        recvs: &[PeerTransfer],
        at: &str,
    ) -> Result<(), RuntimeError>;

    /// A barrier of all `world` ranks on the kernels' stream: every rank's kernels
    /// launched before it finish before any rank's kernels launched after it start
    /// (ranks whose kernels address each other's memory). `scratch` is 8 bytes of device
    /// memory the transport may use.
    fn barrier(&self, device: &D, scratch: u64, world: usize, at: &str)
    -> Result<(), RuntimeError>;
}

/// How a rank's kernels reach its peers' memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerAccess {
    /// Through exchanges: peers' regions are staged before a launch and results sent
    /// after it, cut into chunks that overlap the kernels (NCCL between GPUs; any
    /// machines).
    Exchanged(Pipelining),
    /// Directly: peers' buffers are mapped into this rank's address space (GPUs of one
    /// machine with peer access or CUDA IPC), so kernels read and write them as with
    /// virtual ranks, and ranks meet at barriers (the backends map every peer's buffers
    /// before the first run).
    Mapped,
}

impl Default for PeerAccess {
    fn default() -> Self {
        PeerAccess::Exchanged(Pipelining::default())
    }
}

/// Rank `rank` of a plan bound to inputs on its own device.
pub struct RankJob<D: Device> {
    plan: Plan,
    rank: usize,
    buffers: HashMap<BufferRef, D::Buffer>,
    staging: D::Buffer,
    scratch: D::Buffer,
    scalars: HashMap<ValueId, f64>,
    uniform: HashMap<ValueId, f64>,
    actions: Vec<Action>,
    grid: Option<u32>,
    arrays: PointerArrays<D::Buffer>,
    /// Peers' buffers mapped into this rank's address space ([`PeerAccess::Mapped`]).
    peers: HashMap<(usize, BufferRef), u64>,
    /// Eight bytes for the transport's barriers.
    sync: D::Buffer,
    /// Whether peers address this rank's buffers directly (they mapped the job's own).
    mapped: bool,
    /// Memory lent to the runs.
    lending: Lending,
    /// Buffers lent pieces of which are gathered rather than taken in place.
    unsegmentable: HashSet<RankBuffer>,
    /// Each kernel's segmented twin.
    program_segments: Vec<Option<usize>>,
    /// Why the last run failed: the buffers may hold part of a step.
    failed: Option<String>,
    /// The runs' launches as graphs, a segment each between exchanges, barriers and
    /// matmuls (`None`: launched one by one).
    graphs: Option<LaunchGraphs<D::Graph>>,
}

impl<D: Device> RankJob<D> {
    /// Binds rank `rank`'s part of `bindings` (every rank passes the same, whole
    /// bindings; all of them are checked, as the interpreter does) and allocates its
    /// buffers on `device`. `grid` caps the blocks per launch (`None`: as many as the
    /// work wants); `access` says how kernels reach peers' memory (every rank must pass
    /// the same).
    pub fn new(
        device: &D,
        plan: &Plan,
        program: CudaProgram,
        bindings: &Bindings,
        rank: usize,
        grid: Option<u32>,
        access: PeerAccess,
    ) -> Result<RankJob<D>, RuntimeError> {
        if rank >= plan.ranks() {
            return Err(RuntimeError::Plan(format!(
                "rank {rank} does not exist: the plan is for {} ranks",
                plan.ranks()
            )));
        }
        // This rank's data only: a process binds its own gradient, not every rank's.
        let bound = plan.bind_rank(bindings, rank)?;
        let (actions, staging) = match access {
            PeerAccess::Exchanged(pipelining) => actions(plan, &program, Some(rank), pipelining)?,
            PeerAccess::Mapped => {
                // Debug builds (the tests) replay every rank's actions together.
                #[cfg(debug_assertions)]
                if rank == 0 {
                    let lists: Vec<Vec<Action>> = (0..plan.ranks())
                        .map(|r| mapped_actions(plan, &program, r))
                        .collect::<Result<_, _>>()?;
                    crate::actions::stream_check::check_mapped(plan, &lists).map_err(|e| {
                        RuntimeError::Plan(format!("internal error, please report it: {e}"))
                    })?;
                }
                (mapped_actions(plan, &program, rank)?, 0)
            }
        };
        let unsegmentable = unsegmentable(&actions, &program, Some(rank));
        let program_segments = program.kernels.iter().map(|k| k.segments).collect();
        let mut buffers = HashMap::new();
        for (&id, per_rank) in &bound.tensors {
            if let Some(d) = &per_rank[rank] {
                buffers.insert(BufferRef::Input(id), device.upload(d)?);
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
            rank,
            buffers,
            staging: device.zeros(DType::I64, staging.div_ceil(8))?,
            scratch,
            scalars: bound.scalars,
            uniform: HashMap::new(),
            actions,
            grid,
            arrays: PointerArrays::new(),
            peers: HashMap::new(),
            sync: device.zeros(DType::I64, 1)?,
            mapped: access == PeerAccess::Mapped,
            lending: Lending::default(),
            unsegmentable,
            program_segments,
            failed: None,
            graphs: None,
        })
    }

    /// Makes later runs queue this rank's launches as graphs (`on`: one for each run of
    /// launches between exchanges, barriers and matmuls), or one by one.
    pub fn use_graph(&mut self, on: bool) {
        LaunchGraphs::switch(&mut self.graphs, on)
    }

    /// What the runs' graphs have cost so far (`None` without graphs).
    pub fn graph_stats(&self) -> Option<GraphStats> {
        self.graphs.as_ref().map(LaunchGraphs::stats)
    }

    /// This rank's buffers, for peers to map ([`PeerAccess::Mapped`]).
    pub fn own_buffers(&self) -> impl Iterator<Item = (BufferRef, &D::Buffer)> {
        self.buffers.iter().map(|(&b, buf)| (b, buf))
    }

    /// Records where rank `rank`'s buffer `buffer` is mapped in this rank's address space.
    pub fn map_peer(&mut self, rank: usize, buffer: BufferRef, address: u64) {
        self.peers.insert((rank, buffer), address);
    }

    /// This job's rank.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The address of this rank's buffer `b` at `byte_offset`: the caller's memory where
    /// it is lent in place for the run, else the job's own.
    fn own(&self, device: &D, b: BufferRef, byte_offset: usize) -> Result<u64, RuntimeError> {
        if let Some(at) = self.lending.address((self.rank, b)) {
            return Ok(at + byte_offset as u64);
        }
        self.owned(device, b, byte_offset)
    }

    /// The address of the job's own buffer `b` at `byte_offset`.
    fn owned(&self, device: &D, b: BufferRef, byte_offset: usize) -> Result<u64, RuntimeError> {
        let buf = self.buffers.get(&b).ok_or_else(|| {
            RuntimeError::Plan(format!(
                "rank {} has no buffer {b:?} (a value outside its group)",
                self.rank
            ))
        })?;
        Ok(device.address(buf) + byte_offset as u64)
    }

    fn peer(&self, rank: usize, b: BufferRef, byte_offset: usize) -> Result<u64, RuntimeError> {
        let base = self.peers.get(&(rank, b)).ok_or_else(|| {
            RuntimeError::Plan(format!(
                "rank {}'s kernel reads rank {rank}'s buffer {b:?}, which is not mapped \
                 (map every peer's buffers with `RankJob::map_peer` first)",
                self.rank
            ))
        })?;
        Ok(base + byte_offset as u64)
    }

    fn place(&self, device: &D, p: Place) -> Result<u64, RuntimeError> {
        match p {
            Place::Own(b, off) => self.own(device, b, off),
            Place::Staging(off) => Ok(device.address(&self.staging) + off as u64),
        }
    }

    fn transfers(&self, device: &D, ms: &[Move]) -> Result<Vec<PeerTransfer>, RuntimeError> {
        ms.iter()
            .map(|m| {
                Ok(PeerTransfer {
                    peer: m.peer,
                    address: self.place(device, m.place)?,
                    bytes: m.bytes,
                })
            })
            .collect()
    }

    /// Waits on the host for a run's `event`; a fault it reports leaves the job failed.
    pub fn wait(&mut self, device: &D, event: &D::Event) -> Result<(), RuntimeError> {
        device
            .wait_host(event)
            .inspect_err(|e| self.failed = Some(e.to_string()))
    }

    /// Queues this rank's part of every step once, with the entries of `lent` for this
    /// rank standing for its buffers (gathered into them where peers map the job's own
    /// buffers), after `after` and the lent slices' streams; returns the event the run's
    /// work ends at. Every rank of the job must run too.
    pub fn run_lent<T: PeerTransport<D> + ?Sized>(
        &mut self,
        device: &D,
        transport: &T,
        lent: &Lent<'_>,
        after: Option<&D::Event>,
    ) -> Result<D::Event, RuntimeError> {
        if let Some(e) = &self.failed {
            return Err(after_failure(e));
        }
        let (me, buffers) = (self.rank, &self.buffers);
        self.lending.begin(
            device,
            &self.plan,
            lent,
            &|r| r == me,
            &|(r, b)| r == me && buffers.contains_key(&b),
            !self.mapped,
            &self.unsegmentable,
        )?;
        let queued = self.queue_lent(device, transport, lent, after);
        self.lending.finish(device, lent, queued, &mut self.failed)
    }

    /// Orders the run after `after` and the lenders, gathers pieces in, queues the
    /// steps, scatters updated pieces out.
    fn queue_lent<T: PeerTransport<D> + ?Sized>(
        &mut self,
        device: &D,
        transport: &T,
        lent: &Lent<'_>,
        after: Option<&D::Event>,
    ) -> Result<(), RuntimeError> {
        Lending::order(device, lent, after)?;
        let own = |(_, b)| self.owned(device, b, 0);
        self.lending.gather(device, &own)?;
        self.enqueue(device, transport)?;
        let own = |(_, b)| self.owned(device, b, 0);
        self.lending.scatter(device, &own)
    }

    /// Queues this rank's part of every step once.
    fn enqueue<T: PeerTransport<D> + ?Sized>(
        &mut self,
        device: &D,
        transport: &T,
    ) -> Result<(), RuntimeError> {
        self.uniform.clear();
        if let Some(graphs) = &mut self.graphs {
            graphs.begin();
        }
        for i in 0..self.actions.len() {
            // With graphs, the launches since the last other work go first, as one.
            let launch = matches!(self.actions[i], Action::Launch { .. } | Action::Uniform(_));
            if let (false, Some(graphs)) = (launch, &mut self.graphs) {
                graphs.cut(device)?;
            }
            match &self.actions[i] {
                Action::Uniform(vs) => {
                    let vs = vs.clone();
                    coconet_plan::plan::uniform_values(
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
                    let call = kernel_call(
                        device,
                        &self.plan,
                        i,
                        launch,
                        (*lo, *hi),
                        self.grid,
                        &self.uniform,
                        device.address(&self.scratch),
                        &self.arrays,
                        Pointers {
                            twin: self.program_segments[launch.kernel],
                            pieces: &|p: &PtrArg| {
                                if p.rank == self.rank {
                                    self.lending.pieces((p.rank, p.buffer))
                                } else {
                                    None
                                }
                            },
                            ptr: &mut |a, k, p: &PtrArg| match staged.get(&(a, k)) {
                                // Pointer `k` indexed by positions lo..hi: element `lo`
                                // is the staged region's first (the address below it is
                                // never dereferenced).
                                Some(&off) => Ok((staging + off as u64).wrapping_sub(
                                    (*lo * buffer_size(&self.plan, p.buffer)) as u64,
                                )),
                                None => {
                                    let size = buffer_size(&self.plan, p.buffer);
                                    if p.rank == self.rank {
                                        self.own(device, p.buffer, p.offset * size)
                                    } else {
                                        self.peer(p.rank, p.buffer, p.offset * size)
                                    }
                                }
                            },
                        },
                    )?;
                    if let Some(call) = call {
                        match &mut self.graphs {
                            Some(graphs) => graphs.push(call),
                            None => device.launch(&call)?,
                        }
                    }
                }
                Action::Barrier => {
                    let world = self.plan.ranks();
                    transport.barrier(device, device.address(&self.sync), world, "a barrier")?
                }
                a @ (Action::TransfersWaitKernels
                | Action::KernelsWaitTransfers
                | Action::WaitKernels
                | Action::BlockDone) => a.order_streams(device)?,
                Action::Gemm(m, rows) => {
                    let size = m.dtype.size_bytes();
                    let (a, b, o) = (
                        self.own(device, m.a.buffer, m.a.offset * size)?,
                        self.own(device, m.b.buffer, m.b.offset * size)?,
                        self.own(device, m.out.buffer, m.out.offset * size)?,
                    );
                    device.gemm(m, a, b, o, rows.clone())?;
                }
            }
        }
        match &mut self.graphs {
            Some(graphs) => graphs.cut(device),
            None => Ok(()),
        }
    }

    /// This rank's data of `v` after the last run, as f64 (`None` where the rank does
    /// not hold it).
    pub fn values(&self, device: &D, v: ValueId) -> Result<Option<Vec<f64>>, RuntimeError> {
        self.readable(v)?;
        read_value(device, &self.plan, v, self.rank, &self.uniform, &|b| {
            self.buffers.get(&b)
        })
    }

    /// Copies this rank's data of `v` into `out` in its own dtype (`out` exactly its
    /// size: checked by the caller).
    pub fn read_bytes(&self, device: &D, v: ValueId, out: &mut [u8]) -> Result<(), RuntimeError> {
        self.readable(v)?;
        read_raw(
            device,
            &self.plan,
            v,
            self.rank,
            &self.uniform,
            out,
            &mut |b| self.owned(device, b, 0).ok(),
        )?;
        Ok(())
    }

    /// Copies this rank's data of `v` to the caller's memory `dst` (its dtype, length
    /// and memory checked by the caller), ordered with the kernels.
    pub fn copy_to(
        &self,
        device: &D,
        v: ValueId,
        dst: &DeviceSlice<'_>,
    ) -> Result<(), RuntimeError> {
        self.readable(v)?;
        copy_checked(device, &self.plan, v, self.rank, dst, &mut |b| {
            self.owned(device, b, 0).ok()
        })
    }

    /// Refuses reads after a failed run and of buffers lent in the last run.
    fn readable(&self, v: ValueId) -> Result<(), RuntimeError> {
        if let Some(e) = &self.failed {
            return Err(after_failure(e));
        }
        self.lending.check_read(&self.plan, v, self.rank)
    }

    /// Overwrites this rank's buffer of tensor input `name` with `bytes` (its dtype and
    /// size) for the next run.
    pub fn write_input(
        &mut self,
        device: &D,
        name: &str,
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        let id = self.plan.tensor_input(name)?;
        let b = self.buffers.get(&BufferRef::Input(id)).ok_or_else(|| {
            RuntimeError::Read(format!("rank {} does not hold `{name}`", self.rank))
        })?;
        crate::executors::device_job::write_checked(device, &self.plan, b, id, self.rank, bytes)?;
        self.lending.written((self.rank, BufferRef::Input(id)));
        Ok(())
    }

    /// Sets scalar input `id` for the next runs.
    pub fn set_scalar(&mut self, id: ValueId, value: f64) {
        self.scalars.insert(id, value);
    }
}
