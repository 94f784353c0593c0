//! Plans: a schedule lowered for P ranks — the steps every rank executes, in order, and
//! where every value lives. Backend-neutral: a backend executes [`PlanStep`]s over storage
//! it allocates for [`Plan::slots`].
//!
//! The lowering ([`Plan::lower`]) decides:
//! - **steps**: uniform scalar arithmetic; pointwise kernels (a fusion group, or one
//!   pointwise stage) evaluated over chunks; single operations (matmul, reductions,
//!   layer norm, collectives, send); fused all-reduces (reduce-scatter → computation →
//!   all-gather in one pass over chunks, full reductions of its stages folded as they are
//!   computed); where the computation needs a complete reduction first (LAMB's norms,
//!   gradient clipping), a fused all-reduce for the reductions and updates one pass can
//!   do (a plain reduce-scatter where there are none) and a fused all-gather
//!   (computation → all-gather) at the end; overlapped matmul → fused all-reduce; commits of
//!   updates that could not be written in place. Steps are ordered topologically on the
//!   fused graph.
//! - **storage**: inputs are the caller's buffers; an `update` writes its input in place
//!   when every reader of the input runs no later than the update (reads of an input see
//!   its original value); a `scatter` is a view of its operand; values used only inside
//!   their kernel live in registers; every other value gets a slot, and slots are reused
//!   by values whose lifetimes do not overlap (same dtype and per-rank size).

mod fused;
mod geometry;
mod lower;
mod lowered;
mod overlap;
mod uniform;

pub use fused::{FusedAllGather, FusedAllReduce, Gather};
pub use geometry::BufferRef;
pub use geometry::{Access, View, dense_strides, logical_origin, strided_offset};
pub use lower::is_kernel_op;

pub use lowered::{Plan, PlanStep, Slot, Storage};
pub use overlap::PIECES_PER_BLOCK;
pub use overlap::Pieces;
pub use uniform::uniform_values;
