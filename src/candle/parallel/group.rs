//! A rank's handle on its tensor-parallel group: the collectives the layers call in the
//! middle of a forward or backward pass, each a coconet program (`tp_sum`, `tp_max`,
//! `tp_gather`) run as this rank's [`ProcessJob`] over the group's link — rank threads
//! ([`Threads`]) or TCP processes. A job is prepared once per collective and size (a
//! model calls the same few every step) and kept; every rank must call the same
//! collectives in the same order, which the same model on every rank does.

use crate::programs::{tp_gather, tp_max, tp_sum};
use crate::runtime::cpu::{ProcessJob, Tcp, Threads, Transport};
use crate::runtime::{Plan, RuntimeError};
use coconet_core::schedule::Schedule;
use coconet_core::{Binding, Bindings};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// A collective between the ranks of a tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Collective {
    /// Elementwise sum of every rank's tensor, in rank order.
    Sum,
    /// Elementwise maximum of every rank's tensor.
    Max,
    /// Every rank's tensor, concatenated in rank order.
    Gather,
}

/// One rank's handle on a tensor-parallel group. Cloning it gives another handle on the
/// same rank (layers keep one each); hand one per rank to the thread or process that
/// runs that rank's model.
#[derive(Clone)]
pub struct TensorParallel {
    rank: usize,
    size: usize,
    jobs: Arc<Mutex<dyn Collectives>>,
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

    /// `what` over every rank's `mine` (the same length on every rank).
    pub(crate) fn run(&self, what: Collective, mine: &[f32]) -> Result<Vec<f32>, RuntimeError> {
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .run(what, mine)
    }
}

/// A rank's prepared jobs, whatever its link.
trait Collectives: Send {
    fn run(&mut self, what: Collective, mine: &[f32]) -> Result<Vec<f32>, RuntimeError>;
}

struct Jobs<L: Transport> {
    link: Arc<L>,
    jobs: HashMap<(Collective, usize), ProcessJob<Arc<L>>>,
}

impl<L: Transport + Send + Sync + 'static> Collectives for Jobs<L> {
    fn run(&mut self, what: Collective, mine: &[f32]) -> Result<Vec<f32>, RuntimeError> {
        let key = (what, mine.len());
        let job = match self.jobs.entry(key) {
            std::collections::hash_map::Entry::Occupied(job) => job.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(prepare(&self.link, what, mine.len())?)
            }
        };
        job.run_with("x", mine)?;
        Ok(job.input::<f32>("y", job.rank())?.to_vec())
    }
}

/// This rank's job of collective `what` over tensors of `len` elements per rank.
fn prepare<L: Transport>(
    link: &Arc<L>,
    what: Collective,
    len: usize,
) -> Result<ProcessJob<Arc<L>>, RuntimeError> {
    let ranks = link.size();
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
    };
    let bindings = Bindings::new()
        .dim("N", total)
        .tensor("x", Binding::this_rank(&vec![0f32; len]))
        .tensor("y", Binding::global(&vec![0f32; total]));
    let plan = Plan::lower(&Schedule::new(&program), ranks, bindings.dims())?;
    ProcessJob::new(&plan, &bindings, link.clone())
}
