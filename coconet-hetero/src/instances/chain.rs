//! The synthetic chain the planners bench, the `large_chain` and `chain_toml` examples
//! and the scale tests plan: four resource types (a CPU server, T4, A100, H100) and
//! layers of three kinds.

use crate::{Catalog, Model, Problem};
use std::path::Path;

/// The four resource types, as a catalogue TOML.
pub const CATALOG: &str = r#"
default_bandwidth_gbs = 1.5625
[[types]]
name = "cpu"
class = "cpu"
price_per_hour = 1.36
memory_gib = 64
peak_tflops = 3.58
mem_bandwidth_gbs = 102.4
efficiency = 0.5
layer_overhead_us = 10
sync_bandwidth_gbs = 1.5625
[[types]]
name = "t4"
class = "gpu"
price_per_hour = 0.526
memory_gib = 16
peak_tflops = 65
mem_bandwidth_gbs = 320
efficiency = 0.35
layer_overhead_us = 60
sync_bandwidth_gbs = 3.125
[[types]]
name = "a100"
class = "gpu"
price_per_hour = 4.096
memory_gib = 40
peak_tflops = 312
mem_bandwidth_gbs = 1555
efficiency = 0.45
layer_overhead_us = 60
sync_bandwidth_gbs = 6.25
[[types]]
name = "h100"
class = "gpu"
price_per_hour = 12.29
memory_gib = 80
peak_tflops = 989
mem_bandwidth_gbs = 3350
efficiency = 0.45
layer_overhead_us = 60
sync_bandwidth_gbs = 50
"#;

/// A chain of `layers` layers mixing embedding, FC and transformer-sized layers
/// (deterministic), required 2,000 samples/s.
pub fn model_toml(layers: u64) -> String {
    let mut s = format!(
        "name = \"synthetic-{layers}\"\nbatch_size = 64\n[constraint]\nthroughput = 2000.0\nsamples = 1e9\n",
    );
    for l in 0..layers {
        let scale = 1.0 + ((l * 7919) % 13) as f64;
        let (kind, flops, act, dense) = match l % 10 {
            0 => ("embedding", 1e8, 2e6, 0.0),
            1..=6 => ("fc", 2e10 * scale, 4e6, 4e6 * scale),
            _ => ("transformer", 1e11 * scale, 8e6, 2e7 * scale),
        };
        s += &format!(
            "[[layers]]\nname = \"l{l}\"\nkind = \"{kind}\"\nflops = {flops}\nbytes = {}\nactivation_bytes = {act}\ndense_param_bytes = {dense}\n",
            flops / 50.0
        );
    }
    s
}

/// [`CATALOG`] with `caps` appended to its types in order (`None`: uncapped).
pub fn catalog_toml(caps: &[Option<u64>]) -> String {
    let mut catalog_toml = String::new();
    for (i, part) in CATALOG.split("[[types]]").enumerate() {
        if i > 0 {
            catalog_toml += "[[types]]";
        }
        catalog_toml += part;
        if let Some(Some(cap)) = i.checked_sub(1).and_then(|t| caps.get(t)) {
            catalog_toml += &format!("cap = {cap}\n");
        }
    }
    catalog_toml
}

/// The chain over [`CATALOG`], with `caps` appended to the catalogue's types in order
/// (`None`: uncapped).
///
/// The TOML is generated here, so parsing it cannot fail (a failure is a bug of this
/// module: it panics).
pub fn problem(layers: u64, caps: &[Option<u64>]) -> Problem {
    let catalog_toml = catalog_toml(caps);
    let catalog = Catalog::parse(Path::new("bench-catalog.toml"), &catalog_toml).expect("catalog");
    let model =
        Model::parse(Path::new("bench-model.toml"), &model_toml(layers), &catalog).expect("model");
    let c = model.constraint.expect("constraint");
    Problem::new(model, catalog, c)
}
