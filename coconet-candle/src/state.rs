//! The data-parallel trainer's state as a checkpoint holds it.

/// What [`DataParallel::state`](super::DataParallel::state) hands out and
/// [`DataParallel::load_state`](super::DataParallel::load_state) takes back: enough to
/// continue training exactly where it stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainerState {
    /// Steps taken (the optimizer's bias correction counts them).
    pub steps: u64,
    /// The f32 master weights, one vector per parameter in parameter order (for bf16
    /// replicas these are more precise than the replicas' own weights).
    pub weights: Vec<Vec<f32>>,
    /// Each optimizer-state input of the program (AdamW: `m`, `v`; SGD: the momentum).
    pub tensors: Vec<StateTensor>,
}

/// One optimizer-state input, as this process holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct StateTensor {
    /// The program input's name.
    pub name: String,
    /// The ranks whose blocks `data` holds, in order: every rank on rank threads, this
    /// process's rank under MPI (each process checkpoints its own shard); empty when
    /// every rank holds the whole tensor (one copy is saved).
    pub ranks: Vec<usize>,
    /// The blocks of `ranks`, concatenated (or the whole tensor).
    pub data: Vec<f32>,
}
