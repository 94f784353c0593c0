//! Schedules as data: a list of [`Step`]s naming values by the names they are bound to.
//! This is how `#[coconet(schedule(...))]` states a schedule: the macro applies the steps
//! at compile time (so a bad schedule is a compile error at the offending step) and the
//! generated code replays them.

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
