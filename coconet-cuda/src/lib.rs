//! # coconet-cuda: the CUDA backend
//!
//! Kernels generated from the plan ([`codegen`]), compiled at run time
//! by NVRTC, launched by one executor (a device job) on a device.
//!
//! Unlike the original CoCoNet, nothing is edited or rebuilt per program: the fused
//! pointwise kernels, the fused all-reduce over peer memory (reduce my chunk from every
//! peer → computation → write to every peer) and the collectives are generated CUDA C;
//! matmuls are cuBLAS calls; an overlapped matmul releases the fused all-reduce of its
//! rows block by block through events between a compute and a communication stream.
//!
//! Ranks are *virtual*: P ranks' buffers on one GPU, peer pointers being same-device
//! pointers, so fused-collective kernels run and are checked on a single-GPU machine.
//!
//! Ranks with *separate memories* run the same program, each its own launches
//! (a rank job). Where they can map each other's buffers (CUDA IPC, peer access), the
//! kernels address peers directly and ranks meet at barriers; otherwise what a launch
//! reads from or writes to peers is exchanged before and after it (a transport: NCCL
//! between GPUs, mailboxes between emulated devices), large exchanges pipelined in chunks
//! against the kernels ([`PeerAccess`], [`Pipelining`]).
//! Backends: `Distributed` (a process per GPU, started by `coconet-launch`), `MultiGpu`
//! (a thread per GPU in this process; both with the `cuda` feature) and
//! [`EmulatedRanks`] (a thread per emulated device, for tests).
//!
//! Devices:
//! - [`Cuda`] (cargo feature `cuda`): a real GPU through cudarc. Creating it without a
//!   driver returns [`RuntimeError::Device`](coconet_plan::RuntimeError::Device) naming what is missing (cudarc would
//!   panic, so the libraries are probed first).
//! - [`Emulator`]: the generated source compiled as C++ and run on the host, thread by
//!   thread — the same kernels and the same executor, for tests without a GPU.
//!
//! The folders follow the data flow: [`codegen`] (the plan's steps as CUDA C) →
//! `actions` (each rank's ordered launches, copies, exchanges and barriers: exchanged or
//! mapped, and the stream race check) → `executors` (one device with virtual ranks, one
//! rank of many, rank jobs as threads) → `devices` (a GPU, the host emulator) →
//! `transports` (NCCL, CUDA IPC handles, in-process mailboxes) → `backends` (what users
//! construct).
//!
//! ```no_run
//! use coconet_core::*;
//! use coconet_cuda::EmulatedCuda;
//! use coconet_plan::{Backend, JobData, Plan};
//! # fn main() -> Result<(), coconet_plan::RuntimeError> {
//! let mut b = ProgramBuilder::new("sum");
//! let x = b.tensor_input("x", DType::F32, Layout::Local, Shape::new(vec![Dim::sym("N")]), 0).unwrap();
//! let y = b.all_reduce(ReduceOp::Sum, x).unwrap();
//! let p = b.finish();
//! let args = Bindings::new()
//!     .dim("N", 3)
//!     .tensor("x", Binding::per_rank(&[vec![1.0f32, 2.0, 3.0], vec![10.0, 20.0, 30.0]]));
//! let plan = Plan::lower(&Schedule::new(&p), 2, args.dims())?;
//! let mut job = EmulatedCuda.prepare(&plan, &args)?;
//! EmulatedCuda.run(&mut job)?;
//! assert_eq!(job.local::<f32>(y, 1), Some(vec![11.0, 22.0, 33.0]));
//! # Ok(()) }
//! ```

