//! The CPU backend: P rank threads in one process sharing memory.
//!
//! A [`Job`] binds a [`Plan`] to inputs (validating every binding before any rank
//! starts), allocates each rank's buffers, and runs the plan on P scoped threads. A rank
//! that returns an error or panics marks the shared [`World`](sync::World) failed; every
//! other rank returns from its next wait with an error naming it, and every wait has a
//! deadline, so a run never hangs.

pub(crate) mod array;
pub(crate) mod collective;
pub(crate) mod exec;
pub(crate) mod fused;
pub(crate) mod kernel;
pub(crate) mod matmul;
pub(crate) mod memory;
pub(crate) mod ops;
pub(crate) mod sync;
pub(crate) mod trace;

pub use memory::Buffer;

use crate::RuntimeError;
use crate::backend::Backend;
use crate::plan::{Plan, Step, Storage};
use coconet_core::{Bindings, Element, Layout, ValueId, block_range};
use exec::{Ctx, RankRaw, Span};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Options of a run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// How long a rank waits for its peers before giving up.
    pub timeout: Duration,
    /// Record each rank's steps for [`Job::trace_json`].
    pub trace: bool,
    /// Makes a rank fail on purpose (to test failure handling).
    pub fault: Option<Fault>,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions {
            timeout: Duration::from_secs(60),
            trace: false,
            fault: None,
        }
    }
}

/// A failure injected into a run, to test that every rank reports it without hanging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `rank` panics before step `step`.
    Panic {
        /// The failing rank.
        rank: usize,
        /// Before this step.
        step: usize,
    },
    /// `rank` stops (returns without an error, never reaching its peers) before `step`.
    Vanish {
        /// The vanishing rank.
        rank: usize,
        /// Before this step.
        step: usize,
    },
}

/// The CPU backend (rank threads in this process).
#[derive(Debug, Clone, Default)]
pub struct Cpu {
    /// Options for jobs it prepares.
    pub options: RunOptions,
}

impl Backend for Cpu {
    type Job = Job;

    fn prepare(&self, plan: &Plan, bindings: &Bindings) -> Result<Job, RuntimeError> {
        Job::new(plan, bindings, self.options.clone())
    }

    fn run(&self, job: &mut Job) -> Result<(), RuntimeError> {
        job.run()
    }
}

/// A plan bound to inputs, with every rank's buffers; run it any number of times (each
/// run updates the inputs in place, like a training step).
#[derive(Debug)]
pub struct Job {
    plan: Plan,
    inputs: Vec<HashMap<ValueId, Buffer>>,
    slots: Vec<Vec<Buffer>>,
    scalars: HashMap<ValueId, f64>,
    world: sync::World,
    epoch: u64,
    options: RunOptions,
    spans: Vec<Vec<Span>>,
}

