//! The `coconet-heterps` binary end to end: synthetic data, a profile of this machine,
//! a plan, training with workers as threads, and one worker per process under
//! `coconet-launch`.
//!
//! The launcher is this test executable itself, started with `as_launcher --exact
//! --nocapture -- <the launcher's arguments>` and `COCONET_TEST_LAUNCHER=1`: cargo builds
//! this package's binaries for its tests, not coconet-launch's, so the test runs the
//! launcher's command line (`coconet_launch::cli`, the binary's own code) in a process
//! of its own.

use std::ffi::OsString;
use std::process::Command;

const LAUNCHER: &str = "COCONET_TEST_LAUNCHER";

/// `coconet-launch`, to be given its arguments: this executable as the launcher.
fn launcher() -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "as_launcher",
        "--exact",
        "--nocapture",
        "--test-threads",
        "1",
        "--",
    ])
    .env(LAUNCHER, "1");
    cmd
}

/// The launcher when started by [`launcher`] (the arguments after the first `--` are
/// its own, which libtest takes for filters that match no test); returns at once in a
/// normal test run.
#[test]
fn as_launcher() {
    if std::env::var_os(LAUNCHER).is_none() {
        return;
    }
    let args = std::env::args_os().skip_while(|a| a != "--").skip(1);
    coconet_launch::cli::main_from(std::iter::once(OsString::from("coconet-launch")).chain(args));
}

