//! CTR-DNN with one worker per process (started by `coconet-launch` or torchrun): each
//! process reads its own share of the data, pulls its rows from parameter-server shards
//! hosted by the first processes of the job ([`PsServer`]s, reached through a
//! [`RemoteTable`]), and takes the dense step with its peers over TCP
//! ([`DataParallel::tcp`]). A step is synchronous everywhere — the fused dense step and
//! the merged sparse step of every worker — so the job trains exactly as
//! [`CtrDataParallel`](super::CtrDataParallel) does with the workers as threads.

use super::HeterpsError;
use crate::data::{Batch, Loader, ParamServer, ParamServerConfig, PsServer, RemoteTable};
use crate::train::{AdamConfig, CtrDnn, Progress, TrainError, TrainReport, run_epochs};
use coconet_candle::DataParallel;
use coconet_runtime::cpu::Tcp;
use coconet_runtime::launch::{LaunchEnv, Store};
use std::net::SocketAddr;

/// This process's worker of a multi-process CTR-DNN job (see the module docs).
pub struct CtrProcess {
    model: CtrDnn,
    table: RemoteTable,
    dense: DataParallel,
    worker: usize,
    workers: usize,
    progress: Progress,
    /// Why a step failed: the dense layers and the table may then disagree (one was
    /// updated, not the other), so no further step is taken.
    failed: Option<String>,
    /// The table shard this process serves, if it hosts one.
    server: Option<PsServer>,
    /// The rendezvous store (for the end-of-job barrier).
    store: Option<(Store, LaunchEnv)>,
}

impl CtrProcess {
    /// Joins the job the launcher started: processes `0..shards` each serve one shard
    /// of a table configured by `table` (on the interface that reaches the store), every
    /// process connects to all of them and to its peers, and trains `model` (the same
    /// seed everywhere: checked across processes) with Adam on its dense layers.
    pub fn from_env(
        model: CtrDnn,
        shards: usize,
        table: ParamServerConfig,
        adam: AdamConfig,
    ) -> Result<CtrProcess, HeterpsError> {
        let env = LaunchEnv::from_env()
            .map_err(|e| HeterpsError::Mismatch(format!("not started by a launcher: {e}")))?;
        let (worker, workers) = (env.rank, env.world_size);
        if shards == 0 || shards > workers {
            return Err(HeterpsError::Mismatch(format!(
                "{shards} parameter-server shards for {workers} processes: give 1 to {workers}"
            )));
        }
        let mut store = env.connect().map_err(store_error)?;
        let dim = table.dim;
        let (server, addrs) = host_table(
            &mut store,
            worker,
            shards,
            table,
            workers,
            env.timeout,
            None,
        )?;
        let remote = RemoteTable::connect(&addrs, worker, workers, dim, env.timeout, &env.secret)?;
        let tcp = Tcp::from_env()?;
        let mut process = CtrProcess::new(model, remote, tcp, adam)?;
        process.server = server;
        process.store = Some((store, env));
        Ok(process)
    }

    /// A worker of `tcp.size()` training `model` with its rows in `table` and its dense
    /// layers' Adam step taken with its peers over `tcp`.
    pub fn new(
        model: CtrDnn,
        table: RemoteTable,
        tcp: Tcp,
        adam: AdamConfig,
    ) -> Result<CtrProcess, HeterpsError> {
        let (worker, workers) = (tcp.rank(), tcp.size());
        let dense = DataParallel::tcp(
            model.vars(),
            tcp,
            super::dense_optimizer::dense_optimizer(adam),
        )?;
        Ok(CtrProcess {
            model,
            table,
            dense,
            worker,
            workers,
            progress: Progress::default(),
            failed: None,
            server: None,
            store: None,
        })
    }

    /// The model.
    pub fn model(&self) -> &CtrDnn {
        &self.model
    }

    /// The table, as this worker reads it.
    pub fn table(&self) -> &RemoteTable {
        &self.table
    }

    /// The shard this process serves, if any.
    pub fn server(&self) -> Option<&PsServer> {
        self.server.as_ref()
    }

