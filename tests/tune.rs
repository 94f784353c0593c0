//! The autotuner: it times every candidate × knob variant and picks the fastest, never
//! a contender whose results differ from the program's (a schedule of another program, a
//! backend that corrupts a result), and its cache survives a restart and is not reused
//! for another program, other dims or another machine.

use coconet_example_programs::adam as adam_program;
use coconet_example_programs::data;
use coconet_example_programs::lamb as lamb_program;
use coconet_example_programs::megatron as megatron_program;

use adam_program::AdamParams;
use coconet::core::Schedule;
use coconet::core::schedule::candidates;
use coconet::prelude::*;
use coconet::runtime::cpu::{Cpu, Job};
use coconet::runtime::cuda::{AccessChoice, EmulatedRanks, PeerAccess, Pipelining};
use coconet::runtime::tune::{ProcessKnobs, TuneOptions, Tuning, Variant, tune, tune_processes};
use coconet::runtime::{Backend, Plan, RuntimeError};
use lamb_program::LambParams;
use std::sync::atomic::{AtomicUsize, Ordering};

const RANKS: usize = 3;

use coconet_test_support::loopback;

#[coconet]
fn sgd(g: Tensor<f32, Local, [N]>, w: Tensor<f32, Replicated, [N]>, lr: f32) {
    let g1 = all_reduce(Sum, g);
    let w1 = update(w, w - lr * g1);
}

/// The same signature, another step: its schedules must never be picked for `sgd`.
#[coconet]
fn sgd_twice(g: Tensor<f32, Local, [N]>, w: Tensor<f32, Replicated, [N]>, lr: f32) {
    let g1 = all_reduce(Sum, g);
    let w1 = update(w, w - (lr + lr) * g1);
}

fn sgd_args(n: usize) -> Bindings {
    sgd::Args {
        N: n,
        g: TensorArg::PerRank((0..RANKS).map(|r| data::uniform_f32(r as u64, n)).collect()),
        w: TensorArg::Global(data::uniform_f32(9, n)),
        lr: 0.1,
    }
    .into()
}

fn options(cache: Option<std::path::PathBuf>) -> TuneOptions {
    TuneOptions {
        warmup: 1,
        rounds: 3,
        cache,
        ..TuneOptions::default()
    }
}

/// The CPU backend, counting the jobs it prepares and optionally corrupting `w` after
/// every run.
struct Counting {
    cpu: Cpu,
    prepared: AtomicUsize,
    corrupt: bool,
}

impl Counting {
    fn new(corrupt: bool) -> Counting {
        Counting {
            cpu: Cpu::default(),
            prepared: AtomicUsize::new(0),
            corrupt,
        }
    }
}

impl Backend for Counting {
    type Job = Job;

    fn prepare(&self, plan: &Plan, bindings: &Bindings) -> Result<Job, RuntimeError> {
        self.prepared.fetch_add(1, Ordering::Relaxed);
        self.cpu.prepare(plan, bindings)
    }

    fn run(&self, job: &mut Job) -> Result<(), RuntimeError> {
        self.cpu.run(job)?;
        if self.corrupt {
            job.input_mut::<f32>("w", 0)?[0] += 1.0;
        }
        Ok(())
    }
}

fn counting(corrupt: bool) -> Vec<Variant<Counting>> {
    vec![Variant {
        label: "counted".into(),
        backend: Counting::new(corrupt),
    }]
}

fn prepared(variants: &[Variant<Counting>]) -> usize {
    variants
        .iter()
        .map(|v| v.backend.prepared.load(Ordering::Relaxed))
        .sum()
}

#[test]
fn picks_the_fastest_contender_of_a_complete_table() {
    let p = sgd();
    let schedules = candidates(p.program(), &[]);
    let variants = Variant::cpu_chunks(&[512, 4096]);
    let t = tune(
        p.program(),
        &schedules,
        &variants,
        RANKS,
        &sgd_args(5000),
        &options(None),
    )
    .unwrap();
    assert_eq!(t.table.len(), schedules.len() * variants.len(), "{t}");
    assert!(t.rejected.is_empty(), "{t}");
    assert!(!t.from_cache);
    let fastest = t.table.iter().min_by_key(|m| m.median).unwrap();
    assert_eq!(&t.best, fastest);
    assert_eq!(t.best, t.table[0], "the table is sorted fastest first");
    for m in &t.table {
        assert!(m.min <= m.median && m.median <= m.max, "{m:?}");
        assert!(m.bytes_per_rank > 0, "{m:?}");
    }
    let chosen = t.schedule(&schedules).unwrap();
    assert_eq!(chosen.name(), t.best.schedule);
    assert_eq!(t.variant(&variants).unwrap().label, t.best.variant);
    // Every contender of the table appears in the printed table.
    let printed = t.to_string();
    for m in &t.table {
        assert!(
            printed.contains(&format!("{}, {}", m.schedule, m.variant)),
            "{printed}"
        );
    }
}

#[test]
fn never_picks_a_schedule_of_another_program() {
    let p = sgd();
    let other = sgd_twice();
    let mut schedules = candidates(p.program(), &[]);
    let wrong = candidates(other.program(), &[]);
    schedules.extend(wrong.into_iter().map(|s| s.named("wrong")));
    let t = tune(
        p.program(),
        &schedules,
        &Variant::cpu_chunks(&[4096]),
        RANKS,
        &sgd_args(3000),
        &options(None),
    )
    .unwrap();
    assert_ne!(t.best.schedule, "wrong");
    assert!(t.table.iter().all(|m| m.schedule != "wrong"), "{t}");
    let why: Vec<&String> = t
        .rejected
        .iter()
        .filter(|(w, _)| w.starts_with("wrong"))
        .map(|(_, y)| y)
        .collect();
    assert_eq!(why.len(), 3, "{t}");
    assert!(
        why.iter()
            .all(|y| y.contains("the schedule changes results")),
        "{why:?}"
    );
}

