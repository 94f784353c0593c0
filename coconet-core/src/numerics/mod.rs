//! The arithmetic every backend reproduces bit for bit, defined once: the order of full
//! reductions and of row sums, exact max and min, layer normalisation of a row, the
//! Philox counter-based RNG behind `dropout`, and row-major tensor helpers. The
//! reference interpreter and every backend take them from here, so a backend depends on
//! the numerics, never on the interpreter.

pub mod philox;
mod reduce;
mod rows;
pub mod tensor;

pub use reduce::{REDUCE_BLOCK, REDUCE_LANES, ReduceAcc, ReduceKind, max_exact, min_exact};
pub use rows::{ROW_LANES, layer_norm_row, row_sum};
