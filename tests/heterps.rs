//! HeterPS's synchronous data-parallel CTR-DNN (coconet's fused Adam for the dense
//! layers, merged pushes to the parameter server) equals single-worker training on the
//! same global batches: measured 2e-7 relative on the losses and dense weights, 2e-5 on
//! the embedding rows after 12 steps (the order of floating-point sums differs); the same
//! for a pipeline of data-parallel stages with micro-batches.
#![cfg(feature = "heterps")]

use coconet::hetero::data::{
    ClickLogFormat, Dataset, GeneratorConfig, Loader, LoaderConfig, ParamServer, ParamServerConfig,
};
use coconet::hetero::train::{AdamConfig, CtrDnn, CtrDnnConfig, TrainConfig, Trainer};
use coconet::heterps::{CtrDataParallel, CtrPipeline, StagePlan};
use std::path::Path;

use coconet_test_support::loopback;

const FORMAT: ClickLogFormat = ClickLogFormat { vocabulary: 50_021 };

fn dataset(dir: &Path, files: usize) -> Dataset {
    Dataset::generate(
        dir,
        &GeneratorConfig {
            files,
            rows_per_file: 512,
            heldout_rows: 64,
            max_cardinality: 200,
            ..GeneratorConfig::default()
        },
    )
    .unwrap()
}

