//! coconet-runtime: lowering schedules to per-rank plans and executing them (CPU rank
//! threads, MPI, CUDA). Not yet implemented: programs currently run on
//! [`coconet_core::interpret`], the reference interpreter.

pub use coconet_core::interpret;
