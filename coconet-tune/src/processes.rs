//! Tuning a multi-process job: every process times the same contenders in the same
//! order, the processes pool their times (a step lasts as long as its slowest process)
//! and their result checks, so all of them reach the same choice — a choice made per
//! process would leave processes running different round sizes, and hang.

use super::options::TuneOptions;
use super::tuning::{Measurement, Tuning};
use super::{cache, check, measure};
use coconet_core::{Bindings, Program, Schedule, ValueId};
use coconet_cpu::for_tuning::{all_gather_f64, all_gather_u64};
use coconet_cpu::{CHUNK, Cpu, ProcessJob, Transport};
use coconet_plan::host::memory::Buffer;
use coconet_plan::{JobData, RuntimeError};
use std::time::{Duration, Instant};

/// One setting of a process job's knobs. Results never depend on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessKnobs {
    /// Kernel chunks per pipelined round of a fused all-reduce
    /// ([`ProcessJob::set_round_chunks`]).
    pub round_chunks: usize,
    /// Elements per kernel chunk ([`ProcessJob::set_chunk`]).
    pub chunk: usize,
}

impl ProcessKnobs {
    /// Every pair of `round_chunks` and `chunks`, rounds first.
    pub fn grid(round_chunks: &[usize], chunks: &[usize]) -> Vec<ProcessKnobs> {
        round_chunks
            .iter()
            .flat_map(|&r| {
                chunks.iter().map(move |&c| ProcessKnobs {
                    round_chunks: r.max(1),
                    chunk: c.max(1),
                })
            })
            .collect()
    }

    /// Round sizes of `round_chunks` kernel chunks each, with the default chunk.
    pub fn rounds(round_chunks: &[usize]) -> Vec<ProcessKnobs> {
        ProcessKnobs::grid(round_chunks, &[CHUNK])
    }

    /// What the table and the cache call it.
    pub fn label(&self) -> String {
        format!(
            "rounds of {} chunks, chunk {}",
            self.round_chunks, self.chunk
        )
    }

    fn apply<L: Transport>(&self, job: &mut ProcessJob<L>) {
        job.set_round_chunks(self.round_chunks);
        job.set_chunk(self.chunk);
    }
}

