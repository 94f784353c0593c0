//! The user's requirement: a minimum throughput and how much data to train on.

use serde::Deserialize;

use crate::error::InputError;
use crate::toml_util::Ctx;

/// Required throughput and total work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Constraint {
    /// Required pipeline throughput, samples per second.
    pub throughput: f64,
    /// Total samples to process (epochs × dataset size).
    pub samples: f64,
}

impl Constraint {
    /// Checks the values; a zero or negative throughput or sample count is impossible.
    pub fn new(throughput: f64, samples: f64) -> Result<Self, InputError> {
        if !(throughput.is_finite() && throughput > 0.0) {
            return Err(InputError::Constraint(format!(
                "throughput must be > 0 samples/s, got {throughput}"
            )));
        }
        if !(samples.is_finite() && samples > 0.0) {
            return Err(InputError::Constraint(format!(
                "total samples must be > 0, got {samples}"
            )));
        }
        Ok(Constraint {
            throughput,
            samples,
        })
    }

    /// Training wall time, seconds: the pipeline is fed at the required rate.
    pub fn wall_time(&self) -> f64 {
        self.samples / self.throughput
    }
}

/// `[constraint]` as written in a model file: `samples`, or `epochs` and `dataset_size`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConstraint {
    throughput: f64,
    #[serde(default)]
    samples: Option<f64>,
    #[serde(default)]
    epochs: Option<f64>,
    #[serde(default)]
    dataset_size: Option<f64>,
}

impl RawConstraint {
    pub(crate) fn validate(&self, cx: &Ctx<'_>, at: usize) -> Result<Constraint, InputError> {
        let samples = match (self.samples, self.epochs, self.dataset_size) {
            (Some(s), None, None) => s,
            (None, Some(e), Some(d)) => e * d,
            _ => {
                return Err(cx.invalid(
                    at,
                    "constraint: give either `samples` or both `epochs` and `dataset_size`",
                ));
            }
        };
        Constraint::new(self.throughput, samples)
            .map_err(|e| cx.invalid(at, format!("constraint: {e}")))
    }
}

/// A rate (samples/s) as people read it: plain up to 10^7, else in scientific notation
/// (1e30 is not a 31-digit integer).
pub fn rate(x: f64) -> String {
    if x.abs() < 1e7 {
        format!("{x}")
    } else {
        format!("{x:.4e}")
    }
}
