//! Errors of the checker (compile time for `#[coconet]`, build time for the builder API).

use thiserror::Error;

/// The class of a checking error; the macro's tests cover one case of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Element types do not agree, or the op does not accept the dtype.
    DType,
    /// Layouts are incompatible for the op (e.g. `all_gather` of a non-Sliced tensor).
    Layout,
    /// Shapes do not broadcast or do not match (symbolic dims compare by name).
    Shape,
    /// Values live in different process groups, or a send leaves the world.
    Group,
    /// `update` of something that is not a tensor input, or of one input twice.
    Update,
    /// A name bound twice, or an unknown name, op or argument.
    Binding,
    /// Anything else about how the op was called (arity, argument kinds).
    Usage,
}

/// Which part of the operation the error is about, so the macro can point at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Blame {
    /// The operation as a whole.
    Op,
    /// The operand at this position (0-based, in the order the op takes them).
    Operand(usize),
}

/// A program that violates the typing/layout rules.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct CheckError {
    /// The class of error.
    pub kind: ErrorKind,
    /// What is wrong, naming the operation and its operands' types.
    pub message: String,
    /// The offending part of the operation.
    pub blame: Blame,
}

impl CheckError {
    /// An error about the operation as a whole.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> CheckError {
        CheckError {
            kind,
            message: message.into(),
            blame: Blame::Op,
        }
    }

    /// Points the error at operand `i`.
    pub fn at(mut self, i: usize) -> CheckError {
        self.blame = Blame::Operand(i);
        self
    }
}
