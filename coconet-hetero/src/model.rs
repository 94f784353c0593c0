//! The model to place: an ordered chain of layers with per-resource-type profiles.
//!
//! A layer's time on a type is either *measured* (seconds per batch, forward plus
//! backward, in `[layers.time]`) or *analytic*: a roofline estimate
//! `max(flops / peak_flops, bytes / mem_bandwidth) / efficiency + layer_overhead` from the layer's
//! `flops` and `bytes` (both per batch, forward plus backward) and the catalogue's
//! numbers. A measured value wins over the analytic one for the same type; a type
//! with neither is an error, so a missing profile is never silently treated as free.
//!
//! A type that runs on a shared host (see [`crate::catalog::Host`]) may also give
//! `[layers.time_loaded]`: seconds per batch when every core of its host is busy. The
//! cost model interpolates between the two by how many of the host's cores a plan uses.

use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use crate::batch::MAX_BATCH_SIZE;
use crate::catalog::{Catalog, names};
use crate::constraint::{Constraint, RawConstraint};
use crate::error::InputError;
use crate::toml_util::{self, Ctx};

/// What a layer does; the RL policy uses it as a feature and the CPU-first baseline
/// keeps the first (input/embedding) layer on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerKind {
    /// Sparse embedding lookup (IO/memory bound; tables live in the parameter server).
    Embedding,
    /// Fully connected.
    Fc,
    /// Convolution.
    Conv,
    /// Self-attention block.
    Attention,
    /// Transformer block (attention + MLP).
    Transformer,
    /// Pooling / concatenation / reshaping.
    Pool,
    /// Loss (softmax, NCE, ...).
    Loss,
    /// Anything else.
    Other,
}

impl LayerKind {
    /// All kinds, in one-hot order.
    pub const ALL: [LayerKind; 8] = [
        LayerKind::Embedding,
        LayerKind::Fc,
        LayerKind::Conv,
        LayerKind::Attention,
        LayerKind::Transformer,
        LayerKind::Pool,
        LayerKind::Loss,
        LayerKind::Other,
    ];

    /// Position in [`LayerKind::ALL`].
    pub fn index(self) -> usize {
        Self::ALL.iter().position(|&k| k == self).unwrap_or(0)
    }
}

/// One layer with its profile resolved against a catalogue.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    /// Name, for reports.
    pub name: String,
    /// Kind.
    pub kind: LayerKind,
    /// `time[t]`: seconds per batch (forward + backward) on one unit of type `t`, with
    /// nothing else running on its host.
    pub time: Vec<f64>,
    /// `time_loaded[t]`: the same with every core of the type's host busy; equal to
    /// `time[t]` where not measured (and for types on no host).
    pub time_loaded: Vec<f64>,
    /// Bytes of this layer's output activation per batch; the gradient sent back has the same size.
    pub activation_bytes: f64,
    /// Dense parameter bytes (synchronised by all-reduce across a stage's replicas).
    pub dense_param_bytes: f64,
    /// Sparse parameter bytes (embedding tables; live in the parameter server).
    pub sparse_param_bytes: f64,
    /// Bytes of embedding rows pulled from the parameter server and of their gradients
    /// pushed back, per batch (default for a layer with a table: twice its activation,
    /// which holds every row it looked up).
    pub sparse_traffic_bytes: f64,
    /// Memory one replica needs for this layer, bytes.
    pub memory_bytes: f64,
    /// Bytes of activations one replica keeps per batch for the backward pass: the part
    /// of `memory_bytes` that grows with the batch and with the batches in flight
    /// (default `2·activation_bytes`, [`default_memory_bytes`]'s share; at most
    /// `memory_bytes`).
    pub activation_memory_bytes: f64,
}

