//! Where a model's embedding rows come from: a [`ParamServer`] in this process, or its
//! shards served by other processes ([`RemoteTable`](super::RemoteTable)). The model
//! reads rows through this trait and does not know which.

use super::error::DataError;
use super::param_server::ParamServer;

/// An embedding table a model can read rows from.
pub trait EmbeddingTable: Sync {
    /// Elements per row.
    fn dim(&self) -> usize;

    /// The rows of `keys`, concatenated, counted as training traffic; a row never pushed
    /// reads as its initial values (pushes create rows).
    fn pull(&self, keys: &[u64]) -> Result<Vec<f32>, DataError>;

    /// The rows of `keys` without counting traffic (evaluation): a row never pushed
    /// reads as its initial values.
    fn lookup(&self, keys: &[u64]) -> Result<Vec<f32>, DataError>;
}

impl EmbeddingTable for ParamServer {
    fn dim(&self) -> usize {
        self.config().dim
    }

    fn pull(&self, keys: &[u64]) -> Result<Vec<f32>, DataError> {
        Ok(ParamServer::pull(self, keys))
    }

    fn lookup(&self, keys: &[u64]) -> Result<Vec<f32>, DataError> {
        Ok(ParamServer::lookup(self, keys))
    }
}
