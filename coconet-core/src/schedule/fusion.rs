//! The annotations a schedule carries: fusion groups and overlapped pairs (made by
//! [`Schedule::fuse`](super::Schedule::fuse) and
//! [`Schedule::overlap`](super::Schedule::overlap)).

use crate::ValueId;
use std::collections::BTreeSet;

/// What a fusion group executes as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusionKind {
    /// Computation only: one kernel over chunks.
    Computation,
    /// Computation fused into one collective (the id is the collective).
    Collective(ValueId),
    /// A reduce_scatter, computation, and all_gathers: one fused all-reduce.
    AllReduce {
        /// The reduce_scatter that starts it.
        reduce_scatter: ValueId,
    },
}

/// A fusion group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fusion {
    /// Member stages.
    pub members: BTreeSet<ValueId>,
    /// What it executes as.
    pub kind: FusionKind,
}

/// A producer and consumer run concurrently at chunk granularity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overlap {
    /// The matmul.
    pub producer: ValueId,
    /// The collective consuming it (possibly a member of a fusion group).
    pub consumer: ValueId,
}
