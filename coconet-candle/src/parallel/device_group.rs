//! The collectives of rank threads whose tensors share one GPU: every rank is a virtual
//! rank of one CUDA job per collective and size (the same programs as over the host:
//! `tp_sum`, `tp_gather`, the fused epilogue...), each rank's device memory lent to it in
//! place — its tensor as the program's operand, the memory for its result as `y` — so no
//! byte goes through the host. The ranks meet at each collective; the last to arrive
//! runs the job for all of them and every rank returns once its result is written.

use super::group::{Collective, Holds, collective_plan};
use coconet_core::Bindings;
use coconet_runtime::cuda::{DeviceSlice, EmulatedJob, Lent};
use coconet_runtime::{JobData, Plan, RuntimeError};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// A rank's memory for one collective: its own tensor, the inputs every rank holds the
/// same (the epilogue's bias and residual), and where its result goes.
pub(crate) struct RankMemory {
    pub(crate) mine: DeviceSlice<'static>,
    pub(crate) replicated: Vec<DeviceSlice<'static>>,
    pub(crate) out: DeviceSlice<'static>,
}

/// A one-device job running a collective for every rank: on a GPU, or on the host
/// emulator (tests).
pub(crate) trait GroupJob: Send {
    /// Runs once on `lent` and waits for it.
    fn run(&mut self, lent: &Lent<'_>) -> Result<(), RuntimeError>;
    /// Sets a scalar input for the next runs.
    fn set(&mut self, name: &str, value: f64) -> Result<(), RuntimeError>;
}

impl GroupJob for EmulatedJob {
    fn run(&mut self, lent: &Lent<'_>) -> Result<(), RuntimeError> {
        self.run_lent(lent)
    }
    fn set(&mut self, name: &str, value: f64) -> Result<(), RuntimeError> {
        set_named(self, name, value)
    }
}

#[cfg(feature = "cuda")]
impl GroupJob for coconet_runtime::cuda::CudaJob {
    fn run(&mut self, lent: &Lent<'_>) -> Result<(), RuntimeError> {
        self.run_lent(lent)
    }
    fn set(&mut self, name: &str, value: f64) -> Result<(), RuntimeError> {
        set_named(self, name, value)
    }
}

fn set_named(job: &mut impl JobData, name: &str, value: f64) -> Result<(), RuntimeError> {
    let id = job.plan().program().find(name).ok_or_else(|| {
        RuntimeError::Plan(format!(
            "a tensor-parallel collective has no scalar `{name}`"
        ))
    })?;
    job.set_scalar_value(id, value)
}

/// Makes the job of a plan (on the group's device).
pub(crate) type Prepare =
    dyn Fn(&Plan, &Bindings) -> Result<Box<dyn GroupJob>, RuntimeError> + Send + Sync;

/// What a rank brings to a collective.
struct Post {
    what: Collective,
    len: usize,
    memory: RankMemory,
    scalars: Vec<(String, f64)>,
}

/// The ranks' meeting point.
struct Board {
    posts: Vec<Option<Post>>,
    /// Each rank's outcome of the last collective it took part in, until it reads it.
    outcomes: Vec<Option<Result<(), String>>>,
    /// Collectives completed.
    round: u64,
    jobs: HashMap<(Collective, usize), Box<dyn GroupJob>>,
}

/// The group of rank threads on one device.
pub(crate) struct DeviceGroup {
    ranks: usize,
    prepare: Box<Prepare>,
    board: Mutex<Board>,
    turn: Condvar,
    /// How long a rank waits for the others at a collective.
    patience: Duration,
}

impl DeviceGroup {
    /// A group of `ranks` ranks whose jobs `prepare` makes; a rank waits at most
    /// `patience` for the others at a collective.
    pub(crate) fn new(ranks: usize, prepare: Box<Prepare>, patience: Duration) -> DeviceGroup {
        DeviceGroup {
            ranks,
            prepare,
            board: Mutex::new(Board {
                posts: (0..ranks).map(|_| None).collect(),
                outcomes: (0..ranks).map(|_| None).collect(),
                round: 0,
                jobs: HashMap::new(),
            }),
            turn: Condvar::new(),
            patience,
        }
    }

