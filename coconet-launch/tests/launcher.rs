//! `coconet-launch` end to end on loopback: real processes, a real store.
//!
//! The ranks are this test executable itself, started by the launcher with
//! `--exact worker_… --nocapture` and `COCONET_TEST_WORKER=1`: the `worker_*` functions
//! below are ordinary tests that return at once in a normal run, and act as a rank when
//! that variable is set. Every run is bounded: a launcher that outlives its limit is
//! killed and the test fails, and a rank that outlives its launcher keeps the output pipes
//! open, which fails the test too.

use coconet_example_programs::{adam as adam_program, data};

use coconet::core::schedule::candidates;
use coconet::prelude::*;
use coconet::runtime::Plan;
use coconet::runtime::cpu::{ProcessJob, Tcp};
use coconet::runtime::launch::{Heartbeat, LaunchEnv, StoreError};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const WORKER: &str = "COCONET_TEST_WORKER";
/// Which rank misbehaves in the failure scenarios.
const BAD_RANK: &str = "COCONET_TEST_BAD_RANK";
/// Where ranks write their pid, so the test can check they are gone.
const PID_DIR: &str = "COCONET_TEST_PID_DIR";
/// The job secret the launchers of this file's multi-node jobs share (a one-node
/// launcher started without it makes its own).
const SECRET: &str = "5ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2";

/// The NCCL-unique-id stand-in rank 0 publishes.
fn unique_id() -> Vec<u8> {
    (0..128u32).map(|i| (i * 31 + 7) as u8).collect()
}

// ---------------------------------------------------------------------------------------
// Ranks.

/// The launch environment when running as a rank, `None` in a normal test run.
fn as_rank() -> Option<LaunchEnv> {
    std::env::var_os(WORKER)?;
    Some(LaunchEnv::from_env().expect("the launcher sets every launch variable"))
}

fn bad_rank() -> usize {
    std::env::var(BAD_RANK).unwrap().parse().unwrap()
}

fn write_pid(env: &LaunchEnv) {
    let dir = PathBuf::from(std::env::var_os(PID_DIR).unwrap());
    std::fs::write(
        dir.join(format!("rank-{}.pid", env.rank)),
        std::process::id().to_string(),
    )
    .unwrap();
}

/// Every rank: checks its variables, publishes a key, reads everyone's, reads rank 0's
/// unique id, meets the others at a barrier, and prints what it saw.
#[test]
fn worker_rendezvous() {
    let Some(env) = as_rank() else { return };
    let local_world = env.local_world_size.expect("LOCAL_WORLD_SIZE is set");
    assert!(env.rank < env.world_size);
    assert_eq!(env.local_rank, env.rank % local_world);
    assert_eq!(env.master_addr, "127.0.0.1");
    assert_ne!(env.master_port, 0, "port 0 is resolved before ranks start");
    assert!(
        !env.secret.is_open(),
        "the launcher hands its ranks a job secret"
    );
    let mut store = env.connect().unwrap();
    if env.rank == 0 {
        store.set("nccl/unique_id", &unique_id()).unwrap();
    }
    store
        .set(
            &format!("hello/{}", env.rank),
            format!("I am {}", env.rank).as_bytes(),
        )
        .unwrap();
    for r in 0..env.world_size {
        let got = store.get(&format!("hello/{r}"), env.timeout).unwrap();
        assert_eq!(got, format!("I am {r}").into_bytes());
    }
    assert_eq!(
        store.get("nccl/unique_id", env.timeout).unwrap(),
        unique_id()
    );
    let arrived = store.add("arrived", 1).unwrap();
    assert!(arrived >= 1 && arrived <= env.world_size as i64);
    store.barrier("done", env.world_size, env.timeout).unwrap();
    // After the barrier everyone has counted itself.
    assert_eq!(store.add("arrived", 0).unwrap(), env.world_size as i64);
    println!(
        "RANK-OK rank={} world={} local={} local_world={}",
        env.rank, env.world_size, env.local_rank, local_world
    );
}

/// All ranks meet, then the bad rank exits with status 3 (or aborts, with
/// `COCONET_TEST_ABORT`) while the others sleep for a minute.
#[test]
fn worker_crash() {
    let Some(env) = as_rank() else { return };
    write_pid(&env);
    let mut store = env.connect().unwrap();
    store
        .barrier("started", env.world_size, env.timeout)
        .unwrap();
    if env.rank == bad_rank() {
        if std::env::var_os("COCONET_TEST_ABORT").is_some() {
            std::process::abort();
        }
        std::process::exit(3);
    }
    thread::sleep(Duration::from_secs(60));
}

/// All ranks meet, then the bad rank never comes to the next barrier; the others time out
/// (after the launcher's `--timeout`) and exit with status 7 after printing the store's
/// error.
#[test]
fn worker_never_arrives() {
    let Some(env) = as_rank() else { return };
    write_pid(&env);
    let mut store = env.connect().unwrap();
    // Everyone is up (with a generous timeout, so a slow start on a loaded machine is not
    // mistaken for the failure under test)...
    store
        .barrier("started", env.world_size, Duration::from_secs(20))
        .unwrap();
    // ...but the bad rank never comes to the next barrier.
    if env.rank == bad_rank() {
        thread::sleep(Duration::from_secs(60));
        return;
    }
    match store.barrier("all", env.world_size, env.timeout) {
        Err(e @ StoreError::BarrierTimeout { .. }) => {
            // One write, so the ranks' lines do not interleave on the shared pipe.
            let line = format!("rank {}: {e}\n", env.rank);
            std::io::stderr().write_all(line.as_bytes()).unwrap();
            std::process::exit(7);
        }
        other => panic!("expected a barrier timeout, got {other:?}"),
    }
}

/// Every rank beats its heartbeat every 50 ms for 4 s (`COCONET_TEST_BEAT_SECS`), then
/// exits; with `COCONET_TEST_BAD_RANK` set, that rank beats once and then hangs.
#[test]
fn worker_heartbeat() {
    let Some(env) = as_rank() else { return };
    write_pid(&env);
    let heartbeat = Heartbeat::from_env().unwrap();
    heartbeat.beat().unwrap();
    if std::env::var(BAD_RANK).is_ok() && env.rank == bad_rank() {
        thread::sleep(Duration::from_secs(60));
        return;
    }
    let secs: u64 = std::env::var("COCONET_TEST_BEAT_SECS").map_or(4, |s| s.parse().unwrap());
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        heartbeat.beat().unwrap();
        thread::sleep(Duration::from_millis(50));
    }
}

