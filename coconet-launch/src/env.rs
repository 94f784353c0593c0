//! What a rank learns from its environment: who it is and where the store is.
//!
//! The launcher passes a rank its identity in environment variables rather than arguments
//! so that the training program's own command line stays its own: torchrun's names under
//! `coconet-launch` and torchrun, Slurm's under `srun`, Open MPI's under `mpirun` (see
//! [`Launcher`]).

use std::fmt;
use std::time::Duration;

use coconet_trust::{JobSecret, SecretError};
use thiserror::Error;

use super::launchers::Launcher;

/// The variable holding the global rank, `0..WORLD_SIZE`.
pub const RANK: &str = "RANK";
/// The variable holding the number of ranks in the job.
pub const WORLD_SIZE: &str = "WORLD_SIZE";
/// The variable holding the rank's index on its node, `0..LOCAL_WORLD_SIZE` (which GPU).
pub const LOCAL_RANK: &str = "LOCAL_RANK";
/// The variable holding the number of ranks on this node (optional).
pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
/// The variable holding the host of the rendezvous store.
pub const MASTER_ADDR: &str = "MASTER_ADDR";
/// The variable holding the port of the rendezvous store.
pub const MASTER_PORT: &str = "MASTER_PORT";
/// The variable holding the rendezvous timeout in seconds (optional; set by `coconet-launch`).
pub const RENDEZVOUS_TIMEOUT: &str = "COCONET_RENDEZVOUS_TIMEOUT";

/// The rendezvous timeout when [`RENDEZVOUS_TIMEOUT`] is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// A rank's identity and the store's address, as the launcher passed them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// The launcher that started this process (whose variables were read).
    pub launcher: Launcher,
    /// The global rank, `0..world_size` (`RANK`, `SLURM_PROCID`, `OMPI_COMM_WORLD_RANK`).
    pub rank: usize,
    /// The number of ranks in the job (`WORLD_SIZE`).
    pub world_size: usize,
    /// The rank's index on its node (`LOCAL_RANK`): the GPU it should use.
    pub local_rank: usize,
    /// The number of ranks on this node (`LOCAL_WORLD_SIZE`), if the launcher said.
    pub local_world_size: Option<usize>,
    /// The store's host (`MASTER_ADDR`; under `srun` by default the first host of the
    /// step's node list).
    pub master_addr: String,
    /// The store's port: `MASTER_PORT` (+ 1 under torchrun, whose own store holds
    /// `MASTER_PORT`; 29500 by default under `mpirun`, 29500 + the job id modulo 10,000
    /// under `srun`).
    pub master_port: u16,
    /// How long rendezvous operations may wait (`COCONET_RENDEZVOUS_TIMEOUT`, seconds;
    /// [`DEFAULT_TIMEOUT`] when unset).
    pub timeout: Duration,
    /// The job secret every connection of the job proves (`COCONET_JOB_SECRET`, set by
    /// `coconet-launch`; or `COCONET_JOB_SECRET_FILE`; or the opt-out
    /// `COCONET_INSECURE_NO_SECRET=1`): see [`JobSecret::from_env`].
    pub secret: JobSecret,
}

