//! A machine's parameters for the cost model, read from and written to TOML.

use super::Links;
use serde::{Deserialize, Serialize};

/// What the cost model knows of a machine. Every number says where it comes from in
/// `source` (measured by [`calibrate`](super::calibrate), or a datasheet).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// A name for tables.
    pub name: String,
    /// Where the numbers come from.
    pub source: String,
    /// Ranks sharing one memory system and one set of cores: every rank of a CPU
    /// node's rank threads; 1 for GPUs (each has its own memory).
    pub ranks_per_memory: usize,
    /// Bytes per second one memory system moves (copy bandwidth: read + written).
    pub memory_bandwidth: f64,
    /// Cores of one memory system that run ranks in parallel.
    pub cores: f64,
    /// Seconds per element per pointwise stage on one core (data in cache).
    pub stage_seconds: f64,
    /// Seconds per element per source of a rank-ordered reduction on one core.
    pub reduce_seconds: f64,
    /// Seconds per element of a dropout stage on one core (its Philox draw).
    pub dropout_seconds: f64,
    /// Matmul flop/s of one core (or one GPU), f32 and wider operands.
    pub flops: f64,
    /// Matmul flop/s with f16 or bf16 operands (a GPU's tensor cores); `None`: the
    /// same as `flops`.
    #[serde(default)]
    pub half_flops: Option<f64>,
    /// Seconds of one barrier, per rank taking part (spinning ranks on shared cores
    /// cost more as there are more of them).
    pub barrier_seconds_per_rank: f64,
    /// Fixed seconds of a step on a rank (setting up a kernel or an operation).
    pub step_seconds: f64,
    /// Fixed seconds of a run (waking the ranks, the final barrier).
    pub run_seconds: f64,
    /// Whether memory traffic and computation overlap (a GPU's kernels: the slower
    /// bounds a step), or add up (CPU rank threads: a core computing is not loading).
    pub compute_overlaps_memory: bool,
    /// Links between the ranks of a node and between nodes, where peers' memory is not
    /// this memory (GPUs); `None` on one CPU, whose collectives are memory traffic.
    pub links: Option<Links>,
}

/// Parameter sets shipped with the library ([`Machine::preset`]): `dgx2-v100`, the
/// machine of CoCoNet's paper, and `dgx-h100`. Each file gives the source of every
/// number.
pub const PRESETS: &[(&str, &str)] = &[
    ("dgx2-v100", include_str!("machines/dgx2-v100.toml")),
    ("dgx-h100", include_str!("machines/dgx-h100.toml")),
];

impl Machine {
    /// A shipped parameter set by name (see [`PRESETS`]).
    pub fn preset(name: &str) -> Result<Machine, String> {
        let (_, text) = PRESETS.iter().find(|(n, _)| *n == name).ok_or_else(|| {
            let known: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
            format!("no machine preset {name:?}; presets: {}", known.join(", "))
        })?;
        Machine::from_toml(text)
    }

    /// Reads a machine from TOML text.
    pub fn from_toml(text: &str) -> Result<Machine, String> {
        toml::from_str(text).map_err(|e| format!("machine parameters: {e}"))
    }

    /// The machine as TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a Machine serialises")
    }
}
