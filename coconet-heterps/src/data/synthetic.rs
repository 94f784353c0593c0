//! Synthetic click logs from a hidden ground-truth model, so the best achievable AUC is
//! known.
//!
//! The truth is a logistic model with one interaction: each categorical value has a
//! weight, each count feature a slope on `ln(1 + x)`, and the first two counts interact.
//! Values are drawn Zipf-distributed from slots whose cardinalities range from 4 to
//! [`GeneratorConfig::max_cardinality`] (as Criteo's do), counts log-normally, clicks
//! from the resulting probability. A model cannot beat the Bayes-optimal scorer (the true
//! probability), whose AUC and log loss on the held-out split are recorded in
//! `dataset.toml` beside the files.

use super::click_log::{DENSE_FEATURES, SPARSE_SLOTS, write_record};
use super::error::DataError;
use super::mix::mix;
use coconet_hetero::metrics;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Zipf};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What to generate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GeneratorConfig {
    /// Seed of the hidden model and of every file (the same seed writes the same bytes).
    pub seed: u64,
    /// Training files (shards).
    pub files: usize,
    /// Records per training file.
    pub rows_per_file: usize,
    /// Records in the held-out file.
    pub heldout_rows: usize,
    /// Distinct values of the largest categorical slot.
    pub max_cardinality: u64,
    /// Exponent of the Zipf distribution of categorical values (Criteo's are ~1.1).
    pub zipf_exponent: f64,
    /// Probability that a feature is missing (an empty field).
    pub missing: f64,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        GeneratorConfig {
            seed: 1,
            files: 8,
            rows_per_file: 4096,
            heldout_rows: 8192,
            max_cardinality: 10_000,
            zipf_exponent: 1.1,
            missing: 0.05,
        }
    }
}

/// A generated data set: its files and the quality of the true probabilities on the
/// held-out file (the ceiling for any model trained on it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dataset {
    /// How it was generated.
    pub config: GeneratorConfig,
    /// Training files, in generation order (paths relative to the data set's directory).
    pub train: Vec<PathBuf>,
    /// The held-out file.
    pub heldout: PathBuf,
    /// AUC of the true click probabilities on the held-out file.
    pub optimal_auc: f64,
    /// Log loss of the true click probabilities on the held-out file.
    pub optimal_log_loss: f64,
    /// Fraction of held-out records that are clicks.
    pub click_rate: f64,
}

/// The data set's description, beside its files.
const MANIFEST: &str = "dataset.toml";

