//! One rank per process: a plan bound to this process's rank, run with its peers over
//! a [`Transport`] — Open MPI (feature `mpi`, under `mpirun`) or [`Tcp`] connections
//! (under `coconet-launch`, torchrun, or any launcher that sets the rendezvous
//! variables). Kernels, matmuls and the order of every reduction are those of rank
//! threads, so results are bitwise equal to the [`cpu::Job`](crate::Job)'s and the
//! reference interpreter's; only the data movement differs. Where every process is on
//! one machine and the transport can map memory between them (an MPI-3 window, POSIX
//! shared memory over TCP), the job's buffers live in that memory ([`shared`]) and
//! steps run with the rank threads'
//! collectives, reading and writing the peers' buffers; otherwise every byte moves in
//! the transport's messages ([`exchange`]).

mod exchange;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;
mod plain;
#[cfg(target_os = "linux")]
mod posix_shm;
mod relay;
mod shared;
mod tcp;
mod threads;
pub(crate) mod transport;

pub use tcp::{DataPath, TCP_ROUND_CHUNKS, Tcp};
pub use threads::Threads;
pub use transport::ROUND_CHUNKS;
pub use transport::Transport;

use crate::exec::{Ctx, RankRaw, SharedMemory, run_rank};
use crate::inputs::{Inputs, allocated, lend};
use crate::sync::World;
use crate::values::value_on;
use coconet_core::{Bindings, Element, ValueId};
use coconet_plan::JobData;
use coconet_plan::RuntimeError;
use coconet_plan::agreement;
use coconet_plan::host::memory::Buffer;
use coconet_plan::plan::Plan;
use exchange::Processes;
use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::time::{Duration, Instant};
use transport::link::Link;

/// The step labels of the agreement checks (see [`ProcessJob::new`], [`ProcessJob::run`]).
const AGREE_BINDINGS: &str = "the check that the processes' bindings agree";
const AGREE_SCALARS: &str = "the check that the processes' scalars agree";
/// The step label of [`ProcessJob::all_gather`].
const GATHER_VALUES: &str = "an all-gather of values between runs";

/// A plan bound to this process's rank of a multi-process job: prepared once, run every
/// iteration (the training-loop API of [`cpu::Job`](crate::Job), for this rank).
pub struct ProcessJob<L: Transport = Tcp> {
    plan: Plan,
    link: L,
    /// Kernel chunks per pipelined round of a fused all-reduce.
    round_chunks: usize,
    /// Elements per kernel chunk.
    chunk: usize,
    /// The fused all-reduces' buffers, kept between runs.
    scratch: exchange::Scratch,
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
    fault: Option<crate::options::Fault>,
    /// The memory shared with the other processes that holds every buffer of the job,
    /// where the processes share memory: steps then run as on rank threads. Dropped
    /// last (the buffers live in it).
    shared: Option<Box<dyn transport::link::Shared>>,
}

/// A failed job whose memory its processes must release together (an MPI window) waits
/// first, twice the deadline at most, until every process is releasing it: a peer stuck
/// for good would otherwise hold this process in the collective release forever; then
/// the job is abandoned (MPI aborts it, naming the peer). A job that did not fail
/// releases as usual (collectively, over MPI: see [`ProcessJob::shares_memory`]).
impl<L: Transport> Drop for ProcessJob<L> {
    fn drop(&mut self) {
        let Some(shared) = &self.shared else { return };
        if !shared.released_together() || self.world.failure().is_none() {
            return;
        }
        let most = self.world.timeout().saturating_mul(2);
        let staying = self.world.depart(self.rank, most);
        if let Some(&r) = staying.first() {
            let rank = self.rank;
            let waited = most.as_secs_f64();
            shared.abandon(&format!(
                "rank {rank} gave up waiting {waited:.1} s for rank {r} to release the job's \
                 shared memory after a failed run"
            ));
        }
    }
}

