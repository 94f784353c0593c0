//! The `coconet-launch` command line (feature `launcher`): starts a multi-process job's ranks
//! on this node, torchrun-style.
//!
//! ```text
//! coconet-launch --nproc-per-node 4 -- ./my_training_binary --its-own-args
//! ```
//!
//! Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//! MASTER_PORT and the job secret (COCONET_JOB_SECRET); node 0's launcher hosts the
//! rendezvous store. When a rank fails, the
//! others are stopped and this exits with the failed rank's status. The logic lives in
//! [`launch`]; this module only parses the command line. The binary is [`main`]; a test
//! of another crate that needs a launcher process runs [`main_from`] in a process of its
//! own.

use crate::{JobSecret, LaunchConfig, launch};
use clap::Parser;
use std::ffi::OsString;
use std::io::Write;
use std::time::Duration;

/// Starts a job's ranks on this node and stops them all when one fails.
#[derive(Debug, Parser)]
#[command(name = "coconet-launch", version)]
struct Args {
    /// Ranks to start on this node (usually one per GPU).
    #[arg(long = "nproc-per-node", alias = "nproc_per_node", value_name = "N")]
    nproc_per_node: usize,
    /// Nodes in the job, each running one coconet-launch.
    #[arg(long, default_value_t = 1, value_name = "N")]
    nnodes: usize,
    /// This node's index, 0..nnodes; node 0 hosts the rendezvous store.
    #[arg(
        long = "node-rank",
        alias = "node_rank",
        default_value_t = 0,
        value_name = "R"
    )]
    node_rank: usize,
    /// Address of node 0, where the rendezvous store listens.
    #[arg(
        long = "master-addr",
        alias = "master_addr",
        default_value = "127.0.0.1",
        value_name = "ADDR"
    )]
    master_addr: String,
    /// Port of the rendezvous store (0: any free port, one node only).
    #[arg(
        long = "master-port",
        alias = "master_port",
        default_value_t = 29500,
        value_name = "PORT"
    )]
    master_port: u16,
    /// Seconds the launchers wait for each other; passed to the ranks as their
    /// rendezvous timeout (COCONET_RENDEZVOUS_TIMEOUT).
    #[arg(long, default_value = "300", value_name = "SECS", value_parser = parse_timeout)]
    timeout: Duration,
    /// Seconds ranks told to stop (SIGTERM: a rank failed, or the launcher got SIGTERM,
    /// SIGINT or SIGHUP) have to exit before they are killed (SIGKILL).
    #[arg(long, default_value = "5", value_name = "SECS", value_parser = parse_timeout)]
    grace: Duration,
    /// Seconds the ranks may run at most; past them, they are stopped and the launcher
    /// fails (a rank hung outside any collective is not waited for forever).
    #[arg(long = "job-timeout", value_name = "SECS", value_parser = parse_timeout)]
    job_timeout: Option<Duration>,
    /// Seconds a rank that has sent heartbeats may go without one (at least 2); past
    /// them it is taken for hung and the ranks are stopped. coconet's process backends
    /// beat from a thread of their own unless a run is stuck that long; other code notes
    /// progress with `launch::Heartbeat`.
    #[arg(long = "heartbeat-timeout", value_name = "SECS", value_parser = parse_timeout)]
    heartbeat_timeout: Option<Duration>,
    /// The job's name: every node's launcher must give the same one (a launcher of
    /// another job pointed at this store is refused instead of joining it).
    #[arg(
        long = "rdzv-id",
        alias = "rdzv_id",
        default_value = "none",
        value_name = "ID"
    )]
    rdzv_id: String,
    /// A file holding the job secret as hex, readable by its owner only (the same file
    /// on every node of a multi-node job). Without it: COCONET_JOB_SECRET or
    /// COCONET_JOB_SECRET_FILE, else a fresh secret for a one-node job. Every connection
    /// of the job (store, ranks' data ports, parameter servers) proves it.
    #[arg(
        long = "secret-file",
        value_name = "PATH",
        conflicts_with = "insecure_no_secret"
    )]
    secret_file: Option<std::path::PathBuf>,
    /// Runs the job without a secret: anyone who can reach its ports can join it.
    #[arg(long = "insecure-no-secret")]
    insecure_no_secret: bool,
    /// The program each rank runs, and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    command: Vec<OsString>,
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .parse()
        .map_err(|e| format!("not a number of seconds: {e}"))?;
    if secs.is_nan() || secs <= 0.0 {
        return Err("must be a positive number of seconds".into());
    }
    Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
}

/// The `coconet-launch` binary: [`main_from`] on this process's arguments.
pub fn main() {
    main_from(std::env::args_os());
}

/// `coconet-launch` on the command line `args` (the program's name first): returns when
/// every rank has exited successfully, and exits the process with the launcher's status
/// otherwise (2 for a usage error, as clap's).
pub fn main_from<I, T>(args: I)
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args = Args::parse_from(args);
    let mut command = args.command.into_iter();
    let program = command.next().unwrap_or_default();
    let secret = match (&args.secret_file, args.insecure_no_secret) {
        (Some(path), _) => match JobSecret::from_file(path) {
            Ok(secret) => Some(secret),
            Err(e) => {
                eprintln!("coconet-launch: error: {e}");
                std::process::exit(2);
            }
        },
        (None, true) => Some(JobSecret::insecure_open()),
        (None, false) => None,
    };
    let config = LaunchConfig {
        nproc_per_node: args.nproc_per_node,
        nnodes: args.nnodes,
        node_rank: args.node_rank,
        master_addr: args.master_addr,
        master_port: args.master_port,
        timeout: args.timeout,
        grace: args.grace,
        job_timeout: args.job_timeout,
        heartbeat_timeout: args.heartbeat_timeout,
        run_id: args.rdzv_id,
        secret,
        program,
        args: command.collect(),
    };
    if let Err(e) = launch(&config) {
        // One write: the ranks share this stderr and may still be printing.
        let line = format!("coconet-launch: error: {e}\n");
        let _ = std::io::stderr().write_all(line.as_bytes());
        std::process::exit(e.exit_code());
    }
}