/// A chain model.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// Name, for reports.
    pub name: String,
    /// Samples per batch processed by one replica per step: the batch the profiles
    /// were taken at; at most [`MAX_BATCH_SIZE`] (2^32) in a file.
    pub batch_size: f64,
    /// `batch_sizes[t]`: samples per batch a replica on type `t` steps with (the file's
    /// `[batch_sizes]`, else `batch_size`); see [`crate::batch`] for how times, memory and
    /// transfers scale with it. Empty in a model built in code means `batch_size` for
    /// every type.
    pub batch_sizes: Vec<f64>,
    /// Bytes of training data one batch of `batch_size` reads (the samples as stored):
    /// the first stage loads them at its type's `data_bandwidth`.
    pub input_bytes: f64,
    /// Layers in execution order.
    pub layers: Vec<Layer>,
    /// Default constraint written in the model file, if any.
    pub constraint: Option<Constraint>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    batch_size: f64,
    #[serde(default)]
    batch_sizes: std::collections::BTreeMap<Spanned<String>, Spanned<f64>>,
    #[serde(default)]
    input_bytes: Option<Spanned<f64>>,
    #[serde(default)]
    constraint: Option<Spanned<RawConstraint>>,
    layers: Vec<Spanned<RawLayer>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLayer {
    name: String,
    kind: LayerKind,
    #[serde(default)]
    flops: Option<f64>,
    #[serde(default)]
    bytes: Option<f64>,
    #[serde(default)]
    time: std::collections::BTreeMap<Spanned<String>, Spanned<f64>>,
    #[serde(default)]
    time_loaded: std::collections::BTreeMap<Spanned<String>, Spanned<f64>>,
    activation_bytes: f64,
    #[serde(default)]
    dense_param_bytes: f64,
    #[serde(default)]
    sparse_param_bytes: f64,
    #[serde(default)]
    sparse_traffic_bytes: Option<f64>,
    #[serde(default)]
    memory_bytes: Option<f64>,
    #[serde(default)]
    activation_memory_bytes: Option<f64>,
}

/// `batch` (the value of `what`) if it is at most [`MAX_BATCH_SIZE`], else the error.
fn at_most_max_batch(cx: &Ctx, at: usize, what: &str, batch: f64) -> Result<f64, InputError> {
    if batch <= MAX_BATCH_SIZE {
        Ok(batch)
    } else {
        Err(cx.invalid(
            at,
            format!(
                "{what} must be at most 2^32 = {MAX_BATCH_SIZE} samples per batch (a larger one is a mistake), got {batch}"
            ),
        ))
    }
}

/// Default memory need of one replica when a layer gives none: dense parameters,
/// gradients and two Adam moments (4×), the touched sparse rows are negligible because
/// tables live in the parameter server, plus the activation kept for backward and its
/// gradient (2×).
pub fn default_memory_bytes(dense_param_bytes: f64, activation_bytes: f64) -> f64 {
    4.0 * dense_param_bytes + 2.0 * activation_bytes
}

impl Model {
    /// Reads and validates a model file against `catalog`.
    pub fn load(path: impl AsRef<Path>, catalog: &Catalog) -> Result<Self, InputError> {
        let path = path.as_ref();
        let text = toml_util::read(path)?;
        Self::parse(path, &text, catalog)
    }

