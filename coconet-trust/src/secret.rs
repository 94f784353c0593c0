//! The job secret: a key only the job's own processes hold.

use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// The variable holding the job secret as hex (what `coconet-launch` sets for its ranks).
pub const JOB_SECRET: &str = "COCONET_JOB_SECRET";
/// The variable naming a file that holds the job secret as hex (readable by its owner
/// only), for jobs whose processes are started by several launchers or hosts.
pub const JOB_SECRET_FILE: &str = "COCONET_JOB_SECRET_FILE";
/// The variable that, set to `1`, runs the job without a secret: anyone who can reach
/// its ports can join it. The explicit opt-out.
pub const INSECURE_NO_SECRET: &str = "COCONET_INSECURE_NO_SECRET";

/// Fewest and most bytes a secret may have (128 to 512 bits).
const MIN_BYTES: usize = 16;
const MAX_BYTES: usize = 64;
/// The size of a generated secret (256 bits).
const GENERATED_BYTES: usize = 32;
/// The largest secret file read (hex of 64 bytes and some whitespace).
const MAX_FILE_BYTES: u64 = 1024;

/// A key that every process of one job holds and no one else does; every connection of
/// the job proves it (see [`crate::handshake`]).
///
/// Its `Debug` shows only whether it is open; its bytes leave the process only through
/// [`JobSecret::to_hex`] / [`JobSecret::export`] (to the launcher's own ranks).
///
/// ```
/// use coconet_trust::JobSecret;
/// let secret = JobSecret::generate().unwrap();
/// let again = JobSecret::from_hex(&secret.to_hex()).unwrap();
/// assert_eq!(secret, again);
/// assert_eq!(format!("{secret:?}"), "JobSecret(hidden)");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret {
    /// `None`: the explicit opt-out, proven with an empty key that anyone can compute.
    key: Option<Vec<u8>>,
}

/// Where [`JobSecret::from_env`] found the secret (for the launcher's and ranks' logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// [`JOB_SECRET`].
    Variable,
    /// The file [`JOB_SECRET_FILE`] names.
    File(PathBuf),
    /// [`INSECURE_NO_SECRET`]`=1`.
    OptedOut,
}

/// A job secret that is missing, malformed or unsafe to use.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum SecretError {
    /// No source of a secret is set.
    #[error(
        "no job secret: set {JOB_SECRET} (hex, e.g. from `openssl rand -hex 32`) or {JOB_SECRET_FILE} \
         (a file readable by its owner only) to the same secret for every process of the job \
         (coconet-launch does this for the ranks it starts), or {INSECURE_NO_SECRET}=1 to let \
         anyone who can reach the job's ports join it"
    )]
    Missing,
    /// More than one source is set, so which one counts is unclear.
    #[error("both {first} and {second} are set: set one way of giving the job secret")]
    Ambiguous {
        /// One variable set.
        first: &'static str,
        /// Another.
        second: &'static str,
    },
    /// The secret is not hex of a usable length.
    #[error("the job secret from {origin} is unusable: {reason}")]
    Malformed {
        /// Where it came from (a variable or a file).
        origin: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The secret file cannot be read, or others can read it.
    #[error("the job secret file {}: {reason}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The operating system gave no random bytes.
    #[error("cannot generate a job secret: the system's random source failed: {0}")]
    Random(String),
}

impl JobSecret {
    /// A fresh random 256-bit secret (what `coconet-launch` makes for a one-host job).
    pub fn generate() -> Result<JobSecret, SecretError> {
        let mut key = vec![0u8; GENERATED_BYTES];
        getrandom::fill(&mut key).map_err(|e| SecretError::Random(e.to_string()))?;
        Ok(JobSecret { key: Some(key) })
    }

    /// The secret written as hex (16 to 64 bytes; surrounding whitespace ignored).
    pub fn from_hex(hex: &str) -> Result<JobSecret, SecretError> {
        parse_hex(hex, "the given hex")
    }

