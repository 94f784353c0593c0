//! Starting a job's ranks as processes, and stopping all of them when one fails.
//!
//! A multi-process job is only as healthy as its sickest rank: when one rank dies, the
//! others block forever in their next collective. So the launcher watches every rank it
//! started, and the first one that exits abnormally (a non-zero status or a signal) makes
//! it kill the rest and fail with an error naming that rank and how it ended. The options
//! and the variables the ranks receive are torchrun's, so scripts and programs written
//! for one work with the other.
//!
//! The launcher of node 0 hosts the rendezvous [`StoreServer`] at
//! `MASTER_ADDR:MASTER_PORT` before it starts its ranks. With several nodes, one launcher
//! per node joins the store too: the launchers meet at a barrier before any rank starts
//! (so every node is present and agrees on the number of ranks per node), publish a
//! heartbeat, and tell each other when a rank fails, so one failing rank stops the whole
//! job rather than one node of it. Node 0 keeps the store up until every node's ranks are
//! done.
//!
//! The launcher owns its ranks: each runs in a process group of its own (a wrapper
//! script's children are stopped with it) and is killed if the launcher dies; SIGTERM,
//! SIGINT and SIGHUP sent to the launcher are forwarded to every rank, and ranks are
//! stopped with SIGTERM, then SIGKILL after a grace period ([`LaunchConfig::grace`]), so
//! a rank writing a checkpoint can finish it.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use coconet_trust::{JOB_SECRET, JOB_SECRET_FILE, JobSecret, SecretError};
use thiserror::Error;

use super::env::{
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, RANK, RENDEZVOUS_TIMEOUT, WORLD_SIZE,
};
use super::heartbeat::{BEAT_INTERVAL, HEARTBEAT_TIMEOUT, Watch};
use super::server::StoreServer;
use super::signals::{Noted, own_group_dying_with_parent, signal_group};
use super::store::{FIRST_FAILURE, LAUNCH_PREFIX, Store, StoreError};

/// How often the launcher looks at its ranks.
const POLL: Duration = Duration::from_millis(20);
/// How often a launcher looks at the store for news from other nodes.
const STORE_POLL: Duration = Duration::from_millis(200);
/// How often a launcher tells the others it is alive.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long node 0 keeps the store up after a failure for the other nodes to hear of it.
const LINGER: Duration = Duration::from_secs(2);
/// How long stopped ranks may take to exit before they are killed, by default.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);
/// How long to wait for a killed rank to be reaped.
const REAP: Duration = Duration::from_secs(5);

/// What to launch and where this node sits in the job (`coconet-launch`'s options).
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchConfig {
    /// Ranks started on this node (`--nproc-per-node`), usually one per GPU.
    pub nproc_per_node: usize,
    /// Nodes in the job (`--nnodes`), each running one launcher.
    pub nnodes: usize,
    /// This node's index, `0..nnodes` (`--node-rank`); node 0 hosts the store.
    pub node_rank: usize,
    /// The host of node 0, where the store listens (`--master-addr`).
    pub master_addr: String,
    /// The store's port (`--master-port`). 0 lets node 0 pick a free port, which only
    /// works with one node (other nodes could not know it).
    pub master_port: u16,
    /// How long the launchers wait for each other, and the rendezvous timeout passed to
    /// the ranks (`--timeout`, seconds).
    pub timeout: Duration,
    /// How long ranks told to stop (SIGTERM) may take before they are killed (SIGKILL)
    /// (`--grace`, seconds).
    pub grace: Duration,
    /// The longest the ranks may run (`--job-timeout`): past it they are stopped (a
    /// rank that hangs without touching the store would otherwise be waited for
    /// forever). `None`: no limit.
    pub job_timeout: Option<Duration>,
    /// The longest a rank that has beaten may go without a beat (`--heartbeat-timeout`,
    /// at least twice [`BEAT_INTERVAL`]): past it the rank is taken for hung and the
    /// ranks are stopped. Ranks beat through [`Heartbeat`](super::Heartbeat) (coconet's
    /// process backends at every run); a rank that never beats is not watched. `None`:
    /// no watch.
    pub heartbeat_timeout: Option<Duration>,
    /// The job's name (`--rdzv-id`, torchrun's): a launcher joining a store that serves
    /// another job (another run id, node count or ranks per node) is refused, and the
    /// job is left alone.
    pub run_id: String,
    /// The job secret every connection of the job proves (`--secret-file`,
    /// `--insecure-no-secret`). `None`: the environment's ([`JobSecret::from_env`]), else,
    /// for a one-node job, a fresh one; a job across nodes must be given one (every
    /// node's launcher the same). The ranks receive it in `COCONET_JOB_SECRET`.
    pub secret: Option<JobSecret>,
    /// The program every rank runs.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
}