#[test]
fn a_backend_that_corrupts_a_result_is_rejected_and_named() {
    let p = sgd();
    let schedules = candidates(p.program(), &[]);
    let err = tune(
        p.program(),
        &schedules,
        &counting(true),
        RANKS,
        &sgd_args(1000),
        &options(None),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("no candidate schedule gives the program's results"),
        "{err}"
    );
    assert!(
        err.contains("`w`[0]") && err.contains("where the interpreter gives"),
        "{err}"
    );
}

#[test]
fn schedules_that_reorder_a_reduction_agree_within_rounding() {
    // LAMB's norms are partial sums per rank once sharded: the fused schedule's results
    // differ from the program's in the last bits, and must be accepted.
    let p = lamb_program::lamb();
    let n = 4000;
    let grads: Vec<Vec<f32>> = (0..RANKS).map(|r| data::uniform_f32(r as u64, n)).collect();
    let w = data::uniform_f32(10, n);
    let hp = LambParams::default();
    let zeros = vec![0.0; n];
    let args: Bindings = lamb_program::lamb_args(&grads, &w, &zeros, &zeros, hp).into();
    let schedules = candidates(p.program(), &[p.m.id(), p.v.id()]);
    let t = tune(
        p.program(),
        &schedules,
        &Variant::cpu_chunks(&[1024, 4096]),
        RANKS,
        &args,
        &options(None),
    )
    .unwrap();
    assert!(t.rejected.is_empty(), "{t}");
    assert_eq!(t.table.len(), schedules.len() * 2);
}

#[test]
fn the_cuda_peer_access_is_a_knob_on_emulated_ranks() {
    // How far exchanges overlap the kernels (unpipelined, chunks of 1 or 4 KiB, or
    // peers' memory mapped): every setting is checked and timed on the CUDA backend's
    // multi-rank path, and the chosen one runs Adam bitwise like rank threads.
    let p = adam_program::adam();
    let (args, schedules) = adam_case(3000);
    let backend = EmulatedRanks::default();
    let kib = |k: usize| {
        PeerAccess::Exchanged(Pipelining {
            chunk_bytes: k << 10,
            max_chunks: 8,
        })
    };
    let accesses = [
        PeerAccess::Mapped,
        PeerAccess::Exchanged(Pipelining::OFF),
        kib(1),
        kib(4),
    ];
    let variants = Variant::cuda_access(&backend, &accesses);
    let labels: Vec<&str> = variants.iter().map(|v| v.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "mapped",
            "exchanged, unpipelined",
            "exchanged, 1 KiB chunks, at most 8",
            "exchanged, 4 KiB chunks, at most 8"
        ]
    );
    let t = tune(
        p.program(),
        &schedules,
        &variants,
        RANKS,
        &args,
        &options(None),
    )
    .unwrap();
    assert!(t.rejected.is_empty(), "{t}");
    assert_eq!(t.table.len(), schedules.len() * accesses.len(), "{t}");
    let fastest = t.table.iter().min_by_key(|m| m.median).unwrap();
    assert_eq!(&t.best, fastest);

    let chosen = t.variant(&variants).unwrap();
    let schedule = t.schedule(&schedules).unwrap();
    let plan = Plan::lower(schedule, RANKS, args.dims()).unwrap();
    let mut job = chosen.backend.prepare(&plan, &args).unwrap();
    chosen.backend.run(&mut job).unwrap();
    let mut threads = Cpu::default().prepare(&plan, &args).unwrap();
    Cpu::default().run(&mut threads).unwrap();
    for name in ["w", "m", "v"] {
        assert_eq!(
            job.final_input::<f32>(name).unwrap(),
            threads.final_input::<f32>(name).unwrap(),
            "`{name}` on {}",
            chosen.label
        );
    }
    // A backend's own list: mapped memory first (emulated devices share the host's
    // address space), then exchanges.
    let choices = backend.access_choices();
    assert_eq!(choices[0], PeerAccess::Mapped);
    assert!(choices.contains(&PeerAccess::Exchanged(Pipelining::default())));
}

/// Adam's arguments at `n` elements on [`RANKS`] ranks (zero moments) and its candidate
/// schedules.
fn adam_case(n: usize) -> (Bindings, Vec<Schedule>) {
    let p = adam_program::adam();
    let grads: Vec<Vec<f32>> = (0..RANKS).map(|r| data::uniform_f32(r as u64, n)).collect();
    let w = data::uniform_f32(10, n);
    let zeros = vec![0.0; n];
    let hp = AdamParams::default();
    let args: Bindings = adam_program::adam_args(&grads, &w, &zeros, &zeros, hp).into();
    (args, candidates(p.program(), &[p.m.id(), p.v.id()]))
}

fn tune_adam(
    cache: &std::path::Path,
    machine: &str,
    n: usize,
    variants: &[Variant<Counting>],
) -> (Tuning, Vec<Schedule>) {
    let p = adam_program::adam();
    let (args, schedules) = adam_case(n);
    let options = TuneOptions {
        machine: machine.into(),
        ..options(Some(cache.to_path_buf()))
    };
    let t = tune(p.program(), &schedules, variants, RANKS, &args, &options).unwrap();
    (t, schedules)
}

