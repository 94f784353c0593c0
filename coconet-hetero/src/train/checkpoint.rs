//! Checkpoints in safetensors (the format candle and the Hugging Face ecosystem read):
//! named tensors in one file, written atomically.
//!
//! [`CheckpointWriter`] and [`CheckpointReader`] are the file; what goes in it is the
//! trainer's business. The one-worker [`Trainer`](super::Trainer) writes `dense.{i}`
//! (the model's variables in order), `adam.m.{i}`, `adam.v.{i}`, the embedding table
//! ([`CheckpointWriter::table`]: `table.keys` as I64 bits of the u64 keys,
//! `table.values` and `table.accum` as `[rows, dim]` F32) and `progress` (I64 counters).

use super::TrainError;
use crate::data::TableSnapshot;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A checkpoint being assembled.
#[derive(Debug, Default)]
pub struct CheckpointWriter {
    tensors: HashMap<String, Tensor>,
}

impl CheckpointWriter {
    /// An empty checkpoint.
    pub fn new() -> CheckpointWriter {
        CheckpointWriter::default()
    }

    /// Adds tensor `name`.
    pub fn tensor(&mut self, name: impl Into<String>, tensor: Tensor) {
        self.tensors.insert(name.into(), tensor);
    }

    /// Adds `values` as a 1-D F32 tensor `name`.
    pub fn f32s(&mut self, name: impl Into<String>, values: &[f32]) -> Result<(), TrainError> {
        let t = Tensor::from_slice(values, values.len(), &Device::Cpu)?;
        self.tensor(name, t);
        Ok(())
    }

    /// Adds counters as a 1-D I64 tensor `name` (their bits: any u64 round-trips).
    pub fn counters(&mut self, name: impl Into<String>, values: &[u64]) -> Result<(), TrainError> {
        let bits: Vec<i64> = values.iter().map(|&v| v as i64).collect();
        let t = Tensor::from_vec(bits, values.len(), &Device::Cpu)?;
        self.tensor(name, t);
        Ok(())
    }

    /// Adds an embedding table's rows and optimizer state (`table.*`).
    pub fn table(&mut self, table: &TableSnapshot) -> Result<(), TrainError> {
        self.counters("table.keys", &table.keys)?;
        let shape = (table.keys.len(), table.dim);
        let dev = Device::Cpu;
        self.tensor(
            "table.values",
            Tensor::from_slice(&table.values, shape, &dev)?,
        );
        self.tensor(
            "table.accum",
            Tensor::from_slice(&table.accum, shape, &dev)?,
        );
        Ok(())
    }

    /// Writes the checkpoint next to `path` and renames it over `path`: readers see the
    /// old checkpoint or the new one, never half of one.
    pub fn save(self, path: &Path) -> Result<(), TrainError> {
        let partial = path.with_extension("partial");
        candle_core::safetensors::save(&self.tensors, &partial)
            .map_err(|e| checkpoint_error(&partial, e))?;
        std::fs::rename(&partial, path).map_err(|e| checkpoint_error(path, e))
    }
}

fn checkpoint_error(path: &Path, message: impl std::fmt::Display) -> TrainError {
    TrainError::Checkpoint {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// A checkpoint read back; every accessor checks what it takes and names the file.
#[derive(Debug)]
pub struct CheckpointReader {
    path: PathBuf,
    tensors: HashMap<String, Tensor>,
}

impl CheckpointReader {
    /// Reads the checkpoint at `path`.
    pub fn open(path: &Path) -> Result<CheckpointReader, TrainError> {
        let tensors = candle_core::safetensors::load(path, &Device::Cpu)
            .map_err(|e| checkpoint_error(path, e))?;
        Ok(CheckpointReader {
            path: path.to_path_buf(),
            tensors,
        })
    }

    /// An error about this checkpoint.
    pub fn error(&self, message: impl std::fmt::Display) -> TrainError {
        checkpoint_error(&self.path, message)
    }

    /// Tensor `name`, which must be of `dtype`.
    pub fn tensor(&mut self, name: &str, dtype: DType) -> Result<Tensor, TrainError> {
        let t = self.tensors.remove(name).ok_or_else(|| {
            self.error(format!(
                "no tensor `{name}` (not a checkpoint of this trainer?)"
            ))
        })?;
        if t.dtype() != dtype {
            return Err(self.error(format!("`{name}` is {:?}, expected {dtype:?}", t.dtype())));
        }
        Ok(t)
    }

    /// Tensor `name` with shape `shape` (F32), checked.
    pub fn shaped(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, TrainError> {
        let t = self.tensor(name, DType::F32)?;
        if t.dims() != shape {
            return Err(self.error(format!(
                "`{name}` has shape {:?}, expected {shape:?} (another network shape?)",
                t.dims()
            )));
        }
        Ok(t)
    }

    /// 1-D F32 tensor `name`, as values.
    pub fn f32s(&mut self, name: &str) -> Result<Vec<f32>, TrainError> {
        Ok(self.tensor(name, DType::F32)?.flatten_all()?.to_vec1()?)
    }

    /// `n` counters `name`.
    pub fn counters(&mut self, name: &str, n: usize) -> Result<Vec<u64>, TrainError> {
        let c = self.tensor(name, DType::I64)?.to_vec1::<i64>()?;
        if c.len() != n {
            return Err(self.error(format!("`{name}` has {} counters, expected {n}", c.len())));
        }
        Ok(c.into_iter().map(|c| c as u64).collect())
    }

    /// The embedding table (`table.*`) with rows of `dim`.
    pub fn table(&mut self, dim: usize) -> Result<TableSnapshot, TrainError> {
        let keys = self.tensor("table.keys", DType::I64)?;
        let rows = keys.dims1().map_err(|e| self.error(e))?;
        let values = self.shaped("table.values", &[rows, dim])?;
        let accum = self.shaped("table.accum", &[rows, dim])?;
        Ok(TableSnapshot {
            dim,
            keys: keys
                .to_vec1::<i64>()?
                .into_iter()
                .map(|k| k as u64)
                .collect(),
            values: values.flatten_all()?.to_vec1()?,
            accum: accum.flatten_all()?.to_vec1()?,
        })
    }
}