    /// The secret in `path`, as hex. On Unix the file must not be readable by its group
    /// or others (like ssh's keys): a secret in a file anyone can read protects nothing.
    pub fn from_file(path: impl AsRef<Path>) -> Result<JobSecret, SecretError> {
        let path = path.as_ref();
        let fail = |reason: String| SecretError::File {
            path: path.to_path_buf(),
            reason,
        };
        let meta = std::fs::metadata(path).map_err(|e| fail(format!("cannot be read: {e}")))?;
        if !meta.is_file() {
            return Err(fail("is not a regular file".into()));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode();
            if mode & 0o077 != 0 {
                return Err(fail(format!(
                    "is readable or writable by others (mode {:o}); `chmod 600` it",
                    mode & 0o777
                )));
            }
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(fail(format!(
                "holds {} bytes; a secret file holds at most {MAX_FILE_BYTES} (hex of a 16-64 byte key)",
                meta.len()
            )));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| fail(format!("cannot be read: {e}")))?;
        parse_hex(&text, &format!("file {}", path.display()))
    }

    /// The secret this process was given: [`JOB_SECRET`], else the file [`JOB_SECRET_FILE`],
    /// else the opt-out [`INSECURE_NO_SECRET`]`=1`; none (or two) of them is an error that
    /// says what to set.
    pub fn from_env() -> Result<(JobSecret, SecretSource), SecretError> {
        JobSecret::from_vars(|name| std::env::var(name).ok())
    }

    /// [`JobSecret::from_env`] reading variables through `lookup` (a map in tests).
    pub fn from_vars(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(JobSecret, SecretSource), SecretError> {
        let set = |name: &'static str| lookup(name).filter(|v| !v.is_empty()).map(|v| (name, v));
        let sources: Vec<(&'static str, String)> =
            [JOB_SECRET, JOB_SECRET_FILE, INSECURE_NO_SECRET]
                .into_iter()
                .filter_map(set)
                .collect();
        match sources.as_slice() {
            [] => Err(SecretError::Missing),
            [(name, value)] => match *name {
                JOB_SECRET => Ok((parse_hex(value, JOB_SECRET)?, SecretSource::Variable)),
                JOB_SECRET_FILE => Ok((
                    JobSecret::from_file(value)?,
                    SecretSource::File(PathBuf::from(value)),
                )),
                _ if value.trim() == "1" => {
                    Ok((JobSecret::insecure_open(), SecretSource::OptedOut))
                }
                _ => Err(SecretError::Malformed {
                    origin: INSECURE_NO_SECRET.into(),
                    reason: format!("is {value:?}; only `1` opts out of the job secret"),
                }),
            },
            [(first, _), (second, _), ..] => Err(SecretError::Ambiguous { first, second }),
        }
    }

    /// No secret: every handshake still runs, with a key anyone can compute, so anyone
    /// who can reach the job's ports can join it. Only for a trusted, closed network.
    pub fn insecure_open() -> JobSecret {
        JobSecret { key: None }
    }

    /// Whether this is the opt-out of [`JobSecret::insecure_open`].
    pub fn is_open(&self) -> bool {
        self.key.is_none()
    }

    /// The secret as lowercase hex (to hand it to processes this one starts); empty for
    /// the opt-out.
    pub fn to_hex(&self) -> String {
        self.key
            .iter()
            .flatten()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Gives the secret to a process about to be started, the way [`JobSecret::from_env`]
    /// reads it (and removes the other ways, so the child cannot see two).
    pub fn export(&self, command: &mut std::process::Command) {
        command.env_remove(JOB_SECRET_FILE);
        if self.is_open() {
            command.env_remove(JOB_SECRET).env(INSECURE_NO_SECRET, "1");
        } else {
            command
                .env_remove(INSECURE_NO_SECRET)
                .env(JOB_SECRET, self.to_hex());
        }
    }

    /// The key the handshake's MACs use (empty for the opt-out).
    pub(crate) fn key(&self) -> &[u8] {
        self.key.as_deref().unwrap_or(&[])
    }
}

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_open() {
            "JobSecret(insecure-open)"
        } else {
            "JobSecret(hidden)"
        })
    }
}

