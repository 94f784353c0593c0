#![doc = include_str!("../README.md")]

/// Data-parallel training of candle models with coconet's fused optimizer step.
#[cfg(feature = "candle")]
pub use coconet_candle as candle;

/// The built-in optimizer programs: what the data-parallel trainer runs, and what
/// HeterPS's synchronisation model prices.
pub use coconet_programs as programs;

/// HeterPS's stage synchronisation priced by coconet's schedules and cost model.
#[cfg(feature = "hetero")]
pub use coconet_heterps::hetero_sync;

/// Running HeterPS's models with coconet's fused step for the dense synchronisation.
#[cfg(feature = "heterps")]
pub use coconet_heterps as heterps;

/// The language: types, program IR, checker, reference interpreter, printing.
pub use coconet_core as core;
/// HeterPS: hardware-type scheduling and provisioning at minimum cost (the planner,
/// `coconet-hetero`), with the data management and training that run its plans
/// (`coconet-heterps`).
#[cfg(feature = "hetero")]
pub mod hetero {
    pub use coconet_hetero::*;
    pub use coconet_heterps::{data, train};
}
/// Turns a training step written as a Rust function into a checked coconet program.
pub use coconet_macros::coconet;
/// Plans and backends that execute programs.
pub use coconet_runtime as runtime;
/// Who may join a job (the job secret and the handshake every connection runs) and what
/// on disk may be believed.
pub use coconet_trust as trust;

/// The names of the README's path: a `#[coconet]` program, its arguments and the
/// reference interpreter; its schedules (built by hand, the paper's candidates, or the
/// sharded-update recipe); the plan they lower to; and the CPU job that runs it every
/// step, read through [`JobData`](coconet_runtime::JobData) like every backend's job.
pub mod prelude {
    pub use crate::coconet;
    pub use coconet_core::half::{bf16, f16};
    pub use coconet_core::interp::TensorArg;
    pub use coconet_core::schedule::{Schedule, candidates, sharded_update};
    pub use coconet_core::{
        Binding, Bindings, DType, Execution, InterpError, Layout, Program, ProgramBuilder,
        interpret,
    };
    pub use coconet_runtime::cpu::{Job, RunOptions};
    pub use coconet_runtime::{Backend, JobData, Plan, RuntimeError};
}
