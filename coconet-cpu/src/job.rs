//! A plan bound to buffers on P rank threads: prepared once, run every iteration.
//!
//! A training loop prepares the job once (bindings checked, buffers allocated, rank
//! threads started) and then, every iteration, writes new data into the input buffers
//! ([`Job::input_mut`], [`Job::piece_mut`], [`Job::write_input`]), sets scalars
//! ([`Job::set_scalar`]), runs, and reads results in place ([`Job::input`],
//! [`Job::piece`]): borrowed views in the tensor's own dtype, no copy and no conversion.

use super::exec::{self, Ctx, RankRaw, Span};
use super::inputs::{Inputs, allocated, lend};
use super::options::RunOptions;
use super::pool::Pool;
use super::values::value_on;
use super::{sync, trace};
use coconet_core::{Bindings, Element, InterpError, ValueId};
use coconet_plan::RuntimeError;
use coconet_plan::backend::JobData;
use coconet_plan::host::memory::Buffer;
use coconet_plan::plan::Plan;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// What one rank's part of a run returned: its trace spans, or why it failed.
type RankResult = Result<Vec<Span>, RuntimeError>;

/// A plan bound to inputs, with every rank's buffers and persistent rank threads; run it
/// any number of times (each run updates the inputs in place, like a training step).
#[derive(Debug)]
pub struct Job {
    plan: Plan,
    /// Each step's description (errors and traces name the step; made once).
    labels: Vec<String>,
    inputs: Inputs,
    slots: Vec<Vec<Buffer>>,
    /// Raw views of every rank's buffers, made once: buffers never move their memory.
    registry: Vec<RankRaw>,
    world: sync::World,
    epoch: u64,
    options: RunOptions,
    spans: Vec<Vec<Span>>,
    pool: Pool,
}

