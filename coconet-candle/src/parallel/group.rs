//! A rank's handle on its tensor-parallel group: the collectives the layers call in the
//! middle of a forward or backward pass, each a coconet program (`tp_sum`, `tp_max`,
//! `tp_gather`) run as this rank's [`ProcessJob`] over the group's link — rank threads
//! ([`Threads`]) or TCP processes. A job is prepared once per collective and size (a
//! model calls the same few every step) and kept; every rank must call the same
//! collectives in the same order, which the same model on every rank does.

use super::collective::{Collective, Holds, Scalars, collective_plan, set_scalar};
use super::device_group::{DeviceGroup, Prepare, RankMemory};
use coconet_runtime::RuntimeError;
use coconet_runtime::cpu::{ProcessJob, Tcp, Threads, Transport};
use coconet_runtime::cuda::{DeviceSlice, Memory};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

/// One rank's handle on a tensor-parallel group. Cloning it gives another handle on the
/// same rank (layers keep one each); hand one per rank to the thread or process that
/// runs that rank's model.
#[derive(Clone)]
pub struct TensorParallel {
    rank: usize,
    size: usize,
    link: Link,
    /// Collectives started and not yet waited for, run in order by the rank's
    /// communication thread (spawned on the first [`TensorParallel::start`]).
    queue: Arc<Queue>,
}

/// How a rank's collectives run.
#[derive(Clone)]
enum Link {
    /// This rank's own jobs over host memory (rank threads, TCP processes).
    Host(Arc<Mutex<dyn Collectives>>),
    /// One job for every rank of a group on one device, on the ranks' device memory.
    Device(Arc<DeviceGroup>),
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

    /// The `ranks` ranks of a group of threads of this process whose models are on GPU
    /// `ordinal` (candle's CUDA device): each collective is one job of the CUDA backend
    /// with every rank virtual on that GPU, the ranks' tensors lent to it in place and
    /// the result written into fresh device memory — nothing through the host. Hand rank
    /// r's handle to the thread that runs rank r's model. A rank waits at most 60 s for
    /// the others at a collective, then fails naming them.
    #[cfg(feature = "cuda")]
    pub fn gpu(ranks: usize, ordinal: usize) -> Result<Vec<TensorParallel>, RuntimeError> {
        use coconet_runtime::Backend;
        let gpu = coconet_runtime::cuda::Cuda::new(ordinal)?;
        Ok(TensorParallel::on_device(
            ranks,
            Box::new(move |plan, bindings| Ok(Box::new(gpu.prepare(plan, bindings)?))),
        ))
    }

    /// `TensorParallel::gpu`'s collectives on the CUDA backend's host emulator, over
    /// the host memory of CPU tensors: the GPU path (one job for every rank, memory lent
    /// in place) tested without a GPU. Slow; results bitwise those of
    /// [`TensorParallel::threads`].
    pub fn emulated_gpu(ranks: usize) -> Vec<TensorParallel> {
        use coconet_runtime::Backend;
        TensorParallel::on_device(
            ranks,
            Box::new(|plan, bindings| {
                Ok(Box::new(
                    coconet_runtime::cuda::EmulatedCuda.prepare(plan, bindings)?,
                ))
            }),
        )
    }

    fn on_device(ranks: usize, prepare: Box<Prepare>) -> Vec<TensorParallel> {
        let group = Arc::new(DeviceGroup::new(ranks, prepare, Duration::from_secs(60)));
        (0..ranks)
            .map(|rank| TensorParallel {
                rank,
                size: ranks,
                link: Link::Device(group.clone()),
                queue: Arc::default(),
            })
            .collect()
    }