fn table() -> ParamServer {
    ParamServer::new(ParamServerConfig {
        shards: 2,
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

fn loader(dir: &Path, data: &Dataset, batch: usize, replica: usize, replicas: usize) -> Loader {
    Loader::new(
        data.train_paths(dir),
        LoaderConfig {
            batch,
            replica,
            replicas,
            shuffle: None,
            format: FORMAT,
            ..LoaderConfig::default()
        },
    )
    .unwrap()
}

fn flat(model: &CtrDnn) -> Vec<f32> {
    model
        .vars()
        .iter()
        .flat_map(|v| v.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .collect()
}

/// Every bit of the dense layers and of the table: what "bitwise equal" compares.
type Bits = (Vec<u32>, Vec<u64>, Vec<u32>);

fn bits(model: &CtrDnn, ps: &ParamServer) -> Bits {
    let t = ps.export();
    (
        flat(model).iter().map(|x| x.to_bits()).collect(),
        t.keys,
        t.values.iter().map(|x| x.to_bits()).collect(),
    )
}

/// Largest |a - b| relative to the largest |b|.
fn deviation(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn data_parallel_ctr_dnn_equals_one_worker_on_the_global_batch() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 4);
    let adam = AdamConfig {
        learning_rate: 3e-3,
        ..AdamConfig::default()
    };
    for workers in [2, 4] {
        let (ps_one, ps_many) = (table(), table());
        let mut one = Trainer::new(model(), &ps_one, TrainConfig { epochs: 1, adam }).unwrap();
        let mut many = CtrDataParallel::new(model(), &ps_many, workers, adam).unwrap();
        let global = loader(dir.path(), &data, 128, 0, 1);
        let (mut losses_one, mut losses_many) = (Vec::new(), Vec::new());
        for batch in global.epoch(0).take(12) {
            let batch = batch.unwrap();
            losses_one.push(one.step(&batch).unwrap());
            losses_many.push(many.step(&batch.split(workers)).unwrap());
        }
        let (loss_dev, dense_dev) = (
            deviation(&losses_many, &losses_one),
            deviation(&flat(many.model()), &flat(one.model())),
        );
        let (a, b) = (ps_many.export(), ps_one.export());
        assert_eq!(a.keys, b.keys, "the same rows exist");
        let rows_dev = deviation(&a.values, &b.values);
        println!(
            "{workers} workers: deviation of losses {loss_dev:.2e}, dense {dense_dev:.2e}, rows {rows_dev:.2e}"
        );
        assert!(loss_dev < 1e-5, "losses deviate by {loss_dev}");
        assert!(dense_dev < 1e-5, "dense weights deviate by {dense_dev}");
        assert!(rows_dev < 2e-4, "embedding rows deviate by {rows_dev}");
        assert_eq!(many.steps(), 12);
    }
}

/// A data-parallel run stopped mid-epoch, saved and resumed in a fresh trainer with a
/// fresh table ends bitwise where an uninterrupted run does; another worker count
/// restores it, another model's is refused and changes nothing.
#[test]
fn data_parallel_training_resumed_from_a_checkpoint_ends_bitwise_equal() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 4);
    let adam = AdamConfig::default();
    let loaders: Vec<Loader> = (0..2)
        .map(|w| loader(dir.path(), &data, 100, w, 2))
        .collect();
    let ps = table();
    let mut straight = CtrDataParallel::new(model(), &ps, 2, adam).unwrap();
    straight.train(&loaders, 2, None).unwrap();
    assert_eq!(straight.steps(), 22);
    let expected = bits(straight.model(), &ps);

    let checkpoint = dir.path().join("dp.safetensors");
    let ps = table();
    let mut first = CtrDataParallel::new(model(), &ps, 2, adam).unwrap();
    assert_eq!(first.train(&loaders, 2, Some(15)).unwrap().steps, 15);
    first.save(&checkpoint).unwrap();
    drop(first);
    let ps = table();
    let mut resumed = CtrDataParallel::new(model(), &ps, 2, adam).unwrap();
    resumed.restore(&checkpoint).unwrap();
    let p = resumed.progress();
    assert_eq!(
        (p.epoch, p.batch, p.steps),
        (1, 4, 15),
        "11 batches per epoch"
    );
    let report = resumed.train(&loaders, 2, None).unwrap();
    assert_eq!(report.steps, 22 - 15);
    assert!(
        bits(resumed.model(), &ps) == expected,
        "the resumed trainer's parameters differ"
    );

    // The optimizer state is whole tensors: another worker count restores it.
    let ps_three = table();
    let mut three = CtrDataParallel::new(model(), &ps_three, 3, adam).unwrap();
    three.restore(&checkpoint).unwrap();
    assert_eq!(three.progress().steps, 15);

    // Another model's checkpoint is refused and changes nothing.
    let wider = || {
        CtrDnn::new(CtrDnnConfig {
            hidden: vec![48, 16],
            ..CtrDnnConfig::default()
        })
        .unwrap()
    };
    let ps_wide = table();
    let mut wide = CtrDataParallel::new(wider(), &ps_wide, 2, adam).unwrap();
    let before = bits(wide.model(), &ps_wide);
    match wide.restore(&checkpoint) {
        Err(e) => assert!(e.to_string().contains("dp.safetensors"), "{e}"),
        Ok(()) => panic!("another model's checkpoint was restored"),
    }
    assert!(bits(wide.model(), &ps_wide) == before);
}

#[test]
fn data_parallel_training_reads_each_worker_share_and_refuses_uneven_shares() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 4);
    let ps = table();
    let mut dp = CtrDataParallel::new(model(), &ps, 2, AdamConfig::default()).unwrap();
    let loaders: Vec<Loader> = (0..2)
        .map(|w| loader(dir.path(), &data, 100, w, 2))
        .collect();
    let report = dp.train(&loaders, 2, None).unwrap();
    assert_eq!(report.samples, 2 * 4 * 512, "every record once per epoch");
    assert_eq!(
        report.steps,
        2 * 11,
        "1024 records per worker in batches of 100"
    );

    let uneven = tempfile::tempdir().unwrap();
    let uneven_data = dataset(uneven.path(), 3);
    let loaders: Vec<Loader> = (0..2)
        .map(|w| loader(uneven.path(), &uneven_data, 100, w, 2))
        .collect();
    let ps_uneven = table();
    let mut fresh = CtrDataParallel::new(model(), &ps_uneven, 2, AdamConfig::default()).unwrap();
    let e = fresh.train(&loaders, 1, None).unwrap_err().to_string();
    assert!(
        e.contains("worker 1 ran out of data at batch 6 of epoch 0"),
        "{e}"
    );
    let e = dp.step(&[]).unwrap_err().to_string();
    assert!(e.contains("0 batches for 2 workers"), "{e}");
}

