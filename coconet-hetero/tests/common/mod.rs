//! Shared test helpers: random problem instances and an independent, naive re-implementation
//! of the cost model (loops instead of prefix sums, unit search by counting up).
#![allow(dead_code)]

use coconet_hetero::catalog::GIB;
use coconet_hetero::{
    Catalog, Constraint, DeviceClass, Layer, LayerKind, Model, Problem, ResourceType,
    SchedulingPlan,
};
use proptest::prelude::*;

/// Random instance: up to `max_layers` layers, up to `max_types` types, optional caps.
pub fn arb_problem(max_layers: usize, max_types: usize) -> impl Strategy<Value = Problem> {
    (1..=max_layers, 1..=max_types).prop_flat_map(|(l_n, t_n)| {
        let layer = (
            prop::collection::vec(0.001f64..0.1, t_n),
            prop_oneof![Just(0.0), 1e5f64..2e8],
            prop_oneof![Just(0.0), 1e5f64..4e8],
            0.1f64..6.0,
        );
        let ty = (
            0.1f64..10.0,
            1.0f64..16.0,
            1.0f64..50.0,
            prop_oneof![Just(None), (1u64..=6).prop_map(Some)],
        );
        (
            prop::collection::vec(layer, l_n),
            prop::collection::vec(ty, t_n),
            prop::collection::vec(1.0f64..50.0, t_n * t_n),
            64.0f64..1024.0,
            1e3f64..1e5,
        )
            .prop_map(move |(layers, types, bw, batch, x)| {
                let types: Vec<ResourceType> = types
                    .into_iter()
                    .enumerate()
                    .map(|(i, (price, mem, sync, cap))| ResourceType {
                        name: format!("t{i}"),
                        class: if i == 0 {
                            DeviceClass::Cpu
                        } else {
                            DeviceClass::Gpu
                        },
                        price_per_hour: price,
                        memory_bytes: mem * GIB,
                        peak_flops: 1e12,
                        mem_bandwidth: 1e11,
                        efficiency: 1.0,
                        layer_overhead: 0.0,
                        sync_bandwidth: sync * 1e9,
                        cap,
                        units_per_instance: 1,
                        data_bandwidth: None,
                    })
                    .collect();
                let n = types.len();
                let mut bandwidth = vec![vec![0.0; n]; n];
                for a in 0..n {
                    for b in 0..n {
                        bandwidth[a][b] = bw[a.min(b) * n + a.max(b)] * 1e9;
                    }
                }
                let layers = layers
                    .into_iter()
                    .enumerate()
                    .map(|(i, (time, act, dense, mem))| Layer {
                        name: format!("l{i}"),
                        kind: if i == 0 {
                            LayerKind::Embedding
                        } else {
                            LayerKind::Fc
                        },
                        time_loaded: time.clone(),
                        time,
                        activation_bytes: act,
                        dense_param_bytes: dense,
                        sparse_param_bytes: 0.0,
                        sparse_traffic_bytes: 0.0,
                        memory_bytes: mem * GIB,
                        activation_memory_bytes: (2.0 * act).min(mem * GIB),
                    })
                    .collect();
                let model = Model {
                    name: "random".into(),
                    batch_size: batch,
                    batch_sizes: Vec::new(),
                    input_bytes: 0.0,
                    layers,
                    constraint: None,
                };
                Problem::new(
                    model,
                    Catalog {
                        types,
                        bandwidth,
                        hosts: Vec::new(),
                        parameter_server: None,
                        billing_minimum: 0.0,
                        link_latency: 0.0,
                    },
                    Constraint::new(x, 1e9).unwrap(),
                )
            })
    })
}