#[test]
fn the_cache_survives_a_restart_and_is_keyed_by_program_dims_and_machine() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("nested").join("tune.json");
    let v = counting(false);
    let (first, schedules) = tune_adam(&cache, "machine A", 2000, &v);
    assert!(!first.from_cache && cache.exists());
    let runs = prepared(&v);
    assert!(runs > 0);

    // A new process (fresh variants, same file): the choice comes back, nothing runs.
    let v2 = counting(false);
    let (again, _) = tune_adam(&cache, "machine A", 2000, &v2);
    assert!(again.from_cache, "{again}");
    assert_eq!(again.best, first.best);
    assert_eq!(again.table, first.table);
    assert_eq!(prepared(&v2), 0, "a cached choice runs nothing");
    assert_eq!(
        again.schedule(&schedules).unwrap().name(),
        first.best.schedule
    );

    // Other dims, another machine: tuned again, and both kept beside the first.
    for (machine, n) in [("machine A", 2001), ("machine B", 2000)] {
        let v3 = counting(false);
        let (t, _) = tune_adam(&cache, machine, n, &v3);
        assert!(!t.from_cache, "{machine}, N = {n}");
        assert!(prepared(&v3) > 0);
    }
    assert!(
        tune_adam(&cache, "machine A", 2000, &counting(false))
            .0
            .from_cache
    );

    // Another program under the same name and file: tuned again.
    let p = sgd();
    let other = sgd_twice();
    let options = TuneOptions {
        machine: "machine A".into(),
        ..options(Some(cache.clone()))
    };
    let v4 = counting(false);
    let t = tune(
        p.program(),
        &candidates(p.program(), &[]),
        &v4,
        RANKS,
        &sgd_args(100),
        &options,
    )
    .unwrap();
    assert!(!t.from_cache);
    let v5 = counting(false);
    let t = tune(
        other.program(),
        &candidates(other.program(), &[]),
        &v5,
        RANKS,
        &sgd_args(100),
        &options,
    )
    .unwrap();
    assert!(
        !t.from_cache,
        "a program with the same inputs but another body"
    );
}

/// Adam's candidate schedules, each prepared on every process of a loopback TCP job
/// (one thread per process), tuned over round sizes and chunks (`fault` injected into
/// the last schedule's job): what each process's `tune_processes` returned, and its jobs.
#[allow(clippy::type_complexity)]
fn tune_adam_processes(
    cache: &std::path::Path,
    machine: &str,
    fault: Option<coconet::runtime::cpu::Fault>,
) -> Vec<(
    Result<Tuning, RuntimeError>,
    Vec<coconet::runtime::cpu::ProcessJob>,
)> {
    const P: usize = 2;
    let n = 6000;
    let p = adam_program::adam();
    let grads: Vec<Vec<f32>> = (0..P).map(|r| data::uniform_f32(r as u64, n)).collect();
    let w = data::uniform_f32(10, n);
    let m = data::uniform_f32(11, n);
    let v: Vec<f32> = data::uniform_f32(12, n).iter().map(|x| x * x).collect();
    let args: Bindings = adam_program::adam_args(&grads, &w, &m, &v, AdamParams::default()).into();
    let schedules = candidates(p.program(), &[p.m.id(), p.v.id()]);
    let groups: Vec<String> = schedules.iter().map(|_| loopback::group_name()).collect();
    let options = TuneOptions {
        machine: machine.into(),
        ..options(Some(cache.to_path_buf()))
    };
    loopback::per_process(P, |rank| {
        let last = schedules.len() - 1;
        let mut jobs: Vec<_> = schedules
            .iter()
            .zip(&groups)
            .enumerate()
            .map(|(j, (s, group))| {
                let plan = Plan::lower(s, P, args.dims()).unwrap();
                let mut link = loopback::connect(rank, P, group).unwrap();
                link.set_timeout(std::time::Duration::from_secs(5));
                let mut job = coconet::runtime::cpu::ProcessJob::new(&plan, &args, link).unwrap();
                if j == last {
                    job.inject_fault(fault);
                }
                job
            })
            .collect();
        let knobs = ProcessKnobs::grid(&[1, 4], &[512, 4096]);
        (tune_processes(&mut jobs, &knobs, &options), jobs)
    })
}

#[test]
fn processes_tune_together_and_leave_the_model_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("tune.json");
    let before = tune_adam_processes(&cache, "machine A", None);
    let tunings: Vec<&Tuning> = before.iter().map(|(t, _)| t.as_ref().unwrap()).collect();
    let (t0, jobs0) = (tunings[0], &before[0].1);
    assert!(!t0.from_cache && t0.rejected.is_empty(), "{t0}");
    assert_eq!(t0.table.len(), jobs0.len() * 4, "{t0}");
    for (t, (_, jobs)) in tunings.iter().zip(&before) {
        // One pooled table: every process saw the same times and made the same choice.
        assert_eq!(t.table, t0.table);
        // Each job runs its fastest knobs, and its model is as it was bound.
        for (j, job) in jobs.iter().enumerate() {
            let fastest = t.table.iter().find(|m| m.schedule_index == j).unwrap();
            let want = ProcessKnobs::grid(&[1, 4], &[512, 4096])[fastest.variant_index];
            assert_eq!(
                (job.round_chunks(), job.chunk()),
                (want.round_chunks, want.chunk)
            );
            let rank = job.rank();
            let n = 6000;
            let w: &[f32] = job.input("w", rank).unwrap();
            assert!(
                w == data::uniform_f32(10, n).as_slice(),
                "job {j}: w changed"
            );
            // m is this rank's block where the schedule slices it.
            let m: &[f32] = job.input("m", rank).unwrap();
            let all_m = data::uniform_f32(11, n);
            let want = match m.len() {
                len if len == n => &all_m[..],
                _ => &all_m[coconet::core::block_range(n, 2, rank)],
            };
            assert!(m == want, "job {j}: m changed");
            let v: &[f32] = job.input("v", rank).unwrap();
            let all_v: Vec<f32> = data::uniform_f32(12, n).iter().map(|x| x * x).collect();
            let want = match v.len() {
                len if len == n => &all_v[..],
                _ => &all_v[coconet::core::block_range(n, 2, rank)],
            };
            assert!(v == want, "job {j}: v changed");
        }
    }
    // Rank 0 wrote the cache; every process takes its choice from rank 0.
    let again = tune_adam_processes(&cache, "machine A", None);
    for (t, _) in &again {
        let t = t.as_ref().unwrap();
        assert!(t.from_cache, "{t}");
        assert_eq!(t.table, t0.table);
    }
    let elsewhere = tune_adam_processes(&cache, "machine B", None);
    assert!(
        elsewhere
            .iter()
            .all(|(t, _)| !t.as_ref().unwrap().from_cache)
    );
}

