//! Ranks with separate memories on the host [`Emulator`]: one emulated device and one
//! [`RankJob`](crate::RankJob) per rank thread, exchanging bytes through in-process
//! [`Mailboxes`]. It runs the multi-process path (staging, exchanges, phases) exactly as
//! it runs with NCCL between GPUs, so that path is tested against the reference
//! interpreter without a GPU.

use crate::backends::with_access::AccessChoice;
use crate::devices::emulator::Emulator;
use crate::executors::rank_job::PeerAccess;
use crate::executors::rank_threads::ThreadRanksJob;
use crate::lent::Lent;
use crate::transports::mailboxes::{MAILBOX_TIMEOUT, Mailbox, Mailboxes};
use coconet_core::Bindings;
use coconet_plan::RuntimeError;
use coconet_plan::plan::Plan;
use std::time::Duration;

/// The CUDA backend's multi-process path on the host [`Emulator`]: every rank a thread
/// with its own emulated device and memory, exchanging through in-process mailboxes — as
/// processes with one GPU each do through NCCL.
///
/// ```no_run
/// use coconet_core::*;
/// use coconet_cuda::EmulatedRanks;
/// use coconet_plan::{Backend, JobData, Plan};
/// # fn main() -> Result<(), coconet_plan::RuntimeError> {
/// let mut b = ProgramBuilder::new("sum");
/// let x = b.tensor_input("x", DType::F32, Layout::Local, Shape::new(vec![Dim::sym("N")]), 0).unwrap();
/// let y = b.all_reduce(ReduceOp::Sum, x).unwrap();
/// let p = b.finish();
/// let args = Bindings::new()
///     .dim("N", 3)
///     .tensor("x", Binding::per_rank(&[vec![1.0f32, 2.0, 3.0], vec![10.0, 20.0, 30.0]]));
/// let plan = Plan::lower(&Schedule::new(&p), 2, args.dims())?;
/// let backend = EmulatedRanks::default();
/// let mut job = backend.prepare(&plan, &args)?;
/// backend.run(&mut job)?;
/// assert_eq!(job.local::<f32>(y, 1), Some(vec![11.0, 22.0, 33.0]));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct EmulatedRanks {
    /// How long a rank waits for a peer before reporting it.
    pub timeout: Duration,
    /// How kernels reach peers' memory: exchanged (tests cut small phases too, with a
    /// small `chunk_bytes`, so the pipelined order is checked on every example), or
    /// mapped (emulated devices share the host's address space).
    pub access: PeerAccess,
}

impl Default for EmulatedRanks {
    fn default() -> Self {
        EmulatedRanks {
            timeout: MAILBOX_TIMEOUT,
            access: PeerAccess::default(),
        }
    }
}

/// A plan prepared on [`EmulatedRanks`]: each rank's emulated device and job.
pub type EmulatedRanksJob = ThreadRanksJob<Emulator>;

impl EmulatedRanks {
    /// Runs once with `lent` standing for the ranks' buffers (each rank takes its own
    /// entries: host slices standing for its device memory) and waits for every rank.
    pub fn run_lent(
        &self,
        job: &mut EmulatedRanksJob,
        lent: &Lent<'_>,
    ) -> Result<(), RuntimeError> {
        let boxes = Mailboxes::new(self.timeout);
        let mailboxes: Vec<Mailbox> = (0..job.ranks.len()).map(|r| boxes.rank(r)).collect();
        job.run_lent(&mailboxes, &|r, why| boxes.fail(r, why), lent)
    }
}

impl coconet_plan::Backend for EmulatedRanks {
    type Job = EmulatedRanksJob;

    fn prepare(&self, plan: &Plan, bindings: &Bindings) -> Result<EmulatedRanksJob, RuntimeError> {
        self.prepare_with(plan, bindings, self.access)
    }

    fn run(&self, job: &mut EmulatedRanksJob) -> Result<(), RuntimeError> {
        self.run_lent(job, &Lent::new())
    }
}

impl AccessChoice for EmulatedRanks {
    fn prepare_with(
        &self,
        plan: &Plan,
        bindings: &Bindings,
        access: PeerAccess,
    ) -> Result<EmulatedRanksJob, RuntimeError> {
        // Small grids, so grid-stride loops wrap.
        ThreadRanksJob::prepare(plan, bindings, access, Some(2), |_, program| {
            Emulator::new(program)
        })
    }

    /// Emulated devices share the host's address space.
    fn can_map(&self) -> bool {
        true
    }
}
