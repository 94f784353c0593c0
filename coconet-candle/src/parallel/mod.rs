//! Tensor-parallel layers for candle (Megatron-LM's model parallelism) whose collectives
//! are coconet programs: each rank holds a shard of a layer's weights and runs its part
//! of the forward and backward pass; the all-reduces that join the parts run inside
//! candle's autograd ([`copy_to_parallel`], [`reduce_from_parallel`]).
//!
//! Ranks are threads of one process ([`TensorParallel::threads`]), processes over TCP
//! ([`TensorParallel::tcp`]), or threads whose models share one GPU (`TensorParallel::gpu`,
//! feature `cuda`: each collective one CUDA job with every rank virtual on the GPU, the
//! ranks' tensors lent to it in place, nothing through the host;
//! [`TensorParallel::emulated_gpu`] runs that path on the host emulator); each rank's
//! thread builds its shards from the whole model (`shard`), runs forward and backward as
//! with candle-nn's layers, and can put the whole layers back together (`gather`). Results
//! equal the single-device model's up to the order of the sums over ranks (rank order, the
//! same every run).
//!
//! ```
//! use candle_core::{Device, Module, Tensor};
//! use candle_nn::{Activation, Linear};
//! use coconet_candle::parallel::{ParallelMlp, TensorParallel};
//!
//! let (h, dev) = (64, Device::Cpu);
//! let fc = Linear::new(Tensor::randn(0f32, 0.02, (4 * h, h), &dev)?, None);
//! let proj = Linear::new(Tensor::randn(0f32, 0.02, (h, 4 * h), &dev)?, None);
//! let x = Tensor::randn(0f32, 1.0, (8, h), &dev)?;
//! let whole = proj.forward(&Activation::NewGelu.forward(&fc.forward(&x)?)?)?;
//! std::thread::scope(|s| {
//!     let ranks: Vec<_> = TensorParallel::threads(2).into_iter().map(|tp| {
//!         let (fc, proj, x, whole) = (&fc, &proj, &x, &whole);
//!         s.spawn(move || -> candle_core::Result<()> {
//!             let mlp = ParallelMlp::shard(fc, Activation::NewGelu, proj, &tp)?;
//!             let y = mlp.forward(x)?; // the whole output, on every rank
//!             let off = (&y - whole)?.abs()?.max_all()?.to_scalar::<f32>()?;
//!             assert!(off < 1e-5);
//!             let grads = y.sqr()?.sum_all()?.backward()?;
//!             assert!(grads.get(mlp.vars()[0].as_tensor()).is_some()); // fc's shard
//!             Ok(())
//!         })
//!     }).collect();
//!     ranks.into_iter().try_for_each(|r| r.join().expect("a rank panicked"))
//! })?;
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! The sequence-parallel variant ([`gather_from_sequence_parallel`],
//! [`scatter_to_sequence_parallel`], each layer's `forward_sequence_parallel`) keeps only
//! each rank's block of the tokens between the tensor-parallel regions.
//!
//! [`dropout`] draws each element's mask from its index in the whole tensor (coconet's
//! counter-based `dropout`), so ranks holding slices draw the single-device model's masks;
//! `forward_residual` takes one for Megatron's bias-dropout-add inside the all-reduce;
//! `forward_residual_norm` fuses the layer norm that follows in too
//! ([`reduce_bias_residual_norm`]), each rank normalising only its block of the rows.
//!
//! `with_overlap` on the layers (and [`ParallelMlp::with_overlap`]) overlaps a matmul with
//! its all-reduce, as the paper does for Megatron-LM's layer: the row-parallel product in
//! row chunks, each chunk's all-reduce running on the rank's communication thread while
//! the next is computed; the column-parallel input gradient's all-reduce while the
//! weight's gradient is computed.
//!
//! Not yet: the fused epilogue of the sequence-parallel variant, overlap inside the fused
//! epilogue (`forward_residual`); on a GPU, dropout's masks drawn on the device (they are
//! drawn on the host), the overlapped layers (their forward is the CPU's), ranks on
//! several GPUs or processes.

mod attention;
mod collective;
mod device_group;
mod dropout;
mod epilogue;
mod epilogue_norm;
mod group;
mod linear;
mod mlp;
mod ops;
mod overlap;
mod sequence;
mod storage;
mod vocab;

pub use attention::ParallelAttention;
pub use dropout::{Dropout, dropout, dropout_slice};
pub use epilogue::reduce_bias_residual;
pub use epilogue_norm::{NORM_EPS, reduce_bias_residual_norm};
pub use group::TensorParallel;
pub use linear::{ColumnParallelLinear, RowParallelLinear};
pub use mlp::ParallelMlp;
pub use ops::{copy_to_parallel, reduce_from_parallel};
pub use sequence::{gather_from_sequence_parallel, scatter_to_sequence_parallel};
pub use vocab::{VocabParallelEmbedding, vocab_parallel_cross_entropy};
