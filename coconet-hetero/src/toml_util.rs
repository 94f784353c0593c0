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

/// The kinds of input file, told apart by their top-level keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// A model ([`crate::model`]).
    Model,
    /// A catalogue ([`crate::catalog`]).
    Catalogue,
}

impl FileKind {
    /// What it is called in messages.
    fn name(self) -> &'static str {
        match self {
            FileKind::Model => "model file",
            FileKind::Catalogue => "catalogue",
        }
    }

    /// The other kind.
    fn other(self) -> Self {
        match self {
            FileKind::Model => FileKind::Catalogue,
            FileKind::Catalogue => FileKind::Model,
        }
    }

    /// Top-level keys only this kind has.
    fn keys(self) -> &'static [&'static str] {
        match self {
            FileKind::Model => &[
                "layers",
                "batch_size",
                "batch_sizes",
                "input_bytes",
                "constraint",
            ],
            FileKind::Catalogue => &[
                "types",
                "links",
                "hosts",
                "parameter_server",
                "default_bandwidth_gbs",
                "billing_minimum_s",
                "link_latency_us",
            ],
        }
    }

    /// The arrays of named tables whose entries an error inside names: the key and what
    /// an entry is called.
    fn entries(self) -> &'static [(&'static str, &'static str)] {
        match self {
            FileKind::Model => &[("layers", "layer")],
            FileKind::Catalogue => &[("types", "type"), ("hosts", "host")],
        }
    }
}

/// Parse `text` (read from `path`) as a file of `kind` into `T`, turning parse errors
/// into [`InputError::Syntax`], with two explanations the schema's error lacks: a
/// file of the other kind is called that ([`InputError::WrongKind`]), and an error
/// inside an entry of a named array (a catalogue's `[[types]]`, a model's `[[layers]]`)
/// names the entry (`type `t4`: missing field `price_per_hour``).
pub(crate) fn parse_as<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
    kind: FileKind,
) -> Result<T, InputError> {
    toml::from_str(text).map_err(|e| explain(path, text, kind, &e))
}

/// The bytes a value spans in its document, all of its keys and values included: an
/// entry of an array of tables spans its header, and its keys follow it.
fn extent(v: &toml::Spanned<toml::de::DeValue<'_>>) -> std::ops::Range<usize> {
    let mut r = v.span();
    let mut widen = |s: std::ops::Range<usize>| {
        r.start = r.start.min(s.start);
        r.end = r.end.max(s.end);
    };
    match v.get_ref() {
        toml::de::DeValue::Table(t) => {
            for (k, item) in t.iter() {
                widen(k.span());
                widen(extent(item));
            }
        }
        toml::de::DeValue::Array(a) => {
            for item in a.iter() {
                widen(extent(item));
            }
        }
        _ => {}
    }
    r
}

/// The error `e` from reading `text` as a `kind`, explained where the document shows why.
fn explain(path: &Path, text: &str, kind: FileKind, e: &toml::de::Error) -> InputError {
    let at = e.span().map(|s| s.start);
    let message = e.message().trim().to_string();
    let syntax = |message: String| InputError::Syntax {
        path: path.to_path_buf(),
        line: at.map_or(0, |a| line_of(text, a)),
        message,
    };
    // Not TOML at all: nothing to explain.
    let Ok(doc) = toml::de::DeTable::parse(text) else {
        return syntax(message);
    };
    let doc = doc.get_ref();
    let present = |k: FileKind| -> Vec<&'static str> {
        k.keys()
            .iter()
            .copied()
            .filter(|key| doc.get(*key).is_some())
            .collect()
    };
    let (own, other) = (present(kind), present(kind.other()));
    if own.is_empty() && !other.is_empty() {
        return InputError::WrongKind {
            path: path.to_path_buf(),
            found: kind.other().name(),
            expected: kind.name(),
            keys: other
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", "),
        };
    }
    let Some(at) = at else {
        return syntax(message);
    };
    for &(key, what) in kind.entries() {
        let Some(toml::de::DeValue::Array(items)) = doc.get(key).map(|v| v.get_ref()) else {
            continue;
        };
        let Some((i, entry)) = items
            .iter()
            .enumerate()
            .find(|(_, item)| extent(item).contains(&at))
        else {
            continue;
        };
        let name = match entry.get_ref() {
            toml::de::DeValue::Table(t) => match t.get("name").map(|v| v.get_ref()) {
                Some(toml::de::DeValue::String(name)) => Some(name.to_string()),
                _ => None,
            },
            _ => None,
        };
        return syntax(match name {
            Some(name) => format!("{what} `{name}`: {message}"),
            None => format!("{what} number {} (it has no name): {message}", i + 1),
        });
    }
    syntax(message)
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
