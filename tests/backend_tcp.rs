//! The backend suite on the process executor over TCP (each rank a "process" with its
//! own job and connections, as under `coconet-launch`; here threads of one test process
//! on loopback), bitwise against the reference interpreter.

use coconet_example_programs::{
    adam as adam_program, data, lamb as lamb_program, sgd as sgd_program,
};
use coconet_test_support::loopback;

coconet_backend_suite::backend_suite!(loopback::Loopback::default(), [1, 2, 3, 4]);

/// The same suite with every byte in messages copied once (`COCONET_TCP_DATA=single-copy`:
/// no shared memory).
mod single_copy {
    coconet_backend_suite::backend_suite!(
        super::loopback::Loopback {
            path: Some(coconet::runtime::cpu::DataPath::SingleCopy),
            ..Default::default()
        },
        [2, 4]
    );
}

/// The same suite with every byte through the sockets (the path between hosts).
mod stream {
    coconet_backend_suite::backend_suite!(
        super::loopback::Loopback {
            path: Some(coconet::runtime::cpu::DataPath::Stream),
            ..Default::default()
        },
        [2, 3]
    );
}

/// A mixed group: rank 0's connections on the stream path, the others copying once
/// between themselves (processes on two hosts), collectives spanning both paths.
mod mixed {
    coconet_backend_suite::backend_suite!(
        super::loopback::Loopback {
            stream_rank: Some(0),
            ..Default::default()
        },
        [3, 4]
    );
}

/// The same suite with each rank on a thread of its own over [`Threads`](
/// coconet::runtime::cpu::Threads): every rank runs its own `ProcessJob`, the buffers in
/// one region the threads share.
mod threads {
    coconet_backend_suite::backend_suite!(super::thread_ranks::ThreadRanks, [1, 2, 3, 4]);
}

/// A rank thread that leaves its group while a peer waits for it is named at once.
#[test]
fn a_rank_thread_that_leaves_fails_its_peer_naming_it() {
    use coconet::runtime::cpu::{ProcessJob, Threads};
    let (bindings, plan) = sgd_on_two_ranks(64);
    let mut links = Threads::group(2);
    drop(links.pop());
    let start = std::time::Instant::now();
    let e = ProcessJob::new(&plan, &bindings, links.pop().unwrap())
        .err()
        .expect("rank 1 is gone");
    assert!(start.elapsed() < std::time::Duration::from_secs(5), "{e}");
    assert!(
        e.to_string().contains("rank 1") && e.to_string().contains("left the group"),
        "{e}"
    );
}

mod thread_ranks {
    use super::loopback::{LoopbackJob, per_process, run_all};
    use coconet::prelude::Bindings;
    use coconet::runtime::cpu::{ProcessJob, Threads};
    use coconet::runtime::{Backend, Plan, RuntimeError};
    use std::sync::Mutex;

    /// One thread per rank, each with its own job over the group's link.
    pub struct ThreadRanks;

    impl Backend for ThreadRanks {
        type Job = LoopbackJob<Threads>;

        fn prepare(
            &self,
            plan: &Plan,
            bindings: &Bindings,
        ) -> Result<LoopbackJob<Threads>, RuntimeError> {
            let links: Vec<Mutex<Option<Threads>>> = Threads::group(plan.ranks())
                .into_iter()
                .map(|l| Mutex::new(Some(l)))
                .collect();
            let jobs = per_process(plan.ranks(), |r| {
                let link = links[r].lock().unwrap().take().unwrap();
                ProcessJob::new(plan, bindings, link)
            });
            Ok(LoopbackJob {
                plan: plan.clone(),
                jobs: jobs.into_iter().collect::<Result<_, _>>()?,
            })
        }

        fn run(&self, job: &mut LoopbackJob<Threads>) -> Result<(), RuntimeError> {
            run_all(job).into_iter().collect()
        }
    }
}

/// Processes on one Linux host read each other's memory: every connection of a loopback
/// group takes the single-copy path (the suite above runs on it), and none when the
/// stream is asked for.
#[test]
fn connections_on_one_host_copy_once() {
    use coconet::runtime::cpu::DataPath;
    for (path, single) in [(DataPath::SingleCopy, true), (DataPath::Stream, false)] {
        let name = loopback::group_name();
        let links = loopback::per_process(3, |r| loopback::connect_on(r, 3, &name, path).unwrap());
        assert!(
            links.iter().all(|l| l.single_copy() == single),
            "{path:?}: not every connection on the expected path"
        );
    }
}

