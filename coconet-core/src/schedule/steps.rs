//! Schedules as data: a list of [`Step`]s naming values by the names they are bound to,
//! and how each is written ([`Spelling`]). This is how `#[coconet(schedule(...))]` states
//! a schedule: the macro parses the steps with these spellings, applies them at compile
//! time (so a bad schedule is a compile error at the offending step), and the generated
//! code replays them as written ([`Schedule::from_written`]). The list of steps is here
//! alone: a new step is a variant, its spelling and its `apply` arm.

use super::error::ScheduleError;
use super::recipes::sharded_update;
use super::scheduled::Schedule;
use crate::{Program, ValueId};

/// One transformation, with values named as in the program (`g1`, and names that earlier
/// steps create: `g1_rs` after `split(g1)`, `x_slice` after a reorder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// [`Schedule::split_along`].
    Split(String, usize),
    /// [`Schedule::split_reduce_broadcast`].
    SplitReduceBroadcast(String, usize),
    /// [`Schedule::reorder`]: computations, then the all-gather.
    Reorder(Vec<String>, String),
    /// [`Schedule::reorder_all`].
    ReorderAll(String),
    /// [`Schedule::as_slice`].
    AsSlice(Vec<String>),
    /// [`Schedule::fuse`].
    Fuse(Vec<String>),
    /// [`Schedule::fuse_all_reduce`].
    FuseAllReduce(String),
    /// [`Schedule::overlap`]: producer, consumer.
    Overlap(String, String),
    /// [`Schedule::eliminate_dead_code`].
    EliminateDeadCode,
    /// [`sharded_update`]: the all-reduce, then the optimizer state to slice. Must be the
    /// first step.
    ShardedUpdate(String, Vec<String>),
}

/// How an argument of a step is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepParam {
    /// The name of a value: `g1`.
    Name,
    /// A list of names: `[m, v]`.
    Names,
    /// An integer literal: a dim or a root rank.
    Int,
    /// An integer literal that may be left out (then 0); always last.
    OptInt,
}

/// An argument of a step, as written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StepArg {
    /// For [`StepParam::Name`].
    Name(String),
    /// For [`StepParam::Names`].
    Names(Vec<String>),
    /// For [`StepParam::Int`] and [`StepParam::OptInt`].
    Int(usize),
}

impl From<&str> for StepArg {
    fn from(name: &str) -> StepArg {
        StepArg::Name(name.to_string())
    }
}

impl From<Vec<&str>> for StepArg {
    fn from(names: Vec<&str>) -> StepArg {
        StepArg::Names(names.into_iter().map(str::to_string).collect())
    }
}

impl From<usize> for StepArg {
    fn from(x: usize) -> StepArg {
        StepArg::Int(x)
    }
}

/// How one step is written in `#[coconet(schedule(..))]`: its name, its arguments, and
/// the [`Step`] they make. A step may have several (`reorder(ag)`, `reorder([c], ag)`).
#[derive(Clone, Copy)]
pub struct Spelling {
    /// The step's name.
    pub name: &'static str,
    /// Its arguments, in the order they are written.
    pub params: &'static [StepParam],
    /// The whole call, for error messages: `split(ar[, dim])`.
    pub usage: &'static str,
    make: fn(&Written<'_>) -> Option<Step>,
}

impl std::fmt::Debug for Spelling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Spelling({})", self.usage)
    }
}

impl Spelling {
    /// Whether the spelling takes `n` arguments.
    pub fn accepts(&self, n: usize) -> bool {
        let required = self
            .params
            .iter()
            .filter(|p| **p != StepParam::OptInt)
            .count();
        (required..=self.params.len()).contains(&n)
    }
}

use StepParam::{Int, Name, Names, OptInt};