    fn over<L: Transport + Send + Sync + 'static>(link: L) -> TensorParallel {
        TensorParallel {
            rank: link.rank(),
            size: link.size(),
            link: Link::Host(Arc::new(Mutex::new(Jobs {
                link: Arc::new(link),
                jobs: HashMap::new(),
            }))),
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

    /// `what` over every rank's `mine` (the same length on every rank), the inputs the
    /// same on every rank that `what` takes besides (none but for the epilogue) and the
    /// program's scalars (the same on every rank).
    pub(crate) fn run_with(
        &self,
        what: Collective,
        mine: &[f32],
        replicated: &[&[f32]],
        scalars: Scalars<'_>,
    ) -> Result<Vec<f32>, RuntimeError> {
        let jobs = match &self.link {
            Link::Host(jobs) => jobs,
            Link::Device(group) => {
                return self.run_host_on_device(group, what, mine, replicated, scalars);
            }
        };
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
        jobs.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .run(what, mine, replicated, scalars)
    }

    /// [`TensorParallel::run_with`] of host data on a device group: the data lent as
    /// host memory (what the emulator's jobs take; a GPU's refuses it, saying so).
    fn run_host_on_device(
        &self,
        group: &DeviceGroup,
        what: Collective,
        mine: &[f32],
        replicated: &[&[f32]],
        scalars: Scalars<'_>,
    ) -> Result<Vec<f32>, RuntimeError> {
        let len = match what {
            Collective::Gather => mine.len().checked_mul(self.size),
            Collective::ReduceScatter => Some(mine.len() / self.size),
            _ => mine.len().checked_mul(what.outputs().len()),
        }
        .ok_or_else(|| {
            let e = RuntimeError::Plan(format!("a {what:?} of {} elements overflows", mine.len()));
            group.abort(self.rank, &e.to_string());
            e
        })?;
        let mut out = vec![0f32; len];
        let host = |data: &[f32]| {
            // SAFETY: host memory that outlives the collective (it returns once the run
            // has finished); the programs only read their operands and replicated
            // inputs, so memory behind a shared reference is never written.
            unsafe {
                DeviceSlice::from_raw(
                    data.as_ptr() as u64,
                    data.len(),
                    coconet_core::DType::F32,
                    Memory::Host,
                )
            }
        };
        let memory = RankMemory {
            mine: host(mine),
            replicated: replicated.iter().map(|r| host(r)).collect(),
            // SAFETY: `out` outlives the collective and nothing else uses it meanwhile.
            out: unsafe { DeviceSlice::host(&mut out).detach() },
        };
        group.run(self.rank, what, mine.len(), memory, scalars)?;
        Ok(out)
    }

    /// Tells a group on one device that this rank failed before calling its collective
    /// (`why`), so its peers stop waiting (nothing for the other links: their peers'
    /// transports notice a rank that does not come).
    #[cfg(feature = "cuda")]
    pub(crate) fn abort_collective(&self, why: &str) {
        if let Link::Device(group) = &self.link {
            group.abort(self.rank, why);
        }
    }

    /// `what` over every rank's device memory (`memory`, `len` elements of the rank's
    /// tensor): for groups on one device only.
    #[cfg(feature = "cuda")]
    pub(crate) fn run_on_device(
        &self,
        what: Collective,
        len: usize,
        memory: RankMemory,
        scalars: Scalars<'_>,
    ) -> Result<(), RuntimeError> {
        match &self.link {
            Link::Device(group) => group.run(self.rank, what, len, memory, scalars),
            Link::Host(_) => Err(RuntimeError::Plan(
                "a tensor on a GPU, but this tensor-parallel group's ranks are host threads \
                 or processes: make the group with TensorParallel::gpu"
                    .into(),
            )),
        }
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
        let jobs = match &self.link {
            Link::Host(jobs) => jobs.clone(),
            Link::Device(group) => {
                // One job for every rank: nothing to overlap on the host; run it now.
                let (reply, pending) = channel();
                let _ = reply.send(task(&mut OnDevice { tp: self, group }, &data));
                return Ok(Pending(pending));
            }
        };
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
        let queue = self.queue.clone();
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

/// A device group's collectives behind the host jobs' interface (for the tasks of the
/// overlapped layers).
struct OnDevice<'a> {
    tp: &'a TensorParallel,
    group: &'a DeviceGroup,
}

impl Collectives for OnDevice<'_> {
    fn run(
        &mut self,
        what: Collective,
        mine: &[f32],
        replicated: &[&[f32]],
        scalars: Scalars<'_>,
    ) -> Result<Vec<f32>, RuntimeError> {
        self.tp
            .run_host_on_device(self.group, what, mine, replicated, scalars)
    }
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
            set_scalar(job, name, value)?;
        }
        job.run_with(what.operand(), mine)?;
        let mut out = Vec::new();
        for name in what.outputs() {
            out.extend_from_slice(job.input::<f32>(name, rank)?);
        }
        Ok(out)
    }
}

