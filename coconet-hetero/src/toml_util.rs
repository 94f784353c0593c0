//! Reading TOML with positions, so every error can point at a line.

use std::path::Path;

use crate::error::InputError;

/// 1-based line number of byte `offset` in `text`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Parse `text` (read from `path`) into `T`, turning parse errors into [`InputError::Syntax`].
pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
) -> Result<T, InputError> {
    toml::from_str(text).map_err(|e| InputError::Syntax {
        path: path.to_path_buf(),
        line: e.span().map(|s| line_of(text, s.start)).unwrap_or(0),
        message: e.message().trim().to_string(),
    })
}

/// Read a file into a string.
pub(crate) fn read(path: &Path) -> Result<String, InputError> {
    std::fs::read_to_string(path).map_err(|source| InputError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Builds [`InputError::Invalid`] errors for one file.
pub(crate) struct Ctx<'a> {
    pub path: &'a Path,
    pub text: &'a str,
}

impl Ctx<'_> {
    /// An error at byte offset `at`.
    pub fn invalid(&self, at: usize, message: impl Into<String>) -> InputError {
        InputError::Invalid {
            path: self.path.to_path_buf(),
            line: line_of(self.text, at),
            message: message.into(),
        }
    }

    /// Checks that `v` is finite and ≥ 0 (or > 0 when `positive`).
    pub fn non_negative(
        &self,
        at: usize,
        what: &str,
        v: f64,
        positive: bool,
    ) -> Result<f64, InputError> {
        let ok = v.is_finite() && if positive { v > 0.0 } else { v >= 0.0 };
        if ok {
            Ok(v)
        } else {
            let need = if positive { "> 0" } else { ">= 0" };
            Err(self.invalid(at, format!("{what} must be finite and {need}, got {v}")))
        }
    }
}