/// Times every prepared job (one per candidate schedule of one program, all bound to
/// the same inputs) under every knob setting, on every process of the job at once, and
/// sets each job to its fastest setting; every process must call it with the same jobs
/// and knobs, and every process returns the same table and choice (a [`Tuning`] whose
/// `schedule_index` is the position in `jobs`, `variant_index` in `knobs`; its notes and
/// the reasons for rejections are this process's own). `options.memory_budget` does not
/// apply: the jobs are already prepared.
///
/// Every job's schedule is first checked on the reference interpreter at small dims
/// with the job's scalars (on rank threads in each process: the process executor
/// follows them bit for bit); one that differs is rejected, on every process, and never
/// run. The processes then run each contender `warmup` times and in `rounds`
/// interleaved rounds; a contender's time per round is its slowest process's. Every
/// run starts from the state the jobs had when `tune_processes` was called (this rank's
/// updated inputs are copied once per job and put back before each run, outside the
/// timing, and at the end), so tuning leaves the user's model as it was; the copies
/// double the memory of the updated inputs while it runs. Knobs never change results:
/// after its last run each contender's updated inputs must be bitwise those of its
/// job's first contender, or it is rejected (on every process).
///
/// Rank 0 reads and writes the cache (`options.cache`, keyed by the program, the jobs'
/// schedules, the knobs, the dims, the rank count, `options.backend` and the transport,
/// and `options.machine` — with every process's where they differ) and sends what it
/// found to the others, so processes on machines that do not share the file still agree.
/// The processes first check that they were called alike (the same jobs, knobs, warm-up
/// and rounds) and could save their state; otherwise all fail. A failed run fails the
/// tuning on every process with the job's error: the job that failed is unusable, as
/// after any failed run, and the others are put back at the state and knobs of the
/// call. A contender that fails is not skipped (the other contenders' exchanges would
/// share its failed connection), so tune what can run. No job keeps the round buffers
/// of the knobs it tried.
pub fn tune_processes<L: Transport>(
    jobs: &mut [ProcessJob<L>],
    knobs: &[ProcessKnobs],
    options: &TuneOptions,
) -> Result<Tuning, RuntimeError> {
    if jobs.is_empty() {
        return Err(RuntimeError::Plan("tune: no jobs to time".into()));
    }
    // What this process was asked, checked here, then compared across the processes
    // before anything else is exchanged: a process that cannot tune, or was called
    // otherwise, fails the tuning on all of them instead of leaving them waiting.
    let mine = check_alike(jobs, knobs, options);
    let ask = mine.as_ref().map_or(0, |&h| h);
    let machine = {
        let mut h = cache::Fnv::new();
        h.write(options.machine.as_bytes());
        h.finish()
    };
    let all = all_gather_u64(
        exchange::<L>(&jobs[0]),
        &[u64::from(mine.is_ok()), ask, machine],
    )?;
    mine?;
    if let Some(r) = all.chunks(3).position(|a| a[0] == 0) {
        return Err(RuntimeError::RankFailed {
            rank: r,
            message: format!(
                "tune: rank {r}'s process could not start tuning (its error is there)"
            ),
        });
    }
    if let Some(r) = all.chunks(3).position(|a| a[1] != ask) {
        return Err(RuntimeError::Plan(format!(
            "tune: rank {r}'s process was given other jobs, knobs, warm-up or rounds than \
             this one: every process must tune alike"
        )));
    }
    let plan = jobs[0].plan();
    let (rank, ranks) = (jobs[0].rank(), plan.ranks());
    let original = plan.schedule().original().clone();
    // The cache entry names the transport, and every process's machine where they
    // differ: a choice made over loopback TCP is not one for MPI across machines.
    let mut keyed = options.clone();
    keyed.backend = format!("{} over {}", options.backend, std::any::type_name::<L>());
    if all.chunks(3).any(|a| a[2] != machine) {
        let mut h = cache::Fnv::new();
        all.chunks(3).for_each(|a| h.write(&a[2].to_le_bytes()));
        keyed.machine = format!("{} and others ({:016x})", options.machine, h.finish());
    }
    let schedules: Vec<&Schedule> = jobs.iter().map(|j| j.plan().schedule()).collect();
    let labels: Vec<String> = knobs.iter().map(ProcessKnobs::label).collect();
    let label_refs: Vec<&str> = labels.iter().map(String::as_str).collect();
    let key = cache::Key::of(
        &original,
        &schedules,
        &label_refs,
        ranks,
        plan.dims(),
        &keyed,
    );
    let names: Vec<String> = schedules.iter().map(|s| s.name().to_string()).collect();
    let bytes: Vec<u64> = jobs
        .iter()
        .map(|j| {
            let p = j.plan();
            p.schedule()
                .footprint(p.dims(), ranks)
                .map_or(0, |f| f.total())
        })
        .collect();

    // The cache, as rank 0 sees it.
    let mut notes = Vec::new();
    let cached = match (&options.cache, rank) {
        (Some(path), 0) => match cache::lookup(path, &key) {
            Ok(t) => t.filter(|t| {
                let fits = |m: &Measurement| {
                    names.get(m.schedule_index) == Some(&m.schedule)
                        && labels.get(m.variant_index) == Some(&m.variant)
                };
                fits(&t.best) && t.table.iter().all(fits)
            }),
            Err(why) => {
                notes.push(why);
                None
            }
        },
        _ => None,
    };
    let sent = cached
        .as_ref()
        .map(|t| encode(&t.table))
        .unwrap_or_default();
    let from_zero = all_gather_f64(exchange::<L>(&jobs[0]), &sent)?.swap_remove(0);
    if !from_zero.is_empty() {
        let table = decode(&from_zero, &names, &labels, &bytes)?;
        apply_fastest(jobs, knobs, &table);
        return Ok(Tuning {
            best: table[0].clone(),
            table,
            rejected: Vec::new(),
            from_cache: true,
            notes,
        });
    }
    let before: Vec<ProcessKnobs> = jobs
        .iter()
        .map(|j| ProcessKnobs {
            round_chunks: j.round_chunks(),
            chunk: j.chunk(),
        })
        .collect();
    let tuned = measure_all(jobs, knobs, options, (&original, &names, &labels, &bytes));
    // Whatever happened, every job is back at the state of the call, and no job keeps
    // the round buffers of knobs it will not run.
    for job in jobs.iter_mut() {
        job.clear_scratch();
    }
    let (mut tuning, saved) = match tuned {
        Ok(t) => t,
        Err((e, mut saved)) => {
            for ((job, saved), knobs) in jobs.iter_mut().zip(&mut saved).zip(&before) {
                job.restore(saved);
                knobs.apply(job);
            }
            return Err(e);
        }
    };
    drop(saved);
    tuning.notes.extend(notes);
    if jobs.iter().any(ProcessJob::shares_memory) {
        tuning.notes.push(
            "the jobs share memory: their round sizes do not apply (knobs that differ only \
             in rounds run alike)"
                .into(),
        );
    }
    if let (Some(path), 0) = (&options.cache, rank)
        && let Err(why) = cache::store(path, &key, &tuning)
    {
        tuning.notes.push(why);
    }
    Ok(tuning)
}