/// Every step, as written; in the order error messages list them.
const SPELLINGS: &[Spelling] = &[
    Spelling {
        name: "split",
        params: &[Name, OptInt],
        usage: "split(ar[, dim])",
        make: |a| Some(Step::Split(a.name(0)?, a.int(1)?)),
    },
    Spelling {
        name: "split_reduce_broadcast",
        params: &[Name, Int],
        usage: "split_reduce_broadcast(ar, root)",
        make: |a| Some(Step::SplitReduceBroadcast(a.name(0)?, a.int(1)?)),
    },
    Spelling {
        name: "reorder",
        params: &[Names, Name],
        usage: "reorder([comps], ag)",
        make: |a| Some(Step::Reorder(a.names(0)?, a.name(1)?)),
    },
    Spelling {
        name: "reorder",
        params: &[Name],
        usage: "reorder(ag)",
        make: |a| Some(Step::ReorderAll(a.name(0)?)),
    },
    Spelling {
        name: "as_slice",
        params: &[Names],
        usage: "as_slice([tensors])",
        make: |a| Some(Step::AsSlice(a.names(0)?)),
    },
    Spelling {
        name: "fuse",
        params: &[Names],
        usage: "fuse([stages])",
        make: |a| Some(Step::Fuse(a.names(0)?)),
    },
    Spelling {
        name: "fuse_all_reduce",
        params: &[Name],
        usage: "fuse_all_reduce(rs)",
        make: |a| Some(Step::FuseAllReduce(a.name(0)?)),
    },
    Spelling {
        name: "overlap",
        params: &[Name, Name],
        usage: "overlap(producer, consumer)",
        make: |a| Some(Step::Overlap(a.name(0)?, a.name(1)?)),
    },
    Spelling {
        name: "eliminate_dead_code",
        params: &[],
        usage: "eliminate_dead_code()",
        make: |_| Some(Step::EliminateDeadCode),
    },
    Spelling {
        name: "sharded_update",
        params: &[Name, Names],
        usage: "sharded_update(ar, [state])",
        make: |a| Some(Step::ShardedUpdate(a.name(0)?, a.names(1)?)),
    },
];

/// The arguments of one written step, read by position.
struct Written<'a>(&'a [StepArg]);

impl Written<'_> {
    fn name(&self, i: usize) -> Option<String> {
        match self.0.get(i) {
            Some(StepArg::Name(n)) => Some(n.clone()),
            _ => None,
        }
    }

    fn names(&self, i: usize) -> Option<Vec<String>> {
        match self.0.get(i) {
            Some(StepArg::Names(n)) => Some(n.clone()),
            _ => None,
        }
    }

    /// An integer; a left-out optional one is 0.
    fn int(&self, i: usize) -> Option<usize> {
        match self.0.get(i) {
            Some(StepArg::Int(x)) => Some(*x),
            None => Some(0),
            _ => None,
        }
    }
}

impl Step {
    /// The names the step refers to.
    pub fn names(&self) -> Vec<&str> {
        match self {
            Step::Split(a, _)
            | Step::SplitReduceBroadcast(a, _)
            | Step::ReorderAll(a)
            | Step::FuseAllReduce(a) => vec![a],
            Step::Reorder(v, a) | Step::ShardedUpdate(a, v) => {
                v.iter().map(String::as_str).chain([a.as_str()]).collect()
            }
            Step::AsSlice(v) | Step::Fuse(v) => v.iter().map(String::as_str).collect(),
            Step::Overlap(a, b) => vec![a, b],
            Step::EliminateDeadCode => vec![],
        }
    }

    /// Every way a step is written, in the order error messages list them.
    pub fn spellings() -> &'static [Spelling] {
        SPELLINGS
    }

    /// Every step as written, for messages: `split(ar[, dim]), ...`.
    pub fn usage() -> String {
        SPELLINGS
            .iter()
            .map(|s| s.usage)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The step written `name(args)`, or why no step is written so.
    pub fn written(name: &str, args: &[StepArg]) -> Result<Step, ScheduleError> {
        let mut named = SPELLINGS.iter().filter(|s| s.name == name).peekable();
        let why = if named.peek().is_none() {
            "unknown schedule step"
        } else {
            "wrong arguments for"
        };
        named
            .filter(|s| s.accepts(args.len()))
            .find_map(|s| (s.make)(&Written(args)))
            .ok_or_else(|| {
                let steps = Step::usage();
                ScheduleError::new("schedule", format!("{why} `{name}`; the steps are {steps}"))
            })
    }
}

impl Schedule {
    fn named_value(&self, t: &'static str, name: &str) -> Result<ValueId, ScheduleError> {
        self.program.find(name).ok_or_else(|| {
            let mut known: Vec<String> = self
                .program
                .nodes()
                .iter()
                .filter_map(|n| n.name.clone())
                .collect();
            known.sort();
            ScheduleError::new(
                t,
                format!(
                    "no value is named `{name}` at this step (named values: {})",
                    known.join(", ")
                ),
            )
        })
    }

