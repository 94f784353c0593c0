//! The cluster catalogue: resource types (CPU servers, GPU generations, AI chips) with
//! their price, memory, roofline numbers, availability cap, the bandwidth between types,
//! and hosts: machines whose cores several types' units share.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use crate::error::InputError;
use crate::toml_util::{self, Ctx};

/// Bytes per GiB.
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
/// Bytes per second in one GB/s (decimal, as network and memory bandwidths are quoted).
pub const GBPS: f64 = 1e9;

/// Broad class of a resource type; the CPU-first baseline needs to know which types are CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceClass {
    /// General-purpose CPU server.
    Cpu,
    /// GPU.
    Gpu,
    /// Other accelerator (Kunlun XPU, TPU, ...).
    Xpu,
}

/// One kind of rentable unit.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    /// Unique name, used by model profiles.
    pub name: String,
    /// CPU, GPU or other accelerator.
    pub class: DeviceClass,
    /// Rental price of one unit, dollars per hour.
    pub price_per_hour: f64,
    /// Memory of one unit, bytes.
    pub memory_bytes: f64,
    /// Peak FLOP/s of one unit (for analytic profiles).
    pub peak_flops: f64,
    /// Memory bandwidth of one unit, bytes/s (for analytic profiles).
    pub mem_bandwidth: f64,
    /// Fraction of the roofline an analytic profile achieves (0, 1].
    pub efficiency: f64,
    /// Fixed seconds per layer per batch added to analytic profiles (kernel launches,
    /// framework dispatch): what makes tiny layers not free on an accelerator.
    pub layer_overhead: f64,
    /// Network bandwidth between two units of this type, bytes/s, used for the
    /// data-parallel all-reduce inside a stage.
    pub sync_bandwidth: f64,
    /// How many units can be rented at most (`None`: unlimited). With whole instances
    /// rented ([`crate::Rental::Instances`]) it limits the rented units, idle ones
    /// included, since those are what the provider hands out.
    pub cap: Option<u64>,
    /// Units one rentable instance holds (1: rented singly). A plan rents whole
    /// instances of the type — its stages' units together, rounded up — and pays for
    /// the idle ones (see [`crate::rental`]).
    pub units_per_instance: u64,
    /// Bytes/s one unit reads training samples at (object storage or a data-loading
    /// service over its network): the first stage reads the model's `input_bytes` per
    /// batch at this rate. `None`: data loading is free, as in the paper's model.
    pub data_bandwidth: Option<f64>,
}

/// Most units one instance may hold (a machine's accelerators; the exact DP keeps one
/// state per free slot of an instance).
pub const MAX_UNITS_PER_INSTANCE: u64 = 4096;

/// Most cores a host may have: the planner solves once per load a host can carry, and
/// prices a plan by stepping its load up core by core.
pub const MAX_HOST_CORES: u64 = 4096;

/// One machine whose cores the units of several types share.
///
/// A planner's units are otherwise independent machines. Workers of different types on
/// one machine are not: together they hold at most its cores
/// (`Σ_t threads[t] · k_t ≤ cores`, whatever the types), and their layers slow each
/// other down as more of its cores are busy (a model's `time_loaded`; see
/// [`crate::cost`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Host {
    /// Name, for reports and errors.
    pub name: String,
    /// Cores (hardware threads) the host has.
    pub cores: u64,
    /// `threads[t]`: cores one unit of type `t` takes on this host; 0 for a type that
    /// does not run here.
    pub threads: Vec<u64>,
}

/// Where the models' sparse embedding tables live: shards of a parameter server, each on
/// one unit of a type, the tables split over them (HeterPS keeps them on CPU servers).
#[derive(Debug, Clone, PartialEq)]
pub struct ParameterServer {
    /// The type whose units serve the shards.
    pub ty: usize,
    /// Bytes/s of rows and gradients one shard serves.
    pub bandwidth: f64,
}

