//! Checkpoints in safetensors (the format candle and the Hugging Face ecosystem read):
//! named tensors in one file, written atomically and verified when read back.
//!
//! Nothing on disk is trusted unchecked: the file's metadata carries a CRC-32 of every
//! tensor's bytes and a manifest (the job, the step, the writer); [`CheckpointReader::open`]
//! refuses a file whose checksums do not match (one flipped bit in the weights or the
//! progress counters), whose tensors are not all listed, whose F32 values are not finite,
//! or whose second moments (`v`) or Adagrad accumulators (`accum`) are negative — naming
//! the file and the tensor — before anything is restored.
//!
//! [`CheckpointWriter`] and [`CheckpointReader`] are the file; what goes in it is the
//! trainer's business. The one-worker [`Trainer`](super::Trainer) writes `dense.{i}`
//! (the model's variables in order), `adam.m.{i}`, `adam.v.{i}`, the embedding table
//! ([`CheckpointWriter::table`]: `table.keys` as I64 bits of the u64 keys,
//! `table.values` and `table.accum` as `[rows, dim]` F32) and `progress` (I64 counters).

use super::error::TrainError;
use crate::data::TableSnapshot;
use candle_core::{DType, Device, Tensor};
use safetensors::{SafeTensors, View};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The metadata key of the format's version, and its value.
const FORMAT_KEY: &str = "coconet.checkpoint";
const FORMAT: &str = "1";
/// The metadata key prefix of a tensor's CRC-32.
const CRC_PREFIX: &str = "coconet.crc32.";

/// Who wrote a checkpoint, for what: checked when it is read back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    /// The job that wrote it (an id the trainer makes; two jobs never share one).
    pub job: String,
    /// The optimizer steps taken when it was written.
    pub step: u64,
    /// The writer's role (`trainer`, `stage 1 replica 0`, ...): a file read by another
    /// role is refused.
    pub writer: String,
}

impl Manifest {
    /// A fresh job id (64 random bits, as hex): what a trainer names its checkpoints by.
    pub fn fresh_job_id() -> String {
        format!("job-{:016x}", rand::random::<u64>())
    }
}

/// A checkpoint being assembled.
#[derive(Debug, Default)]
pub struct CheckpointWriter {
    tensors: HashMap<String, Tensor>,
    manifest: Manifest,
}

impl CheckpointWriter {
    /// An empty checkpoint.
    pub fn new() -> CheckpointWriter {
        CheckpointWriter::default()
    }

    /// Names the job, step and writer in the file (see [`Manifest`]).
    pub fn manifest(&mut self, manifest: Manifest) {
        self.manifest = manifest;
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

    /// Writes the checkpoint, with its checksums and manifest, next to `path`, flushes it
    /// to the disk and renames it over `path`: readers see the old checkpoint or the new
    /// one, never half of one.
    pub fn save(self, path: &Path) -> Result<(), TrainError> {
        let partial = path.with_extension("partial");
        let fail = |e: &dyn std::fmt::Display| checkpoint_error(&partial, e);
        let mut metadata: HashMap<String, String> = HashMap::new();
        metadata.insert(FORMAT_KEY.into(), FORMAT.into());
        metadata.insert("coconet.job".into(), self.manifest.job.clone());
        metadata.insert("coconet.step".into(), self.manifest.step.to_string());
        metadata.insert("coconet.writer".into(), self.manifest.writer.clone());
        for (name, tensor) in &self.tensors {
            let crc = crc32fast::hash(&tensor.data());
            metadata.insert(format!("{CRC_PREFIX}{name}"), format!("{crc:08x}"));
        }
        safetensors::serialize_to_file(&self.tensors, Some(metadata), &partial)
            .map_err(|e| fail(&e))?;
        std::fs::File::open(&partial)
            .and_then(|f| f.sync_all())
            .map_err(|e| fail(&e))?;
        std::fs::rename(&partial, path).map_err(|e| checkpoint_error(path, e))?;
        // The rename itself reaches the disk with its directory (best effort: not every
        // file system lets a directory be opened for this).
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
        }
        Ok(())
    }
}

