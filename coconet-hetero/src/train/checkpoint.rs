//! Checkpoints in safetensors (the format candle and the Hugging Face ecosystem read):
//! the dense layers, Adam's moments, the embedding table with its Adagrad state, and the
//! progress, in one file.
//!
//! Tensors: `dense.{i}` (the model's variables in order), `adam.m.{i}`, `adam.v.{i}`,
//! `table.keys` (I64, the u64 keys' bits), `table.values` and `table.accum` (`[rows,
//! dim]` F32), and `progress` (I64: epoch, batch, steps, Adam's steps).

use super::adam::Adam;
use super::worker::Progress;
use super::{CtrDnn, TrainError};
use crate::data::TableSnapshot;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;

/// A checkpoint read back, checked against the model it will be loaded into.
#[derive(Debug)]
pub(crate) struct Saved {
    pub(crate) dense: Vec<Tensor>,
    pub(crate) moments: Vec<(Tensor, Tensor)>,
    pub(crate) adam_steps: u64,
    pub(crate) table: TableSnapshot,
    pub(crate) progress: Progress,
}

fn error(path: &Path, message: impl std::fmt::Display) -> TrainError {
    TrainError::Checkpoint {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// Writes the checkpoint next to `path` and renames it over `path`: readers see the old
/// checkpoint or the new one, never half of one.
pub(crate) fn save(
    path: &Path,
    model: &CtrDnn,
    adam: &Adam,
    table: &TableSnapshot,
    progress: Progress,
) -> Result<(), TrainError> {
    let dev = Device::Cpu;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for (i, var) in model.vars().iter().enumerate() {
        tensors.insert(format!("dense.{i}"), var.as_tensor().clone());
    }
    for (i, (m, v)) in adam.moments().iter().enumerate() {
        tensors.insert(format!("adam.m.{i}"), m.as_tensor().clone());
        tensors.insert(format!("adam.v.{i}"), v.as_tensor().clone());
    }
    let rows = table.keys.len();
    let keys: Vec<i64> = table.keys.iter().map(|&k| k as i64).collect();
    tensors.insert("table.keys".into(), Tensor::from_vec(keys, rows, &dev)?);
    let shape = (rows, table.dim);
    tensors.insert(
        "table.values".into(),
        Tensor::from_slice(&table.values, shape, &dev)?,
    );
    tensors.insert(
        "table.accum".into(),
        Tensor::from_slice(&table.accum, shape, &dev)?,
    );
    let counters = [progress.epoch, progress.batch, progress.steps, adam.steps()].map(|c| c as i64);
    tensors.insert("progress".into(), Tensor::from_slice(&counters, 4, &dev)?);
    let partial = path.with_extension("partial");
    candle_core::safetensors::save(&tensors, &partial).map_err(|e| error(&partial, e))?;
    std::fs::rename(&partial, path).map_err(|e| error(path, e))
}

/// Reads the checkpoint at `path` and checks it fits `model` and a table of rows of
/// `dim`; changes nothing.
pub(crate) fn load(path: &Path, model: &CtrDnn, dim: usize) -> Result<Saved, TrainError> {
    let mut tensors =
        candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| error(path, e))?;
    let mut take = |name: &str, dtype: DType| -> Result<Tensor, TrainError> {
        let t = tensors.remove(name).ok_or_else(|| {
            error(
                path,
                format!("no tensor `{name}` (not a coconet CTR-DNN checkpoint?)"),
            )
        })?;
        if t.dtype() != dtype {
            return Err(error(
                path,
                format!("`{name}` is {:?}, expected {dtype:?}", t.dtype()),
            ));
        }
        Ok(t)
    };
    let vars = model.vars();
    let mut dense = Vec::with_capacity(vars.len());
    let mut moments = Vec::with_capacity(vars.len());
    for (i, var) in vars.iter().enumerate() {
        let names = [
            format!("dense.{i}"),
            format!("adam.m.{i}"),
            format!("adam.v.{i}"),
        ];
        let [d, m, v] = names.clone().map(|n| take(&n, DType::F32));
        let (d, m, v) = (d?, m?, v?);
        for (name, t) in names.iter().zip([&d, &m, &v]) {
            if t.shape() != var.shape() {
                return Err(error(
                    path,
                    format!(
                        "`{name}` has shape {:?}, the model's variable {:?} (another network shape?)",
                        t.shape(),
                        var.shape()
                    ),
                ));
            }
        }
        dense.push(d);
        moments.push((m, v));
    }
    let keys = take("table.keys", DType::I64)?;
    let (values, accum) = (
        take("table.values", DType::F32)?,
        take("table.accum", DType::F32)?,
    );
    let rows = keys.dims1().map_err(|e| error(path, e))?;
    for (name, t) in [("table.values", &values), ("table.accum", &accum)] {
        if t.dims() != [rows, dim] {
            return Err(error(
                path,
                format!(
                    "`{name}` has shape {:?}, expected [{rows}, {dim}]",
                    t.dims()
                ),
            ));
        }
    }
    let counters = take("progress", DType::I64)?.to_vec1::<i64>()?;
    let [epoch, batch, steps, adam_steps] = counters[..] else {
        return Err(error(
            path,
            format!("`progress` has {} counters, expected 4", counters.len()),
        ));
    };
    let table = TableSnapshot {
        dim,
        keys: keys
            .to_vec1::<i64>()?
            .into_iter()
            .map(|k| k as u64)
            .collect(),
        values: values.flatten_all()?.to_vec1()?,
        accum: accum.flatten_all()?.to_vec1()?,
    };
    Ok(Saved {
        dense,
        moments,
        adam_steps: adam_steps as u64,
        table,
        progress: Progress {
            epoch: epoch as u64,
            batch: batch as u64,
            steps: steps as u64,
        },
    })
}