/// All resource types, the bandwidth matrix between them, and the hosts they share.
#[derive(Debug, Clone, PartialEq)]
pub struct Catalog {
    /// Resource types, indexed by position everywhere else.
    pub types: Vec<ResourceType>,
    /// `bandwidth[a][b]`: bytes/s from one unit of type `a` to one unit of type `b`
    /// (symmetric), used for activations and gradients between pipeline stages.
    pub bandwidth: Vec<Vec<f64>>,
    /// Machines whose cores several types' units share (empty: every unit is its own
    /// machine). A type runs on at most one host.
    pub hosts: Vec<Host>,
    /// The parameter server's shards, provisioned and priced with every plan (`None`:
    /// sparse tables are free and unlimited, as in the paper's cost model).
    pub parameter_server: Option<ParameterServer>,
    /// Seconds every rented unit is billed at least (a cloud's minimum charge; 0: none).
    pub billing_minimum: f64,
    /// Seconds each message between two stages takes besides its bytes (network
    /// latency); a boundary carries two per batch, the activation and its gradient.
    pub link_latency: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCatalog {
    #[serde(default)]
    default_bandwidth_gbs: Option<Spanned<f64>>,
    #[serde(default)]
    billing_minimum_s: f64,
    #[serde(default)]
    link_latency_us: Option<Spanned<f64>>,
    types: Vec<Spanned<RawType>>,
    #[serde(default)]
    links: Vec<Spanned<RawLink>>,
    #[serde(default)]
    hosts: Vec<Spanned<RawHost>>,
    #[serde(default)]
    parameter_server: Option<Spanned<RawParameterServer>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawParameterServer {
    #[serde(rename = "type")]
    ty: String,
    #[serde(default)]
    bandwidth_gbs: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    name: String,
    cores: i64,
    threads: BTreeMap<String, i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawType {
    name: String,
    class: DeviceClass,
    price_per_hour: f64,
    memory_gib: f64,
    peak_tflops: f64,
    mem_bandwidth_gbs: f64,
    #[serde(default = "default_efficiency")]
    efficiency: f64,
    #[serde(default)]
    layer_overhead_us: f64,
    sync_bandwidth_gbs: f64,
    #[serde(default)]
    cap: Option<i64>,
    #[serde(default)]
    units_per_instance: Option<i64>,
    #[serde(default)]
    data_bandwidth_gbs: Option<f64>,
}

fn default_efficiency() -> f64 {
    1.0
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLink {
    between: [String; 2],
    bandwidth_gbs: f64,
}

impl Catalog {
    /// Reads and validates a catalogue file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, InputError> {
        let path = path.as_ref();
        let text = toml_util::read(path)?;
        Self::parse(path, &text)
    }

    /// Parses and validates catalogue TOML; `path` is only used in error messages.
    pub fn parse(path: &Path, text: &str) -> Result<Self, InputError> {
        let raw: RawCatalog = toml_util::parse_as(path, text, toml_util::FileKind::Catalogue)?;
        let cx = Ctx { path, text };
        if raw.types.is_empty() {
            return Err(cx.invalid(0, "the catalogue defines no resource types"));
        }
        let mut types = Vec::with_capacity(raw.types.len());
        let mut index = BTreeMap::new();
        for st in &raw.types {
            let at = st.span().start;
            let t = st.get_ref();
            if t.name.is_empty() {
                return Err(cx.invalid(at, "resource type with an empty name"));
            }
            if index.insert(t.name.clone(), types.len()).is_some() {
                return Err(cx.invalid(at, format!("resource type `{}` is defined twice", t.name)));
            }
            types.push(t.validate(&cx, at)?);
        }
        let known = Known {
            cx: &cx,
            types: &types,
            index: &index,
        };
        let bandwidth = known.bandwidths(&raw.links, raw.default_bandwidth_gbs.as_ref())?;
        let hosts = known.hosts(&raw.hosts)?;
        let parameter_server = match &raw.parameter_server {
            None => None,
            Some(sp) => Some(known.parameter_server(sp)?),
        };
        let billing_minimum =
            cx.non_negative(0, "billing_minimum_s", raw.billing_minimum_s, false)?;
        let link_latency = match &raw.link_latency_us {
            Some(v) => {
                cx.non_negative(v.span().start, "link_latency_us", *v.get_ref(), false)? * 1e-6
            }
            None => 0.0,
        };
        Ok(Catalog {
            types,
            bandwidth,
            hosts,
            parameter_server,
            billing_minimum,
            link_latency,
        })
    }

    /// The host type `t` runs on, if any.
    pub fn host_of(&self, t: usize) -> Option<usize> {
        self.hosts.iter().position(|h| h.threads[t] > 0)
    }

    /// Index of the type called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.types.iter().position(|t| t.name == name)
    }

    /// Number of resource types.
    pub fn len(&self) -> usize {
        self.types.len()
    }

    /// True when there are no types (never for a loaded catalogue).
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }
}

impl RawType {
    /// The type in the planner's units (bytes, FLOP/s, seconds), every field checked;
    /// `at`: where it is defined, for errors.
    fn validate(&self, cx: &Ctx, at: usize) -> Result<ResourceType, InputError> {
        let t = self;
        let what = |f: &str| format!("type `{}`: {f}", t.name);
        let cap = match t.cap {
            None => None,
            Some(c) if c >= 1 => Some(c as u64),
            Some(c) => {
                return Err(cx.invalid(at, format!("{} must be >= 1, got {c}", what("cap"))));
            }
        };
        let units_per_instance = match t.units_per_instance {
            None => 1,
            Some(n) if (1..=MAX_UNITS_PER_INSTANCE as i64).contains(&n) => n as u64,
            Some(n) => {
                return Err(cx.invalid(
                    at,
                    format!(
                        "{} must be 1..={MAX_UNITS_PER_INSTANCE}, got {n}",
                        what("units_per_instance")
                    ),
                ));
            }
        };
        if let Some(c) = cap
            && c < units_per_instance
        {
            return Err(cx.invalid(
                at,
                format!(
                    "{} ({c}) is below its units_per_instance ({units_per_instance}): not one instance could be rented",
                    what("cap")
                ),
            ));
        }
        let eff = cx.non_negative(at, &what("efficiency"), t.efficiency, true)?;
        if eff > 1.0 {
            return Err(cx.invalid(
                at,
                format!("{} must be <= 1, got {eff}", what("efficiency")),
            ));
        }
        Ok(ResourceType {
            name: t.name.clone(),
            class: t.class,
            price_per_hour: cx.non_negative(
                at,
                &what("price_per_hour"),
                t.price_per_hour,
                false,
            )?,
            memory_bytes: cx.non_negative(at, &what("memory_gib"), t.memory_gib, true)? * GIB,
            peak_flops: cx.non_negative(at, &what("peak_tflops"), t.peak_tflops, true)? * 1e12,
            mem_bandwidth: cx.non_negative(
                at,
                &what("mem_bandwidth_gbs"),
                t.mem_bandwidth_gbs,
                true,
            )? * GBPS,
            efficiency: eff,
            layer_overhead: cx.non_negative(
                at,
                &what("layer_overhead_us"),
                t.layer_overhead_us,
                false,
            )? * 1e-6,
            sync_bandwidth: cx.non_negative(
                at,
                &what("sync_bandwidth_gbs"),
                t.sync_bandwidth_gbs,
                true,
            )? * GBPS,
            cap,
            units_per_instance,
            data_bandwidth: match t.data_bandwidth_gbs {
                Some(b) => Some(cx.non_negative(at, &what("data_bandwidth_gbs"), b, true)? * GBPS),
                None => None,
            },
        })
    }
}

/// The parts of a catalogue that name resource types, read once the types are known.
struct Known<'a> {
    cx: &'a Ctx<'a>,
    types: &'a [ResourceType],
    /// Type name -> index.
    index: &'a BTreeMap<String, usize>,
}