/// Three Adam steps over TCP, whatever launcher set the variables; prints the launcher.
#[test]
fn worker_foreign() {
    let Some(env) = as_rank() else { return };
    let (rank, ranks) = (env.rank, env.world_size);
    let p = adam_program::adam();
    let n = 1024;
    let grads: Vec<Vec<f32>> = (0..ranks).map(|r| data::uniform_f32(r as u64, n)).collect();
    let (w, m, v) = (data::uniform_f32(1, n), vec![0.0f32; n], vec![0.0f32; n]);
    let all: Bindings =
        adam_program::adam_args(&grads, &w, &m, &v, adam_program::AdamParams::default()).into();
    let want = interpret(p.program(), ranks, &all).unwrap();
    let mine = all.tensor("g", Binding::this_rank(&grads[rank]));
    let plan = Plan::lower(&Schedule::new(p.program()), ranks, mine.dims()).unwrap();
    let mut job = ProcessJob::new(&plan, &mine, Tcp::from_env().unwrap()).unwrap();
    job.run().unwrap();
    let got = job.final_input_local::<f32>("w", rank).unwrap();
    let same = got
        .iter()
        .zip(want.final_input_local::<f32>("w", rank).unwrap())
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "rank {rank}'s weights differ from the interpreter's");
    println!("OK {} rank {rank} of {ranks}", env.launcher);
}

/// Adam steps over TCP for 10 s, every rank writing its pid first (a rank to be stopped
/// from outside).
#[test]
fn worker_tcp_steps() {
    let Some(env) = as_rank() else { return };
    write_pid(&env);
    let (rank, ranks) = (env.rank, env.world_size);
    let p = adam_program::adam();
    let n = 4096;
    let grads: Vec<Vec<f32>> = (0..ranks).map(|r| data::uniform_f32(r as u64, n)).collect();
    let (w, m, v) = (data::uniform_f32(1, n), vec![0.0f32; n], vec![0.0f32; n]);
    let mine: Bindings =
        adam_program::adam_args(&grads, &w, &m, &v, adam_program::AdamParams::default()).into();
    let mine = mine.tensor("g", Binding::this_rank(&grads[rank]));
    let plan = Plan::lower(&Schedule::new(p.program()), ranks, mine.dims()).unwrap();
    let mut job = ProcessJob::new(&plan, &mine, Tcp::from_env().unwrap()).unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        job.run().unwrap();
        thread::sleep(Duration::from_millis(10));
    }
}

/// Adam trained over TCP (`ProcessJob` + `Tcp::from_env`), each rank binding only its own
/// gradient and writing a fresh one into the job every iteration; every iteration of
/// every schedule bitwise equal to the interpreter (which each rank runs with every
/// rank's gradients, regenerated from their seeds). With `COCONET_TEST_BAD_RANK` set,
/// that rank stalls before its third run and the others must time out naming it.
#[test]
fn worker_tcp_training() {
    let Some(env) = as_rank() else { return };
    let (rank, ranks) = (env.rank, env.world_size);
    let stall = std::env::var(BAD_RANK).ok().map(|_| bad_rank());
    let (mut single_copy, mut shares) = (true, true);
    let p = adam_program::adam();
    let n = 1001;
    let grads = |it: usize| -> Vec<Vec<f32>> {
        (0..ranks)
            .map(|r| data::uniform_f32(100 * it as u64 + r as u64, n))
            .collect()
    };
    let hp = |it: usize| adam_program::AdamParams {
        lr: 1e-2 / (1.0 + it as f64),
        step: it as i32 + 1,
        ..Default::default()
    };
    for s in candidates(p.program(), &[p.m.id(), p.v.id()]) {
        let (mut w, mut m, mut v) = (data::uniform_f32(1, n), vec![0.0f32; n], vec![0.0f32; n]);
        let mine: Bindings = adam_program::adam_args(&grads(0), &w, &m, &v, hp(0)).into();
        let mine = mine.tensor("g", Binding::this_rank(&grads(0)[rank]));
        let plan = Plan::lower(&s, ranks, mine.dims()).unwrap();
        let mut tcp = Tcp::from_env().unwrap();
        single_copy &= tcp.single_copy();
        if stall.is_some() {
            tcp.set_timeout(Duration::from_secs(2));
        }
        let mut job = ProcessJob::new(&plan, &mine, tcp).unwrap();
        shares &= job.shares_memory();
        for it in 0..6 {
            if it > 0 {
                job.set_scalar("step", hp(it).step).unwrap();
                job.set_scalar("lr", hp(it).lr).unwrap();
            }
            if stall == Some(rank) && it == 2 {
                thread::sleep(Duration::from_secs(60));
            }
            job.input_mut::<f32>("g", rank)
                .unwrap()
                .copy_from_slice(&grads(it)[rank]);
            if let Err(e) = job.run() {
                let line = format!("rank {rank}: {e}\n");
                std::io::stderr().write_all(line.as_bytes()).unwrap();
                std::process::exit(7);
            }
            let args: Bindings = adam_program::adam_args(&grads(it), &w, &m, &v, hp(it)).into();
            let want = interpret(s.program(), ranks, &args).unwrap();
            for name in ["w", "m", "v"] {
                let got: Vec<f32> = job.final_input_local(name, rank).unwrap();
                let exp: Vec<f32> = want.final_input_local(name, rank).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&exp),
                    "{}: `{name}`, iteration {it}",
                    s.name()
                );
            }
            (w, m, v) = (
                want.final_input("w").unwrap(),
                want.final_input("m").unwrap(),
                want.final_input("v").unwrap(),
            );
        }
    }
    println!("TCP-OK rank={rank} single-copy={single_copy} shares-memory={shares}");
}

// ---------------------------------------------------------------------------------------
// The harness.

struct Outcome {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Outcome {
    /// Fails, showing everything, unless stderr contains `text`.
    #[track_caller]
    fn assert_stderr(&self, text: &str) {
        assert!(self.stderr.contains(text), "{}", self.show());
    }

    fn show(&self) -> String {
        format!(
            "status {:?} after {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.took, self.stdout, self.stderr
        )
    }