#[test]
fn jobs_of_different_programs_or_no_knobs_are_refused_before_any_run() {
    let (adam, sgd) = (adam_program::adam(), sgd());
    let n = 64;
    let grads: Vec<Vec<f32>> = (0..2).map(|r| data::uniform_f32(r as u64, n)).collect();
    let w = data::uniform_f32(10, n);
    let zeros = vec![0.0; n];
    let adam_args: Bindings =
        adam_program::adam_args(&grads, &w, &zeros, &zeros, AdamParams::default()).into();
    let sgd_args: Bindings = sgd::Args {
        N: n,
        g: TensorArg::PerRank(grads.clone()),
        w: TensorArg::Global(w.clone()),
        lr: 0.1,
    }
    .into();
    let groups = [loopback::group_name(), loopback::group_name()];
    let errors = loopback::per_process(2, |rank| {
        let job = |s: &Schedule, args: &Bindings, group: &str| {
            let plan = Plan::lower(s, 2, args.dims()).unwrap();
            let link = loopback::connect(rank, 2, group).unwrap();
            coconet::runtime::cpu::ProcessJob::new(&plan, args, link).unwrap()
        };
        let mut jobs = vec![
            job(&Schedule::new(adam.program()), &adam_args, &groups[0]),
            job(&Schedule::new(sgd.program()), &sgd_args, &groups[1]),
        ];
        let options = options(None);
        let knobs = ProcessKnobs::rounds(&[1]);
        let mixed = tune_processes(&mut jobs, &knobs, &options).unwrap_err();
        let none = tune_processes(&mut jobs[..1], &[], &options).unwrap_err();
        (mixed.to_string(), none.to_string())
    });
    for (mixed, none) in errors {
        assert!(
            mixed.contains("job 1") && mixed.contains("not the same program"),
            "{mixed}"
        );
        assert!(none.contains("no knob settings"), "{none}");
    }
}

#[test]
fn a_process_failing_while_tuning_fails_every_process_and_puts_the_others_back() {
    let dir = tempfile::tempdir().unwrap();
    let fault = coconet::runtime::cpu::Fault::Panic { rank: 1, step: 0 };
    let out = tune_adam_processes(&dir.path().join("tune.json"), "m", Some(fault));
    for (rank, (t, jobs)) in out.iter().enumerate() {
        let err = t
            .as_ref()
            .expect_err("a failed run fails the tuning")
            .to_string();
        assert!(
            err.contains("tune:") && err.contains("rank 1"),
            "rank {rank}: {err}"
        );
        // The jobs that ran before the failing one are usable, at the state and knobs
        // of the call; the failing one refuses its buffers.
        let (last, others) = jobs.split_last().unwrap();
        assert!(last.input::<f32>("w", rank).is_err());
        for (j, job) in others.iter().enumerate() {
            let w: &[f32] = job.input("w", rank).unwrap();
            assert!(
                w == data::uniform_f32(10, 6000).as_slice(),
                "job {j}: w changed"
            );
            let defaults = (
                coconet::runtime::cpu::TCP_ROUND_CHUNKS,
                coconet::runtime::cpu::CHUNK,
            );
            assert_eq!((job.round_chunks(), job.chunk()), defaults, "job {j}");
        }
    }
}

#[test]
fn an_unreadable_cache_is_a_miss_with_a_note_then_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("tune.json");
    std::fs::write(&cache, "{ not json").unwrap();
    let (t, _) = tune_adam(&cache, "m", 500, &counting(false));
    assert!(!t.from_cache);
    assert!(t.notes.iter().any(|n| n.contains("not valid JSON")), "{t}");
    let (again, _) = tune_adam(&cache, "m", 500, &counting(false));
    assert!(again.from_cache, "{again}");
}

#[test]
fn nothing_to_time_is_a_clear_error() {
    let p = sgd();
    let none: Vec<Variant<Cpu>> = Vec::new();
    let err = tune(
        p.program(),
        &candidates(p.program(), &[]),
        &none,
        RANKS,
        &sgd_args(10),
        &options(None),
    )
    .unwrap_err();
    assert!(err.to_string().contains("no knob variants"), "{err}");
    let err = tune(
        p.program(),
        &[],
        &Variant::cpu_chunks(&[64]),
        RANKS,
        &sgd_args(10),
        &options(None),
    )
    .unwrap_err();
    assert!(err.to_string().contains("no candidate schedules"), "{err}");
}

