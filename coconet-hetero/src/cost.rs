//! The cost model.
//!
//! For a stage `s` covering layers `i..=j` on type `t`, with `k` units (data-parallel
//! replicas), batch size `B` per replica and neighbours `t⁻` (previous stage) and `t⁺`
//! (next stage):
//!
//! * compute: `C = Σ_{l=i..j} c[l][t]` (profiled forward + backward seconds per batch);
//! * inter-stage transfer: `D = 2·(λ + a_{i−1} / bw(t⁻, t)) + 2·(λ + a_j / bw(t, t⁺))`:
//!   the activation sent forward and the equally sized gradient sent back at each
//!   boundary the stage has (none before the first stage or after the last), each
//!   message with the catalogue's `link_latency_us` `λ` (0 by default). The first stage
//!   also loads the batch's samples, `input_bytes / bw_data(t)`, where its type has a
//!   `data_bandwidth_gbs` (free otherwise, as in the paper). A unit sends and receives
//!   its own batches over its own link, so stages with different unit counts (fan-in,
//!   fan-out) change nothing per batch. Communication is not overlapped with compute
//!   (the conservative variant);
//! * data-parallel synchronisation of the stage's dense parameters `G = Σ g_l` by ring
//!   all-reduce over the type's network: `sync(k) = 2·(k−1)/k · G / bw_sync(t)` (zero for
//!   `k = 1`; sparse embedding tables live in the parameter server and are not
//!   all-reduced) — the paper's model, the default. [`Problem::with_sync`] prices it
//!   instead as the cheapest of coconet's schedules of all-reduce + optimizer update
//!   (see [`crate::sync`]), the update's memory traffic included;
//! * stage time per batch `T_s(k) = C + D + sync(k)` (`max(C, D) + sync(k)` with
//!   [`Transfers::Overlapped`]: the transfers run beside the compute; with
//!   [`Problem::with_sync_overlap`] the synchronisation hides behind a fraction of the
//!   compute, `max(T₁, T₁ − h + sync(k))`), stage throughput
//!   `X_s(k) = k·B / T_s(k)` samples/s.
//!
//! The pipeline throughput is `X = min_s X_s(k_s)` (the slowest stage bounds the
//! pipeline). Units are provisioned per stage by [`crate::provision::min_units`] so that
//! `X ≥ X_req`.
//!
//! **Cost** (see [`crate::objective`] for the two objectives). By default the job is fed
//! at the required rate, so its wall time is `W = N / X_req`
//! for `N` samples, and `Cost = W · Σ_s k_s · price(τ_s)` (price per second). Charging
//! the required rate rather than the capacity `X` makes the cost a *sum over stages*,
//! each term depending only on the stage's layers, its type and its neighbours' types;
//! that separability is what lets [`crate::schedulers::Dp`] be exact. The capacity `X`
//! (≥ `X_req`, higher by the rounding of unit counts) is reported alongside. Under the
//! paper's objective ([`crate::Objective::Duration`]) `W = N / X` instead, and the DP
//! searches over the throughputs plans reach (see `schedulers::parametric`). A
//! catalogue's `billing_minimum_s` bills every unit for at least that long:
//! `Cost = max(W, minimum) · Σ price` (a cloud's minimum charge; AWS's is 60 s).
//!
//! **Rental granularity.** Types rented only by whole instances
//! (`units_per_instance`, see [`crate::rental`]) are paid per instance: the units of all
//! stages of a type (and the shards on it) are rounded up to whole instances, and the
//! idle units are paid, `Cost = W · Σ_t price(t) · n_t · ⌈u_t / n_t⌉`. A cap limits the
//! rented units. This couples the stages of a type; the DP keeps each such type's free
//! slots in its state and stays exact. [`Problem::with_rental`] with
//! [`crate::Rental::Units`] prices every unit singly (the paper's model).
//!
//! **Feasibility.** One replica of a stage holds `Σ m_l` bytes (`memory_bytes` of its
//! layers; with [`Problem::with_in_flight`] `n` batches' activations instead of one)
//! and must fit one unit's memory; the units of each type over all stages must
//! not exceed the type's availability cap, and the cores the units on a shared host take
//! must not exceed its cores (both are [`Limit`]s).
//!
//! **Parameter server.** With a `[parameter_server]` in the catalogue, sparse tables
//! (`sparse_param_bytes`) live in shards on units of its type: enough to hold the tables
//! and to serve the rows `X` samples/s pull and push (`sparse_traffic_bytes` per batch)
//! at its bandwidth ([`Problem::parameter_servers`]). The shards are priced with the
//! plan, draw on their type's limits (the stages get what is left), and bound the
//! throughput like a stage. At a given throughput every plan needs the same shards, so
//! the DP stays exact; under the paper's objective the shards grow with the throughput
//! searched. Without one, tables are free and unlimited, as in the paper. In the
//! asynchronous mode ([`SyncModel::AsyncServer`], Paddle HeterPS's) the server also holds
//! the dense parameters `G` and serves `2·G` bytes per batch (gradients pushed,
//! parameters pulled), and the stages spend nothing on synchronisation: their units
//! are the closed form `⌈X·T₁/B⌉`.
//!
//! **Per-type batch sizes.** A type may step with a batch `b_t` of its own (the model's
//! `[batch_sizes]`, [`Problem::with_batch_sizes`]): `c[l][t]`, the activations a replica
//! keeps and the boundary transfers are scaled to it as [`crate::batch`] says, and the
//! stage's throughput is `k·b_t / T(k)`. A stage's cost still depends only on its layers,
//! its type and its neighbours' types, so the DP stays exact.
//!
//! **Shared hosts.** Units on one host (see [`crate::catalog::Host`]) slow each other
//! down: a layer's time on a type there is `c + (c_loaded − c)⁺ · (U − θ)/(cores − θ)`
//! with `U` the cores the plan's units take on that host, `θ` one unit's threads, `c`
//! the time alone and `c_loaded` with every core busy (never faster than alone: a
//! contended host does not speed layers up). Time grows with `U`, so the units a stage
//! needs do too, and a plan's load is the least `U` at which its provisioning takes
//! at most `U` cores: [`Problem::evaluate`] finds it by iterating from the plan's
//! smallest load. That couples the stages (the cost is no longer a sum over them); the
//! DP restores separability by solving once per load with the host's cores limited to it
//! ([`Problem::at_loads`]), and the cheapest of those is the optimum.

