//! Runs the example programs' schedules under MPI (one rank per process) and checks each
//! process's results bitwise against the same plan on in-process rank threads; with
//! `--bench N`, times Adam's fused schedule against `MPI_Allreduce` + a single-loop Adam,
//! and LAMB's fused schedule (two passes).
//!
//! With `--steps N K`, runs Adam's fused step K times at N elements and nothing else
//! (a steady state to profile, e.g. under `perf record -a`); with `--threads P` too (one
//! process, no `mpirun` needed), the same step on P rank threads instead, the reference
//! of item 4's ratio from the same binary.
//!
//! With `--tune N`, tunes Adam's and LAMB's candidate schedules × round sizes × kernel
//! chunks across the processes (`tune_processes`) at N elements and prints the tables.
//!
//! With `--candle` (feature `candle`), trains a small candle model with
//! `DataParallel::mpi` (one replica per process, each binding only its own gradient) and
//! checks every step's weights bitwise against the rank-thread trainer.
//!
//! Jobs put their buffers in an MPI-3 shared-memory window (every process is on this
//! machine); with `--messages`, `--steps` and `--bench` move every byte in MPI messages
//! instead.
//!
//! `mpirun -np 4 target/release/coconet-mpi-check [--bench N | --steps N K [--threads P] | --tune N | --candle | --panic | --stall | --stall-between-runs | --hang-between-runs | --stall-in-step | --vanish-in-step] [--messages]`

use coconet_example_programs as programs;
use programs::{
    adam as adam_program, data, lamb as lamb_program, megatron as megatron_program,
    sgd as sgd_program,
};

use coconet::core::schedule::{Schedule, candidates};
use coconet::prelude::*;
use coconet::runtime::Plan;
use coconet::runtime::cpu::{Job, RunOptions};
use coconet::runtime::mpi::{Mpi, MpiJob, ROUND_CHUNKS};
use coconet::runtime::tune::{ProcessKnobs, TuneOptions, Tuning, tune_processes};
use mpi::collective::SystemOperation;
use mpi::traits::*;
use std::time::Instant;

fn adam_bindings(ranks: usize, n: usize) -> Bindings {
    let hp = adam_program::AdamParams {
        step: 2,
        ..Default::default()
    };
    let (grads, w, m, v) = optimizer_data(ranks, n);
    adam_program::adam_args(&grads, &w, &m, &v, hp).into()
}

/// Every rank's gradient, and w, m and v (v non-negative) for an optimizer's arguments.
#[allow(clippy::type_complexity)]
fn optimizer_data(ranks: usize, n: usize) -> (Vec<Vec<f32>>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let grads: Vec<Vec<f32>> = (0..ranks).map(|r| data::uniform_f32(r as u64, n)).collect();
    let v: Vec<f32> = data::uniform_f32(3, n).iter().map(|x| x * x).collect();
    (grads, data::uniform_f32(1, n), data::uniform_f32(2, n), v)
}

/// Runs `schedules` under MPI — with the job's buffers in a shared-memory window (the
/// default on one machine), and moving every byte in MPI messages (fused all-reduces in
/// rounds of `round_chunks` kernel chunks) — and on rank threads; returns the
/// mismatches.
fn check(
    world: &mpi::topology::SimpleCommunicator,
    schedules: &[Schedule],
    args: &Bindings,
    round_chunks: usize,
) -> Vec<String> {
    let ranks = world.size() as usize;
    let rank = world.rank() as usize;
    let mut bad = Vec::new();
    for s in schedules {
        let plan = Plan::lower(s, ranks, args.dims()).expect("plan");
        let mut threads = Job::new(&plan, args, RunOptions::default()).expect("bind");
        threads.run().expect("threads run");
        for shared in [true, false] {
            let mut mpi_job = MpiJob::new(&plan, args, communicator(world, !shared)).expect("bind");
            if mpi_job.shares_memory() != shared {
                bad.push(format!("{}: shares memory: {}", s.name(), !shared));
            }
            mpi_job.set_round_chunks(round_chunks);
            mpi_job.run().expect("mpi run");
            let how = match shared {
                true => "shared memory".to_string(),
                false => format!("messages, rounds of {round_chunks} chunks"),
            };
            bad.extend(differences(s, &mpi_job, &threads, rank, &how));
        }
    }
    bad
}

