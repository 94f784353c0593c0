//! A cost model of schedules: the time of a plan predicted from what each of its steps
//! asks of the machine, without running it.
//!
//! # Design
//! The plan says everything a step moves and computes ([`Demand`]: bytes through
//! memory, pointwise element-stages, elements reduced across ranks, matmul flops,
//! barriers, bytes over links); a [`Machine`] says what each costs. A step takes
//! `barriers · P · barrier + memory + compute` where the ranks share a memory system
//! (CPU rank threads: memory traffic and computation add up, computation spread over
//! the cores), or the largest of memory, compute and link time where they do not
//! (GPUs; links priced α–β per protocol and algorithm, see [`Links`]). On GPUs an
//! overlapped matmul and fused all-reduce take the longer of the two plus the first
//! block of the matmul (the fill); on rank threads sharing the cores, their sum plus
//! the reduction of the matmul's last piece (see [`coconet_plan::plan::PIECES_PER_BLOCK`]). The
//! same byte model is
//! the one BENCHMARKS.md derives by hand for the memory bound; here it is counted for
//! every step of every schedule, so the model ranks schedules before any is run.

mod calibrate;
mod links;
mod machine;
mod predict;
mod traffic;

pub use calibrate::calibrate;
pub use links::{InNetwork, Latency, Links, Pattern, Protocol, Transfer};
pub use machine::{Machine, PRESETS};
pub use predict::{Prediction, predict};
pub use traffic::{Demand, demands};
