//! HeterPS's data-management module: the training data on disk, its loading, and the
//! sparse parameters in a parameter server.
//!
//! - [`click_log`]: one ad impression per line in the Criteo text format (the data
//!   CTR-DNN is defined on), parsed into [`Batch`]es of table keys and dense features.
//! - [`synthetic`]: click logs drawn from a hidden ground-truth model, written as
//!   sharded files, with the best achievable AUC on the held-out split recorded.
//! - [`loader`]: each data-parallel replica streams its share of the files on its own
//!   thread, ahead of training; every record is seen exactly once per epoch.
//! - [`param_server`]: embedding rows hash-partitioned over shards; workers pull the rows
//!   a batch touches and push sparse gradients, each shard applies Adagrad per row;
//!   [`remote`] serves shards to workers in other processes.

pub mod click_log;
mod error;
pub mod loader;
mod mix;
pub mod param_server;
pub mod remote;
pub mod synthetic;
mod table;

pub use click_log::{Batch, ClickLogFormat, DENSE_FEATURES, SPARSE_SLOTS};
pub use error::DataError;
pub use loader::{Loader, LoaderConfig};
pub use param_server::{Adagrad, ParamServer, ParamServerConfig, ShardStats, TableSnapshot};
pub use remote::{PsServer, RemoteTable};
pub use synthetic::{Dataset, GeneratorConfig};
pub use table::EmbeddingTable;
