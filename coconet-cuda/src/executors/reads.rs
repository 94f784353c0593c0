//! Reading a job's values: as f64 (the [`JobData`](coconet_plan::JobData) way, for tests and the
//! interpreter's comparisons), and in their own dtype into host or device memory
//! ([`DeviceData`]), run by run of the value's view and one rank's data only.

use crate::devices::Device;
use crate::lent::{DeviceSlice, Memory};
use coconet_core::{Element, ValueId};
use coconet_plan::RuntimeError;
use coconet_plan::backend::JobData;
use coconet_plan::plan::{BufferRef, Plan};
use std::collections::HashMap;

/// Rank `r`'s data of `v` as f64 (`None` where `r` does not hold it); `buffer` finds
/// rank `r`'s buffers.
pub(crate) fn read_value<'a, D: Device>(
    device: &D,
    plan: &Plan,
    v: ValueId,
    r: usize,
    uniform: &HashMap<ValueId, f64>,
    buffer: &dyn Fn(BufferRef) -> Option<&'a D::Buffer>,
) -> Result<Option<Vec<f64>>, RuntimeError>
where
    D::Buffer: 'a,
{
    let p = plan.program();
    if !plan.holders(v).contains(&r) {
        return Ok(None);
    }
    if let Some(x) = uniform.get(&v) {
        return Ok(Some(vec![*x]));
    }
    let view = plan
        .view(v, r)
        .ok_or_else(|| RuntimeError::Read(format!("`{}` is not kept in memory", p.label(v))))?;
    let b = buffer(view.buffer).ok_or_else(|| {
        RuntimeError::Read(format!("rank {r} has no buffer for `{}`", p.label(v)))
    })?;
    let (dtype, len) = plan.buffer_extent(view.buffer, r);
    Ok(Some(view.gather(&device.download(b, dtype, len)?)))
}

/// Copies rank `r`'s data of `v` into `out` (exactly its bytes), run by run from its
/// buffer; `base` finds the rank's buffers' addresses. `Ok(false)` where `r` does not
/// hold `v`.
pub(crate) fn read_raw<D: Device>(
    device: &D,
    plan: &Plan,
    v: ValueId,
    r: usize,
    uniform: &HashMap<ValueId, f64>,
    out: &mut [u8],
    base: &mut dyn FnMut(BufferRef) -> Option<u64>,
) -> Result<bool, RuntimeError> {
    let p = plan.program();
    if !plan.holders(v).contains(&r) {
        return Ok(false);
    }
    if let Some(x) = uniform.get(&v) {
        let mut one = coconet_plan::host::memory::Buffer::from_f64(p.node(v).ty.dtype, &[*x]);
        // SAFETY: a buffer of this function's own, one element long, outliving the view.
        let raw = unsafe { one.raw() };
        // SAFETY: as above; no other thread sees the buffer.
        out.copy_from_slice(unsafe { raw.bytes(0, 1) });
        return Ok(true);
    }
    let view = plan
        .view(v, r)
        .ok_or_else(|| RuntimeError::Read(format!("`{}` is not kept in memory", p.label(v))))?;
    let at = base(view.buffer).ok_or_else(|| {
        RuntimeError::Read(format!("rank {r} has no buffer for `{}`", p.label(v)))
    })?;
    let size = crate::actions::buffer_size(plan, view.buffer);
    let mut done = 0;
    for (start, len) in view.runs() {
        let bytes = len * size;
        device.read_bytes(at + (start * size) as u64, &mut out[done..done + bytes])?;
        done += bytes;
    }
    Ok(true)
}

/// Copies rank `r`'s data of `v` to device address `dst`, run by run, ordered with the
/// kernels. `Ok(false)` where `r` does not hold `v`.
pub(crate) fn copy_value<D: Device>(
    device: &D,
    plan: &Plan,
    v: ValueId,
    r: usize,
    dst: u64,
    base: &mut dyn FnMut(BufferRef) -> Option<u64>,
) -> Result<bool, RuntimeError> {
    let p = plan.program();
    if !plan.holders(v).contains(&r) {
        return Ok(false);
    }
    let view = plan.view(v, r).ok_or_else(|| {
        RuntimeError::Read(format!(
            "`{}` is not kept in device memory (a scalar: read it to the host)",
            p.label(v)
        ))
    })?;
    let at = base(view.buffer).ok_or_else(|| {
        RuntimeError::Read(format!("rank {r} has no buffer for `{}`", p.label(v)))
    })?;
    let size = crate::actions::buffer_size(plan, view.buffer);
    let mut done = 0u64;
    for (start, len) in view.runs() {
        device.copy(dst + done, at + (start * size) as u64, len * size)?;
        done += (len * size) as u64;
    }
    Ok(true)
}

