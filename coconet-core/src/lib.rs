//! # coconet-core: the coconet language
//!
//! Types ([`DType`], [`Shape`], [`Layout`]), the typed program IR ([`Program`]), the checker
//! ([`ProgramBuilder`], shared by the `#[coconet]` macro and code that builds programs
//! directly), the reference interpreter ([`interpret`], the semantics oracle for every
//! transformation and backend), and printing ([`Program`]'s `Display`, [`to_dot`]).
//!
//! Data flow: `#[coconet] fn` → [`ProgramBuilder`] → [`Program`] → [`interpret`].

mod builder;
mod dtype;
mod error;
pub mod handle;
pub mod interp;
mod layout;
mod op;
mod print;
mod program;
mod shape;

pub use builder::{Operand, ProgramBuilder};
pub use dtype::{DType, Element};
pub use error::{Blame, CheckError, ErrorKind};
pub use interp::{Binding, Bindings, Execution, InterpError, interpret};
pub use layout::{Layout, block_range};
pub use op::{BinaryOp, Direction, ReduceKind, ReduceOp, UnaryOp};
pub use print::to_dot;
pub use program::{Node, Op, Placement, Program, ValueId, ValueType};
pub use shape::{Dim, Shape};

pub use half;