/// One worker per process (`CtrProcess`: the table's shard served by worker 0 over TCP,
/// the dense step over TCP; the processes here are threads on loopback, talking as
/// processes do) trains bitwise as `CtrDataParallel` with the workers as threads.
#[test]
fn workers_as_processes_with_a_remote_table_train_as_workers_as_threads() {
    use coconet::hetero::data::{PsServer, RemoteTable};
    use coconet::heterps::CtrProcess;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 4);
    let workers = 2;
    let ps = table();
    let mut threads = CtrDataParallel::new(model(), &ps, workers, AdamConfig::default()).unwrap();
    let loaders: Vec<Loader> = (0..workers)
        .map(|w| loader(dir.path(), &data, 64, w, workers))
        .collect();
    let want = threads.train(&loaders, 1, None).unwrap();
    let server = PsServer::start(
        "127.0.0.1:0",
        table(),
        workers,
        Duration::from_secs(30),
        loopback::secret(),
    )
    .unwrap();
    let addrs = vec![server.local_addr().to_string()];
    let name = loopback::group_name();
    let got = loopback::per_process(workers, |w| {
        let remote = RemoteTable::connect(
            &addrs,
            w,
            workers,
            9,
            Duration::from_secs(10),
            loopback::secret(),
        )
        .unwrap();
        let tcp = loopback::connect(w, workers, &name).unwrap();
        let mut process = CtrProcess::new(model(), remote, tcp, AdamConfig::default()).unwrap();
        let report = process.train(&loaders[w], 1).unwrap();
        (report.losses, flat(process.model()))
    });
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (w, (losses, weights)) in got.iter().enumerate() {
        assert_eq!(losses.len(), want.losses.len(), "worker {w}");
        assert_eq!(
            bits(weights),
            bits(&flat(threads.model())),
            "worker {w}'s dense weights"
        );
    }
    // The threads' loss is the mean of the workers' losses.
    for (step, &mean) in want.losses.iter().enumerate() {
        let ours = (got[0].0[step] + got[1].0[step]) / workers as f32;
        assert_eq!(ours.to_bits(), mean.to_bits(), "step {step}");
    }
    assert_eq!(server.table().export(), ps.export());
}

fn stage(first: usize, last: usize, replicas: usize) -> StagePlan {
    StagePlan {
        first,
        last,
        replicas,
        threads: 1,
    }
}

#[test]
fn a_pipeline_of_data_parallel_stages_equals_one_worker_on_the_global_batch() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 4);
    let adam = AdamConfig {
        learning_rate: 3e-3,
        ..AdamConfig::default()
    };
    // Layers: 0 embedding, 1..=3 fc1..fc3 (hidden 32, 16), so fc3 is the 16 -> 2 output.
    let plans: [(&str, Vec<StagePlan>, usize); 3] = [
        ("one stage, one replica", vec![stage(0, 3, 1)], 1),
        (
            "embedding alone, then 2 x fc1-fc3",
            vec![stage(0, 0, 1), stage(1, 3, 2)],
            4,
        ),
        (
            "2 x emb+fc1, 1 x fc2, 3 x fc3, uneven micro-batches",
            vec![stage(0, 1, 2), stage(2, 2, 1), stage(3, 3, 3)],
            6,
        ),
    ];
    for (name, stages, micro) in plans {
        let (ps_one, ps_pipe) = (table(), table());
        let mut one = Trainer::new(model(), &ps_one, TrainConfig { epochs: 1, adam }).unwrap();
        let mut pipe = CtrPipeline::new(model(), &ps_pipe, &stages, micro, adam).unwrap();
        // 128 records: 6 micro-batches of 21 or 22.
        let global = loader(dir.path(), &data, 128, 0, 1);
        let (mut losses_one, mut losses_pipe) = (Vec::new(), Vec::new());
        for batch in global.epoch(0).take(8) {
            let batch = batch.unwrap();
            losses_one.push(one.step(&batch).unwrap());
            losses_pipe.push(pipe.step(&batch).unwrap());
        }
        let got = (losses_pipe, flat(pipe.model()), ps_pipe.export());
        assert_like_one_worker(name, got, (losses_one, flat(one.model()), ps_one.export()));
    }
}