use crate::batch::{self, MAX_BATCH_SIZE};
use crate::catalog::Catalog;
use crate::constraint::Constraint;
use crate::error::{Infeasible, InputError};
use crate::limit::{self, Limit};
use crate::model::Model;
use crate::objective::Objective;
use crate::plan::{SchedulingPlan, Stage};
use crate::provision::min_units;
use crate::rental::{Rental, Rented, usable_cap};
pub use crate::stage_shape::{StageShape, Transfers};
use crate::sync::SyncModel;

/// One provisioned stage in an [`Evaluation`].
#[derive(Debug, Clone, PartialEq)]
pub struct StageReport {
    /// The stage.
    pub stage: Stage,
    /// Units rented for it.
    pub units: u64,
    /// Seconds per batch per replica at that unit count.
    pub time_per_batch: f64,
    /// Samples per second of the stage.
    pub throughput: f64,
    /// Bytes per replica.
    pub memory: f64,
    /// Dollars per hour for the stage's units.
    pub price_per_hour: f64,
}

/// The parameter server provisioned with a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerReport {
    /// The type whose units serve the shards.
    pub ty: usize,
    /// Shards (units of that type).
    pub shards: u64,
    /// Samples/s whose rows the shards can serve.
    pub throughput: f64,
    /// Dollars per hour for the shards.
    pub price_per_hour: f64,
}

/// A fully evaluated plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// Provisioned stages.
    pub stages: Vec<StageReport>,
    /// The parameter server's shards, when the catalogue has one and the model sparse
    /// tables.
    pub parameter_servers: Option<ServerReport>,
    /// Pipeline capacity `min_s X_s` (and the parameter server's), samples/s (≥ the
    /// required throughput).
    pub throughput: f64,
    /// Index of the slowest stage.
    pub bottleneck: usize,
    /// What the plan rents of each type it uses (stages and shards together, rounded up
    /// to whole instances), in type order.
    pub rented: Vec<Rented>,
    /// Dollars per hour for all rented units, the parameter server's and the idle ones
    /// included.
    pub price_per_hour: f64,
    /// Training wall time, seconds.
    pub wall_time: f64,
    /// Seconds every unit is billed: the wall time, or the catalogue's billing minimum
    /// when that is longer.
    pub billed_time: f64,
    /// Total monetary cost, dollars.
    pub cost: f64,
}