/// A random instance of [`arb_problem`] whose types `0..on_host` (at least one) share a
/// host of 2..=6 cores, each unit taking 1 or 2 threads, with every layer on those types
/// `0.8..4` times slower when the host is full (below 1: noise the cost model ignores),
/// and a throughput that 1..3 units of type 0 reach alone; the transfers serial or
/// overlapped, the synchronisation hidden behind none or part of the compute.
pub fn arb_hosted_problem(max_layers: usize, max_types: usize) -> impl Strategy<Value = Problem> {
    (
        arb_problem(max_layers, max_types),
        2u64..=6,
        prop::collection::vec(1u64..=2, max_types),
        prop::collection::vec(0.8f64..4.0, max_layers * max_types),
        1usize..=max_types,
        1.0f64..3.0,
        any::<bool>(),
        prop_oneof![Just(0.0), 0.0f64..=1.0],
    )
        .prop_map(
            |(pb, cores, threads, slow, on_host, load, overlapped, hidden)| {
                let (mut model, mut catalog) = (pb.model.clone(), pb.catalog.clone());
                let n = catalog.types.len();
                let on_host = on_host.min(n);
                catalog.hosts.push(coconet_hetero::Host {
                    name: "shared".into(),
                    cores,
                    threads: (0..n)
                        .map(|t| {
                            if t < on_host {
                                threads[t].min(cores)
                            } else {
                                0
                            }
                        })
                        .collect(),
                });
                for (l, layer) in model.layers.iter_mut().enumerate() {
                    for t in 0..on_host {
                        layer.time_loaded[t] = layer.time[t] * slow[l * n + t];
                    }
                }
                // A throughput that `load` units of type 0 alone would reach: a few cores' worth.
                let alone: f64 = model.layers.iter().map(|l| l.time[0]).sum();
                let x = load * model.batch_size / alone;
                let constraint = Constraint::new(x, pb.constraint.samples).unwrap();
                let mut with_host = Problem::new(model, catalog, constraint);
                with_host.sync = pb.sync.clone();
                let transfers = if overlapped {
                    coconet_hetero::Transfers::Overlapped
                } else {
                    coconet_hetero::Transfers::Serial
                };
                with_host
                    .with_transfers(transfers)
                    .with_sync_overlap(hidden)
            },
        )
}

/// A random instance of [`arb_problem`] whose first layer holds a sparse table of
/// 0.5..3 units of type 0's memory, pulling and pushing 0.1..10 MB per batch from a
/// parameter server on type 0 serving 0.5..5 GB/s a shard; type 0 is capped at 2..=8
/// units, which the shards share with the stages.
pub fn arb_ps_problem(max_layers: usize, max_types: usize) -> impl Strategy<Value = Problem> {
    (
        arb_problem(max_layers, max_types),
        0.5f64..3.0,
        1e5f64..1e7,
        0.5f64..5.0,
        2u64..=8,
    )
        .prop_map(|(pb, table, traffic, bw, cap)| {
            let (mut model, mut catalog) = (pb.model.clone(), pb.catalog.clone());
            model.layers[0].sparse_param_bytes = table * catalog.types[0].memory_bytes;
            model.layers[0].sparse_traffic_bytes = traffic;
            catalog.types[0].cap = Some(cap);
            catalog.parameter_server = Some(coconet_hetero::catalog::ParameterServer {
                ty: 0,
                bandwidth: bw * 1e9,
            });
            let mut with_ps = Problem::new(model, catalog, pb.constraint);
            with_ps.sync = pb.sync.clone();
            with_ps
        })
}

/// A random instance of [`arb_problem`] whose types have a fixed per-layer overhead of
/// up to 0.05 s (part or all of a layer's time) and step with their own batch, 1/8 to 8
/// times the model's; with a parameter server (shards of type 0) in some; links with a
/// latency of up to 5 ms in some; the first stage loading up to 100 MB per batch at
/// 0.1..10 GB/s on some types; 1 to 3 batches in flight in some; activations any share
/// of a layer's memory in some.
pub fn arb_batched_problem(max_layers: usize, max_types: usize) -> impl Strategy<Value = Problem> {
    let pb = prop_oneof![
        arb_problem(max_layers, max_types),
        arb_ps_problem(max_layers, max_types)
    ];
    (
        pb,
        prop::collection::vec(0.0f64..0.05, max_types),
        prop::collection::vec(prop_oneof![Just(1.0), 0.125f64..8.0], max_types),
        prop_oneof![Just(0.0), 0.0f64..5e-3],
        prop::collection::vec(
            prop_oneof![Just(None), (0.1f64..10.0).prop_map(Some)],
            max_types,
        ),
        prop_oneof![Just(0.0), 0.0f64..1e8],
        prop_oneof![Just(1u32), 1u32..4],
        prop::collection::vec(
            prop_oneof![Just(None), (0.0f64..1.0).prop_map(Some)],
            max_layers,
        ),
    )
        .prop_map(
            |(pb, overheads, ratios, latency, reads, input, in_flight, kept)| {
                let (mut model, mut catalog) = (pb.model.clone(), pb.catalog.clone());
                for ((ty, o), read) in catalog.types.iter_mut().zip(&overheads).zip(&reads) {
                    ty.layer_overhead = *o;
                    ty.data_bandwidth = read.map(|r| r * 1e9);
                }
                catalog.link_latency = latency;
                model.input_bytes = input;
                for (layer, share) in model.layers.iter_mut().zip(&kept) {
                    if let Some(share) = share {
                        layer.activation_memory_bytes = share * layer.memory_bytes;
                    }
                }
                let batches = ratios[..catalog.len()]
                    .iter()
                    .map(|r| r * model.batch_size)
                    .collect();
                Problem::new(model, catalog, pb.constraint)
                    .with_batch_sizes(batches)
                    .expect("positive batches")
                    .with_in_flight(in_flight)
            },
        )
}