impl LaunchConfig {
    /// One node, `nproc_per_node` ranks of `program`, the store at 127.0.0.1:29500 and a
    /// 300 s rendezvous timeout (torchrun's defaults).
    pub fn new(program: impl Into<OsString>, nproc_per_node: usize) -> LaunchConfig {
        LaunchConfig {
            nproc_per_node,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            timeout: super::env::DEFAULT_TIMEOUT,
            grace: DEFAULT_GRACE,
            job_timeout: None,
            heartbeat_timeout: None,
            run_id: "none".into(),
            secret: None,
            program: program.into(),
            args: Vec::new(),
        }
    }

    /// The total number of ranks, `nnodes * nproc_per_node`.
    pub fn world_size(&self) -> usize {
        self.nnodes * self.nproc_per_node
    }

    /// Checks the options against each other.
    pub fn validate(&self) -> Result<(), LaunchError> {
        let bad = |m: String| Err(LaunchError::Config(m));
        if self.nproc_per_node == 0 {
            return bad("--nproc-per-node must be at least 1".into());
        }
        if let Some(t) = self.heartbeat_timeout
            && t < 2 * BEAT_INTERVAL
        {
            return bad(format!(
                "--heartbeat-timeout must be at least {:?} (twice the interval of ranks' beats)",
                2 * BEAT_INTERVAL
            ));
        }
        if self.nnodes == 0 {
            return bad("--nnodes must be at least 1".into());
        }
        if self.node_rank >= self.nnodes {
            return bad(format!(
                "--node-rank {} is out of range for --nnodes {}",
                self.node_rank, self.nnodes
            ));
        }
        if self.nnodes.checked_mul(self.nproc_per_node).is_none() {
            return bad("--nnodes × --nproc-per-node overflows".into());
        }
        if self.master_port == 0 && self.nnodes > 1 {
            return bad("--master-port 0 (any free port) works only with --nnodes 1: the other nodes could not know the port".into());
        }
        if self.master_addr.trim().is_empty() {
            return bad("--master-addr is empty".into());
        }
        if self.timeout.is_zero() {
            return bad("--timeout must be positive".into());
        }
        if self.program.is_empty() {
            return bad("no program to launch".into());
        }
        Ok(())
    }
}

/// How a rank's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankExit {
    /// It exited with this status.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl RankExit {
    fn of(status: ExitStatus) -> RankExit {
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            if let Some(signal) = status.signal() {
                return RankExit::Signal(signal);
            }
        }
        RankExit::Code(status.code().unwrap_or(-1))
    }

    /// The exit status a shell would report for it (128 + n for signal n).
    pub fn shell_status(self) -> i32 {
        match self {
            RankExit::Code(c) => c,
            RankExit::Signal(s) => 128 + s,
        }
    }
}

