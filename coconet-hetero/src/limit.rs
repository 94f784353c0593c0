//! Availability limits: what the units of a plan may add up to.
//!
//! Two kinds, one shape — `Σ_t per_unit[t] · k_t ≤ cap`: a type's availability cap (that
//! type, one per unit) and a host's cores (the types that run on it, each unit taking its
//! threads). The cost model checks every limit after provisioning; the exact DP tracks
//! the ones that bind.

use crate::catalog::Catalog;
use crate::error::Infeasible;
use crate::plan::SchedulingPlan;

/// One limit on the units of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// What is limited, for messages: "type `t4`" or "host `local`".
    pub name: String,
    /// What one unit draws, for messages: "units" or "cores".
    pub unit: &'static str,
    /// The bound.
    pub cap: u64,
    /// `per_unit[t]`: how much of the limit one unit of type `t` draws (0: none).
    pub per_unit: Vec<u64>,
    /// The host whose cores this is, if it is a host's.
    pub host: Option<usize>,
}

impl Limit {
    /// How much of the limit `units[t]` units of each type draw.
    pub fn used(&self, units: &[u64]) -> u64 {
        self.per_unit
            .iter()
            .zip(units)
            .map(|(&w, &k)| w.saturating_mul(k))
            .fold(0u64, u64::saturating_add)
    }

    /// Whether units of type `t` draw on this limit.
    pub fn draws_on(&self, t: usize) -> bool {
        self.per_unit[t] > 0
    }

    /// The error for `plan`'s stages needing `need` of this limit, the `index`-th.
    pub(crate) fn exceeded(&self, index: usize, plan: &SchedulingPlan, need: u64) -> Infeasible {
        Infeasible::Cap {
            limit: index,
            name: self.name.clone(),
            unit: self.unit,
            stages: (0..plan.stages.len())
                .filter(|&s| self.draws_on(plan.stages[s].ty))
                .collect(),
            need,
            cap: self.cap,
        }
    }
}

/// The catalogue's limits: every type's cap, in type order, then every host's cores.
pub(crate) fn of_catalog(catalog: &Catalog) -> Vec<Limit> {
    let n = catalog.len();
    let mut limits: Vec<Limit> = catalog
        .types
        .iter()
        .enumerate()
        .filter_map(|(t, ty)| {
            let cap = ty.cap?;
            let mut per_unit = vec![0; n];
            per_unit[t] = 1;
            Some(Limit {
                name: format!("type {}", ty.name),
                unit: "units",
                cap,
                per_unit,
                host: None,
            })
        })
        .collect();
    for (h, host) in catalog.hosts.iter().enumerate() {
        limits.push(Limit {
            name: format!("host {}", host.name),
            unit: "cores",
            cap: host.cores,
            per_unit: host.threads.clone(),
            host: Some(h),
        });
    }
    limits
}

/// Each type's price plus `mu[l]` per unit it draws on each limit `l`: the prices of
/// Lagrangian pricing, which charge the limits instead of enforcing them.
pub(crate) fn priced(prices: &[f64], limits: &[Limit], mu: &[f64]) -> Vec<f64> {
    (0..prices.len())
        .map(|t| {
            prices[t]
                + limits
                    .iter()
                    .zip(mu)
                    .map(|(l, m)| m * l.per_unit[t] as f64)
                    .sum::<f64>()
        })
        .collect()
}
