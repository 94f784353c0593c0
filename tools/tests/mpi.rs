//! MPI integration test (feature `mpi`): 4 processes on loopback run every schedule of
//! the examples and compare, bitwise, with the same plans on rank threads.
#![cfg(feature = "mpi")]

use std::process::Command;

#[test]
fn four_processes_agree_with_rank_threads() {
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
        .arg(env!("CARGO_BIN_EXE_coconet-mpi-check"))
        .output()
        .expect("mpirun runs (install openmpi-bin)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mpirun failed:\n{stdout}\n{stderr}");
    for rank in 0..4 {
        assert!(
            stdout.contains(&format!(
                "rank {rank}: MPI results equal the rank-thread results bitwise"
            )),
            "{stdout}\n{stderr}"
        );
    }
}

/// A panic in one rank ends the whole job promptly with the rank and the message (it
/// unwound into MPI_Finalize and its peers waited forever).
#[test]
fn a_panicking_rank_aborts_the_job_instead_of_hanging_it() {
    aborts_within("--panic", 120, &["rank 2 panicked"]);
}

/// `coconet-mpi-check MODE` on 4 processes must end within `limit_s` seconds (a hang
/// is a failure), unsuccessfully, saying every one of `said` on stderr.
fn aborts_within(mode: &str, limit_s: u64, said: &[&str]) {
    let (status, stderr) = four_processes_within(mode, limit_s);
    let status = status.unwrap_or_else(|| panic!("the job hung ({mode}):\n{stderr}"));
    assert!(!status.success(), "{stderr}");
    for s in said {
        assert!(stderr.contains(s), "{s:?} not said:\n{stderr}");
    }
}

/// `coconet-mpi-check MODE` on 4 processes; its status, or `None` if it was still running
/// after `limit_s` seconds (then killed: a hang is a failure), and its stderr.
fn four_processes_within(mode: &str, limit_s: u64) -> (Option<std::process::ExitStatus>, String) {
    let started = std::time::Instant::now();
    let mut child = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
        .arg(env!("CARGO_BIN_EXE_coconet-mpi-check"))
        .arg(mode)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("mpirun runs (install openmpi-bin)");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > std::time::Duration::from_secs(limit_s) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let out = child.wait_with_output().expect("output");
    (status, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Over MPI messages, a rank that stops answering makes the others' waits end at their
/// deadline: the job is aborted with the rank, the step and the time waited (MPI waits
/// had no deadline and hung until killed).
#[test]
fn a_stalled_rank_aborts_the_job_at_the_deadline_instead_of_hanging_it() {
    // The stalled rank sleeps 60 s: ending well before means the deadline worked.
    aborts_within("--stall", 45, &["waited 2.0 s at", "aborting the MPI job"]);
}

/// Over shared memory, a rank that stops between two runs makes the others' next run
/// fail at their deadline naming it (they wait for it at the agreement on the scalars,
/// in the window), and its own fails once it goes on.
#[test]
fn a_rank_stalled_between_runs_fails_every_next_run_over_shared_memory() {
    every_run_fails_naming_rank_2("--stall-between-runs", 60);
}

/// Over shared memory, a rank hung for good between runs: the others' next run fails at
/// the deadline, and instead of waiting forever for it to free the window with them
/// (a collective call), they abort the job naming it.
#[test]
fn a_rank_hung_between_runs_aborts_the_job_instead_of_holding_the_window() {
    aborts_within(
        "--hang-between-runs",
        60,
        &[
            "for rank 2 to release the job's shared memory",
            "aborting the MPI job",
        ],
    );
}

/// Over shared memory, a rank that stops in the middle of a step makes the others' runs
/// fail at their deadline naming it (their wait is on the window, not in MPI), and the
/// stalled rank's run fails too once it goes on: no process returns `Ok`, none hangs.
#[test]
fn a_rank_stalled_mid_step_fails_every_run_over_shared_memory() {
    every_run_fails_naming_rank_2("--stall-in-step", 60);
}

/// Over shared memory, a rank whose run ends early marks the job failed: the others'
/// runs fail at once naming it, long before their 60 s deadline.
#[test]
fn a_rank_gone_mid_step_fails_every_run_at_once_over_shared_memory() {
    every_run_fails_naming_rank_2("--vanish-in-step", 30);
}

/// `coconet-mpi-check MODE` on 4 processes: every process's run must fail naming rank 2,
/// and the job end within `limit_s` seconds.
fn every_run_fails_naming_rank_2(mode: &str, limit_s: u64) {
    let started = std::time::Instant::now();
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
        .arg(env!("CARGO_BIN_EXE_coconet-mpi-check"))
        .arg(mode)
        .output()
        .expect("mpirun runs (install openmpi-bin)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for rank in [0, 1, 3] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("rank {rank}: the run failed")))
            .unwrap_or_else(|| panic!("rank {rank}'s run must fail:\n{stdout}\n{stderr}"));
        // Named as missing (by the ranks that gave up) or as failed (by the others).
        assert!(
            line.contains("ranks [2] never arrived") || line.contains("rank 2 failed"),
            "{line}"
        );
    }
    assert!(
        stdout.contains("rank 2: the run failed"),
        "{stdout}\n{stderr}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(limit_s));
}

/// The candle trainer with one replica per process (`DataParallel::mpi`, each process
/// binding only its own gradient) steps bitwise as the rank-thread trainer does.
#[cfg(feature = "candle")]
#[test]
fn the_candle_trainer_across_processes_equals_rank_threads() {
    for np in ["2", "3"] {
        let out = Command::new("mpirun")
            .args(["--allow-run-as-root", "--oversubscribe", "-np", np])
            .arg(env!("CARGO_BIN_EXE_coconet-mpi-check"))
            .arg("--candle")
            .output()
            .expect("mpirun runs (install openmpi-bin)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "mpirun -np {np} failed:\n{stdout}\n{stderr}"
        );
        for rank in 0..np.parse().unwrap() {
            assert!(
                stdout.contains(&format!(
                    "rank {rank}: the candle trainer across processes equals rank threads bitwise"
                )),
                "{stdout}\n{stderr}"
            );
        }
    }
}
