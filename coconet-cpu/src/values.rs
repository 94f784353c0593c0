//! Reading a value of a plan back from a rank's buffers.

use coconet_core::{Layout, ValueId, block_range};
use coconet_plan::plan::{Plan, Storage};

/// `v`'s data on rank `r`, from that rank's input buffers and slots (views are sliced
/// out of the viewed value); `None` if the rank does not hold it or it has no memory.
pub(crate) fn value_on(
    plan: &Plan,
    v: ValueId,
    r: usize,
    input: &dyn Fn(ValueId) -> Option<Vec<f64>>,
    slot: &dyn Fn(usize) -> Option<Vec<f64>>,
) -> Option<Vec<f64>> {
    let p = plan.program();
    let q = plan.group_size();
    let holds = match p.node(v).ty.placement {
        coconet_core::Placement::Everywhere => true,
        coconet_core::Placement::Group(g) => r / q == g,
    };
    if !holds || plan.unreadable(v).is_some() {
        return None;
    }
    match plan.storage(v)? {
        Storage::Input(t) => input(t),
        Storage::Slot(s) => slot(s),
        Storage::View { of, dim } => {
            let data = value_on(plan, of, r, input, slot)?;
            let mut shape = plan.shape(of).to_vec();
            if let Layout::Sliced(d) = p.node(of).ty.layout {
                shape[d] = block_range(shape[d], q, r % q).len();
            }
            let b = block_range(plan.shape(of)[dim], q, r % q);
            Some(coconet_core::numerics::tensor::slice_dim(
                &data, &shape, dim, b,
            ))
        }
        Storage::Uniform | Storage::Register => None,
    }
}
