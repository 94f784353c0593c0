//! A rank's handle on its tensor-parallel group: the collectives the layers call in the
//! middle of a forward or backward pass, each a coconet program (`tp_sum`, `tp_max`,
//! `tp_gather`) run as this rank's [`ProcessJob`] over the group's link — rank threads
//! ([`Threads`]) or TCP processes. A job is prepared once per collective and size (a
//! model calls the same few every step) and kept; every rank must call the same
//! collectives in the same order, which the same model on every rank does.

use coconet_core::Program;
use coconet_core::schedule::{Schedule, candidates};
use coconet_core::{Binding, Bindings};
use coconet_programs::{
    tp_bias_dropout_residual, tp_bias_residual, tp_gather, tp_max, tp_reduce_scatter, tp_sum,
};
use coconet_runtime::cpu::{ProcessJob, Tcp, Threads, Transport};
use coconet_runtime::{JobData, Plan, RuntimeError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// A collective between the ranks of a tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Collective {
    /// Elementwise sum of every rank's tensor, in rank order.
    Sum,
    /// Elementwise maximum of every rank's tensor.
    Max,
    /// Every rank's tensor, concatenated in rank order.
    Gather,
    /// This rank's block (of P equal blocks) of the elementwise sum of every rank's
    /// tensor.
    ReduceScatter,
    /// A row-parallel layer's epilogue: `residual + (Σ partial + bias)`, the bias `width`
    /// long.
    BiasResidual {
        /// The bias's length (the last dim).
        width: usize,
    },
    /// [`Collective::BiasResidual`] with dropout on `Σ partial + bias`; the probability
    /// and seed are the run's scalars `drop` and `seed`.
    BiasDropoutResidual {
        /// The bias's length (the last dim).
        width: usize,
    },
}

/// The scalars of one run of a collective's program (the epilogue's dropout).
pub(crate) type Scalars<'a> = &'a [(&'a str, f64)];

/// One rank's handle on a tensor-parallel group. Cloning it gives another handle on the
/// same rank (layers keep one each); hand one per rank to the thread or process that
/// runs that rank's model.
#[derive(Clone)]
pub struct TensorParallel {
    rank: usize,
    size: usize,
    jobs: Arc<Mutex<dyn Collectives>>,
    /// Collectives started and not yet waited for, run in order by the rank's
    /// communication thread (spawned on the first [`TensorParallel::start`]).
    queue: Arc<Queue>,
}

/// A rank's communication thread and the count of collectives queued on it: a
/// collective called while others are in flight queues behind them, so every rank runs
/// its collectives in the order it called them (the order the ranks' programs match in).
#[derive(Default)]
struct Queue {
    sender: OnceLock<Mutex<Sender<Task>>>,
    in_flight: AtomicUsize,
}

type Task = Box<dyn FnOnce() + Send>;

/// A collective started by [`TensorParallel::start`]: its result, once waited for.
pub(crate) struct Pending(Receiver<Result<Vec<f32>, RuntimeError>>);

impl Pending {
    /// The collective's result (the calling thread blocks until it is there).
    pub(crate) fn wait(self) -> Result<Vec<f32>, RuntimeError> {
        self.0.recv().unwrap_or_else(|_| {
            Err(RuntimeError::Plan(
                "a tensor-parallel rank's communication thread ended with a collective in \
                 flight"
                    .into(),
            ))
        })
    }
}

impl std::fmt::Debug for TensorParallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorParallel(rank {} of {})", self.rank, self.size)
    }
}

impl TensorParallel {
    /// The `ranks` ranks of a group of threads of this process: hand rank r's handle to
    /// the thread that runs rank r's model.
    pub fn threads(ranks: usize) -> Vec<TensorParallel> {
        Threads::group(ranks)
            .into_iter()
            .map(TensorParallel::over)
            .collect()
    }

    /// This process's rank of a group of processes connected by `tcp` (made with
    /// [`Tcp::from_env`] under `coconet-launch` or torchrun).
    pub fn tcp(tcp: Tcp) -> TensorParallel {
        TensorParallel::over(tcp)
    }

