//! Ranks that are threads of one process, each with its own device and memory: emulated
//! devices exchanging through mailboxes ([`EmulatedRanks`](crate::EmulatedRanks)), or
//! GPUs exchanging through NCCL (`MultiGpu`, cargo feature `cuda`). Both run every rank's
//! [`RankJob`] on its own thread and report the first rank's own failure.

use crate::codegen::CudaProgram;
use crate::devices::Device;
use crate::executors::rank_job::{PeerAccess, PeerTransport, RankJob};
use crate::executors::reads::DeviceData;
use crate::lent::{DeviceSlice, Lent, Memory};
use coconet_core::{Bindings, ValueId};
use coconet_plan::RuntimeError;
use coconet_plan::backend::JobData;
use coconet_plan::plan::{BufferRef, Plan};

/// A plan prepared on ranks that are threads of this process: every rank's device and
/// job.
pub struct ThreadRanksJob<D: Device> {
    pub(crate) ranks: Vec<(D, RankJob<D>)>,
}

impl<D: Device> JobData for ThreadRanksJob<D> {
    fn plan(&self) -> &Plan {
        self.ranks[0].1.plan()
    }

    fn rank_value(&self, v: ValueId, rank: usize) -> Result<Option<Vec<f64>>, RuntimeError> {
        match self.ranks.get(rank) {
            Some((device, job)) => job.values(device, v),
            None => Ok(None),
        }
    }

    fn write_rank_bytes(
        &mut self,
        name: &str,
        rank: usize,
        bytes: &[u8],
    ) -> Result<(), RuntimeError> {
        let (device, job) = self
            .ranks
            .get_mut(rank)
            .ok_or_else(|| RuntimeError::Read(format!("there is no rank {rank}")))?;
        job.write_input(device, name, bytes)
    }

    fn set_scalar_value(&mut self, id: ValueId, value: f64) -> Result<(), RuntimeError> {
        for (_, job) in &mut self.ranks {
            job.set_scalar(id, value);
        }
        Ok(())
    }
}

impl<D: Device> DeviceData for ThreadRanksJob<D> {
    fn rank_memory(&self, rank: usize) -> Result<Memory, RuntimeError> {
        match self.ranks.get(rank) {
            Some((device, _)) => Ok(device.memory()),
            None => Err(RuntimeError::Read(crate::lent::no_such_rank(
                rank,
                self.ranks.len(),
            ))),
        }
    }

    fn read_rank_bytes(&self, v: ValueId, rank: usize, out: &mut [u8]) -> Result<(), RuntimeError> {
        let (device, job) = &self.ranks[rank];
        job.read_bytes(device, v, out)
    }

    fn copy_rank_to(
        &self,
        v: ValueId,
        rank: usize,
        dst: &DeviceSlice<'_>,
    ) -> Result<(), RuntimeError> {
        let (device, job) = &self.ranks[rank];
        job.copy_to(device, v, dst)
    }
}

impl<D: Device> ThreadRanksJob<D> {
    /// Every rank of `plan` on its own device (`device(rank, &program)`), bound to
    /// `bindings`. With [`PeerAccess::Mapped`] every rank's buffers are mapped into every
    /// other's at their device address, which must mean the same in every rank's space
    /// (one host, or GPUs of one process with unified addressing).
    pub(crate) fn prepare(
        plan: &Plan,
        bindings: &Bindings,
        access: PeerAccess,
        grid: Option<u32>,
        device: impl Fn(usize, &CudaProgram) -> Result<D, RuntimeError>,
    ) -> Result<ThreadRanksJob<D>, RuntimeError> {
        let program = CudaProgram::generate(plan)?;
        let ranks = (0..plan.ranks())
            .map(|r| {
                let device = device(r, &program)?;
                let job = RankJob::new(&device, plan, program.clone(), bindings, r, grid, access)?;
                Ok((device, job))
            })
            .collect::<Result<Vec<_>, RuntimeError>>()?;
        let mut job = ThreadRanksJob { ranks };
        if access == PeerAccess::Mapped {
            job.map_every_peer();
        }
        Ok(job)
    }

    /// Makes later runs queue every rank's launches as graphs (`on`), or one by one
    /// (see [`PreparedJob::use_graph`](crate::PreparedJob::use_graph)).
    pub fn use_graph(&mut self, on: bool) {
        for (_, job) in &mut self.ranks {
            job.use_graph(on);
        }
    }

    /// What rank `rank`'s graphs have cost so far (`None` without graphs, or no such
    /// rank).
    pub fn graph_stats(&self, rank: usize) -> Option<crate::GraphStats> {
        self.ranks.get(rank).and_then(|(_, job)| job.graph_stats())
    }

    fn map_every_peer(&mut self) {
        let table: Vec<(usize, BufferRef, u64)> = self
            .ranks
            .iter()
            .enumerate()
            .flat_map(|(r, (device, job))| {
                job.own_buffers()
                    .map(|(b, buf)| (r, b, device.address(buf)))
                    .collect::<Vec<_>>()
            })
            .collect();
        for (me, (_, job)) in self.ranks.iter_mut().enumerate() {
            for &(r, b, a) in table.iter().filter(|t| t.0 != me) {
                job.map_peer(r, b, a);
            }
        }
    }