    fn named_values(
        &self,
        t: &'static str,
        names: &[String],
    ) -> Result<Vec<ValueId>, ScheduleError> {
        names.iter().map(|n| self.named_value(t, n)).collect()
    }

    /// Applies one step.
    pub fn apply(&mut self, step: &Step) -> Result<(), ScheduleError> {
        match step {
            Step::Split(a, dim) => {
                let a = self.named_value("split", a)?;
                self.split_along(a, *dim).map(drop)
            }
            Step::SplitReduceBroadcast(a, root) => {
                let a = self.named_value("split", a)?;
                self.split_reduce_broadcast(a, *root).map(drop)
            }
            Step::Reorder(comps, ag) => {
                let comps = self.named_values("reorder", comps)?;
                let ag = self.named_value("reorder", ag)?;
                self.reorder(&comps, ag).map(drop)
            }
            Step::ReorderAll(ag) => {
                let ag = self.named_value("reorder", ag)?;
                self.reorder_all(ag).map(drop)
            }
            Step::AsSlice(ts) => {
                let ts = self.named_values("as_slice", ts)?;
                self.as_slice(&ts)
            }
            Step::Fuse(stages) => {
                let stages = self.named_values("fuse", stages)?;
                self.fuse(&stages).map(drop)
            }
            Step::FuseAllReduce(rs) => {
                let rs = self.named_value("fuse", rs)?;
                self.fuse_all_reduce(rs).map(drop)
            }
            Step::Overlap(p, c) => {
                let (p, c) = (
                    self.named_value("overlap", p)?,
                    self.named_value("overlap", c)?,
                );
                self.overlap(p, c)
            }
            Step::EliminateDeadCode => self.eliminate_dead_code().map(drop),
            Step::ShardedUpdate(ar, state) => {
                if !self.steps.is_empty() {
                    return Err(ScheduleError::new(
                        "sharded_update",
                        "a recipe starts from the program as written: make it the first step",
                    ));
                }
                let ar = self.named_value("sharded_update", ar)?;
                let state = self.named_values("sharded_update", state)?;
                let name = self.name.clone();
                *self = sharded_update(&self.original, ar, &state)?.named(name);
                Ok(())
            }
        }
    }

    /// [`Schedule::from_steps`] with the steps as written (`("split", vec!["g1".into()])`):
    /// how the code `#[coconet]` generates replays a schedule.
    pub fn from_written(
        program: &Program,
        name: &str,
        steps: &[(&str, Vec<StepArg>)],
    ) -> Result<Schedule, (usize, ScheduleError)> {
        let steps = steps
            .iter()
            .enumerate()
            .map(|(i, (step, args))| Step::written(step, args).map_err(|e| (i, e)))
            .collect::<Result<Vec<_>, _>>()?;
        Schedule::from_steps(program, name, &steps)
    }

    /// Builds the schedule `name` of `program` from `steps`; on failure, the index of the
    /// step that failed and why.
    pub fn from_steps(
        program: &Program,
        name: &str,
        steps: &[Step],
    ) -> Result<Schedule, (usize, ScheduleError)> {
        let mut s = Schedule::new(program).named(name);
        for (i, step) in steps.iter().enumerate() {
            s.apply(step).map_err(|e| (i, e))?;
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step is chosen by its name and how many arguments it is written with.
    #[test]
    fn written_steps_pick_their_spelling_by_arity() {
        assert_eq!(
            Step::written("reorder", &["ag".into()]),
            Ok(Step::ReorderAll("ag".into()))
        );
        assert_eq!(
            Step::written("reorder", &[vec!["m"].into(), "ag".into()]),
            Ok(Step::Reorder(vec!["m".into()], "ag".into()))
        );
        assert_eq!(
            Step::written("split", &["g1".into()]),
            Ok(Step::Split("g1".into(), 0))
        );
        let err = Step::written("overlap", &["g1".into()]).unwrap_err();
        assert!(err.message.starts_with("wrong arguments for `overlap`"));
        let err = Step::written("splitt", &[]).unwrap_err();
        assert!(err.message.starts_with("unknown schedule step `splitt`"));
    }
}
