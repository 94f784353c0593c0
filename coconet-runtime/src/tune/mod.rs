//! The autotuner: time every candidate schedule of a program under every setting of a
//! backend's knobs, on the user's own dims and rank count, and pick the fastest — never
//! one whose results differ from the program's.
//!
//! # Design
//! CoCoNet's paper picks schedules by running them; a guess (`AR-C` is slow, the fused
//! schedule is usually best, a chunk of 4096 elements) is wrong often enough on some
//! machine, size or rank count. [`tune`] is the measurement, done once: every
//! (schedule, knob variant) is first checked against the reference interpreter on a
//! small instance of the program (its symbolic dims shrunk, the user's scalars kept),
//! then prepared at full size and run in interleaved rounds (the machine is shared and
//! noisy: every contender sees the same load), and after the same number of runs every
//! contender's updated inputs must be bitwise those of the program as written (checked
//! through a hash: nothing the size of the model is kept). The choice is cached in a
//! file keyed by the program, the candidates, the dims, the rank count, the backend and
//! the machine, so the next run of the training script skips tuning.

mod cache;
mod check;
mod measure;
mod processes;

pub use cache::{default_cache_path, machine_fingerprint};
pub use processes::{ProcessKnobs, tune_processes};

use crate::RuntimeError;
use crate::backend::Backend;
use coconet_core::{Bindings, Program, Schedule};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// One setting of a backend's knobs: the backend configured with it, and a label
/// naming it in the table and the cache.
#[derive(Debug, Clone)]
pub struct Variant<B> {
    /// What it sets, e.g. `chunk 4096`.
    pub label: String,
    /// The backend configured with it.
    pub backend: B,
}

impl Variant<crate::cpu::Cpu> {
    /// The CPU backend with each kernel chunk length of `chunks` (elements; see
    /// [`RunOptions::chunk`](crate::cpu::RunOptions::chunk)).
    pub fn cpu_chunks(chunks: &[usize]) -> Vec<Variant<crate::cpu::Cpu>> {
        chunks
            .iter()
            .map(|&chunk| Variant {
                label: format!("chunk {chunk}"),
                backend: crate::cpu::Cpu {
                    options: crate::cpu::RunOptions {
                        chunk,
                        ..Default::default()
                    },
                },
            })
            .collect()
    }
}

impl<'a, B: crate::cuda::AccessChoice> Variant<crate::cuda::WithAccess<'a, B>> {
    /// A multi-rank CUDA backend with each peer access of `accesses` (mapped memory, or
    /// exchanges cut into chunks of some size): the knob that decides how far
    /// communication overlaps the kernels.
    /// [`access_choices`](crate::cuda::AccessChoice::access_choices) lists the settings
    /// worth timing on a backend.
    pub fn cuda_access(
        backend: &'a B,
        accesses: &[crate::cuda::PeerAccess],
    ) -> Vec<Variant<crate::cuda::WithAccess<'a, B>>> {
        accesses
            .iter()
            .map(|&access| Variant {
                label: crate::cuda::access_label(access),
                backend: crate::cuda::WithAccess { backend, access },
            })
            .collect()
    }
}

/// How to tune.
#[derive(Debug, Clone)]
pub struct TuneOptions {
    /// Untimed runs of every contender before the timed rounds (page faults, caches).
    pub warmup: usize,
    /// Timed rounds; each runs every contender once, in an order that rotates.
    pub rounds: usize,
    /// Where choices are cached (`None`: never read nor written). Default:
    /// [`default_cache_path`].
    pub cache: Option<PathBuf>,
    /// What identifies this machine in the cache (default: [`machine_fingerprint`]).
    pub machine: String,
    /// What identifies the backend in the cache, e.g. `cpu` (the variants' labels are
    /// part of the key too).
    pub backend: String,
    /// Bytes the contenders' jobs may hold at once to be timed in interleaved rounds;
    /// past it they are timed one after the other (noted in [`Tuning::notes`]).
    /// Default: half the memory available when the options are made.
    pub memory_budget: u64,
}

impl Default for TuneOptions {
    fn default() -> TuneOptions {
        TuneOptions {
            warmup: 2,
            rounds: 7,
            cache: default_cache_path(),
            machine: machine_fingerprint(),
            backend: "cpu".into(),
            memory_budget: cache::available_memory() / 2,
        }
    }
}