/// What the tuner's own exchanges are called in a transport's errors (a peer that
/// never arrives is named at this step, not at the last run's).
const TUNING: &str = "the tuner's exchange between the processes";

/// Job 0's connection, with the step named for the tuner's next exchange.
fn exchange<L: Transport>(job: &ProcessJob<L>) -> &L {
    let link = job.link();
    link.known(&[TUNING.to_string()]);
    link.enter(TUNING);
    link
}

/// A hash of what this process was asked to tune (jobs, knobs, warm-up and rounds), or
/// why it cannot be tuned.
fn check_alike<L: Transport>(
    jobs: &[ProcessJob<L>],
    knobs: &[ProcessKnobs],
    options: &TuneOptions,
) -> Result<u64, RuntimeError> {
    if knobs.is_empty() {
        return Err(RuntimeError::Plan("tune: no knob settings to time".into()));
    }
    if options.rounds == 0 {
        return Err(RuntimeError::Plan("tune: rounds must be at least 1".into()));
    }
    let plan = jobs[0].plan();
    let mut h = cache::Fnv::new();
    for (i, job) in jobs.iter().enumerate() {
        let other = job.plan();
        if other.ranks() != plan.ranks()
            || job.rank() != jobs[0].rank()
            || other.dims() != plan.dims()
            || other.schedule().original().to_string() != plan.schedule().original().to_string()
        {
            return Err(RuntimeError::Plan(format!(
                "tune: job {i} ({}) is not the same program, dims, rank count and rank as \
                 job 0 ({})",
                other.schedule().name(),
                plan.schedule().name()
            )));
        }
        h.write(other.schedule().to_string().as_bytes());
        h.write(&[0]);
    }
    for k in knobs {
        h.write(k.label().as_bytes());
        h.write(&[0]);
    }
    h.write(&(options.warmup as u64).to_le_bytes());
    h.write(&(options.rounds as u64).to_le_bytes());
    Ok(h.finish())
}

/// The saved state of every job (this rank's updated inputs), by job.
type Saved = Vec<Vec<(ValueId, Buffer)>>;

/// Checks, times and compares every contender (see [`tune_processes`]); the jobs'
/// saved state comes back either way, for the caller to put back on failure.
#[allow(clippy::type_complexity)]
fn measure_all<L: Transport>(
    jobs: &mut [ProcessJob<L>],
    knobs: &[ProcessKnobs],
    options: &TuneOptions,
    (original, names, labels, bytes): (&Program, &[String], &[String], &[u64]),
) -> Result<(Tuning, Saved), (RuntimeError, Saved)> {
    let (mut saved, checked, mut rejected) = check_all(jobs, original, names)?;
    // Every contender timed from the same saved state.
    let contenders: Vec<(usize, usize)> = checked
        .iter()
        .flat_map(|&j| (0..knobs.len()).map(move |k| (j, k)))
        .collect();
    let name = |(j, k): (usize, usize)| format!("{}, {}", names[j], labels[k]);
    let timed = time_all(
        jobs,
        knobs,
        options,
        &contenders,
        &mut saved,
        original,
        &name,
    );
    let (times, hashes) = match timed {
        Ok(t) => t,
        Err(e) => return Err((e, saved)),
    };
    let all = match pool_results(jobs, &contenders, times, &hashes) {
        Ok(all) => all,
        Err(e) => return Err((e, saved)),
    };
    let n_times = contenders.len() * options.rounds;
    let mut table = Vec::new();
    for (c, &(j, k)) in contenders.iter().enumerate() {
        if all.iter().any(|p| p[n_times + c] != 0.0) {
            let against = name((j, 0));
            rejected.push((
                name((j, k)),
                format!("after a run at the full dims its results differ from those of {against}"),
            ));
            continue;
        }
        // A round lasts as long as its slowest process.
        let slowest: Vec<Duration> = (0..options.rounds)
            .map(|r| {
                let t = all
                    .iter()
                    .map(|p| p[c * options.rounds + r])
                    .fold(0.0, f64::max);
                Duration::from_secs_f64(t)
            })
            .collect();
        let mut m = measure::summary(&slowest);
        m.schedule = names[j].clone();
        m.schedule_index = j;
        m.variant = labels[k].clone();
        m.variant_index = k;
        m.bytes_per_rank = bytes[j];
        table.push(m);
    }
    table.sort_by_key(|m| (m.median, m.schedule_index, m.variant_index));
    let Some(best) = table.first().cloned() else {
        let why: Vec<String> = rejected.iter().map(|(w, y)| format!("{w}: {y}")).collect();
        let e = RuntimeError::Plan(format!(
            "tune: no contender gives the program's results: {}",
            why.join("; ")
        ));
        return Err((e, saved));
    };
    apply_fastest(jobs, knobs, &table);
    let tuning = Tuning {
        best,
        table,
        rejected,
        from_cache: false,
        notes: Vec::new(),
    };
    Ok((tuning, saved))
}

