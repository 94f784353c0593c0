//! Each data-parallel replica streams its share of the training files, on its own
//! thread and ahead of training.
//!
//! An epoch deals the files (shuffled by `(seed, epoch)` if asked) round-robin to the
//! replicas, so the replicas' shares partition the files and every record is read
//! exactly once per epoch; a replica reads its files in order and cuts them into batches
//! (a batch may span two files; the last one of the epoch may be short). A reader
//! thread parses up to [`LoaderConfig::prefetch`] batches ahead; dropping the epoch stops
//! it.

use super::click_log::{Batch, ClickLogFormat};
use super::error::DataError;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

/// Which share of the data a replica reads, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct LoaderConfig {
    /// Records per batch.
    pub batch: usize,
    /// This replica's index, `0..replicas`.
    pub replica: usize,
    /// Replicas reading the same files.
    pub replicas: usize,
    /// Shuffle the order of the files every epoch with this seed (`None`: as given).
    pub shuffle: Option<u64>,
    /// Batches parsed ahead of the consumer (at least 1).
    pub prefetch: usize,
    /// How lines become batches.
    pub format: ClickLogFormat,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            batch: 512,
            replica: 0,
            replicas: 1,
            shuffle: Some(0),
            prefetch: 4,
            format: ClickLogFormat::default(),
        }
    }
}

/// One replica's view of the training files.
#[derive(Debug, Clone)]
pub struct Loader {
    files: Vec<PathBuf>,
    config: LoaderConfig,
}

impl Loader {
    /// A loader over `files` (the data set's training files, the same list on every
    /// replica). Every replica must get at least one file.
    pub fn new(files: Vec<PathBuf>, config: LoaderConfig) -> Result<Loader, DataError> {
        if config.batch == 0 {
            return Err(DataError::Invalid("batch must be positive".into()));
        }
        if config.replica >= config.replicas {
            return Err(DataError::Invalid(format!(
                "replica {} of {}: must be below the number of replicas",
                config.replica, config.replicas
            )));
        }
        if files.len() < config.replicas {
            return Err(DataError::Invalid(format!(
                "{} files cannot be shared by {} replicas (each needs at least one): write more, smaller files",
                files.len(),
                config.replicas
            )));
        }
        Ok(Loader { files, config })
    }

    /// The files this replica reads in `epoch`, in reading order.
    pub fn files_for(&self, epoch: u64) -> Vec<PathBuf> {
        let mut order = self.files.clone();
        if let Some(seed) = self.config.shuffle {
            order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed ^ epoch.rotate_left(32)));
        }
        order
            .into_iter()
            .skip(self.config.replica)
            .step_by(self.config.replicas)
            .collect()
    }

    /// Starts reading `epoch`: its batches, in order, as the reader thread parses them.
    pub fn epoch(&self, epoch: u64) -> Epoch {
        let (tx, rx) = sync_channel(self.config.prefetch.max(1));
        let files = self.files_for(epoch);
        let (batch, format) = (self.config.batch, self.config.format);
        let reader = std::thread::Builder::new()
            .name(format!("coconet-loader-{}", self.config.replica))
            .spawn(move || read(&files, batch, format, &tx));
        match reader {
            Ok(handle) => Epoch {
                batches: Some(rx),
                reader: Some(handle),
                failed: None,
            },
            Err(e) => Epoch {
                batches: None,
                reader: None,
                failed: Some(DataError::Invalid(format!(
                    "cannot start the loader thread: {e}"
                ))),
            },
        }
    }
}

/// The reader thread: parses `files` into batches and sends them; stops at the first
/// error (sent) or when the consumer is gone.
fn read(
    files: &[PathBuf],
    size: usize,
    format: ClickLogFormat,
    tx: &SyncSender<Result<Batch, DataError>>,
) {
    // Room for a batch up to a bound: a huge batch size grows as records arrive instead
    // of asking for the memory (or overflowing its size) up front.
    let room = size.min(1 << 16);
    let mut batch = Batch::with_capacity(room);
    for path in files {
        let file = match std::fs::File::open(path) {
            Ok(f) => std::io::BufReader::with_capacity(1 << 20, f),
            Err(e) => {
                let _ = tx.send(Err(DataError::io(path, e)));
                return;
            }
        };
        for (i, line) in file.lines().enumerate() {
            let malformed = |message: String| DataError::Malformed {
                path: path.clone(),
                line: i + 1,
                message,
            };
            let parsed = match line {
                Ok(l) => format
                    .parse_line(l.trim_end_matches('\r'), &mut batch)
                    .map_err(malformed),
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    Err(malformed("not UTF-8 text".into()))
                }
                Err(e) => Err(DataError::io(path, e)),
            };
            if let Err(e) = parsed {
                let _ = tx.send(Err(e));
                return;
            }
            if batch.len() == size {
                let full = std::mem::replace(&mut batch, Batch::with_capacity(room));
                if tx.send(Ok(full)).is_err() {
                    return;
                }
            }
        }
    }
    if !batch.is_empty() {
        let _ = tx.send(Ok(batch));
    }
}

/// One epoch of one replica's batches (an iterator); the first error ends it.
#[derive(Debug)]
pub struct Epoch {
    batches: Option<Receiver<Result<Batch, DataError>>>,
    reader: Option<JoinHandle<()>>,
    failed: Option<DataError>,
}

impl Iterator for Epoch {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.failed.take() {
            return Some(Err(e));
        }
        let next = self.batches.as_ref()?.recv().ok();
        if matches!(next, None | Some(Err(_))) {
            self.batches = None;
        }
        next
    }
}

impl Drop for Epoch {
    fn drop(&mut self) {
        // Closing the channel first makes a reader blocked on a full channel return.
        self.batches = None;
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}