/// A launch variable that is missing or does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EnvError {
    /// A required variable is not set.
    #[error(
        "environment variable {name} is not set (start the program with coconet-launch, torchrun, srun or mpirun, or set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT)"
    )]
    Missing {
        /// The variable's name.
        name: &'static str,
    },
    /// A variable is set to something unusable.
    #[error("environment variable {name}={value:?} is invalid: {reason}")]
    Invalid {
        /// The variable's name.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The job secret is missing or unusable.
    #[error(transparent)]
    Secret(#[from] SecretError),
}

impl LaunchEnv {
    /// Reads the launch variables of this process.
    pub fn from_env() -> Result<LaunchEnv, EnvError> {
        LaunchEnv::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads the launch variables through `lookup` (a map in tests, the environment in
    /// [`LaunchEnv::from_env`]), checking that they are consistent.
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv, EnvError> {
        let required = |name: &'static str| lookup(name).ok_or(EnvError::Missing { name });
        let number = |name: &'static str, value: String| -> Result<usize, EnvError> {
            value
                .trim()
                .parse::<usize>()
                .map_err(|e| EnvError::Invalid {
                    name,
                    reason: format!("not a non-negative integer ({e})"),
                    value,
                })
        };
        let launcher = Launcher::detect(&lookup);
        let names = launcher.names();
        let (rank_var, world_var) = (names.rank, names.world_size);
        let (local_var, local_world_var) = (names.local_rank, names.local_world_size);
        let world_size = number(world_var, required(world_var)?)?;
        if world_size == 0 {
            return Err(invalid(world_var, "0", "must be at least 1"));
        }
        let rank_text = required(rank_var)?;
        let rank = number(rank_var, rank_text.clone())?;
        if rank >= world_size {
            return Err(invalid(
                rank_var,
                &rank_text,
                format!("must be less than {world_var}={world_size}"),
            ));
        }
        let local_world_size = match lookup(local_world_var) {
            None => None,
            // Slurm writes `2(x3)` for 2 tasks on each of 3 nodes, `3,2` for uneven ones.
            Some(v) if launcher == Launcher::Slurm => v
                .split('(')
                .next()
                .and_then(|n| n.trim().parse::<usize>().ok())
                .filter(|&n| n > 0 && !v.contains(',')),
            Some(v) => match number(local_world_var, v)? {
                0 => return Err(invalid(local_world_var, "0", "must be at least 1")),
                n => Some(n),
            },
        };
        let local_text = required(local_var)?;
        let local_rank = number(local_var, local_text.clone())?;
        if let Some(n) = local_world_size
            && local_rank >= n
        {
            return Err(invalid(
                local_var,
                &local_text,
                format!("must be less than {local_world_var}={n}"),
            ));
        }
        let master_addr = match (lookup(MASTER_ADDR), launcher.default_master_addr(&lookup)) {
            (Some(addr), _) => addr,
            (None, Some((addr, _))) => addr,
            (None, None) if launcher == Launcher::OpenMpi => {
                return Err(invalid(
                    MASTER_ADDR,
                    "",
                    "is not set: under mpirun, pass rank 0's host (`mpirun -x MASTER_ADDR=host ...`)",
                ));
            }
            (None, None) => return Err(EnvError::Missing { name: MASTER_ADDR }),
        };
        if master_addr.trim().is_empty() {
            return Err(invalid(MASTER_ADDR, &master_addr, "is empty"));
        }
        let port_text = match (lookup(MASTER_PORT), launcher.default_master_port(&lookup)) {
            (Some(port), _) => port,
            (None, Some(port)) => port.to_string(),
            (None, None) => return Err(EnvError::Missing { name: MASTER_PORT }),
        };
        let master_port = match port_text.trim().parse::<u16>() {
            Ok(0) => {
                return Err(invalid(
                    MASTER_PORT,
                    &port_text,
                    "port 0 cannot be connected to",
                ));
            }
            Ok(p) => p,
            Err(e) => {
                return Err(invalid(
                    MASTER_PORT,
                    &port_text,
                    format!("not a port number ({e})"),
                ));
            }
        };
        // torchrun's own store holds MASTER_PORT on rank 0's host: coconet's is beside it.
        let master_port = match launcher {
            Launcher::Torchrun => master_port.checked_add(1).ok_or_else(|| {
                invalid(
                    MASTER_PORT,
                    &port_text,
                    "under torchrun coconet's store listens on MASTER_PORT + 1, past 65535",
                )
            })?,
            _ => master_port,
        };
        let timeout = match lookup(RENDEZVOUS_TIMEOUT) {
            None => DEFAULT_TIMEOUT,
            Some(v) => {
                parse_seconds(&v).map_err(|reason| invalid(RENDEZVOUS_TIMEOUT, &v, reason))?
            }
        };
        let (secret, _) = JobSecret::from_vars(&lookup)?;
        Ok(LaunchEnv {
            launcher,
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr: master_addr.trim().to_string(),
            master_port,
            timeout,
            secret,
        })
    }

    /// The store's address, `host:port`.
    pub fn store_addr(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            // A bare IPv6 address needs brackets before a port.
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }
}

impl fmt::Display for LaunchEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} of {} (local rank {}), store at {}",
            self.rank,
            self.world_size,
            self.local_rank,
            self.store_addr()
        )
    }
}

/// Parses a positive, finite number of seconds.
pub fn parse_seconds(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|e| format!("not a number of seconds ({e})"))?;
    if secs.is_nan() || secs <= 0.0 {
        return Err("must be a positive number of seconds".into());
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("not a usable duration ({e})"))
}