/// Contenders left out, and why.
type Rejected = Vec<(String, String)>;

/// This rank's updated inputs, saved before anything runs; then every schedule checked
/// on the reference interpreter at small dims, with this job's scalars, on rank threads
/// here (the process executor follows rank threads bit for bit). A schedule rejected on
/// any process is rejected on all, before any run; a process that could not save or
/// check fails the tuning on all. Returns the saved state, the jobs whose schedules
/// pass, and the rejected ones.
#[allow(clippy::type_complexity)]
fn check_all<L: Transport>(
    jobs: &mut [ProcessJob<L>],
    original: &Program,
    names: &[String],
) -> Result<(Saved, Vec<usize>, Rejected), (RuntimeError, Saved)> {
    let ranks = jobs[0].plan().ranks();
    let mut saved: Saved = Vec::new();
    let mut setup = Ok(());
    for job in jobs.iter_mut() {
        match job.save_updated() {
            Ok(s) => saved.push(s),
            Err(e) => {
                setup = Err(e);
                break;
            }
        }
    }
    let reference =
        setup.and_then(|()| check::Reference::new(original, ranks, &small_bindings(&jobs[0])));
    let verdicts: Vec<Result<(), String>> = match &reference {
        Ok(reference) => jobs
            .iter()
            .map(|j| reference.check(j.plan().schedule(), &Cpu::default()))
            .collect(),
        Err(_) => Vec::new(),
    };
    let mut flags: Vec<f64> = vec![f64::from(u8::from(reference.is_err()))];
    flags.extend((0..jobs.len()).map(|j| {
        let failed = verdicts.get(j).is_none_or(Result::is_err);
        f64::from(u8::from(failed))
    }));
    let pooled = match all_gather_f64(exchange::<L>(&jobs[0]), &flags) {
        Ok(p) => p,
        Err(e) => return Err((e, saved)),
    };
    if let Err(e) = reference {
        return Err((e, saved));
    }
    if let Some(r) = pooled.iter().position(|p| p[0] != 0.0) {
        let message =
            format!("tune: rank {r}'s process could not save its state or check the schedules");
        return Err((RuntimeError::RankFailed { rank: r, message }, saved));
    }
    let mut rejected = Vec::new();
    let mut checked = Vec::new();
    for (j, verdict) in verdicts.into_iter().enumerate() {
        match (verdict, pooled.iter().position(|p| p[1 + j] != 0.0)) {
            (_, None) => checked.push(j),
            (Err(why), _) => rejected.push((names[j].clone(), why)),
            (Ok(()), Some(r)) => rejected.push((
                names[j].clone(),
                format!("its results differ from the interpreter's on rank {r}'s process"),
            )),
        }
    }
    Ok((saved, checked, rejected))
}

/// Runs every contender (job, knobs) `options.warmup + options.rounds` times, each run
/// from its job's saved state, rotating who goes first (no contender always runs right
/// after another). Returns each contender's timed seconds and a hash of this rank's
/// results after its last run; the jobs are back at their saved state.
fn time_all<L: Transport>(
    jobs: &mut [ProcessJob<L>],
    knobs: &[ProcessKnobs],
    options: &TuneOptions,
    contenders: &[(usize, usize)],
    saved: &mut Saved,
    original: &Program,
    name: &dyn Fn((usize, usize)) -> String,
) -> Result<(Vec<Vec<f64>>, Vec<u64>), RuntimeError> {
    let mut times: Vec<Vec<f64>> = (0..contenders.len())
        .map(|_| Vec::with_capacity(options.rounds))
        .collect();
    let mut hashes = vec![0u64; contenders.len()];
    for round in 0..options.warmup + options.rounds {
        let timed = round >= options.warmup;
        for i in 0..contenders.len() {
            let c = (i + round) % contenders.len();
            let (j, k) = contenders[c];
            let job = &mut jobs[j];
            knobs[k].apply(job);
            job.restore(&mut saved[j]);
            let start = Instant::now();
            if let Err(e) = job.run() {
                return Err(RuntimeError::Plan(format!("tune: {}: {e}", name((j, k)))));
            }
            if timed {
                times[c].push(start.elapsed().as_secs_f64());
            }
            if round + 1 == options.warmup + options.rounds {
                hashes[c] = local_hash(&*job, original);
            }
        }
    }
    for (job, saved) in jobs.iter_mut().zip(saved) {
        job.restore(saved);
    }
    Ok((times, hashes))
}

