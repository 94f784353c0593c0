//! Errors of the data-management module: each names the file (and line) to fix.

use std::path::PathBuf;

/// Why data could not be written, read or applied.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file could not be opened, read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A line of a click log is not a record.
    #[error("{path}:{line}: {message}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// A parameter server in another process failed or could not be reached.
    #[error("parameter server {addr}: {message}")]
    Remote {
        /// The server's address.
        addr: String,
        /// What happened.
        message: String,
    },
    /// A configuration value or an argument is invalid.
    #[error("{0}")]
    Invalid(String),
}

impl DataError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> DataError {
        DataError::Io {
            path: path.into(),
            source,
        }
    }
}