/// The updated inputs and outputs of `s` on which the MPI job and rank threads differ.
fn differences(
    s: &Schedule,
    mpi_job: &MpiJob,
    threads: &Job,
    rank: usize,
    how: &str,
) -> Vec<String> {
    let mut bad = Vec::new();
    {
        let p = s.original();
        let mut names: Vec<(String, coconet::core::ValueId)> =
            p.updates().map(|(t, _)| (p.label(t), t)).collect();
        names.extend(p.outputs().iter().map(|&o| (p.label(o), o)));
        for (name, id) in names {
            let a: Option<Vec<f64>> = mpi_job.local(id, rank);
            let b: Option<Vec<f64>> = threads.local(id, rank);
            let (a, b) = if p.node(id).op == coconet::core::Op::TensorInput {
                (
                    mpi_job.final_input_local(&name, rank).ok(),
                    threads.final_input_local(&name, rank).ok(),
                )
            } else {
                (a, b)
            };
            let bits =
                |v: Option<Vec<f64>>| v.map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            if bits(a) != bits(b) {
                bad.push(format!(
                    "{} ({how}): `{name}` differs on rank {rank}",
                    s.name()
                ));
            }
        }
    }
    bad
}

/// Adam trained for 20 iterations, each process binding only its own gradient
/// (`Binding::this_rank`) and writing fresh gradients and a new step and learning rate
/// into the job between runs; every iteration bitwise equal to the interpreter (which
/// each process runs with every rank's gradients, regenerated from their seeds).
fn training_loop(world: &mpi::topology::SimpleCommunicator) -> Vec<String> {
    let ranks = world.size() as usize;
    let rank = world.rank() as usize;
    let p = adam_program::adam();
    let n = 3001;
    let grads = |it: usize| -> Vec<Vec<f32>> {
        (0..ranks)
            .map(|r| data::uniform_f32(100 * it as u64 + r as u64, n))
            .collect()
    };
    let hp = |it: usize| adam_program::AdamParams {
        lr: 1e-2 / (1.0 + it as f64),
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        step: it as i32 + 1,
    };
    let mut bad = Vec::new();
    for s in candidates(p.program(), &[p.m.id(), p.v.id()]) {
        let (mut w, mut m, mut v) = (data::uniform_f32(1, n), vec![0.0f32; n], vec![0.0f32; n]);
        let mine: Bindings = adam_program::adam_args(&grads(0), &w, &m, &v, hp(0)).into();
        let mine = mine.tensor("g", Binding::this_rank(&grads(0)[rank]));
        let plan = Plan::lower(&s, ranks, mine.dims()).expect("plan");
        let mut job = MpiJob::new(&plan, &mine, world.duplicate().into()).expect("bind");
        for it in 0..20 {
            if it > 0 {
                job.set_scalar("step", hp(it).step).expect("step");
                job.set_scalar("lr", hp(it).lr).expect("lr");
            }
            // Odd iterations lend the gradient, even ones copy it into the job.
            if it % 2 == 1 {
                job.run_with("g", &grads(it)[rank]).expect("run");
            } else {
                job.input_mut::<f32>("g", rank)
                    .expect("g")
                    .copy_from_slice(&grads(it)[rank]);
                job.run().expect("run");
            }
            // The interpreter runs the same schedule (m and v are stored sliced by the
            // sharded ones, so each rank holds its block).
            let args: Bindings = adam_program::adam_args(&grads(it), &w, &m, &v, hp(it)).into();
            let want = interpret(s.program(), ranks, &args).expect("interpreter");
            for name in ["w", "m", "v"] {
                let got: Vec<f32> = job.final_input_local(name, rank).expect("read");
                let exp: Vec<f32> = want.final_input_local(name, rank).expect("read");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                if bits(&got) != bits(&exp) {
                    bad.push(format!(
                        "training loop, {}: `{name}` differs at iteration {it}",
                        s.name()
                    ));
                }
            }
            let borrowed: &[f32] = job.input("w", rank).expect("view");
            let want_w: Vec<f32> = want.final_input("w").expect("w");
            if borrowed != &want_w[..] {
                bad.push(format!(
                    "training loop, {}: borrowed `w` differs at iteration {it}",
                    s.name()
                ));
            }
            (w, m, v) = (
                want_w,
                want.final_input("m").expect("m"),
                want.final_input("v").expect("v"),
            );
        }
    }
    bad
}