/// Adam's AR-C kernel, by hand: on every rank it reads g1, m, v and w and writes m, v
/// and w, each once — m's new value is stored in m's buffer both as the value and as the
/// update (it is read again for the bias correction), and counted once.
#[test]
fn the_cost_model_counts_a_buffer_written_twice_once() {
    use coconet::runtime::model::predict;
    let p = adam_program::adam();
    let (n, ranks) = (1000, 2);
    let grads: Vec<Vec<f32>> = (0..ranks).map(|r| data::uniform_f32(r as u64, n)).collect();
    let z = vec![0.0; n];
    let args: Bindings = adam_program::adam_args(
        &grads,
        &data::uniform_f32(9, n),
        &z,
        &z,
        AdamParams::default(),
    )
    .into();
    let schedule = candidates(p.program(), &[p.m.id(), p.v.id()])
        .into_iter()
        .find(|s| s.name() == "AR-C")
        .unwrap();
    let plan = Plan::lower(&schedule, ranks, args.dims()).unwrap();
    let prediction = predict(&plan, &memory_only());
    let kernel: f64 = prediction
        .steps
        .iter()
        .filter(|(name, _, _)| name.starts_with("kernel"))
        .map(|(_, d, _)| d.memory_bytes)
        .sum();
    assert_eq!(
        kernel,
        (ranks * 7 * n * 4) as f64,
        "{:#?}",
        prediction.steps
    );
}

/// A machine where only memory traffic costs anything: predictions are bytes / bandwidth.
fn memory_only() -> coconet::runtime::model::Machine {
    coconet::runtime::model::Machine {
        name: "memory only".into(),
        source: "a test".into(),
        ranks_per_memory: usize::MAX,
        cache_bytes: 0.0,
        cache_bandwidth: 0.0,
        memory_bandwidth: 1e9,
        cores: 2.0,
        stage_seconds: 0.0,
        reduce_seconds: 0.0,
        compiled_reduce_seconds: 0.0,
        full_reduce_seconds: 0.0,
        dropout_seconds: 0.0,
        layer_norm_seconds: 0.0,
        half_conversion_seconds: 0.0,
        matmul_element_seconds: 0.0,
        half_matmul_element_seconds: 0.0,
        flops: f64::INFINITY,
        half_flops: None,
        barrier_seconds_per_rank: 0.0,
        step_seconds: 0.0,
        run_seconds: 0.0,
        wake_seconds_per_rank: 0.0,
        compute_overlaps_memory: false,
        links: None,
    }
}

/// Megatron's epilogue by hand: every element of the layer's output goes through one
/// dropout draw and one layer norm on the rank that computes it — once per rank after an
/// all-reduce, once in all after a reduce-scatter — priced at the machine's rates; each
/// rank's matmul converts its operands' and result's elements.
#[test]
fn the_cost_model_counts_dropout_and_layer_norm_elements_by_hand() {
    use coconet::runtime::model::predict;
    let p = megatron_program::megatron();
    let (b, s, h, ranks) = (2, 3, 4, 2);
    let args: Bindings = megatron_program::megatron_args(b, s, h, 7).into();
    let machine = coconet::runtime::model::Machine {
        dropout_seconds: 1e-6,
        layer_norm_seconds: 1e-3,
        memory_bandwidth: f64::INFINITY,
        ..memory_only()
    };
    let elements = (b * s * h) as f64;
    for (name, copies) in [("MM-AR-C", ranks as f64), ("MM-RS-C-AG", 1.0)] {
        let schedule = candidates(p.program(), &[])
            .into_iter()
            .find(|s| s.name() == name)
            .unwrap();
        let plan = Plan::lower(&schedule, ranks, args.dims()).unwrap();
        let prediction = predict(&plan, &machine);
        let sum = |f: fn(&coconet::runtime::model::Demand) -> f64| -> f64 {
            prediction.steps.iter().map(|(_, d, _)| f(d)).sum()
        };
        assert_eq!(sum(|d| d.dropout_elements), copies * elements, "{name}");
        assert_eq!(sum(|d| d.layer_norm_elements), copies * elements, "{name}");
        // Each rank's matmul: x's [6, 2] block, w's [2, 4] rows and the [6, 4] partial.
        assert_eq!(
            sum(|d| d.half_matmul_elements),
            2.0 * (12.0 + 8.0 + 24.0),
            "{name}"
        );
        // The work spreads over the 2 cores: seconds = elements · rate / 2.
        let want = copies * elements * (1e-6 + 1e-3) / 2.0;
        let got = prediction.total.as_secs_f64();
        assert!(
            (got - want).abs() < 1e-9,
            "{name}: {got} s, by hand {want} s"
        );
    }
}

#[test]
fn the_cost_model_counts_the_bytes_of_sgd_by_hand() {
    use coconet::runtime::model::predict;
    let p = sgd();
    let (n, ranks) = (1000, 4);
    let args = sgd_args(n);
    let schedules = candidates(p.program(), &[]);
    let bytes = |name: &str| {
        let s = schedules.iter().find(|s| s.name() == name).unwrap();
        let plan = Plan::lower(s, ranks, args.dims()).unwrap();
        let prediction = predict(&plan, &memory_only());
        let total: f64 = prediction
            .steps
            .iter()
            .map(|(_, d, _)| d.memory_bytes)
            .sum();
        // Time is bytes over the bandwidth, nothing else, on this machine.
        assert!((prediction.total.as_secs_f64() - total / 1e9).abs() < 1e-12);
        (total, prediction)
    };
    // fuse(RS-C-AG): every rank reads its block of g from 4 ranks (1000 · 4 B), its
    // block of w (250 · 4 B) and writes its block of w into 4 ranks (1000 · 4 B).
    let (fused, prediction) = bytes("fuse(RS-C-AG)");
    assert_eq!(
        fused,
        4.0 * (4000.0 + 1000.0 + 4000.0),
        "{:#?}",
        prediction.steps
    );
    let reduced: f64 = prediction
        .steps
        .iter()
        .map(|(_, d, _)| d.reduced_elements)
        .sum();
    assert_eq!(
        reduced,
        4.0 * 1000.0,
        "every rank reduces 250 elements from 4 sources"
    );
    // AR-C: the all-reduce reads every block of g (4000 B), writes my reduced block
    // (1000 B) and copies the 3 others in (2 · 3000 B); the kernel reads g1 and w and
    // writes w (3 · 4000 B); on every rank.
    let (unfused, prediction) = bytes("AR-C");
    assert_eq!(
        unfused,
        4.0 * (4000.0 + 1000.0 + 6000.0 + 12000.0),
        "{:#?}",
        prediction.steps
    );
}