/// This rank's job of collective `what` over tensors of `len` elements per rank.
fn prepare<L: Transport>(
    link: &Arc<L>,
    what: Collective,
    len: usize,
) -> Result<ProcessJob<Arc<L>>, RuntimeError> {
    let (plan, bindings) = collective_plan(what, len, link.size(), Holds::ThisRank)?;
    ProcessJob::new(&plan, &bindings, link.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use coconet_runtime::Backend;
    use coconet_runtime::cuda::EmulatedCuda;

    fn emulated(ranks: usize) -> Arc<DeviceGroup> {
        Arc::new(DeviceGroup::new(
            ranks,
            Box::new(|plan, bindings| Ok(Box::new(EmulatedCuda.prepare(plan, bindings)?))),
            Duration::from_secs(30),
        ))
    }

    fn data(rank: usize, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7 + rank * 13) % 17) as f32 * 0.37 - 2.9 + rank as f32 * 0.01)
            .collect()
    }

    /// What each rank gets from `what` on the emulated GPU's group, and on the host's.
    fn both(ranks: usize, what: Collective, n: usize) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
        let scalars: &[(&str, f64)] = match what {
            Collective::BiasDropoutResidual { .. } | Collective::BiasDropoutResidualNorm { .. } => {
                &[("drop", 0.25), ("seed", 7.0)]
            }
            _ => &[],
        };
        let out_len = match what {
            Collective::Gather => n * ranks,
            Collective::ReduceScatter => n / ranks,
            _ => n * what.outputs().len(),
        };
        // The inputs every rank holds the same: the residual `n` long, the others a row.
        let replicated: Vec<Vec<f32>> = what
            .replicated()
            .iter()
            .enumerate()
            .map(|(k, &name)| {
                let len = if name == "r" {
                    n
                } else {
                    what.width().unwrap_or(0)
                };
                data(90 + k, len)
            })
            .collect();
        let group = emulated(ranks);
        let on_device: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..ranks)
                .map(|r| {
                    let (group, mut replicated) = (group.clone(), replicated.clone());
                    s.spawn(move || {
                        let mut x = data(r, n);
                        let mut out = vec![0f32; out_len];
                        // SAFETY: the vectors outlive the collective, which returns
                        // once the run that uses them has finished.
                        let memory = unsafe {
                            RankMemory {
                                mine: DeviceSlice::host(&mut x).detach(),
                                replicated: replicated
                                    .iter_mut()
                                    .map(|v| DeviceSlice::host(v).detach())
                                    .collect(),
                                out: DeviceSlice::host(&mut out).detach(),
                            }
                        };
                        group.run(r, what, n, memory, scalars).unwrap();
                        out
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let on_host: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = TensorParallel::threads(ranks)
                .into_iter()
                .enumerate()
                .map(|(r, tp)| {
                    let replicated = &replicated;
                    s.spawn(move || {
                        let replicated: Vec<&[f32]> =
                            replicated.iter().map(Vec::as_slice).collect();
                        tp.run_with(what, &data(r, n), &replicated, scalars)
                            .unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        (on_device, on_host)
    }

    /// Every collective on the emulated GPU gives every rank bitwise what the host's
    /// group of rank threads gives it.
    #[test]
    fn every_collective_on_one_device_is_bitwise_the_hosts() {
        let bits = |v: &[Vec<f32>]| -> Vec<Vec<u32>> {
            v.iter()
                .map(|x| x.iter().map(|y| y.to_bits()).collect())
                .collect()
        };
        for ranks in [1, 2, 3] {
            for what in [
                Collective::Sum,
                Collective::Max,
                Collective::Gather,
                Collective::ReduceScatter,
                Collective::BiasResidual { width: 4 },
                Collective::BiasDropoutResidual { width: 4 },
                Collective::BiasDropoutResidualNorm { width: 4 },
            ] {
                let n = 12 * ranks;
                let (device, host) = both(ranks, what, n);
                assert_eq!(bits(&device), bits(&host), "{what:?} on {ranks} ranks");
            }
        }
    }
}