/// Processes that disagree are errors on every process, naming the rank: a Replicated
/// input bound differently, then a learning rate set differently before a run.
fn disagreement(world: &mpi::topology::SimpleCommunicator) -> Vec<String> {
    let ranks = world.size() as usize;
    let rank = world.rank() as usize;
    let p = adam_program::adam();
    let n = 64;
    let plan = Plan::lower(
        &Schedule::new(p.program()),
        ranks,
        &[("N".to_string(), n)].into(),
    )
    .expect("plan");
    let mut bad = Vec::new();
    let args = |w: f32| -> Bindings {
        let hp = adam_program::AdamParams::default();
        let g = vec![vec![0.5f32; n]; ranks];
        adam_program::adam_args(&g, &vec![w; n], &vec![0.0; n], &vec![0.0; n], hp).into()
    };
    let w = if rank == ranks - 1 { 2.0 } else { 1.0 };
    match MpiJob::new(&plan, &args(w), world.duplicate().into()) {
        Err(e)
            if e.to_string().contains(&format!("rank {}", ranks - 1))
                && e.to_string().contains("`w`") => {}
        Err(e) => bad.push(format!("different `w`: unexpected error {e}")),
        Ok(_) => bad.push("different `w` on one rank was accepted".into()),
    }
    // A rank whose own bindings fail: it reports its error, its peers name it.
    let short = if rank == 1 {
        args(1.0).tensor("w", Binding::global(&[1.0f32; 3]))
    } else {
        args(1.0)
    };
    match MpiJob::new(&plan, &short, world.duplicate().into()) {
        Err(e) if rank == 1 && e.to_string().contains("`w`") => {}
        Err(e) if rank != 1 && e.to_string().contains("rank 1 could not bind") => {}
        Err(e) => bad.push(format!("rank 1's bad binding: unexpected error {e}")),
        Ok(_) => bad.push("rank 1's bad binding was accepted".into()),
    }
    let mut job = MpiJob::new(&plan, &args(1.0), world.duplicate().into()).expect("bind");
    job.run().expect("run");
    if rank == 1 {
        job.set_scalar("lr", 0.5f64).expect("lr");
    }
    match job.run() {
        Err(e) if e.to_string().contains("rank 1") && e.to_string().contains("`lr`") => {}
        Err(e) => bad.push(format!("different `lr`: unexpected error {e}")),
        Ok(()) => bad.push("different `lr` on one rank was accepted".into()),
    }
    if job.input::<f32>("w", rank).is_ok() {
        bad.push("a failed job handed out its buffers".into());
    }
    bad
}

/// Every candidate of `schedules` prepared under MPI with `args`, tuned over `knobs`.
fn tune_all(
    world: &mpi::topology::SimpleCommunicator,
    schedules: &[Schedule],
    args: &Bindings,
    knobs: &[ProcessKnobs],
    options: &TuneOptions,
) -> (Result<Tuning, coconet::runtime::RuntimeError>, Vec<MpiJob>) {
    let ranks = world.size() as usize;
    let mut jobs: Vec<MpiJob> = schedules
        .iter()
        .map(|s| {
            let plan = Plan::lower(s, ranks, args.dims()).expect("plan");
            MpiJob::new(&plan, args, world.duplicate().into()).expect("bind")
        })
        .collect();
    let tuning = tune_processes(&mut jobs, knobs, options);
    (tuning, jobs)
}

/// Tunes Adam's and LAMB's schedules across the processes at `n` elements; rank 0
/// prints the tables.
fn tune_optimizers(world: &mpi::topology::SimpleCommunicator, n: usize) {
    let ranks = world.size() as usize;
    let knobs = ProcessKnobs::grid(&[32, 128, 512], &[4096, 16384]);
    let options = TuneOptions {
        cache: None,
        backend: "mpi".into(),
        ..TuneOptions::default()
    };
    let adam = adam_program::adam();
    let lamb = lamb_program::lamb();
    for (name, schedules, args) in [
        (
            "adam",
            candidates(adam.program(), &[adam.m.id(), adam.v.id()]),
            adam_bindings(ranks, n),
        ),
        (
            "lamb",
            candidates(lamb.program(), &[lamb.m.id(), lamb.v.id()]),
            lamb_bindings(ranks, n),
        ),
    ] {
        let (tuning, jobs) = tune_all(world, &schedules, &args, &knobs, &options);
        drop(jobs);
        match tuning {
            Ok(t) if world.rank() == 0 => println!("{name}, P = {ranks}, N = {n}:\n{t}"),
            Ok(_) => {}
            Err(e) => {
                eprintln!("rank {}: {e}", world.rank());
                world.abort(1);
            }
        }
    }
}

