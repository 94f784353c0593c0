//! What the CUDA executor needs from a device: memory, kernel launches with CUDA's
//! argument convention (an array of pointers to the arguments), matmuls and a way to
//! order work. A GPU (cudarc) implements it, and so does the host [`Emulator`]
//! (generated kernels compiled as C++), so the executor and every generated kernel are
//! tested on machines without a GPU.
//!
//! [`Emulator`]: crate::Emulator

pub(crate) mod emulator;
#[cfg(feature = "cuda")]
pub(crate) mod gpu;
#[cfg(feature = "cuda")]
pub(crate) mod gpu_graph;
#[cfg(feature = "cuda")]
pub(crate) mod libraries;

use crate::codegen::MatMul;
use crate::lent::{Lent, Memory};
use coconet_core::DType;
use coconet_plan::RuntimeError;
use std::ffi::c_void;

/// One kernel launch, whole: the kernel (an index into the program's kernels), `grid`
/// blocks of `block` threads, and every argument as an 8-byte word in parameter order
/// (pointers, 64-bit integers, f64 bits). Whole, a launch can be compared with the
/// one a graph recorded and updated in place where it differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelCall {
    /// The kernel.
    pub kernel: usize,
    /// Blocks.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// The arguments.
    pub words: Vec<u64>,
}

impl KernelCall {
    /// CUDA's argument convention: a pointer to each argument (valid while the call is
    /// neither moved nor changed). Mutable by the convention's type only: a launch, a
    /// graph node and the emulator read the arguments, never write them.
    pub fn argument_pointers(&self) -> Vec<*mut c_void> {
        self.words
            .iter()
            .map(|w| (w as *const u64).cast_mut().cast())
            .collect()
    }
}

/// A device the CUDA executor drives. Buffers are identified by their device address.
pub trait Device {
    /// A device buffer (freed when dropped).
    type Buffer;

    /// A buffer holding `data` converted to `dtype`.
    fn upload(&self, data: &coconet_core::HostData) -> Result<Self::Buffer, RuntimeError>;

    /// Overwrites buffer `b` with `bytes` (its size exactly), ordered before kernels
    /// launched afterwards.
    fn write(&self, b: &Self::Buffer, bytes: &[u8]) -> Result<(), RuntimeError>;

    /// A buffer of `n` zeroed elements of `dtype`.
    fn zeros(&self, dtype: DType, n: usize) -> Result<Self::Buffer, RuntimeError>;

    /// A buffer holding device addresses (arrays of peer pointers).
    fn addresses(&self, addrs: &[u64]) -> Result<Self::Buffer, RuntimeError>;

    /// The device address of a buffer's first element.
    fn address(&self, b: &Self::Buffer) -> u64;

    /// The contents of a buffer of `n` elements of `dtype`.
    fn download(&self, b: &Self::Buffer, dtype: DType, n: usize) -> Result<Vec<f64>, RuntimeError>;

    /// Launches `call` on the kernels' stream.
    fn launch(&self, call: &KernelCall) -> Result<(), RuntimeError>;

    /// Launches recorded once and replayed as one unit: a CUDA graph on a GPU.
    type Graph: Send;

    /// A graph of `calls`, each after the one before (as on one stream).
    fn graph(&self, calls: &[KernelCall]) -> Result<Self::Graph, RuntimeError>;

    /// Makes launch `i` of `graph` launch `call` (the same kernel, other arguments or
    /// grid) from the next replay on; replays already queued keep the old one.
    fn update_graph(
        &self,
        graph: &mut Self::Graph,
        i: usize,
        call: &KernelCall,
    ) -> Result<(), RuntimeError>;

    /// Queues `graph` on the kernels' stream, ordered as its launches would be.
    fn replay(&self, graph: &Self::Graph) -> Result<(), RuntimeError>;

    /// Makes later matmuls wait for every kernel launched so far (the compute stream
    /// waits for the communication stream on a GPU).
    fn wait_kernels(&self) -> Result<(), RuntimeError>;

    /// Computes rows `rows` of a matmul, `out = a × b`, with operands at these device
    /// addresses (already offset), on the compute stream, after the last
    /// [`Device::wait_kernels`] (not after later kernels: an overlapped matmul's next
    /// block runs while the collective works on the previous one).
    fn gemm(
        &self,
        mm: &MatMul,
        a: u64,
        b: u64,
        out: u64,
        rows: std::ops::Range<usize>,
    ) -> Result<(), RuntimeError>;

    /// Marks the end of an overlapped matmul block: collective work launched after
    /// [`Device::wait_block`] waits for it (an event between streams on a GPU).
    fn block_done(&self) -> Result<(), RuntimeError>;

    /// Makes later launches wait for the last [`Device::block_done`].
    fn wait_block(&self) -> Result<(), RuntimeError>;

    /// Makes later transfers (a [`PeerTransport`](crate::executors::rank_job::PeerTransport)'s, on the transfers'
    /// stream) wait for every kernel launched so far.
    fn transfers_wait_kernels(&self) -> Result<(), RuntimeError>;

    /// Makes later kernels wait for every transfer posted so far.
    fn kernels_wait_transfers(&self) -> Result<(), RuntimeError>;

    /// Waits for all launched work.
    fn synchronize(&self) -> Result<(), RuntimeError>;

    /// A point in the device's work: what a run hands back and what a run can wait on.
    type Event;

    /// Where this device's memory is (what lent memory must be).
    fn memory(&self) -> Memory;

    /// Why `bytes` bytes at `address` cannot be lent to this device (another device's
    /// memory, an allocation shorter than that), where the device can tell.
    fn check_lent(&self, address: u64, bytes: usize) -> Result<(), String>;

    /// Joins every stream's work so far and records it: later work on any stream of the
    /// caller's that waits on the event sees all of it.
    fn record(&self) -> Result<Self::Event, RuntimeError>;

    /// Makes every later launch, matmul and transfer wait for `event`.
    fn wait_event(&self, event: &Self::Event) -> Result<(), RuntimeError>;

    /// Waits on the host for the work recorded in `event`.
    fn wait_host(&self, event: &Self::Event) -> Result<(), RuntimeError>;

    /// Copies `bytes` bytes from `src` to `dst` (device addresses), ordered with the
    /// kernels.
    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), RuntimeError>;

    /// Reads `out.len()` bytes at device address `address` once every launched kernel
    /// has finished.
    fn read_bytes(&self, address: u64, out: &mut [u8]) -> Result<(), RuntimeError>;

    /// Makes later work wait for the work queued so far on the streams the lent memory
    /// was used on (cudarc slices carry theirs; the emulator has none).
    fn after_lenders(&self, _lent: &Lent<'_>) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// Makes the lent memory's streams wait for `event` (a run's end).
    fn release_lenders(&self, _lent: &Lent<'_>, _event: &Self::Event) -> Result<(), RuntimeError> {
        Ok(())
    }
}
