//! Why a transformation was refused.

use crate::CheckError;
use thiserror::Error;

/// A transformation whose preconditions do not hold.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{transformation}: {message}")]
pub struct ScheduleError {
    /// The transformation (`split`, `reorder`, ...).
    pub transformation: &'static str,
    /// Which precondition failed, and why.
    pub message: String,
}

impl ScheduleError {
    pub(crate) fn new(transformation: &'static str, message: impl Into<String>) -> ScheduleError {
        ScheduleError {
            transformation,
            message: message.into(),
        }
    }

    pub(crate) fn check(transformation: &'static str, e: CheckError) -> ScheduleError {
        ScheduleError::new(
            transformation,
            format!("the rewritten program does not check: {}", e.message),
        )
    }
}

/// "a reduce" / "an all_reduce": an op name with its article, for messages.
pub(crate) fn article(op: &str) -> String {
    let an = op.starts_with(['a', 'e', 'i', 'o', 'u']);
    format!("{} {op}", if an { "an" } else { "a" })
}