impl Known<'_> {
    /// The type called `name`, or an error at `at` saying who (`by`) named an unknown one.
    fn type_named(&self, at: usize, by: &str, name: &str) -> Result<usize, InputError> {
        self.index.get(name).copied().ok_or_else(|| {
            self.cx.invalid(
                at,
                format!(
                    "{by} names unknown resource type `{name}` (known: {})",
                    names(self.types)
                ),
            )
        })
    }

    /// The bandwidth matrix: each link both ways, `default` (GB/s) between every other
    /// pair; a pair with neither is an error (a plan would have no price for it).
    fn bandwidths(
        &self,
        links: &[Spanned<RawLink>],
        default: Option<&Spanned<f64>>,
    ) -> Result<Vec<Vec<f64>>, InputError> {
        let (cx, types) = (self.cx, self.types);
        let n = types.len();
        let mut bw = vec![vec![f64::NAN; n]; n];
        for sl in links {
            let at = sl.span().start;
            let l = sl.get_ref();
            let a = self.type_named(at, "link", &l.between[0])?;
            let b = self.type_named(at, "link", &l.between[1])?;
            let v = cx.non_negative(at, "bandwidth_gbs", l.bandwidth_gbs, true)? * GBPS;
            if !bw[a][b].is_nan() {
                return Err(cx.invalid(
                    at,
                    format!(
                        "link {} <-> {} is defined twice",
                        l.between[0], l.between[1]
                    ),
                ));
            }
            bw[a][b] = v;
            bw[b][a] = v;
        }
        let default = match default {
            Some(d) => Some(
                cx.non_negative(d.span().start, "default_bandwidth_gbs", *d.get_ref(), true)?
                    * GBPS,
            ),
            None => None,
        };
        for a in 0..n {
            for b in 0..n {
                if bw[a][b].is_nan() {
                    match default {
                        Some(d) => bw[a][b] = d,
                        None => {
                            return Err(cx.invalid(
                                0,
                                format!(
                                    "no bandwidth between `{}` and `{}`: add a [[links]] entry or default_bandwidth_gbs",
                                    types[a].name, types[b].name
                                ),
                            ));
                        }
                    }
                }
            }
        }
        Ok(bw)
    }

    /// The hosts, each checked on its own and against the ones before it (a name
    /// defined twice, a type on two hosts).
    fn hosts(&self, raw: &[Spanned<RawHost>]) -> Result<Vec<Host>, InputError> {
        let mut hosts: Vec<Host> = Vec::with_capacity(raw.len());
        let mut host_of: Vec<Option<usize>> = vec![None; self.types.len()];
        for sh in raw {
            let host = self.host(sh.span().start, sh.get_ref(), &hosts, &mut host_of)?;
            hosts.push(host);
        }
        Ok(hosts)
    }

    /// Host `h` (at `at`), after `before`; `host_of[t]`: the host type t runs on so far,
    /// updated with h's types.
    fn host(
        &self,
        at: usize,
        h: &RawHost,
        before: &[Host],
        host_of: &mut [Option<usize>],
    ) -> Result<Host, InputError> {
        let cx = self.cx;
        if !(1..=MAX_HOST_CORES as i64).contains(&h.cores) {
            return Err(cx.invalid(
                at,
                format!(
                    "host `{}`: cores must be 1..={MAX_HOST_CORES} (one machine), got {}",
                    h.name, h.cores
                ),
            ));
        }
        if before.iter().any(|o| o.name == h.name) {
            return Err(cx.invalid(at, format!("host `{}` is defined twice", h.name)));
        }
        if h.threads.is_empty() {
            return Err(cx.invalid(
                at,
                format!("host `{}` runs no type: give `threads`", h.name),
            ));
        }
        let mut threads = vec![0u64; self.types.len()];
        for (name, &th) in &h.threads {
            let t = self.type_named(at, &format!("host `{}`", h.name), name)?;
            if th < 1 || th > h.cores {
                return Err(cx.invalid(
                    at,
                    format!(
                        "host `{}`: a unit of `{name}` must take 1..={} cores, got {th}",
                        h.name, h.cores
                    ),
                ));
            }
            // A host's units are its cores, handed out one by one: renting them by
            // instances would make idle units load the host.
            if self.types[t].units_per_instance > 1 {
                return Err(cx.invalid(
                    at,
                    format!(
                        "host `{}` runs type `{name}`, which is rented by instances of {} units: a type on a host must have units_per_instance = 1",
                        h.name, self.types[t].units_per_instance
                    ),
                ));
            }
            if let Some(other) = host_of[t] {
                return Err(cx.invalid(
                    at,
                    format!(
                        "type `{name}` runs on two hosts, `{}` and `{}`",
                        before[other].name, h.name
                    ),
                ));
            }
            host_of[t] = Some(before.len());
            threads[t] = th as u64;
        }
        Ok(Host {
            name: h.name.clone(),
            cores: h.cores as u64,
            threads,
        })
    }

    /// The parameter server: its type's units, at its own bandwidth or else the type's
    /// sync bandwidth.
    fn parameter_server(
        &self,
        sp: &Spanned<RawParameterServer>,
    ) -> Result<ParameterServer, InputError> {
        let at = sp.span().start;
        let p = sp.get_ref();
        let ty = self.type_named(at, "parameter_server", &p.ty)?;
        let bandwidth = match p.bandwidth_gbs {
            Some(b) => {
                self.cx
                    .non_negative(at, "parameter_server.bandwidth_gbs", b, true)?
                    * GBPS
            }
            None => self.types[ty].sync_bandwidth,
        };
        Ok(ParameterServer { ty, bandwidth })
    }
}