/// A standard normal number determined by `(seed, a, b)` (Box–Muller).
fn normal(seed: u64, a: u64, b: u64) -> f64 {
    let unit = |x: u64| ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let (u, v) = (unit(mix(seed, a, b)), unit(mix(seed ^ 0x5555, a, b)));
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// The hidden model. Weights are functions of the seed (nothing is stored).
struct Truth {
    seed: u64,
    cardinality: [u64; SPARSE_SLOTS],
    zipf: Vec<Zipf<f64>>,
    missing: f64,
}

/// Intercept of the logit: about one record in four is a click (Criteo's rate).
const BIAS: f64 = -1.3;
/// Standard deviation of a categorical value's weight.
const VALUE_WEIGHT: f64 = 0.35;
/// Standard deviation of a count's slope.
const COUNT_WEIGHT: f64 = 0.3;
/// Weight of the product of the first two (centred) counts.
const INTERACTION: f64 = 0.4;

impl Truth {
    fn new(c: &GeneratorConfig) -> Result<Truth, DataError> {
        if c.max_cardinality < 4 {
            return Err(DataError::Invalid(format!(
                "max_cardinality must be at least 4, found {}",
                c.max_cardinality
            )));
        }
        if !(0.0..1.0).contains(&c.missing) {
            return Err(DataError::Invalid(format!(
                "missing must be in [0, 1), found {}",
                c.missing
            )));
        }
        let mut cardinality = [0; SPARSE_SLOTS];
        let ratio = c.max_cardinality as f64 / 4.0;
        for (s, card) in cardinality.iter_mut().enumerate() {
            *card = (4.0 * ratio.powf(s as f64 / (SPARSE_SLOTS - 1) as f64)).round() as u64;
        }
        let zipf = cardinality
            .iter()
            .map(|&n| {
                Zipf::new(n as f64, c.zipf_exponent).map_err(|e| {
                    DataError::Invalid(format!("zipf_exponent {}: {e}", c.zipf_exponent))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Truth {
            seed: c.seed,
            cardinality,
            zipf,
            missing: c.missing,
        })
    }

    /// Mean of `ln(1 + count)` of feature `j` (counts are log-normal around it).
    fn count_centre(j: usize) -> f64 {
        0.5 + 0.2 * j as f64
    }

    /// Draws one record: its counts, categories and true click probability.
    fn draw(
        &self,
        rng: &mut ChaCha8Rng,
    ) -> (
        [Option<i64>; DENSE_FEATURES],
        [Option<u32>; SPARSE_SLOTS],
        f64,
    ) {
        let mut logit = BIAS;
        let mut counts = [None; DENSE_FEATURES];
        let mut z = [0.0; DENSE_FEATURES];
        for (j, c) in counts.iter_mut().enumerate() {
            if rng.random::<f64>() < self.missing {
                continue;
            }
            let n: f64 = rand_distr::StandardNormal.sample(rng);
            let x = ((Self::count_centre(j) + n).exp() - 1.0).max(0.0).floor();
            *c = Some(x as i64);
            z[j] = x.ln_1p() - Self::count_centre(j);
            logit += COUNT_WEIGHT * normal(self.seed, 1000 + j as u64, 0) * z[j];
        }
        logit += INTERACTION * z[0] * z[1];
        let mut cats = [None; SPARSE_SLOTS];
        for (s, c) in cats.iter_mut().enumerate() {
            if rng.random::<f64>() < self.missing {
                continue;
            }
            let value = self.zipf[s].sample(rng) as u64 - 1;
            debug_assert!(value < self.cardinality[s]);
            *c = Some(mix(self.seed, s as u64, value) as u32);
            logit += VALUE_WEIGHT * normal(self.seed, s as u64, value);
        }
        (counts, cats, 1.0 / (1.0 + (-logit).exp()))
    }

    /// Writes `rows` records to `path`; returns the true probabilities and labels.
    fn write_file(
        &self,
        path: &Path,
        rows: usize,
        stream: u64,
    ) -> Result<(Vec<f32>, Vec<f32>), DataError> {
        let mut rng = ChaCha8Rng::seed_from_u64(mix(self.seed, 77, stream));
        let mut text = String::with_capacity(rows * 160);
        let (mut p, mut labels) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
        for _ in 0..rows {
            let (counts, cats, prob) = self.draw(&mut rng);
            let click = rng.random::<f64>() < prob;
            write_record(&mut text, click, &counts, &cats);
            p.push(prob as f32);
            labels.push(if click { 1.0 } else { 0.0 });
        }
        std::fs::write(path, text).map_err(|e| DataError::io(path, e))?;
        Ok((p, labels))
    }
}

impl Dataset {
    /// Generates the data set into `dir` (created if needed): `part-NNNNN.tsv` training
    /// files, `heldout.tsv` and the manifest `dataset.toml`.
    pub fn generate(dir: &Path, config: &GeneratorConfig) -> Result<Dataset, DataError> {
        if config.files == 0 || config.rows_per_file == 0 || config.heldout_rows == 0 {
            return Err(DataError::Invalid(
                "files, rows_per_file and heldout_rows must be positive".into(),
            ));
        }
        let truth = Truth::new(config)?;
        std::fs::create_dir_all(dir).map_err(|e| DataError::io(dir, e))?;
        let mut train = Vec::with_capacity(config.files);
        for f in 0..config.files {
            let name = PathBuf::from(format!("part-{f:05}.tsv"));
            truth.write_file(&dir.join(&name), config.rows_per_file, f as u64)?;
            train.push(name);
        }
        let heldout = PathBuf::from("heldout.tsv");
        let (p, labels) = truth.write_file(&dir.join(&heldout), config.heldout_rows, u64::MAX)?;
        let dataset = Dataset {
            config: config.clone(),
            train,
            heldout,
            optimal_auc: metrics::auc(&p, &labels).unwrap_or(0.5),
            optimal_log_loss: metrics::log_loss(&p, &labels),
            click_rate: labels.iter().map(|&l| f64::from(l)).sum::<f64>() / labels.len() as f64,
        };
        let manifest = dir.join(MANIFEST);
        let text = toml::to_string(&dataset).map_err(|e| DataError::Invalid(e.to_string()))?;
        std::fs::write(&manifest, text).map_err(|e| DataError::io(&manifest, e))?;
        Ok(dataset)
    }

    /// Reads the manifest of a data set generated into `dir`.
    pub fn open(dir: &Path) -> Result<Dataset, DataError> {
        let manifest = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&manifest).map_err(|e| DataError::io(&manifest, e))?;
        toml::from_str(&text).map_err(|e| DataError::Malformed {
            line: e
                .span()
                .map_or(0, |s| text[..s.start].lines().count().max(1)),
            path: manifest,
            message: e.message().to_string(),
        })
    }

    /// The training files as paths under `dir`.
    pub fn train_paths(&self, dir: &Path) -> Vec<PathBuf> {
        self.train.iter().map(|f| dir.join(f)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_writes_the_same_bytes_and_the_truth_is_learnable() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let config = GeneratorConfig {
            files: 2,
            rows_per_file: 300,
            heldout_rows: 4000,
            ..GeneratorConfig::default()
        };
        let da = Dataset::generate(a.path(), &config).unwrap();
        let db = Dataset::generate(b.path(), &config).unwrap();
        assert_eq!(da, db);
        for f in da.train.iter().chain([&da.heldout]) {
            let (x, y) = (a.path().join(f), b.path().join(f));
            assert_eq!(std::fs::read(x).unwrap(), std::fs::read(y).unwrap());
        }
        assert_eq!(Dataset::open(a.path()).unwrap(), da);
        // Clicks are about as frequent as Criteo's, and the truth separates them well
        // but not perfectly: there is something to learn and a ceiling below 1.
        assert!((0.15..0.4).contains(&da.click_rate), "{}", da.click_rate);
        assert!((0.7..0.9).contains(&da.optimal_auc), "{}", da.optimal_auc);
    }

    #[test]
    fn bad_configs_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        for (config, want) in [
            (
                GeneratorConfig {
                    files: 0,
                    ..GeneratorConfig::default()
                },
                "must be positive",
            ),
            (
                GeneratorConfig {
                    max_cardinality: 2,
                    ..GeneratorConfig::default()
                },
                "at least 4",
            ),
            (
                GeneratorConfig {
                    missing: 1.0,
                    ..GeneratorConfig::default()
                },
                "missing must be in",
            ),
        ] {
            let e = Dataset::generate(dir.path(), &config)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
        }
        let e = Dataset::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("dataset.toml"), "{e}");
    }
}