/// A run's losses, dense weights and table.
type Trained = (Vec<f32>, Vec<f32>, coconet::hetero::data::TableSnapshot);

/// `got` (a pipeline's run) equals one worker's run `want` on the same global batches up
/// to the order of floating-point sums.
fn assert_like_one_worker(name: &str, got: Trained, want: Trained) {
    let ((losses, dense, rows), (losses_one, dense_one, rows_one)) = (got, want);
    assert_eq!(rows.keys, rows_one.keys, "{name}: the same rows exist");
    let (loss_dev, dense_dev, rows_dev) = (
        deviation(&losses, &losses_one),
        deviation(&dense, &dense_one),
        deviation(&rows.values, &rows_one.values),
    );
    println!(
        "{name}: deviation of losses {loss_dev:.2e}, dense {dense_dev:.2e}, rows {rows_dev:.2e}"
    );
    assert!(loss_dev < 1e-5, "{name}: losses deviate by {loss_dev}");
    assert!(
        dense_dev < 1e-5,
        "{name}: dense weights deviate by {dense_dev}"
    );
    // Adagrad's first step on a row is lr·sign(g): a row whose gradient nearly cancels
    // over the batch turns rounding into a visible difference (measured 2.8e-4).
    assert!(
        rows_dev < 1e-3,
        "{name}: embedding rows deviate by {rows_dev}"
    );
}

#[test]
fn a_plan_that_does_not_fit_the_model_is_an_error() {
    let ps = table();
    let adam = AdamConfig::default();
    for (stages, micro, want) in [
        (
            vec![stage(0, 1, 1), stage(3, 3, 1)],
            1,
            "does not continue the stages before it at layer 2",
        ),
        (
            vec![stage(0, 2, 1)],
            1,
            "the stages cover layers 0..3, the model has 4",
        ),
        (
            vec![stage(0, 3, 2)],
            3,
            "3 micro-batches do not divide among stage 0's 2 replicas",
        ),
        (vec![stage(0, 3, 0)], 1, "at least one replica"),
        (vec![stage(0, 3, 1)], 0, "at least one micro-batch"),
    ] {
        let e = CtrPipeline::new(model(), &ps, &stages, micro, adam)
            .err()
            .expect("an error")
            .to_string();
        assert!(e.contains(want), "{e}");
    }
    let mut pipe = CtrPipeline::new(model(), &ps, &[stage(0, 3, 1)], 4, adam).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _ = &mut pipe;
    let data = dataset(dir.path(), 1);
    let tiny = loader(dir.path(), &data, 3, 0, 1)
        .epoch(0)
        .next()
        .unwrap()
        .unwrap();
    let e = pipe.step(&tiny).unwrap_err().to_string();
    assert!(
        e.contains("a batch of 3 records cannot feed 4 micro-batches"),
        "{e}"
    );
}

