//! # coconet-backend-suite: the test suite every coconet backend passes
//!
//! One test suite for every backend (as CubeCL's `testgen_all!`): every example program ×
//! every candidate schedule × P in {1, 2, 3, 4, 8}, sizes that do not divide P, run on
//! the backend and compared with the reference interpreter running the same schedule:
//! bitwise (elementwise work, collectives and reductions use the interpreter's order);
//! within one f16 ulp where a matmul is involved (gemm sums in another order). Replicated
//! outputs must be bitwise identical on every rank, and two runs identical.
//!
//! coconet's own backends run it (the CPU rank threads, TCP processes, the CUDA
//! emulator, GPUs); a backend written elsewhere — a crate implementing
//! `coconet_plan::Backend` — runs the same suite from one line of a test file:
//!
//! ```ignore
//! // tests/suite.rs of a backend crate, with `coconet-backend-suite` as a dev-dependency
//! coconet_backend_suite::backend_suite!(my_backend::MyBackend::new());
//! // or on chosen rank counts:
//! coconet_backend_suite::backend_suite!(my_backend::MyBackend::new(), [1, 2, 4]);
//! ```
//!
//! The programs are `coconet-example-programs`' (SGD, Adam, LAMB, Megatron's layer, a
//! pipeline stage) and a set of op-by-op programs of the suite's own.

mod suite;

/// The library, as the suite names it (the crate using the suite need not depend on it
/// under that name).
#[doc(hidden)]
pub use coconet as __coconet;
/// The example programs, as the suite names them.
#[doc(hidden)]
pub use coconet_example_programs as __programs;
