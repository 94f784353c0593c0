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
