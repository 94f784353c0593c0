//! The f32 data a custom op's CPU forward gets from candle.

use candle_core::{CpuStorage, Layout, Result};

/// The f32 data of a contiguous storage, or an error naming `what`.
pub(super) fn f32_data<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    what: &str,
) -> Result<&'a [f32]> {
    let CpuStorage::F32(all) = storage else {
        candle_core::bail!("{what}: expected f32 data")
    };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&all[start..end]),
        None => candle_core::bail!("{what}: expected a contiguous tensor"),
    }
}
