//! # coconet
//!
//! Write a distributed training step — gradients, collectives, optimizer update, a
//! tensor-parallel layer, a pipeline stage — as a `#[coconet]` function. The program is
//! checked at compile time (dtypes, layouts, symbolic shapes), can be run on the reference
//! interpreter, and (in later layers) transformed into faster schedules and executed on CPU
//! ranks or GPUs. [`hetero`] plans which hardware each layer runs on.
//!
//! See the crate README for a tour.

pub use coconet_core as core;
pub use coconet_hetero as hetero;
pub use coconet_macros::coconet;
pub use coconet_runtime as runtime;

/// The names a `#[coconet]` user needs.
pub mod prelude {
    pub use crate::coconet;
    pub use coconet_core::half::{bf16, f16};
    pub use coconet_core::interp::TensorArg;
    pub use coconet_core::{
        Binding, Bindings, DType, Execution, InterpError, Layout, Program, ProgramBuilder,
        interpret,
    };
}