/// Every process's `times` (contender by contender, round by round) followed by, per
/// contender, whether its results differ from those of its job's first contender: at
/// full size the knobs never change them, so every contender's updated inputs on this
/// rank must be bitwise those of its job's first; a difference on any process rejects
/// the contender on all.
fn pool_results<L: Transport>(
    jobs: &[ProcessJob<L>],
    contenders: &[(usize, usize)],
    times: Vec<Vec<f64>>,
    hashes: &[u64],
) -> Result<Vec<Vec<f64>>, RuntimeError> {
    let differs: Vec<bool> = contenders
        .iter()
        .enumerate()
        .map(|(c, &(j, _))| {
            let first = contenders.iter().position(|&(f, _)| f == j).unwrap_or(c);
            hashes[c] != hashes[first]
        })
        .collect();
    let mut mine: Vec<f64> = times.concat();
    mine.extend(differs.iter().map(|&d| f64::from(u8::from(d))));
    all_gather_f64(exchange::<L>(&jobs[0]), &mine)
}

/// Bindings with the job's dims and scalars (the interpreter check makes its tensors).
fn small_bindings<L: Transport>(job: &ProcessJob<L>) -> Bindings {
    let plan = job.plan();
    let p = plan.program();
    let mut b = Bindings::new();
    for (name, &size) in plan.dims() {
        b = b.dim(name, size);
    }
    for (&id, &value) in job.scalar_values() {
        b = b.scalar_as(&p.label(id), p.node(id).ty.dtype, value);
    }
    b
}

/// A hash of this rank's data of every input `original` updates (NaNs alike).
fn local_hash<L: Transport>(job: &ProcessJob<L>, original: &Program) -> u64 {
    let mut h = cache::Fnv::new();
    for (t, _) in original.updates() {
        match job.final_input_local::<f64>(&original.label(t), job.rank()) {
            Ok(values) => {
                h.write(&[1]);
                for x in values {
                    let x = if x.is_nan() { f64::NAN } else { x };
                    h.write(&x.to_bits().to_le_bytes());
                }
            }
            Err(_) => h.write(&[0]),
        }
    }
    h.finish()
}

/// Sets each job to its fastest knobs in `table` (sorted fastest first).
fn apply_fastest<L: Transport>(
    jobs: &mut [ProcessJob<L>],
    knobs: &[ProcessKnobs],
    table: &[Measurement],
) {
    for (j, job) in jobs.iter_mut().enumerate() {
        if let Some(m) = table.iter().find(|m| m.schedule_index == j) {
            knobs[m.variant_index].apply(job);
        }
    }
}

/// A table as f64s to send (indices and nanoseconds stay exact below 2^53).
fn encode(table: &[Measurement]) -> Vec<f64> {
    table
        .iter()
        .flat_map(|m| {
            [
                m.schedule_index as f64,
                m.variant_index as f64,
                m.median.as_nanos() as f64,
                m.min.as_nanos() as f64,
                m.max.as_nanos() as f64,
            ]
        })
        .collect()
}

/// The table [`encode`] sent, named after this process's jobs and knobs (rank 0 checked
/// that every index names the same schedule and knobs there); an error where an index
/// is past this process's jobs or knobs (the processes were not called alike).
fn decode(
    data: &[f64],
    names: &[String],
    labels: &[String],
    bytes: &[u64],
) -> Result<Vec<Measurement>, RuntimeError> {
    data.chunks_exact(5)
        .map(|row| {
            let (j, k) = (row[0] as usize, row[1] as usize);
            if j >= names.len() || k >= labels.len() {
                return Err(RuntimeError::Plan(format!(
                    "tune: rank 0's cached choice names job {j} and knobs {k}, but this \
                     process has {} jobs and {} knob settings: every process must tune \
                     the same jobs and knobs",
                    names.len(),
                    labels.len()
                )));
            }
            let ns = |x: f64| Duration::from_nanos(x as u64);
            Ok(Measurement {
                schedule: names[j].clone(),
                schedule_index: j,
                variant: labels[k].clone(),
                variant_index: k,
                median: ns(row[2]),
                min: ns(row[3]),
                max: ns(row[4]),
                bytes_per_rank: bytes[j],
            })
        })
        .collect()
}