/// The times of one contender.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// The schedule's name.
    pub schedule: String,
    /// Its position among the candidates given to [`tune`].
    pub schedule_index: usize,
    /// The knob variant's label.
    pub variant: String,
    /// Its position among the variants given to [`tune`].
    pub variant_index: usize,
    /// Median of the timed rounds.
    pub median: Duration,
    /// Fastest round.
    pub min: Duration,
    /// Slowest round.
    pub max: Duration,
    /// Memory per rank of the schedule ([`Schedule::footprint`], the busiest rank).
    pub bytes_per_rank: u64,
}

/// What [`tune`] found.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// The fastest contender whose results equal the program's.
    pub best: Measurement,
    /// Every contender that was timed, fastest first.
    pub table: Vec<Measurement>,
    /// Contenders left out, and why (e.g. their results differ from the program's).
    pub rejected: Vec<(String, String)>,
    /// Whether the choice came from the cache (then nothing was run, and `table` is
    /// the table measured when it was made).
    pub from_cache: bool,
    /// What the caller should know: a cache that could not be read or written, timing
    /// one contender after another for lack of memory.
    pub notes: Vec<String>,
}

impl Tuning {
    /// The chosen schedule among `candidates` (those given to [`tune`]).
    pub fn schedule<'a>(&self, candidates: &'a [Schedule]) -> Option<&'a Schedule> {
        candidates
            .get(self.best.schedule_index)
            .filter(|s| s.name() == self.best.schedule)
    }

    /// The chosen variant among `variants` (those given to [`tune`]).
    pub fn variant<'a, B>(&self, variants: &'a [Variant<B>]) -> Option<&'a Variant<B>> {
        variants
            .get(self.best.variant_index)
            .filter(|v| v.label == self.best.variant)
    }
}

impl fmt::Display for Tuning {
    /// The table: schedule × variant → median (min–max), memory per rank, the choice
    /// marked; then the rejected contenders and the notes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let width = self
            .table
            .iter()
            .map(|m| m.schedule.len() + m.variant.len() + 2)
            .max()
            .unwrap_or(0)
            .max(9);
        writeln!(
            f,
            "  {:<width$}  {:>10}  {:>19}  {:>9}  {:>7}",
            "schedule", "median ms", "min–max ms", "MiB/rank", "÷ best"
        )?;
        for m in &self.table {
            let name = format!("{}, {}", m.schedule, m.variant);
            let mark = if *m == self.best { "*" } else { " " };
            writeln!(
                f,
                "{mark} {name:<width$}  {:>10.3}  {:>8.3} – {:<8.3}  {:>9.1}  {:>7.2}",
                ms(m.median),
                ms(m.min),
                ms(m.max),
                m.bytes_per_rank as f64 / (1u64 << 20) as f64,
                ms(m.median) / ms(self.best.median),
            )?;
        }
        for (who, why) in &self.rejected {
            writeln!(f, "  rejected {who}: {why}")?;
        }
        if self.from_cache {
            writeln!(f, "  (from the cache: nothing was run)")?;
        }
        for n in &self.notes {
            writeln!(f, "  note: {n}")?;
        }
        Ok(())
    }
}