    /// The ranks that printed RANK-OK, as (rank, world, local, local_world).
    fn ok_ranks(&self) -> BTreeSet<(usize, usize, usize, usize)> {
        self.stdout
            .lines()
            // libtest's own "test worker_rendezvous ... " may precede it on the line.
            .filter_map(|l| l.split_once("RANK-OK ").map(|(_, rest)| rest))
            .map(|l| {
                let v: Vec<usize> = l
                    .split(' ')
                    .map(|kv| kv.split_once('=').unwrap().1.parse().unwrap())
                    .collect();
                (v[0], v[1], v[2], v[3])
            })
            .collect()
    }
}

/// Launcher options for `nproc` ranks on this machine, a free port, and a store timeout.
fn one_node(nproc: usize, timeout: &str) -> Vec<String> {
    [
        "--nproc-per-node",
        &nproc.to_string(),
        "--master-port",
        "0",
        "--timeout",
        timeout,
    ]
    .map(String::from)
    .to_vec()
}

/// A launcher command running `worker` as every rank.
fn launcher<S: AsRef<std::ffi::OsStr>>(worker: &str, options: &[S]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_coconet-launch"));
    cmd.args(options)
        .arg("--")
        .arg(std::env::current_exe().unwrap())
        .args([worker, "--exact", "--nocapture", "--test-threads", "1"])
        .env(WORKER, "1")
        .env("COCONET_JOB_SECRET", SECRET)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Starts `cmd`; see [`finish`].
fn start(mut cmd: Command) -> (std::process::Child, Instant) {
    (cmd.spawn().expect("start coconet-launch"), Instant::now())
}

/// Waits for a started launcher at most `limit`, and for its output pipes to close (which
/// needs every rank it started to be gone) at most 2 s after it exits.
fn finish((mut child, started): (std::process::Child, Instant), limit: Duration) -> Outcome {
    let pipe = |r: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = mpsc::channel();
        let mut r = r.unwrap();
        thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            let _ = tx.send(s);
        });
        rx
    };
    let out = pipe(child.stdout.take().map(|s| Box::new(s) as _));
    let err = pipe(child.stderr.take().map(|s| Box::new(s) as _));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = err.recv_timeout(Duration::from_secs(2)).unwrap_or_default();
            panic!("coconet-launch ran past {limit:?}; stderr:\n{stderr}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    let took = started.elapsed();
    let grace = Duration::from_secs(2);
    let stdout = out
        .recv_timeout(grace)
        .expect("a rank outlived its launcher (stdout still open)");
    let stderr = err
        .recv_timeout(grace)
        .expect("a rank outlived its launcher (stderr still open)");
    Outcome {
        status,
        stdout,
        stderr,
        took,
    }
}

fn run(cmd: Command, limit: Duration) -> Outcome {
    finish(start(cmd), limit)
}

/// A port that was free a moment ago (for jobs whose nodes must agree on it in advance),
/// picked below the kernel's ephemeral range: a port the kernel handed out (`:0`) is
/// handed out again to the next outgoing connection of any process on the machine, which
/// then holds it when the job binds it ("Address already in use").
fn free_port() -> String {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(10_001));
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ (u64::from(std::process::id()) << 20);
    for _ in 0..1000 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let port = low + ((seed >> 33) % u64::from(high - low)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port.to_string();
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port().to_string()
}