/// Jobs whose processes are all on one host put their buffers in shared memory by
/// default, and keep them to themselves on the single-copy and stream paths or when one
/// process of the group is on the stream path.
#[test]
fn jobs_on_one_host_share_memory_by_default() {
    use coconet::runtime::Backend;
    use coconet::runtime::cpu::DataPath;
    let p = sgd_program::sgd();
    let n = 1000;
    let args = Bindings::new()
        .dim("N", n)
        .tensor(
            "g",
            Binding::per_rank(&(0..3).map(|r| data::uniform_f32(r, n)).collect::<Vec<_>>()),
        )
        .tensor("w", Binding::global(&data::uniform_f32(7, n)))
        .scalar("lr", 0.1f32);
    let plan = coconet::runtime::Plan::lower(&Schedule::new(p.program()), 3, args.dims()).unwrap();
    for (path, stream_rank, shares) in [
        (None, None, true),
        (Some(DataPath::SingleCopy), None, false),
        (Some(DataPath::Stream), None, false),
        (None, Some(1), false),
    ] {
        let backend = loopback::Loopback {
            path,
            stream_rank,
            ..Default::default()
        };
        let job = backend.prepare(&plan, &args).unwrap();
        assert!(
            job.jobs.iter().all(|j| j.shares_memory() == shares),
            "{path:?}, stream rank {stream_rank:?}: shares memory should be {shares}"
        );
    }
}

/// Failures: a process that stops, panics, stalls or disagrees fails every process of
/// the job with an error (never `Ok`, never a hang), and a failed job refuses reads.
mod failures {
    use super::loopback::{self, Loopback};
    use super::{adam_program, data};
    use coconet::core::schedule::candidates;
    use coconet::prelude::*;
    use coconet::runtime::cpu::Fault;
    use coconet::runtime::{Backend, JobData, Plan, RuntimeError};
    use std::time::Duration;

    const RANKS: usize = 3;

    /// Adam's fused schedule (and every other) with its bindings.
    fn adam(n: usize) -> (Vec<Plan>, Bindings) {
        let p = adam_program::adam();
        let grads: Vec<Vec<f32>> = (0..RANKS).map(|r| data::uniform_f32(r as u64, n)).collect();
        let hp = adam_program::AdamParams {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            step: 1,
        };
        let zeros = vec![0.0f32; n];
        let args: Bindings =
            adam_program::adam_args(&grads, &data::uniform_f32(9, n), &zeros, &zeros, hp).into();
        let plans = candidates(p.program(), &[p.m.id(), p.v.id()])
            .iter()
            .map(|s| Plan::lower(s, RANKS, args.dims()).unwrap())
            .collect();
        (plans, args)
    }

    fn show(results: &[Result<(), RuntimeError>]) -> String {
        results
            .iter()
            .enumerate()
            .map(|(r, e)| format!("\n  rank {r}: {e:?}"))
            .collect()
    }

    #[test]
    fn a_process_that_stops_at_any_step_fails_every_process() {
        let (plans, args) = adam(1001);
        for plan in &plans {
            for step in 0..plan.steps().len() {
                let backend = Loopback {
                    fault: Some(Fault::Vanish { rank: 2, step }),
                    timeout: Some(Duration::from_secs(20)),
                    ..Default::default()
                };
                let mut job = backend.prepare(plan, &args).unwrap();
                let results = loopback::run_all(&mut job);
                let what = format!("{} stopping before step {step}", plan.schedule().name());
                assert!(
                    results.iter().all(Result::is_err),
                    "{what}:{}",
                    show(&results)
                );
                // Every process names the one that stopped (no timeout: the stop is
                // noticed from the messages, and the culprit is published to all).
                assert!(
                    results
                        .iter()
                        .all(|r| matches!(r, Err(RuntimeError::RankFailed { rank: 2, .. }))),
                    "{what}:{}",
                    show(&results)
                );
                // The trained state of a failed job is not handed out.
                assert!(job.final_input::<f32>("w").is_err(), "{what}");
                assert!(
                    job.jobs[0].run().is_err(),
                    "{what}: a failed job runs again"
                );
            }
        }
    }