/// Times every candidate schedule of `program` under every knob variant, on `ranks`
/// ranks with `bindings`, and returns the fastest whose results equal the program's
/// (and the table), or the cached choice for the same program, candidates, variants,
/// dims, rank count, backend and machine.
///
/// Each contender is checked on the reference interpreter at small dims before it is
/// timed, and its updated inputs after the timed runs must be bitwise the program as
/// written's (within 2e-3 on the small check where a matmul sums in another order; the
/// full-size comparison is then skipped). The first candidate should be the program as
/// written (as [`candidates`](coconet_core::schedule::candidates) returns it).
///
/// ```
/// use coconet_core::schedule::candidates;
/// use coconet_core::*;
/// use coconet_runtime::tune::{TuneOptions, Variant, tune};
/// let mut b = ProgramBuilder::new("sgd");
/// let n = Shape::new(vec![Dim::sym("N")]);
/// let g = b.tensor_input("g", DType::F32, Layout::Local, n.clone(), 0).unwrap();
/// let w = b.tensor_input("w", DType::F32, Layout::Replicated, n, 0).unwrap();
/// let lr = b.scalar_input("lr", DType::F32).unwrap();
/// let g1 = b.all_reduce(ReduceOp::Sum, g).unwrap();
/// let step = b.binary(BinaryOp::Mul, lr, g1).unwrap();
/// let w2 = b.binary(BinaryOp::Sub, w, step).unwrap();
/// b.update(w, w2).unwrap();
/// let p = b.finish();
/// let args = Bindings::new()
///     .dim("N", 1000)
///     .scalar("lr", 0.1f32)
///     .tensor("g", Binding::per_rank(&[vec![1.0f32; 1000], vec![2.0; 1000]]))
///     .tensor("w", Binding::global(&[0.0f32; 1000]));
/// let schedules = candidates(&p, &[]);
/// let variants = Variant::cpu_chunks(&[1024, 4096]);
/// let options = TuneOptions { cache: None, rounds: 3, ..TuneOptions::default() };
/// let tuning = tune(&p, &schedules, &variants, 2, &args, &options).unwrap();
/// assert_eq!(tuning.table.len(), schedules.len() * variants.len());
/// println!("{tuning}");
/// let fastest = tuning.schedule(&schedules).unwrap();
/// # let _ = fastest;
/// ```
pub fn tune<B: Backend>(
    program: &Program,
    candidates: &[Schedule],
    variants: &[Variant<B>],
    ranks: usize,
    bindings: &Bindings,
    options: &TuneOptions,
) -> Result<Tuning, RuntimeError> {
    if candidates.is_empty() || variants.is_empty() {
        return Err(RuntimeError::Plan(
            "tune: no candidate schedules or no knob variants to time".into(),
        ));
    }
    if options.rounds == 0 {
        return Err(RuntimeError::Plan("tune: rounds must be at least 1".into()));
    }
    let key = cache::Key::new(program, candidates, variants, ranks, bindings, options);
    let mut notes = Vec::new();
    if let Some(path) = &options.cache {
        match cache::lookup(path, &key) {
            Ok(Some(mut tuning)) => {
                if tuning.schedule(candidates).is_some() && tuning.variant(variants).is_some() {
                    tuning.from_cache = true;
                    return Ok(tuning);
                }
            }
            Ok(None) => {}
            Err(why) => notes.push(why),
        }
    }

    // Every contender checked on the interpreter at small dims first.
    let mut rejected = Vec::new();
    let mut contenders = Vec::new();
    let reference = check::Reference::new(program, ranks, bindings)?;
    for (si, s) in candidates.iter().enumerate() {
        for (vi, v) in variants.iter().enumerate() {
            match reference.check(s, &v.backend) {
                Ok(()) => contenders.push(measure::Contender {
                    schedule: si,
                    variant: vi,
                }),
                Err(why) => rejected.push((format!("{}, {}", s.name(), v.label), why)),
            }
        }
    }
    // Memory per rank of each schedule (the busiest rank).
    let footprints: Vec<u64> = candidates
        .iter()
        .map(|s| s.footprint(bindings.dims(), ranks).map_or(0, |f| f.total()))
        .collect();
    let measured = measure::time_all(
        program,
        candidates,
        &footprints,
        variants,
        contenders,
        ranks,
        bindings,
        options,
        reference.exact(),
        &mut rejected,
        &mut notes,
    );
    let mut table: Vec<Measurement> = measured
        .into_iter()
        .map(|(c, times)| {
            let s = &candidates[c.schedule];
            let v = &variants[c.variant];
            let mut m = measure::summary(&times);
            m.schedule = s.name().to_string();
            m.schedule_index = c.schedule;
            m.variant = v.label.clone();
            m.variant_index = c.variant;
            m.bytes_per_rank = footprints[c.schedule];
            m
        })
        .collect();
    table.sort_by_key(|m| m.median);
    let Some(best) = table.first().cloned() else {
        let why: Vec<String> = rejected.iter().map(|(w, y)| format!("{w}: {y}")).collect();
        return Err(RuntimeError::Plan(format!(
            "tune: no candidate schedule gives the program's results: {}",
            why.join("; ")
        )));
    };
    let tuning = Tuning {
        best,
        table,
        rejected,
        from_cache: false,
        notes,
    };
    if let Some(path) = &options.cache
        && let Err(why) = cache::store(path, &key, &tuning)
    {
        let mut tuning = tuning;
        tuning.notes.push(why);
        return Ok(tuning);
    }
    Ok(tuning)
}