/// A fresh directory for pid files.
fn pid_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("coconet-launch-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Asserts that every rank that wrote a pid into `dir` (expecting `n`) is gone.
fn assert_all_gone(dir: &Path, n: usize) {
    let mut pids = Vec::new();
    for rank in 0..n {
        let file = dir.join(format!("rank-{rank}.pid"));
        let pid = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("rank {rank} wrote no pid ({e})"));
        pids.push(pid);
    }
    for (rank, pid) in pids.iter().enumerate() {
        if cfg!(target_os = "linux") {
            assert!(
                !Path::new(&format!("/proc/{pid}")).exists(),
                "rank {rank} (pid {pid}) is still alive"
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

// ---------------------------------------------------------------------------------------
// The tests.

/// With no secret given, a one-node launcher makes one and hands it to its ranks.
#[test]
fn four_ranks_rendezvous_on_one_node() {
    let mut cmd = launcher("worker_rendezvous", &one_node(4, "20"));
    cmd.env_remove("COCONET_JOB_SECRET");
    let o = run(cmd, Duration::from_secs(30));
    assert!(o.status.success(), "{}", o.show());
    let expected: BTreeSet<_> = (0..4).map(|r| (r, 4, r, 4)).collect();
    assert_eq!(o.ok_ranks(), expected, "{}", o.show());
}

/// Three processes on this host train through the single-copy path (each reads its
/// peers' memory), with the job's buffers in shared memory (the default), and again
/// through the socket (`COCONET_TCP_DATA=stream`).
#[test]
fn three_processes_train_over_tcp_bitwise_as_the_interpreter() {
    for (data, single_copy, shares) in [
        (Some("single-copy"), true, false),
        (None, true, true),
        (Some("stream"), false, false),
    ] {
        let mut cmd = launcher("worker_tcp_training", &one_node(3, "20"));
        if let Some(d) = data {
            cmd.env("COCONET_TCP_DATA", d);
        }
        let o = run(cmd, Duration::from_secs(120));
        assert!(o.status.success(), "{}", o.show());
        for r in 0..3 {
            assert!(
                o.stdout.contains(&format!(
                    "TCP-OK rank={r} single-copy={single_copy} shares-memory={shares}"
                )),
                "{}",
                o.show()
            );
        }
    }
}

/// A rank that stops answering mid-training: the others time out after their deadline
/// naming it, exit, and the launcher stops the job (no hang).
#[test]
fn a_stalled_process_over_tcp_times_the_others_out_naming_it() {
    let mut cmd = launcher("worker_tcp_training", &one_node(3, "20"));
    cmd.env(BAD_RANK, "1");
    let o = run(cmd, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(7), "{}", o.show());
    o.assert_stderr("ranks [1] never arrived");
    // The verdict names the rank that exited first, and the cause its peers published.
    o.assert_stderr("the first failure the ranks reported: rank 1: ");
}

/// A rank stopped (SIGSTOP) in the middle of TCP training, under `--heartbeat-timeout`:
/// the verdict names it, not a healthy peer stuck waiting for it (issue 46: a healthy
/// rank was named in 2 of 2 tries). Its peers beat until their own run has been stuck
/// past the limit; it fell silent first.
#[test]
fn a_stopped_rank_is_named_not_the_peers_waiting_for_it() {
    let dir = pid_dir("stopped-rank");
    let mut options = one_node(3, "20");
    options.extend(["--heartbeat-timeout", "2", "--grace", "1"].map(String::from));
    let mut cmd = launcher("worker_tcp_steps", &options);
    cmd.env(PID_DIR, &dir);
    let job = start(cmd);
    let pid = dir.join("rank-1.pid");
    let begun = Instant::now();
    while !pid.exists() && begun.elapsed() < Duration::from_secs(20) {
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_millis(1500));
    let pid = std::fs::read_to_string(pid).unwrap();
    assert!(
        Command::new("kill")
            .args(["-STOP", pid.trim()])
            .status()
            .unwrap()
            .success()
    );
    let o = finish(job, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(1), "{}", o.show());
    o.assert_stderr(&format!(
        "error: rank 1 (pid {}) sent no heartbeat",
        pid.trim()
    ));
    assert_all_gone(&dir, 3);
}

/// Ranks started by `srun`, `mpirun` or torchrun (their variables set here as those
/// launchers set them, no coconet-launch anywhere): rank 0 hosts the store, every rank
/// finds the others and trains bitwise as the interpreter (issue 48, item 1).
#[test]
fn ranks_started_by_srun_mpirun_or_torchrun_find_each_other() {
    type Vars = fn(usize) -> Vec<(&'static str, String)>;
    let launchers: [(&str, Vars); 3] = [
        ("srun", |r| {
            vec![
                ("SLURM_PROCID", r.to_string()),
                ("SLURM_NTASKS", "3".into()),
                ("SLURM_LOCALID", r.to_string()),
                ("SLURM_NTASKS_PER_NODE", "3".into()),
                ("SLURM_STEP_NODELIST", "localhost".into()),
            ]
        }),
        ("mpirun", |r| {
            vec![
                ("OMPI_COMM_WORLD_RANK", r.to_string()),
                ("OMPI_COMM_WORLD_SIZE", "3".into()),
                ("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string()),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "3".into()),
                ("MASTER_ADDR", "127.0.0.1".into()),
            ]
        }),
        ("torchrun", |r| {
            vec![
                ("RANK", r.to_string()),
                ("WORLD_SIZE", "3".into()),
                ("LOCAL_RANK", r.to_string()),
                ("MASTER_ADDR", "127.0.0.1".into()),
            ]
        }),
    ];
    for (name, vars) in launchers {
        let port = free_port();
        let ranks: Vec<_> = (0..3)
            .map(|r| {
                let mut cmd = Command::new(std::env::current_exe().unwrap());
                cmd.args([
                    "worker_foreign",
                    "--exact",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env(WORKER, "1")
                .env("COCONET_JOB_SECRET", SECRET)
                .env("MASTER_PORT", &port)
                .env("COCONET_RENDEZVOUS_TIMEOUT", "20")
                .envs(vars(r))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
                for var in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "COCONET_LAUNCHED"] {
                    if !vars(r).iter().any(|(k, _)| *k == var) {
                        cmd.env_remove(var);
                    }
                }
                start(cmd)
            })
            .collect();
        for (r, rank) in ranks.into_iter().enumerate() {
            let o = finish(rank, Duration::from_secs(60));
            assert!(o.status.success(), "{name}, rank {r}: {}", o.show());
            assert!(
                o.stdout.contains(&format!("OK {name} rank {r} of 3")),
                "{name}, rank {r}: {}",
                o.show()
            );
        }
    }
}

/// Under a real `mpirun` (where Open MPI is installed, as in CI): three processes find
/// each other through Open MPI's variables, rank 0 hosting the store.
#[test]
fn ranks_started_by_a_real_mpirun_find_each_other() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        println!("skipped: no mpirun on this machine (install openmpi-bin)");
        return;
    }
    let port = free_port();
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "3"])
        .args(["-x", "COCONET_TEST_WORKER=1", "-x", "MASTER_ADDR=127.0.0.1"])
        .args(["-x", &format!("MASTER_PORT={port}")])
        .args(["-x", &format!("COCONET_JOB_SECRET={SECRET}")])
        .arg(std::env::current_exe().unwrap())
        .args([
            "worker_foreign",
            "--exact",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env_remove("COCONET_LAUNCHED")
        .env_remove("RANK")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "mpirun failed:\n{stdout}\n{stderr}");
    for r in 0..3 {
        assert!(
            stdout.contains(&format!("OK mpirun rank {r} of 3")),
            "rank {r}:\n{stdout}\n{stderr}"
        );
    }
}

/// Whether process `pid` is gone (or a zombie about to be reaped), waiting up to 3 s.
fn gone(pid: &str) -> bool {
    let status = format!("/proc/{}/status", pid.trim());
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        match std::fs::read_to_string(&status) {
            Err(_) => return true,
            Ok(s) if s.contains("State:\tZ") => return true,
            Ok(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
    false
}

/// The launcher with `nproc` ranks each running the shell script `script` (`$RANK` set).
fn shell_ranks(nproc: usize, grace: &str, script: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_coconet-launch"));
    cmd.args(one_node(nproc, "20"))
        .args(["--grace", grace, "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// SIGTERM to the launcher reaches every rank and what the ranks started (each rank is
/// a process group of its own); the launcher exits with 128 + 15 naming the signal.
#[cfg(target_os = "linux")]
#[test]
fn a_signal_to_the_launcher_stops_every_rank_and_what_it_started() {
    let dir = pid_dir("signal");
    let d = dir.display();
    let script =
        format!("echo $$ > {d}/rank-$RANK.pid; sleep 300 & echo $! > {d}/child-$RANK.pid; wait");
    let (child, started) = start(shell_ranks(2, "2", &script));
    while !(0..2).all(|r| dir.join(format!("child-{r}.pid")).exists()) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the ranks never started"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let o = finish((child, started), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(143), "{}", o.show());
    o.assert_stderr("received signal 15; stopped the 2 running ranks");
    for r in 0..2 {
        for what in ["rank", "child"] {
            let pid = std::fs::read_to_string(dir.join(format!("{what}-{r}.pid"))).unwrap();
            assert!(
                gone(&pid),
                "{what} of rank {r} (pid {pid}) outlived the launcher"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A launcher killed outright (SIGKILL: no chance to forward anything) takes its ranks
/// with it (their parent-death signal), instead of leaving them orphaned.
#[cfg(target_os = "linux")]
#[test]
fn ranks_die_with_a_killed_launcher() {
    let dir = pid_dir("orphans");
    let d = dir.display();
    let script = format!("echo $$ > {d}/rank-$RANK.pid; while true; do sleep 0.05; done");
    let (mut child, started) = start(shell_ranks(2, "2", &script));
    while !(0..2).all(|r| dir.join(format!("rank-{r}.pid")).exists()) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the ranks never started"
        );
        thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    for r in 0..2 {
        let pid = std::fs::read_to_string(dir.join(format!("rank-{r}.pid"))).unwrap();
        assert!(
            gone(&pid),
            "rank {r} (pid {pid}) outlived its killed launcher"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A launcher of another job pointed at a running job's store (here: `--nnodes 2
/// --node-rank 1` against a one-node job, or another --rdzv-id) is refused at once, and
/// the running job finishes normally.
#[test]
fn a_launcher_of_another_job_is_refused_and_the_job_is_left_alone() {
    let port = free_port();
    let options = |extra: &[&str]| {
        let mut o: Vec<String> = ["--nproc-per-node", "2", "--master-port", &port]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect();
        o.extend(["--timeout", "20", "--", "sh", "-c", "sleep 3"].map(String::from));
        o
    };
    let launch = |o: Vec<String>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_coconet-launch"));
        cmd.args(o)
            .env("COCONET_JOB_SECRET", SECRET)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    };
    let job = start(launch(options(&["--rdzv-id", "first"])));
    thread::sleep(Duration::from_millis(500));
    for extra in [
        &["--rdzv-id", "first", "--nnodes", "2", "--node-rank", "1"][..],
        &["--rdzv-id", "second", "--nnodes", "2", "--node-rank", "1"][..],
    ] {
        let o = run(launch(options(extra)), Duration::from_secs(20));
        assert_eq!(o.status.code(), Some(1), "{}", o.show());
        o.assert_stderr("serves another job (run id \"first\", 1 nodes of 2 ranks)");
    }
    // A launcher with the job's name but not its secret is refused by the store itself.
    let mut stranger = launch(options(&[
        "--rdzv-id",
        "first",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
    ]));
    stranger.env("COCONET_JOB_SECRET", "ab".repeat(32));
    let o = run(stranger, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(1), "{}", o.show());
    o.assert_stderr("did not let this process in: the peer does not hold this job's secret");
    let o = finish(job, Duration::from_secs(20));
    assert!(o.status.success(), "the job was disturbed: {}", o.show());
}

/// Ranks that hang (here: sleep) past `--job-timeout` are stopped, and the launcher says
/// why.
#[test]
fn ranks_past_the_job_timeout_are_stopped() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_coconet-launch"));
    cmd.args(one_node(2, "20"))
        .args([
            "--job-timeout",
            "1",
            "--grace",
            "1",
            "--",
            "sh",
            "-c",
            "sleep 60",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let o = run(cmd, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(1), "{}", o.show());
    o.assert_stderr("the ranks ran past --job-timeout 1s; stopped the 2 running ranks");
    assert!(o.took < Duration::from_secs(10), "{}", o.show());
}

/// When a rank fails, the others get SIGTERM and the grace period to finish what they are
/// writing (here a checkpoint taking 0.5 s) before SIGKILL; the failed rank is named.
#[cfg(target_os = "linux")]
#[test]
fn stopped_ranks_get_a_grace_period_to_finish_their_checkpoint() {
    let dir = pid_dir("grace");
    let d = dir.display();
    let script = format!(
        "if [ \"$RANK\" = 1 ]; then sleep 0.5; exit 3; fi; \
         trap 'sleep 0.5; echo saved > {d}/checkpoint; exit 0' TERM; \
         while true; do sleep 0.05; done"
    );
    let o = run(shell_ranks(2, "10", &script), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(3), "{}", o.show());
    o.assert_stderr("rank 1 (pid ");
    assert_eq!(
        std::fs::read_to_string(dir.join("checkpoint"))
            .ok()
            .as_deref(),
        Some("saved\n"),
        "rank 0 was cut off before its checkpoint: {}",
        o.show()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_crashing_rank_stops_the_job_and_is_named() {
    let dir = pid_dir("crash");
    let mut cmd = launcher("worker_crash", &one_node(4, "20"));
    cmd.env(BAD_RANK, "2").env(PID_DIR, &dir);
    let o = run(cmd, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(3), "{}", o.show());
    o.assert_stderr("coconet-launch: error: rank 2 (pid ");
    o.assert_stderr("exited with status 3; stopped the other 3 ranks");
    // The others sleep for 60 s: they were killed, not waited for.
    assert!(o.took < Duration::from_secs(15), "{}", o.show());
    assert_all_gone(&dir, 4);
}

#[test]
fn a_rank_killed_by_a_signal_is_reported_with_the_signal() {
    let dir = pid_dir("abort");
    let mut cmd = launcher("worker_crash", &one_node(2, "20"));
    cmd.env(BAD_RANK, "1")
        .env(PID_DIR, &dir)
        .env("COCONET_TEST_ABORT", "1");
    let o = run(cmd, Duration::from_secs(30));
    o.assert_stderr("was killed by signal 6 (SIGABRT); stopped the other rank");
    o.assert_stderr("rank 1 (pid ");
    assert_eq!(o.status.code(), Some(128 + 6), "{}", o.show());
    assert!(o.took < Duration::from_secs(15), "{}", o.show());
    assert_all_gone(&dir, 2);
}

#[test]
fn a_rank_that_never_arrives_times_the_others_out() {
    let dir = pid_dir("never");
    let mut cmd = launcher("worker_never_arrives", &one_node(4, "1.5"));
    cmd.env(BAD_RANK, "3").env(PID_DIR, &dir);
    let o = run(cmd, Duration::from_secs(30));
    // The ranks' own report of the store's timeout...
    o.assert_stderr("barrier \"all\" timed out after 1.5s: 3 of 4 ranks arrived");
    // ...and the launcher's report of the first of them to exit.
    assert_eq!(o.status.code(), Some(7), "{}", o.show());
    o.assert_stderr("exited with status 7");
    let named = (0..3).any(|r| o.stderr.contains(&format!("error: rank {r} (pid ")));
    assert!(named, "{}", o.show());
    assert!(o.took < Duration::from_secs(15), "{}", o.show());
    assert_all_gone(&dir, 4);
}

/// A rank that beat once and then hangs (without exiting or touching the store) is
/// named and stopped with the others after `--heartbeat-timeout`; ranks that keep
/// beating run to the end untouched.
#[test]
fn a_rank_that_stops_beating_is_named_and_the_ranks_stopped() {
    let dir = pid_dir("silent");
    let mut options = one_node(3, "20");
    options.extend(["--heartbeat-timeout", "2", "--grace", "1"].map(String::from));
    let mut cmd = launcher("worker_heartbeat", &options);
    cmd.env(BAD_RANK, "1").env(PID_DIR, &dir);
    let o = run(cmd, Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(1), "{}", o.show());
    o.assert_stderr("error: rank 1 (pid ");
    o.assert_stderr("sent no heartbeat for");
    o.assert_stderr("(--heartbeat-timeout 2s): hung, or busy without beating");
    assert!(o.took < Duration::from_secs(12), "{}", o.show());
    assert_all_gone(&dir, 3);

    let mut cmd = launcher("worker_heartbeat", &options);
    cmd.env(PID_DIR, pid_dir("beating"));
    let o = run(cmd, Duration::from_secs(30));
    assert!(o.status.success(), "{}", o.show());

    // The launcher (and the store it hosts) stopped for 5 s, longer than the limit:
    // healthy ranks are not blamed for the silence it could not watch (issue 46: such a
    // job was killed as hung once the launcher resumed).
    let mut cmd = launcher("worker_heartbeat", &options);
    cmd.env(PID_DIR, pid_dir("launcher-stopped"))
        .env("COCONET_TEST_BEAT_SECS", "9");
    let job = start(cmd);
    thread::sleep(Duration::from_secs(2));
    let pid = job.0.id().to_string();
    let signal = |s: &str| {
        let ok = Command::new("kill").args([s, &pid]).status().unwrap();
        assert!(ok.success(), "kill {s} {pid}");
    };
    signal("-STOP");
    thread::sleep(Duration::from_secs(5));
    signal("-CONT");
    let o = finish(job, Duration::from_secs(30));
    assert!(
        o.status.success(),
        "a healthy job was stopped: {}",
        o.show()
    );
    // A limit below twice the beat interval could stop healthy ranks: refused.
    let mut options = one_node(1, "20");
    options.extend(["--heartbeat-timeout", "1.5"].map(String::from));
    let o = run(
        launcher("worker_heartbeat", &options),
        Duration::from_secs(30),
    );
    assert_eq!(o.status.code(), Some(1), "{}", o.show());
    o.assert_stderr("--heartbeat-timeout must be at least 2s");
}

/// Two launchers share a job secret through a file (`--secret-file`, as on two hosts
/// with a shared or copied file); without one, a multi-node launcher refuses to start.
#[test]
fn two_nodes_on_one_machine() {
    use std::os::unix::fs::PermissionsExt;
    let port = free_port();
    let dir = pid_dir("two-node-secret");
    let secret_file = dir.join("secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let node = |rank: &str| {
        let mut cmd = launcher(
            "worker_rendezvous",
            &[
                "--nnodes",
                "2",
                "--node-rank",
                rank,
                "--nproc-per-node",
                "2",
                "--master-port",
                &port,
                "--timeout",
                "20",
                "--secret-file",
                secret_file.to_str().unwrap(),
            ],
        );
        cmd.env_remove("COCONET_JOB_SECRET");
        cmd
    };
    let mut no_secret = launcher(
        "worker_rendezvous",
        &[
            "--nnodes",
            "2",
            "--nproc-per-node",
            "2",
            "--master-port",
            &port,
        ],
    );
    no_secret.env_remove("COCONET_JOB_SECRET");
    let o = run(no_secret, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(1), "{}", o.show());
    o.assert_stderr("a job across 2 nodes needs one job secret on every node");
    // Node 1 first: its launcher and ranks wait for node 0's store to appear.
    let one = start(node("1"));
    thread::sleep(Duration::from_millis(200));
    let zero = start(node("0"));
    let one = finish(one, Duration::from_secs(30));
    let zero = finish(zero, Duration::from_secs(30));
    assert!(zero.status.success(), "node 0: {}", zero.show());
    assert!(one.status.success(), "node 1: {}", one.show());
    let on_zero: BTreeSet<_> = [(0, 4, 0, 2), (1, 4, 1, 2)].into();
    let on_one: BTreeSet<_> = [(2, 4, 0, 2), (3, 4, 1, 2)].into();
    assert_eq!(zero.ok_ranks(), on_zero, "{}", zero.show());
    assert_eq!(one.ok_ranks(), on_one, "{}", one.show());
}

#[test]
fn a_crash_on_one_node_stops_the_other_node() {
    let port = free_port();
    let dir = pid_dir("two-node-crash");
    let node = |rank: &str| {
        let mut cmd = launcher(
            "worker_crash",
            &[
                "--nnodes",
                "2",
                "--node-rank",
                rank,
                "--nproc-per-node",
                "2",
                "--master-port",
                &port,
                "--timeout",
                "20",
            ],
        );
        cmd.env(BAD_RANK, "3").env(PID_DIR, &dir);
        cmd
    };
    let zero = start(node("0"));
    let one = start(node("1"));
    let one = finish(one, Duration::from_secs(30));
    let zero = finish(zero, Duration::from_secs(30));
    assert_eq!(one.status.code(), Some(3), "node 1: {}", one.show());
    assert!(
        one.stderr
            .contains("exited with status 3; stopped the other rank"),
        "node 1: {}",
        one.show()
    );
    assert_eq!(zero.status.code(), Some(1), "node 0: {}", zero.show());
    assert!(
        zero.stderr.contains("node 1: rank 3 (pid ")
            && zero
                .stderr
                .contains("stopped the 2 running ranks of node 0"),
        "node 0: {}",
        zero.show()
    );
    assert!(zero.took < Duration::from_secs(15), "{}", zero.show());
    assert_all_gone(&dir, 4);
}

#[test]
fn a_node_that_never_joins_is_reported() {
    let port = free_port();
    let o = run(
        launcher(
            "worker_rendezvous",
            &[
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--master-port",
                &port,
                "--timeout",
                "1",
            ],
        ),
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(1), "{}", o.show());
    o.assert_stderr("only 1 of 2 nodes' launchers joined the rendezvous at 127.0.0.1:");
    // No rank was started.
    assert!(!o.stdout.contains("running 1 test"), "{}", o.show());
    // And a node whose node 0 never comes cannot reach the store.
    let o = run(
        launcher(
            "worker_rendezvous",
            &[
                "--nnodes",
                "2",
                "--node-rank",
                "1",
                "--nproc-per-node",
                "2",
                "--master-port",
                &port,
                "--timeout",
                "1",
            ],
        ),
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(1), "{}", o.show());
    o.assert_stderr(&format!(
        "could not connect to the rendezvous store at 127.0.0.1:{port}"
    ));
}

#[test]
fn a_missing_program_is_a_clear_error() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_coconet-launch"));
    cmd.args([
        "--nproc-per-node",
        "2",
        "--master-port",
        "0",
        "/nonexistent/coconet-program",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let o = run(cmd, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(1), "{}", o.show());
    o.assert_stderr("could not start rank 0 (/nonexistent/coconet-program)");
}

#[test]
fn inconsistent_options_are_refused() {
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "--nproc-per-node",
                "2",
                "--nnodes",
                "2",
                "--node-rank",
                "2",
                "true",
            ],
            "--node-rank 2 is out of range for --nnodes 2",
        ),
        (
            &[
                "--nproc-per-node",
                "2",
                "--nnodes",
                "2",
                "--master-port",
                "0",
                "true",
            ],
            "--master-port 0",
        ),
        (
            &["--nproc-per-node", "0", "true"],
            "--nproc-per-node must be at least 1",
        ),
    ];
    for (args, message) in cases {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_coconet-launch"));
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        let o = run(cmd, Duration::from_secs(20));
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", o.show());
        assert!(o.stderr.contains(message), "{args:?}: {}", o.show());
    }
    // No program at all is a usage error (clap's status 2).
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_coconet-launch"));
    cmd.args(["--nproc-per-node", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let o = run(cmd, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(2), "{}", o.show());
}

// ---------------------------------------------------------------------------------------
// Two hosts made of namespaces (issue 48, item 2): each a network namespace joined to the
// other by a veth pair, with its own PID, IPC and mount namespaces (its own /dev/shm), so
// nothing one-host can succeed across them by accident.

/// Two "hosts" on this machine; removed on drop.
struct Hosts {
    names: [String; 2],
    addrs: [String; 2],
    /// Each host's end of the veth pair.
    links: [String; 2],
}

impl Hosts {
    /// Makes them, or says why this machine cannot (not root, no namespaces).
    fn make(tag: &str) -> Result<Hosts, String> {
        let id = std::process::id() % 200 + 20;
        let names = [0, 1].map(|h| format!("cc{tag}{id}h{h}"));
        let addrs = [1, 2].map(|h| format!("10.{id}.{}.{h}", tag.len()));
        let links = [0, 1].map(|h| format!("cc{tag}{id}v{h}"));
        let hosts = Hosts {
            names: names.clone(),
            addrs: addrs.clone(),
            links: links.clone(),
        };
        let [v0, v1] = &links;
        let ip = |args: &[&str]| -> Result<(), String> {
            let o = Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("ip: {e}"))?;
            if o.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&o.stderr).trim()
                ))
            }
        };
        for n in &names {
            // A namespace left by an earlier run of this test with the same pid goes.
            let _ = Command::new("ip").args(["netns", "del", n]).output();
            ip(&["netns", "add", n])?;
        }
        ip(&["link", "add", v0, "type", "veth", "peer", "name", v1])?;
        for (h, v) in [(0, v0), (1, v1)] {
            ip(&["link", "set", v, "netns", &names[h]])?;
            let inside = |args: &[&str]| {
                let mut a = vec!["netns", "exec", &names[h], "ip"];
                a.extend_from_slice(args);
                ip(&a)
            };
            inside(&["addr", "add", &format!("{}/24", addrs[h]), "dev", v])?;
            inside(&["link", "set", v, "up"])?;
            inside(&["link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }

    /// `cmd` run on host `h`: in its network namespace, with PID, IPC and mount
    /// namespaces of its own and a fresh /dev/shm (the command is PID 1 there: when it
    /// exits, everything it started goes with it).
    fn on(&self, h: usize, cmd: &Command) -> Command {
        let mut c = Command::new("ip");
        c.args([
            "netns",
            "exec",
            &self.names[h],
            "unshare",
            "--pid",
            "--fork",
            "--ipc",
        ])
        .args(["--mount", "--mount-proc", "sh", "-c"])
        .arg("mount -t tmpfs tmpfs /dev/shm && exec \"$@\"")
        .arg("sh")
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        // The command's environment as it would have had it: set and removed variables.
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    }

    /// Delays host 1's packets 2 ms and drops 1 % of them (`tc netem`), or says why
    /// this kernel cannot.
    fn impair(&self) -> Result<(), String> {
        let v1 = &self.links[1];
        let o = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.names[1],
                "tc",
                "qdisc",
                "add",
                "dev",
                v1,
            ])
            .args(["root", "netem", "delay", "2ms", "loss", "1%"])
            .output()
            .map_err(|e| format!("tc: {e}"))?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!(
                "tc netem: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
    }

    /// Cuts (or restores) the link between the hosts.
    fn link(&self, up: bool) {
        let v1 = &self.links[1];
        let state = if up { "up" } else { "down" };
        let ok = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.names[1],
                "ip",
                "link",
                "set",
                v1,
                state,
            ])
            .status()
            .unwrap();
        assert!(ok.success(), "link {state}");
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// Adam over TCP between two hosts of two ranks each, every run bitwise the
/// interpreter's; with `COCONET_TEST_RUN_SECS`, runs for that long (a partition test
/// cuts the link meanwhile).
#[test]
fn worker_hosts() {
    let Some(env) = as_rank() else { return };
    let (rank, ranks) = (env.rank, env.world_size);
    let p = adam_program::adam();
    let n = 1 << 16;
    let grads: Vec<Vec<f32>> = (0..ranks).map(|r| data::uniform_f32(r as u64, n)).collect();
    let (w, m, v) = (data::uniform_f32(1, n), vec![0.0f32; n], vec![0.0f32; n]);
    let all: Bindings =
        adam_program::adam_args(&grads, &w, &m, &v, adam_program::AdamParams::default()).into();
    let want = interpret(p.program(), ranks, &all).unwrap();
    let mine = all.tensor("g", Binding::this_rank(&grads[rank]));
    // The fused step first (its all-gathers relayed across hosts), then the plain one
    // (the job that runs on).
    let fused = candidates(p.program(), &[p.m.id(), p.v.id()])
        .into_iter()
        .find(|s| s.name() == "fuse(RS-C-AG)")
        .unwrap();
    let mut tcp = Tcp::from_env().unwrap();
    tcp.set_timeout(Duration::from_secs(3));
    let single_copy = tcp.single_copy();
    let hosts = tcp.hosts().to_vec();
    let tcp = std::sync::Arc::new(tcp);
    let mut job = None;
    for schedule in [fused, Schedule::new(p.program())] {
        let plan = Plan::lower(&schedule, ranks, mine.dims()).unwrap();
        let mut this = ProcessJob::new(&plan, &mine, tcp.clone()).unwrap();
        this.run().unwrap();
        let same = this
            .final_input_local::<f32>("w", rank)
            .unwrap()
            .iter()
            .zip(want.final_input_local::<f32>("w", rank).unwrap())
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "rank {rank}'s weights under {} differ from the interpreter's",
            schedule.name()
        );
        job = Some(this);
    }
    let mut job = job.unwrap();
    println!("OK rank {rank} of {ranks} single_copy={single_copy} hosts={hosts:?}");
    let secs: u64 = std::env::var("COCONET_TEST_RUN_SECS").map_or(0, |s| s.parse().unwrap());
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        if let Err(e) = job.run() {
            eprintln!("rank {rank} failed: {e}");
            std::process::exit(5);
        }
    }
}

/// A job of 2 hosts x 2 ranks across a veth link: the store on host 0, the secret from a
/// file on both; every rank bitwise the interpreter's, across hosts on the network path
/// (no rank sees all its peers' memory). A partition mid-run ends every rank with an error
/// naming a peer it lost, nothing left behind (each host's PID namespace dies with its
/// launcher); the link restored, a new job runs on the same hosts.
#[test]
fn a_job_across_two_namespaced_hosts_runs_and_a_partition_ends_it() {
    let hosts = match Hosts::make("j") {
        Ok(h) => h,
        Err(why) => {
            println!("skipped: this machine cannot make hosts in namespaces ({why})");
            return;
        }
    };
    let dir = pid_dir("hosts");
    let secret = dir.join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let port = "29411";
    let job = |run_secs: &str| -> Vec<(std::process::Child, Instant)> {
        (0..2)
            .map(|h| {
                let mut cmd = launcher(
                    "worker_hosts",
                    &[
                        "--nnodes",
                        "2",
                        "--node-rank",
                        &h.to_string(),
                        "--nproc-per-node",
                        "2",
                        "--master-addr",
                        &hosts.addrs[0],
                        "--master-port",
                        port,
                        "--timeout",
                        "20",
                        "--grace",
                        "1",
                        "--secret-file",
                        secret.to_str().unwrap(),
                    ],
                );
                cmd.env_remove("COCONET_JOB_SECRET")
                    .env("COCONET_TEST_RUN_SECS", run_secs);
                start(hosts.on(h, &cmd))
            })
            .collect()
    };
    // One job, to the end.
    for (h, o) in job("0").into_iter().enumerate() {
        let o = finish(o, Duration::from_secs(60));
        assert!(o.status.success(), "host {h}: {}", o.show());
        for r in [2 * h, 2 * h + 1] {
            assert!(
                o.stdout.contains(&format!(
                    "OK rank {r} of 4 single_copy=false hosts=[0, 0, 2, 2]"
                )),
                "host {h}: {}",
                o.show()
            );
        }
    }
    // A partition mid-run.
    let running = job("30");
    thread::sleep(Duration::from_secs(4));
    hosts.link(false);
    let cut = Instant::now();
    for (h, o) in running.into_iter().enumerate() {
        let o = finish(o, Duration::from_secs(60));
        assert!(
            !o.status.success(),
            "host {h} went on after the partition: {}",
            o.show()
        );
        // Each host names what it lost: a peer rank, (host 1) the store on host 0, or
        // the other host's launcher, silent past the timeout (whichever is seen first:
        // a partition ends no connection, every side waits out its deadline).
        let named = (0..4).any(|r| o.stderr.contains(&format!("ranks [{r}")))
            || o.stderr.contains(&format!(
                "lost the rendezvous store: lost the connection to the rendezvous store at {}",
                hosts.addrs[0]
            ))
            || o.stderr.contains(&format!(
                "launcher of node {} has not been heard from",
                1 - h
            ));
        assert!(named, "host {h}: {}", o.show());
        let verdict: Vec<_> = o.stderr.lines().filter(|l| l.contains("error")).collect();
        println!("host {h}, {:.1?} after the cut: {verdict:?}", cut.elapsed());
    }
    assert!(
        cut.elapsed() < Duration::from_secs(40),
        "{:?}",
        cut.elapsed()
    );
    // Restored: a new job on the same hosts.
    hosts.link(true);
    for (h, o) in job("0").into_iter().enumerate() {
        let o = finish(o, Duration::from_secs(60));
        assert!(
            o.status.success(),
            "host {h} after the link came back: {}",
            o.show()
        );
    }
    // Across a lossy, slow link: still bitwise (TCP retransmits; nothing is lost).
    match hosts.impair() {
        Err(why) => println!("skipped the lossy link: this kernel cannot impair it ({why})"),
        Ok(()) => {
            for (h, o) in job("0").into_iter().enumerate() {
                let o = finish(o, Duration::from_secs(60));
                assert!(
                    o.status.success(),
                    "host {h} over a lossy link: {}",
                    o.show()
                );
            }
        }
    }
}
