//! A stage's time as a function of its replica count: what the cost model (see
//! [`crate::cost`] for the formulas) and provisioning ([`crate::provision`]) both read.

/// What a stage's time depends on, precomputed; see [`crate::cost`] for the formulas.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageShape {
    /// Compute seconds per batch on one unit.
    pub compute: f64,
    /// Inter-stage transfer seconds per batch (both boundaries, both directions).
    pub transfer: f64,
    /// Dense parameter bytes all-reduced across replicas.
    pub dense_bytes: f64,
    /// Bytes/s of the all-reduce network.
    pub sync_bandwidth: f64,
    /// Samples per batch per replica.
    pub batch: f64,
    /// Bytes one replica needs.
    pub memory: f64,
}

impl StageShape {
    /// Per-batch time of one unit working alone (`C + D`).
    pub fn single_unit_time(&self) -> f64 {
        self.compute + self.transfer
    }

    /// Seconds to move the dense parameters once over the sync network (`S = G / bw`).
    pub fn sync_time(&self) -> f64 {
        self.dense_bytes / self.sync_bandwidth
    }

    /// Per-batch time with `k` replicas, `T(k) = C + D + 2(k−1)/k · S`.
    pub fn time(&self, k: u64) -> f64 {
        let kf = k as f64;
        self.single_unit_time() + 2.0 * (kf - 1.0) / kf * self.sync_time()
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
