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
mod error;
mod footprint;
mod fuse;
mod fusion;
mod print;
mod recipes;
mod reorder;
mod rewrite;
mod scheduled;
mod split;
mod steps;

pub use error::ScheduleError;
pub use footprint::Footprint;
pub use fusion::{Fusion, FusionKind, Overlap};
pub use recipes::{candidates, candidates_explained, sharded_update};
pub use reorder::Reordered;
pub use scheduled::Schedule;
pub use steps::{Spelling, Step, StepArg, StepParam};