//!
//! # A training step on the caller's device memory
//!
//! A training loop's tensors already live on the GPU: the framework computed the
//! gradients there and holds the weights there. [`Lent`] lends them to one run — one
//! [`DeviceSlice`] per input and rank (from a cudarc `CudaSlice`, safely; from a raw
//! device pointer under the contract in [`DeviceSlice::from_raw`]), or a list of pieces
//! (one per parameter tensor) read as their concatenation — and the kernels read and
//! write them in place: an input the program updates (`update(w, …)`) is updated in the
//! caller's memory, with no copy through the host. [`PreparedJob::run_after`] queues the run
//! after an event of the caller's stream (and after the lent slices' own streams) and
//! hands back the event its work ends at, with no device-wide synchronisation; reads
//! take the value's own dtype, into a host slice ([`DeviceData::read`]) or the caller's
//! device memory ([`DeviceData::read_to`]), and download one rank's data only.
//!
//! [`PreparedJob::use_graph`] replays the step's launches as CUDA graphs (one for each
//! run of launches between other work): built at the first run, updated where a
//! launch's scalars or lent addresses changed, each queued with one driver call.
//!
//! On the emulator a host slice stands for device memory, so the same loop runs (and is
//! tested) without a GPU:
//!
//! ```
//! use coconet_core::*;
//! use coconet_plan::{Backend, JobData, Plan};
//! use coconet_cuda::{DeviceSlice, EmulatedCuda, Lent};
//! # fn main() -> Result<(), coconet_plan::RuntimeError> {
//! // w ← w − lr · Σ_ranks g, on one virtual rank.
//! let mut b = ProgramBuilder::new("sgd");
//! let n = Shape::new(vec![Dim::sym("N")]);
//! let g = b.tensor_input("g", DType::F32, Layout::Local, n.clone(), 0).unwrap();
//! let w = b.tensor_input("w", DType::F32, Layout::Replicated, n, 0).unwrap();
//! let lr = b.scalar_input("lr", DType::F32).unwrap();
//! let g1 = b.all_reduce(ReduceOp::Sum, g).unwrap();
//! let step = b.binary(BinaryOp::Mul, lr, g1).unwrap();
//! let w1 = b.binary(BinaryOp::Sub, w, step).unwrap();
//! b.update(w, w1).unwrap();
//! let p = b.finish();
//! let args = Bindings::new()
//!     .dim("N", 4)
//!     .tensor("g", Binding::per_rank(&[vec![0.0f32; 4]]))
//!     .tensor("w", Binding::global(&[0.0f32; 4]))
//!     .scalar("lr", 0.5f32);
//! let plan = Plan::lower(&Schedule::new(&p), 1, args.dims())?;
//! let mut job = EmulatedCuda.prepare(&plan, &args)?;
//! // The model's memory (device memory on a GPU: `DeviceSlice::cuda(&mut slice)`).
//! let mut weights = vec![1.0f32; 4];
//! for _ in 0..3 {
//!     let mut grads = vec![1.0f32; 4]; // this iteration's backward pass
//!     let lent = Lent::new()
//!         .input("w", 0, DeviceSlice::host(&mut weights))
//!         .input("g", 0, DeviceSlice::host(&mut grads));
//!     let _done = job.run_after(&lent, None)?; // wait on it before using the weights
//! }
//! assert_eq!(weights, vec![-0.5f32; 4]);
//! # Ok(()) }
//! ```

mod actions;
mod backends;
pub mod codegen;
mod devices;
mod executors;
mod lent;
mod transports;

pub use actions::exchanged::Pipelining;
#[cfg(feature = "cuda")]
pub use backends::distributed::{Distributed, DistributedJob};
pub use backends::emulated_ranks::{EmulatedRanks, EmulatedRanksJob};
#[cfg(feature = "cuda")]
pub use backends::multi_gpu::{MultiGpu, MultiGpuJob};
#[cfg(feature = "cuda")]
pub use backends::one_device::CudaJob;
pub use backends::one_device::{Cuda, EmulatedCuda, EmulatedJob, PreparedJob};
pub use backends::with_access::{AccessChoice, WithAccess, access_label};
#[cfg(not(feature = "cuda"))]
pub use backends::without_cuda::{
    CudaJob, Distributed, DistributedJob, MultiGpu, MultiGpuJob, NoGpuJob,
};
pub use codegen::CudaProgram;
/// The cudarc the CUDA backend is built on (feature `cuda`): lend its `CudaSlice`s with
/// [`DeviceSlice::cuda`] and order with its events, from the same version.
#[cfg(feature = "cuda")]
pub use cudarc;
pub use devices::emulator::Emulator;
#[cfg(feature = "cuda")]
pub use devices::gpu::{compile, compile_cubin, driver_present, nvrtc_present};
pub use executors::launch_graph::GraphStats;
pub use executors::rank_job::PeerAccess;
pub use executors::reads::DeviceData;
pub use lent::{DeviceSlice, Lent, Memory};
#[cfg(test)]
pub(crate) use transports::mailboxes::{Mailbox, Mailboxes};
