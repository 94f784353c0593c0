//! What a generated kernel's launch passes: its arguments (pointers into ranks' buffers,
//! ranges, scalars) and how its positions map to threads — the vocabulary the generator
//! and the executors share.

use coconet_core::ValueId;
use coconet_plan::plan::BufferRef;

/// A pointer argument: an element of a buffer on a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PtrArg {
    /// The rank whose buffer it is.
    pub rank: usize,
    /// The buffer.
    pub buffer: BufferRef,
    /// Offset in elements.
    pub offset: usize,
}

/// What a launch over positions `lo..hi` does with a single pointer's buffer (from the
/// pointer's element on). Ranks with separate memories order and pipeline their launches
/// and exchanges by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PtrUse {
    /// Reads element `i` at position `i` (a contiguous operand).
    ReadsAt,
    /// Writes element `i` at position `i` (a fused stage's store).
    WritesAt,
    /// Reads elements `0..n`, whatever the positions (a splat, a broadcast block, a
    /// strided view).
    ReadsFixed(usize),
    /// May read and write anything in the buffer.
    Any,
}

/// A kernel argument, resolved by the executor at launch time.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    /// `lo, hi`: the range of positions this launch covers (two `long long` params).
    Range,
    /// A device pointer into the launching rank's memory, and what the launch does there.
    Ptr(PtrArg, PtrUse),
    /// A device array of device pointers (peers' buffers) the kernel reads at the
    /// launch's positions: element `i` of pointer `k` for `i` in `lo..hi`.
    Reads(Vec<PtrArg>),
    /// A device array of device pointers the kernel writes at the launch's positions.
    Writes(Vec<PtrArg>),
    /// A 64-bit integer.
    I64(i64),
    /// A host scalar of the plan (a uniform), passed as `double`.
    Uniform(ValueId),
    /// Doubles `offset..` of a rank's scratch buffer (partial results of full
    /// reductions; [`CudaProgram::scratch`](super::CudaProgram::scratch) doubles per rank).
    Scratch {
        /// The rank.
        rank: usize,
        /// Offset in doubles.
        offset: usize,
    },
}

/// How positions map to threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One position per thread.
    Elements,
    /// Four positions per thread (vector loads).
    Vector,
    /// One row of `h` positions per block of [`coconet_core::numerics::ROW_LANES`] threads (a
    /// block-level kernel).
    Rows(usize),
    /// A fixed number of threads.
    Threads(usize),
    /// One block of [`REDUCE_LANES`](coconet_core::numerics::REDUCE_LANES) threads per position (a block-level kernel).
    Blocks,
}