    #[test]
    fn a_panicking_process_fails_every_process_naming_it() {
        let (plans, args) = adam(1001);
        for plan in &plans {
            let backend = Loopback {
                fault: Some(Fault::Panic { rank: 1, step: 1 }),
                timeout: Some(Duration::from_secs(20)),
                ..Default::default()
            };
            let mut job = backend.prepare(plan, &args).unwrap();
            let results = loopback::run_all(&mut job);
            let what = plan.schedule().name();
            assert!(
                results
                    .iter()
                    .all(|r| matches!(r, Err(RuntimeError::RankFailed { rank: 1, .. }))),
                "{what}:{}",
                show(&results)
            );
            let own = results[1].as_ref().unwrap_err().to_string();
            assert!(own.contains("injected fault"), "{what}: {own}");
        }
    }

    /// A process that stops answering (here: sleeps through its peers' deadline) times
    /// them out naming it; it then finds its connections closed.
    #[test]
    fn a_stalled_process_times_the_others_out() {
        let (plans, args) = adam(1001);
        let plan = plans.last().unwrap();
        let backend = Loopback {
            fault: Some(Fault::Stall { rank: 0, step: 1 }),
            timeout: Some(Duration::from_millis(300)),
            ..Default::default()
        };
        let mut job = backend.prepare(plan, &args).unwrap();
        let results = loopback::run_all(&mut job);
        assert!(results.iter().all(Result::is_err), "{}", show(&results));
        for r in &results[1..] {
            assert!(
                matches!(r, Err(RuntimeError::Timeout { missing, .. }) if missing == &[0])
                    || matches!(r, Err(RuntimeError::RankFailed { rank: 0, .. })),
                "{}",
                show(&results)
            );
        }
    }

    /// Processes given different hyperparameters fail the run naming the first that
    /// differs, before anything is updated; the job stays usable once they agree.
    #[test]
    fn processes_with_different_scalars_fail_the_run_before_any_update() {
        let (plans, args) = adam(1001);
        let plan = plans.last().unwrap();
        let mut job = Loopback::default().prepare(plan, &args).unwrap();
        let w0: Vec<Vec<f32>> = (0..RANKS)
            .map(|r| job.final_input_local("w", r).unwrap())
            .collect();
        job.jobs[1].set_scalar("lr", 0.5f64).unwrap();
        let results = loopback::run_all(&mut job);
        for r in &results {
            let e = r.as_ref().unwrap_err().to_string();
            assert!(
                e.contains("rank 1 disagrees with rank 0 on the scalar `lr`"),
                "{e}"
            );
        }
        // Nothing ran: a failed agreement seals the job all the same (documented), so
        // the weights are read from a fresh job bound to the same inputs.
        assert!(job.final_input::<f32>("w").is_err());
        let fresh = Loopback::default().prepare(plan, &args).unwrap();
        for (r, w) in w0.iter().enumerate() {
            assert_eq!(&fresh.final_input_local::<f32>("w", r).unwrap(), w);
        }
    }

    /// A process running another schedule is refused when the job is prepared.
    #[test]
    fn processes_running_different_plans_are_refused_at_prepare() {
        let (plans, args) = adam(1001);
        let name = loopback::group_name();
        let results = loopback::per_process(RANKS, |r| {
            let plan = if r == 2 { &plans[0] } else { &plans[1] };
            let tcp = loopback::connect(r, RANKS, &name)?;
            coconet::runtime::cpu::ProcessJob::new(plan, &args, tcp).map(drop)
        });
        for r in &results {
            let e = r.as_ref().unwrap_err().to_string();
            assert!(
                e.contains("rank 2 disagrees with rank 0 on the program and schedule")
                    || e.contains("rank 2 runs another program than rank 0"),
                "{e}"
            );
        }
    }
}