impl fmt::Display for RankExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RankExit::Code(c) => write!(f, "exited with status {c}"),
            RankExit::Signal(s) => {
                let name = match s {
                    1 => " (SIGHUP)",
                    2 => " (SIGINT)",
                    4 => " (SIGILL)",
                    6 => " (SIGABRT)",
                    7 => " (SIGBUS)",
                    8 => " (SIGFPE)",
                    9 => " (SIGKILL)",
                    11 => " (SIGSEGV)",
                    13 => " (SIGPIPE)",
                    15 => " (SIGTERM)",
                    _ => "",
                };
                write!(f, "was killed by signal {s}{name}")
            }
        }
    }
}

/// Why a launch failed.
#[derive(Debug, Error)]
pub enum LaunchError {
    /// The options are inconsistent.
    #[error("{0}")]
    Config(String),
    /// The job secret is missing or unusable.
    #[error("{0}")]
    Secret(#[from] SecretError),
    /// Starting or joining the rendezvous store failed.
    #[error("rendezvous: {0}")]
    Rendezvous(#[from] StoreError),
    /// Not every node's launcher joined within the timeout.
    #[error(
        "only {arrived} of {nnodes} nodes' launchers joined the rendezvous at {store} within {waited:.1?} (start one coconet-launch per node, each with its own --node-rank)"
    )]
    NodesMissing {
        /// How many launchers joined.
        arrived: i64,
        /// How many were expected.
        nnodes: usize,
        /// The store's address.
        store: String,
        /// How long this launcher waited.
        waited: Duration,
    },
    /// A rank's process could not be started.
    #[error("could not start rank {rank} ({program}): {source}; stopped {}", stopped_phrase(*stopped))]
    Spawn {
        /// The rank.
        rank: usize,
        /// The program.
        program: String,
        /// What the OS said.
        source: io::Error,
        /// How many already started ranks were killed.
        stopped: usize,
    },
    /// A rank exited abnormally; the others were killed.
    #[error(
        "rank {rank} (pid {pid}) {exit}; stopped {}{}",
        stopped_phrase(*stopped),
        reported.as_ref().map(|r| format!("; the first failure the ranks reported: {r}")).unwrap_or_default()
    )]
    RankFailed {
        /// The global rank that failed first.
        rank: usize,
        /// Its process id.
        pid: u32,
        /// How it ended.
        exit: RankExit,
        /// How many ranks of this node were still running and were killed.
        stopped: usize,
        /// The first failure a rank's process backend published (the rank it names
        /// and why), where one did: the cause, when the rank that exited first only
        /// reacted to it.
        reported: Option<String>,
    },
    /// Watching a rank's process failed.
    #[error("could not watch rank {rank} (pid {pid}): {source}; stopped {}", stopped_phrase(*stopped))]
    Wait {
        /// The rank.
        rank: usize,
        /// Its process id.
        pid: u32,
        /// What the OS said.
        source: io::Error,
        /// How many ranks of this node were killed.
        stopped: usize,
    },
    /// The ranks ran past the job's time limit; they were stopped.
    #[error("the ranks ran past --job-timeout {limit:?}; stopped {}", stopped_phrase_all(*stopped))]
    JobTimeout {
        /// The limit.
        limit: Duration,
        /// How many ranks were running and were stopped.
        stopped: usize,
    },
    /// A rank that had beaten went silent for longer than `--heartbeat-timeout` (hung,
    /// or busy outside coconet's runs without beating); the ranks were stopped.
    #[error(
        "rank {rank} (pid {pid}) sent no heartbeat for {silent:.1?} (--heartbeat-timeout \
         {limit:?}): hung, or busy without beating; stopped {}",
        stopped_phrase_all(*stopped)
    )]
    RankSilent {
        /// The rank.
        rank: usize,
        /// Its process id.
        pid: u32,
        /// How long it had been silent.
        silent: Duration,
        /// The limit.
        limit: Duration,
        /// How many ranks were running and were stopped.
        stopped: usize,
    },
    /// The launcher was told to stop (SIGTERM, SIGINT or SIGHUP): it stopped its ranks.
    #[error("received signal {signal}; stopped {}", stopped_phrase_all(*stopped))]
    Signalled {
        /// The signal.
        signal: i32,
        /// How many ranks were running and were stopped.
        stopped: usize,
    },
    /// Another node's launcher reported a failure; this node's ranks were killed.
    #[error("{message}; stopped the {stopped} running ranks of node {node}")]
    Aborted {
        /// This node.
        node: usize,
        /// The other node's report, e.g. "node 1: rank 5 (pid 77) exited with status 3".
        message: String,
        /// How many ranks of this node were killed.
        stopped: usize,
    },
    /// The connection to the store broke (node 0's launcher is gone).
    #[error(
        "lost the rendezvous store: {source}; stopped the {stopped} running ranks of node {node}"
    )]
    StoreLost {
        /// This node.
        node: usize,
        /// The store failure.
        source: StoreError,
        /// How many ranks of this node were killed.
        stopped: usize,
    },
    /// Another node's launcher stopped sending heartbeats.
    #[error(
        "the launcher of node {peer} has not been heard from for {silent:.1?}; stopped the {stopped} running ranks of node {node}"
    )]
    NodeLost {
        /// This node.
        node: usize,
        /// The silent node.
        peer: usize,
        /// How long it has been silent.
        silent: Duration,
        /// How many ranks of this node were killed.
        stopped: usize,
    },
}

