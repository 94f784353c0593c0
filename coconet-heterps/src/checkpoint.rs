//! The parts of a checkpoint the pipeline and the data-parallel trainer share: the dense
//! layers, and a dense optimizer's state (every replica's block of m and v, and its
//! step count) under a name prefix, read back with every size checked before anything
//! changes.

use super::HeterpsError;
use crate::data::{ParamServer, TableSnapshot};
use crate::train::{CheckpointReader, CheckpointWriter, CtrDnn, Manifest, Progress, TrainError};
use coconet_candle::{StateTensor, TrainerState};
use std::path::Path;

/// Writes the model's dense layers as `dense.{i}`.
pub(crate) fn write_dense(file: &mut CheckpointWriter, model: &CtrDnn) {
    for (i, var) in model.vars().iter().enumerate() {
        file.tensor(format!("dense.{i}"), var.as_tensor().clone());
    }
}

/// Reads the dense layers `dense.{i}` with the shapes of `model`'s.
pub(crate) fn read_dense(
    file: &mut CheckpointReader,
    model: &CtrDnn,
) -> Result<Vec<Vec<f32>>, TrainError> {
    model
        .vars()
        .iter()
        .enumerate()
        .map(|(i, v)| {
            Ok(file
                .shaped(&format!("dense.{i}"), v.dims())?
                .flatten_all()?
                .to_vec1()?)
        })
        .collect()
}

/// Writes an optimizer's state as `{prefix}.{tensor}` and `{prefix}.steps`.
pub(crate) fn write_state(
    file: &mut CheckpointWriter,
    prefix: &str,
    state: &TrainerState,
) -> Result<(), TrainError> {
    for t in &state.tensors {
        file.f32s(format!("{prefix}.{}", t.name), &t.data)?;
    }
    file.counters(format!("{prefix}.steps"), &[state.steps])
}

/// Reads the optimizer state written under `prefix` in the layout of `now` (the state
/// of the optimizer it will replace, `what` in errors), with `weights` as its weights;
/// a tensor of another size (another plan) is an error.
pub(crate) fn read_state(
    file: &mut CheckpointReader,
    prefix: &str,
    now: &TrainerState,
    weights: Vec<Vec<f32>>,
    what: &str,
) -> Result<TrainerState, HeterpsError> {
    let mut tensors = Vec::with_capacity(now.tensors.len());
    for t in &now.tensors {
        let data = file.f32s(&format!("{prefix}.{}", t.name))?;
        if data.len() != t.data.len() {
            return Err(file
                .error(format!(
                    "`{prefix}.{}` has {} elements, {what} holds {} (another plan?)",
                    t.name,
                    data.len(),
                    t.data.len()
                ))
                .into());
        }
        tensors.push(StateTensor {
            name: t.name.clone(),
            ranks: t.ranks.clone(),
            data,
        });
    }
    let [steps] = file.counters(&format!("{prefix}.steps"), 1)?[..] else {
        unreachable!("one counter was checked");
    };
    Ok(TrainerState {
        steps,
        weights,
        tensors,
    })
}

/// Adds the table and the progress, names `job` and `writer`, and writes the checkpoint
/// to `path` (atomically).
pub(crate) fn finish(
    mut file: CheckpointWriter,
    ps: &ParamServer,
    p: Progress,
    (job, writer): (&str, &str),
    path: &Path,
) -> Result<(), HeterpsError> {
    file.manifest(Manifest {
        job: job.into(),
        step: p.steps,
        writer: writer.into(),
    });
    file.table(&ps.export())?;
    file.counters("progress", &[p.epoch, p.batch, p.steps])?;
    Ok(file.save(path)?)
}

/// Reads the table (in `ps`'s row width) and the progress of a file `writer` wrote.
pub(crate) fn read_table_and_progress(
    file: &mut CheckpointReader,
    ps: &ParamServer,
    writer: &str,
) -> Result<(TableSnapshot, Progress), TrainError> {
    file.expect_writer(writer)?;
    let table = file.table(ps.config().dim)?;
    let [epoch, batch, steps] = file.counters("progress", 3)?[..] else {
        unreachable!("three counters were checked");
    };
    file.expect_step(steps)?;
    Ok((
        table,
        Progress {
            epoch,
            batch,
            steps,
        },
    ))
}