/// The heartbeat the launcher's `--heartbeat-timeout` watches is beaten by a thread of
/// the process's own, off the step's path: a store that stalls (here: every byte to it
/// held back for 3 s) delays the beats, never a run, and beats resume when it returns;
/// a rank stuck in a run (its peer never joins) stops beating once the run has lasted
/// past the limit, while its idle peer keeps beating.
#[test]
fn the_heartbeat_beats_off_the_step_path_and_stops_only_for_a_stuck_run() {
    use coconet::runtime::cpu::{ProcessJob, Tcp};
    use coconet::runtime::launch::{LAUNCH_PREFIX, Store, StoreServer};
    use std::time::{Duration, Instant};

    let server = StoreServer::bind("127.0.0.1:0", loopback::secret().clone()).unwrap();
    let proxy = support_proxy::Proxy::start(server.local_addr());
    let (args, plan) = sgd_on_two_ranks(64);
    let t = Duration::from_secs(10);
    let mut reader = Store::connect(server.local_addr(), loopback::secret(), t).unwrap();
    let mut beats = |rank: usize| -> u64 {
        let key = format!("{LAUNCH_PREFIX}rank-alive/{rank}");
        let value = reader.try_get(&key).unwrap().unwrap_or_default();
        String::from_utf8(value).unwrap().parse().unwrap_or(0)
    };
    let limit = Duration::from_secs(2);
    // Three meetings: all set up; the store stalled; the beats checked.
    let meet = std::sync::Barrier::new(3);
    std::thread::scope(|s| {
        let jobs: Vec<_> = (0..2)
            .map(|rank| {
                let (plan, args, proxy, meet) = (&plan, &args, &proxy, &meet);
                s.spawn(move || {
                    let mut store = Store::connect(proxy.addr(), loopback::secret(), t).unwrap();
                    let mut link = Tcp::connect(&mut store, rank, 2, "beats", t).unwrap();
                    link.set_timeout(Duration::from_secs(6));
                    link.start_heartbeat(limit).unwrap();
                    let mut job = ProcessJob::new(plan, args, link).unwrap();
                    meet.wait();
                    meet.wait();
                    // Runs while the store is stalled: none waits for it.
                    let start = Instant::now();
                    for _ in 0..20 {
                        job.run().unwrap();
                    }
                    let took = start.elapsed();
                    if rank == 0 {
                        // Rank 0 runs alone: stuck until its collective's 6 s deadline.
                        let e = job.run().unwrap_err().to_string();
                        assert!(e.contains("never arrived"), "{e}");
                    }
                    meet.wait();
                    took
                })
            })
            .collect();
        meet.wait();
        std::thread::sleep(Duration::from_millis(1500));
        let (first0, first1) = (beats(0), beats(1));
        assert!(first0 >= 1 && first1 >= 1, "no beats: {first0} {first1}");
        let stalled = proxy.stall(Duration::from_secs(3));
        meet.wait();
        // Past the limit into rank 0's stuck run (and past the stall): rank 0 silent,
        // rank 1 beating again.
        std::thread::sleep(limit + Duration::from_millis(1500));
        let (a0, a1) = (beats(0), beats(1));
        std::thread::sleep(Duration::from_millis(1500));
        let (b0, b1) = (beats(0), beats(1));
        assert_eq!(a0, b0, "a rank stuck in a run past the limit kept beating");
        assert!(b1 > a1, "an idle rank stopped beating: {a1} -> {b1}");
        meet.wait();
        stalled.join().unwrap();
        for job in jobs {
            let took = job.join().unwrap();
            assert!(
                took < Duration::from_secs(2),
                "runs waited for the stalled store: {took:?}"
            );
        }
    });
}

/// SGD over two ranks with `n` elements: its bindings and its plan.
fn sgd_on_two_ranks(n: usize) -> (coconet::prelude::Bindings, coconet::runtime::Plan) {
    use coconet::prelude::*;
    let p = sgd_program::sgd();
    let args = Bindings::new()
        .dim("N", n)
        .tensor(
            "g",
            Binding::per_rank(&[data::uniform_f32(1, n), data::uniform_f32(2, n)]),
        )
        .tensor("w", Binding::global(&data::uniform_f32(3, n)))
        .scalar("lr", 0.1f32);
    let plan = coconet::runtime::Plan::lower(&Schedule::new(p.program()), 2, args.dims()).unwrap();
    (args, plan)
}

/// A TCP proxy whose forwarding can be held back, to play a store that stalls.
mod support_proxy {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    pub struct Proxy {
        addr: SocketAddr,
        held: Arc<AtomicBool>,
    }

