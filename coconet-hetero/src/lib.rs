//! HeterPS planner: which hardware type each layer of a model runs on, how many units
//! of each type to rent, and what it costs, for a required training throughput.
//!
//! After Liu et al., *HeterPS* (FGCS 2023, arXiv 2111.10635). A model is a chain of
//! layers ([`model`]) with per-type profiles; a catalogue ([`catalog`]) lists resource
//! types with prices. A *scheduling plan* ([`plan`]) assigns a type to every layer;
//! consecutive layers on one type form a pipeline stage. *Provisioning*
//! ([`provision`]) gives each stage the fewest data-parallel units that meet the
//! throughput; the [`cost`] model prices the result. [`schedulers`] search for the
//! cheapest plan: an exact dynamic programme (beyond the paper), exhaustive search, and
//! the paper's RL scheduler and baselines.
//!
//! Running a plan — the data, the parameter server, CTR-DNN training, pipelines of
//! processes — is `coconet-heterps`, the execution half.

pub mod batch;
pub mod catalog;
pub mod constraint;
pub mod cost;
pub mod error;
pub mod instances;
pub mod limit;
pub mod metrics;
pub mod model;
pub mod objective;
pub mod pareto;
pub mod plan;
pub mod provision;
pub mod rental;
pub mod report;
pub mod schedulers;
pub mod stage_shape;
pub mod sync;
mod toml_util;

pub use catalog::{Catalog, DeviceClass, Host, ParameterServer, ResourceType};
pub use constraint::Constraint;
pub use cost::{Evaluation, Problem, ServerReport, StageReport, StageShape, Transfers};
pub use error::{Infeasible, InputError, PlanError};
pub use limit::Limit;
pub use model::{Layer, LayerKind, Model};
pub use objective::Objective;
pub use plan::{SchedulingPlan, Stage};
pub use rental::{Rental, Rented};
pub use sync::{SyncModel, SyncSchedule, SyncStep, Traffic};

/// Loads a catalogue and a model and builds the problem. `constraint` overrides the
/// model file's `[constraint]`; one of the two must exist.
pub fn load(
    model: impl AsRef<std::path::Path>,
    catalog: impl AsRef<std::path::Path>,
    constraint: Option<Constraint>,
) -> Result<Problem, InputError> {
    let catalog = Catalog::load(catalog)?;
    let model_path = model.as_ref();
    let model = Model::load(model_path, &catalog)?;
    let constraint = constraint.or(model.constraint).ok_or_else(|| {
        InputError::Constraint(format!(
            "{}: no [constraint] in the model file and none given (--throughput and --samples)",
            model_path.display()
        ))
    })?;
    Problem::try_new(model, catalog, constraint)
}