    /// This worker's index and the number of workers.
    pub fn worker(&self) -> (usize, usize) {
        (self.worker, self.workers)
    }

    /// Where the dense step's time went, summed over the steps taken.
    pub fn dense_times(&self) -> coconet_candle::StepTimes {
        self.dense.times()
    }

    /// One synchronous step on this worker's `batch` (every worker calls it): returns
    /// this worker's loss before the update.
    pub fn step(&mut self, batch: &Batch) -> Result<f32, HeterpsError> {
        if let Some(why) = &self.failed {
            return Err(HeterpsError::Mismatch(format!(
                "an earlier step failed ({why}); the model and the table may disagree: \
                 restart the job"
            )));
        }
        let result = self.try_step(batch);
        if let Err(e) = &result {
            self.failed = Some(e.to_string());
        }
        result
    }

    fn try_step(&mut self, batch: &Batch) -> Result<f32, HeterpsError> {
        let b = self.model.backward(&self.table, batch)?;
        if !b.loss.is_finite() {
            return Err(TrainError::Diverged {
                step: self.progress.steps,
                loss: b.loss,
            }
            .into());
        }
        self.dense.step(&[b.dense])?;
        self.table
            .push(&b.keys, &b.row_grads, 1.0 / self.workers as f32)?;
        self.progress.steps += 1;
        Ok(b.loss)
    }

    /// Trains `epochs` epochs on `loader`, this worker's share of the data (replica
    /// `worker` of `workers`, every share of the same number of batches).
    pub fn train(&mut self, loader: &Loader, epochs: u64) -> Result<TrainReport, HeterpsError> {
        let mut progress = self.progress;
        let report = run_epochs(&mut progress, loader, epochs, None, |batch| {
            self.step(batch).map(Some)
        });
        self.progress.epoch = progress.epoch;
        self.progress.batch = progress.batch;
        report
    }

    /// Waits until every process is done with the table (a process serving a shard must
    /// not leave before the others' last pull), then releases this process's shard.
    pub fn finish(mut self) -> Result<(), HeterpsError> {
        if let Some((mut store, env)) = self.store.take() {
            store
                .barrier("heterps/done", env.world_size, env.timeout)
                .map_err(|e| HeterpsError::Mismatch(format!("the end-of-job barrier: {e}")))?;
        }
        Ok(())
    }
}

/// What a failing store operation is reported as.
pub(super) fn store_error(e: coconet_runtime::launch::StoreError) -> HeterpsError {
    HeterpsError::Mismatch(format!("the rendezvous store: {e}"))
}

/// Shard `process` of a table configured by `table`, served (on the interface that
/// reaches `store`) by process `process` if it is one of the first `shards`, for
/// `workers` pushing workers — starting from its part of `restore`, if given; and every
/// shard's address, once each is up.
pub(super) fn host_table(
    store: &mut Store,
    process: usize,
    shards: usize,
    table: ParamServerConfig,
    workers: usize,
    timeout: std::time::Duration,
    restore: Option<&crate::data::TableSnapshot>,
) -> Result<(Option<PsServer>, Vec<String>), HeterpsError> {
    let server = if process < shards {
        let ip = store
            .local_addr()
            .map_err(|e| HeterpsError::Mismatch(format!("no local address: {e}")))?
            .ip();
        let rows = ParamServer::new(table)?;
        if let Some(snapshot) = restore {
            rows.restore(&snapshot.rows_where(|k| RemoteTable::server_for(k, shards) == process))?;
        }
        let server = PsServer::start(
            SocketAddr::new(ip, 0),
            rows,
            workers,
            timeout,
            store.secret(),
        )?;
        store
            .set(
                &format!("heterps/ps/{process}"),
                server.local_addr().to_string().as_bytes(),
            )
            .map_err(store_error)?;
        Some(server)
    } else {
        None
    };
    let addrs = (0..shards)
        .map(|s| {
            let a = store
                .get(&format!("heterps/ps/{s}"), timeout)
                .map_err(store_error)?;
            Ok(String::from_utf8_lossy(&a).into_owned())
        })
        .collect::<Result<Vec<_>, HeterpsError>>()?;
    Ok((server, addrs))
}
