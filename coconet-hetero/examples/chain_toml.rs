//! Writes the planners bench's synthetic chain (`instances::chain`) as a model and a
//! catalogue TOML, for timing the `coconet-hetero` CLI on it at any length:
//!
//! ```text
//! cargo run --release -p coconet-hetero --example chain_toml -- 10000 0 64 64 0 /tmp/chain
//! cargo build --release -p coconet-hetero --features cli
//! target/release/coconet-hetero plan --model /tmp/chain/model.toml --catalog /tmp/chain/catalog.toml
//! ```
//!
//! Arguments: the number of layers, a cap per type (cpu, t4, a100, h100; 0 for none),
//! then the directory to write `model.toml` and `catalog.toml` to.

use std::path::PathBuf;

use coconet_hetero::instances::chain;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: chain_toml LAYERS CAP_CPU CAP_T4 CAP_A100 CAP_H100 DIR";
    let [layers, caps @ .., dir] = args.as_slice() else {
        return Err(usage.into());
    };
    let number = |s: &String| {
        s.parse::<u64>()
            .map_err(|_| format!("`{s}` is not a whole number; {usage}"))
    };
    let layers = number(layers)?;
    let caps = caps
        .iter()
        .map(|c| number(c).map(|c| (c > 0).then_some(c)))
        .collect::<Result<Vec<_>, _>>()?;
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (name, text) in [
        ("model.toml", chain::model_toml(layers)),
        ("catalog.toml", chain::catalog_toml(&caps)),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    println!(
        "{layers} layers, caps {caps:?}: {}",
        dir.join("model.toml").display()
    );
    Ok(())
}
