//! # coconet-tune: the autotuner and the cost model
//!
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
//!
//! Beside it, [`model`]: the cost model, which predicts from the plan alone what the
//! tuner measures.

mod cache;
mod check;
mod machine;
mod measure;
pub mod model;
mod options;
mod processes;
mod tuning;
mod variant;

pub use machine::{default_cache_path, machine_fingerprint};
pub use options::TuneOptions;
pub use processes::{ProcessKnobs, tune_processes};
pub use tuning::{Measurement, Tuning};
pub use variant::Variant;

use coconet_core::{Bindings, Program, Schedule};
use coconet_plan::RuntimeError;
use coconet_plan::backend::Backend;

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
/// use coconet_tune::{TuneOptions, Variant, tune};
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