/// Tuning across processes at a small size: every contender timed, the choice set on
/// the jobs, the model left as it was bound.
fn tuning(world: &mpi::topology::SimpleCommunicator) -> Vec<String> {
    let (ranks, rank) = (world.size() as usize, world.rank() as usize);
    let n = 3001;
    let adam = adam_program::adam();
    let schedules = candidates(adam.program(), &[adam.m.id(), adam.v.id()]);
    let knobs = ProcessKnobs::grid(&[1, 4], &[512, 4096]);
    let options = TuneOptions {
        cache: None,
        warmup: 1,
        rounds: 3,
        ..TuneOptions::default()
    };
    let (tuning, jobs) = tune_all(
        world,
        &schedules,
        &adam_bindings(ranks, n),
        &knobs,
        &options,
    );
    let t = match tuning {
        Ok(t) => t,
        Err(e) => return vec![format!("tuning across processes failed: {e}")],
    };
    let mut bad = Vec::new();
    if t.table.len() != schedules.len() * knobs.len() || !t.rejected.is_empty() {
        bad.push(format!("tuning across processes left contenders out:\n{t}"));
    }
    let (_, w, _, _) = optimizer_data(ranks, n);
    for (j, job) in jobs.iter().enumerate() {
        let fastest = t.table.iter().find(|m| m.schedule_index == j);
        let want = fastest.map(|m| knobs[m.variant_index]);
        if want.map(|k| (k.round_chunks, k.chunk)) != Some((job.round_chunks(), job.chunk())) {
            bad.push(format!(
                "job {j} does not run its fastest knobs after tuning"
            ));
        }
        if job.input::<f32>("w", rank).ok() != Some(&w[..]) {
            bad.push(format!("tuning changed job {j}'s w"));
        }
    }
    bad
}

/// A duplicate of `world` for a job: sharing memory, or (`messages`) moving every byte
/// in MPI messages.
fn communicator(world: &mpi::topology::SimpleCommunicator, messages: bool) -> Mpi {
    let mpi = Mpi::from(world.duplicate());
    if messages {
        mpi.without_shared_memory()
    } else {
        mpi
    }
}