/// Reads of a CUDA job's values in their own dtype, without f64 and without the host
/// where the destination is device memory: what a training loop on a GPU uses between
/// runs. Every CUDA job implements it (one device, ranks as threads, a process's rank).
///
/// Reads refuse what [`JobData`]'s do (values not kept in memory, ranks that do not hold
/// the value here, a failed job) and, besides, a destination of another dtype or length:
/// nothing is converted.
pub trait DeviceData: JobData {
    /// Where rank `rank`'s memory is, or why it is not in this process.
    fn rank_memory(&self, rank: usize) -> Result<Memory, RuntimeError>;

    /// Copies rank `rank`'s data of `v` (resolved, readable, held by the rank here:
    /// checked) into `out`, exactly its bytes.
    fn read_rank_bytes(&self, v: ValueId, rank: usize, out: &mut [u8]) -> Result<(), RuntimeError>;

    /// Copies rank `rank`'s data of `v` (checked as for [`DeviceData::read_rank_bytes`])
    /// into the caller's memory `dst` (checked: its dtype, length and memory), ordered
    /// after the last run.
    fn copy_rank_to(
        &self,
        v: ValueId,
        rank: usize,
        dst: &DeviceSlice<'_>,
    ) -> Result<(), RuntimeError>;

    /// Copies rank `rank`'s data of `v` after the last run into `out`, in the value's own
    /// dtype `T` (its length exactly): only that rank's data leaves the device.
    fn read<T: Element>(
        &self,
        v: impl Into<ValueId>,
        rank: usize,
        out: &mut [T],
    ) -> Result<(), RuntimeError> {
        let plan = self.plan();
        let v = plan.resolve(v.into())?;
        let dtype = plan.program().node(v).ty.dtype;
        if T::DTYPE != dtype {
            return Err(RuntimeError::Read(format!(
                "`{}` holds {dtype:?} elements, not {:?} (a typed read does not convert)",
                plan.program().label(v),
                T::DTYPE
            )));
        }
        check_len(plan, v, rank, out.len())?;
        self.rank_memory(rank)?;
        // SAFETY: every element type is plain data; the bytes are exactly `out`'s.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                out.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(out),
            )
        };
        self.read_rank_bytes(v, rank, bytes)
    }

    /// Copies rank `rank`'s data of `v` after the last run into the caller's device
    /// memory `dst` (its dtype and length exactly), ordered after the run: work that
    /// waits on an event recorded afterwards (the next run's, or
    /// [`PreparedJob::record`](crate::PreparedJob::record)'s) sees it.
    fn read_to(
        &self,
        v: impl Into<ValueId>,
        rank: usize,
        dst: &DeviceSlice<'_>,
    ) -> Result<(), RuntimeError> {
        let plan = self.plan();
        let v = plan.resolve(v.into())?;
        let name = plan.program().label(v);
        let dtype = plan.program().node(v).ty.dtype;
        if dst.dtype() != dtype {
            return Err(RuntimeError::Lend(format!(
                "the memory to read `{name}` into is {:?}; it holds {dtype:?}",
                dst.dtype()
            )));
        }
        check_len(plan, v, rank, dst.len())?;
        let memory = self.rank_memory(rank)?;
        if dst.memory() != memory {
            return Err(RuntimeError::Lend(format!(
                "the memory to read `{name}` into is in {}; rank {rank}'s is {memory}",
                dst.memory()
            )));
        }
        self.copy_rank_to(v, rank, dst)
    }
}

/// Checks that rank `rank` holds readable `v` here with `got` elements.
fn check_len(plan: &Plan, v: ValueId, rank: usize, got: usize) -> Result<(), RuntimeError> {
    let p = plan.program();
    if !plan.holders(v).contains(&rank) {
        return Err(RuntimeError::Read(format!(
            "rank {rank} does not hold `{}`",
            p.label(v)
        )));
    }
    if let Some(why) = plan.unreadable(v) {
        return Err(RuntimeError::Read(why));
    }
    let n: usize = plan.local_shape(v, rank).iter().product();
    if n != got {
        return Err(RuntimeError::Read(format!(
            "`{}` on rank {rank} has {n} elements ({:?}); the destination holds {got}",
            p.label(v),
            plan.local_shape(v, rank)
        )));
    }
    Ok(())
}

/// Copies rank `rank`'s data of `v` on `device` into `dst`, after checking the device
/// can take it (its extent where the device can tell); `base` finds the rank's buffers.
pub(crate) fn copy_checked<D: Device>(
    device: &D,
    plan: &Plan,
    v: ValueId,
    rank: usize,
    dst: &DeviceSlice<'_>,
    base: &mut dyn FnMut(BufferRef) -> Option<u64>,
) -> Result<(), RuntimeError> {
    device
        .check_lent(dst.address(), dst.bytes())
        .map_err(|why| {
            RuntimeError::Lend(format!(
                "the memory to read `{}` into: {why}",
                plan.program().label(v)
            ))
        })?;
    copy_value(device, plan, v, rank, dst.address(), base)?;
    Ok(())
}