/// The cache term by hand: SGD's fused step on 4 ranks holds g (4 × 1000 f32) and a
/// copy of w per rank (4 × 1000 f32) plus its runtime buffers. Filling at most a
/// quarter of the cache, its bytes move at the cache's bandwidth; half or more, at
/// memory's; in between, a linear mix. Starting a run costs `wake_seconds_per_rank`
/// per rank.
#[test]
fn the_cost_model_serves_small_runs_from_the_cache_and_charges_waking_ranks() {
    use coconet::runtime::model::predict;
    let p = sgd();
    let (n, ranks) = (1000, 4);
    let args = sgd_args(n);
    let schedule = candidates(p.program(), &[])
        .into_iter()
        .find(|s| s.name() == "fuse(RS-C-AG)")
        .unwrap();
    let plan = Plan::lower(&schedule, ranks, args.dims()).unwrap();
    let footprint = (2 * ranks * n * 4 + plan.total_slot_bytes().unwrap()) as f64;
    let charged = predict(&plan, &memory_only()).total.as_secs_f64();
    assert!(charged > 0.0);
    // (cache size ÷ footprint, cache bandwidth, share of the memory-only time): the
    // cache's share of the bytes at its bandwidth (free where it is 0), the rest at
    // memory's 1e9 B/s.
    for (cache, bandwidth, share) in [
        (4.0, 0.0, 0.0),
        (3.0, 0.0, 1.0 / 3.0),
        (2.0, 0.0, 1.0),
        (1.0, 0.0, 1.0),
        (4.0, 2e9, 0.5),
        (3.0, 2e9, 2.0 / 3.0 * 0.5 + 1.0 / 3.0),
        (1.0, 2e9, 1.0),
    ] {
        let machine = coconet::runtime::model::Machine {
            cache_bytes: cache * footprint,
            cache_bandwidth: bandwidth,
            ..memory_only()
        };
        let got = predict(&plan, &machine).total.as_secs_f64();
        assert!(
            (got - share * charged).abs() < 1e-12,
            "cache {cache} × the footprint at {bandwidth} B/s: {got} s, by hand {} s",
            share * charged
        );
    }
    let machine = coconet::runtime::model::Machine {
        wake_seconds_per_rank: 1e-3,
        memory_bandwidth: f64::INFINITY,
        ..memory_only()
    };
    let got = predict(&plan, &machine).total.as_secs_f64();
    assert!((got - 4e-3).abs() < 1e-12, "{got} s to wake 4 ranks");
}

#[coconet]
fn norm(x: Tensor<f32, Replicated, [N]>) {
    let n = norm2(x);
    n
}

/// A full reduction is priced at `full_reduce_seconds` (one element each, on the rank
/// that holds it), and at `reduce_seconds` where that is not measured (0).
#[test]
fn full_reductions_have_their_own_rate() {
    use coconet::runtime::model::predict;
    let p = norm();
    let (n, ranks) = (1000, 1);
    let args: Bindings = norm::Args {
        N: n,
        x: TensorArg::Global(data::uniform_f32(5, n)),
    }
    .into();
    let plan = Plan::lower(&Schedule::new(p.program()), ranks, args.dims()).unwrap();
    let full: f64 = predict(&plan, &memory_only())
        .steps
        .iter()
        .map(|(_, d, _)| d.full_reduced_elements)
        .sum();
    assert_eq!(full, n as f64);
    for (reduce, full_reduce, want) in [(1e-6, 0.0, 1e-3), (1e-6, 1e-9, 1e-6), (0.0, 1e-9, 1e-6)] {
        let machine = coconet::runtime::model::Machine {
            memory_bandwidth: f64::INFINITY,
            stage_seconds: 0.0,
            reduce_seconds: reduce,
            full_reduce_seconds: full_reduce,
            cores: 1.0,
            ..memory_only()
        };
        let got = predict(&plan, &machine).total.as_secs_f64();
        assert!(
            (got - want).abs() < 1e-12,
            "{reduce} / {full_reduce}: {got} s, by hand {want} s"
        );
    }
}

/// The fused all-reduce's compiled kernel sums its sources at `compiled_reduce_seconds`
/// per element of the sum (it sums one element's sources at a time, the collectives
/// whole blocks), the rest of the step's reductions at `reduce_seconds` per element per
/// source, and every one at `reduce_seconds` where the compiled rate is not measured (0).
#[test]
fn compiled_reductions_have_their_own_rate() {
    use coconet::runtime::model::predict;
    let p = sgd();
    let fused = candidates(p.program(), &[])
        .into_iter()
        .find(|s| s.name().starts_with("fuse("))
        .expect("a fused schedule of sgd");
    let args = sgd_args(4096);
    let plan = Plan::lower(&fused, RANKS, args.dims()).unwrap();
    let steps = predict(&plan, &memory_only()).steps;
    let compiled: f64 = steps
        .iter()
        .map(|(_, d, _)| d.compiled_reduced_elements)
        .sum();
    let reduced: f64 = steps.iter().map(|(_, d, _)| d.reduced_elements).sum();
    assert!(compiled > 0.0, "the fused kernel reduces nothing");
    for (reduce, compiled_reduce) in [(1e-6, 0.0), (1e-6, 1e-9), (1e-9, 1e-6)] {
        let machine = coconet::runtime::model::Machine {
            memory_bandwidth: f64::INFINITY,
            reduce_seconds: reduce,
            compiled_reduce_seconds: compiled_reduce,
            cores: 1.0,
            ..memory_only()
        };
        // Per element of the sum (RANKS sources each) where measured, else per source.
        let compiled_cost = if compiled_reduce > 0.0 {
            compiled / RANKS as f64 * compiled_reduce
        } else {
            compiled * reduce
        };
        let want = compiled_cost + (reduced - compiled) * reduce;
        let got = predict(&plan, &machine).total.as_secs_f64();
        assert!(
            (got - want).abs() < 1e-12,
            "{reduce} / {compiled_reduce}: {got} s, by hand {want} s"
        );
    }
}

