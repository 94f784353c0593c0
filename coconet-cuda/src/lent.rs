//! Device memory a caller lends to a CUDA job for one run: a framework's tensors (a
//! gradient, the weights, optimizer state) used in place, never copied through the host.
//!
//! # The contract of lent memory
//!
//! A [`DeviceSlice`] names `len` elements of one dtype at a device address. Whoever makes
//! one from a raw address ([`DeviceSlice::from_raw`], unsafe) promises what the safe
//! constructors get from the borrow checker:
//!
//! 1. the memory stays allocated, and is used by nothing else, until the work of the run
//!    it is lent to has finished (the event the run hands back has completed, or a
//!    stream has waited on it);
//! 2. it is memory of the job's device ([`Memory`]): a GPU's global memory for a job on
//!    that GPU, host memory for the emulator;
//! 3. it holds at least `len` elements of the stated dtype.
//!
//! The job checks what it can: the dtype and the length against the input's buffer on
//! that rank, overlaps between everything lent to one run, and on a GPU the device and
//! the allocation's extent (`cuPointerGetAttribute`), so a wrong device or a too-short
//! allocation is an error naming the input, not a fault. A region found good is not
//! asked about again by the same job (a training loop lends the same tensors every
//! step): memory freed and reallocated under a lent address stays the caller's concern.
//!
//! Several slices for one input (a model's parameter tensors) are taken in place too:
//! every elementwise kernel has a segmented twin that steps a list of pieces in one
//! launch. Where a step reaches the input otherwise (a matmul, an exchange between ranks
//! with separate memories, a full reduction such as LAMB's norms), the pieces are
//! gathered into the job's buffer by device copies before the run and, for an input the
//! program updates, scattered back after it.
//!
//! Memory lent for an input the program updates (`update(w, …)`) is written in place:
//! after the run the caller's memory holds the new value.

use coconet_core::{DType, Element};
use coconet_plan::RuntimeError;
use std::marker::PhantomData;

/// Where memory lives: what a job checks lent memory against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Memory {
    /// Host memory: the emulator's "device" memory (a host pointer stands for a device
    /// pointer).
    Host,
    /// Global memory of the GPU with this ordinal.
    Gpu(usize),
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Memory::Host => write!(f, "host memory"),
            Memory::Gpu(o) => write!(f, "GPU {o}"),
        }
    }
}

/// `len` elements of `dtype` at a device address, lent to a job for as long as `'a`
/// (see the module's contract).
#[derive(Debug, Clone)]
pub struct DeviceSlice<'a> {
    pub(crate) address: u64,
    pub(crate) len: usize,
    pub(crate) dtype: DType,
    pub(crate) memory: Memory,
    /// The stream the memory was last used on (a cudarc slice's): the run waits for its
    /// work first and makes it wait for the run's work after.
    #[cfg(feature = "cuda")]
    pub(crate) stream: Option<std::sync::Arc<cudarc::driver::CudaStream>>,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl DeviceSlice<'static> {
    /// Memory at a raw device address (a framework's tensor).
    ///
    /// # Safety
    /// The module's contract: the memory is `memory`'s, holds `len` elements of `dtype`,
    /// and stays allocated and otherwise unused until the work of every run it is lent to
    /// has finished.
    pub unsafe fn from_raw(address: u64, len: usize, dtype: DType, memory: Memory) -> Self {
        DeviceSlice {
            address,
            len,
            dtype,
            memory,
            #[cfg(feature = "cuda")]
            stream: None,
            _borrow: PhantomData,
        }
    }
}

impl<'a> DeviceSlice<'a> {
    /// A host slice standing for device memory: what the emulator's jobs
    /// ([`EmulatedCuda`](crate::EmulatedCuda)) take, so lending is tested without
    /// a GPU.
    pub fn host<T: Element>(data: &'a mut [T]) -> Self {
        DeviceSlice {
            address: data.as_mut_ptr() as u64,
            len: data.len(),
            dtype: T::DTYPE,
            memory: Memory::Host,
            #[cfg(feature = "cuda")]
            stream: None,
            _borrow: PhantomData,
        }
    }

    /// A cudarc slice on its GPU, borrowed for `'a`. The run is ordered after the work
    /// queued on the slice's stream and that stream after the run's work, so a caller
    /// working on one stream (candle's device stream) needs no events of its own.
    #[cfg(feature = "cuda")]
    pub fn cuda<T: Element + cudarc::driver::DeviceRepr>(
        data: &'a mut cudarc::driver::CudaSlice<T>,
    ) -> Self {
        use cudarc::driver::DevicePtrMut;
        let stream = data.stream().clone();
        let len = data.len();
        // The guard records the slice's write event on its own stream (where cudarc
        // tracks events) at once: the run orders itself with that stream instead (it
        // waits for the stream's work, and the stream waits for the run's).
        let (address, guard) = data.device_ptr_mut(&stream);
        drop(guard);
        DeviceSlice {
            address,
            len,
            dtype: T::DTYPE,
            memory: Memory::Gpu(stream.context().ordinal()),
            stream: Some(stream.clone()),
            _borrow: PhantomData,
        }
    }

