//! Which launcher started this process, and where it put the rank's identity.
//!
//! `coconet-launch` and torchrun set torchrun's variables; Slurm's `srun` and Open MPI's
//! `mpirun` set their own. A rank reads whichever its launcher set, and with a launcher
//! other than `coconet-launch` rank 0 hosts the rendezvous store itself (nothing else
//! would).

use std::fmt;

/// The variable `coconet-launch` sets in its ranks (it hosts their store).
pub const LAUNCHED_BY_COCONET: &str = "COCONET_LAUNCHED";

/// The launcher that started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `coconet-launch`: torchrun's variables, and a store hosted by node 0's launcher.
    Coconet,
    /// torchrun (or anything setting `RANK`, `WORLD_SIZE`, ...): rank 0 hosts the store.
    Torchrun,
    /// Slurm's `srun` (`SLURM_PROCID`, ...): rank 0 hosts the store, on the first host of
    /// the step's node list unless `MASTER_ADDR` says otherwise.
    Slurm,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_RANK`, ...): rank 0 hosts the store at
    /// `MASTER_ADDR` (`mpirun -x MASTER_ADDR=...`).
    OpenMpi,
}

/// The variables holding a rank's identity under one launcher.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Names {
    pub rank: &'static str,
    pub world_size: &'static str,
    pub local_rank: &'static str,
    pub local_world_size: &'static str,
}

impl Launcher {
    /// The launcher whose variables `lookup` finds (torchrun's first: a job started by
    /// torchrun inside a Slurm allocation carries both).
    pub(crate) fn detect(lookup: &impl Fn(&str) -> Option<String>) -> Launcher {
        if lookup(LAUNCHED_BY_COCONET).is_some() {
            Launcher::Coconet
        } else if lookup("RANK").is_some() {
            Launcher::Torchrun
        } else if lookup("SLURM_PROCID").is_some() {
            Launcher::Slurm
        } else if lookup("OMPI_COMM_WORLD_RANK").is_some() {
            Launcher::OpenMpi
        } else {
            // Nothing set: the error names torchrun's variables.
            Launcher::Torchrun
        }
    }

    /// Where this launcher puts the rank's identity.
    pub(crate) fn names(self) -> Names {
        match self {
            Launcher::Coconet | Launcher::Torchrun => Names {
                rank: "RANK",
                world_size: "WORLD_SIZE",
                local_rank: "LOCAL_RANK",
                local_world_size: "LOCAL_WORLD_SIZE",
            },
            Launcher::Slurm => Names {
                rank: "SLURM_PROCID",
                world_size: "SLURM_NTASKS",
                local_rank: "SLURM_LOCALID",
                local_world_size: "SLURM_NTASKS_PER_NODE",
            },
            Launcher::OpenMpi => Names {
                rank: "OMPI_COMM_WORLD_RANK",
                world_size: "OMPI_COMM_WORLD_SIZE",
                local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
                local_world_size: "OMPI_COMM_WORLD_LOCAL_SIZE",
            },
        }
    }

    /// Whether this launcher hosts the store (else rank 0 does).
    pub fn hosts_store(self) -> bool {
        self == Launcher::Coconet
    }

    /// The store's host when `MASTER_ADDR` is not set, and the variable it came from.
    pub(crate) fn default_master_addr(
        self,
        lookup: &impl Fn(&str) -> Option<String>,
    ) -> Option<(String, &'static str)> {
        match self {
            Launcher::Slurm => [
                "SLURM_STEP_NODELIST",
                "SLURM_JOB_NODELIST",
                "SLURM_NODELIST",
            ]
            .into_iter()
            .find_map(|name| Some((first_host(&lookup(name)?)?, name))),
            _ => None,
        }
    }

    /// The store's port when `MASTER_PORT` is not set: 29500 (torchrun's), plus the job
    /// id modulo 10,000 under Slurm, so that jobs sharing a node do not collide.
    pub(crate) fn default_master_port(
        self,
        lookup: &impl Fn(&str) -> Option<String>,
    ) -> Option<u16> {
        match self {
            Launcher::Coconet | Launcher::Torchrun => None,
            Launcher::Slurm => {
                let job = lookup("SLURM_JOB_ID").and_then(|j| j.trim().parse::<u64>().ok());
                Some(29500 + job.map_or(0, |j| (j % 10_000) as u16))
            }
            Launcher::OpenMpi => Some(29500),
        }
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Coconet => "coconet-launch",
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "srun",
            Launcher::OpenMpi => "mpirun",
        })
    }
}

/// The first host of a Slurm host list (`node[01-04,07],gpu5` → `node01`).
pub(crate) fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    // The first entry ends at a comma outside brackets.
    let mut depth = 0;
    let end = list
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        })
        .map_or(list.len(), |(i, _)| i);
    // Each bracketed range contributes its first value (`rack[3-4]-n[9-10]` → `rack3-n9`).
    let (mut host, mut rest) = (String::new(), &list[..end]);
    while let Some(open) = rest.find('[') {
        let close = rest[open..].find(']')? + open;
        let first = rest[open + 1..close].split(',').next()?.split('-').next()?;
        host.push_str(&rest[..open]);
        host.push_str(first);
        rest = &rest[close + 1..];
    }
    host.push_str(rest);
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_host_of_a_slurm_node_list() {
        for (list, first) in [
            ("node[01-04,07],gpu5", "node01"),
            ("gpu5,node[1-2]", "gpu5"),
            ("a-1", "a-1"),
            ("rack[3-4]-n[9-10]", "rack3-n9"),
            ("n[007-009]", "n007"),
        ] {
            assert_eq!(first_host(list).as_deref(), Some(first), "{list}");
        }
        assert_eq!(first_host(""), None);
        assert_eq!(first_host("n[1-2"), None);
    }
}