#[test]
fn a_pipeline_resumed_from_a_checkpoint_ends_bitwise_equal_and_a_failing_replica_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 4);
    let adam = AdamConfig::default();
    let plan = [stage(0, 1, 2), stage(2, 3, 1)];
    let global = loader(dir.path(), &data, 64, 0, 1);
    let ps = table();
    let mut straight = CtrPipeline::new(model(), &ps, &plan, 4, adam).unwrap();
    straight.train(&global, 2, None).unwrap();
    assert_eq!(straight.steps(), 64);
    let expected = bits(straight.model(), &ps);

    let checkpoint = dir.path().join("pipe.safetensors");
    let ps = table();
    let mut first = CtrPipeline::new(model(), &ps, &plan, 4, adam).unwrap();
    first.train(&global, 2, Some(45)).unwrap();
    first.save(&checkpoint).unwrap();
    drop(first);
    let ps = table();
    let mut resumed = CtrPipeline::new(model(), &ps, &plan, 4, adam).unwrap();
    resumed.restore(&checkpoint).unwrap();
    assert_eq!(resumed.progress().epoch, 1);
    let report = resumed.train(&global, 2, None).unwrap();
    assert_eq!(report.steps, 64 - 45);
    assert!(
        bits(resumed.model(), &ps) == expected,
        "the resumed pipeline's parameters differ"
    );

    // Another replica count restores too (a stage's blocks, in rank order, are the whole
    // state) and trains on to the same parameters up to the order of sums.
    let ps_two = table();
    let mut fewer =
        CtrPipeline::new(model(), &ps_two, &[stage(0, 1, 1), stage(2, 3, 1)], 4, adam).unwrap();
    fewer.restore(&checkpoint).unwrap();
    fewer.train(&global, 2, None).unwrap();
    let dev = deviation(&flat(fewer.model()), &flat(straight.model()));
    assert!(dev < 1e-4, "resharded resume deviates by {dev}");

    // A checkpoint of other stage boundaries is refused and changes nothing.
    let ps_other = table();
    let mut other = CtrPipeline::new(
        model(),
        &ps_other,
        &[stage(0, 2, 1), stage(3, 3, 1)],
        4,
        adam,
    )
    .unwrap();
    let before = bits(other.model(), &ps_other);
    let e = other.restore(&checkpoint).unwrap_err().to_string();
    assert!(
        e.contains("pipe.safetensors") && e.contains("another plan"),
        "{e}"
    );
    assert!(bits(other.model(), &ps_other) == before);

    // A record the last stage cannot take (a label that is not a class) fails its
    // replica, which the error names; nothing is updated.
    let mut bad = global.epoch(0).next().unwrap().unwrap();
    bad.labels[40] = 7.0;
    let before = bits(resumed.model(), &ps);
    let e = resumed.step(&bad).unwrap_err().to_string();
    assert!(e.starts_with("stage 1 replica 0 failed"), "{e}");
    assert!(
        bits(resumed.model(), &ps) == before,
        "a failed step changed the parameters"
    );
}

/// The first-stage replicas' batches of one step, one after the other: the global batch
/// a pipeline of processes trains on.
fn union(batches: &[coconet::hetero::data::Batch]) -> coconet::hetero::data::Batch {
    let mut all = coconet::hetero::data::Batch {
        labels: vec![],
        dense: vec![],
        keys: vec![],
    };
    for b in batches {
        all.labels.extend_from_slice(&b.labels);
        all.dense.extend_from_slice(&b.dense);
        all.keys.extend_from_slice(&b.keys);
    }
    all
}

/// What one process of a pipeline of processes returns: its role, its report, and on
/// process 0 the gathered model.
type StageResult = (
    (usize, usize),
    Result<coconet::hetero::train::TrainReport, String>,
    Option<Vec<f32>>,
);

