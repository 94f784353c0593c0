//! Timing the contenders at full size: interleaved rounds where their jobs fit in
//! memory together (every contender sees the same load), one after the other otherwise;
//! the same number of runs for each, so their updated inputs can be compared.

use super::check;
use super::options::TuneOptions;
use super::tuning::Measurement;
use super::variant::Variant;
use coconet_core::{Bindings, Program, Schedule};
use coconet_plan::Plan;
use coconet_plan::backend::Backend;
use std::time::{Duration, Instant};

/// A (candidate schedule, knob variant) pair, by position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Contender {
    pub schedule: usize,
    pub variant: usize,
}

/// A prepared contender and its timed runs.
struct Timed<J> {
    who: Contender,
    job: J,
    times: Vec<Duration>,
}

/// Times every contender (`warmup` untimed runs, then `rounds` timed ones; interleaved
/// where the jobs of all of them, `footprints[schedule]` bytes per rank each, fit the
/// memory budget together) and keeps
/// those whose runs succeed and whose results then equal the first surviving
/// contender's (the program as written, when it is first) where `exact`, else the first
/// of the same schedule's; the others go to `rejected` with why.
#[allow(clippy::too_many_arguments)]
pub(crate) fn time_all<B: Backend>(
    program: &Program,
    candidates: &[Schedule],
    footprints: &[u64],
    variants: &[Variant<B>],
    contenders: Vec<Contender>,
    ranks: usize,
    bindings: &Bindings,
    options: &TuneOptions,
    exact: bool,
    rejected: &mut Vec<(String, String)>,
    notes: &mut Vec<String>,
) -> Vec<(Contender, Vec<Duration>)> {
    let name = |c: Contender| {
        format!(
            "{}, {}",
            candidates[c.schedule].name(),
            variants[c.variant].label
        )
    };
    let plans: Vec<Result<Plan, String>> = candidates
        .iter()
        .map(|s| Plan::lower(s, ranks, bindings.dims()).map_err(|e| e.to_string()))
        .collect();
    let prepare = |c: Contender, rejected: &mut Vec<(String, String)>| {
        let plan = match &plans[c.schedule] {
            Ok(plan) => plan,
            Err(why) => {
                rejected.push((name(c), why.clone()));
                return None;
            }
        };
        match variants[c.variant].backend.prepare(plan, bindings) {
            Ok(job) => Some(Timed {
                who: c,
                job,
                times: Vec::new(),
            }),
            Err(e) => {
                rejected.push((name(c), e.to_string()));
                None
            }
        }
    };
    let run = |t: &mut Timed<B::Job>, timed: bool| -> Result<(), String> {
        let start = Instant::now();
        variants[t.who.variant]
            .backend
            .run(&mut t.job)
            .map_err(|e| e.to_string())?;
        if timed {
            t.times.push(start.elapsed());
        }
        Ok(())
    };
    let bytes: u64 = contenders
        .iter()
        .map(|c| footprints[c.schedule].saturating_mul(ranks as u64))
        .fold(0, u64::saturating_add);
    let interleave = bytes <= options.memory_budget;

    let mut done: Vec<(Contender, Vec<Duration>, u64)> = Vec::new();
    let finish = |t: Timed<B::Job>, done: &mut Vec<_>| {
        let hash = check::state_hash(&t.job, program, ranks);
        done.push((t.who, t.times, hash));
    };
    if interleave {
        let mut jobs: Vec<Timed<B::Job>> = contenders
            .into_iter()
            .filter_map(|c| prepare(c, rejected))
            .collect();
        let mut runs = |jobs: &mut Vec<Timed<B::Job>>, i: usize, timed: bool| {
            if let Err(why) = run(&mut jobs[i], timed) {
                let t = jobs.remove(i);
                rejected.push((name(t.who), why));
                false
            } else {
                true
            }
        };
        for _ in 0..options.warmup {
            let mut i = 0;
            while i < jobs.len() {
                i += usize::from(runs(&mut jobs, i, false));
            }
        }
        for k in 0..options.rounds {
            // Rotate who goes first: no contender always runs right after another.
            let n = jobs.len();
            let order: Vec<Contender> = (0..n).map(|i| jobs[(i + k) % n].who).collect();
            for who in order {
                if let Some(i) = jobs.iter().position(|t| t.who == who) {
                    runs(&mut jobs, i, true);
                }
            }
        }
        for t in jobs {
            finish(t, &mut done);
        }
    } else {
        notes.push(format!(
            "the contenders' jobs need {:.1} GiB together, over the memory budget of {:.1} GiB: \
             timed one after the other, not interleaved",
            bytes as f64 / (1u64 << 30) as f64,
            options.memory_budget as f64 / (1u64 << 30) as f64
        ));
        'next: for c in contenders {
            let Some(mut t) = prepare(c, rejected) else {
                continue;
            };
            for i in 0..options.warmup + options.rounds {
                if let Err(why) = run(&mut t, i >= options.warmup) {
                    rejected.push((name(c), why));
                    continue 'next;
                }
            }
            finish(t, &mut done);
        }
    }

    // At full size, after the same runs, every contender's results are those of the
    // first contender: bitwise where no schedule may change them, else those of the
    // first contender of the same schedule (knobs never change results).
    let mut out = Vec::new();
    let mut firsts: Vec<(Contender, u64)> = Vec::new();
    for (c, times, hash) in done {
        let first = firsts
            .iter()
            .find(|(f, _)| exact || f.schedule == c.schedule)
            .copied();
        match first {
            Some((f, want)) if hash != want => rejected.push((
                name(c),
                format!(
                    "after {} runs at the full dims its results differ from those of {}",
                    options.warmup + options.rounds,
                    name(f)
                ),
            )),
            Some(_) => out.push((c, times)),
            None => {
                firsts.push((c, hash));
                out.push((c, times));
            }
        }
    }
    out
}

/// Median, min and max of `times` (schedule and variant left for the caller).
pub(crate) fn summary(times: &[Duration]) -> Measurement {
    let mut sorted = times.to_vec();
    sorted.sort();
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2
    };
    Measurement {
        schedule: String::new(),
        schedule_index: 0,
        variant: String::new(),
        variant_index: 0,
        median,
        min: sorted[0],
        max: sorted[n - 1],
        bytes_per_rank: 0,
    }
}
