//! Persistent rank threads: started once per job, woken for every run.
//!
//! A training loop runs the same job every iteration; spawning P threads per run cost
//! more than the whole step at small sizes. The pool keeps ranks 1..P parked on a
//! condition variable between runs and runs rank 0 on the caller's thread, so a run costs
//! one wake-up and one completion signal per worker.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// The work of one run: called once per rank with the rank's index. It must not panic
/// out (the caller wraps each rank's body in `catch_unwind`), and it must stay valid until
/// [`Pool::run`] returns.
type Task = dyn Fn(usize) + Sync;

/// A lifetime-erased pointer to the current run's task. Only dereferenced between the
/// moment [`Pool::run`] publishes it and the moment the worker reports done, during which
/// `run` is blocked waiting and so keeps the task alive.
#[derive(Clone, Copy)]
struct TaskPtr(*const Task);

// SAFETY: the pointee is `Sync` and outlives every dereference (see above).
unsafe impl Send for TaskPtr {}

struct State {
    /// Bumped for every run; a worker runs the task once per generation.
    generation: u64,
    task: Option<TaskPtr>,
    /// Workers that finished the current generation.
    done: usize,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    start: Condvar,
    finished: Condvar,
    /// `State::done`, readable without the lock (written under it): the caller watches
    /// it before blocking, as the workers finish within microseconds of each other.
    done: AtomicUsize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update under the lock is a plain assignment: a poisoned lock is valid.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// P − 1 parked worker threads (ranks 1..P); rank 0 runs on the caller.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Rank 0's CPU, where ranks are bound: the caller's thread is bound to it for the
    /// length of each run.
    caller_cpu: Option<usize>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} workers)", self.workers.len())
    }
}

impl Pool {
    /// Starts the workers of a `ranks`-rank job (an error names the rank whose thread
    /// could not be started), each bound to its own CPU in turn where `bind` (see
    /// [`super::affinity`]; rank 0 is the caller's thread, bound only during runs).
    pub(crate) fn new(ranks: usize, bind: bool) -> Result<Pool, String> {
        let cpus = if bind {
            super::affinity::assign(ranks.max(1))
        } else {
            None
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                generation: 0,
                task: None,
                done: 0,
                shutdown: false,
            }),
            start: Condvar::new(),
            finished: Condvar::new(),
            done: AtomicUsize::new(0),
        });
        let mut pool = Pool {
            shared,
            workers: Vec::new(),
            // (A one-rank job has no worker to keep apart from.)
            caller_cpu: cpus.as_ref().filter(|_| ranks > 1).map(|c| c[0]),
        };
        for rank in 1..ranks.max(1) {
            let shared = Arc::clone(&pool.shared);
            let cpu = cpus.as_ref().map(|c| c[rank]);
            let handle = std::thread::Builder::new()
                .name(format!("coconet-rank-{rank}"))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        super::affinity::bind(cpu);
                    }
                    worker(&shared, rank)
                })
                .map_err(|e| format!("could not start the thread of rank {rank}: {e}"))?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Runs `task(rank)` for every rank concurrently and returns when all have returned.
    pub(crate) fn run<'a>(&self, task: &'a (dyn Fn(usize) + Sync + 'a)) {
        // SAFETY: erases the borrow's lifetime; workers dereference the pointer only
        // until they report done, and this function waits for all of them below.
        let erased: *const Task =
            unsafe { std::mem::transmute::<&'a (dyn Fn(usize) + Sync + 'a), &'static Task>(task) };
        {
            let mut s = self.shared.lock();
            s.task = Some(TaskPtr(erased));
            s.done = 0;
            self.shared.done.store(0, Ordering::Release);
            s.generation += 1;
        }
        self.shared.start.notify_all();
        // Rank 0's panic must not unwind past the workers still using the task.
        let first =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match self.caller_cpu {
                Some(cpu) => super::affinity::bound_while(cpu, || task(0)),
                None => task(0),
            }));
        let workers = self.workers.len();
        super::sync::watch(|| self.shared.done.load(Ordering::Acquire) >= workers);
        let mut s = self.shared.lock();
        while s.done < self.workers.len() {
            s = self
                .shared
                .finished
                .wait(s)
                .unwrap_or_else(|e| e.into_inner());
        }
        s.task = None;
        drop(s);
        if let Err(panic) = first {
            std::panic::resume_unwind(panic);
        }
    }
}

fn worker(shared: &Shared, rank: usize) {
    let mut seen = 0;
    loop {
        let task = {
            let mut s = shared.lock();
            while s.generation == seen && !s.shutdown {
                s = shared.start.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            if s.shutdown {
                return;
            }
            seen = s.generation;
            s.task
        };
        if let Some(TaskPtr(task)) = task {
            // SAFETY: `Pool::run` keeps the task alive until this worker reports done.
            let task = unsafe { &*task };
            // The task catches its own panics; this guard only keeps the pool alive
            // (and `run` from waiting forever) if one escapes anyway.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task(rank)));
        }
        let mut s = shared.lock();
        s.done += 1;
        shared.done.store(s.done, Ordering::Release);
        drop(s);
        shared.finished.notify_all();
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.start.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_rank_runs_once_per_run_and_threads_are_reused() {
        let pool = Pool::new(4, true).unwrap();
        let hits: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
        let names = Mutex::new(std::collections::BTreeSet::new());
        for _ in 0..100 {
            pool.run(&|r| {
                hits[r].fetch_add(1, Ordering::SeqCst);
                names
                    .lock()
                    .unwrap()
                    .insert(format!("{:?}", std::thread::current().id()));
            });
        }
        assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) == 100));
        // The caller plus three workers: no thread was spawned per run.
        assert_eq!(names.lock().unwrap().len(), 4);
    }

    #[test]
    fn a_panicking_task_does_not_stop_the_pool() {
        let pool = Pool::new(3, false).unwrap();
        pool.run(&|r| {
            if r == 2 {
                panic!("boom")
            }
        });
        let count = AtomicUsize::new(0);
        pool.run(&|_| {
            count.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(count.load(Ordering::SeqCst), 3);
    }
}