/// Runs `stages` as one thread per process on loopback (real TCP, a real store), each
/// first-stage replica reading its share of `dir`'s data in batches of `batch`; the
/// process `dies` (if any) joins and then stops before training.
///
/// With `checkpoint` `(dir, steps, resume)`, the table and every process start from the
/// checkpoint in `dir` (if any) and train `steps` steps and save there — once, or with
/// `resume` again and again until training is over (as `coconet-heterps --checkpoint`).
///
/// With `stranger`, a process without the job's secret reaches stage 1 replica 0's
/// boundary port before stage 0 replica 0 does, greets as that replica and fails the
/// handshake, and another connection there stays silent; both stay open while the job
/// connects and trains.
#[allow(clippy::too_many_arguments)]
fn pipeline_of_processes(
    dir: &Path,
    data: &Dataset,
    stages: &[StagePlan],
    micro: usize,
    batch: usize,
    adam: AdamConfig,
    dies: Option<usize>,
    checkpoint: Option<(&Path, u64, bool)>,
    stranger: bool,
) -> (Vec<StageResult>, coconet::hetero::data::TableSnapshot) {
    use coconet::hetero::data::{PsServer, RemoteTable};
    use coconet::heterps::{CtrStageProcess, stage_processes, stage_role};
    use coconet::runtime::launch::Store;
    use std::time::Duration;
    let k0 = stages[0].replicas;
    let rows = table();
    if let Some((ckpt, _, _)) = checkpoint
        && let Some(t) = CtrStageProcess::checkpointed_table(ckpt, 9).unwrap()
    {
        rows.restore(&t).unwrap();
    }
    let server = PsServer::start(
        "127.0.0.1:0",
        rows,
        k0,
        Duration::from_secs(30),
        loopback::secret(),
    )
    .unwrap();
    let addrs = vec![server.local_addr().to_string()];
    let name = loopback::group_name();
    let (stranger_done, after_stranger) = std::sync::mpsc::channel::<()>();
    let after_stranger = std::sync::Mutex::new(after_stranger);
    let stranger = stranger.then(|| {
        let name = name.clone();
        std::thread::spawn(move || pipeline_stranger(&name, stranger_done))
    });
    let got = loopback::per_process(stage_processes(stages), |p| {
        let (stage, replica) = stage_role(stages, p).unwrap();
        if stranger.is_some() && (stage, replica) == (0, 0) {
            after_stranger.lock().unwrap().recv().unwrap();
        }
        let remote = (stage == 0).then(|| {
            RemoteTable::connect(
                &addrs,
                replica,
                k0,
                9,
                Duration::from_secs(10),
                loopback::secret(),
            )
            .unwrap()
        });
        let store = Store::connect(
            loopback::store_addr(),
            loopback::secret(),
            Duration::from_secs(10),
        )
        .unwrap();
        let mut process = CtrStageProcess::new(
            model(),
            stages,
            micro,
            p,
            remote,
            store,
            &name,
            adam,
            Duration::from_secs(20),
        )
        .unwrap();
        assert_eq!(process.role(), (stage, replica));
        if dies == Some(p) {
            drop(process);
            return ((stage, replica), Err("died".to_string()), None);
        }
        let share = (stage == 0).then(|| loader(dir, data, batch, replica, k0));
        let report = match checkpoint {
            None => process.train(share.as_ref(), 1, None),
            Some((ckpt, steps, resume)) => {
                process.restore(ckpt).unwrap();
                let mut total = coconet::hetero::train::TrainReport::default();
                loop {
                    let part = process.train(share.as_ref(), 1, Some(steps)).unwrap();
                    process.save(ckpt).unwrap();
                    total.steps += part.steps;
                    total.losses.extend(part.losses);
                    if !resume || process.done() {
                        break Ok(total);
                    }
                }
            }
        }
        .map_err(|e| e.to_string());
        if report.is_err() {
            return ((stage, replica), report, None);
        }
        let whole = process
            .gather_model()
            .unwrap()
            .then(|| flat(process.model()));
        process.finish().unwrap();
        ((stage, replica), report, whole)
    });
    if let Some(stranger) = stranger {
        drop(stranger.join().unwrap());
    }
    (got, server.table().export())
}