/// Comma-separated type names, for error messages.
pub fn names(types: &[ResourceType]) -> String {
    types
        .iter()
        .map(|t| t.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str = "[[types]]\nname = \"cpu\"\nclass = \"cpu\"\nprice_per_hour = 1.0\nmemory_gib = 8\npeak_tflops = 1\nmem_bandwidth_gbs = 100\nsync_bandwidth_gbs = 1\n";

    fn parse(text: &str) -> Result<Catalog, InputError> {
        Catalog::parse(Path::new("c.toml"), text)
    }

    #[test]
    fn units_are_converted() {
        let c = parse(&format!("default_bandwidth_gbs = 2\n{ONE}")).unwrap();
        let t = &c.types[0];
        assert_eq!(t.memory_bytes, 8.0 * GIB);
        assert_eq!(t.peak_flops, 1e12);
        assert_eq!(t.sync_bandwidth, 1e9);
        assert_eq!(c.bandwidth[0][0], 2e9);
        assert_eq!(t.cap, None);
        assert_eq!(t.units_per_instance, 1);
        assert_eq!(t.efficiency, 1.0);
    }

    #[test]
    fn errors_name_the_line_and_the_problem() {
        let dup = format!("default_bandwidth_gbs = 2\n{ONE}{ONE}");
        let e = parse(&dup).unwrap_err().to_string();
        assert!(
            e.starts_with("c.toml:10:") && e.contains("defined twice"),
            "{e}"
        );
        let e = parse(ONE).unwrap_err().to_string();
        assert!(e.contains("no bandwidth between `cpu` and `cpu`"), "{e}");
        let link = format!("{ONE}[[links]]\nbetween = [\"cpu\", \"gpu\"]\nbandwidth_gbs = 1\n");
        let e = parse(&link).unwrap_err().to_string();
        assert!(
            e.starts_with("c.toml:9:") && e.contains("unknown resource type `gpu`"),
            "{e}"
        );
        let neg = format!(
            "default_bandwidth_gbs = 2\n{}",
            ONE.replace("price_per_hour = 1.0", "price_per_hour = -1.0")
        );
        let e = parse(&neg).unwrap_err().to_string();
        assert!(
            e.contains("price_per_hour must be finite and >= 0, got -1"),
            "{e}"
        );
        let cap = format!("default_bandwidth_gbs = 2\n{ONE}cap = 0\n");
        assert!(
            parse(&cap)
                .unwrap_err()
                .to_string()
                .contains("cap must be >= 1")
        );
        // One type with `extra` lines: the error it is refused with.
        let refused = |extra: &str| {
            parse(&format!("default_bandwidth_gbs = 2\n{ONE}{extra}"))
                .unwrap_err()
                .to_string()
        };
        let e = refused("units_per_instance = 0\n");
        assert!(
            e.starts_with("c.toml:2:")
                && e.contains("type `cpu`: units_per_instance must be 1..=4096, got 0"),
            "{e}"
        );
        let e = refused(
            "units_per_instance = 8\n[[hosts]]\nname = \"m\"\ncores = 2\nthreads = { cpu = 1 }\n",
        );
        assert!(
            e.contains("host `m` runs type `cpu`, which is rented by instances of 8 units"),
            "{e}"
        );
        let e = refused("units_per_instance = 8\ncap = 4\n");
        assert!(
            e.contains("type `cpu`: cap (4) is below its units_per_instance (8)"),
            "{e}"
        );
        let eight = parse(&format!(
            "default_bandwidth_gbs = 2\n{ONE}units_per_instance = 8\n"
        ))
        .unwrap();
        assert_eq!(eight.types[0].units_per_instance, 8);
        let eff = format!("default_bandwidth_gbs = 2\n{ONE}efficiency = 1.5\n");
        assert!(
            parse(&eff)
                .unwrap_err()
                .to_string()
                .contains("efficiency must be <= 1")
        );
        let host = |h: &str| parse(&format!("default_bandwidth_gbs = 2\n{ONE}{h}"));
        let e = host("[[hosts]]\nname = \"m\"\ncores = 2\nthreads = { cpu = 3 }\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("c.toml:10:") && e.contains("`cpu` must take 1..=2 cores, got 3"),
            "{e}"
        );
        let e = host("[[hosts]]\nname = \"m\"\ncores = 2\nthreads = { gpu = 1 }\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown resource type `gpu`"), "{e}");
        let twice = "[[hosts]]\nname = \"m\"\ncores = 2\nthreads = { cpu = 1 }\n\
                     [[hosts]]\nname = \"n\"\ncores = 4\nthreads = { cpu = 1 }\n";
        let e = host(twice).unwrap_err().to_string();
        assert!(e.contains("`cpu` runs on two hosts, `m` and `n`"), "{e}");
        let e = host("[[hosts]]\nname = \"m\"\ncores = 5000\nthreads = { cpu = 1 }\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cores must be 1..=4096 (one machine), got 5000"),
            "{e}"
        );
        let c = host("[[hosts]]\nname = \"m\"\ncores = 2\nthreads = { cpu = 2 }\n").unwrap();
        assert_eq!(c.hosts[0].threads, vec![2]);
        assert_eq!(c.host_of(0), Some(0));
        let unknown = format!("default_bandwidth_gbs = 2\n{ONE}colour = \"red\"\n");
        assert!(
            parse(&unknown)
                .unwrap_err()
                .to_string()
                .contains("unknown field `colour`")
        );
    }
}
