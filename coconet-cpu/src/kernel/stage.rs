//! What a kernel is made of — its stages, where their operands come from, a reduction it
//! may compute — and the view of a prepared kernel that its compiled code is made from
//! and runs on. Both the stage loops (`kernel`) and the compiler (`compiled`) read these;
//! neither reads the other's internals.

use crate::array::Mapping;
use coconet_core::{DType, Op, ValueId};
use coconet_plan::host::memory::Raw;

/// Where a stage's operand comes from during a kernel.
#[derive(Debug, Clone)]
pub enum Src {
    /// A register: an earlier stage of the same kernel (index into the stages).
    Reg(usize),
    /// Memory (or a constant).
    Mem(Mapping),
}

/// One stage of a kernel, ready to run on this rank.
#[derive(Debug, Clone)]
pub struct Stage {
    pub id: ValueId,
    pub op: Op,
    pub dtype: DType,
    pub srcs: Vec<Src>,
    /// Where to store each chunk (None: register only).
    pub store: Option<Mapping>,
    /// For dropout: (logical index of local position 0 along the sliced dim, the
    /// sliced dim, the logical shape) — to recover logical element indices.
    pub logical: Option<(usize, usize, Vec<usize>)>,
}

/// Whether values of `d` live in f32 registers.
pub(super) fn is_narrow(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// A reduction a kernel's compiled code may compute itself: its first preset stage at
/// kernel positions `origin..origin + len`, as the `op`-reduction in rank order of
/// `sources` (a fused all-reduce's chunk of every rank's operand, or the blocks a
/// process received), read where they lie: position `origin + i` of source `(raw,
/// base)` is element `base + i` of `raw`.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "jit"), allow(dead_code))]
pub struct Reduction<'a> {
    pub op: coconet_core::ReduceOp,
    pub sources: &'a [(Raw, usize)],
    pub origin: usize,
    pub len: usize,
    /// The caller reads the reduced register after each chunk (to store it).
    pub keep: bool,
}

/// Whether compiled code can compute a preset stage of dtype `dtype` as an
/// `op`-reduction of every rank's operand ([`Reduction`]): f32 sums and means, the bits
/// of `collective::reduce_f32_slices`.
pub(crate) fn reduction_compiles(op: coconet_core::ReduceOp, dtype: DType) -> bool {
    dtype == DType::F32
        && matches!(
            op,
            coconet_core::ReduceOp::Sum | coconet_core::ReduceOp::Avg
        )
}

/// What compiled code is made from: a prepared kernel's stages and the layout of its
/// registers (see [`Kernel`](super::Kernel)).
#[cfg(feature = "jit")]
#[derive(Clone, Copy)]
pub(super) struct View<'a> {
    pub(super) stages: &'a [Stage],
    /// Per stage: its registers are f32 lanes.
    pub(super) narrow: &'a [bool],
    /// Per stage: computed in f32.
    pub(super) in_f32: &'a [bool],
    /// Per stage: the stage whose register holds its values.
    pub(super) reg: &'a [usize],
    /// The first `preset` stages are filled by the caller.
    pub(super) preset: usize,
    /// Positions of the kernel.
    pub(super) len: usize,
}
