//! A multi-process job in one test process: P threads, each acting as one process with
//! its own `ProcessJob` over real TCP connections on loopback (rendezvous through a real
//! store), exposed as a `Backend` so that the backend suite and failure tests run the
//! process executor exactly as `coconet-launch` ranks do, without starting processes.

use coconet::prelude::*;
use coconet::runtime::cpu::{DataPath, Fault, ProcessJob, Tcp, Transport};
use coconet::runtime::launch::{JobSecret, Store, StoreServer};
use coconet::runtime::{Backend, JobData, Plan, RuntimeError};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The job secret of every loopback job (store, data ports, parameter servers) of this
/// test process.
pub fn secret() -> &'static JobSecret {
    static SECRET: OnceLock<JobSecret> = OnceLock::new();
    SECRET.get_or_init(|| JobSecret::generate().expect("a job secret"))
}

/// The store every loopback job of this test process meets at.
pub fn store_addr() -> std::net::SocketAddr {
    static SERVER: OnceLock<StoreServer> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            StoreServer::bind("127.0.0.1:0", secret().clone()).expect("a store on loopback")
        })
        .local_addr()
}

/// A fresh group name per job.
pub fn group_name() -> String {
    static GROUPS: AtomicUsize = AtomicUsize::new(0);
    format!("loopback-{}", GROUPS.fetch_add(1, Ordering::Relaxed))
}

/// Connects rank `rank` of `ranks` to group `name` on the test store (single copy).
pub fn connect(rank: usize, ranks: usize, name: &str) -> Result<Tcp, RuntimeError> {
    connect_on(rank, ranks, name, DataPath::SingleCopy)
}

/// [`connect`] moving data on `path`.
pub fn connect_on(
    rank: usize,
    ranks: usize,
    name: &str,
    path: DataPath,
) -> Result<Tcp, RuntimeError> {
    let mut store = Store::connect(store_addr(), secret(), Duration::from_secs(10)).expect("store");
    Tcp::connect_with(&mut store, rank, ranks, name, Duration::from_secs(10), path)
}

/// The process executor over TCP, one thread per process.
#[derive(Default)]
pub struct Loopback {
    /// A failure injected into every process's job.
    pub fault: Option<Fault>,
    /// Each process's collective deadline (default: the transport's).
    pub timeout: Option<Duration>,
    /// Kernel chunks per round of a fused pass (default: the transport's).
    pub round_chunks: Option<usize>,
    /// How the connections move data (default: the job's buffers in shared memory,
    /// this host allowing).
    pub path: Option<DataPath>,
    /// A rank that asks for the stream path whatever `path` says: its connections take
    /// the stream, the others' connections among themselves copy once (a mixed group,
    /// as processes on two hosts make).
    pub stream_rank: Option<usize>,
}

/// Every process's job of one loopback run (over TCP, or over another transport).
pub struct LoopbackJob<L: Transport = Tcp> {
    /// The plan every process runs.
    pub plan: Plan,
    /// The processes' jobs, in rank order.
    pub jobs: Vec<ProcessJob<L>>,
}

/// Runs `f(rank)` on one thread per rank; the results in rank order.
pub fn per_process<T: Send>(ranks: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = (0..ranks).map(|r| s.spawn(move || f(r))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a process thread panicked"))
            .collect()
    })
}

impl Backend for Loopback {
    type Job = LoopbackJob;

    fn prepare(&self, plan: &Plan, bindings: &Bindings) -> Result<LoopbackJob, RuntimeError> {
        let name = group_name();
        let jobs = per_process(plan.ranks(), |r| {
            let path = if self.stream_rank == Some(r) {
                DataPath::Stream
            } else {
                self.path.unwrap_or(DataPath::SharedMemory)
            };
            let mut tcp = connect_on(r, plan.ranks(), &name, path)?;
            if let Some(t) = self.timeout {
                tcp.set_timeout(t);
            }
            let mut job = ProcessJob::new(plan, bindings, tcp)?;
            job.inject_fault(self.fault);
            if let Some(c) = self.round_chunks {
                job.set_round_chunks(c);
            }
            Ok(job)
        });
        Ok(LoopbackJob {
            plan: plan.clone(),
            jobs: jobs.into_iter().collect::<Result<_, RuntimeError>>()?,
        })
    }

    fn run(&self, job: &mut LoopbackJob) -> Result<(), RuntimeError> {
        let results = run_all(job);
        results.into_iter().collect()
    }
}

/// Runs every process's job once; each process's result.
pub fn run_all<L: Transport + Send>(job: &mut LoopbackJob<L>) -> Vec<Result<(), RuntimeError>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = job.jobs.iter_mut().map(|j| s.spawn(|| j.run())).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a process thread panicked"))
            .collect()
    })
}

impl<L: Transport> JobData for LoopbackJob<L> {
    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn rank_value(
        &self,
        v: coconet::core::ValueId,
        rank: usize,
    ) -> Result<Option<Vec<f64>>, RuntimeError> {
        self.jobs[rank].rank_value(v, rank)
    }

    fn write_rank_bytes(
        &mut self,
        name: &str,
        rank: usize,
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        self.jobs[rank].write_rank_bytes(name, rank, bytes)
    }

    fn set_scalar_value(
        &mut self,
        id: coconet::core::ValueId,
        value: f64,
    ) -> Result<(), RuntimeError> {
        self.jobs
            .iter_mut()
            .try_for_each(|j| j.set_scalar_value(id, value))
    }
}
