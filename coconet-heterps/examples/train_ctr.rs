//! Trains CTR-DNN on synthetic click logs with its embedding table in a sharded
//! parameter server, and checks the held-out AUC against the best achievable one (the
//! hidden truth's). Exits non-zero if the model falls short.
//!
//! `cargo run --release -p coconet-hetero --example train_ctr [-- --files 16 --rows 8192 --epochs 2]`
//! (about 10 s at the defaults: 262,144 records, one epoch).

use clap::Parser;
use coconet_heterps::data::{
    ClickLogFormat, Dataset, GeneratorConfig, Loader, LoaderConfig, ParamServer, ParamServerConfig,
};
use coconet_heterps::train::{CtrDnn, CtrDnnConfig, TrainConfig, evaluate, train};
use std::path::PathBuf;

#[derive(Parser)]
struct Args {
    /// Training files to generate.
    #[arg(long, default_value_t = 8)]
    files: usize,
    /// Records per training file.
    #[arg(long, default_value_t = 32768)]
    rows: usize,
    /// Distinct values of the largest categorical slot.
    #[arg(long, default_value_t = 2000)]
    cardinality: u64,
    /// Epochs.
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Records per batch.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Parameter-server shards.
    #[arg(long, default_value_t = 4)]
    shards: usize,
    /// Where to write the data (a temporary directory if not given).
    #[arg(long)]
    data: Option<PathBuf>,
    /// How far below the optimal AUC the model may end (what remains at the default
    /// size is the finite sample: the truth weighs rare categories the model sees a few
    /// times).
    #[arg(long, default_value_t = 0.035)]
    tolerance: f64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let temp = tempfile::tempdir()?;
    let dir = args
        .data
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    let dataset = Dataset::generate(
        &dir,
        &GeneratorConfig {
            files: args.files,
            rows_per_file: args.rows,
            heldout_rows: 16_384,
            max_cardinality: args.cardinality,
            ..GeneratorConfig::default()
        },
    )?;
    println!(
        "data: {} files x {} records in {}; held-out optimum AUC {:.4}, log loss {:.4}, click rate {:.3}",
        args.files,
        args.rows,
        dir.display(),
        dataset.optimal_auc,
        dataset.optimal_log_loss,
        dataset.click_rate
    );
    let format = ClickLogFormat::default();
    let ps = ParamServer::new(ParamServerConfig {
        shards: args.shards,
        ..ParamServerConfig::default()
    })?;
    let model = CtrDnn::new(CtrDnnConfig::default())?;
    let loader = Loader::new(
        dataset.train_paths(&dir),
        LoaderConfig {
            batch: args.batch,
            format,
            ..LoaderConfig::default()
        },
    )?;
    let heldout = dir.join(&dataset.heldout);
    let before = evaluate(&model, &ps, &heldout, format)?;
    let (model, report) = train(
        model,
        &ps,
        &loader,
        &TrainConfig {
            epochs: args.epochs,
            ..TrainConfig::default()
        },
    )?;
    let after = evaluate(&model, &ps, &heldout, format)?;
    let rows: usize = ps.stats().iter().map(|s| s.rows).sum();
    println!(
        "trained {} steps, {} samples in {:.2} s: {:.0} samples/s; {} embedding rows",
        report.steps,
        report.samples,
        report.seconds,
        report.samples_per_second(),
        rows
    );
    println!(
        "held-out AUC {:.4} -> {:.4} (optimum {:.4}), log loss {:.4} -> {:.4} (optimum {:.4})",
        before.auc,
        after.auc,
        dataset.optimal_auc,
        before.log_loss,
        after.log_loss,
        dataset.optimal_log_loss
    );
    if after.auc < dataset.optimal_auc - args.tolerance {
        return Err(format!(
            "AUC {:.4} is more than {} below the optimum {:.4}",
            after.auc, args.tolerance, dataset.optimal_auc
        )
        .into());
    }
    println!("ok: within {} of the best achievable AUC", args.tolerance);
    Ok(())
}