impl LaunchError {
    /// The status `coconet-launch` exits with: the failed rank's status if it exited with
    /// a non-zero one, 128 + n if signal n killed it or the launcher, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            LaunchError::RankFailed { exit, .. } => match exit.shell_status() {
                s @ 1..=255 => s,
                _ => 1,
            },
            LaunchError::Signalled { signal, .. } => 128 + signal,
            _ => 1,
        }
    }
}

fn stopped_phrase_all(n: usize) -> String {
    match n {
        1 => "the running rank".into(),
        n => format!("the {n} running ranks"),
    }
}

fn stopped_phrase(n: usize) -> String {
    match n {
        0 => "no other rank (none was running)".into(),
        1 => "the other rank".into(),
        n => format!("the other {n} ranks"),
    }
}

/// Runs a job's ranks on this node: on node 0 hosts the store, starts
/// `config.nproc_per_node` processes of `config.program` with the launch variables set,
/// and returns when all of them exited with status 0, or with an error as soon as one
/// failed (after killing the others).
///
/// Each rank receives `RANK` (= `node_rank * nproc_per_node + local rank`),
/// `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (the real
/// port when `master_port` is 0) and `COCONET_RENDEZVOUS_TIMEOUT`; see
/// [`LaunchEnv`](super::LaunchEnv). Their standard streams are the launcher's.
pub fn launch(config: &LaunchConfig) -> Result<(), LaunchError> {
    config.validate()?;
    let secret = job_secret(config)?;
    let server = if config.node_rank == 0 {
        Some(StoreServer::bind(
            host_port(&config.master_addr, config.master_port),
            secret.clone(),
        )?)
    } else {
        None
    };
    let port = server
        .as_ref()
        .map_or(config.master_port, |s| s.local_addr().port());
    let mut agent = Agent::join(config, &host_port(&config.master_addr, port), &secret)?;
    let signals = Noted::install();
    let result = run_ranks(config, port, &secret, &mut agent, &signals);
    drop(signals);
    let result = match result {
        Ok(()) => agent.finish(),
        Err(e) => {
            agent.report_failure(&e);
            Err(e)
        }
    };
    drop(server);
    result
}