impl Job {
    /// Binds `bindings` (checked exactly as the reference interpreter checks them) and
    /// allocates the buffers. Nothing runs, so a bad binding changes nothing.
    pub fn new(plan: &Plan, bindings: &Bindings, options: RunOptions) -> Result<Job, RuntimeError> {
        let p = plan.program();
        let bound = plan.bind(bindings)?;
        let mut inputs: Vec<HashMap<ValueId, Buffer>> =
            (0..plan.ranks).map(|_| HashMap::new()).collect();
        for (&id, per_rank) in &bound.tensors {
            let node = p.node(id);
            // Pieces stay separate where every rank holds the whole tensor.
            let pieces = bound
                .pieces
                .get(&id)
                .filter(|_| matches!(node.ty.layout, Layout::Replicated | Layout::Local));
            for (r, data) in per_rank.iter().enumerate() {
                let buffer = match (data, pieces) {
                    (Some(d), Some(lens)) => Buffer::pieces(node.ty.dtype, d, lens),
                    (d, _) => Buffer::from_f64(node.ty.dtype, d.as_deref().unwrap_or(&[])),
                };
                inputs[r].insert(id, buffer);
            }
        }
        let slots = (0..plan.ranks)
            .map(|r| {
                plan.slots
                    .iter()
                    .map(|s| Buffer::zeros(s.dtype, s.elements[r]))
                    .collect()
            })
            .collect();
        let flags = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Overlap { matmul, .. } => Some(plan.ranks * plan.shape(*matmul)[0]),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        Ok(Job {
            plan: plan.clone(),
            inputs,
            slots,
            scalars: bound.scalars,
            world: sync::World::new(plan.ranks, flags, options.timeout),
            epoch: 0,
            options,
            spans: Vec::new(),
        })
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Runs the plan once on P rank threads.
    pub fn run(&mut self) -> Result<(), RuntimeError> {
        if let Some(e) = self.world.failure() {
            return Err(RuntimeError::Plan(format!(
                "an earlier run failed ({e}); the job's buffers are undefined — prepare a new job"
            )));
        }
        self.epoch += 1;
        let registry: Vec<RankRaw> = self
            .inputs
            .iter_mut()
            .zip(self.slots.iter_mut())
            .map(|(ins, sl)| RankRaw {
                inputs: ins.iter_mut().map(|(&k, b)| (k, b.raw())).collect(),
                slots: sl.iter_mut().map(Buffer::raw).collect(),
            })
            .collect();
        let start = Instant::now();
        let plan = &self.plan;
        let world = &self.world;
        let scalars = &self.scalars;
        let (epoch, trace, fault) = (self.epoch, self.options.trace, self.options.fault);
        let registry = &registry;
        let results: Vec<Result<Vec<Span>, RuntimeError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..plan.ranks)
                .map(|rank| {
                    scope.spawn(move || {
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
                            };
                            exec::run_rank(&mut ctx, start, trace, fault)
                        });
                        match std::panic::catch_unwind(body) {
                            Ok(Ok(spans)) => Ok(spans),
                            Ok(Err(e)) => {
                                world.fail(rank, e.to_string());
                                Err(e)
                            }
                            Err(panic) => {
                                let msg = panic
                                    .downcast_ref::<String>()
                                    .cloned()
                                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                                    .unwrap_or_else(|| "unknown panic".into());
                                let msg = format!("panicked: {msg}");
                                world.fail(rank, msg.clone());
                                Err(RuntimeError::RankFailed { rank, message: msg })
                            }
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(RuntimeError::Plan("rank thread lost".into())))
                })
                .collect()
        });
        if let Some(e) = self.world.failure() {
            return Err(e);
        }
        let mut spans = Vec::new();
        for r in results {
            spans.push(r?);
        }
        self.spans = spans;
        Ok(())
    }

    /// How many separately allocated pieces rank `rank`'s buffer of input `name` has.
    pub fn input_pieces(&self, name: &str, rank: usize) -> Option<usize> {
        let id = self.plan.program().find(name)?;
        Some(self.inputs.get(rank)?.get(&id)?.piece_count())
    }

    /// Chrome trace-event JSON of the last run (empty unless [`RunOptions::trace`]).
    pub fn trace_json(&self) -> String {
        trace::to_json(&self.spans)
    }

    fn buffer(&self, v: ValueId, r: usize) -> Option<Vec<f64>> {
        value_on(
            &self.plan,
            v,
            r,
            &|t| Some(self.inputs[r].get(&t)?.to_f64()),
            &|s| Some(self.slots[r][s].to_f64()),
        )
    }

    /// `v`'s data on `rank` after the last run (`None` if that rank does not hold it or
    /// it lived only in registers).
    pub fn local<T: Element>(&self, v: impl Into<ValueId>, rank: usize) -> Option<Vec<T>> {
        let v = v.into();
        self.plan.program().get(v)?;
        Some(self.buffer(v, rank)?.into_iter().map(T::from_f64).collect())
    }

    /// The logical value of a Replicated or Sliced value after the last run.
    pub fn logical<T: Element>(&self, v: impl Into<ValueId>) -> Result<Vec<T>, RuntimeError> {
        let v = v.into();
        let p = self.plan.program();
        let node = p
            .get(v)
            .ok_or_else(|| RuntimeError::Read(format!("{v} is not a value of `{}`", p.name())))?;
        let q = self.plan.group_size;
        let first = match node.ty.placement {
            coconet_core::Placement::Group(g) => g * q,
            coconet_core::Placement::Everywhere => 0,
        };
        let unreadable = || RuntimeError::Read(format!("`{}` is not kept in memory", p.label(v)));
        let data = match node.ty.layout {
            Layout::Replicated => self.buffer(v, first).ok_or_else(unreadable)?,
            Layout::Local => {
                return Err(RuntimeError::Read(format!(
                    "`{}` is Local (a different value per rank); read it per rank",
                    p.label(v)
                )));
            }
            Layout::Sliced(d) => {
                let blocks: Vec<(Vec<f64>, usize)> = (first..first + q)
                    .map(|r| {
                        let b = self.buffer(v, r).ok_or_else(unreadable)?;
                        Ok((b, block_range(self.plan.shape(v)[d], q, r % q).len()))
                    })
                    .collect::<Result<_, RuntimeError>>()?;
                let refs: Vec<(&[f64], usize)> = blocks.iter().map(|(b, n)| (&b[..], *n)).collect();
                coconet_core::interp::tensor::concat_dim(&refs, self.plan.shape(v), d)
            }
        };
        Ok(data.into_iter().map(T::from_f64).collect())
    }

    /// The logical value of input `name` after the last run.
    pub fn final_input<T: Element>(&self, name: &str) -> Result<Vec<T>, RuntimeError> {
        let id = self.plan.tensor_input(name)?;
        self.logical(id)
    }

    /// Rank `rank`'s data of input `name` after the last run (for Local inputs).
    pub fn final_input_local<T: Element>(
        &self,
        name: &str,
        rank: usize,
    ) -> Result<Vec<T>, RuntimeError> {
        let id = self.plan.tensor_input(name)?;
        self.local(id, rank)
            .ok_or_else(|| RuntimeError::Read(format!("rank {rank} does not hold `{name}`")))
    }
}

/// `v`'s data on rank `r`, from that rank's input buffers and slots (views are sliced
/// out of the viewed value); `None` if the rank does not hold it or it has no memory.
pub(crate) fn value_on(
    plan: &Plan,
    v: ValueId,
    r: usize,
    input: &dyn Fn(ValueId) -> Option<Vec<f64>>,
    slot: &dyn Fn(usize) -> Option<Vec<f64>>,
) -> Option<Vec<f64>> {
    let p = plan.program();
    let q = plan.group_size;
    let holds = match p.node(v).ty.placement {
        coconet_core::Placement::Everywhere => true,
        coconet_core::Placement::Group(g) => r / q == g,
    };
    if !holds {
        return None;
    }
    match plan.storage(v)? {
        Storage::Input(t) => input(t),
        Storage::Slot(s) => slot(s),
        Storage::View { of, dim } => {
            let data = value_on(plan, of, r, input, slot)?;
            let mut shape = plan.shape(of).to_vec();
            if let Layout::Sliced(d) = p.node(of).ty.layout {
                shape[d] = block_range(shape[d], q, r % q).len();
            }
            let b = block_range(plan.shape(of)[dim], q, r % q);
            Some(coconet_core::interp::tensor::slice_dim(
                &data, &shape, dim, b,
            ))
        }
        Storage::Uniform | Storage::Register => None,
    }
}