#[test]
fn machine_parameters_round_trip_through_toml() {
    use coconet::runtime::model::{InNetwork, Machine};
    let mut m = memory_only();
    m.flops = 1e12;
    m.links = Some(links(vec![simple(1e-6, 2e-6, 5e-6)]));
    m.links.as_mut().unwrap().in_network = Some(InNetwork {
        bandwidth: 2e11,
        latency: 2e-5,
    });
    assert_eq!(Machine::from_toml(&m.to_toml()).unwrap(), m);
    let err = Machine::from_toml("name = 3").unwrap_err();
    assert!(err.contains("machine parameters"), "{err}");
    // Parameters that would price a step at no time or forever are refused by name.
    let mut broken = m.clone();
    broken.links.as_mut().unwrap().protocols[0].efficiency = 0.0;
    let err = Machine::from_toml(&broken.to_toml()).unwrap_err();
    assert!(err.contains("efficiency"), "{err}");
    let mut broken = m.clone();
    broken.links.as_mut().unwrap().intra_beta = 0.0;
    let err = Machine::from_toml(&broken.to_toml()).unwrap_err();
    assert!(err.contains("links.intra_beta"), "{err}");
    let mut broken = m.clone();
    broken.links.as_mut().unwrap().protocols.clear();
    assert!(
        Machine::from_toml(&broken.to_toml())
            .unwrap_err()
            .contains("protocols")
    );
    let mut broken = m;
    broken.memory_bandwidth = -1.0;
    let err = Machine::from_toml(&broken.to_toml()).unwrap_err();
    assert!(err.contains("memory_bandwidth"), "{err}");
}

/// A protocol at full bandwidth with ring latencies (base, hop inside, hop between
/// nodes) and no tree.
fn simple(base: f64, intra: f64, inter: f64) -> coconet::runtime::model::Protocol {
    use coconet::runtime::model::{Latency, Protocol};
    Protocol {
        name: "Simple".into(),
        efficiency: 1.0,
        ring: Latency {
            base,
            intra_hop: intra,
            inter_hop: inter,
        },
        tree: None,
    }
}

/// 8 ranks per node, 100 GB/s inside, 10 GB/s per rank between nodes.
fn links(protocols: Vec<coconet::runtime::model::Protocol>) -> coconet::runtime::model::Links {
    coconet::runtime::model::Links {
        ranks_per_node: 8,
        intra_beta: 1e11,
        inter_beta: 1e10,
        protocols,
        in_network: None,
    }
}

/// An all-reduce of `size` bytes among `q` ranks, as a ring moves it.
use coconet::runtime::model::Pattern;

fn all_reduce(size: f64, q: usize) -> coconet::runtime::model::Transfer {
    let q = q as f64;
    coconet::runtime::model::Transfer {
        bytes: 2.0 * (q - 1.0) / q * size,
        hops: 2.0 * (q - 1.0),
        pattern: Pattern::AllReduce,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1e-9)
}

