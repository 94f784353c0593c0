//! CTR-DNN with its table in the parameter server learns the synthetic truth, and
//! training is deterministic (the base of bitwise checkpoint/resume).

use coconet_hetero::data::{
    ClickLogFormat, Dataset, GeneratorConfig, Loader, LoaderConfig, ParamServer, ParamServerConfig,
};
use coconet_hetero::train::{CtrDnn, CtrDnnConfig, TrainConfig, evaluate, train};
use std::path::Path;

fn small_run(dir: &Path, data: &Dataset) -> (CtrDnn, ParamServer, f64, Vec<f32>) {
    let format = ClickLogFormat { vocabulary: 50_021 };
    let ps = ParamServer::new(ParamServerConfig {
        shards: 3,
        ..ParamServerConfig::default()
    })
    .unwrap();
    let model = CtrDnn::new(CtrDnnConfig {
        hidden: vec![32, 16],
        ..CtrDnnConfig::default()
    })
    .unwrap();
    let loader = Loader::new(
        data.train_paths(dir),
        LoaderConfig {
            batch: 128,
            format,
            ..LoaderConfig::default()
        },
    )
    .unwrap();
    let report = train(
        &model,
        &ps,
        &loader,
        &TrainConfig {
            epochs: 2,
            learning_rate: 3e-3,
        },
    )
    .unwrap();
    assert_eq!(report.samples, 2 * 4 * 2048);
    let auc = evaluate(&model, &ps, &dir.join(&data.heldout), format)
        .unwrap()
        .auc;
    (model, ps, auc, report.losses)
}

#[test]
fn ctr_dnn_learns_the_hidden_truth_and_trains_deterministically() {
    let dir = tempfile::tempdir().unwrap();
    let data = Dataset::generate(
        dir.path(),
        &GeneratorConfig {
            files: 4,
            rows_per_file: 2048,
            heldout_rows: 4096,
            max_cardinality: 200,
            ..GeneratorConfig::default()
        },
    )
    .unwrap();
    let (model, ps, auc, losses) = small_run(dir.path(), &data);
    println!("held-out AUC {auc:.4}, optimum {:.4}", data.optimal_auc);
    let first: f32 = losses[..8].iter().sum::<f32>() / 8.0;
    let last: f32 = losses[losses.len() - 8..].iter().sum::<f32>() / 8.0;
    assert!(last < first - 0.05, "the loss falls: {first} -> {last}");
    assert!(
        auc > data.optimal_auc - 0.08 && auc > 0.7,
        "held-out AUC {auc} vs optimum {}",
        data.optimal_auc
    );

    // The same seeds give the same parameters, bit for bit.
    let (again, ps_again, auc_again, losses_again) = small_run(dir.path(), &data);
    assert_eq!(losses, losses_again);
    assert_eq!(auc, auc_again);
    assert_eq!(ps.rows(), ps_again.rows());
    for (a, b) in model.vars().iter().zip(again.vars()) {
        let (a, b) = (
            a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        assert_eq!(a, b);
    }
}
