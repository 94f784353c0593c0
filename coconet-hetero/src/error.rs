//! Error types: input errors carry the file and line so a user can fix the TOML;
//! planning errors name the stage and the constraint that failed.

use std::path::PathBuf;

/// A problem with an input file (model, catalogue or constraint).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file could not be read.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// File that failed.
        path: PathBuf,
        /// Underlying I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not match the schema (missing or mistyped field).
    #[error("{path}:{line}: {message}")]
    Syntax {
        /// File that failed.
        path: PathBuf,
        /// 1-based line of the offending item (0 when unknown).
        line: usize,
        /// What the parser said.
        message: String,
    },
    /// The file is the other kind of input: a model given as the catalogue, or a
    /// catalogue given as the model.
    #[error(
        "{path}: this looks like a {found}, not a {expected} (it has the top-level keys {keys} of a {found})"
    )]
    WrongKind {
        /// File that failed.
        path: PathBuf,
        /// What it looks like: "model file" or "catalogue".
        found: &'static str,
        /// What it was read as.
        expected: &'static str,
        /// The keys that give it away, quoted and comma-separated.
        keys: String,
    },
    /// The file parses but a value is invalid (negative, unknown resource name, missing profile, ...).
    #[error("{path}:{line}: {message}")]
    Invalid {
        /// File that failed.
        path: PathBuf,
        /// 1-based line of the offending item.
        line: usize,
        /// What is wrong and what was expected.
        message: String,
    },
    /// The constraint cannot be satisfied by construction (e.g. zero throughput).
    #[error("impossible constraint: {0}")]
    Constraint(String),
    /// A model and a catalogue built in code do not fit together (sizes, indices).
    #[error("inconsistent problem: {0}")]
    Inconsistent(String),
}

/// Why a plan (or every plan) is infeasible.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Infeasible {
    /// One replica of the stage does not fit in one unit's memory.
    #[error(
        "stage {stage} (layers {first}..={last} on {ty}) needs {need:.3e} bytes per replica, but one {ty} unit has {have:.3e}"
    )]
    Memory {
        /// Stage index.
        stage: usize,
        /// First layer of the stage.
        first: usize,
        /// Last layer of the stage.
        last: usize,
        /// Resource type name.
        ty: String,
        /// Bytes needed per replica.
        need: f64,
        /// Bytes available per unit.
        have: f64,
    },
    /// The stages drawing on one limit (a type's availability cap, a host's cores)
    /// together need more than it allows.
    #[error("{name}: stages {stages:?} need {need} {unit} in total, but only {cap} are available")]
    Cap {
        /// The limit's position in [`crate::Problem::limits`].
        limit: usize,
        /// What is limited: "type `t4`", "host `local`".
        name: String,
        /// What is counted: "units" or "cores".
        unit: &'static str,
        /// The stages drawing on it.
        stages: Vec<usize>,
        /// How much they need.
        need: u64,
        /// The limit.
        cap: u64,
    },
    /// The unit count needed for the stage overflows (throughput absurdly high for this stage).
    #[error(
        "stage {stage} on {ty} cannot reach the required throughput with any finite number of units"
    )]
    Unreachable {
        /// Stage index.
        stage: usize,
        /// Resource type name.
        ty: String,
    },
    /// The parameter server cannot be provisioned: its shards alone break a limit, or
    /// serving the required rows needs more than any finite number of them.
    #[error("parameter server: {0}")]
    ParameterServer(String),
}

/// An error from a scheduler.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// No feasible plan exists (proved by an exact solver); the reason explains which constraint.
    #[error("no feasible plan: {0}")]
    NoFeasiblePlan(String),
    /// An exact solver ran out of its budget before it found a plan or proved that none
    /// exists.
    #[error("{scheduler}: no plan found and none proven impossible: {reason}")]
    Undecided {
        /// Scheduler name.
        scheduler: String,
        /// Which budget ran out.
        reason: String,
    },
    /// A heuristic ran out of budget without finding any feasible plan.
    #[error("{scheduler}: no feasible plan found within {evaluations} evaluations")]
    NothingFound {
        /// Scheduler name.
        scheduler: String,
        /// Evaluations spent.
        evaluations: usize,
    },
    /// The instance is too large for this scheduler (e.g. exhaustive search).
    #[error("{scheduler}: instance too large ({reason})")]
    TooLarge {
        /// Scheduler name.
        scheduler: String,
        /// Why.
        reason: String,
    },
    /// The neural-network library failed (RL scheduler).
    #[error("{0}")]
    Backend(String),
}