impl<L: Transport> ProcessJob<L> {
    /// Binds this process's rank: `bindings` needs this rank's data only (Local and
    /// Sliced inputs as [`Binding::this_rank`](coconet_core::Binding::this_rank), or as
    /// every rank's data of which only this rank's is kept; Replicated inputs whole), so
    /// memory per process is O(N), not O(P·N). Every process calls it: the processes
    /// then check that they agree (program, dims, dtypes, scalars, Replicated inputs)
    /// and all fail, naming the first rank that differs from rank 0, if they do not.
    pub fn new(plan: &Plan, bindings: &Bindings, link: L) -> Result<ProcessJob<L>, RuntimeError> {
        if link.size() != plan.ranks() {
            return Err(RuntimeError::Plan(format!(
                "the plan is for {} ranks but the job has {} processes",
                plan.ranks(),
                link.size()
            )));
        }
        let rank = link.rank();
        // A process whose bindings are bad still takes part in the agreement check, so
        // that its peers fail with it instead of waiting for it in the first run.
        let prepared = Self::allocate(plan, bindings, rank);
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
                agreement::fingerprint(plan, rank, &replicated, &inputs.scalars)
            }
            Err(_) => agreement::failed_to_bind(),
        };
        let labels: Vec<String> = plan.steps().iter().map(|s| plan.describe(s)).collect();
        link.known(&labels);
        link.known(
            &[
                AGREE_BINDINGS,
                AGREE_SCALARS,
                GATHER_VALUES,
                tcp::END_OF_RUN,
            ]
            .map(String::from),
        );
        link.enter(AGREE_BINDINGS);
        let agreement = transport::agree(&link, &mine);
        let (mut inputs, mut slots) = prepared?;
        agreement?;
        // SAFETY: the job keeps its buffers (never replacing one) until it drops, and
        // drops its window after them.
        let placed =
            unsafe { shared::place(&link, plan, &mut inputs, &mut slots, link.timeout())? };
        let (mem, world, shared) = match placed {
            Some(placed) => (placed.mem, placed.world, Some(placed.memory)),
            None => {
                let mut mem = vec![RankRaw::default(); plan.ranks()];
                mem[rank] = RankRaw {
                    inputs: inputs.buffers[rank]
                        .iter_mut()
                        // SAFETY: as in `cpu::Job`: the job owns these buffers and drops
                        // the registry with them.
                        .map(|(&k, b)| (k, unsafe { b.raw() }))
                        .collect(),
                    slots: slots.iter_mut().map(|b| unsafe { b.raw() }).collect(),
                };
                (mem, World::new(1, 0, Duration::from_secs(1)), None)
            }
        };
        let round_chunks = link.round_chunks();
        Ok(ProcessJob {
            labels,
            plan: plan.clone(),
            link,
            round_chunks,
            chunk: crate::kernel::CHUNK,
            scratch: exchange::Scratch::default(),
            rank,
            inputs,
            slots,
            mem,
            world,
            epoch: 0,
            failed: None,
            fault: None,
            shared,
        })
    }

    /// This rank's inputs and runtime buffers.
    fn allocate(
        plan: &Plan,
        bindings: &Bindings,
        rank: usize,
    ) -> Result<(Inputs, Vec<Buffer>), RuntimeError> {
        let inputs = Inputs::allocate(plan, plan.bind_rank(bindings, rank)?)?;
        let mut slots = Vec::with_capacity(plan.slots().len());
        for (i, s) in plan.slots().iter().enumerate() {
            let what = || format!("runtime buffer {i} ({}) on rank {rank}", plan.slot_users(i));
            let n = s.elements[rank];
            slots.push(allocated(Buffer::try_zeros(s.dtype, n), what, n, s.dtype)?);
        }
        Ok((inputs, slots))
    }

    /// Sets the kernel chunks per pipelined round of fused all-reduces (at least 1;
    /// default [`ROUND_CHUNKS`] over MPI, [`TCP_ROUND_CHUNKS`]
    /// over TCP). Results do not depend on it; every process of the job
    /// must set the same value.
    pub fn set_round_chunks(&mut self, chunks: usize) {
        self.round_chunks = chunks.max(1);
    }

    /// Sets the elements per kernel chunk (at least 1; default
    /// [`CHUNK`](crate::CHUNK); see [`RunOptions::chunk`](crate::RunOptions::chunk)).
    /// Results do not depend on it.
    pub fn set_chunk(&mut self, elements: usize) {
        self.chunk = elements.max(1);
    }

    /// The kernel chunks per pipelined round of fused all-reduces now set.
    pub fn round_chunks(&self) -> usize {
        self.round_chunks
    }

    /// The elements per kernel chunk now set.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The scalars set for the next run.
    #[doc(hidden)] // for the autotuner
    pub fn scalar_values(&self) -> &HashMap<ValueId, f64> {
        &self.inputs.scalars
    }

    /// The connection to the job's other processes (for the tuner's exchanges).
    #[doc(hidden)] // for the autotuner
    pub fn link(&self) -> &L {
        &self.link
    }

    /// A copy of this rank's buffers of the inputs the program updates, to put back with
    /// [`ProcessJob::restore`] (the tuner runs a step many times and must leave the
    /// user's state as it was).
    #[doc(hidden)] // for the autotuner
    pub fn save_updated(&mut self) -> Result<Vec<(ValueId, Buffer)>, RuntimeError> {
        self.usable()?;
        let targets: Vec<ValueId> = self.plan.program().updates().map(|(t, _)| t).collect();
        let mut saved = Vec::new();
        for t in targets {
            let Some(buffer) = self.inputs.buffers[self.rank].get_mut(&t) else {
                continue;
            };
            let what = || {
                format!(
                    "a copy of `{}` on rank {} (the tuner's saved state)",
                    self.plan.program().label(t),
                    self.rank
                )
            };
            let (dtype, len) = (buffer.dtype, buffer.len);
            let mut copy = allocated(Buffer::try_zeros(dtype, len), what, len, dtype)?;
            buffer.copy_all_to(&mut copy);
            saved.push((t, copy));
        }
        Ok(saved)
    }

    /// Frees the fused collectives' buffers kept between runs (the next run makes its
    /// own): after tuning, those of knobs the job no longer runs.
    #[doc(hidden)] // for the autotuner
    pub fn clear_scratch(&mut self) {
        self.scratch = exchange::Scratch::default();
    }

    /// Puts back buffers saved by [`ProcessJob::save_updated`].
    #[doc(hidden)] // for the autotuner
    pub fn restore(&mut self, saved: &mut [(ValueId, Buffer)]) {
        for (t, copy) in saved {
            if let Some(buffer) = self.inputs.buffers[self.rank].get_mut(t) {
                copy.copy_all_to(buffer);
            }
        }
    }

    /// How long a collective waits for the other processes (default 60 s): past it, a
    /// TCP run fails on every process naming the ranks that never arrived; an MPI job is
    /// aborted with the rank and the step (MPI cannot cancel a collective in flight).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.link.set_timeout(timeout);
        self.world.set_timeout(timeout);
    }

    /// Whether the job's buffers are in memory shared by its processes (every process
    /// on one machine; see [`DataPath::SharedMemory`] and `Mpi::without_shared_memory`):
    /// its steps then read and write the peers' buffers
    /// directly, as rank threads do, instead of sending messages (rounds of
    /// [`ProcessJob::set_round_chunks`] then do not apply). Every process must drop
    /// such a job, as it made it: freeing an MPI window is collective. After a failed
    /// run a process waits at most twice the deadline for its peers to drop it too, then
    /// aborts the MPI job naming the one that never came (a peer hung for good would
    /// otherwise hold it forever).
    pub fn shares_memory(&self) -> bool {
        self.shared.is_some()
    }

    /// Makes this rank fail on purpose in the next runs (to test failure handling: a
    /// panic aborts an MPI job with the rank and the message, and fails every process
    /// of a TCP job).
    pub fn inject_fault(&mut self, fault: Option<crate::options::Fault>) {
        self.fault = fault;
    }

    /// Every process's `values`, in rank order (each process may pass a different
    /// number): a small collective between runs, for what a training loop logs — a loss
    /// averaged over ranks, added in rank order so every process gets the same bits.
    /// Every process of the job must call it at the same point.
    pub fn all_gather(&mut self, values: &[f64]) -> Result<Vec<Vec<f64>>, RuntimeError> {
        self.usable()?;
        self.link.enter(GATHER_VALUES);
        transport::all_gather_f64(&self.link, values)
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
    /// check that they run with the same scalars (one small all-gather; over shared
    /// memory a digest compared in the window): a step counter or learning rate set
    /// differently on one process is an error naming it. Over [`Tcp`](super::Tcp) under
    /// `coconet-launch --heartbeat-timeout`, a run that stays stuck past the limit stops
    /// this rank's heartbeat (see [`Tcp::start_heartbeat`](super::Tcp::start_heartbeat)).
    pub fn run(&mut self) -> Result<(), RuntimeError> {
        self.usable()?;
        self.link.alive();
        let result = self.run_steps();
        if let Err(e) = &result {
            self.link.report(e);
        }
        self.link.idle();
        result
    }

    /// [`ProcessJob::run`] between the transport's `alive` and `idle`.
    fn run_steps(&mut self) -> Result<(), RuntimeError> {
        let scalars = agreement::scalar_fingerprint(&self.plan, &self.inputs.scalars);
        let messages = Processes {
            link: &self.link,
            round_chunks: self.round_chunks,
            scratch: &self.scratch,
        };
        let comm: &dyn crate::exec::Comm = match self.shared {
            Some(_) => &SharedMemory,
            None => &messages,
        };
        const AGREE: &str = "the check that the processes' scalars agree";
        self.link.enter(AGREE);
        // Over shared memory, one digest compared in the window (no message); only a
        // difference goes through the transport, to name what differs.
        let agreed = match self
            .world
            .agree(self.rank, agreement::digest(&scalars), AGREE)
        {
            Ok(Some(true)) => Ok(()),
            Ok(Some(false) | None) => transport::agree(&self.link, &scalars),
            Err(e) => Err(e),
        };
        let result = agreed.and_then(|()| {
            self.epoch += 1;
            let mut ctx = Ctx {
                plan: &self.plan,
                comm,
                rank: self.rank,
                world: &self.world,
                mem: &self.mem,
                scalars: &self.inputs.scalars,
                uniform: HashMap::new(),
                epoch: self.epoch,
                overlaps: 0,
                epoch_stamp: 0,
                chunk: self.chunk,
            };
            let fault = self.fault;
            let step = std::panic::AssertUnwindSafe(|| {
                run_rank(&mut ctx, &self.labels, Instant::now(), false, fault)
            });
            // Over shared memory the peers wait in the window, not in the transport:
            // they learn of this rank's failure from the world's mark.
            let shared = self.shared.is_some();
            let steps = match std::panic::catch_unwind(step) {
                Ok(Ok(done)) => done.steps,
                Ok(Err(e)) => {
                    if shared {
                        self.world.fail(self.rank, e.to_string());
                    }
                    return Err(self.link.stopped(e));
                }
                Err(panic) => {
                    let message = coconet_plan::panic_message(&*panic);
                    if shared {
                        self.world.fail(self.rank, format!("panicked: {message}"));
                    }
                    return Err(self.link.panicked(&message));
                }
            };
            if shared {
                return finished_together(&self.world, &self.plan, self.rank, steps);
            }
            all_finished(&self.link, &self.plan, steps)
        });
        if let Err(e) = &result {
            self.failed = Some(e.to_string());
        }
        result
    }

    /// Runs once with this rank's input `name` read straight from `data` (in its dtype)
    /// instead of the job's buffer — the gradient needs no copy into the job. Only inputs
    /// the program never updates can be lent. Where the job's buffers are in shared
    /// memory ([`ProcessJob::shares_memory`]) the peers read the job's buffer, so `data`
    /// is copied into it (one copy, as [`ProcessJob::input_mut`] would make).
    pub fn run_with<T: Element>(&mut self, name: &str, data: &[T]) -> Result<(), RuntimeError> {
        self.run_with_pieces(name, &[data])
    }

    /// [`ProcessJob::run_with`] from several slices read as their concatenation (a model's
    /// gradient tensors, in parameter order).
    pub fn run_with_pieces<T: Element>(
        &mut self,
        name: &str,
        pieces: &[&[T]],
    ) -> Result<(), RuntimeError> {
        self.usable()?;
        let id = self.plan.tensor_input(name)?;
        let lent = lend(&self.plan, &self.inputs, name, self.rank, pieces)?;
        if self.shared.is_some() {
            lent.raw.copy_all_to(&self.mem[self.rank].inputs[&id]);
            return self.run();
        }
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
impl<L: Transport> JobData for ProcessJob<L> {
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

/// [`all_finished`] for processes sharing memory: a rank that stopped early marks the
/// world failed (so no peer waits for it), the others meet at a last barrier, which
/// fails on every process if any failed.
fn finished_together(
    world: &World,
    plan: &Plan,
    rank: usize,
    steps: usize,
) -> Result<(), RuntimeError> {
    let total = plan.steps().len();
    if steps != total {
        let message = format!("rank {rank} stopped after {steps} of the plan's {total} steps");
        world.fail(rank, message.clone());
        return Err(RuntimeError::RankFailed { rank, message });
    }
    world.barrier(rank, tcp::END_OF_RUN)
}

/// A run succeeds only if every process finished every step: one that stopped
/// early (after the last collective it took part in) would otherwise leave the
/// others returning `Ok` with Replicated values that differ between processes.
fn all_finished(link: &dyn Link, plan: &Plan, steps: usize) -> Result<(), RuntimeError> {
    let total = plan.steps().len();
    link.enter(tcp::END_OF_RUN);
    let done = transport::all_gather_u64(link, &[steps as u64])?;
    match done.iter().position(|&d| d as usize != total) {
        None => Ok(()),
        Some(r) => Err(RuntimeError::RankFailed {
            rank: r,
            message: format!(
                "rank {r} stopped after {} of the plan's {total} steps",
                done[r]
            ),
        }),
    }
}