impl Evaluation {
    /// The stages in one line, `first-last:TYPExUNITS` separated by spaces (`catalog`
    /// names the types): for CSV files and terse reports.
    pub fn stage_summary(&self, catalog: &Catalog) -> String {
        self.stages
            .iter()
            .map(|r| {
                format!(
                    "{}-{}:{}x{}",
                    r.stage.first, r.stage.last, catalog.types[r.stage.ty].name, r.units
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A model, a catalogue and a constraint, with prefix sums for O(1) stage shapes.
#[derive(Debug, Clone)]
pub struct Problem {
    /// The model (profiles resolved against `catalog`). Read it freely; to change it,
    /// build a new problem ([`Problem::try_new`]): the per-type sums of its times and
    /// memory are computed once, at construction, and would not follow.
    pub model: Model,
    /// The resource catalogue. Its limits, links and parameter server are read at each
    /// evaluation, but its types' overheads enter the sums computed at construction:
    /// build a new problem to change those.
    pub catalog: Catalog,
    /// The requirement.
    pub constraint: Constraint,
    /// How a stage's replicas synchronise (the paper's ring by default).
    pub sync: SyncModel,
    /// Which wall time the cost is charged for.
    pub objective: Objective,
    /// Whether a stage's boundary transfers overlap its compute.
    pub transfers: Transfers,
    /// Fraction of a stage's compute its synchronisation can hide behind (0: none).
    pub sync_overlap: f64,
    /// Whether units are rented singly or by the catalogue's whole instances.
    pub rental: Rental,
    /// The hosts' loads, once fixed by [`Problem::at_loads`].
    host_loads: Option<Vec<u64>>,
    /// Batches whose activations a replica keeps at once ([`Problem::with_in_flight`]).
    in_flight: u32,
    /// `batch[t]`: samples per batch on type `t` (see [`crate::batch`]).
    batch: Vec<f64>,
    /// `prefix_time[t][l]`: seconds per batch of `batch[t]` of the first `l` layers on `t`.
    prefix_time: Vec<Vec<f64>>,
    prefix_dense: Vec<f64>,
    /// `prefix_mem[t][l]`: bytes one replica on `t` needs for the first `l` layers.
    prefix_mem: Vec<Vec<f64>>,
    /// Each layer's only type and the first layer of its run, where the problem is
    /// restricted to one assignment ([`Problem::restricted_to`]).
    only: Option<std::sync::Arc<Only>>,
}

/// A restriction of every layer to one type ([`Problem::restricted_to`]).
#[derive(Debug)]
struct Only {
    types: Vec<usize>,
    run_start: Vec<usize>,
}

/// A model's batch, finite, positive and at most [`MAX_BATCH_SIZE`], and its per-type
/// batches: none (the model's for every type) or one such batch per type.
fn check_batches(model: &Model, catalog: &Catalog) -> Result<(), InputError> {
    let sane = |v: f64| v.is_finite() && v > 0.0 && v <= MAX_BATCH_SIZE;
    if !sane(model.batch_size) {
        return Err(InputError::Inconsistent(format!(
            "the model's batch size must be > 0 and at most 2^32 = {MAX_BATCH_SIZE} samples, got {}",
            model.batch_size
        )));
    }
    let t_n = catalog.len();
    let b = &model.batch_sizes;
    if !b.is_empty() && b.len() != t_n {
        return Err(InputError::Inconsistent(format!(
            "{} batch sizes for {t_n} resource types",
            b.len()
        )));
    }
    if let Some((t, v)) = b.iter().enumerate().find(|(_, v)| !sane(**v)) {
        return Err(InputError::Inconsistent(format!(
            "the batch size on {} must be > 0 and at most 2^32 = {MAX_BATCH_SIZE} samples, got {v}",
            catalog.types[t].name
        )));
    }
    Ok(())
}

fn prefix(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v = vec![0.0];
    let mut acc = 0.0;
    for x in values {
        acc += x;
        v.push(acc);
    }
    v
}

/// `(threads, cores)` of type `t`'s host when its time can depend on the host's load:
/// the type runs on a host with more cores than one unit takes.
fn slope(catalog: &Catalog, t: usize) -> Option<(u64, u64)> {
    let h = &catalog.hosts[catalog.host_of(t)?];
    (h.cores > h.threads[t]).then_some((h.threads[t], h.cores))
}

/// A layer's time on type `t` when its host has `load` cores busy: linear from alone (one
/// unit, `threads` cores) to loaded (every core), never below alone.
fn time_at_load(catalog: &Catalog, layer: &crate::model::Layer, t: usize, load: u64) -> f64 {
    let alone = layer.time[t];
    let Some((threads, cores)) = slope(catalog, t) else {
        return alone;
    };
    let extra = (layer.time_loaded[t] - alone).max(0.0);
    let frac = (load.saturating_sub(threads) as f64 / (cores - threads) as f64).min(1.0);
    alone + extra * frac
}

impl Problem {
    /// Builds a problem. The model must have been resolved against this catalogue
    /// (one time per type per layer).
    ///
    /// # Panics
    /// Where [`Problem::try_new`] returns an error (never for a model and catalogue read
    /// from files, which are checked as they are read).
    pub fn new(model: Model, catalog: Catalog, constraint: Constraint) -> Self {
        Self::try_new(model, catalog, constraint).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Problem::new`], or an error naming what does not fit where a model or catalogue
    /// built in code disagree on the number of types: a layer's times, the bandwidth
    /// matrix, a host's threads per type, the parameter server's type.
    pub fn try_new(
        model: Model,
        catalog: Catalog,
        constraint: Constraint,
    ) -> Result<Self, InputError> {
        let t_n = catalog.len();
        let wrong = |what: String| Err(InputError::Inconsistent(what));
        if let Some(l) = model
            .layers
            .iter()
            .find(|l| l.time.len() != t_n || l.time_loaded.len() != t_n)
        {
            return wrong(format!(
                "layer `{}` has {} times and {} loaded times for {t_n} resource types (profiles resolved against another catalogue?)",
                l.name,
                l.time.len(),
                l.time_loaded.len()
            ));
        }
        if catalog.bandwidth.len() != t_n || catalog.bandwidth.iter().any(|r| r.len() != t_n) {
            return wrong(format!(
                "the bandwidth matrix is not {t_n} × {t_n} for {t_n} resource types"
            ));
        }
        if let Some(h) = catalog.hosts.iter().find(|h| h.threads.len() != t_n) {
            return wrong(format!(
                "host `{}` gives threads for {} types, not {t_n}",
                h.name,
                h.threads.len()
            ));
        }
        if let Some(ps) = catalog.parameter_server.as_ref().filter(|ps| ps.ty >= t_n) {
            return wrong(format!(
                "the parameter server's type is #{}, but there are {t_n} types",
                ps.ty
            ));
        }
        check_batches(&model, &catalog)?;
        Ok(Self::build(model, catalog, constraint, None, 1))
    }

    fn build(
        model: Model,
        catalog: Catalog,
        constraint: Constraint,
        host_loads: Option<Vec<u64>>,
        in_flight: u32,
    ) -> Self {
        let batch: Vec<f64> = if model.batch_sizes.is_empty() {
            vec![model.batch_size; catalog.len()]
        } else {
            model.batch_sizes.clone()
        };
        let ratio = |t: usize| batch[t] / model.batch_size;
        let prefix_time = (0..catalog.len())
            .map(|t| {
                let overhead = catalog.types[t].layer_overhead;
                prefix(
                    model
                        .layers
                        .iter()
                        .map(|l| batch::scale_time(l.time[t], overhead, ratio(t))),
                )
            })
            .collect();
        let prefix_dense = prefix(model.layers.iter().map(|l| l.dense_param_bytes));
        let prefix_mem = (0..catalog.len())
            .map(|t| {
                prefix(model.layers.iter().map(|l| {
                    // The activations of `in_flight` batches are kept at once.
                    let kept = ratio(t) * f64::from(in_flight);
                    batch::scale_memory(l.memory_bytes, l.activation_memory_bytes, kept)
                }))
            })
            .collect();
        Problem {
            model,
            catalog,
            constraint,
            sync: SyncModel::Ring,
            objective: Objective::default(),
            transfers: Transfers::default(),
            sync_overlap: 0.0,
            rental: Rental::default(),
            host_loads,
            in_flight,
            batch,
            prefix_time,
            prefix_dense,
            prefix_mem,
            only: None,
        }
    }

    /// The same problem (settings kept) over `model`, with hosts loaded as `host_loads`.
    fn rebuilt(&self, model: Model, host_loads: Option<Vec<u64>>) -> Problem {
        Problem {
            sync: self.sync.clone(),
            objective: self.objective,
            transfers: self.transfers,
            sync_overlap: self.sync_overlap,
            rental: self.rental,
            only: self.only.clone(),
            ..Self::build(
                model,
                self.catalog.clone(),
                self.constraint,
                host_loads,
                self.in_flight,
            )
        }
    }

    /// The same problem with every stage keeping the activations of `batches` batches
    /// in flight (at least 1): a pipeline keeps several batches between their forward
    /// and backward passes. GPipe with `n` micro-batches keeps `n`; 1F1B
    /// (PipeDream-Flush) keeps `S − p` at stage `p` of `S`, at most `S`, so `S` bounds
    /// it. A replica's memory holds `batches` times its activations (see
    /// [`crate::batch`]); 1, the default, is the paper's model.
    pub fn with_in_flight(&self, batches: u32) -> Problem {
        Problem {
            in_flight: batches.max(1),
            ..self.clone()
        }
        .rebuilt(self.model.clone(), self.host_loads.clone())
    }

    /// Batches whose activations every stage keeps at once ([`Problem::with_in_flight`]).
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The limits every plan must keep: the types' caps, then the hosts' cores (at most
    /// their fixed loads after [`Problem::at_loads`]).
    ///
    /// What the parameter server's shards draw ([`Problem::parameter_servers`]) is taken
    /// off: the caps here are what the stages may use.
    pub fn limits(&self) -> Vec<Limit> {
        let mut limits = self.catalog_limits();
        if let Some(loads) = &self.host_loads {
            for l in &mut limits {
                if let Some(h) = l.host {
                    l.cap = l.cap.min(loads[h]);
                }
            }
        }
        if let Ok(Some(ps)) = self.parameter_servers() {
            for l in &mut limits {
                let draw = l.per_unit[ps.ty].saturating_mul(ps.shards);
                if draw > 0 {
                    l.cap = l.cap.saturating_sub(draw);
                    l.name = format!("{} (less {draw} for the parameter server)", l.name);
                }
            }
        }
        limits
    }

    /// The catalogue's limits ([`limit::of_catalog`]), each type's cap cut to the whole
    /// instances under it when units are rented by instances: a cap on the rented
    /// units is a cap on the used ones at `n · ⌊cap / n⌋`.
    fn catalog_limits(&self) -> Vec<Limit> {
        let mut limits = limit::of_catalog(&self.catalog);
        for l in limits.iter_mut().filter(|l| l.host.is_none()) {
            let Some(t) = l.per_unit.iter().position(|&w| w > 0) else {
                continue;
            };
            let size = self.rental.instance_size(&self.catalog, t);
            let usable = usable_cap(l.cap, size);
            if usable < l.cap {
                l.name = format!("{} (whole instances of {size}: {usable} usable)", l.name);
                l.cap = usable;
            }
        }
        limits
    }

    /// The parameter server's shards at the required throughput: enough units of its
    /// type to hold every sparse table (`Σ sparse_param_bytes` over a unit's memory) and
    /// to serve the rows that many samples pull and push
    /// (`X · Σ sparse_traffic_bytes / B` over a shard's bandwidth), at least one; with
    /// [`SyncModel::AsyncServer`] the dense parameters `G` too (held, and `2·G` per batch
    /// pushed and pulled). `None` when the catalogue has no parameter server or the model
    /// nothing to keep there; `Err` when the shards alone break a limit (a cap of their
    /// type, a host's cores) or cannot be counted, or the asynchronous mode has no server.
    pub fn parameter_servers(&self) -> Result<Option<ServerReport>, Infeasible> {
        let Some(ps) = &self.catalog.parameter_server else {
            if self.sync == SyncModel::AsyncServer {
                return Err(Infeasible::ParameterServer(
                    "the asynchronous mode keeps the dense parameters on a parameter server, \
                     and the catalogue has no [parameter_server]"
                        .into(),
                ));
            }
            return Ok(None);
        };
        let layers = &self.model.layers;
        if self.sync == SyncModel::AsyncServer && self.has_per_type_batches() {
            // The dense traffic per sample would depend on which type steps each layer.
            return Err(Infeasible::ParameterServer(
                "the asynchronous mode prices the dense traffic at the model's batch and \
                 does not support per-type batch sizes"
                    .into(),
            ));
        }
        // In the asynchronous mode the server also holds the dense parameters, and every
        // batch pushes their gradients and pulls them back.
        let dense = if self.sync == SyncModel::AsyncServer {
            layers.iter().map(|l| l.dense_param_bytes).sum()
        } else {
            0.0
        };
        let table: f64 = layers.iter().map(|l| l.sparse_param_bytes).sum::<f64>() + dense;
        if table == 0.0 {
            return Ok(None);
        }
        let rt = &self.catalog.types[ps.ty];
        let per_sample = (layers.iter().map(|l| l.sparse_traffic_bytes).sum::<f64>() + 2.0 * dense)
            / self.model.batch_size;
        let x = self.constraint.throughput;
        let need = (table / rt.memory_bytes)
            .ceil()
            .max((x * per_sample / ps.bandwidth).ceil())
            .max(1.0);
        if !need.is_finite() || need > crate::provision::MAX_UNITS as f64 {
            return Err(Infeasible::ParameterServer(format!(
                "serving {} samples/s needs more than 2^40 shards of {}",
                crate::constraint::rate(x),
                rt.name
            )));
        }
        let shards = need as u64;
        for l in self.catalog_limits() {
            let draw = l.per_unit[ps.ty].saturating_mul(shards);
            if draw > l.cap {
                return Err(Infeasible::ParameterServer(format!(
                    "{} shards of {} (tables {table:.4e} bytes, {:.4e} bytes/s of rows) need {draw} {} of {}, which has {}",
                    shards,
                    rt.name,
                    x * per_sample,
                    l.unit,
                    l.name,
                    l.cap
                )));
            }
        }
        Ok(Some(ServerReport {
            ty: ps.ty,
            shards,
            throughput: if per_sample > 0.0 {
                shards as f64 * ps.bandwidth / per_sample
            } else {
                f64::INFINITY
            },
            price_per_hour: shards as f64 * rt.price_per_hour,
        }))
    }

    /// Whether layer times depend on how loaded a shared host is (a model with
    /// `time_loaded` above `time` on a host's type, loads not fixed by
    /// [`Problem::at_loads`]), so that the cost of a stage depends on the other stages on
    /// its host.
    pub fn is_contended(&self) -> bool {
        self.host_loads.is_none()
            && self.model.layers.iter().any(|l| {
                (0..self.num_types())
                    .any(|t| l.time_loaded[t] > l.time[t] && slope(&self.catalog, t).is_some())
            })
    }

    /// The problem with each host `h` loaded with `loads[h]` cores (a host past the end
    /// of `loads`: full): every layer's time on a host's type taken at that load, and the
    /// host's cores limited to it (at most its real cores). Not contended any more: its
    /// cost is a sum over stages again.
    pub fn at_loads(&self, loads: &[u64]) -> Problem {
        let hosts = &self.catalog.hosts;
        let loads: Vec<u64> = (0..hosts.len())
            .map(|h| loads.get(h).copied().unwrap_or(hosts[h].cores))
            .collect();
        let mut model = self.model.clone();
        for layer in &mut model.layers {
            for t in 0..self.num_types() {
                let at = self.catalog.host_of(t).map_or(0, |h| loads[h]);
                layer.time[t] = time_at_load(&self.catalog, layer, t, at);
                layer.time_loaded[t] = layer.time[t];
            }
        }
        self.rebuilt(model, Some(loads))
    }

    /// The same problem with type `t`'s replicas stepping with `batch_sizes[t]` samples
    /// per batch (see [`crate::batch`]), or an error naming a batch that is not finite,
    /// positive and at most [`MAX_BATCH_SIZE`] (2^32), or a list of the wrong length.
    pub fn with_batch_sizes(&self, batch_sizes: Vec<f64>) -> Result<Self, InputError> {
        let mut model = self.model.clone();
        model.batch_sizes = batch_sizes;
        check_batches(&model, &self.catalog)?;
        Ok(self.rebuilt(model, self.host_loads.clone()))
    }

    /// Samples per batch a replica on type `ty` steps with.
    pub fn batch_size(&self, ty: usize) -> f64 {
        self.batch[ty]
    }

    /// Type `ty`'s batch over the model's (profiled) one.
    pub(crate) fn batch_ratio(&self, ty: usize) -> f64 {
        self.batch[ty] / self.model.batch_size
    }

    /// Seconds per batch (of [`Problem::batch_size`]) of layer `l` alone on one unit of
    /// `ty`: the profile scaled to the type's batch ([`crate::batch`]), to the bit the
    /// profile where the batch is the model's.
    pub fn layer_time(&self, l: usize, ty: usize) -> f64 {
        batch::scale_time(
            self.model.layers[l].time[ty],
            self.catalog.types[ty].layer_overhead,
            self.batch_ratio(ty),
        )
    }

    /// Whether some type steps with a batch other than the model's.
    pub fn has_per_type_batches(&self) -> bool {
        self.batch.iter().any(|&b| b != self.model.batch_size)
    }

    /// The same problem with the replicas' synchronisation priced by `sync`.
    pub fn with_sync(self, sync: SyncModel) -> Self {
        Problem { sync, ..self }
    }

    /// The same problem with its stages' boundary transfers taken as `transfers`.
    pub fn with_transfers(self, transfers: Transfers) -> Self {
        Problem { transfers, ..self }
    }

    /// The same problem with each stage's synchronisation hidden behind `fraction` of
    /// its compute (clamped to 0..=1; 2/3 is the backward pass of a forward + backward).
    pub fn with_sync_overlap(self, fraction: f64) -> Self {
        Problem {
            sync_overlap: if fraction.is_nan() {
                0.0
            } else {
                fraction.clamp(0.0, 1.0)
            },
            ..self
        }
    }

    /// The same problem with its units rented as `rental` says: singly (the paper's
    /// per-unit prices) or by the catalogue's whole instances.
    pub fn with_rental(self, rental: Rental) -> Self {
        Problem { rental, ..self }
    }

    /// The same problem with its cost charged for `objective`'s wall time.
    pub fn with_objective(self, objective: Objective) -> Self {
        Problem { objective, ..self }
    }

    /// Same model and catalogue with another constraint.
    pub fn with_constraint(&self, constraint: Constraint) -> Self {
        Problem {
            constraint,
            ..self.clone()
        }
    }

    /// Number of layers `L`.
    pub fn num_layers(&self) -> usize {
        self.model.layers.len()
    }

    /// Number of resource types `T`.
    pub fn num_types(&self) -> usize {
        self.catalog.len()
    }

    /// Bytes one replica of layers `first..=last` on `ty` needs; infinite (fits no
    /// unit) for a stage outside the assignment a problem is restricted to
    /// ([`Problem::restricted_to`]).
    pub fn segment_memory(&self, first: usize, last: usize, ty: usize) -> f64 {
        if let Some(only) = &self.only
            && (only.types[last] != ty || only.run_start[last] > first)
        {
            return f64::INFINITY;
        }
        self.prefix_mem[ty][last + 1] - self.prefix_mem[ty][first]
    }

    /// The problem with layer `l` allowed on `types[l]` only: its plans are the ways of
    /// cutting the assignment's runs into stages. Every solver already skips a stage that
    /// fits no unit, and a stage's memory only grows as it extends, so the restriction is
    /// a stage outside the assignment needing infinite memory: the exact DP, its bounds
    /// and its parametric search then solve the restricted space unchanged (how the
    /// heuristics get the DP's cuts, [`crate::schedulers::Cuts::Best`]).
    ///
    /// # Panics
    /// If `types` is not one type of this problem per layer.
    pub(crate) fn restricted_to(&self, types: &[usize]) -> Problem {
        assert!(
            types.len() == self.num_layers() && types.iter().all(|&t| t < self.num_types()),
            "an assignment of {} layers to {} types, got {types:?}",
            self.num_layers(),
            self.num_types()
        );
        let mut run_start = vec![0; types.len()];
        for l in 1..types.len() {
            run_start[l] = if types[l] == types[l - 1] {
                run_start[l - 1]
            } else {
                l
            };
        }
        Problem {
            only: Some(std::sync::Arc::new(Only {
                types: types.to_vec(),
                run_start,
            })),
            ..self.clone()
        }
    }

    /// Compute seconds per batch (of [`Problem::batch_size`]) of layers `first..=last`
    /// on one unit of `ty`.
    pub fn segment_compute(&self, first: usize, last: usize, ty: usize) -> f64 {
        self.prefix_time[ty][last + 1] - self.prefix_time[ty][first]
    }

    /// The shape of a stage `first..=last` on `ty` between neighbours `prev` and `next`.
    pub fn stage_shape(
        &self,
        first: usize,
        last: usize,
        ty: usize,
        prev: Option<usize>,
        next: Option<usize>,
    ) -> StageShape<'_> {
        let layers = &self.model.layers;
        let bw = &self.catalog.bandwidth;
        // The activation bytes per sample are the model's; a batch moves its own samples'.
        let ratio = self.batch_ratio(ty);
        let latency = self.catalog.link_latency;
        let mut transfer = 0.0;
        if let Some(p) = prev {
            transfer += 2.0 * (latency + layers[first - 1].activation_bytes * ratio / bw[p][ty]);
        }
        if let Some(n) = next {
            transfer += 2.0 * (latency + layers[last].activation_bytes * ratio / bw[ty][n]);
        }
        // The first stage loads the batch's samples.
        if let Some(read) = self.catalog.types[ty].data_bandwidth.filter(|_| first == 0) {
            transfer += self.model.input_bytes * ratio / read;
        }
        StageShape {
            compute: self.prefix_time[ty][last + 1] - self.prefix_time[ty][first],
            transfer,
            dense_bytes: self.prefix_dense[last + 1] - self.prefix_dense[first],
            sync_bandwidth: self.catalog.types[ty].sync_bandwidth,
            memory_bandwidth: self.catalog.types[ty].mem_bandwidth,
            sync: &self.sync,
            batch: self.batch[ty],
            memory: self.segment_memory(first, last, ty),
            transfers: self.transfers,
            sync_overlap: self.sync_overlap,
        }
    }

    /// Price of one unit of `ty` in dollars per second.
    pub fn price_per_second(&self, ty: usize) -> f64 {
        self.catalog.types[ty].price_per_hour / 3600.0
    }

    /// Provisions and prices a plan; `Err` names the first violated constraint. On a
    /// contended problem the hosts' loads are the least fixed point of provisioning
    /// (see the module documentation), and the stages' times are those at the loads the
    /// plan's units really make.
    ///
    /// # Panics
    /// If the plan is not well formed for this problem (see [`SchedulingPlan::is_well_formed`]).
    pub fn evaluate(&self, plan: &SchedulingPlan) -> Result<Evaluation, Infeasible> {
        assert!(
            plan.is_well_formed(self.num_layers(), self.num_types()),
            "malformed plan {plan:?}"
        );
        let servers = self.parameter_servers()?;
        if !self.is_contended() {
            let reports = self.stage_reports(plan, None)?;
            return self.finish(plan, reports, servers);
        }
        let hosts = &self.catalog.hosts;
        // Each host's cores as a limit (the catalogue's, in host order): what units take.
        let host_limits: Vec<Limit> = limit::of_catalog(&self.catalog)
            .into_iter()
            .filter(|l| l.host.is_some())
            .collect();
        // The parameter server's shards load their host too.
        let serving: Vec<u64> = hosts
            .iter()
            .map(|h| servers.as_ref().map_or(0, |s| h.threads[s.ty] * s.shards))
            .collect();
        // The smallest load a plan can make: one unit per stage.
        let mut loads = serving.clone();
        for st in &plan.stages {
            if let Some(h) = self.catalog.host_of(st.ty) {
                loads[h] += hosts[h].threads[st.ty];
            }
        }
        loop {
            let at = self.at_loads(&loads);
            let reports = at.stage_reports(plan, None)?;
            let mut units = vec![0u64; self.num_types()];
            for r in &reports {
                units[r.stage.ty] += r.units;
            }
            let need: Vec<u64> = host_limits
                .iter()
                .zip(&serving)
                .map(|(l, s)| s.saturating_add(l.used(&units)))
                .collect();
            if need.iter().zip(&loads).all(|(n, l)| n <= l) {
                // Consistent: report the stages at the load their units really make.
                let real = self.at_loads(&need);
                let counts: Vec<u64> = reports.iter().map(|r| r.units).collect();
                let reports = real.stage_reports(plan, Some(&counts))?;
                return real.finish(plan, reports, servers);
            }
            for (h, host) in hosts.iter().enumerate() {
                if need[h] > host.cores {
                    // The stages' share, against what the shards leave of the cores.
                    let limits = self.limits();
                    let (i, l) = limits
                        .iter()
                        .enumerate()
                        .find(|(_, l)| l.host == Some(h))
                        .expect("every host has a limit");
                    return Err(l.exceeded(i, plan, need[h] - serving[h]));
                }
                loads[h] = loads[h].max(need[h]);
            }
        }
    }

    /// Each stage of `plan` with `units` units, or (`None`) the fewest that meet the
    /// required throughput.
    pub(crate) fn stage_reports(
        &self,
        plan: &SchedulingPlan,
        units: Option<&[u64]>,
    ) -> Result<Vec<StageReport>, Infeasible> {
        let x_req = self.constraint.throughput;
        let n = plan.stages.len();
        let mut reports = Vec::with_capacity(n);
        for (i, st) in plan.stages.iter().enumerate() {
            let prev = (i > 0).then(|| plan.stages[i - 1].ty);
            let next = (i + 1 < n).then(|| plan.stages[i + 1].ty);
            let shape = self.stage_shape(st.first, st.last, st.ty, prev, next);
            let rt = &self.catalog.types[st.ty];
            if shape.memory > rt.memory_bytes {
                return Err(Infeasible::Memory {
                    stage: i,
                    first: st.first,
                    last: st.last,
                    ty: rt.name.clone(),
                    need: shape.memory,
                    have: rt.memory_bytes,
                });
            }
            let units = match units {
                Some(u) => u[i],
                None => min_units(&shape, x_req).ok_or_else(|| Infeasible::Unreachable {
                    stage: i,
                    ty: rt.name.clone(),
                })?,
            };
            reports.push(StageReport {
                stage: *st,
                units,
                time_per_batch: shape.time(units),
                throughput: shape.throughput(units),
                memory: shape.memory,
                price_per_hour: units as f64 * rt.price_per_hour,
            });
        }
        Ok(reports)
    }

    /// Checks the limits and prices provisioned stages and the parameter server.
    fn finish(
        &self,
        plan: &SchedulingPlan,
        reports: Vec<StageReport>,
        servers: Option<ServerReport>,
    ) -> Result<Evaluation, Infeasible> {
        let mut used = vec![0u64; self.num_types()];
        for r in &reports {
            used[r.stage.ty] += r.units;
        }
        for (i, l) in self.limits().iter().enumerate() {
            let need = l.used(&used);
            if need > l.cap {
                return Err(l.exceeded(i, plan, need));
            }
        }
        let (bottleneck, throughput) = reports
            .iter()
            .enumerate()
            .map(|(i, r)| (i, r.throughput))
            .fold((0, f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a });
        let throughput = servers
            .as_ref()
            .map_or(throughput, |s| throughput.min(s.throughput));
        // Whole instances: the shards share their type's instances with the stages.
        if let Some(s) = &servers {
            used[s.ty] += s.shards;
        }
        let rented = self.rental.rent(&self.catalog, &used);
        // The idle units' price is added last, so that without any the sum is the
        // per-unit model's to the bit.
        let idle: f64 = rented
            .iter()
            .map(|r| r.idle as f64 * self.catalog.types[r.ty].price_per_hour)
            .sum();
        let price_per_hour: f64 = reports.iter().map(|r| r.price_per_hour).sum::<f64>()
            + servers.as_ref().map_or(0.0, |s| s.price_per_hour)
            + idle;
        let wall_time = match self.objective {
            Objective::RequiredRate => self.constraint.wall_time(),
            Objective::Duration => self.constraint.samples / throughput,
        };
        Ok(Evaluation {
            stages: reports,
            parameter_servers: servers,
            throughput,
            bottleneck,
            rented,
            price_per_hour,
            wall_time,
            billed_time: wall_time.max(self.catalog.billing_minimum),
            cost: price_per_hour / 3600.0 * wall_time.max(self.catalog.billing_minimum),
        })
    }

    /// Evaluates the plan that merges runs of `types` (one type per layer).
    pub fn evaluate_assignment(&self, types: &[usize]) -> Result<Evaluation, Infeasible> {
        self.evaluate(&SchedulingPlan::from_assignment(types))
    }
}