    impl Proxy {
        pub fn start(to: SocketAddr) -> Proxy {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let held = Arc::new(AtomicBool::new(false));
            let h = Arc::clone(&held);
            std::thread::spawn(move || {
                for client in listener.incoming() {
                    let Ok(client) = client else { return };
                    let Ok(server) = TcpStream::connect(to) else {
                        return;
                    };
                    for (mut from, mut into) in [
                        (client.try_clone().unwrap(), server.try_clone().unwrap()),
                        (server, client),
                    ] {
                        let h = Arc::clone(&h);
                        std::thread::spawn(move || {
                            let mut buf = [0u8; 1 << 16];
                            while let Ok(n) = from.read(&mut buf) {
                                if n == 0 {
                                    break;
                                }
                                while h.load(Ordering::Relaxed) {
                                    std::thread::sleep(Duration::from_millis(5));
                                }
                                if into.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                            let _ = into.shutdown(std::net::Shutdown::Both);
                        });
                    }
                }
            });
            Proxy { addr, held }
        }

        pub fn addr(&self) -> SocketAddr {
            self.addr
        }

        /// Holds every byte back for `d` (on a thread; returns its handle).
        pub fn stall(&self, d: Duration) -> std::thread::JoinHandle<()> {
            self.held.store(true, Ordering::Relaxed);
            let held = Arc::clone(&self.held);
            std::thread::spawn(move || {
                std::thread::sleep(d);
                held.store(false, Ordering::Relaxed);
            })
        }
    }
}

/// LAMB's fused step is two passes: the reduce-scatter with the kernel up to `r`, folding
/// the partial norms of `r` and `w` chunk by chunk, and after the trust ratio a kernel
/// that sends its results to every peer. Bitwise the interpreter's on rank threads with chunks that cut
/// the 2048-value blocks of the reduction order anywhere, and on processes over TCP with
/// blocks of several chunks, in one round or a round per chunk.
#[test]
fn lamb_in_two_passes_equals_the_interpreter_in_any_chunking() {
    use coconet::core::schedule::candidates;
    use coconet::runtime::cpu::{Cpu, RunOptions};
    use coconet::runtime::{Backend, JobData, Plan, PlanStep};

    fn check<B: Backend>(backend: &B, ranks: usize, n: usize) {
        let p = lamb_program::lamb();
        let fused = candidates(p.program(), &[p.m.id(), p.v.id()])
            .into_iter()
            .find(|s| s.name() == "fuse(RS-C-AG)")
            .expect("the fused schedule");
        let hp = lamb_program::LambParams {
            step: 3,
            ..Default::default()
        };
        let grads: Vec<Vec<f32>> = (0..ranks)
            .map(|r| data::uniform_f32(10 + r as u64, n))
            .collect();
        let v: Vec<f32> = data::uniform_f32(3, n).iter().map(|x| x * x).collect();
        let args: Bindings = lamb_program::lamb_args(
            &grads,
            &data::uniform_f32(1, n),
            &data::uniform_f32(2, n),
            &v,
            hp,
        )
        .into();
        let plan = Plan::lower(&fused, ranks, args.dims()).unwrap();
        // Both partial norms (‖r‖ of the reduced values, ‖w‖ of the weights' slices).
        let folded = plan.steps().iter().any(
            |s| matches!(s, PlanStep::FusedAllReduce(f) if f.reductions.len() == 2 && f.gathers.is_empty()),
        );
        let gathered = plan
            .steps()
            .iter()
            .any(|s| matches!(s, PlanStep::FusedAllGather(_)));
        assert!(folded && gathered, "not two passes: {:?}", plan.steps());
        let want = interpret(fused.program(), ranks, &args).unwrap();
        let mut job = backend.prepare(&plan, &args).unwrap();
        backend.run(&mut job).unwrap();
        for name in ["w", "m", "v"] {
            for r in 0..ranks {
                let got = job.final_input_local::<f32>(name, r).unwrap();
                let exp = want.final_input_local::<f32>(name, r).unwrap();
                let same = got
                    .iter()
                    .zip(&exp)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{name} on rank {r} of {ranks}, N = {n}");
            }
        }
    }

    for chunk in [64, 1000, 4096] {
        let cpu = Cpu {
            options: RunOptions::default().with_chunk(chunk),
        };
        for ranks in [1, 3] {
            check(&cpu, ranks, 9001);
        }
    }
    for (ranks, round_chunks) in [(2, None), (3, Some(1))] {
        let processes = loopback::Loopback {
            round_chunks,
            ..Default::default()
        };
        check(&processes, ranks, 20011);
    }
}

/// A stranger who reaches a rank's data port — with a greeting computed from the public
/// group name, as the probe did — is refused before a byte of it is read as data,
/// and the group connects and runs as if it had never come (issue 46: the stranger's bytes
/// were used as rank 1's gradients in a run that returned `Ok`).
#[test]
fn a_stranger_at_a_data_port_is_refused_and_the_run_is_the_groups() {
    use coconet::prelude::*;
    use coconet::runtime::cpu::{DataPath, ProcessJob};
    use coconet::runtime::launch::{JobSecret, Store};
    use coconet::trust::{AuthError, handshake};
    use std::hash::{DefaultHasher, Hash, Hasher};
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    let (args, plan) = sgd_on_two_ranks(4096);
    let want = interpret(sgd_program::sgd().program(), 2, &args).unwrap();
    let name = loopback::group_name();
    let t = Duration::from_secs(10);
    let (strangers_done, go) = std::sync::mpsc::channel::<()>();

    let got: Vec<Vec<f32>> = std::thread::scope(|s| {
        let stranger = s.spawn(|| {
            // Finding the port is what a scan would do; the test reads it from the store.
            let mut store = Store::connect(loopback::store_addr(), loopback::secret(), t).unwrap();
            let addr = store.get(&format!("coconet/tcp/{name}/0"), t).unwrap();
            let addr = String::from_utf8(addr).unwrap();
            let group = {
                let mut h = DefaultHasher::new();
                name.hash(&mut h);
                h.finish()
            };
            let greeting: Vec<u8> = [u64::from_le_bytes(*b"coco-tcp"), group, 1, 2]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            let purpose =
                format!("coconet data port of group `{name}` (2 ranks): rank 1 -> rank 0");
            // Another job's secret: the rank's proof does not verify, nothing goes on.
            // The connection stays open (the rank waits for a proof that never comes)
            // and so does one that says nothing at all: neither holds up rank 1, whose
            // rendezvous has 10 s, the handshake's limit.
            let mut wrong = TcpStream::connect(&addr).unwrap();
            wrong.write_all(&greeting).unwrap();
            let other = JobSecret::generate().unwrap();
            let e = handshake::client(&mut wrong, &other, &purpose, t).unwrap_err();
            assert!(matches!(e, AuthError::WrongSecret { .. }), "{e:?}");
            let silent = TcpStream::connect(&addr).unwrap();
            // The old attack: the greeting, then bytes meant to be taken for gradients.
            let mut c = TcpStream::connect(&addr).unwrap();
            c.set_read_timeout(Some(t)).unwrap();
            c.write_all(&greeting).unwrap();
            let _ = c.write_all(&vec![0x7f; 1 << 16]);
            let mut answer = Vec::new();
            let _ = c.read_to_end(&mut answer);
            assert!(answer.is_empty(), "a stranger was answered: {answer:?}");
            strangers_done.send(()).unwrap();
            (wrong, silent)
        });
        let mut go = Some(go);
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let (plan, args, name) = (&plan, &args, &name);
                let go = if rank == 1 { go.take() } else { None };
                s.spawn(move || {
                    if let Some(go) = go {
                        go.recv().unwrap();
                    }
                    let link = loopback::connect_on(rank, 2, name, DataPath::Stream).unwrap();
                    let mut job = ProcessJob::new(plan, args, link).unwrap();
                    job.run().unwrap();
                    job.final_input_local::<f32>("w", rank).unwrap()
                })
            })
            .collect();
        let got = ranks.into_iter().map(|h| h.join().unwrap()).collect();
        drop(stranger.join().unwrap());
        got
    });
    for (rank, got) in got.iter().enumerate() {
        let want = want.final_input_local::<f32>("w", rank).unwrap();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "rank {rank}'s weights are not the group's"
        );
    }
}
