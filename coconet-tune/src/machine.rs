//! What the tuner knows of this machine: where it caches by default, what identifies
//! the machine, how much memory is free.

use std::path::PathBuf;

/// Where [`tune`](super::tune()) caches its choices by default: `$COCONET_TUNE_CACHE`
/// (empty: no cache), else `$XDG_CACHE_HOME/coconet/tune.json`, else
/// `~/.cache/coconet/tune.json`.
pub fn default_cache_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("COCONET_TUNE_CACHE") {
        return (!p.is_empty()).then(|| PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("coconet").join("tune.json"))
}

/// What identifies this machine to the cache: the CPU model, the logical CPUs this
/// process may use and the memory (GiB), so a choice measured elsewhere is not reused.
pub fn machine_fingerprint() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let gib = meminfo("MemTotal:").map_or(0, |b| (b + (1 << 29)) >> 30);
    format!("{model}, {cpus} CPUs, {gib} GiB")
}

/// Bytes of memory available now (`/proc/meminfo`; 4 GiB where it cannot be read).
pub(crate) fn available_memory() -> u64 {
    meminfo("MemAvailable:").unwrap_or(4 << 30)
}

/// A `/proc/meminfo` field, in bytes.
fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}