impl Job {
    /// Binds `bindings` (checked exactly as the reference interpreter checks them),
    /// allocates the buffers and starts the rank threads. Nothing runs, so a bad binding
    /// changes nothing.
    pub fn new(plan: &Plan, bindings: &Bindings, options: RunOptions) -> Result<Job, RuntimeError> {
        let mut inputs = Inputs::allocate(plan, plan.bind(bindings)?)?;
        coconet_core::probe_allocation(
            &format!("the plan's runtime buffers on {} ranks", plan.ranks()),
            plan.total_slot_bytes()?,
        )?;
        let mut slots: Vec<Vec<Buffer>> = Vec::with_capacity(plan.ranks());
        for r in 0..plan.ranks() {
            let mut mine = Vec::with_capacity(plan.slots().len());
            for (i, s) in plan.slots().iter().enumerate() {
                let what = || format!("runtime buffer {i} ({}) on rank {r}", plan.slot_users(i));
                let buffer = Buffer::try_zeros(s.dtype, s.elements[r]);
                mine.push(allocated(buffer, what, s.elements[r], s.dtype)?);
            }
            slots.push(mine);
        }
        let flags = sync::World::flags_for(plan);
        let registry = inputs
            .buffers
            .iter_mut()
            .zip(slots.iter_mut())
            .map(|(ins, sl)| RankRaw {
                // SAFETY: the job owns these buffers and drops the registry with them;
                // its rank threads are joined before a run returns, and they follow
                // the barrier discipline.
                inputs: ins
                    .iter_mut()
                    .map(|(&k, b)| (k, unsafe { b.raw() }))
                    .collect(),
                slots: sl.iter_mut().map(|b| unsafe { b.raw() }).collect(),
            })
            .collect();
        Ok(Job {
            labels: plan.steps().iter().map(|s| plan.describe(s)).collect(),
            plan: plan.clone(),
            inputs,
            slots,
            registry,
            world: sync::World::new(plan.ranks(), flags, options.timeout),
            epoch: 0,
            pool: Pool::new(plan.ranks(), options.bind_threads).map_err(RuntimeError::Plan)?,
            options,
            spans: Vec::new(),
        })
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Runs the plan once on the P rank threads.
    pub fn run(&mut self) -> Result<(), RuntimeError> {
        self.usable()?;
        self.epoch += 1;
        let start = Instant::now();
        let results: Vec<Mutex<Option<RankResult>>> =
            (0..self.plan.ranks()).map(|_| Mutex::new(None)).collect();
        let (plan, world, scalars, registry, labels) = (
            &self.plan,
            &self.world,
            &self.inputs.scalars,
            &self.registry,
            &self.labels,
        );
        let (epoch, trace, fault, chunk) = (
            self.epoch,
            self.options.trace,
            self.options.fault,
            self.options.chunk,
        );
        let task = |rank: usize| {
            let body = std::panic::AssertUnwindSafe(|| {
                let mut ctx = Ctx {
                    plan,
                    comm: &exec::SharedMemory,
                    rank,
                    world,
                    mem: registry,
                    scalars,
                    uniform: HashMap::new(),
                    epoch,
                    overlaps: 0,
                    epoch_stamp: 0,
                    chunk,
                };
                exec::run_rank(&mut ctx, labels, start, trace, fault)
            });
            let total = plan.steps().len();
            let result = match std::panic::catch_unwind(body) {
                Ok(Ok(done)) if done.steps == total => Ok(done.spans),
                Ok(Ok(done)) => {
                    // Stopped without an error: its peers must not wait for it, and the
                    // run must not look successful.
                    let message = format!(
                        "stopped after {} of {total} steps without reporting an error",
                        done.steps
                    );
                    world.fail(rank, message.clone());
                    Err(RuntimeError::RankFailed { rank, message })
                }
                Ok(Err(e)) => {
                    world.fail(rank, e.to_string());
                    Err(e)
                }
                Err(panic) => {
                    let msg = format!("panicked: {}", coconet_plan::panic_message(&*panic));
                    world.fail(rank, msg.clone());
                    Err(RuntimeError::RankFailed { rank, message: msg })
                }
            };
            *results[rank].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        };
        self.pool.run(&task);
        if let Some(e) = self.world.failure() {
            return Err(e);
        }
        let mut spans = Vec::with_capacity(results.len());
        for r in results {
            let r = r.into_inner().unwrap_or_else(|e| e.into_inner());
            spans.push(r.unwrap_or_else(|| Err(RuntimeError::Plan("rank thread lost".into())))?);
        }
        self.spans = spans;
        Ok(())
    }

    /// Runs once with input `name` read straight from the caller's slices — one per
    /// rank of the input's group, in rank order, in the input's dtype — instead of from
    /// the job's buffer: gradients computed elsewhere need no copy into the job. Only
    /// inputs the program never updates can be lent (nothing writes them during the
    /// run); the job's own buffer of `name` is untouched.
    pub fn run_with<T: Element>(
        &mut self,
        name: &str,
        per_rank: &[&[T]],
    ) -> Result<(), RuntimeError> {
        let pieces: Vec<[&[T]; 1]> = per_rank.iter().map(|d| [*d]).collect();
        self.run_lent(name, &pieces)
    }

    /// [`Job::run_with`] where each rank's data is several slices (a model's gradient
    /// tensors, in parameter order), read as their concatenation: no copy of a
    /// gradient that lives in many tensors either.
    pub fn run_with_pieces<T: Element>(
        &mut self,
        name: &str,
        per_rank: &[Vec<&[T]>],
    ) -> Result<(), RuntimeError> {
        self.run_lent(name, per_rank)
    }

    fn run_lent<'a, T: Element>(
        &mut self,
        name: &str,
        per_rank: &[impl AsRef<[&'a [T]]>],
    ) -> Result<(), RuntimeError> {
        self.usable()?;
        let id = self.plan.tensor_input(name)?;
        let holders = self.plan.holders(id);
        if per_rank.len() != holders.len() {
            return Err(InterpError::RankCount {
                name: name.to_string(),
                expected: holders.len(),
                got: per_rank.len(),
            }
            .into());
        }
        let lent = holders
            .zip(per_rank)
            .map(|(r, data)| Ok((r, lend(&self.plan, &self.inputs, name, r, data.as_ref())?)))
            .collect::<Result<Vec<_>, RuntimeError>>()?;
        let mut saved = Vec::with_capacity(lent.len());
        for (r, view) in &lent {
            if let Some(slot) = self.registry[*r].inputs.get_mut(&id) {
                saved.push((*r, std::mem::replace(slot, view.raw)));
            }
        }
        let result = self.run();
        for (r, raw) in saved {
            self.registry[r].inputs.insert(id, raw);
        }
        drop(lent);
        result
    }

    /// An error once a run has failed: the buffers may hold some ranks' new values and
    /// other ranks' old ones, so they are neither run nor handed out again.
    fn usable(&self) -> Result<(), RuntimeError> {
        match self.world.failure() {
            None => Ok(()),
            Some(e) => Err(RuntimeError::Plan(format!(
                "an earlier run failed ({e}); the job's buffers are undefined — prepare a new job"
            ))),
        }
    }

    /// Rank `rank`'s data of tensor input `name`, borrowed in its own dtype (`T` must be
    /// it): after a run, the updated value. For Sliced inputs, the rank's block. An input
    /// bound as pieces is read piece by piece ([`Job::piece`]).
    pub fn input<T: Element>(&self, name: &str, rank: usize) -> Result<&[T], RuntimeError> {
        self.usable()?;
        self.inputs.view(&self.plan, name, rank)
    }

    /// Rank `rank`'s buffer of tensor input `name`, to write the next run's data into
    /// (this iteration's gradient). Replicated inputs must stay identical on every rank:
    /// write them with [`Job::write_input`].
    pub fn input_mut<T: Element>(
        &mut self,
        name: &str,
        rank: usize,
    ) -> Result<&mut [T], RuntimeError> {
        self.usable()?;
        self.inputs.view_mut(&self.plan, name, rank)
    }

    /// How many separately allocated pieces rank `rank`'s buffer of input `name` has
    /// (`None` if there is no such input on that rank).
    pub fn input_pieces(&self, name: &str, rank: usize) -> Option<usize> {
        let id = self.plan.program().find(name)?;
        Some(self.inputs.buffers.get(rank)?.get(&id)?.piece_count())
    }

    /// Piece `piece` of rank `rank`'s buffer of input `name` (a model's parameter
    /// tensor, bound with [`Binding::pieces`](coconet_core::Binding::pieces)), borrowed
    /// in its own dtype. A buffer that was not bound as pieces is one piece.
    pub fn piece<T: Element>(
        &self,
        name: &str,
        rank: usize,
        piece: usize,
    ) -> Result<&[T], RuntimeError> {
        self.usable()?;
        self.inputs.piece(&self.plan, name, rank, piece)
    }

    /// Piece `piece` of rank `rank`'s buffer of input `name`, to write.
    pub fn piece_mut<T: Element>(
        &mut self,
        name: &str,
        rank: usize,
        piece: usize,
    ) -> Result<&mut [T], RuntimeError> {
        self.usable()?;
        self.inputs.piece_mut(&self.plan, name, rank, piece)
    }

    /// Writes the whole logical tensor `data` into input `name` on every rank that holds
    /// it: a copy per rank for Replicated and Local inputs, each rank's block for Sliced
    /// ones (as [`Binding::global`](coconet_core::Binding::global) lays it out). Copies in
    /// `T`, the input's dtype; no conversion.
    pub fn write_input<T: Element>(&mut self, name: &str, data: &[T]) -> Result<(), RuntimeError> {
        self.usable()?;
        self.inputs.write_global(&self.plan, name, data)
    }

    /// Chrome trace-event JSON of the last run (empty unless [`RunOptions::trace`]).
    pub fn trace_json(&self) -> String {
        trace::to_json(&self.spans)
    }
}

impl JobData for Job {
    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn rank_value(&self, v: ValueId, rank: usize) -> Result<Option<Vec<f64>>, RuntimeError> {
        self.usable()?;
        let Some(inputs) = self.inputs.buffers.get(rank) else {
            return Ok(None);
        };
        Ok(value_on(
            &self.plan,
            v,
            rank,
            &|t| Some(inputs.get(&t)?.to_f64()),
            &|s| Some(self.slots[rank][s].to_f64()),
        ))
    }

    fn write_rank_bytes(
        &mut self,
        name: &str,
        rank: usize,
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        self.usable()?;
        self.inputs.write_bytes(&self.plan, name, rank, bytes)
    }

    fn set_scalar_value(&mut self, id: ValueId, value: f64) -> Result<(), RuntimeError> {
        self.inputs.scalars.insert(id, value);
        Ok(())
    }
}