fn bench(world: &mpi::topology::SimpleCommunicator, n: usize, messages: bool) {
    let communicator = || communicator(world, messages);
    let ranks = world.size() as usize;
    let rank = world.rank() as usize;
    let p = adam_program::adam();
    let args = adam_bindings(ranks, n);
    let fused = &candidates(p.program(), &[p.m.id(), p.v.id()])[2];
    let plan = Plan::lower(fused, ranks, args.dims()).expect("plan");
    let mut job = MpiJob::new(&plan, &args, communicator()).expect("bind");
    // Baseline: MPI_Allreduce of the f32 gradient, then one loop of Adam over N.
    let mut g = data::uniform_f32(rank as u64, n);
    let (mut w, mut m, mut v) = (data::uniform_f32(1, n), vec![0.0f32; n], vec![0.0f32; n]);
    let mut sum = vec![0.0f32; n];
    let time = |f: &mut dyn FnMut()| {
        let mut best = f64::MAX;
        for _ in 0..5 {
            world.barrier();
            let t = Instant::now();
            f();
            world.barrier();
            best = best.min(t.elapsed().as_secs_f64());
        }
        best
    };
    let baseline = time(&mut || {
        world.all_reduce_into(&g[..], &mut sum[..], SystemOperation::sum());
        let (b1, b2, lr, eps) = (0.9f32, 0.999f32, 1e-3f32, 1e-8f32);
        let (c1, c2) = (1.0 - b1 * b1, 1.0 - b2 * b2);
        for i in 0..n {
            m[i] = b1 * m[i] + (1.0 - b1) * sum[i];
            v[i] = b2 * v[i] + (1.0 - b2) * sum[i] * sum[i];
            w[i] -= lr * (m[i] / c1) / ((v[i] / c2).sqrt() + eps);
        }
        g[0] += 0.0;
    });
    let ours = time(&mut || job.run().expect("run"));
    let lamb = lamb_program::lamb();
    let lamb_args = lamb_bindings(ranks, n);
    let lamb_fused = candidates(lamb.program(), &[lamb.m.id(), lamb.v.id()])
        .into_iter()
        .find(|s| s.name() == "fuse(RS-C-AG)")
        .expect("LAMB's fused schedule");
    let lamb_plan = Plan::lower(&lamb_fused, ranks, lamb_args.dims()).expect("plan");
    let mut lamb_job = MpiJob::new(&lamb_plan, &lamb_args, communicator()).expect("bind");
    let lamb_time = time(&mut || lamb_job.run().expect("run"));
    drop((lamb_job, lamb_args));
    // The training loop on a job bound per process (this rank's gradient only):
    // write the gradient, set the step, run, read w through a borrowed view.
    // Only the per-process job and this rank's gradient stay resident.
    drop((job, args, w, m, v, sum));
    let hp = adam_program::AdamParams::default();
    let zeros = vec![0.0f32; n];
    let mine: Bindings =
        adam_program::adam_args(&[], &data::uniform_f32(1, n), &zeros, &zeros, hp).into();
    let mine = mine.tensor("g", Binding::this_rank(&g));
    let mut job = MpiJob::new(&plan, &mine, communicator()).expect("bind");
    drop(mine);
    let mut step = 1;
    let (mut run, mut iteration, mut lent) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..7 {
        world.barrier();
        let t = Instant::now();
        job.run().expect("run");
        run.push(t.elapsed().as_secs_f64());
        world.barrier();
        let t = Instant::now();
        step += 1;
        job.input_mut::<f32>("g", rank)
            .expect("g")
            .copy_from_slice(&g);
        job.set_scalar("step", step).expect("step");
        job.run().expect("run");
        std::hint::black_box(job.input::<f32>("w", rank).expect("w")[n - 1]);
        iteration.push(t.elapsed().as_secs_f64());
        world.barrier();
        let t = Instant::now();
        step += 1;
        job.set_scalar("step", step).expect("step");
        job.run_with("g", &g).expect("run");
        std::hint::black_box(job.input::<f32>("w", rank).expect("w")[n - 1]);
        lent.push(t.elapsed().as_secs_f64());
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (run, iteration, lent) = (median(run), median(iteration), median(lent));
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?.to_string();
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or("?".to_string(), |kib| format!("{:.0} MiB", kib / 1024.0));
    println!(
        "rank {rank}: training loop (per-process bindings): run {:.1} ms; iteration \
         (set step + run_with lent gradient + read w) {:.1} ms ({:.2}x run); with the \
         gradient copied in instead {:.1} ms ({:.2}x run); resident {rss}",
        run * 1e3,
        lent * 1e3,
        lent / run,
        iteration * 1e3,
        iteration / run
    );
    if rank == 0 {
        println!(
            "Adam N={n} on {ranks} MPI processes: MPI_Allreduce + single-loop Adam {:.1} ms, \
             fuse(RS-C-AG) {:.1} ms, ratio {:.2}x",
            baseline * 1e3,
            ours * 1e3,
            baseline / ours
        );
        println!(
            "LAMB N={n} on {ranks} MPI processes: fuse(RS-C-AG) {:.1} ms",
            lamb_time * 1e3
        );
    }
}

/// LAMB's arguments (the same data as Adam's, at step 3).
fn lamb_bindings(ranks: usize, n: usize) -> Bindings {
    let (grads, w, m, v) = optimizer_data(ranks, n);
    let hp = lamb_program::LambParams {
        step: 3,
        ..Default::default()
    };
    lamb_program::lamb_args(&grads, &w, &m, &v, hp).into()
}

/// `DataParallel::mpi` against `DataParallel::new` on rank threads: the same gradients
/// give bitwise the same weights after every step.
#[cfg(feature = "candle")]
fn candle_trainer(world: &mpi::topology::SimpleCommunicator) -> Result<(), String> {
    use candle_core::{Device, Tensor, Var};
    use coconet::candle::{AdamWConfig, DataParallel, Optimizer, SgdConfig};
    let (ranks, rank) = (world.size() as usize, world.rank() as usize);
    let shapes: [&[usize]; 3] = [&[3, 4], &[5], &[2, 2, 3]];
    let model = || -> Vec<Var> {
        shapes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let n: usize = s.iter().product();
                let init: Vec<f32> = (0..n)
                    .map(|k| ((k * 7 + i * 3) % 11) as f32 / 10.0 - 0.5)
                    .collect();
                Var::from_tensor(&Tensor::from_slice(&init, *s, &Device::Cpu).unwrap()).unwrap()
            })
            .collect()
    };
    // Rank r's gradient at `step`: of sum(w · c) with coefficients depending on both.
    let grads = |vars: &[Var], r: usize, step: usize| {
        let mut loss = Tensor::zeros((), candle_core::DType::F32, &Device::Cpu).unwrap();
        for (i, v) in vars.iter().enumerate() {
            let c: Vec<f32> = (0..v.elem_count())
                .map(|k| ((k * 5 + r * 13 + i * 3 + step * 17) % 19) as f32 / 9.0 - 1.0)
                .collect();
            let c = Tensor::from_slice(&c, v.shape(), &Device::Cpu).unwrap();
            loss = (loss + (v.as_tensor() * c).unwrap().sum_all().unwrap()).unwrap();
        }
        loss.backward().unwrap()
    };
    let bits = |vars: &[Var]| -> Vec<u32> {
        vars.iter()
            .flat_map(|v| {
                v.as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            })
            .map(f32::to_bits)
            .collect()
    };
    let adamw = AdamWConfig {
        lr: 0.01,
        max_grad_norm: Some(0.5),
        ..AdamWConfig::default()
    };
    for optimizer in [
        Optimizer::from(adamw),
        Optimizer::from(SgdConfig::default()),
    ] {
        let mine = model();
        let mut trainer = DataParallel::mpi(mine.clone(), world.duplicate(), optimizer.clone())
            .map_err(|e| e.to_string())?;
        let replicas: Vec<Vec<Var>> = (0..ranks).map(|_| model()).collect();
        let mut threads =
            DataParallel::new(replicas.clone(), optimizer).map_err(|e| e.to_string())?;
        for step in 0..4 {
            trainer
                .step(&[grads(&mine, rank, step)])
                .map_err(|e| e.to_string())?;
            let all: Vec<_> = (0..ranks).map(|r| grads(&replicas[r], r, step)).collect();
            threads.step(&all).map_err(|e| e.to_string())?;
            if bits(&mine) != bits(&replicas[rank]) {
                return Err(format!(
                    "{}: step {step}: the MPI trainer's weights differ from rank threads'",
                    trainer.schedule().program().name()
                ));
            }
        }
        let n: usize = mine.iter().map(|v| v.elem_count()).sum();
        let per_state = 4 * n.div_ceil(ranks);
        if trainer.state_bytes_per_rank() > 2 * per_state {
            return Err(format!(
                "{} bytes of optimizer state on rank {rank}",
                trainer.state_bytes_per_rank()
            ));
        }
        // One store per process: passing every rank's is refused.
        let e = trainer
            .step(&[grads(&mine, rank, 0), grads(&mine, rank, 0)])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        if !e.contains("2 gradient stores for 1 ranks") {
            return Err(format!("two stores were not refused: {e:?}"));
        }
    }
    Ok(())
}