/// The stranger of [`pipeline_of_processes`]: its open connections, once it tried.
fn pipeline_stranger(
    name: &str,
    done: std::sync::mpsc::Sender<()>,
) -> (std::net::TcpStream, std::net::TcpStream) {
    use coconet::runtime::launch::{JobSecret, Store};
    use coconet::trust::{AuthError, handshake};
    use std::io::Write;
    use std::time::Duration;
    let t = Duration::from_secs(10);
    // Finding the port is what a scan would do; the test reads it from the store.
    let mut store = Store::connect(loopback::store_addr(), loopback::secret(), t).unwrap();
    let addr = store.get(&format!("heterps/pipe/{name}/1/0"), t).unwrap();
    let addr = String::from_utf8(addr).unwrap();
    let greeting: Vec<u8> = [0x636f_636f_7069_7065u64, 0, 0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let purpose = format!("coconet pipeline `{name}`: stage 0 replica 0 -> stage 1 replica 0");
    let mut wrong = std::net::TcpStream::connect(&addr).unwrap();
    wrong.write_all(&greeting).unwrap();
    let other = JobSecret::generate().unwrap();
    let e = handshake::client(&mut wrong, &other, &purpose, t).unwrap_err();
    assert!(matches!(e, AuthError::WrongSecret { .. }), "{e:?}");
    let silent = std::net::TcpStream::connect(&addr).unwrap();
    done.send(()).unwrap();
    (wrong, silent)
}

/// A multi-stage plan with one process per replica trains as one worker on the union of
/// the first stage's batches; a process that dies is named by its neighbours, which
/// stop instead of waiting for it.
#[test]
fn a_pipeline_of_processes_equals_one_worker_and_names_a_replica_that_died() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 4);
    let adam = AdamConfig {
        learning_rate: 3e-3,
        ..AdamConfig::default()
    };
    // The last over 3 files: the first stage's shares are 2 files and 1, and every
    // epoch ends with the shorter.
    let uneven = tempfile::tempdir().unwrap();
    let uneven_data = dataset(uneven.path(), 3);
    let plans: [(&str, Vec<StagePlan>, usize, &Path, &Dataset); 3] = [
        (
            "embedding alone, then 2 x fc1-fc3",
            vec![stage(0, 0, 1), stage(1, 3, 2)],
            4,
            dir.path(),
            &data,
        ),
        (
            "2 x emb+fc1, 1 x fc2, 3 x fc3",
            vec![stage(0, 1, 2), stage(2, 2, 1), stage(3, 3, 3)],
            6,
            dir.path(),
            &data,
        ),
        (
            "2 x emb+fc1-fc2, 1 x fc3, shares of 2 files and 1",
            vec![stage(0, 2, 2), stage(3, 3, 1)],
            2,
            uneven.path(),
            &uneven_data,
        ),
    ];
    for (i, (name, stages, micro, dir, data)) in plans.into_iter().enumerate() {
        let k0 = stages[0].replicas;
        // 64 records per first-stage replica and step: 128 records a step with 2 of them.
        let batch = 64;
        // The first plan's job is visited by a stranger (issue 46): it trains the same.
        let stranger = i == 0;
        let (got, rows) =
            pipeline_of_processes(dir, data, &stages, micro, batch, adam, None, None, stranger);
        let ps_one = table();
        let mut one = Trainer::new(model(), &ps_one, TrainConfig { epochs: 1, adam }).unwrap();
        let shares: Vec<Loader> = (0..k0).map(|r| loader(dir, data, batch, r, k0)).collect();
        let mut epochs: Vec<_> = shares.iter().map(|l| l.epoch(0)).collect();
        let mut losses_one = Vec::new();
        loop {
            let step: Vec<_> = epochs.iter_mut().filter_map(|e| e.next()).collect();
            if step.len() < k0 {
                break;
            }
            let step: Vec<_> = step.into_iter().map(Result::unwrap).collect();
            losses_one.push(one.step(&union(&step)).unwrap());
        }
        let last = stages.len() - 1;
        let mut losses_pipe = vec![0f32; losses_one.len()];
        for ((s, r), report, _) in &got {
            let report = report.as_ref().unwrap();
            assert_eq!(
                report.steps as usize,
                losses_one.len(),
                "{name}: stage {s} replica {r}"
            );
            if *s == last {
                losses_pipe
                    .iter_mut()
                    .zip(&report.losses)
                    .for_each(|(t, l)| *t += l);
            }
        }
        // Every stage saw every record: its replicas' records add up to the first's.
        let records = |stage: usize| -> u64 {
            got.iter()
                .filter(|g| g.0.0 == stage)
                .map(|g| g.1.as_ref().unwrap().samples)
                .sum()
        };
        for s in 1..stages.len() {
            assert_eq!(records(s), records(0), "{name}: stage {s}'s records");
        }
        let whole = got[0].2.clone().expect("process 0 gathers the model");
        assert_like_one_worker(
            &format!("{name} (processes)"),
            (losses_pipe, whole, rows),
            (losses_one, flat(one.model()), ps_one.export()),
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 4);
    // Stage 1's second replica dies after joining: the first stage, which sends it half
    // the micro-batches, names it; nothing waits for a timeout.
    let stages = [stage(0, 0, 1), stage(1, 3, 2)];
    let start = std::time::Instant::now();
    let (got, rows) = pipeline_of_processes(
        dir.path(),
        &data,
        &stages,
        4,
        64,
        adam,
        Some(2),
        None,
        false,
    );
    let e = got[0].1.as_ref().unwrap_err();
    assert!(e.contains("stage 1 replica 1"), "{e}");
    assert!(got[1].1.is_err(), "stage 1 replica 0 stops too");
    // Pulled rows exist, but none was pushed: every row is as a fresh table makes it.
    assert_eq!(rows.values, table().pull(&rows.keys), "no row was pushed");
    println!(
        "a dead replica ended the run in {:.2} s (the neighbours' timeout is 20 s)",
        start.elapsed().as_secs_f64()
    );
}