#[test]
fn collective_times_follow_the_alpha_beta_formulas_by_hand() {
    use coconet::runtime::model::{InNetwork, Latency};
    let l = links(vec![simple(1e-6, 2e-6, 5e-6)]);
    // A send between pipeline groups: one hop, each rank at its own bandwidth; over
    // the network once the plan spans two nodes; priced even for one-rank groups.
    let send = coconet::runtime::model::Transfer {
        bytes: 1e6,
        hops: 1.0,
        pattern: Pattern::Send,
    };
    let (t, how) = l.seconds(1, 4, &send);
    assert!(close(t, 1e-6 + 2e-6 + 1e6 / 1e11), "{t}");
    assert_eq!(how, "send/Simple");
    assert!(close(l.seconds(8, 16, &send).0, 1e-6 + 5e-6 + 1e6 / 1e10));
    // One node, q = 8, 1 MB: 1 µs + 14 hops · 2 µs + (2 · 7/8 · 1e6 B) / 1e11 B/s.
    let (t, how) = l.seconds(8, 8, &all_reduce(1e6, 8));
    assert!(close(t, 1e-6 + 14.0 * 2e-6 + 1.75e6 / 1e11), "{t}");
    assert_eq!(how, "ring/Simple");
    // Two nodes, q = 16: 1 of 15 steps crosses (30 hops: 28 inside, 2 between), and the
    // ring runs at min(100, 8 · 10) = 80 GB/s.
    let (t, _) = l.seconds(16, 16, &all_reduce(1e6, 16));
    let hops = 30.0 * (14.0 / 15.0 * 2e-6 + 1.0 / 15.0 * 5e-6);
    assert!(
        close(t, 1e-6 + hops + 2.0 * 15.0 / 16.0 * 1e6 / 8e10),
        "{t}"
    );
    // A reduce-scatter (q − 1 hops, (q−1)/q of the bytes) on one node.
    let rs = coconet::runtime::model::Transfer {
        bytes: 7.0 / 8.0 * 1e6,
        hops: 7.0,
        pattern: Pattern::Ring,
    };
    assert!(close(
        l.seconds(8, 8, &rs).0,
        1e-6 + 7.0 * 2e-6 + 0.875e6 / 1e11
    ));
    // Nothing to send costs nothing; one rank sends nothing.
    assert_eq!(l.seconds(8, 8, &all_reduce(0.0, 8)).0, 0.0);
    assert_eq!(l.seconds(1, 1, &all_reduce(1e6, 1)).0, 0.0);

    // With a tree, a small all-reduce over 8 nodes (q = 64) takes
    // 2 · (7 hops inside + 3 between) instead of a ring's 126 hops; a large one the ring.
    let mut p = simple(1e-6, 2e-6, 5e-6);
    p.tree = Some(Latency {
        base: 1e-6,
        intra_hop: 2e-6,
        inter_hop: 5e-6,
    });
    let l = links(vec![p]);
    let (t, how) = l.seconds(64, 64, &all_reduce(1e3, 64));
    assert_eq!(how, "tree/Simple");
    assert!(
        close(t, 1e-6 + 2.0 * (7.0 * 2e-6 + 3.0 * 5e-6) + 2.0 * 1e3 / 8e10),
        "{t}"
    );
    assert_eq!(l.seconds(64, 64, &all_reduce(1e9, 64)).1, "ring/Simple");
    // Only plain all-reduces may run as trees.
    let fused = coconet::runtime::model::Transfer {
        pattern: Pattern::Ring,
        ..all_reduce(1e3, 64)
    };
    assert_eq!(l.seconds(64, 64, &fused).1, "ring/Simple");

    // A low-latency protocol at half the bandwidth wins small messages only.
    let mut ll = simple(1e-6, 0.5e-6, 1e-6);
    ll.name = "LL".into();
    ll.efficiency = 0.5;
    let l = links(vec![simple(1e-6, 2e-6, 5e-6), ll]);
    assert_eq!(l.seconds(8, 8, &all_reduce(1e3, 8)).1, "ring/LL");
    let (t, how) = l.seconds(8, 8, &all_reduce(1e8, 8));
    assert_eq!(how, "ring/Simple");
    assert!(close(t, 1e-6 + 14.0 * 2e-6 + 1.75e8 / 1e11));

    // In the network, inside one node: latency + the tensor over the algorithm bandwidth.
    let mut l = links(vec![simple(1e-6, 2e-6, 5e-6)]);
    l.in_network = Some(InNetwork {
        bandwidth: 2e11,
        latency: 2e-5,
    });
    let (t, how) = l.seconds(8, 8, &all_reduce(1e9, 8));
    assert_eq!(how, "in-network");
    assert!(close(t, 2e-5 + 1e9 / 2e11), "{t}");
    // Not across nodes.
    assert_eq!(l.seconds(16, 16, &all_reduce(1e9, 16)).1, "ring/Simple");
}

#[test]
fn shipped_machine_presets_load_and_name_their_sources() {
    use coconet::runtime::model::{Machine, PRESETS};
    for (name, _) in PRESETS {
        let m = Machine::preset(name).unwrap();
        assert!(!m.source.is_empty(), "{name}");
        let links = m.links.as_ref().expect("a GPU machine has links");
        assert!(!links.protocols.is_empty(), "{name}");
        for p in &links.protocols {
            assert!(
                p.efficiency > 0.0 && p.efficiency <= 1.0,
                "{name} {}",
                p.name
            );
        }
        assert_eq!(Machine::from_toml(&m.to_toml()).unwrap(), m);
    }
    let err = Machine::preset("dgx-9").unwrap_err();
    assert!(
        err.contains("dgx2-v100") && err.contains("dgx-h100"),
        "{err}"
    );
}

/// HeterPS's synchronisation priced by coconet: at replica counts it was not derived
/// from, each schedule's time per parameter byte equals the cost model's prediction of
/// the schedule's plan on a latency-free machine with the same memory and network.
#[cfg(feature = "hetero")]
#[test]
fn heterps_sync_from_coconet_equals_the_cost_model() {
    use coconet::hetero::SyncModel;
    use coconet::runtime::model::{Latency, Links, Machine, Protocol, predict};
    let SyncModel::Schedules(schedules) = coconet::hetero_sync::coconet_schedules().unwrap() else {
        panic!("coconet's model is a list of schedules");
    };
    let names: Vec<&str> = schedules.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["AR-C", "RS-C-AG", "fuse(RS-C-AG)"]);
    let (memory, network) = (2e11, 1.25e10);
    let machine = Machine {
        name: "latency-free".into(),
        ranks_per_memory: 1,
        memory_bandwidth: memory,
        cores: 1.0,
        compute_overlaps_memory: true,
        links: Some(Links {
            ranks_per_node: usize::MAX,
            intra_beta: network,
            inter_beta: network,
            protocols: vec![Protocol {
                name: "Simple".into(),
                efficiency: 1.0,
                ring: Latency {
                    base: 0.0,
                    intra_hop: 0.0,
                    inter_hop: 0.0,
                },
                tree: None,
            }],
            in_network: None,
        }),
        ..memory_only()
    };
    let adamw = coconet::programs::adamw();
    let plans = candidates(adamw.program(), &[adamw.m.id(), adamw.v.id()]);
    // ~1 ms per schedule: the prediction's nanosecond rounding is ~1e-6 of it.
    let n = 3 * 5 * 7 * 64 * 256;
    for k in [1u64, 3, 5, 7, 8, 16] {
        for (s, plan_schedule) in schedules.iter().zip(&plans) {
            let plan = Plan::lower(
                plan_schedule,
                k as usize,
                Bindings::new().dim("N", n).dims(),
            )
            .unwrap();
            let predicted = predict(&plan, &machine).total.as_secs_f64();
            let priced = s.seconds_per_byte(k, memory, network) * 4.0 * n as f64;
            assert!(
                (predicted - priced).abs() <= 2e-9,
                "{} at k = {k}: model {predicted}, HeterPS {priced}",
                s.name
            );
        }
    }
}
