//! A stage's time as a function of its replica count: what the cost model (see
//! [`crate::cost`] for the formulas) and provisioning ([`crate::provision`]) both read.

use crate::sync::SyncModel;

/// Whether a stage's boundary transfers (activations out, gradients in) take time of
/// its own or run beside its compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transfers {
    /// After the compute, `C + D` per batch: the paper's model, the conservative one.
    #[default]
    Serial,
    /// Beside the compute, `max(C, D)` per batch: a pipeline with micro-batches in
    /// flight keeps the network (or copy engine) and the processor busy at once, so the
    /// slower of the two bounds the stage.
    Overlapped,
}

/// What a stage's time depends on, precomputed; see [`crate::cost`] for the formulas.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageShape<'a> {
    /// Compute seconds per batch on one unit.
    pub compute: f64,
    /// Inter-stage transfer seconds per batch (both boundaries, both directions).
    pub transfer: f64,
    /// Dense parameter bytes all-reduced across replicas.
    pub dense_bytes: f64,
    /// Bytes/s of the all-reduce network.
    pub sync_bandwidth: f64,
    /// Bytes/s of one unit's memory (the optimizer update's traffic).
    pub memory_bandwidth: f64,
    /// How the replicas synchronise.
    pub sync: &'a SyncModel,
    /// Samples per batch per replica.
    pub batch: f64,
    /// Bytes one replica needs.
    pub memory: f64,
    /// Whether the transfers overlap the compute.
    pub transfers: Transfers,
    /// Fraction of the compute the synchronisation can hide behind (0: none, the
    /// paper's; about 2/3 when the all-reduce runs during the backward pass, as DDP's
    /// bucketed all-reduce does).
    pub sync_overlap: f64,
}

impl StageShape<'_> {
    /// Per-batch time of one unit working alone (`C + D`, or `max(C, D)` with the
    /// transfers overlapped).
    pub fn single_unit_time(&self) -> f64 {
        match self.transfers {
            Transfers::Serial => self.compute + self.transfer,
            Transfers::Overlapped => self.compute.max(self.transfer),
        }
    }

    /// Seconds to move the dense parameters once over the sync network (`S = G / bw`).
    pub fn sync_time(&self) -> f64 {
        self.dense_bytes / self.sync_bandwidth
    }

    /// Seconds of the synchronisation with `k` replicas: `2(k−1)/k · S` under the
    /// paper's ring, else the cheapest schedule's (see [`SyncModel`]).
    pub fn sync_seconds(&self, k: u64) -> f64 {
        if self.dense_bytes == 0.0 {
            return 0.0;
        }
        let (per_byte, _) =
            self.sync
                .seconds_per_byte(k, self.memory_bandwidth, self.sync_bandwidth);
        self.dense_bytes * per_byte
    }

    /// The single-unit time without the part of the compute the synchronisation hides
    /// behind (`overlap · C`): what the synchronisation adds to, `T₁'`. Like `T₁` it
    /// never falls as the compute or the transfers grow (so a busier host never makes a
    /// stage faster): `(1 − overlap)·C + D`, or `max((1 − overlap)·C, D)` with the
    /// transfers overlapped.
    pub fn exposed_time(&self) -> f64 {
        let rest = (1.0 - self.sync_overlap) * self.compute;
        match self.transfers {
            Transfers::Serial => rest + self.transfer,
            Transfers::Overlapped => rest.max(self.transfer),
        }
    }

    /// Per-batch time with `k` replicas, `T(k) = T₁ + sync(k)`, or with part of the
    /// compute hiding the synchronisation `max(T₁, T₁' + sync(k))` (see
    /// [`StageShape::exposed_time`]).
    pub fn time(&self, k: u64) -> f64 {
        self.single_unit_time()
            .max(self.exposed_time() + self.sync_seconds(k))
    }

    /// Samples per second with `k` replicas, `k·B / T(k)` (infinite for a zero-time stage).
    pub fn throughput(&self, k: u64) -> f64 {
        let t = self.time(k);
        if t <= 0.0 {
            f64::INFINITY
        } else {
            k as f64 * self.batch / t
        }
    }

    /// Whether `k` replicas reach `required` samples/s (`k·B ≥ required·T(k)`, no division).
    pub fn meets(&self, k: u64, required: f64) -> bool {
        k as f64 * self.batch >= required * self.time(k)
    }
}