#[test]
fn the_heterps_cli_generates_profiles_trains_and_predicts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let bin = env!("CARGO_BIN_EXE_coconet-heterps");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(bin).args(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {text}");
        text
    };
    let data = d.join("data");
    let (model, catalog) = (d.join("model.toml"), d.join("catalog.toml"));
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();
    run(&[
        "generate",
        "--out",
        &s(&data),
        "--files",
        "2",
        "--rows",
        "256",
        "--cardinality",
        "50",
    ]);
    let text = run(&[
        "profile",
        "--data",
        &s(&data),
        "--model-out",
        &s(&model),
        "--catalog-out",
        &s(&catalog),
        "--threads",
        "1",
        "--batch",
        "64",
        "--repeats",
        "1",
    ]);
    assert!(
        text.contains("fc1:") && text.contains("GB/s for coconet's schedules in the cost model"),
        "{text}"
    );
    // The planner reads what the profile wrote.
    let problem = coconet_hetero::load(
        &model,
        &catalog,
        Some(coconet_hetero::Constraint::new(100.0, 1000.0).unwrap()),
    )
    .unwrap();
    assert_eq!(problem.model.layers.len(), 6);
    assert!(problem.model.layers.iter().all(|l| l.time[0] > 0.0));
    // The workers share this machine: one host with its cores, each unit taking its
    // threads; with more than one core the layers are timed with the machine full too.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert_eq!(problem.catalog.hosts.len(), 1);
    assert_eq!(problem.catalog.hosts[0].cores, cores);
    assert_eq!(problem.catalog.hosts[0].threads, vec![1]);
    let full = std::fs::read_to_string(&model).unwrap();
    assert_eq!(full.contains("[layers.time_loaded]"), cores > 1, "{full}");
    // `plan` prints what `train --throughput` would run.
    let text = run(&[
        "plan",
        "--data",
        &s(&data),
        "--model",
        &s(&model),
        "--catalog",
        &s(&catalog),
        "--throughput",
        "10",
    ]);
    assert!(
        text.contains("cpu-1t") && text.contains("optimality: proven optimal"),
        "{text}"
    );
    // W workers of one thread on batches of 64, predicted by the profile, the dense
    // step priced by `sync`.
    let workers = |w: &str, sync: &str| {
        run(&[
            "train",
            "--data",
            &s(&data),
            "--workers",
            w,
            "--threads",
            "1",
            "--batch",
            "64",
            "--model",
            &s(&model),
            "--catalog",
            &s(&catalog),
            "--sync",
            sync,
        ])
    };
    let text = workers("2", "coconet");
    assert!(
        text.contains("2 workers x cpu-1t (4 steps, 512 samples"),
        "{text}"
    );
    assert!(text.contains("measured/predicted = "), "{text}");
    // The dense step at one worker: the update, priced by coconet's schedules (the
    // default), free under the paper's ring.
    let one = |sync: &str| workers("1", sync);
    assert!(one("ring").contains("ms compute + 0.00 ms sync"));
    let text = one("coconet");
    assert!(
        text.contains("ms sync") && !text.contains("ms compute + 0.00 ms sync"),
        "{text}"
    );
    // Plan for a throughput and run the plan (stages of the planner's types and units).
    let (data_s, model_s, catalog_s) = (s(&data), s(&model), s(&catalog));
    let plan = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--data",
            &data_s,
            "--throughput",
            "10",
            "--in-flight",
            "2",
            "--model",
            &model_s,
            "--catalog",
            &catalog_s,
        ];
        args.extend_from_slice(extra);
        run(&args)
    };
    let text = plan(&[]);
    assert!(text.contains("optimality: proven optimal"), "{text}");
    // With a checkpoint: a second run with more epochs resumes where the first ended.
    let ckpt = d.join("plan.safetensors");
    let ckpt_s = s(&ckpt);
    let with_checkpoint = |epochs: &str| {
        plan(&[
            "--epochs",
            epochs,
            "--checkpoint",
            &ckpt_s,
            "--checkpoint-every",
            "1",
        ])
    };
    let first = with_checkpoint("1");
    assert!(!first.contains("resumed") && ckpt.exists(), "{first}");
    let second = with_checkpoint("2");
    assert!(second.contains("at epoch 1, batch 0"), "{second}");
    assert!(
        text.contains("measured/predicted") && text.contains("stage 0 (layers 0..="),
        "{text}"
    );
    // One worker per process under coconet-launch, the table served by both.
    let out = launcher()
        .args([
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "--timeout",
            "60",
            "--",
        ])
        .args([
            bin,
            "train",
            "--processes",
            "--ps-shards",
            "2",
            "--data",
            &s(&data),
        ])
        .args(["--batch", "64", "--threads", "1"])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("2 worker processes x cpu-1t (2 serving the table")
            && text.contains("held-out AUC"),
        "{text}"
    );
    // The plan for a throughput with one process per replica (here the plan is one
    // replica, so the job is one process; multi-stage jobs are tested below with
    // processes as threads).
    let launch = |nproc: &str, extra: &[&str]| {
        let out = launcher()
            .args([
                "--nproc-per-node",
                nproc,
                "--master-port",
                "0",
                "--timeout",
                "60",
                "--",
            ])
            .args([
                bin,
                "train",
                "--processes",
                "--throughput",
                "10",
                "--in-flight",
                "2",
            ])
            .args([
                "--data",
                &data_s,
                "--model",
                &model_s,
                "--catalog",
                &catalog_s,
            ])
            .args(extra)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (ok, text) = launch("1", &[]);
    assert!(ok, "{text}");
    assert!(
        text.contains("stage 0 replica 0 (layers 0..=5, cpu-1t)")
            && text.contains("on 1 processes")
            && text.contains("held-out AUC"),
        "{text}"
    );
    // A job of the wrong size says how many processes the plan needs.
    let (ok, text) = launch("2", &[]);
    assert!(!ok && text.contains("the plan has 1 replicas"), "{text}");
    // With a checkpoint: a second job with more epochs resumes where the first ended.
    let ckpt_dir = s(&d.join("plan-processes"));
    let with_checkpoint = |epochs: &str| {
        let (ok, text) = launch(
            "1",
            &[
                "--checkpoint",
                &ckpt_dir,
                "--checkpoint-every",
                "1",
                "--epochs",
                epochs,
            ],
        );
        assert!(ok, "{text}");
        text
    };
    let first = with_checkpoint("1");
    assert!(!first.contains("resumed"), "{first}");
    let second = with_checkpoint("2");
    assert!(second.contains("at epoch 1, batch 0"), "{second}");
    // Each job removed its own earlier checkpoints, not the other's: `latest`, the lock
    // of the directory, each job's last checkpoint.
    let mut kept: Vec<String> = std::fs::read_dir(&ckpt_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    assert_eq!(kept.len(), 4, "{kept:?}");
    assert_eq!(&kept[..2], [".coconet-lock", "latest"], "{kept:?}");
    assert!(kept[2..].iter().all(|k| k.starts_with("step-")), "{kept:?}");
    // A directory another running job holds (here the test plays that job) is refused
    // before anything is read or written, naming the holder.
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.join("plan-processes").join(".coconet-lock"))
        .unwrap();
    held.try_lock().unwrap();
    let (ok, text) = launch("1", &["--checkpoint", &ckpt_dir, "--epochs", "3"]);
    assert!(
        !ok && text.contains("another running job (job-") && text.contains("cannot resume there"),
        "{text}"
    );
    drop(held);
    let out = std::process::Command::new(bin)
        .args(["train", "--data", &s(&d.join("nowhere"))])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("nowhere/dataset.toml"),
        "{err}"
    );
}