fn parse_hex(text: &str, origin: &str) -> Result<JobSecret, SecretError> {
    let malformed = |reason: String| SecretError::Malformed {
        origin: origin.to_string(),
        reason,
    };
    let hex = text.trim().as_bytes();
    if !hex.len().is_multiple_of(2) {
        return Err(malformed(format!(
            "{} hex digits is not a whole number of bytes",
            hex.len()
        )));
    }
    let key = hex
        .chunks(2)
        .map(|pair| {
            let digit = |c: u8| (c as char).to_digit(16);
            match (digit(pair[0]), digit(pair[1])) {
                (Some(hi), Some(lo)) => Ok((hi * 16 + lo) as u8),
                _ => Err(malformed("is not hexadecimal".into())),
            }
        })
        .collect::<Result<Vec<u8>, _>>()?;
    if !(MIN_BYTES..=MAX_BYTES).contains(&key.len()) {
        return Err(malformed(format!(
            "holds {} bytes; a job secret holds {MIN_BYTES} to {MAX_BYTES} (e.g. `openssl rand -hex 32`)",
            key.len()
        )));
    }
    Ok(JobSecret { key: Some(key) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn generated_secrets_differ_and_round_trip_through_hex() {
        let a = JobSecret::generate().unwrap();
        let b = JobSecret::generate().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.to_hex().len(), 64);
        assert_eq!(
            JobSecret::from_hex(&format!(" {}\n", a.to_hex())).unwrap(),
            a
        );
    }

    #[test]
    fn malformed_secrets_are_refused_with_the_reason() {
        let short = JobSecret::from_hex("abcd").unwrap_err().to_string();
        assert!(short.contains("2 bytes"), "{short}");
        let odd = JobSecret::from_hex(&"a".repeat(33))
            .unwrap_err()
            .to_string();
        assert!(odd.contains("33 hex digits"), "{odd}");
        let not_hex = JobSecret::from_hex(&"zz".repeat(16))
            .unwrap_err()
            .to_string();
        assert!(not_hex.contains("not hexadecimal"), "{not_hex}");
        let long = JobSecret::from_hex(&"ab".repeat(65))
            .unwrap_err()
            .to_string();
        assert!(long.contains("65 bytes"), "{long}");
    }

    #[test]
    fn the_environment_gives_exactly_one_source() {
        let hex = "0f".repeat(32);
        let (secret, source) = JobSecret::from_vars(vars(&[(JOB_SECRET, &hex)])).unwrap();
        assert_eq!(
            (secret.to_hex(), source),
            (hex.clone(), SecretSource::Variable)
        );
        let (open, source) = JobSecret::from_vars(vars(&[(INSECURE_NO_SECRET, "1")])).unwrap();
        assert!(open.is_open());
        assert_eq!(source, SecretSource::OptedOut);
        let missing = JobSecret::from_vars(vars(&[])).unwrap_err();
        assert_eq!(missing, SecretError::Missing);
        assert!(missing.to_string().contains(INSECURE_NO_SECRET));
        let both = JobSecret::from_vars(vars(&[(JOB_SECRET, &hex), (INSECURE_NO_SECRET, "1")]));
        assert!(matches!(both, Err(SecretError::Ambiguous { .. })));
        let half_hearted = JobSecret::from_vars(vars(&[(INSECURE_NO_SECRET, "yes")])).unwrap_err();
        assert!(
            half_hearted.to_string().contains("only `1`"),
            "{half_hearted}"
        );
    }

    #[test]
    fn a_secret_file_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("coconet-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        let secret = JobSecret::generate().unwrap();
        std::fs::write(&path, format!("{}\n", secret.to_hex())).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let shared = JobSecret::from_file(&path).unwrap_err().to_string();
        assert!(
            shared.contains("chmod 600") && shared.contains("644"),
            "{shared}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(JobSecret::from_file(&path).unwrap(), secret);
        let via_env = JobSecret::from_vars(vars(&[(JOB_SECRET_FILE, path.to_str().unwrap())]));
        assert_eq!(via_env.unwrap(), (secret, SecretSource::File(path.clone())));
        let absent = JobSecret::from_file(dir.join("absent"))
            .unwrap_err()
            .to_string();
        assert!(absent.contains("cannot be read"), "{absent}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn debug_never_shows_the_key() {
        let secret = JobSecret::from_hex(&"ab".repeat(32)).unwrap();
        assert!(!format!("{secret:?}").contains("ab"));
        assert_eq!(
            format!("{:?}", JobSecret::insecure_open()),
            "JobSecret(insecure-open)"
        );
    }
}