/// Naive cost of a plan: `Some((cost, units per stage))`, or `None` if infeasible; each
/// type at its own batch size, links with their latency, the first stage loading its
/// samples; the
/// parameter server's shards counted up one by one, and the instances each type's units
/// rent; in the asynchronous mode no synchronisation, the dense parameters on the
/// server. Hosts are not modelled here.
pub fn naive_cost(pb: &Problem, plan: &SchedulingPlan) -> Option<(f64, Vec<u64>)> {
    let asynchronous = pb.sync == coconet_hetero::SyncModel::AsyncServer;
    let m = &pb.model;
    let c = &pb.catalog;
    let x = pb.constraint.throughput;
    let mut units = Vec::new();
    let mut used = vec![0u64; c.types.len()];
    let mut price = 0.0;
    for (s, st) in plan.stages.iter().enumerate() {
        let rt = &c.types[st.ty];
        let mut compute = 0.0;
        let mut dense = 0.0;
        let mut mem = 0.0;
        // The type's own batch: the fixed per-layer overhead stays, the rest, the
        // activations kept and the transfers scale with it.
        let batch = m.batch_sizes.get(st.ty).copied().unwrap_or(m.batch_size);
        let ratio = batch / m.batch_size;
        for l in st.first..=st.last {
            let layer = &m.layers[l];
            let time = layer.time[st.ty];
            let fixed = rt.layer_overhead.min(time).max(0.0);
            compute += fixed + (time - fixed) * ratio;
            dense += layer.dense_param_bytes;
            let acts = layer.activation_memory_bytes;
            mem += layer.memory_bytes - acts + acts * ratio * f64::from(pb.in_flight());
        }
        if mem > rt.memory_bytes {
            return None;
        }
        let mut comm = 0.0;
        if s > 0 {
            let p = plan.stages[s - 1].ty;
            comm += 2.0
                * (c.link_latency
                    + m.layers[st.first - 1].activation_bytes * ratio / c.bandwidth[p][st.ty]);
        }
        if s + 1 < plan.stages.len() {
            let n = plan.stages[s + 1].ty;
            comm += 2.0
                * (c.link_latency
                    + m.layers[st.last].activation_bytes * ratio / c.bandwidth[st.ty][n]);
        }
        if s == 0
            && let Some(read) = rt.data_bandwidth
        {
            comm += m.input_bytes * ratio / read;
        }
        let stage_x = |k: u64| {
            let kf = k as f64;
            let sync = if asynchronous {
                0.0
            } else {
                2.0 * (kf - 1.0) / kf * dense
            };
            let t = compute + comm + sync / rt.sync_bandwidth;
            kf * batch / t
        };
        let mut k = 1;
        while stage_x(k) < x * (1.0 - 1e-12) {
            k += 1;
            if k > 10_000_000 {
                return None;
            }
        }
        units.push(k);
        used[st.ty] += k;
        price += k as f64 * rt.price_per_hour;
    }
    // The parameter server: shards for the tables' bytes and for the rows' traffic.
    let dense: f64 = m.layers.iter().map(|l| l.dense_param_bytes).sum();
    let dense = if asynchronous { dense } else { 0.0 };
    let table = m.layers.iter().map(|l| l.sparse_param_bytes).sum::<f64>() + dense;
    if let Some(ps) = &c.parameter_server
        && table > 0.0
    {
        let traffic = m.layers.iter().map(|l| l.sparse_traffic_bytes).sum::<f64>() + 2.0 * dense;
        let mut shards = 1u64;
        while (shards as f64) * c.types[ps.ty].memory_bytes < table
            || (shards as f64) * ps.bandwidth < x * traffic / m.batch_size
        {
            shards += 1;
        }
        used[ps.ty] += shards;
        price += shards as f64 * c.types[ps.ty].price_per_hour;
    }
    // Whole instances: each type's units rented in instances, counted up one by one; the
    // cap counts the rented units.
    for (t, u) in used.iter_mut().enumerate() {
        let size = match pb.rental {
            coconet_hetero::Rental::Units => 1,
            coconet_hetero::Rental::Instances => c.types[t].units_per_instance,
        };
        let mut rented = 0;
        while rented < *u {
            rented += size;
        }
        price += (rented - *u) as f64 * c.types[t].price_per_hour;
        *u = rented;
    }
    for (t, &u) in used.iter().enumerate() {
        if c.types[t].cap.is_some_and(|cap| u > cap) {
            return None;
        }
    }
    Some((price / 3600.0 * pb.constraint.samples / x, units))
}