    /// Runs every rank on its own thread, rank `r` exchanging through `transports[r]`,
    /// with `lent` standing for the ranks' buffers (each rank takes its own entries), and
    /// waits for every rank's work. When a rank fails, `fail(rank, why)` is called at
    /// once so that its peers stop waiting for it. Returns the first failing rank's own
    /// error (not its peers' reports of it).
    pub(crate) fn run_lent<T>(
        &mut self,
        transports: &[T],
        fail: &(dyn Fn(usize, &str) + Sync),
        lent: &Lent<'_>,
    ) -> Result<(), RuntimeError>
    where
        D: Send,
        D::Buffer: Send,
        T: PeerTransport<D> + Sync,
    {
        let ranks = self.ranks.len();
        if let Some(e) = lent.entries.iter().find(|e| e.rank >= ranks) {
            return Err(RuntimeError::Lend(format!(
                "`{}` on rank {}: {}",
                e.input,
                e.rank,
                crate::lent::no_such_rank(e.rank, ranks)
            )));
        }
        // The rank that failed first: its peers' errors are consequences.
        let first = std::sync::Mutex::new(None::<usize>);
        let results: Vec<Result<(), RuntimeError>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .ranks
                .iter_mut()
                .zip(transports)
                .enumerate()
                .map(|(r, ((device, job), transport))| {
                    let first = &first;
                    s.spawn(move || {
                        let run = std::panic::AssertUnwindSafe(|| {
                            let done = job.run_lent(device, transport, lent, None)?;
                            job.wait(device, &done)
                        });
                        let out = std::panic::catch_unwind(run).unwrap_or_else(|_| {
                            Err(RuntimeError::Plan("the rank's thread panicked".into()))
                        });
                        if let Err(e) = &out {
                            let mut f = first.lock().unwrap_or_else(|e| e.into_inner());
                            f.get_or_insert(r);
                            drop(f);
                            fail(r, &e.to_string());
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rank threads catch their panics"))
                .collect()
        });
        let first = first.into_inner().unwrap_or_else(|e| e.into_inner());
        match first {
            None => Ok(()),
            Some(r) => {
                let why = match &results[r] {
                    Err(RuntimeError::RankFailed { rank, message }) if *rank == r => {
                        message.clone()
                    }
                    Err(e) => e.to_string(),
                    Ok(()) => unreachable!("rank {r} reported a failure"),
                };
                Err(RuntimeError::RankFailed {
                    rank: r,
                    message: why,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::emulator::Emulator;
    use crate::executors::rank_job::PeerTransfer;
    use crate::{EmulatedRanks, Mailbox, Mailboxes};
    use coconet_core::*;
    use coconet_plan::{Backend, Plan};
    use std::time::{Duration, Instant};

    /// Mailboxes, except that rank `broken`'s exchanges fail.
    struct Flaky {
        mail: Mailbox,
        broken: bool,
    }

    impl PeerTransport<Emulator> for Flaky {
        fn exchange(
            &self,
            device: &Emulator,
            sends: &[PeerTransfer],
            recvs: &[PeerTransfer],
            at: &str,
        ) -> Result<(), RuntimeError> {
            if self.broken {
                return Err(RuntimeError::Device(format!("{at}: the link is down")));
            }
            self.mail.exchange(device, sends, recvs, at)
        }

        fn barrier(
            &self,
            device: &Emulator,
            scratch: u64,
            world: usize,
            at: &str,
        ) -> Result<(), RuntimeError> {
            self.mail.barrier(device, scratch, world, at)
        }
    }

    #[test]
    fn the_first_failing_rank_is_named_and_its_peers_stop_waiting() {
        let mut b = ProgramBuilder::new("sum");
        let n = Shape::new(vec![Dim::sym("N")]);
        let x = b
            .tensor_input("x", DType::F32, Layout::Local, n, 0)
            .unwrap();
        b.all_reduce(ReduceOp::Sum, x).unwrap();
        let p = b.finish();
        let args = Bindings::new()
            .dim("N", 64)
            .tensor("x", Binding::per_rank(&vec![vec![1.0f32; 64]; 4]));
        let plan = Plan::lower(&Schedule::new(&p), 4, args.dims()).unwrap();
        let mut job = EmulatedRanks::default().prepare(&plan, &args).unwrap();
        // Peers would wait ten minutes for rank 2 without the failure notice.
        let boxes = Mailboxes::new(Duration::from_secs(600));
        let transports: Vec<Flaky> = (0..4)
            .map(|r| Flaky {
                mail: boxes.rank(r),
                broken: r == 2,
            })
            .collect();
        let start = Instant::now();
        let e = job
            .run_lent(&transports, &|r, why| boxes.fail(r, why), &Lent::new())
            .unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(60));
        let RuntimeError::RankFailed { rank, message } = e else {
            panic!("{e}")
        };
        assert_eq!(rank, 2);
        assert!(message.contains("the link is down"), "{message}");
    }
}
