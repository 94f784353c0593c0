//! Schedules: a program plus the transformations applied to it.
//!
//! A [`Schedule`] starts as a copy of a [`Program`]. *Rewriting* transformations —
//! [`Schedule::split`], [`Schedule::reorder`], [`Schedule::as_slice`],
//! [`Schedule::eliminate_dead_code`] — produce a new program that the checker re-checks;
//! *annotating* transformations — [`Schedule::fuse`] and [`Schedule::overlap`] — mark how
//! the final program is executed (one kernel; producer and consumer concurrently at chunk
//! granularity) without changing its values. Every transformation checks its
//! preconditions and says which one failed.
//!
//! All of them preserve semantics: the reference interpreter gives the same outputs and
//! updated inputs for the schedule's program as for the original (bitwise, except that
//! `reorder` turns a norm of a sliced tensor into per-rank partial sums plus an
//! all-reduce, which reassociates the sum: within a few ulps of the dtype).
//!
//! Values keep their [`ValueId`] through rewrites, so the typed handles of a `#[coconet]`
//! program (`p.g1`) address the same values in every schedule derived from it.

mod as_slice;
mod dce;
mod footprint;
mod fuse;
mod print;
mod recipes;
mod reorder;
mod rewrite;
mod split;
mod steps;

pub use footprint::Footprint;
pub use fuse::{Fusion, FusionKind, Overlap};
pub use recipes::{candidates, candidates_explained, sharded_update};
pub use reorder::Reordered;
pub use steps::Step;

use crate::{CheckError, Program, ValueId};
use thiserror::Error;

/// A transformation whose preconditions do not hold.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{transformation}: {message}")]
pub struct ScheduleError {
    /// The transformation (`split`, `reorder`, ...).
    pub transformation: &'static str,
    /// Which precondition failed, and why.
    pub message: String,
}

impl ScheduleError {
    pub(crate) fn new(transformation: &'static str, message: impl Into<String>) -> ScheduleError {
        ScheduleError {
            transformation,
            message: message.into(),
        }
    }

    pub(crate) fn check(transformation: &'static str, e: CheckError) -> ScheduleError {
        ScheduleError::new(
            transformation,
            format!("the rewritten program does not check: {}", e.message),
        )
    }
}

/// A program and the transformations applied to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    name: String,
    original: Program,
    program: Program,
    fusions: Vec<Fusion>,
    overlaps: Vec<Overlap>,
    steps: Vec<String>,
}

impl Schedule {
    /// The unscheduled program (every stage its own kernel, in program order).
    pub fn new(program: &Program) -> Schedule {
        Schedule {
            name: "as written".to_string(),
            original: program.clone(),
            program: program.clone(),
            fusions: Vec::new(),
            overlaps: Vec::new(),
            steps: Vec::new(),
        }
    }

    /// Names the schedule (e.g. `RS-C-AG`), for printing and tables.
    pub fn named(mut self, name: impl Into<String>) -> Schedule {
        self.name = name.into();
        self
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The transformed program (what backends execute; run it on the reference
    /// interpreter to check the schedule).
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The program the schedule started from.
    pub fn original(&self) -> &Program {
        &self.original
    }

    /// Fusion groups, in the order they were made.
    pub fn fusions(&self) -> &[Fusion] {
        &self.fusions
    }

    /// Overlapped producer/consumer pairs.
    pub fn overlaps(&self) -> &[Overlap] {
        &self.overlaps
    }

    /// The transformations applied so far, as text.
    pub fn steps(&self) -> &[String] {
        &self.steps
    }

    /// The fusion group containing `v`, if any.
    pub fn fusion_of(&self, v: ValueId) -> Option<usize> {
        self.fusions.iter().position(|f| f.members.contains(&v))
    }

    /// Rewrites must come before annotations, which refer to the final program.
    fn before_annotations(&self, t: &'static str) -> Result<(), ScheduleError> {
        if self.fusions.is_empty() && self.overlaps.is_empty() {
            Ok(())
        } else {
            Err(ScheduleError::new(
                t,
                "the schedule already has fusion or overlap annotations; apply split, reorder, \
                 as_slice and dead-code elimination first, then fuse and overlap",
            ))
        }
    }

    fn stage(&self, t: &'static str, v: impl Into<ValueId>) -> Result<ValueId, ScheduleError> {
        let v = v.into();
        if self.program.contains(v) {
            Ok(v)
        } else {
            Err(ScheduleError::new(
                t,
                format!(
                    "{v} is not a value of the current program (was it removed by an earlier \
                     transformation?)"
                ),
            ))
        }
    }

    fn label(&self, v: ValueId) -> String {
        format!("`{}`", self.program.label(v))
    }

    fn replace(&mut self, program: Program, step: String) {
        self.program = program;
        self.steps.push(step);
    }
}

/// "a reduce" / "an all_reduce": an op name with its article, for messages.
pub(crate) fn article(op: &str) -> String {
    let an = op.starts_with(['a', 'e', 'i', 'o', 'u']);
    format!("{} {op}", if an { "an" } else { "a" })
}
