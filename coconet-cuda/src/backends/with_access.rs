//! Peer access as a knob: a multi-rank CUDA backend prepared with an access other than
//! its own, so the tuner can time mapped memory against exchanges cut into chunks of
//! several sizes without making one backend (NCCL communicators, contexts) per setting.

use crate::actions::exchanged::Pipelining;
use crate::executors::rank_job::PeerAccess;
use coconet_core::Bindings;
use coconet_plan::RuntimeError;
use coconet_plan::plan::Plan;
use std::fmt;

/// A multi-rank CUDA backend of one process whose peer access can be chosen per
/// prepared job. ([`Distributed`](crate::Distributed) has none: the tuner runs in
/// one process, and processes choosing apart would run different plans.)
pub trait AccessChoice: coconet_plan::Backend {
    /// Prepares `plan` as [`Backend::prepare`](coconet_plan::Backend::prepare) does, with
    /// `access` instead of the backend's own setting.
    fn prepare_with(
        &self,
        plan: &Plan,
        bindings: &Bindings,
        access: PeerAccess,
    ) -> Result<Self::Job, RuntimeError>;

    /// Whether the ranks can map each other's memory ([`PeerAccess::Mapped`]).
    fn can_map(&self) -> bool;

    /// The settings worth timing on this backend: mapped memory where the ranks can map
    /// each other's, and exchanges unpipelined, in chunks of 1, 4 (the default) and
    /// 16 MiB.
    fn access_choices(&self) -> Vec<PeerAccess> {
        let mut choices = Vec::new();
        if self.can_map() {
            choices.push(PeerAccess::Mapped);
        }
        choices.push(PeerAccess::Exchanged(Pipelining::OFF));
        for mib in [1, 4, 16] {
            choices.push(PeerAccess::Exchanged(Pipelining {
                chunk_bytes: mib << 20,
                ..Pipelining::default()
            }));
        }
        choices
    }
}

/// `backend` preparing every job with `access`: one setting of the tuner's knob.
pub struct WithAccess<'a, B> {
    /// The backend that prepares and runs the jobs.
    pub backend: &'a B,
    /// The peer access of every job it prepares.
    pub access: PeerAccess,
}

impl<B> fmt::Debug for WithAccess<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WithAccess({})", access_label(self.access))
    }
}

impl<B> Clone for WithAccess<'_, B> {
    fn clone(&self) -> Self {
        WithAccess {
            backend: self.backend,
            access: self.access,
        }
    }
}

impl<B: AccessChoice> coconet_plan::Backend for WithAccess<'_, B> {
    type Job = B::Job;

    fn prepare(&self, plan: &Plan, bindings: &Bindings) -> Result<B::Job, RuntimeError> {
        self.backend.prepare_with(plan, bindings, self.access)
    }

    fn run(&self, job: &mut B::Job) -> Result<(), RuntimeError> {
        self.backend.run(job)
    }
}

/// A short name of `access` for tables and the tuner's cache, e.g. `exchanged, 4 MiB
/// chunks, at most 16`.
pub fn access_label(access: PeerAccess) -> String {
    match access {
        PeerAccess::Mapped => "mapped".into(),
        PeerAccess::Exchanged(p) if p.max_chunks <= 1 || p.chunk_bytes == usize::MAX => {
            "exchanged, unpipelined".into()
        }
        PeerAccess::Exchanged(p) => {
            let size = if p.chunk_bytes % (1 << 20) == 0 {
                format!("{} MiB", p.chunk_bytes >> 20)
            } else if p.chunk_bytes % (1 << 10) == 0 {
                format!("{} KiB", p.chunk_bytes >> 10)
            } else {
                format!("{} B", p.chunk_bytes)
            };
            format!("exchanged, {size} chunks, at most {}", p.max_chunks)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_every_setting() {
        assert_eq!(access_label(PeerAccess::Mapped), "mapped");
        assert_eq!(
            access_label(PeerAccess::Exchanged(Pipelining::OFF)),
            "exchanged, unpipelined"
        );
        assert_eq!(
            access_label(PeerAccess::default()),
            "exchanged, 4 MiB chunks, at most 16"
        );
        let odd = Pipelining {
            chunk_bytes: 1536,
            max_chunks: 3,
        };
        assert_eq!(
            access_label(PeerAccess::Exchanged(odd)),
            "exchanged, 1536 B chunks, at most 3"
        );
    }
}