/// A pipeline of processes stopped after 5 steps (a checkpoint saved) and resumed by new
/// processes and a new table server, in parts of 3 steps with a checkpoint after each,
/// ends bitwise where an uninterrupted run ends.
#[test]
fn a_pipeline_of_processes_resumed_from_a_checkpoint_ends_bitwise_equal() {
    use coconet::heterps::CtrStageProcess;
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 4);
    let adam = AdamConfig::default();
    let stages = [stage(0, 1, 2), stage(2, 3, 1)];
    let run = |checkpoint| {
        pipeline_of_processes(
            dir.path(),
            &data,
            &stages,
            2,
            64,
            adam,
            None,
            checkpoint,
            false,
        )
    };
    let (whole, rows) = run(None);
    let ckpt = tempfile::tempdir().unwrap();
    assert!(
        CtrStageProcess::latest_checkpoint(ckpt.path())
            .unwrap()
            .is_none()
    );
    let (first, _) = run(Some((ckpt.path(), 5, false)));
    assert!(first.iter().all(|g| g.1.as_ref().unwrap().steps == 5));
    // New processes go on from the checkpoint, 3 steps at a time, saving after each
    // part: the second stage's replica hears each pause from both first-stage replicas.
    let (rest, rows_resumed) = run(Some((ckpt.path(), 3, true)));
    assert_eq!(
        rest[0].1.as_ref().unwrap().steps + 5,
        whole[0].1.as_ref().unwrap().steps,
        "the resumed run takes the remaining steps"
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(rest[0].2.as_ref().unwrap()),
        bits(whole[0].2.as_ref().unwrap()),
        "dense layers"
    );
    assert_eq!(rows_resumed.keys, rows.keys);
    assert_eq!(bits(&rows_resumed.values), bits(&rows.values), "rows");
    assert_eq!(
        bits(&rows_resumed.accum),
        bits(&rows.accum),
        "Adagrad state"
    );
}
