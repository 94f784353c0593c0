//! The schedule itself: a program and the transformations applied to it (each
//! transformation adds its methods in its own file).

use super::error::ScheduleError;
use super::fusion::{Fusion, Overlap};
use crate::{Program, ValueId};

/// A program and the transformations applied to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub(super) name: String,
    pub(super) original: Program,
    pub(super) program: Program,
    pub(super) fusions: Vec<Fusion>,
    pub(super) overlaps: Vec<Overlap>,
    pub(super) steps: Vec<String>,
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
    pub(super) fn before_annotations(&self, t: &'static str) -> Result<(), ScheduleError> {
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

    pub(super) fn stage(
        &self,
        t: &'static str,
        v: impl Into<ValueId>,
    ) -> Result<ValueId, ScheduleError> {
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

    pub(super) fn label(&self, v: ValueId) -> String {
        format!("`{}`", self.program.label(v))
    }

    pub(super) fn replace(&mut self, program: Program, step: String) {
        self.program = program;
        self.steps.push(step);
    }
}
