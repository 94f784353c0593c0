//! The tuner's cache: one JSON file of choices, each under the key of what it was
//! measured for, so a training script tunes once per program, size and machine.
//!
//! The key hashes the printed program and every candidate's printed schedule with
//! FNV-1a (a fixed, documented function: std's hasher may change between Rust releases,
//! which would silently empty every cache). A file that cannot be read is a cache miss
//! with a note, never an error: tuning again is always correct.

use super::options::TuneOptions;
use super::tuning::{Measurement, Tuning};
use super::variant::Variant;
use coconet_core::{Bindings, Program, Schedule};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

/// The version of the file's layout; entries of another version are ignored.
const VERSION: u64 = 1;

/// FNV-1a, 64 bits.
pub(crate) struct Fnv(u64);

impl Fnv {
    pub(crate) fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    pub(crate) fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

/// What a choice was measured for.
pub(crate) struct Key(Value);

impl Key {
    pub(crate) fn new<B>(
        program: &Program,
        candidates: &[Schedule],
        variants: &[Variant<B>],
        ranks: usize,
        bindings: &Bindings,
        options: &TuneOptions,
    ) -> Key {
        let schedules: Vec<&Schedule> = candidates.iter().collect();
        let labels: Vec<&str> = variants.iter().map(|v| v.label.as_str()).collect();
        Key::of(
            program,
            &schedules,
            &labels,
            ranks,
            bindings.dims(),
            options,
        )
    }

    /// The key of `schedules` of `program` under knob settings `labels`, at `dims` on
    /// `ranks` ranks, for the options' backend and machine.
    pub(crate) fn of(
        program: &Program,
        schedules: &[&Schedule],
        labels: &[&str],
        ranks: usize,
        dims: &std::collections::BTreeMap<String, usize>,
        options: &TuneOptions,
    ) -> Key {
        let mut h = Fnv::new();
        h.write(program.to_string().as_bytes());
        for s in schedules {
            h.write(s.name().as_bytes());
            h.write(&[0]);
            h.write(s.to_string().as_bytes());
            h.write(&[0]);
        }
        Key(json!({
            "program": program.name(),
            "hash": format!("{:016x}", h.finish()),
            "variants": labels,
            "dims": dims,
            "ranks": ranks,
            "backend": options.backend,
            "machine": options.machine,
        }))
    }
}

/// The cached choice for `key`, if the file at `path` holds one; why the file could not
/// be read, if it exists and cannot.
pub(crate) fn lookup(path: &Path, key: &Key) -> Result<Option<Tuning>, String> {
    let Some(entries) = read(path)? else {
        return Ok(None);
    };
    for e in entries {
        if e.get("key") == Some(&key.0) {
            return decode(&e).map(Some).ok_or_else(|| {
                format!(
                    "the tune cache {} has a malformed entry; tuning again",
                    path.display()
                )
            });
        }
    }
    Ok(None)
}

/// Writes `tuning` under `key` into the file at `path` (replacing an entry with the
/// same key; the file is replaced atomically); why not, if it cannot be written.
pub(crate) fn store(path: &Path, key: &Key, tuning: &Tuning) -> Result<(), String> {
    let mut entries = read(path).ok().flatten().unwrap_or_default();
    entries.retain(|e| e.get("key") != Some(&key.0));
    entries.push(json!({ "key": key.0, "best": encode(&tuning.best), "table": tuning.table.iter().map(encode).collect::<Vec<_>>() }));
    let text = serde_json::to_string_pretty(&json!({ "version": VERSION, "entries": entries }))
        .map_err(|e| e.to_string())?;
    let fail =
        |e: std::io::Error| format!("could not write the tune cache {}: {e}", path.display());
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

/// The entries of the cache file (`None` if there is none).
fn read(path: &Path) -> Result<Option<Vec<Value>>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(format!(
                "could not read the tune cache {}: {e}; tuning again",
                path.display()
            ));
        }
    };
    let value: Value = serde_json::from_str(&text).map_err(|e| {
        format!(
            "the tune cache {} is not valid JSON ({e}); tuning again",
            path.display()
        )
    })?;
    if value.get("version").and_then(Value::as_u64) != Some(VERSION) {
        return Ok(Some(Vec::new()));
    }
    Ok(Some(
        value
            .get("entries")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    ))
}

fn encode(m: &Measurement) -> Value {
    json!({
        "schedule": m.schedule, "schedule_index": m.schedule_index,
        "variant": m.variant, "variant_index": m.variant_index,
        "median_ns": m.median.as_nanos() as u64, "min_ns": m.min.as_nanos() as u64,
        "max_ns": m.max.as_nanos() as u64, "bytes_per_rank": m.bytes_per_rank,
    })
}

fn decode_measurement(v: &Value) -> Option<Measurement> {
    let s = |k: &str| v.get(k)?.as_str().map(String::from);
    let n = |k: &str| v.get(k)?.as_u64();
    Some(Measurement {
        schedule: s("schedule")?,
        schedule_index: n("schedule_index")? as usize,
        variant: s("variant")?,
        variant_index: n("variant_index")? as usize,
        median: Duration::from_nanos(n("median_ns")?),
        min: Duration::from_nanos(n("min_ns")?),
        max: Duration::from_nanos(n("max_ns")?),
        bytes_per_rank: n("bytes_per_rank")?,
    })
}

fn decode(e: &Value) -> Option<Tuning> {
    Some(Tuning {
        best: decode_measurement(e.get("best")?)?,
        table: e
            .get("table")?
            .as_array()?
            .iter()
            .map(decode_measurement)
            .collect::<Option<_>>()?,
        rejected: Vec::new(),
        from_cache: true,
        notes: Vec::new(),
    })
}
