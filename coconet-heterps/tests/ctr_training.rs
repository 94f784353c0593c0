//! CTR-DNN with its table in the parameter server learns the synthetic truth; training
//! is deterministic, and a run stopped at a checkpoint and resumed ends with the same
//! parameters, bit for bit, as one that was not stopped.

use coconet_heterps::data::{
    ClickLogFormat, Dataset, GeneratorConfig, Loader, LoaderConfig, ParamServer, ParamServerConfig,
};
use coconet_heterps::train::{AdamConfig, CtrDnn, CtrDnnConfig, TrainConfig, Trainer, evaluate};
use std::path::Path;

const FORMAT: ClickLogFormat = ClickLogFormat { vocabulary: 50_021 };

fn data(dir: &Path) -> Dataset {
    Dataset::generate(
        dir,
        &GeneratorConfig {
            files: 4,
            rows_per_file: 2048,
            heldout_rows: 4096,
            max_cardinality: 200,
            ..GeneratorConfig::default()
        },
    )
    .unwrap()
}

fn table(shards: usize) -> ParamServer {
    ParamServer::new(ParamServerConfig {
        shards,
        ..ParamServerConfig::default()
    })
    .unwrap()
}

fn model() -> CtrDnn {
    CtrDnn::new(CtrDnnConfig {
        hidden: vec![32, 16],
        ..CtrDnnConfig::default()
    })
    .unwrap()
}

fn loader(dir: &Path, data: &Dataset) -> Loader {
    Loader::new(
        data.train_paths(dir),
        LoaderConfig {
            batch: 128,
            format: FORMAT,
            ..LoaderConfig::default()
        },
    )
    .unwrap()
}

const CONFIG: TrainConfig = TrainConfig {
    epochs: 2,
    adam: AdamConfig {
        learning_rate: 3e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    },
};

/// Every dense parameter and every table row, as bits.
fn state(trainer: &Trainer<'_>, ps: &ParamServer) -> (Vec<Vec<u32>>, Vec<u64>, Vec<u32>, Vec<u32>) {
    let dense = trainer
        .model()
        .vars()
        .iter()
        .map(|v| {
            let x = v.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            x.iter().map(|x| x.to_bits()).collect()
        })
        .collect();
    let t = ps.export();
    let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect();
    (dense, t.keys, bits(&t.values), bits(&t.accum))
}

#[test]
fn ctr_dnn_learns_the_hidden_truth_and_trains_deterministically() {
    let dir = tempfile::tempdir().unwrap();
    let data = data(dir.path());
    let loader = loader(dir.path(), &data);
    let run = |shards| {
        let ps = table(shards);
        let mut trainer = Trainer::new(model(), &ps, CONFIG).unwrap();
        let report = trainer.train(&loader, None).unwrap();
        assert_eq!(report.samples, 2 * 4 * 2048);
        let auc = evaluate(
            trainer.model(),
            &ps,
            &dir.path().join(&data.heldout),
            FORMAT,
        )
        .unwrap()
        .auc;
        (state(&trainer, &ps), auc, report.losses)
    };
    let (state_a, auc, losses) = run(3);
    println!("held-out AUC {auc:.4}, optimum {:.4}", data.optimal_auc);
    let first: f32 = losses[..8].iter().sum::<f32>() / 8.0;
    let last: f32 = losses[losses.len() - 8..].iter().sum::<f32>() / 8.0;
    assert!(last < first - 0.05, "the loss falls: {first} -> {last}");
    assert!(
        auc > data.optimal_auc - 0.08 && auc > 0.7,
        "held-out AUC {auc} vs optimum {}",
        data.optimal_auc
    );
    // The same seeds give the same parameters, bit for bit, whatever the shard count.
    let (state_b, auc_b, losses_b) = run(5);
    assert_eq!(losses, losses_b);
    assert_eq!(auc, auc_b);
    assert!(
        state_a == state_b,
        "the parameters differ between two identical runs"
    );
}

