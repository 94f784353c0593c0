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
    /// Bytes of one memory system's last-level cache; 0 where not modelled (presets).
    /// A run whose buffers fill at most a quarter of it moves its bytes at
    /// `cache_bandwidth`, one that fills half or more at `memory_bandwidth`, linearly
    /// in between: the rest of the cache holds what else the training step touches
    /// (activations, other jobs).
    #[serde(default)]
    pub cache_bytes: f64,
    /// Bytes per second the cores move through that cache (read + written, all cores);
    /// 0 where not measured: cache traffic free beyond the stages.
    #[serde(default)]
    pub cache_bandwidth: f64,
    /// Cores of one memory system that run ranks in parallel.
    pub cores: f64,
    /// Seconds per element per pointwise stage on one core (data in cache).
    pub stage_seconds: f64,
    /// Seconds per element per source of a rank-ordered reduction on one core (the
    /// collectives' element-wise sums across ranks).
    pub reduce_seconds: f64,
    /// Seconds per element of the sum a fused all-reduce's compiled kernel computes in
    /// its loop (each element's sources summed in f64 in rank order), whatever the
    /// number of sources: on rank threads it measured the same at 2 and 4 ranks (1.98
    /// and 0.99 ns per source), bound by reading the peers' blocks rather than by the
    /// additions. 0 where not measured: priced at `reduce_seconds` per source.
    #[serde(default)]
    pub compiled_reduce_seconds: f64,
    /// Seconds per element of a full reduction to one value on one core (a norm, a
    /// `reduce_all`); 0 where not measured: priced at `reduce_seconds`.
    #[serde(default)]
    pub full_reduce_seconds: f64,
    /// Seconds per f16 or bf16 element-stage or reduced element on one core beyond its
    /// f32 cost (the conversions to and from the half type); 0 where not measured
    /// (presets: GPUs convert in registers).
    #[serde(default)]
    pub half_conversion_seconds: f64,
    /// Seconds per element of a dropout stage on one core (its Philox draw).
    pub dropout_seconds: f64,
    /// Seconds per element of a layer norm on one core beyond a pointwise stage (its
    /// row statistics); 0 where not measured (presets: a stage's cost).
    #[serde(default)]
    pub layer_norm_seconds: f64,
    /// Matmul flop/s of one core (or one GPU), f32 and wider operands.
    pub flops: f64,
    /// Matmul flop/s with f16 or bf16 operands (a GPU's tensor cores); `None`: the
    /// same as `flops`.
    #[serde(default)]
    pub half_flops: Option<f64>,
    /// Seconds per operand or result element of a matmul with f32 or wider operands on
    /// one core (converting it between the buffer's dtype and the product's working
    /// precision): what a small or thin product costs beyond its flops. 0 where not
    /// measured (presets).
    #[serde(default)]
    pub matmul_element_seconds: f64,
    /// The same with f16 or bf16 operands.
    #[serde(default)]
    pub half_matmul_element_seconds: f64,
    /// Seconds of one barrier, per rank taking part (spinning ranks on shared cores
    /// cost more as there are more of them).
    pub barrier_seconds_per_rank: f64,
    /// Fixed seconds of a step on a rank (setting up a kernel or an operation).
    pub step_seconds: f64,
    /// Fixed seconds of a run beyond waking its ranks (the final barrier).
    pub run_seconds: f64,
    /// Seconds per rank of starting a run (waking a rank that idled since the last
    /// one); 0 where not measured (presets: GPUs launch from a host thread per rank).
    #[serde(default)]
    pub wake_seconds_per_rank: f64,
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

    /// Reads a machine from TOML text, and checks it ([`Machine::check`]).
    pub fn from_toml(text: &str) -> Result<Machine, String> {
        let m: Machine = toml::from_str(text).map_err(|e| format!("machine parameters: {e}"))?;
        m.check()?;
        Ok(m)
    }

    /// Refuses parameters that would price a step at no time, negative time or
    /// forever: rates and bandwidths must be positive (flop rates may be infinite: free),
    /// costs finite and not negative, protocol efficiencies in (0, 1], and links need a
    /// protocol. The error names the parameter.
    pub fn check(&self) -> Result<(), String> {
        let bad =
            |what: &str, v: f64| Err(format!("machine parameters: {what} = {v} is out of range"));
        for (what, v) in [
            ("memory_bandwidth", self.memory_bandwidth),
            ("cores", self.cores),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(what, v);
            }
        }
        for (what, v) in [
            ("flops", self.flops),
            ("half_flops", self.half_flops.unwrap_or(1.0)),
        ] {
            if v.is_nan() || v <= 0.0 {
                return bad(what, v);
            }
        }
        for (what, v) in [
            ("stage_seconds", self.stage_seconds),
            ("reduce_seconds", self.reduce_seconds),
            ("compiled_reduce_seconds", self.compiled_reduce_seconds),
            ("full_reduce_seconds", self.full_reduce_seconds),
            ("dropout_seconds", self.dropout_seconds),
            ("layer_norm_seconds", self.layer_norm_seconds),
            ("half_conversion_seconds", self.half_conversion_seconds),
            ("matmul_element_seconds", self.matmul_element_seconds),
            (
                "half_matmul_element_seconds",
                self.half_matmul_element_seconds,
            ),
            ("barrier_seconds_per_rank", self.barrier_seconds_per_rank),
            ("step_seconds", self.step_seconds),
            ("run_seconds", self.run_seconds),
            ("wake_seconds_per_rank", self.wake_seconds_per_rank),
            ("cache_bytes", self.cache_bytes),
            ("cache_bandwidth", self.cache_bandwidth),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(what, v);
            }
        }
        if let Some(l) = &self.links {
            for (what, v) in [
                ("links.intra_beta", l.intra_beta),
                ("links.inter_beta", l.inter_beta),
            ] {
                if !(v.is_finite() && v > 0.0) {
                    return bad(what, v);
                }
            }
            if l.protocols.is_empty() {
                return Err("machine parameters: links.protocols is empty".into());
            }
            for p in &l.protocols {
                if !(p.efficiency > 0.0 && p.efficiency <= 1.0) {
                    return bad(
                        &format!("links.protocols[{}].efficiency", p.name),
                        p.efficiency,
                    );
                }
                let latencies = [&p.ring].into_iter().chain(p.tree.as_ref());
                for lat in latencies {
                    for v in [lat.base, lat.intra_hop, lat.inter_hop] {
                        if !(v.is_finite() && v >= 0.0) {
                            return bad(&format!("links.protocols[{}] latency", p.name), v);
                        }
                    }
                }
            }
            if let Some(n) = &l.in_network
                && !(n.bandwidth.is_finite() && n.bandwidth > 0.0 && n.latency >= 0.0)
            {
                return bad("links.in_network.bandwidth", n.bandwidth);
            }
        }
        Ok(())
    }

    /// The machine as TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a Machine serialises")
    }
}