fn invalid(name: &'static str, value: &str, reason: impl Into<String>) -> EnvError {
    EnvError::Invalid {
        name,
        value: value.to_string(),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<LaunchEnv, EnvError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_vars(|name| map.get(name).cloned())
    }

    const FULL: [(&str, &str); 8] = [
        ("COCONET_LAUNCHED", "1"),
        ("COCONET_JOB_SECRET", "000102030405060708090a0b0c0d0e0f"),
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ];

    #[test]
    fn reads_every_variable() {
        let e = env(&FULL).unwrap();
        assert_eq!(
            e,
            LaunchEnv {
                launcher: Launcher::Coconet,
                rank: 5,
                world_size: 8,
                local_rank: 1,
                local_world_size: Some(4),
                master_addr: "127.0.0.1".into(),
                master_port: 29500,
                timeout: DEFAULT_TIMEOUT,
                secret: JobSecret::from_hex("000102030405060708090a0b0c0d0e0f").unwrap(),
            }
        );
        assert_eq!(e.store_addr(), "127.0.0.1:29500");
        let mut with_timeout = FULL.to_vec();
        with_timeout.push((RENDEZVOUS_TIMEOUT, "2.5"));
        assert_eq!(
            env(&with_timeout).unwrap().timeout,
            Duration::from_millis(2500)
        );
    }

    #[test]
    fn names_the_missing_or_invalid_variable() {
        for name in [
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
        ] {
            let partial: Vec<_> = FULL.iter().copied().filter(|(k, _)| *k != name).collect();
            let err = env(&partial).unwrap_err();
            assert_eq!(err, EnvError::Missing { name }, "{name}");
            assert!(err.to_string().contains(name));
        }
        let with = |name: &str, value: &'static str| {
            let mut v: Vec<_> = FULL.iter().copied().filter(|(k, _)| *k != name).collect();
            v.push((FULL.iter().find(|(k, _)| *k == name).unwrap().0, value));
            env(&v).unwrap_err()
        };
        let err = with("RANK", "8");
        assert!(
            matches!(err, EnvError::Invalid { name: "RANK", .. }),
            "{err}"
        );
        assert!(err.to_string().contains("WORLD_SIZE=8"), "{err}");
        assert!(matches!(
            with("RANK", "-1"),
            EnvError::Invalid { name: "RANK", .. }
        ));
        assert!(matches!(
            with("WORLD_SIZE", "0"),
            EnvError::Invalid {
                name: "WORLD_SIZE",
                ..
            }
        ));
        assert!(matches!(
            with("LOCAL_RANK", "4"),
            EnvError::Invalid {
                name: "LOCAL_RANK",
                ..
            }
        ));
        assert!(matches!(
            with("MASTER_PORT", "70000"),
            EnvError::Invalid {
                name: "MASTER_PORT",
                ..
            }
        ));
        assert!(matches!(
            with("MASTER_PORT", "0"),
            EnvError::Invalid {
                name: "MASTER_PORT",
                ..
            }
        ));
        let no_secret: Vec<_> = FULL
            .iter()
            .copied()
            .filter(|(k, _)| !k.contains("SECRET"))
            .collect();
        let err = env(&no_secret).unwrap_err();
        assert_eq!(err, EnvError::Secret(SecretError::Missing));
        assert!(
            err.to_string().contains("COCONET_INSECURE_NO_SECRET=1"),
            "{err}"
        );
        let mut bad_timeout = FULL.to_vec();
        bad_timeout.push((RENDEZVOUS_TIMEOUT, "-3"));
        assert!(matches!(
            env(&bad_timeout).unwrap_err(),
            EnvError::Invalid {
                name: RENDEZVOUS_TIMEOUT,
                ..
            }
        ));
    }

    #[test]
    fn ipv6_hosts_are_bracketed() {
        let mut v = FULL.to_vec();
        v.retain(|(k, _)| *k != "MASTER_ADDR");
        v.push(("MASTER_ADDR", "::1"));
        assert_eq!(env(&v).unwrap().store_addr(), "[::1]:29500");
    }

    #[test]
    fn slurm_open_mpi_and_torchrun_ranks_read_their_launchers_variables() {
        let secret = ("COCONET_JOB_SECRET", "000102030405060708090a0b0c0d0e0f");
        let slurm = env(&[
            secret,
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS_PER_NODE", "4(x2)"),
            ("SLURM_STEP_NODELIST", "gpu[07-08]"),
            ("SLURM_JOB_ID", "123456"),
        ])
        .unwrap();
        assert_eq!(slurm.launcher, Launcher::Slurm);
        assert_eq!((slurm.rank, slurm.world_size, slurm.local_rank), (5, 8, 1));
        assert_eq!(slurm.local_world_size, Some(4));
        assert_eq!(slurm.store_addr(), "gpu07:32956");
        let ompi = env(&[
            secret,
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
        ])
        .unwrap();
        assert_eq!(ompi.launcher, Launcher::OpenMpi);
        assert_eq!(ompi.store_addr(), "10.0.0.1:29500");
        let torchrun: Vec<_> = FULL
            .iter()
            .copied()
            .filter(|(k, _)| *k != "COCONET_LAUNCHED")
            .collect();
        let torchrun = env(&torchrun).unwrap();
        assert_eq!(torchrun.launcher, Launcher::Torchrun);
        assert_eq!(torchrun.master_port, 29501, "beside torchrun's own store");
        // What is missing or wrong is named by its launcher's variable.
        let e = env(&[
            secret,
            ("SLURM_PROCID", "9"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "0"),
        ])
        .unwrap_err();
        assert!(
            e.to_string().contains("SLURM_PROCID") && e.to_string().contains("SLURM_NTASKS=8"),
            "{e}"
        );
        let e = env(&[
            secret,
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("mpirun -x MASTER_ADDR"), "{e}");
        let e = env(&[secret, ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")]).unwrap_err();
        assert_eq!(
            e,
            EnvError::Missing {
                name: "SLURM_LOCALID"
            }
        );
    }
}