/// The job's secret: the configuration's, the environment's, or (one node only) a fresh one.
fn job_secret(config: &LaunchConfig) -> Result<JobSecret, LaunchError> {
    if let Some(secret) = &config.secret {
        return Ok(secret.clone());
    }
    match JobSecret::from_env() {
        Ok((secret, _)) => Ok(secret),
        Err(SecretError::Missing) if config.nnodes == 1 => Ok(JobSecret::generate()?),
        Err(SecretError::Missing) => Err(LaunchError::Config(format!(
            "a job across {} nodes needs one job secret on every node: give each launcher \
             the same --secret-file (e.g. made with `openssl rand -hex 32 > secret; chmod 600 \
             secret`) or set {JOB_SECRET}/{JOB_SECRET_FILE}; --insecure-no-secret lets \
             anyone who reaches the job's ports join it",
            config.nnodes
        ))),
        Err(e) => Err(e.into()),
    }
}

/// `host:port`, with brackets around a bare IPv6 host.
fn host_port(host: &str, port: u16) -> String {
    let host = host.trim();
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// One started rank.
struct RankProcess {
    rank: usize,
    child: Child,
    running: bool,
    /// It exited abnormally: what it started in its group is stopped with the others.
    failed: bool,
}

fn run_ranks(
    config: &LaunchConfig,
    port: u16,
    secret: &JobSecret,
    agent: &mut Agent,
    signals: &Noted,
) -> Result<(), LaunchError> {
    let grace = config.grace;
    let started = Instant::now();
    let world = config.world_size();
    let mut ranks: Vec<RankProcess> = Vec::with_capacity(config.nproc_per_node);
    for local in 0..config.nproc_per_node {
        let rank = config.node_rank * config.nproc_per_node + local;
        let mut cmd = Command::new(&config.program);
        own_group_dying_with_parent(&mut cmd);
        secret.export(&mut cmd);
        let spawned = cmd
            .args(&config.args)
            .env(RANK, rank.to_string())
            .env(WORLD_SIZE, world.to_string())
            .env(LOCAL_RANK, local.to_string())
            .env(LOCAL_WORLD_SIZE, config.nproc_per_node.to_string())
            .env(MASTER_ADDR, config.master_addr.trim())
            .env(MASTER_PORT, port.to_string())
            .env(RENDEZVOUS_TIMEOUT, config.timeout.as_secs_f64().to_string())
            .env(super::LAUNCHED_BY_COCONET, "1")
            .envs(
                config
                    .heartbeat_timeout
                    .map(|t| (HEARTBEAT_TIMEOUT, t.as_secs_f64().to_string())),
            )
            .spawn();
        match spawned {
            Ok(child) => ranks.push(RankProcess {
                rank,
                child,
                running: true,
                failed: false,
            }),
            Err(source) => {
                let stopped = stop_all(&mut ranks, grace);
                return Err(LaunchError::Spawn {
                    rank,
                    program: config.program.to_string_lossy().into_owned(),
                    source,
                    stopped,
                });
            }
        }
    }
    let (mut watch, mut last_watch) = (Watch::default(), Instant::now());
    loop {
        let mut running = 0;
        // Ranks found dead in this pass: a rank killed by a signal takes its peers down
        // within milliseconds, so several are often found in one pass.
        let mut failed: Vec<(usize, u32, RankExit)> = Vec::new();
        for i in 0..ranks.len() {
            if !ranks[i].running {
                continue;
            }
            let (rank, pid) = (ranks[i].rank, ranks[i].child.id());
            match ranks[i].child.try_wait() {
                Ok(None) => running += 1,
                Ok(Some(status)) => {
                    ranks[i].running = false;
                    ranks[i].failed = !status.success();
                    if !status.success() {
                        failed.push((rank, pid, RankExit::of(status)));
                    }
                }
                Err(source) => {
                    let stopped = stop_all(&mut ranks, grace);
                    return Err(LaunchError::Wait {
                        rank,
                        pid,
                        source,
                        stopped,
                    });
                }
            }
        }
        if let Some(&(rank, pid, exit)) = culprit(&failed) {
            let stopped = stop_all(&mut ranks, grace);
            // Best effort, bounded: the store is this launcher's (node 0) or answers
            // within its deadline.
            let reported = agent
                .store
                .try_get(&key(FIRST_FAILURE))
                .ok()
                .flatten()
                .map(|r| String::from_utf8_lossy(&r).into_owned());
            return Err(LaunchError::RankFailed {
                rank,
                pid,
                exit,
                stopped,
                reported,
            });
        }
        if running == 0 {
            return Ok(());
        }
        if let Some(signal) = signals.received() {
            let stopped = stop_all(&mut ranks, grace);
            return Err(LaunchError::Signalled { signal, stopped });
        }
        if let Some(limit) = config.job_timeout
            && started.elapsed() > limit
        {
            let stopped = stop_all(&mut ranks, grace);
            return Err(LaunchError::JobTimeout { limit, stopped });
        }
        if let Some(limit) = config.heartbeat_timeout
            && last_watch.elapsed() >= STORE_POLL
        {
            last_watch = Instant::now();
            let alive = ranks.iter().filter(|r| r.running).map(|r| r.rank);
            match watch.silent(&mut agent.store, alive, limit) {
                Ok(None) => {}
                Ok(Some((rank, silent))) => {
                    let pid = ranks
                        .iter()
                        .find(|r| r.rank == rank)
                        .map_or(0, |r| r.child.id());
                    let stopped = stop_all(&mut ranks, grace);
                    return Err(LaunchError::RankSilent {
                        rank,
                        pid,
                        silent,
                        limit,
                        stopped,
                    });
                }
                Err(source) => {
                    let stopped = stop_all(&mut ranks, grace);
                    return Err(Interrupt::StoreLost(source).into_error(config.node_rank, stopped));
                }
            }
        }
        if let Err(interrupt) = agent.check() {
            let stopped = stop_all(&mut ranks, grace);
            return Err(interrupt.into_error(config.node_rank, stopped));
        }
        std::thread::sleep(POLL);
    }
}

/// Which of the ranks found dead in one pass (in rank order) the verdict names: one a
/// signal killed (the cause: its peers exit with an error because it vanished), else the
/// first.
fn culprit(failed: &[(usize, u32, RankExit)]) -> Option<&(usize, u32, RankExit)> {
    failed
        .iter()
        .find(|f| matches!(f.2, RankExit::Signal(_)))
        .or_else(|| failed.first())
}

/// Stops every rank still running — SIGTERM to its process group, SIGKILL to whatever
/// is left of the group after `grace` — and reaps it; returns how many were running.
/// The groups of ranks that failed are stopped too (a wrapper's children); those of
/// ranks that finished cleanly are left alone (their group ids may be reused by now).
fn stop_all(ranks: &mut [RankProcess], grace: Duration) -> usize {
    let stopped = ranks.iter().filter(|r| r.running).count();
    let groups: Vec<u32> = ranks
        .iter()
        .filter(|r| r.running || r.failed)
        .map(|r| r.child.id())
        .collect();
    for &g in &groups {
        signal_group(g, libc::SIGTERM);
    }
    let reap = |ranks: &mut [RankProcess], until: Instant| {
        for r in ranks.iter_mut().filter(|r| r.running) {
            while Instant::now() < until {
                match r.child.try_wait() {
                    Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                    _ => {
                        r.running = false;
                        break;
                    }
                }
            }
        }
    };
    reap(ranks, Instant::now() + grace);
    // What ignored SIGTERM, and what failed ranks left behind in their groups.
    for &g in &groups {
        signal_group(g, libc::SIGKILL);
    }
    reap(ranks, Instant::now() + REAP);
    for r in ranks.iter_mut() {
        r.running = false;
    }
    stopped
}

/// News from the store that stops this node's ranks.
enum Interrupt {
    Aborted(String),
    StoreLost(StoreError),
    NodeLost { peer: usize, silent: Duration },
}

impl Interrupt {
    fn into_error(self, node: usize, stopped: usize) -> LaunchError {
        match self {
            Interrupt::Aborted(message) => LaunchError::Aborted {
                node,
                message,
                stopped,
            },
            Interrupt::StoreLost(source) => LaunchError::StoreLost {
                node,
                source,
                stopped,
            },
            Interrupt::NodeLost { peer, silent } => LaunchError::NodeLost {
                node,
                peer,
                silent,
                stopped,
            },
        }
    }
}

/// A launcher's own connection to the store, through which the nodes coordinate.
struct Agent {
    store: Store,
    node: usize,
    nnodes: usize,
    timeout: Duration,
    last_poll: Instant,
    last_beat: Instant,
    beats: u64,
    /// Per other node: its last heartbeat value and when it changed.
    peers: Vec<(Option<Vec<u8>>, Instant)>,
}

fn key(rest: impl fmt::Display) -> String {
    format!("{LAUNCH_PREFIX}{rest}")
}

impl Agent {
    /// Connects to the store and meets the other nodes' launchers.
    fn join(
        config: &LaunchConfig,
        store_addr: &str,
        secret: &JobSecret,
    ) -> Result<Agent, LaunchError> {
        // Answers within 5 s at most: a launcher cut off from node 0 reports and exits
        // in seconds, not after the whole rendezvous timeout.
        let mut store = Store::connect(store_addr, secret, config.timeout)?
            .with_deadline(config.timeout.min(Duration::from_secs(5)));
        let node = config.node_rank;
        // Node 0 hosts the store and says which job it serves; a launcher of another
        // job is refused before it touches anything of this one.
        let job = format!(
            "run id {:?}, {} nodes of {} ranks",
            config.run_id, config.nnodes, config.nproc_per_node
        );
        if node == 0 {
            store.set(&key("job"), job.as_bytes())?;
        } else {
            let served = store.get(&key("job"), config.timeout)?;
            let served = String::from_utf8_lossy(&served).into_owned();
            if served != job {
                return Err(LaunchError::Config(format!(
                    "the store at {store_addr} serves another job ({served}); this launcher \
                     is node {node} of {job}: check --master-addr/--master-port, --nnodes, \
                     --nproc-per-node and --rdzv-id"
                )));
            }
        }
        store.set(
            &key(format_args!("nproc/{node}")),
            config.nproc_per_node.to_string().as_bytes(),
        )?;
        match store.barrier(&key("agents"), config.nnodes, config.timeout) {
            Ok(()) => {}
            Err(StoreError::BarrierTimeout {
                arrived, waited, ..
            }) => {
                return Err(LaunchError::NodesMissing {
                    arrived,
                    nnodes: config.nnodes,
                    store: store_addr.to_string(),
                    waited,
                });
            }
            Err(e) => return Err(e.into()),
        }
        for other in 0..config.nnodes {
            let theirs = store.get(&key(format_args!("nproc/{other}")), config.timeout)?;
            let theirs = String::from_utf8_lossy(&theirs).into_owned();
            if theirs != config.nproc_per_node.to_string() {
                return Err(LaunchError::Config(format!(
                    "node {other} runs --nproc-per-node {theirs} but node {node} runs {}; every node must run the same number",
                    config.nproc_per_node
                )));
            }
        }
        let now = Instant::now();
        Ok(Agent {
            store,
            node,
            nnodes: config.nnodes,
            timeout: config.timeout,
            last_poll: now,
            last_beat: now,
            beats: 0,
            peers: vec![(None, now); config.nnodes],
        })
    }

    /// With several nodes: sends this node's heartbeat and looks for failures elsewhere.
    /// At most one store round trip per [`STORE_POLL`].
    fn check(&mut self) -> Result<(), Interrupt> {
        if self.nnodes == 1 || self.last_poll.elapsed() < STORE_POLL {
            return Ok(());
        }
        self.last_poll = Instant::now();
        self.poll().map_err(Interrupt::StoreLost)?
    }

    fn poll(&mut self) -> Result<Result<(), Interrupt>, StoreError> {
        if self.last_beat.elapsed() >= HEARTBEAT || self.beats == 0 {
            self.beats += 1;
            let beat = self.beats.to_string();
            self.store
                .set(&key(format_args!("alive/{}", self.node)), beat.as_bytes())?;
            self.last_beat = Instant::now();
        }
        if let Some(message) = self.store.try_get(&key("abort"))? {
            return Ok(Err(Interrupt::Aborted(
                String::from_utf8_lossy(&message).into_owned(),
            )));
        }
        for peer in 0..self.nnodes {
            if peer == self.node
                || self
                    .store
                    .try_get(&key(format_args!("finished/{peer}")))?
                    .is_some()
            {
                continue;
            }
            let beat = self.store.try_get(&key(format_args!("alive/{peer}")))?;
            let (last, since) = &mut self.peers[peer];
            if beat != *last {
                *last = beat;
                *since = Instant::now();
            } else if since.elapsed() > self.timeout.max(HEARTBEAT * 5) {
                return Ok(Err(Interrupt::NodeLost {
                    peer,
                    silent: since.elapsed(),
                }));
            }
        }
        Ok(Ok(()))
    }

    /// This node's ranks all succeeded: says so, and on node 0 keeps the store up until
    /// every other node's ranks are done too.
    fn finish(&mut self) -> Result<(), LaunchError> {
        if self.nnodes == 1 {
            return Ok(());
        }
        self.store
            .set(&key(format_args!("finished/{}", self.node)), b"")?;
        if self.node != 0 {
            return Ok(());
        }
        loop {
            let mut all = true;
            for peer in 0..self.nnodes {
                if self
                    .store
                    .try_get(&key(format_args!("finished/{peer}")))?
                    .is_none()
                {
                    all = false;
                }
            }
            if all {
                return Ok(());
            }
            self.last_poll = Instant::now();
            if let Err(interrupt) = self.poll()? {
                return Err(interrupt.into_error(self.node, 0));
            }
            std::thread::sleep(STORE_POLL);
        }
    }

    /// Tells the other nodes' launchers that this node failed (unless another node's
    /// failure is the reason), and on node 0 keeps the store up a little while for them to
    /// hear it.
    fn report_failure(&mut self, error: &LaunchError) {
        if self.nnodes == 1 {
            return;
        }
        if !matches!(
            error,
            LaunchError::Aborted { .. } | LaunchError::StoreLost { .. }
        ) {
            let message = format!("node {}: {error}", self.node);
            if let Ok(None) = self.store.try_get(&key("abort")) {
                let _ = self.store.set(&key("abort"), message.as_bytes());
            }
        }
        let _ = self
            .store
            .set(&key(format_args!("stopped/{}", self.node)), b"");
        if self.node == 0 {
            let keys: Vec<String> = (0..self.nnodes)
                .map(|n| key(format_args!("stopped/{n}")))
                .collect();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let _ = self.store.wait(&keys, LINGER);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank killed by a signal and the peers that exited with an error because it
    /// vanished, all found in one pass: the verdict names the killed one, whatever its
    /// rank; without a signal, the first found.
    #[test]
    fn the_verdict_names_the_rank_a_signal_killed_before_its_peers() {
        let found = [
            (0, 10, RankExit::Code(1)),
            (1, 11, RankExit::Signal(9)),
            (2, 12, RankExit::Code(1)),
        ];
        assert_eq!(culprit(&found).map(|f| f.0), Some(1));
        let codes = [(2, 12, RankExit::Code(3)), (3, 13, RankExit::Code(1))];
        assert_eq!(culprit(&codes).map(|f| f.0), Some(2));
        assert!(culprit(&[]).is_none());
    }
}