    fn over<L: Transport + Send + Sync + 'static>(link: L) -> TensorParallel {
        TensorParallel {
            rank: link.rank(),
            size: link.size(),
            jobs: Arc::new(Mutex::new(Jobs {
                link: Arc::new(link),
                jobs: HashMap::new(),
            })),
            queue: Arc::default(),
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// `what` over every rank's `mine` (the same length on every rank) and the inputs
    /// the same on every rank that `what` takes besides (none but for the epilogue).
    pub(crate) fn run(
        &self,
        what: Collective,
        mine: &[f32],
        replicated: &[&[f32]],
    ) -> Result<Vec<f32>, RuntimeError> {
        self.run_with(what, mine, replicated, &[])
    }

    /// [`TensorParallel::run`] with the program's scalars set first (the same on every
    /// rank).
    pub(crate) fn run_with(
        &self,
        what: Collective,
        mine: &[f32],
        replicated: &[&[f32]],
        scalars: Scalars<'_>,
    ) -> Result<Vec<f32>, RuntimeError> {
        if self.queue.in_flight.load(Ordering::Acquire) > 0 {
            // Behind the collectives in flight, in the order called.
            let replicated: Vec<Vec<f32>> = replicated.iter().map(|r| r.to_vec()).collect();
            let scalars: Vec<(String, f64)> =
                scalars.iter().map(|&(n, v)| (n.to_string(), v)).collect();
            let task = move |jobs: &mut dyn Collectives, mine: &[f32]| {
                let replicated: Vec<&[f32]> = replicated.iter().map(Vec::as_slice).collect();
                let scalars: Vec<(&str, f64)> =
                    scalars.iter().map(|(n, v)| (n.as_str(), *v)).collect();
                jobs.run(what, mine, &replicated, &scalars)
            };
            return self.enqueue(task, mine.to_vec())?.wait();
        }
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .run(what, mine, replicated, scalars)
    }

    /// Starts `what` over every rank's `mine` on this rank's communication thread and
    /// returns at once: the caller computes while the collective runs, and waits for
    /// its result when it needs it. For collectives without replicated inputs or
    /// scalars (the sums, maxima and gathers the overlapped layers start).
    pub(crate) fn start(&self, what: Collective, mine: Vec<f32>) -> Result<Pending, RuntimeError> {
        self.enqueue(move |jobs, mine| jobs.run(what, mine, &[], &[]), mine)
    }

    /// Queues `task` (given the rank's jobs and `data`) on the communication thread.
    fn enqueue(
        &self,
        task: impl FnOnce(&mut dyn Collectives, &[f32]) -> Result<Vec<f32>, RuntimeError>
        + Send
        + 'static,
        data: Vec<f32>,
    ) -> Result<Pending, RuntimeError> {
        if self.queue.sender.get().is_none() {
            let (sender, tasks) = channel::<Task>();
            // Ends when the last handle on the rank drops the sender.
            std::thread::Builder::new()
                .name(format!("coconet-tp-rank-{}", self.rank))
                .spawn(move || {
                    for task in tasks {
                        task();
                    }
                })
                .map_err(|e| {
                    RuntimeError::Plan(format!(
                        "rank {}'s communication thread could not start: {e}",
                        self.rank
                    ))
                })?;
            // A rank's collectives are called from one thread: nobody else sets it.
            let _ = self.queue.sender.set(Mutex::new(sender));
        }
        let sender = self.queue.sender.get().expect("set above");
        let (reply, pending) = channel();
        let (jobs, queue) = (self.jobs.clone(), self.queue.clone());
        queue.in_flight.fetch_add(1, Ordering::AcqRel);
        let job: Task = Box::new(move || {
            let result = task(
                &mut *jobs.lock().unwrap_or_else(PoisonError::into_inner),
                &data,
            );
            queue.in_flight.fetch_sub(1, Ordering::AcqRel);
            let _ = reply.send(result);
        });
        sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(job)
            .map_err(|_| {
                self.queue.in_flight.fetch_sub(1, Ordering::AcqRel);
                RuntimeError::Plan("a tensor-parallel rank's communication thread ended".into())
            })?;
        Ok(Pending(pending))
    }
}

/// A rank's prepared jobs, whatever its link.
trait Collectives: Send {
    fn run(
        &mut self,
        what: Collective,
        mine: &[f32],
        replicated: &[&[f32]],
        scalars: Scalars<'_>,
    ) -> Result<Vec<f32>, RuntimeError>;
}

struct Jobs<L: Transport> {
    link: Arc<L>,
    jobs: HashMap<(Collective, usize), ProcessJob<Arc<L>>>,
}

impl<L: Transport + Send + Sync + 'static> Collectives for Jobs<L> {
    fn run(
        &mut self,
        what: Collective,
        mine: &[f32],
        replicated: &[&[f32]],
        scalars: Scalars<'_>,
    ) -> Result<Vec<f32>, RuntimeError> {
        let key = (what, mine.len());
        let job = match self.jobs.entry(key) {
            std::collections::hash_map::Entry::Occupied(job) => job.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(prepare(&self.link, what, mine.len())?)
            }
        };
        let rank = job.rank();
        for (name, data) in what.replicated().iter().zip(replicated) {
            let buffer = job.input_mut::<f32>(name, rank)?;
            if buffer.len() != data.len() {
                return Err(RuntimeError::Plan(format!(
                    "input `{name}` of a tensor-parallel collective has {} elements, not {}",
                    data.len(),
                    buffer.len()
                )));
            }
            buffer.copy_from_slice(data);
        }
        for &(name, value) in scalars {
            let id = job.plan().program().find(name).ok_or_else(|| {
                RuntimeError::Plan(format!(
                    "a tensor-parallel collective has no scalar `{name}`"
                ))
            })?;
            job.set_scalar_value(id, value)?;
        }
        job.run_with(what.operand(), mine)?;
        Ok(job.input::<f32>("y", rank)?.to_vec())
    }
}

