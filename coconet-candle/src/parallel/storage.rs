//! What a custom op's forward gets from candle — a CPU storage or a CUDA storage and its
//! layout — and a collective's forward on it: the same coconet program either way, over
//! host vectors (rank threads, TCP processes) or over the device memory itself (rank
//! threads on one GPU: lent in place, the result written into a fresh allocation).

use super::collective::Collective;
use super::group::TensorParallel;
use candle_core::{CpuStorage, Layout, Result, Shape};

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

/// The shape of `what`'s result on a rank whose tensor has `layout`: the same, dim 0
/// times (a gather) or divided by (a reduce-scatter) the ranks, or a new dim 0 stacking
/// several results.
pub(super) fn result_shape(
    what: Collective,
    layout: &Layout,
    ranks: usize,
    name: &str,
) -> Result<Shape> {
    let mut dims = layout.dims().to_vec();
    match what {
        Collective::Gather | Collective::ReduceScatter if dims.is_empty() => {
            candle_core::bail!("{name}: a scalar has no rows to gather or scatter")
        }
        Collective::Gather => dims[0] *= ranks,
        Collective::ReduceScatter => {
            if !dims[0].is_multiple_of(ranks) {
                candle_core::bail!(
                    "{name}: {} rows do not split evenly over {ranks} ranks",
                    dims[0]
                );
            }
            dims[0] /= ranks;
        }
        // Several results (an epilogue's stream and its norm): one after the other.
        _ if what.outputs().len() > 1 => dims.insert(0, what.outputs().len()),
        _ => {}
    }
    Ok(Shape::from(dims))
}

/// Why a collective failed, as candle's error.
pub(super) fn failed(
    name: &str,
) -> impl Fn(coconet_runtime::RuntimeError) -> candle_core::Error + '_ {
    move |e| candle_core::Error::Msg(format!("{name}: {e}"))
}

/// `what` over every rank's tensor (`storage`), the inputs every rank holds the same
/// (`replicated`) and the run's `scalars`, on the host: the result's storage and shape.
pub(super) fn cpu_collective(
    tp: &TensorParallel,
    what: Collective,
    (storage, layout): (&CpuStorage, &Layout),
    replicated: &[(&CpuStorage, &Layout)],
    scalars: &[(&str, f64)],
    name: &str,
) -> Result<(CpuStorage, Shape)> {
    let shape = result_shape(what, layout, tp.size(), name)?;
    let mine = f32_data(storage, layout, name)?;
    let replicated = replicated
        .iter()
        .map(|(s, l)| f32_data(s, l, name))
        .collect::<Result<Vec<_>>>()?;
    let out = tp
        .run_with(what, mine, &replicated, scalars)
        .map_err(failed(name))?;
    Ok((CpuStorage::F32(out), shape))
}

#[cfg(feature = "cuda")]
pub(super) use cuda::cuda_collective;

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use crate::parallel::device_group::RankMemory;
    use candle_core::CudaStorage;
    use coconet_core::DType;
    use coconet_runtime::cuda::cudarc::driver::{CudaSlice, DevicePtr};
    use coconet_runtime::cuda::{DeviceSlice, Memory};

    /// `len` f32 elements of `slice` from element `from`, lent for one collective.
    ///
    /// What orders the collective with this rank's work is not the stream named here
    /// (candle's per-thread stream means the calling thread's, and the group's job may
    /// run on another rank's thread) but the rank settling its stream before it calls
    /// the collective and the group's job waiting on the host before any rank returns
    /// (`GroupJob::run`).
    fn lent(
        slice: &CudaSlice<f32>,
        storage: &CudaStorage,
        from: usize,
        len: usize,
    ) -> DeviceSlice<'static> {
        let stream = storage.device.cuda_stream();
        let (base, guard) = slice.device_ptr(&stream);
        drop(guard);
        let address = base + (from * std::mem::size_of::<f32>()) as u64;
        // SAFETY: `len` f32 elements of this GPU's memory from `address` (candle's layout
        // of the tensor, or a fresh allocation), kept by the caller's tensors; the rank
        // settled its stream before the collective, and the collective returns only once
        // the run that uses them has finished (its job waits on the host), so candle's
        // later work on them, a free included, comes after.
        let memory = unsafe {
            DeviceSlice::from_raw(address, len, DType::F32, Memory::Gpu(slice.ordinal()))
        };
        memory.ordered_with(stream)
    }

    /// A contiguous f32 CUDA tensor's memory, lent.
    fn input(storage: &CudaStorage, layout: &Layout, name: &str) -> Result<DeviceSlice<'static>> {
        let (from, to) = layout.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg(format!("{name}: expected a contiguous tensor"))
        })?;
        Ok(lent(
            storage.as_cuda_slice::<f32>()?,
            storage,
            from,
            to - from,
        ))
    }

    /// [`cpu_collective`] on a CUDA storage: every tensor lent in place to the group's
    /// job on the GPU, the result written into a fresh allocation of candle's.
    pub(crate) fn cuda_collective(
        tp: &TensorParallel,
        what: Collective,
        (storage, layout): (&CudaStorage, &Layout),
        replicated: &[(&CudaStorage, &Layout)],
        scalars: &[(&str, f64)],
        name: &str,
    ) -> Result<(CudaStorage, Shape)> {
        use candle_core::backend::BackendDevice;
        let shape = result_shape(what, layout, tp.size(), name)?;
        let prepared = (|| -> Result<(CudaSlice<f32>, RankMemory)> {
            // Written whole by the collective.
            // SAFETY: every element is written by the run before anything reads it.
            let out: CudaSlice<f32> = unsafe { storage.device.alloc(shape.elem_count())? };
            // candle queues on the calling thread's stream (a per-thread stream), and the
            // group's job may run on another rank's thread, whose stream that is not: the
            // work that made this rank's operand and allocated `out` is finished first.
            storage.device.synchronize()?;
            let memory = RankMemory {
                mine: input(storage, layout, name)?,
                replicated: replicated
                    .iter()
                    .map(|(s, l)| input(s, l, name))
                    .collect::<Result<_>>()?,
                out: lent(&out, storage, 0, shape.elem_count()),
            };
            Ok((out, memory))
        })();
        // A rank that cannot call the collective tells its peers at once.
        let (out, memory) = prepared.inspect_err(|e| tp.abort_collective(&e.to_string()))?;
        let len = layout.shape().elem_count();
        tp.run_on_device(what, len, memory, scalars)
            .map_err(failed(name))?;
        Ok((
            CudaStorage::wrap_cuda_slice(out, storage.device.clone()),
            shape,
        ))
    }
}