/// The `k`-th number after the flag at `args[flag]`, or `default`.
fn number(args: &[String], flag: usize, k: usize, default: usize) -> usize {
    args.get(flag + k)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Adam's fused schedule at n elements on `ranks` ranks, and its bindings.
fn fused_adam_plan(ranks: usize, n: usize) -> (Plan, Bindings) {
    let p = adam_program::adam();
    let args = adam_bindings(ranks, n);
    let s = &candidates(p.program(), &[p.m.id(), p.v.id()])[2];
    (Plan::lower(s, ranks, args.dims()).expect("plan"), args)
}

/// Adam's fused job at n elements, the same across the processes (the bindings
/// dropped: the job holds its own); `messages`: see [`communicator`].
fn fused_adam(world: &mpi::topology::SimpleCommunicator, n: usize, messages: bool) -> MpiJob {
    let (plan, args) = fused_adam_plan(world.size() as usize, n);
    MpiJob::new(&plan, &args, communicator(world, messages)).expect("bind")
}

/// Milliseconds per run of `run`, over `steps` runs.
fn per_step(steps: usize, run: &mut dyn FnMut()) -> f64 {
    let start = Instant::now();
    (0..steps).for_each(|_| run());
    start.elapsed().as_secs_f64() * 1e3 / steps as f64
}

/// `--panic`: rank 2 panics in the middle of a run: the job must end at once
/// (MPI_Abort), not hang its peers.
fn panic_in_run(world: &mpi::topology::SimpleCommunicator, messages: bool) {
    let mut job = fused_adam(world, 1000, messages);
    if world.rank() == 2 {
        job.inject_fault(Some(coconet::runtime::cpu::Fault::Panic {
            rank: 2,
            step: 1,
        }));
    }
    let _ = job.run();
    println!("rank {}: the run returned", world.rank());
}

/// `--stall`: over MPI messages, rank 2 stops answering between two runs: the others'
/// MPI waits end at their deadline (2 s here) and abort the job with a message, instead
/// of hanging.
fn stall_over_messages(world: &mpi::topology::SimpleCommunicator) {
    let (plan, bindings) = fused_adam_plan(world.size() as usize, 1000);
    let mut job = MpiJob::new(&plan, &bindings, communicator(world, true)).expect("bind");
    job.set_timeout(std::time::Duration::from_secs(2));
    job.run().expect("the first run");
    if world.rank() == 2 {
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
    let _ = job.run();
    println!("rank {}: the run returned", world.rank());
}

/// `--stall-between-runs`, `--hang-between-runs` (`hang`): over shared memory, rank 2
/// stops between two runs for twice the deadline: the others' next run fails at the
/// deadline (2 s) naming it, at the agreement on the scalars in the window; rank 2's
/// fails at once when it goes on. Hung for good instead, rank 2 never releases the
/// window with the others: once they have waited for it twice the deadline, they abort
/// the job.
fn stop_between_runs(world: &mpi::topology::SimpleCommunicator, hang: bool, messages: bool) {
    let mut job = fused_adam(world, 1000, messages);
    assert!(job.shares_memory(), "the processes share memory");
    job.set_timeout(std::time::Duration::from_secs(2));
    job.run().expect("the first run");
    if world.rank() == 2 {
        std::thread::sleep(std::time::Duration::from_secs(if hang { 600 } else { 4 }));
    }
    match job.run() {
        Ok(()) => println!("rank {}: the run succeeded", world.rank()),
        Err(e) => println!("rank {}: the run failed: {e}", world.rank()),
    }
}

/// `--stall-in-step` (`stall`), `--vanish-in-step`: rank 2 stops in the middle of a run
/// over shared memory. Stalled, the others wait for it at a barrier in the window until
/// their deadline (2 s); gone (its run returns early), it marks the world failed and
/// nobody waits (deadline 60 s). Either way every process's run fails naming it
/// (nothing to abort: no MPI call is in flight).
fn stop_in_step(world: &mpi::topology::SimpleCommunicator, stall: bool, messages: bool) {
    use coconet::runtime::cpu::Fault;
    let mut job = fused_adam(world, 1000, messages);
    assert!(job.shares_memory(), "the processes share memory");
    job.set_timeout(std::time::Duration::from_secs(if stall { 2 } else { 60 }));
    if world.rank() == 2 {
        job.inject_fault(Some(match stall {
            true => Fault::Stall { rank: 2, step: 1 },
            false => Fault::Vanish { rank: 2, step: 1 },
        }));
    }
    match job.run() {
        Ok(()) => println!("rank {}: the run succeeded", world.rank()),
        Err(e) => println!("rank {}: the run failed: {e}", world.rank()),
    }
}

/// `--candle`: the candle trainer across processes against rank threads (aborts the
/// job where they differ or the feature is off).
fn candle(world: &mpi::topology::SimpleCommunicator) {
    #[cfg(feature = "candle")]
    {
        match candle_trainer(world) {
            Ok(()) => println!(
                "rank {}: the candle trainer across processes equals rank threads bitwise",
                world.rank()
            ),
            Err(e) => {
                eprintln!("rank {}: {e}", world.rank());
                world.abort(1);
            }
        }
    }
    #[cfg(not(feature = "candle"))]
    {
        eprintln!("--candle needs the `candle` feature");
        world.abort(2);
    }
}

/// `--steps N K [--threads P]`: Adam's fused step K times at N elements, across the
/// processes or (`--threads`) on P rank threads in this one process.
fn steps(world: &mpi::topology::SimpleCommunicator, args: &[String], i: usize, messages: bool) {
    let (n, steps) = (number(args, i, 1, 1 << 24), number(args, i, 2, 50));
    if let Some(t) = args.iter().position(|a| a == "--threads") {
        // The same step on rank threads in this one process: the reference of the
        // processes' time, from the same binary.
        let ranks = number(args, t, 1, 4);
        let (plan, args) = fused_adam_plan(ranks, n);
        let mut job = Job::new(&plan, &args, RunOptions::default()).expect("bind");
        drop(args);
        let ms = per_step(steps, &mut || job.run().expect("run"));
        println!("Adam fuse(RS-C-AG), N = {n}, {ranks} rank threads: {ms:.3} ms per step");
        return;
    }
    let mut job = fused_adam(world, n, messages);
    let ms = per_step(steps, &mut || job.run().expect("run"));
    if world.rank() == 0 {
        let ranks = world.size();
        let how = match job.shares_memory() {
            true => "shared memory",
            false => "messages",
        };
        println!("Adam fuse(RS-C-AG), N = {n}, {ranks} processes ({how}): {ms:.3} ms per step");
    }
}

/// Every example's schedules under MPI against rank threads, at sizes chosen for the
/// fused all-reduce's rounds; returns the mismatches.
fn check_examples(world: &mpi::topology::SimpleCommunicator) -> Vec<String> {
    let ranks = world.size() as usize;
    let mut bad = Vec::new();
    let adam = adam_program::adam();
    for n in [7, 3001] {
        bad.extend(check(
            world,
            &candidates(adam.program(), &[adam.m.id(), adam.v.id()]),
            &adam_bindings(ranks, n),
            ROUND_CHUNKS,
        ));
    }
    // The fused all-reduce's pipelined rounds (Adam's kernel chunks are 2048 elements):
    // many rounds with a partial last one and blocks of different lengths across ranks
    // (20483 = 4 · 5120 + 3: blocks of 5121 and 5120 in rounds of 2048), a tensor
    // smaller than one round, and the default rounds with a last round of one or two
    // elements (4 · 2048 · 128 + 5).
    let adam_all = candidates(adam.program(), &[adam.m.id(), adam.v.id()]);
    for (n, chunks, schedules) in [
        (20483, 1, &adam_all[..]),
        (3001, 2, &adam_all[..]),
        (4 * 2048 * ROUND_CHUNKS + 5, ROUND_CHUNKS, &adam_all[2..3]),
    ] {
        bad.extend(check(world, schedules, &adam_bindings(ranks, n), chunks));
    }
    bad.extend(check_sgd(world));
    // LAMB's two passes (the second a fused all-gather): one round, and rounds of one
    // chunk on blocks of several.
    let lamb = lamb_program::lamb();
    for (n, chunks) in [(3001, ROUND_CHUNKS), (20011, 1)] {
        bad.extend(check(
            world,
            &candidates(lamb.program(), &[lamb.m.id(), lamb.v.id()]),
            &lamb_bindings(ranks, n),
            chunks,
        ));
    }
    let mega = megatron_program::megatron();
    let (b, s, h) = (5, 2, 6);
    let mega_args: Bindings = megatron_program::megatron_args(b, s, h, 3).into();
    bad.extend(check(
        world,
        &candidates(mega.program(), &[]),
        &mega_args,
        ROUND_CHUNKS,
    ));
    // Rows of 64 (layer norm: kernel chunks of 2048 = 32 rows), 9 batch rows split 3, 2,
    // 2, 2: one rank has two rounds, the others one and an empty one.
    let mega_args: Bindings = megatron_program::megatron_args(9, 16, 64, 3).into();
    bad.extend(check(
        world,
        &candidates(mega.program(), &[]),
        &mega_args,
        1,
    ));
    bad
}

/// SGD's fused rounds: one, then 2 rounds of 2048 on 2501 and 2500-element blocks.
fn check_sgd(world: &mpi::topology::SimpleCommunicator) -> Vec<String> {
    let ranks = world.size() as usize;
    let sgd = sgd_program::sgd();
    let sgd_args = |n: usize| -> Bindings {
        sgd_program::sgd::Args {
            N: n,
            g: TensorArg::PerRank(
                (0..ranks)
                    .map(|r| data::uniform_f32(10 + r as u64, n))
                    .collect(),
            ),
            w: TensorArg::Global(data::uniform_f32(5, n)),
            lr: 0.1,
        }
        .into()
    };
    let mut bad = Vec::new();
    for (n, chunks) in [(1001, ROUND_CHUNKS), (10001, 1)] {
        bad.extend(check(
            world,
            &candidates(sgd.program(), &[]),
            &sgd_args(n),
            chunks,
        ));
    }
    bad
}

fn main() {
    let universe = mpi::initialize().expect("MPI initialises");
    let world = universe.world();
    let args: Vec<String> = std::env::args().collect();
    // With `--messages`, jobs move every byte in MPI messages (no shared memory).
    let messages = args.iter().any(|a| a == "--messages");
    let flag = |f: &str| args.iter().any(|a| a == f);
    if flag("--panic") {
        return panic_in_run(&world, messages);
    }
    if flag("--stall") {
        return stall_over_messages(&world);
    }
    let hang = flag("--hang-between-runs");
    if hang || flag("--stall-between-runs") {
        return stop_between_runs(&world, hang, messages);
    }
    let stall = flag("--stall-in-step");
    if stall || flag("--vanish-in-step") {
        return stop_in_step(&world, stall, messages);
    }
    if flag("--candle") {
        return candle(&world);
    }
    if let Some(i) = args.iter().position(|a| a == "--bench") {
        bench(&world, number(&args, i, 1, 1 << 24), messages);
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--steps") {
        return steps(&world, &args, i, messages);
    }
    if let Some(i) = args.iter().position(|a| a == "--tune") {
        tune_optimizers(&world, number(&args, i, 1, 1 << 24));
        return;
    }
    let mut bad = training_loop(&world);
    bad.extend(tuning(&world));
    bad.extend(disagreement(&world));
    bad.extend(check_examples(&world));
    let rank = world.rank();
    if bad.is_empty() {
        println!("rank {rank}: MPI results equal the rank-thread results bitwise");
    } else {
        for b in &bad {
            eprintln!("rank {rank}: {b}");
        }
        world.abort(1);
    }
}