    /// Rank `rank`'s part of collective `what` over `len` elements per rank: returns once
    /// every rank's result is written (or the collective failed, for every rank alike).
    pub(crate) fn run(
        &self,
        rank: usize,
        what: Collective,
        len: usize,
        memory: RankMemory,
        scalars: &[(&str, f64)],
    ) -> Result<(), RuntimeError> {
        let mut board = self.board.lock().unwrap_or_else(PoisonError::into_inner);
        board.posts[rank] = Some(Post {
            what,
            len,
            memory,
            scalars: scalars.iter().map(|&(n, v)| (n.to_string(), v)).collect(),
        });
        if board.posts.iter().all(Option::is_some) {
            let posts: Vec<Post> = board.posts.iter_mut().filter_map(Option::take).collect();
            let outcome = self
                .run_all(&mut board.jobs, posts)
                .map_err(|e| e.to_string());
            for o in &mut board.outcomes {
                *o = Some(outcome.clone());
            }
            board.round += 1;
            self.turn.notify_all();
        } else {
            let round = board.round;
            let (b, waited) = self
                .turn
                .wait_timeout_while(board, self.patience, |b| b.round == round)
                .unwrap_or_else(PoisonError::into_inner);
            board = b;
            if waited.timed_out() && board.round == round {
                board.posts[rank] = None;
                let missing: Vec<usize> = (0..self.ranks)
                    .filter(|&r| r != rank && board.posts[r].is_none())
                    .collect();
                return Err(RuntimeError::Plan(format!(
                    "rank {rank} waited {:?} at a tensor-parallel {what:?} for ranks \
                     {missing:?}, which did not come",
                    self.patience
                )));
            }
        }
        match board.outcomes[rank].take() {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(RuntimeError::Plan(e)),
            None => Err(RuntimeError::Plan(
                "internal error, please report it: a collective ended without an outcome".into(),
            )),
        }
    }

    /// Runs every rank's posts as one run of the collective's job.
    fn run_all(
        &self,
        jobs: &mut HashMap<(Collective, usize), Box<dyn GroupJob>>,
        posts: Vec<Post>,
    ) -> Result<(), RuntimeError> {
        let (what, len) = (posts[0].what, posts[0].len);
        if let Some((r, p)) = posts
            .iter()
            .enumerate()
            .find(|(_, p)| (p.what, p.len, &p.scalars) != (what, len, &posts[0].scalars))
        {
            return Err(RuntimeError::Plan(format!(
                "the ranks called different collectives: rank 0 a {what:?} of {len} elements \
                 ({:?}), rank {r} a {:?} of {} ({:?})",
                posts[0].scalars, p.what, p.len, p.scalars
            )));
        }
        let job = match jobs.entry((what, len)) {
            std::collections::hash_map::Entry::Occupied(job) => job.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let (plan, bindings) = collective_plan(what, len, self.ranks, Holds::EveryRank)?;
                slot.insert((self.prepare)(&plan, &bindings)?)
            }
        };
        for (name, value) in &posts[0].scalars {
            job.set(name, *value)?;
        }
        let mut lent = Lent::new();
        for (r, post) in posts.into_iter().enumerate() {
            let RankMemory {
                mine,
                replicated,
                out,
            } = post.memory;
            lent = lent.input(what.operand(), r, mine);
            // The results one after the other, each as long as the first.
            let mut rest = out;
            let each = rest.len() / what.outputs().len();
            for name in what.outputs() {
                let (this, after) = rest.split_at(each).ok_or_else(|| {
                    RuntimeError::Plan(
                        "internal error, please report it: a collective's results do not fit"
                            .into(),
                    )
                })?;
                lent = lent.input(name, r, this);
                rest = after;
            }
            for (name, memory) in what.replicated().iter().zip(replicated) {
                lent = lent.input(name, r, memory);
            }
        }
        job.run(&lent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::TensorParallel;
    use coconet_runtime::Backend;
    use coconet_runtime::cuda::EmulatedCuda;
    use std::sync::Arc;

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

    /// `x` and `y` lent as a collective's operand and result (the caller keeps both
    /// until the collective returns).
    fn sum_memory(x: &mut [f32], y: &mut [f32]) -> RankMemory {
        // SAFETY: the callers keep the vectors alive and unused until the collective
        // returns, which is after its run.
        unsafe {
            RankMemory {
                mine: DeviceSlice::host(x).detach(),
                replicated: vec![],
                out: DeviceSlice::host(y).detach(),
            }
        }
    }

    /// A rank that does not come is named after the others' patience; ranks that call
    /// different collectives are all told so.
    #[test]
    fn a_missing_rank_and_mismatched_calls_are_errors() {
        let group = Arc::new(DeviceGroup::new(
            2,
            Box::new(|plan, bindings| Ok(Box::new(EmulatedCuda.prepare(plan, bindings)?))),
            Duration::from_millis(200),
        ));
        let (mut x, mut y) = (vec![1f32; 4], vec![0f32; 4]);
        let e = group
            .run(0, Collective::Sum, 4, sum_memory(&mut x, &mut y), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 0 waited") && e.contains("[1]"), "{e}");
        let errors: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = [(0, Collective::Sum), (1, Collective::Max)]
                .into_iter()
                .map(|(r, what)| {
                    let group = group.clone();
                    s.spawn(move || {
                        let (mut x, mut y) = (vec![1f32; 4], vec![0f32; 4]);
                        let memory = sum_memory(&mut x, &mut y);
                        group.run(r, what, 4, memory, &[]).unwrap_err().to_string()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for e in errors {
            assert!(e.contains("different collectives"), "{e}");
        }
    }
}
