//! What a fused all-reduce step (`Step::FusedAllReduce`) is made of, as every backend
//! reads it: the all-gathers that end it and the stages its kernel computes.

use coconet_core::{Op, ValueId};

/// A fused all-reduce's members, split into its all-gathers `(gather, gathered value)`
/// and the stages its kernel computes: everything else but the updates that only commit
/// a gathered value (the gather writes the input in place).
pub fn split_fused_members(
    p: &coconet_core::Program,
    members: &[ValueId],
) -> (Vec<(ValueId, ValueId)>, Vec<ValueId>) {
    let gathers: Vec<(ValueId, ValueId)> = members
        .iter()
        .filter_map(|&m| match p.node(m).op {
            Op::AllGather(y) => Some((m, y)),
            _ => None,
        })
        .collect();
    let in_kernel = members
        .iter()
        .copied()
        .filter(|&m| match p.node(m).op {
            Op::AllGather(_) => false,
            Op::Update { value, .. } => !gathers.iter().any(|&(g, _)| g == value),
            _ => true,
        })
        .collect();
    (gathers, in_kernel)
}
