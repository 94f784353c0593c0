//! HeterPS's data management: exactly-once loading, errors naming the file and line.

use coconet_heterps::data::{
    Batch, ClickLogFormat, Dataset, GeneratorConfig, Loader, LoaderConfig,
};
use std::path::{Path, PathBuf};

fn dataset(dir: &Path, files: usize, rows: usize) -> Dataset {
    Dataset::generate(
        dir,
        &GeneratorConfig {
            files,
            rows_per_file: rows,
            heldout_rows: 10,
            seed: 5,
            ..GeneratorConfig::default()
        },
    )
    .unwrap()
}

/// Every record of `files` read once, in order, as text lines.
fn all_lines(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The batch's records as comparable rows (label, dense bits, keys).
fn records(b: &Batch) -> Vec<(u32, Vec<u32>, Vec<u64>)> {
    (0..b.len())
        .map(|i| {
            (
                b.labels[i].to_bits(),
                b.dense[i * 13..(i + 1) * 13]
                    .iter()
                    .map(|x| x.to_bits())
                    .collect(),
                b.keys[i * 26..(i + 1) * 26].to_vec(),
            )
        })
        .collect()
}

#[test]
fn every_record_is_read_exactly_once_per_epoch_by_the_replicas_together() {
    let dir = tempfile::tempdir().unwrap();
    // Files of different lengths, so batches span files and the last one is short.
    let data = dataset(dir.path(), 7, 37);
    let files = data.train_paths(dir.path());
    let format = ClickLogFormat::default();
    let mut expected = Batch::default();
    for line in all_lines(&files) {
        format.parse_line(&line, &mut expected).unwrap();
    }
    let mut expected = records(&expected);
    expected.sort();
    for replicas in [1, 2, 3] {
        let mut orders = Vec::new();
        for epoch in 0..3 {
            let mut seen = Vec::new();
            let mut first_files = Vec::new();
            for replica in 0..replicas {
                let loader = Loader::new(
                    files.clone(),
                    LoaderConfig {
                        batch: 16,
                        replica,
                        replicas,
                        shuffle: Some(11),
                        prefetch: 2,
                        format,
                    },
                )
                .unwrap();
                first_files.extend(loader.files_for(epoch));
                for batch in loader.epoch(epoch) {
                    let batch = batch.unwrap();
                    assert!(batch.len() <= 16 && !batch.is_empty());
                    seen.extend(records(&batch));
                }
            }
            seen.sort();
            assert_eq!(seen, expected, "{replicas} replicas, epoch {epoch}");
            orders.push(first_files);
        }
        assert!(
            orders.windows(2).any(|w| w[0] != w[1]),
            "shuffling changes the order of the files between epochs"
        );
    }
}

#[test]
fn a_malformed_line_is_an_error_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 2, 20);
    let files = data.train_paths(dir.path());
    let mut text = std::fs::read_to_string(&files[1]).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[12] = "1\tnot a record";
    text = lines.join("\n");
    std::fs::write(&files[1], text).unwrap();
    let loader = Loader::new(
        files.clone(),
        LoaderConfig {
            batch: 8,
            shuffle: None,
            ..LoaderConfig::default()
        },
    )
    .unwrap();
    let results: Vec<_> = loader.epoch(0).collect();
    let e = results.last().unwrap().as_ref().unwrap_err().to_string();
    assert!(
        e.contains("part-00001.tsv:13: expected 40 tab-separated fields"),
        "{e}"
    );
    // The records before the bad line were delivered; nothing after it.
    let delivered: usize = results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(Batch::len)
        .sum();
    assert_eq!(delivered, 32);

    std::fs::remove_file(&files[0]).unwrap();
    let e = loader.epoch(0).next().unwrap().unwrap_err().to_string();
    assert!(e.contains("part-00000.tsv"), "{e}");
}

#[test]
fn a_loader_dropped_mid_epoch_stops_its_reader() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 2, 400);
    let loader = Loader::new(
        data.train_paths(dir.path()),
        LoaderConfig {
            batch: 4,
            prefetch: 1,
            ..LoaderConfig::default()
        },
    )
    .unwrap();
    let mut epoch = loader.epoch(0);
    assert!(epoch.next().unwrap().is_ok());
    drop(epoch); // joins the reader, which is blocked on a full channel: must not hang
}

#[test]
fn bad_loader_configs_are_errors() {
    let files = vec![PathBuf::from("a.tsv"), PathBuf::from("b.tsv")];
    for (config, want) in [
        (
            LoaderConfig {
                replicas: 3,
                ..LoaderConfig::default()
            },
            "2 files cannot be shared by 3 replicas",
        ),
        (
            LoaderConfig {
                replica: 2,
                replicas: 2,
                ..LoaderConfig::default()
            },
            "replica 2 of 2",
        ),
        (
            LoaderConfig {
                batch: 0,
                ..LoaderConfig::default()
            },
            "batch must be positive",
        ),
    ] {
        let e = Loader::new(files.clone(), config).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}