impl Collective {
    /// The program's input that takes each rank's own tensor.
    fn operand(self) -> &'static str {
        match self {
            Collective::BiasResidual { .. } | Collective::BiasDropoutResidual { .. } => "p",
            _ => "x",
        }
    }

    /// The program's other inputs, the same on every rank, in the order `run` takes them.
    fn replicated(self) -> &'static [&'static str] {
        match self {
            Collective::BiasResidual { .. } | Collective::BiasDropoutResidual { .. } => &["b", "r"],
            _ => &[],
        }
    }
}

/// This rank's job of collective `what` over tensors of `len` elements per rank.
fn prepare<L: Transport>(
    link: &Arc<L>,
    what: Collective,
    len: usize,
) -> Result<ProcessJob<Arc<L>>, RuntimeError> {
    let ranks = link.size();
    let zeros = |n: usize| vec![0f32; n];
    let mut bindings = Bindings::new();
    let (program, total) = match what {
        Collective::Sum => (tp_sum().program().clone(), len),
        Collective::Max => (tp_max().program().clone(), len),
        Collective::Gather => (
            tp_gather().program().clone(),
            len.checked_mul(ranks).ok_or_else(|| {
                RuntimeError::Plan(format!(
                    "gathering {len} elements from {ranks} ranks overflows"
                ))
            })?,
        ),
        Collective::ReduceScatter => {
            if !len.is_multiple_of(ranks) {
                return Err(RuntimeError::Plan(format!(
                    "a reduce-scatter of {len} elements into {ranks} equal blocks"
                )));
            }
            (tp_reduce_scatter().program().clone(), len)
        }
        Collective::BiasResidual { width } | Collective::BiasDropoutResidual { width } => {
            if width == 0 || !len.is_multiple_of(width) {
                return Err(RuntimeError::Plan(format!(
                    "a row-parallel epilogue over {len} elements with a bias of {width}"
                )));
            }
            bindings = bindings
                .dim("T", len / width)
                .dim("H", width)
                .tensor("b", Binding::global(&zeros(width)))
                .tensor("r", Binding::global(&zeros(len)));
            if let Collective::BiasDropoutResidual { .. } = what {
                bindings = bindings.scalar("drop", 0f32).scalar("seed", 0i64);
                (tp_bias_dropout_residual().program().clone(), len)
            } else {
                (tp_bias_residual().program().clone(), len)
            }
        }
    };
    if !matches!(
        what,
        Collective::BiasResidual { .. } | Collective::BiasDropoutResidual { .. }
    ) {
        bindings = bindings.dim("N", total);
    }
    let out = match what {
        Collective::ReduceScatter => Binding::this_rank(&zeros(len / ranks)),
        _ => Binding::global(&zeros(total)),
    };
    let bindings = bindings
        .tensor(what.operand(), Binding::this_rank(&zeros(len)))
        .tensor("y", out);
    let schedule = match what {
        // The epilogue on each rank's block of the sum, between the reduce-scatter and
        // the all-gather (the paper's fused schedule).
        Collective::BiasResidual { .. } | Collective::BiasDropoutResidual { .. } => fused(&program),
        _ => Schedule::new(&program),
    };
    let plan = Plan::lower(&schedule, ranks, bindings.dims())?;
    ProcessJob::new(&plan, &bindings, link.clone())
}

/// `program`'s all-reduce split into a reduce-scatter and an all-gather with the
/// elementwise work between them fused into one pass over each rank's block.
fn fused(program: &Program) -> Schedule {
    candidates(program, &[])
        .into_iter()
        .min_by_key(|s| match s.name() {
            "fuse(RS-C-AG)" => 0,
            "RS-C-AG" => 1,
            _ => 2,
        })
        .expect("the program as written is always a candidate")
}