    /// The same memory, with the run ordered after the work queued on `stream` and
    /// `stream` after the run's: for memory a framework uses on its own stream and lends
    /// through [`DeviceSlice::from_raw`] (a candle `Var`'s storage).
    #[cfg(feature = "cuda")]
    pub fn ordered_with(mut self, stream: std::sync::Arc<cudarc::driver::CudaStream>) -> Self {
        self.stream = Some(stream);
        self
    }

    /// The same memory (and stream to order with) without the borrow: for a caller that
    /// keeps its tensors alive itself, as a framework holding a model's parameters does.
    ///
    /// # Safety
    /// [`DeviceSlice::from_raw`]'s contract, for as long as the result or a run it is
    /// lent to is in use.
    pub unsafe fn detach(self) -> DeviceSlice<'static> {
        DeviceSlice {
            address: self.address,
            len: self.len,
            dtype: self.dtype,
            memory: self.memory,
            #[cfg(feature = "cuda")]
            stream: self.stream,
            _borrow: PhantomData,
        }
    }

    /// The first `mid` elements and the rest, each lent on its own (as
    /// `slice::split_at_mut` splits a slice), or `None` when `mid` is past the end.
    pub fn split_at(self, mid: usize) -> Option<(DeviceSlice<'a>, DeviceSlice<'a>)> {
        if mid > self.len {
            return None;
        }
        let rest = DeviceSlice {
            address: self.address + (mid * self.dtype.size_bytes()) as u64,
            len: self.len - mid,
            ..self.clone()
        };
        Some((DeviceSlice { len: mid, ..self }, rest))
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements' dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the memory lives.
    pub fn memory(&self) -> Memory {
        self.memory
    }

    /// The device address of the first element.
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Bytes from the first element to the end.
    pub(crate) fn bytes(&self) -> usize {
        self.len * self.dtype.size_bytes()
    }
}

/// What one run borrows: for inputs and ranks, the caller's memory to use instead of the
/// job's buffers.
///
/// One slice per (input, rank) is used in place: the kernels read and write it. Several
/// slices (a model's parameter tensors, in order) are the buffer's pieces, read as their
/// concatenation, in place as well where every step reaching the input is elementwise
/// (the module's docs say when they are copied instead).
#[derive(Debug, Default)]
pub struct Lent<'a> {
    pub(crate) entries: Vec<LentInput<'a>>,
}

/// One input's memory on one rank.
#[derive(Debug)]
pub(crate) struct LentInput<'a> {
    pub(crate) input: String,
    pub(crate) rank: usize,
    pub(crate) pieces: Vec<DeviceSlice<'a>>,
}

impl<'a> Lent<'a> {
    /// Nothing lent.
    pub fn new() -> Self {
        Lent::default()
    }

    /// Lends `memory` as rank `rank`'s buffer of tensor input `input`.
    pub fn input(self, input: &str, rank: usize, memory: DeviceSlice<'a>) -> Self {
        self.pieces(input, rank, vec![memory])
    }

    /// Lends `pieces`, in order, as rank `rank`'s buffer of tensor input `input`.
    pub fn pieces(mut self, input: &str, rank: usize, pieces: Vec<DeviceSlice<'a>>) -> Self {
        self.entries.push(LentInput {
            input: input.to_string(),
            rank,
            pieces,
        });
        self
    }

    /// Whether nothing is lent.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The streams of the lent slices, each once (cudarc slices only).
    #[cfg(feature = "cuda")]
    pub(crate) fn streams(&self) -> Vec<std::sync::Arc<cudarc::driver::CudaStream>> {
        let mut out: Vec<std::sync::Arc<cudarc::driver::CudaStream>> = Vec::new();
        for s in self.entries.iter().flat_map(|e| &e.pieces) {
            if let Some(st) = &s.stream
                && !out.iter().any(|o| o.cu_stream() == st.cu_stream())
            {
                out.push(st.clone());
            }
        }
        out
    }
}

/// The error text for a rank a job does not have.
pub(crate) fn no_such_rank(rank: usize, ranks: usize) -> String {
    format!("rank {rank} does not exist (the job has {ranks} ranks)")
}

/// Refuses lent regions that overlap: two inputs (or ranks, or pieces) in the same
/// bytes would make the kernels' reads depend on their writes' order.
pub(crate) fn check_disjoint(lent: &Lent<'_>) -> Result<(), RuntimeError> {
    let mut regions: Vec<(u64, u64, &str, usize)> = lent
        .entries
        .iter()
        .flat_map(|e| {
            e.pieces.iter().filter(|s| s.bytes() > 0).map(move |s| {
                (
                    s.address,
                    s.address + s.bytes() as u64,
                    &e.input[..],
                    e.rank,
                )
            })
        })
        .collect();
    regions.sort_unstable_by_key(|r| r.0);
    for w in regions.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(RuntimeError::Lend(format!(
                "the memory lent for `{}` on rank {} overlaps the memory lent for `{}` on rank {}",
                w[1].2, w[1].3, w[0].2, w[0].3
            )));
        }
    }
    Ok(())
}