/// The DP (consecutive stages of one type allowed or not, `max_cap_states` table states:
/// 1 forces the label search) against exhaustive search on `pb`: equal costs, the DP's
/// proven. `Ok(Some(dp's outcome))` when both find a plan, `Ok(None)` when neither does.
pub fn dp_against_exhaustive(
    pb: &Problem,
    split: bool,
    max_cap_states: usize,
) -> Result<Option<coconet_hetero::schedulers::Outcome>, TestCaseError> {
    use coconet_hetero::PlanError;
    use coconet_hetero::schedulers::{Dp, Exhaustive, Optimality, Scheduler, SearchConfig};
    let cfg = SearchConfig::default();
    let dp = Dp {
        split_runs: split,
        max_cap_states,
        ..Dp::default()
    }
    .schedule(pb, &cfg);
    let ex = Exhaustive {
        split_runs: split,
        ..Exhaustive::default()
    }
    .schedule(pb, &cfg);
    match (dp, ex) {
        (Ok(d), Ok(e)) => {
            prop_assert!(
                close(d.evaluation.cost, e.evaluation.cost),
                "dp {} vs exhaustive {}",
                d.evaluation.cost,
                e.evaluation.cost
            );
            prop_assert_eq!(&d.optimality, &Optimality::Proven);
            // A proven optimum is its own lower bound.
            prop_assert_eq!(d.lower_bound, Some(d.evaluation.cost));
            Ok(Some(d))
        }
        (Err(PlanError::NoFeasiblePlan(_)), Err(PlanError::NoFeasiblePlan(_))) => Ok(None),
        (d, e) => Err(TestCaseError::fail(format!(
            "disagree: dp {:?} exhaustive {:?}",
            d.map(|o| o.evaluation.cost),
            e.map(|o| o.evaluation.cost)
        ))),
    }
}

/// Relative closeness.
pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-300)
}

/// Two layers, batch 1, no transfers or synchronisation: a stage of type t over layers
/// i..=j needs ⌈X · Σ seconds⌉ units. `times[l][t]`, `prices[t]` ($/h), `caps[t]`.
pub fn two_layers(
    times: [[f64; 3]; 2],
    prices: [f64; 3],
    caps: [Option<u64>; 3],
    x: f64,
) -> coconet_hetero::Problem {
    chain(&[&times[0], &times[1]], &prices, &caps, x)
}

/// [`two_layers`] with any number of layers and types: `times[l][t]`, `prices[t]`,
/// `caps[t]`.
pub fn chain(
    times: &[&[f64]],
    prices: &[f64],
    caps: &[Option<u64>],
    x: f64,
) -> coconet_hetero::Problem {
    use coconet_hetero::{Catalog, Constraint, DeviceClass, Model, Problem, ResourceType};
    let n = prices.len();
    let types = (0..n)
        .map(|t| ResourceType {
            name: format!("{}", (b'A' + t as u8) as char),
            class: DeviceClass::Gpu,
            price_per_hour: prices[t],
            memory_bytes: 1e15,
            peak_flops: 1e12,
            mem_bandwidth: 1e11,
            efficiency: 1.0,
            layer_overhead: 0.0,
            sync_bandwidth: 1e12,
            cap: caps[t],
            units_per_instance: 1,
            data_bandwidth: None,
        })
        .collect();
    let layers = fc_layers(times.iter().copied());
    let model = Model {
        name: "chain".into(),
        batch_size: 1.0,
        batch_sizes: Vec::new(),
        input_bytes: 0.0,
        layers,
        constraint: None,
    };
    Problem::new(
        model,
        Catalog {
            types,
            bandwidth: vec![vec![1e12; n]; n],
            hosts: Vec::new(),
            parameter_server: None,
            billing_minimum: 0.0,
            link_latency: 0.0,
        },
        Constraint::new(x, 3600.0).unwrap(),
    )
}

/// Fully connected layers with `times[l][t]` seconds per batch on type `t` (also
/// loaded), no transfers, parameters or synchronisation, 1 byte of memory.
pub fn fc_layers<'a>(times: impl Iterator<Item = &'a [f64]>) -> Vec<coconet_hetero::Layer> {
    times
        .enumerate()
        .map(|(i, time)| coconet_hetero::Layer {
            name: format!("l{i}"),
            kind: coconet_hetero::LayerKind::Fc,
            time: time.to_vec(),
            time_loaded: time.to_vec(),
            activation_bytes: 0.0,
            dense_param_bytes: 0.0,
            sparse_param_bytes: 0.0,
            sparse_traffic_bytes: 0.0,
            memory_bytes: 1.0,
            activation_memory_bytes: 0.0,
        })
        .collect()
}

/// The gap a "not guaranteed" answer states ("… within G % of a lower bound"), in percent.
pub fn stated_gap(why: &str) -> f64 {
    // The first "within X %" (a reason may say "a plan within them" before it).
    why.split("within ")
        .skip(1)
        .find_map(|s| s.split(" %").next().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("no gap stated in {why:?}"))
}
