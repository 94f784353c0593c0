//! The collectives of rank threads whose tensors share one GPU: every rank is a virtual
//! rank of one CUDA job per collective and size (the same programs as over the host:
//! `tp_sum`, `tp_gather`, the fused epilogue...), each rank's device memory lent to it in
//! place — its tensor as the program's operand, the memory for its result as `y` — so no
//! byte goes through the host. The ranks meet at each collective; the last to arrive
//! runs the job for all of them and every rank returns once its result is written.

use super::collective::{Collective, Holds, collective_plan, set_scalar};
use coconet_core::Bindings;
use coconet_runtime::cuda::{DeviceSlice, EmulatedJob, Lent};
use coconet_runtime::{Plan, RuntimeError};
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
    /// Runs once on `lent` and waits for it on the host: the ranks' device memory is not
    /// used after it returns (what orders the run with every rank's stream).
    fn run(&mut self, lent: &Lent<'_>) -> Result<(), RuntimeError>;
    /// Sets a scalar input for the next runs.
    fn set(&mut self, name: &str, value: f64) -> Result<(), RuntimeError>;
}

impl GroupJob for EmulatedJob {
    fn run(&mut self, lent: &Lent<'_>) -> Result<(), RuntimeError> {
        self.run_lent(lent)
    }
    fn set(&mut self, name: &str, value: f64) -> Result<(), RuntimeError> {
        set_scalar(self, name, value)
    }
}

#[cfg(feature = "cuda")]
impl GroupJob for coconet_runtime::cuda::CudaJob {
    fn run(&mut self, lent: &Lent<'_>) -> Result<(), RuntimeError> {
        self.run_lent(lent)
    }
    fn set(&mut self, name: &str, value: f64) -> Result<(), RuntimeError> {
        set_scalar(self, name, value)
    }
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
    /// How many collectives the rank called before this one: ranks meet only at the
    /// same count, so a rank that fell behind can never be paired with another call.
    call: u64,
}

/// The ranks' meeting point.
struct Board {
    posts: Vec<Option<Post>>,
    /// Each rank's outcome of the last collective it took part in, until it reads it.
    outcomes: Vec<Option<Result<(), String>>>,
    /// Collectives completed.
    round: u64,
    /// Collectives each rank has called.
    calls: Vec<u64>,
    /// Why the group can no longer meet (a rank did not come): every later call fails
    /// at once with it.
    broken: Option<String>,
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
                calls: vec![0; ranks],
                broken: None,
                jobs: HashMap::new(),
            }),
            turn: Condvar::new(),
            patience,
        }
    }

    /// Rank `rank`'s part of collective `what` over `len` elements per rank: returns once
    /// every rank's result is written (or the collective failed, for every rank alike).
    /// A rank that does not come within the patience breaks the group: the waiting ranks
    /// and every later call fail, naming it.
    pub(crate) fn run(
        &self,
        rank: usize,
        what: Collective,
        len: usize,
        memory: RankMemory,
        scalars: &[(&str, f64)],
    ) -> Result<(), RuntimeError> {
        let mut board = self.board.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(why) = &board.broken {
            return Err(RuntimeError::Plan(format!(
                "the tensor-parallel group is broken: {why}"
            )));
        }
        if board.posts[rank].is_some() {
            return Err(RuntimeError::Plan(format!(
                "rank {rank} called a tensor-parallel {what:?} while its last collective is \
                 in flight: a rank's collectives are called from one thread"
            )));
        }
        let call = board.calls[rank];
        board.calls[rank] += 1;
        board.posts[rank] = Some(Post {
            what,
            len,
            memory,
            scalars: scalars.iter().map(|&(n, v)| (n.to_string(), v)).collect(),
            call,
        });
        if board.posts.iter().all(Option::is_some) {
            let posts: Vec<Post> = board.posts.iter_mut().filter_map(Option::take).collect();
            // A panic in a job is every rank's failure, not a silent 60 s wait.
            let run = std::panic::AssertUnwindSafe(|| self.run_all(&mut board.jobs, posts));
            let outcome = match std::panic::catch_unwind(run) {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Err("the collective's job panicked".to_string()),
            };
            for o in &mut board.outcomes {
                *o = Some(outcome.clone());
            }
            board.round += 1;
            self.turn.notify_all();
        } else {
            let round = board.round;
            let (b, waited) = self
                .turn
                .wait_timeout_while(board, self.patience, |b| {
                    b.round == round && b.broken.is_none()
                })
                .unwrap_or_else(PoisonError::into_inner);
            board = b;
            if board.round == round {
                board.posts[rank] = None;
                if let Some(why) = &board.broken {
                    return Err(RuntimeError::Plan(format!(
                        "the tensor-parallel group is broken: {why}"
                    )));
                }
                debug_assert!(waited.timed_out());
                let missing: Vec<usize> = (0..self.ranks)
                    .filter(|&r| r != rank && board.posts[r].is_none())
                    .collect();
                let why = format!(
                    "rank {rank} waited {:?} at a tensor-parallel {what:?} for ranks \
                     {missing:?}, which did not come",
                    self.patience
                );
                board.broken = Some(why.clone());
                self.turn.notify_all();
                return Err(RuntimeError::Plan(why));
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

    /// Rank `rank` failed before it could call its collective (`why`): the group is
    /// broken, so the others stop waiting for it and no rank meets the wrong call.
    pub(crate) fn abort(&self, rank: usize, why: &str) {
        let mut board = self.board.lock().unwrap_or_else(PoisonError::into_inner);
        board
            .broken
            .get_or_insert_with(|| format!("rank {rank} failed before its collective: {why}"));
        self.turn.notify_all();
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
            .find(|(_, p)| p.call != posts[0].call)
        {
            return Err(RuntimeError::Plan(format!(
                "the ranks are at different collectives: rank 0 at its call {}, rank {r} at \
                 its call {} (a rank went on after a collective failed)",
                posts[0].call, p.call
            )));
        }
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
    use coconet_runtime::Backend;
    use coconet_runtime::cuda::EmulatedCuda;
    use std::sync::Arc;

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
        // Broken: every later call fails at once, naming why.
        let e = group
            .run(1, Collective::Sum, 4, sum_memory(&mut x, &mut y), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("broken") && e.contains("rank 0 waited"), "{e}");
        let group = Arc::new(DeviceGroup::new(
            2,
            Box::new(|plan, bindings| Ok(Box::new(EmulatedCuda.prepare(plan, bindings)?))),
            Duration::from_secs(30),
        ));
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
        // A rank that fails before its call breaks the group: its peer is told at once.
        let group = Arc::new(DeviceGroup::new(
            2,
            Box::new(|plan, bindings| Ok(Box::new(EmulatedCuda.prepare(plan, bindings)?))),
            Duration::from_secs(30),
        ));
        let e = std::thread::scope(|s| {
            let waiting = s.spawn(|| {
                let (mut x, mut y) = (vec![1f32; 4], vec![0f32; 4]);
                let memory = sum_memory(&mut x, &mut y);
                group.run(0, Collective::Sum, 4, memory, &[])
            });
            std::thread::sleep(Duration::from_millis(50));
            group.abort(1, "out of device memory");
            waiting.join().unwrap().unwrap_err().to_string()
        });
        assert!(
            e.contains("rank 1 failed") && e.contains("out of device memory"),
            "{e}"
        );
    }
}