fn checkpoint_error(path: &Path, message: impl std::fmt::Display) -> TrainError {
    TrainError::Checkpoint {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// A checkpoint read back and verified; every accessor checks what it takes and names
/// the file.
#[derive(Debug)]
pub struct CheckpointReader {
    path: PathBuf,
    tensors: HashMap<String, Tensor>,
    manifest: Manifest,
}

impl CheckpointReader {
    /// Reads the checkpoint at `path` and verifies it (see the module docs): every
    /// tensor's checksum, that every tensor is listed, finite values, non-negative second
    /// moments and accumulators.
    pub fn open(path: &Path) -> Result<CheckpointReader, TrainError> {
        let fail = |e: &dyn std::fmt::Display| checkpoint_error(path, e);
        let bytes = std::fs::read(path).map_err(|e| fail(&e))?;
        let manifest = verify(&bytes).map_err(|e| fail(&e))?;
        let tensors =
            candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).map_err(|e| fail(&e))?;
        for (name, t) in &tensors {
            check_values(name, t).map_err(|e| fail(&e))?;
        }
        Ok(CheckpointReader {
            path: path.to_path_buf(),
            tensors,
            manifest,
        })
    }

    /// Who wrote the checkpoint, for what.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Refuses a file written by another role than `writer` (a file moved or copied
    /// to another's place).
    pub fn expect_writer(&self, writer: &str) -> Result<(), TrainError> {
        if self.manifest.writer != writer {
            return Err(self.error(format!(
                "was written by {:?}, and is read as {writer:?}'s (a file moved from \
                 another's place?)",
                self.manifest.writer
            )));
        }
        Ok(())
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

    /// Refuses a file whose manifest's step is not `steps` (the step its progress holds).
    pub fn expect_step(&self, steps: u64) -> Result<(), TrainError> {
        if self.manifest.step != steps {
            return Err(self.error(format!(
                "its manifest says step {}, its progress step {steps}",
                self.manifest.step
            )));
        }
        Ok(())
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

/// Checks the checksums and the manifest of a safetensors file in `bytes`.
fn verify(bytes: &[u8]) -> Result<Manifest, String> {
    let file =
        SafeTensors::deserialize(bytes).map_err(|e| format!("not a safetensors file: {e}"))?;
    let (_, metadata) =
        SafeTensors::read_metadata(bytes).map_err(|e| format!("not a safetensors file: {e}"))?;
    let meta = metadata.metadata().clone().unwrap_or_default();
    if meta.get(FORMAT_KEY).map(String::as_str) != Some(FORMAT) {
        return Err(
            "carries no coconet checksums (written by another tool or an older coconet): \
             it cannot be verified"
                .into(),
        );
    }
    let mut listed = 0;
    for (name, view) in file.tensors() {
        let want = meta.get(&format!("{CRC_PREFIX}{name}")).ok_or_else(|| {
            format!("tensor `{name}` has no checksum (added after it was written?)")
        })?;
        let got = format!("{:08x}", crc32fast::hash(view.data()));
        if &got != want {
            return Err(format!(
                "tensor `{name}` is corrupt: its bytes' CRC-32 is {got}, the file says {want}"
            ));
        }
        listed += 1;
    }
    let checksums = meta.keys().filter(|k| k.starts_with(CRC_PREFIX)).count();
    if checksums != listed {
        let missing: Vec<&str> = meta
            .keys()
            .filter_map(|k| k.strip_prefix(CRC_PREFIX))
            .filter(|n| file.tensor(n).is_err())
            .collect();
        return Err(format!("tensors {missing:?} were written but are missing"));
    }
    let field = |k: &str| meta.get(k).cloned().unwrap_or_default();
    let step = field("coconet.step");
    Ok(Manifest {
        job: field("coconet.job"),
        step: step
            .parse()
            .map_err(|_| format!("its manifest's step {step:?} is not a number"))?,
        writer: field("coconet.writer"),
    })
}

/// Whether tensor `name` holds second moments or accumulators, which are never negative.
fn nonnegative(name: &str) -> bool {
    name.split('.').any(|part| part == "v" || part == "accum")
}

/// Refuses non-finite F32 values, and negative ones where `name` says they cannot be.
fn check_values(name: &str, t: &Tensor) -> Result<(), String> {
    if t.dtype() != DType::F32 {
        return Ok(());
    }
    let values: Vec<f32> = t
        .flatten_all()
        .and_then(|t| t.to_vec1())
        .map_err(|e| format!("tensor `{name}`: {e}"))?;
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(format!(
            "tensor `{name}` holds {} at element {i}",
            values[i]
        ));
    }
    if nonnegative(name)
        && let Some(i) = values.iter().position(|&v| v < 0.0)
    {
        return Err(format!(
            "tensor `{name}` holds {} at element {i}: second moments and accumulators are never \
             negative",
            values[i]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(dir: &Path) -> PathBuf {
        let path = dir.join("c.safetensors");
        let mut w = CheckpointWriter::new();
        w.manifest(Manifest {
            job: "job-1".into(),
            step: 7,
            writer: "trainer".into(),
        });
        w.f32s("dense.0", &[0.5, -1.5, 2.0]).unwrap();
        w.f32s("adam.v.0", &[0.25, 0.0, 1.0]).unwrap();
        w.counters("progress", &[1, 2, 7]).unwrap();
        w.save(&path).unwrap();
        path
    }

    #[test]
    fn a_checkpoint_reads_back_with_its_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = CheckpointReader::open(&written(dir.path())).unwrap();
        assert_eq!(r.manifest().step, 7);
        r.expect_writer("trainer").unwrap();
        r.expect_step(7).unwrap();
        assert!(r.expect_writer("stage 1 replica 0").is_err());
        assert_eq!(r.f32s("dense.0").unwrap(), vec![0.5, -1.5, 2.0]);
    }

    /// Every bit of the file flipped in turn: each is refused or reads back exactly what
    /// was written (a flip in padding or an unused header byte), never a changed value.
    #[test]
    fn every_flipped_bit_is_refused_or_harmless() {
        let dir = tempfile::tempdir().unwrap();
        let path = written(dir.path());
        let good = std::fs::read(&path).unwrap();
        let bad = dir.path().join("bad.safetensors");
        let (mut refused, mut harmless) = (0, 0);
        for byte in 0..good.len() {
            for bit in 0..8 {
                let mut b = good.clone();
                b[byte] ^= 1 << bit;
                std::fs::write(&bad, &b).unwrap();
                match CheckpointReader::open(&bad) {
                    Err(_) => refused += 1,
                    Ok(mut r) => {
                        assert_eq!(r.f32s("dense.0").unwrap(), vec![0.5, -1.5, 2.0]);
                        assert_eq!(r.f32s("adam.v.0").unwrap(), vec![0.25, 0.0, 1.0]);
                        assert_eq!(r.counters("progress", 3).unwrap(), vec![1, 2, 7]);
                        harmless += 1;
                    }
                }
            }
        }
        assert!(
            refused > 8 * good.len() / 2,
            "{refused} refused, {harmless} harmless"
        );
    }

    #[test]
    fn values_that_cannot_be_are_refused_naming_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        for (name, values, why) in [
            ("dense.0", [1.0, f32::NAN, 0.0], "holds NaN at element 1"),
            ("adam.v.0", [0.5, -0.25, 0.0], "holds -0.25 at element 1"),
            (
                "table.accum",
                [f32::INFINITY, 0.0, 0.0],
                "holds inf at element 0",
            ),
        ] {
            let path = dir.path().join("v.safetensors");
            let mut w = CheckpointWriter::new();
            w.f32s(name, &values).unwrap();
            w.save(&path).unwrap();
            let e = CheckpointReader::open(&path).unwrap_err().to_string();
            assert!(
                e.contains(name) && e.contains(why) && e.contains("v.safetensors"),
                "{e}"
            );
        }
        // A file without coconet's checksums (candle's own save) cannot be verified.
        let plain = dir.path().join("plain.safetensors");
        let t = Tensor::from_slice(&[1.0f32], 1, &Device::Cpu).unwrap();
        candle_core::safetensors::save(&HashMap::from([("dense.0".to_string(), t)]), &plain)
            .unwrap();
        let e = CheckpointReader::open(&plain).unwrap_err().to_string();
        assert!(e.contains("cannot be verified"), "{e}");
    }
}
