//! A machine's parameters for the cost model, read from and written to TOML.

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
    /// Matmul flop/s of one core (or one GPU).
    pub flops: f64,
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

/// α–β parameters of the links between ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Links {
    /// Ranks per node.
    pub ranks_per_node: usize,
    /// Latency of a message inside a node (s).
    pub intra_alpha: f64,
    /// Bandwidth a rank sends at inside a node (B/s).
    pub intra_beta: f64,
    /// Latency of a message between nodes (s).
    pub inter_alpha: f64,
    /// Bandwidth a rank sends at between nodes (B/s).
    pub inter_beta: f64,
}

impl Machine {
    /// Reads a machine from TOML text.
    pub fn from_toml(text: &str) -> Result<Machine, String> {
        toml::from_str(text).map_err(|e| format!("machine parameters: {e}"))
    }

    /// The machine as TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a Machine serialises")
    }
}