    /// Parses and validates model TOML; `path` is only used in error messages.
    pub fn parse(path: &Path, text: &str, catalog: &Catalog) -> Result<Self, InputError> {
        let raw: RawModel = toml_util::parse_as(path, text, toml_util::FileKind::Model)?;
        let cx = Ctx { path, text };
        let batch_size = at_most_max_batch(
            &cx,
            0,
            "batch_size",
            cx.non_negative(0, "batch_size", raw.batch_size, true)?,
        )?;
        if raw.layers.is_empty() {
            return Err(cx.invalid(0, "the model has no layers"));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = raw.layers.iter().find(|l| !seen.insert(&l.get_ref().name)) {
            return Err(cx.invalid(
                dup.span().start,
                format!(
                    "two layers are named `{}`: reports and plans name layers, so names must differ",
                    dup.get_ref().name
                ),
            ));
        }
        let mut layers = Vec::with_capacity(raw.layers.len());
        for sl in &raw.layers {
            layers.push(sl.get_ref().validate(&cx, sl.span().start, catalog)?);
        }
        let constraint = match &raw.constraint {
            Some(c) => Some(c.get_ref().validate(&cx, c.span().start)?),
            None => None,
        };
        let batch_sizes = batch_sizes(&cx, &raw.batch_sizes, batch_size, catalog)?;
        let input_bytes = match &raw.input_bytes {
            Some(v) => cx.non_negative(v.span().start, "input_bytes", *v.get_ref(), false)?,
            None => 0.0,
        };
        Ok(Model {
            name: raw.name,
            batch_size,
            batch_sizes,
            input_bytes,
            layers,
            constraint,
        })
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True for a model without layers (never for a loaded model).
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

/// Values per resource type, keyed by the names the file gives (`time`, `time_loaded`,
/// `[batch_sizes]`).
type PerType = std::collections::BTreeMap<Spanned<String>, Spanned<f64>>;

/// Per type, the batch a replica steps with: `[batch_sizes]`'s, else `batch_size`.
fn batch_sizes(
    cx: &Ctx,
    raw: &PerType,
    batch_size: f64,
    catalog: &Catalog,
) -> Result<Vec<f64>, InputError> {
    let mut batch_sizes = vec![batch_size; catalog.len()];
    for (name, b) in raw {
        let t = catalog.index_of(name.get_ref()).ok_or_else(|| {
            cx.invalid(
                name.span().start,
                format!(
                    "unknown resource type `{}` in [batch_sizes] (known: {})",
                    name.get_ref(),
                    names(&catalog.types)
                ),
            )
        })?;
        let what = format!("batch_sizes.{}", name.get_ref());
        let at = b.span().start;
        batch_sizes[t] = at_most_max_batch(
            cx,
            at,
            &what,
            cx.non_negative(at, &what, *b.get_ref(), true)?,
        )?;
    }
    Ok(batch_sizes)
}

impl RawLayer {
    /// The layer with every field checked and the defaults filled in; `at`: where it is
    /// defined, for errors.
    fn validate(&self, cx: &Ctx, at: usize, catalog: &Catalog) -> Result<Layer, InputError> {
        let l = self;
        let what = |f: &str| format!("layer `{}`: {f}", l.name);
        let nn = |f: &str, v: f64| cx.non_negative(at, &what(f), v, false);
        let activation_bytes = nn("activation_bytes", l.activation_bytes)?;
        let dense_param_bytes = nn("dense_param_bytes", l.dense_param_bytes)?;
        let sparse_param_bytes = nn("sparse_param_bytes", l.sparse_param_bytes)?;
        let sparse_traffic_bytes = match l.sparse_traffic_bytes {
            Some(b) => nn("sparse_traffic_bytes", b)?,
            None if sparse_param_bytes > 0.0 => 2.0 * activation_bytes,
            None => 0.0,
        };
        let memory_bytes = match l.memory_bytes {
            Some(m) => nn("memory_bytes", m)?,
            None => default_memory_bytes(dense_param_bytes, activation_bytes),
        };
        let activation_memory_bytes = match l.activation_memory_bytes {
            Some(m) if m > memory_bytes => {
                return Err(cx.invalid(
                    at,
                    what(&format!(
                        "activation_memory_bytes ({m}) is more than memory_bytes ({memory_bytes}), which holds it"
                    )),
                ));
            }
            Some(m) => nn("activation_memory_bytes", m)?,
            None => (2.0 * activation_bytes).min(memory_bytes),
        };
        let analytic = match (l.flops, l.bytes) {
            (Some(f), Some(b)) => Some((nn("flops", f)?, nn("bytes", b)?)),
            (None, None) => None,
            _ => {
                return Err(cx.invalid(
                    at,
                    what("an analytic profile needs both `flops` and `bytes`"),
                ));
            }
        };
        let (time, time_loaded) = l.times(cx, at, catalog, analytic)?;
        Ok(Layer {
            name: l.name.clone(),
            kind: l.kind,
            time,
            time_loaded,
            activation_bytes,
            dense_param_bytes,
            sparse_param_bytes,
            sparse_traffic_bytes,
            memory_bytes,
            activation_memory_bytes,
        })
    }

    /// Seconds per type, alone and loaded: measured where the file gives them, else
    /// from the `analytic` (FLOPs, bytes) roofline; loaded defaults to alone.
    fn times(
        &self,
        cx: &Ctx,
        at: usize,
        catalog: &Catalog,
        analytic: Option<(f64, f64)>,
    ) -> Result<(Vec<f64>, Vec<f64>), InputError> {
        let mut time = self.measured(cx, catalog, &self.time, "time")?;
        let mut time_loaded = self.measured(cx, catalog, &self.time_loaded, "time_loaded")?;
        self.check_loaded(cx, catalog)?;
        for (t, ty) in catalog.types.iter().enumerate() {
            if time[t].is_nan() {
                match analytic {
                    Some((f, b)) => {
                        time[t] = (f / ty.peak_flops).max(b / ty.mem_bandwidth) / ty.efficiency
                            + ty.layer_overhead;
                    }
                    None => {
                        return Err(cx.invalid(
                            at,
                            format!(
                                "layer `{}` has no profile for resource type `{}`: give `time.{}` or `flops` and `bytes`",
                                self.name, ty.name, ty.name
                            ),
                        ));
                    }
                }
            }
            if time_loaded[t].is_nan() {
                time_loaded[t] = time[t];
            }
        }
        Ok((time, time_loaded))
    }

    /// The seconds `table` (the file's `field`) gives per type; NaN where it gives none.
    fn measured(
        &self,
        cx: &Ctx,
        catalog: &Catalog,
        table: &PerType,
        field: &str,
    ) -> Result<Vec<f64>, InputError> {
        let mut out = vec![f64::NAN; catalog.len()];
        for (name, secs) in table {
            let t = catalog.index_of(name.get_ref()).ok_or_else(|| {
                cx.invalid(
                    name.span().start,
                    format!(
                        "layer `{}`: unknown resource type `{}` in its profile (known: {})",
                        self.name,
                        name.get_ref(),
                        names(&catalog.types)
                    ),
                )
            })?;
            out[t] = cx.non_negative(
                secs.span().start,
                &format!("layer `{}`: {field} on `{}`", self.name, name.get_ref()),
                *secs.get_ref(),
                false,
            )?;
        }
        Ok(out)
    }

    /// A loaded time means something only for a type that shares a host's cores with
    /// others: not for one on no host, nor for one whose unit takes every core.
    fn check_loaded(&self, cx: &Ctx, catalog: &Catalog) -> Result<(), InputError> {
        for name in self.time_loaded.keys() {
            let Some(t) = catalog.index_of(name.get_ref()) else {
                continue;
            };
            let why = match catalog.host_of(t) {
                None => Some(
                    "a type that runs on no host (add it to a [[hosts]] entry of the catalogue)"
                        .to_string(),
                ),
                Some(h) if catalog.hosts[h].threads[t] == catalog.hosts[h].cores => Some(format!(
                    "a type whose unit takes every core of host `{}` alone (loaded is alone: give only `time`)",
                    catalog.hosts[h].name
                )),
                Some(_) => None,
            };
            if let Some(why) = why {
                return Err(cx.invalid(
                    name.span().start,
                    format!(
                        "layer `{}`: `time_loaded.{}` for {why}",
                        self.name,
                        name.get_ref()
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        let text = "default_bandwidth_gbs = 1\n[[types]]\nname = \"cpu\"\nclass = \"cpu\"\nprice_per_hour = 1\nmemory_gib = 8\npeak_tflops = 1\nmem_bandwidth_gbs = 100\nsync_bandwidth_gbs = 1\nefficiency = 0.5\nlayer_overhead_us = 10\n[[types]]\nname = \"gpu\"\nclass = \"gpu\"\nprice_per_hour = 3\nmemory_gib = 16\npeak_tflops = 100\nmem_bandwidth_gbs = 1000\nsync_bandwidth_gbs = 10\n";
        Catalog::parse(Path::new("c.toml"), text).unwrap()
    }

    fn parse(layers: &str) -> Result<Model, InputError> {
        Model::parse(
            Path::new("m.toml"),
            &format!("name = \"m\"\nbatch_size = 4\n{layers}"),
            &catalog(),
        )
    }

    #[test]
    fn analytic_and_measured_profiles() {
        let m = parse("[[layers]]\nname = \"a\"\nkind = \"fc\"\nflops = 1e12\nbytes = 1e9\nactivation_bytes = 8\ndense_param_bytes = 100\n[layers.time]\ngpu = 0.25\n").unwrap();
        let l = &m.layers[0];
        // cpu: max(1e12 / 1e12, 1e9 / 1e11) / 0.5 + 10 us
        assert!((l.time[0] - (2.0 + 10e-6)).abs() < 1e-12);
        // gpu: measured wins over analytic
        assert_eq!(l.time[1], 0.25);
        assert_eq!(l.memory_bytes, default_memory_bytes(100.0, 8.0));
        assert_eq!(l.memory_bytes, 416.0);
        assert!(m.constraint.is_none());
        assert_eq!(m.batch_sizes, [4.0, 4.0]);
        assert_eq!(l.activation_memory_bytes, 16.0);
        let e = parse("[[layers]]\nname = \"a\"\nkind = \"fc\"\nflops = 1\nbytes = 1\nactivation_bytes = 8\nmemory_bytes = 10\nactivation_memory_bytes = 11\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("activation_memory_bytes (11) is more than memory_bytes (10)"),
            "{e}"
        );
    }

    /// Two layers of one name, and a batch beyond what f64 counts exactly, are refused
    /// (both were accepted: the second planned at 1.76e22 samples/s).
    #[test]
    fn duplicate_layer_names_and_huge_batches_are_refused() {
        let layer = |n: &str| {
            format!(
                "[[layers]]\nname = \"{n}\"\nkind = \"fc\"\nactivation_bytes = 1\nflops = 1\nbytes = 1\n"
            )
        };
        let e = parse(&format!("{}{}{}", layer("a"), layer("b"), layer("a")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("two layers are named `a`"), "{e}");
        let e = Model::parse(
            Path::new("m.toml"),
            &format!(
                "name = \"m\"\nbatch_size = 18446744073709551615\n{}",
                layer("a")
            ),
            &catalog(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("batch_size must be at most 2^32"), "{e}");
    }

    #[test]
    fn batch_sizes_per_type() {
        let layer =
            "[[layers]]\nname = \"a\"\nkind = \"fc\"\nactivation_bytes = 1\nflops = 1\nbytes = 1\n";
        let m = parse(&format!("[batch_sizes]\ngpu = 64\n{layer}")).unwrap();
        assert_eq!(m.batch_sizes, [4.0, 64.0]);
        let e = parse(&format!("[batch_sizes]\ntpu = 64\n{layer}"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("m.toml:4:")
                && e.contains("unknown resource type `tpu` in [batch_sizes]"),
            "{e}"
        );
        let e = parse(&format!("[batch_sizes]\ngpu = 0\n{layer}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch_sizes.gpu must be"), "{e}");
    }

    #[test]
    fn profile_errors() {
        let e =
            parse("[[layers]]\nname = \"a\"\nkind = \"fc\"\nflops = 1.0\nactivation_bytes = 1\n")
                .unwrap_err()
                .to_string();
        assert!(
            e.starts_with("m.toml:3:") && e.contains("needs both `flops` and `bytes`"),
            "{e}"
        );
        let e = parse("[[layers]]\nname = \"a\"\nkind = \"fc\"\nactivation_bytes = 1\n[layers.time]\ncpu = -0.5\ngpu = 1\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("m.toml:8:") && e.contains("time on `cpu` must be finite and >= 0"),
            "{e}"
        );
        let e = parse("[[layers]]\nname = \"a\"\nkind = \"lstm\"\nactivation_bytes = 1\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("m.toml:5:") && e.contains("unknown variant `lstm`"),
            "{e}"
        );
        let e = parse("").unwrap_err().to_string();
        assert!(e.contains("layers"), "{e}");
        let e = parse("[[layers]]\nname = \"a\"\nkind = \"fc\"\nactivation_bytes = 1\n[layers.time]\ncpu = 1\ngpu = 1\n[layers.time_loaded]\ncpu = 2\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("m.toml:11:")
                && e.contains("`time_loaded.cpu` for a type that runs on no host"),
            "{e}"
        );
    }

    #[test]
    fn constraint_forms() {
        let layer =
            "[[layers]]\nname = \"a\"\nkind = \"fc\"\nactivation_bytes = 1\nflops = 1\nbytes = 1\n";
        let m = parse(&format!(
            "[constraint]\nthroughput = 10\nepochs = 2\ndataset_size = 50\n{layer}"
        ))
        .unwrap();
        assert_eq!(
            m.constraint,
            Some(Constraint {
                throughput: 10.0,
                samples: 100.0
            })
        );
        let e = parse(&format!(
            "[constraint]\nthroughput = 10\nepochs = 2\n{layer}"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("either `samples` or both `epochs` and `dataset_size`"),
            "{e}"
        );
        let e = parse(&format!(
            "[constraint]\nthroughput = 0\nsamples = 5\n{layer}"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("throughput must be > 0"), "{e}");
    }
}