#[test]
fn a_run_resumed_from_a_checkpoint_ends_bitwise_equal_to_one_never_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let data = data(dir.path());
    let loader = loader(dir.path(), &data);
    let ps = table(2);
    let mut straight = Trainer::new(model(), &ps, CONFIG).unwrap();
    straight.train(&loader, None).unwrap();
    let expected = state(&straight, &ps);

    // Stopped mid-epoch (step 21 of 64 per epoch) and in the second epoch, each time
    // resumed by a fresh process's worth of objects (new model, new empty table).
    let checkpoint = dir.path().join("ckpt.safetensors");
    let ps = table(3);
    let mut first = Trainer::new(model(), &ps, CONFIG).unwrap();
    first.train(&loader, Some(21)).unwrap();
    first.save(&checkpoint).unwrap();
    drop(first);
    let ps = table(4);
    let mut second = Trainer::new(model(), &ps, CONFIG).unwrap();
    second.restore(&checkpoint).unwrap();
    assert_eq!(second.progress().steps, 21);
    second.train(&loader, Some(70)).unwrap();
    assert_eq!(second.progress().epoch, 1);
    second.save(&checkpoint).unwrap();
    let ps = table(1);
    let mut third = Trainer::new(model(), &ps, CONFIG).unwrap();
    third.restore(&checkpoint).unwrap();
    let report = third.train(&loader, None).unwrap();
    assert_eq!(report.steps, 128 - 91);
    assert!(
        state(&third, &ps) == expected,
        "the resumed run's parameters differ"
    );
}

#[test]
fn a_checkpoint_that_does_not_fit_is_an_error_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = data(dir.path());
    let loader = loader(dir.path(), &data);
    let ps = table(2);
    let mut trainer = Trainer::new(model(), &ps, CONFIG).unwrap();
    trainer.train(&loader, Some(3)).unwrap();
    let checkpoint = dir.path().join("ckpt.safetensors");
    trainer.save(&checkpoint).unwrap();

    let other_ps = table(2);
    let wider = CtrDnn::new(CtrDnnConfig {
        hidden: vec![64, 16],
        ..CtrDnnConfig::default()
    })
    .unwrap();
    let mut other = Trainer::new(wider, &other_ps, CONFIG).unwrap();
    let before = state(&other, &other_ps);
    let e = other.restore(&checkpoint).unwrap_err().to_string();
    assert!(
        e.contains("ckpt.safetensors") && e.contains("`dense.0` has shape"),
        "{e}"
    );
    assert!(
        state(&other, &other_ps) == before,
        "a failed restore changed the worker"
    );

    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"not a checkpoint").unwrap();
    let e = trainer.restore(&garbage).unwrap_err().to_string();
    assert!(e.contains("garbage.safetensors"), "{e}");
    let e = trainer
        .restore(&dir.path().join("missing"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing"), "{e}");
}

/// One flipped bit in the weights or the progress, or a negated second moment, is refused
/// naming the file and the tensor, and the trainer is left as it was (issue 46: such
/// files resumed with `rc 0` and a ruined model, or "at epoch 17").
#[test]
fn a_corrupted_checkpoint_is_refused_naming_the_tensor_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = data(dir.path());
    let loader = loader(dir.path(), &data);
    let ps = table(2);
    let mut trainer = Trainer::new(model(), &ps, CONFIG).unwrap();
    trainer.train(&loader, Some(3)).unwrap();
    let checkpoint = dir.path().join("ckpt.safetensors");
    trainer.save(&checkpoint).unwrap();
    let good = std::fs::read(&checkpoint).unwrap();
    let (header, meta) = safetensors::SafeTensors::read_metadata(&good).unwrap();
    // Where tensor `name`'s bytes start in the file.
    let at = |name: &str| 8 + header + meta.info(name).unwrap().data_offsets.0;

    let other_ps = table(2);
    let mut other = Trainer::new(model(), &other_ps, CONFIG).unwrap();
    let before = state(&other, &other_ps);
    for (name, byte, mask) in [
        ("dense.0", 5, 0x08),
        ("progress", 0, 0x10),
        ("adam.v.1", 3, 0x80),
        ("table.values", 2, 0x01),
    ] {
        let mut bad = good.clone();
        bad[at(name) + byte] ^= mask;
        let path = dir.path().join("bad.safetensors");
        std::fs::write(&path, &bad).unwrap();
        let e = other.restore(&path).unwrap_err().to_string();
        assert!(
            e.contains("bad.safetensors") && e.contains(&format!("`{name}` is corrupt")),
            "{name}: {e}"
        );
        assert!(
            state(&other, &other_ps) == before,
            "a refused checkpoint changed the trainer"
        );
    }
    // The good file still restores.
    other.restore(&checkpoint).unwrap();
    assert_eq!(other.progress().steps, 3);
}
