//! Where the trainer's step runs: P rank threads in this process, or this process's
//! rank of an MPI job (feature `mpi`). The trainer sees one interface either way.

use crate::runtime::cpu::Job;
#[cfg(feature = "mpi")]
use crate::runtime::mpi::MpiJob;
use crate::runtime::{JobData, Plan, RuntimeError};
use coconet_core::ValueId;

/// The job behind a trainer.
pub(crate) enum Engine {
    /// Every rank, on rank threads.
    Threads(Job),
    /// This process's rank.
    #[cfg(feature = "mpi")]
    Mpi(MpiJob),
}

impl Engine {
    /// The ranks whose data this process holds, in order.
    pub fn local_ranks(&self) -> Vec<usize> {
        match self {
            Engine::Threads(job) => (0..job.plan().ranks()).collect(),
            #[cfg(feature = "mpi")]
            Engine::Mpi(job) => vec![job.rank()],
        }
    }

    pub fn plan(&self) -> &Plan {
        match self {
            Engine::Threads(job) => job.plan(),
            #[cfg(feature = "mpi")]
            Engine::Mpi(job) => job.plan(),
        }
    }

    pub fn set_scalar_value(&mut self, id: ValueId, value: f64) -> Result<(), RuntimeError> {
        match self {
            Engine::Threads(job) => job.set_scalar_value(id, value),
            #[cfg(feature = "mpi")]
            Engine::Mpi(job) => job.set_scalar_value(id, value),
        }
    }

    pub fn run(&mut self) -> Result<(), RuntimeError> {
        match self {
            Engine::Threads(job) => job.run(),
            #[cfg(feature = "mpi")]
            Engine::Mpi(job) => job.run(),
        }
    }

    /// Runs with input `name` read from `per_local[k]`, the pieces of local rank k.
    pub fn run_with_pieces(
        &mut self,
        name: &str,
        per_local: &[Vec<&[f32]>],
    ) -> Result<(), RuntimeError> {
        match self {
            Engine::Threads(job) => job.run_with_pieces(name, per_local),
            #[cfg(feature = "mpi")]
            Engine::Mpi(job) => job.run_with_pieces(name, &per_local[0]),
        }
    }

    pub fn piece(&self, name: &str, rank: usize, piece: usize) -> Result<&[f32], RuntimeError> {
        match self {
            Engine::Threads(job) => job.piece(name, rank, piece),
            #[cfg(feature = "mpi")]
            Engine::Mpi(job) => job.piece(name, rank, piece),
        }
    }

    pub fn piece_mut(
        &mut self,
        name: &str,
        rank: usize,
        piece: usize,
    ) -> Result<&mut [f32], RuntimeError> {
        match self {
            Engine::Threads(job) => job.piece_mut(name, rank, piece),
            #[cfg(feature = "mpi")]
            Engine::Mpi(job) => job.piece_mut(name, rank, piece),
        }
    }

    /// Rank `rank`'s buffer of input `name` (its block, for a sliced input).
    pub fn input(&self, name: &str, rank: usize) -> Result<&[f32], RuntimeError> {
        match self {
            Engine::Threads(job) => job.input(name, rank),
            #[cfg(feature = "mpi")]
            Engine::Mpi(job) => job.input(name, rank),
        }
    }

    /// Rank `rank`'s buffer of input `name`, to write.
    pub fn input_mut(&mut self, name: &str, rank: usize) -> Result<&mut [f32], RuntimeError> {
        match self {
            Engine::Threads(job) => job.input_mut(name, rank),
            #[cfg(feature = "mpi")]
            Engine::Mpi(job) => job.input_mut(name, rank),
        }
    }
}
