//! Human-readable reports of plans and comparisons.

use std::fmt::Write;

use crate::constraint::rate;
use crate::cost::Problem;
use crate::objective::Objective;
use crate::schedulers::{Optimality, Outcome};

/// The terms of the cost model `pb` prices with, in one line: the objective, then every
/// term beyond the paper's model that is on (so that a report says what it assumed).
pub fn cost_terms(pb: &Problem) -> String {
    use crate::stage_shape::Transfers;
    use crate::sync::SyncModel;
    let types = &pb.catalog.types;
    let mut terms = vec![match pb.objective {
        Objective::Duration => "the job's duration (the paper's)".to_string(),
        Objective::RequiredRate => "fed at the required rate".to_string(),
    }];
    if (0..pb.num_types()).any(|t| pb.rental.instance_size(&pb.catalog, t) > 1) {
        terms.push("whole instances".into());
    }
    match &pb.sync {
        SyncModel::Ring => {}
        SyncModel::Schedules(_) => terms.push("sync priced by coconet's schedules".into()),
        SyncModel::AsyncServer => terms.push("asynchronous parameter server".into()),
    }
    if pb.sync != SyncModel::AsyncServer && matches!(pb.parameter_servers(), Ok(Some(_))) {
        terms.push("parameter-server shards".into());
    }
    if pb.transfers == Transfers::Overlapped {
        terms.push("transfers overlapped".into());
    }
    if pb.sync_overlap > 0.0 {
        terms.push(format!(
            "sync hidden behind {:.0} % of compute",
            100.0 * pb.sync_overlap
        ));
    }
    if pb.has_per_type_batches() {
        let own: Vec<String> = (0..pb.num_types())
            .filter(|&t| pb.batch_size(t) != pb.model.batch_size)
            .map(|t| format!("{} {}", types[t].name, pb.batch_size(t)))
            .collect();
        terms.push(format!(
            "batches {} (model {})",
            own.join(", "),
            pb.model.batch_size
        ));
    }
    if pb.in_flight() > 1 {
        terms.push(format!("{} batches in flight", pb.in_flight()));
    }
    if pb.catalog.link_latency > 0.0 {
        // Microseconds to six decimals, without the float's noise.
        let us = (pb.catalog.link_latency * 1e12).round() / 1e6;
        terms.push(format!("link latency {us} µs"));
    }
    if pb.model.input_bytes > 0.0 && types.iter().any(|t| t.data_bandwidth.is_some()) {
        terms.push("data loading".into());
    }
    if !pb.catalog.hosts.is_empty() {
        terms.push("shared hosts".into());
    }
    if pb.catalog.billing_minimum > 0.0 {
        terms.push(format!("billed {} s at least", pb.catalog.billing_minimum));
    }
    terms.join(", ")
}

/// The scheduling plan, provisioning plan, throughput, cost and bottleneck of an outcome.
pub fn plan_report(pb: &Problem, out: &Outcome) -> String {
    let mut s = String::new();
    let ev = &out.evaluation;
    let ty = |t: usize| pb.catalog.types[t].name.as_str();
    let _ = writeln!(
        s,
        "model {} ({} layers), required {} samples/s, {:.4e} samples; scheduler {}",
        pb.model.name,
        pb.num_layers(),
        rate(pb.constraint.throughput),
        pb.constraint.samples,
        out.scheduler
    );
    let _ = writeln!(s, "cost model: {}", cost_terms(pb));
    let _ = writeln!(s, "\nscheduling plan (layer -> type):");
    for (si, st) in out.plan.stages.iter().enumerate() {
        for l in st.first..=st.last {
            let _ = writeln!(
                s,
                "  {:>3}  {:<24} -> {:<10} stage {si}",
                l,
                pb.model.layers[l].name,
                ty(st.ty)
            );
        }
    }
    let _ = writeln!(s, "\nprovisioning plan (units per stage):");
    // The batch column only where some type steps with a batch of its own.
    let batches = pb.has_per_type_batches();
    let _ = writeln!(
        s,
        "  stage  layers      type        units{}   s/batch     samples/s    $/hour",
        if batches { "     batch" } else { "" }
    );
    for (i, r) in ev.stages.iter().enumerate() {
        let batch = if batches {
            format!(" {:>9}", pb.batch_size(r.stage.ty))
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "  {:>5}  {:>4}..{:<4}  {:<10} {:>6}{}   {:<10.4e}  {:<12.4e} {:>9.2}{}",
            i,
            r.stage.first,
            r.stage.last,
            ty(r.stage.ty),
            r.units,
            batch,
            r.time_per_batch,
            r.throughput,
            r.price_per_hour,
            if i == ev.bottleneck {
                "  <- bottleneck"
            } else {
                ""
            }
        );
    }
    if let Some(ps) = &ev.parameter_servers {
        let _ = writeln!(
            s,
            "  parameter server: {} shards of {}, rows for {:.4e} samples/s, ${:.2}/hour",
            ps.shards,
            ty(ps.ty),
            ps.throughput,
            ps.price_per_hour
        );
    }
    // What is rented per type: where whole instances are, the instances and idle units.
    if ev.rented.iter().any(|r| r.per_instance > 1) {
        let _ = writeln!(s, "\nrented (whole instances, idle units paid):");
        for r in &ev.rented {
            let _ = writeln!(
                s,
                "  {:<10} {:>6} units used, {} instance{} of {} = {} units{}, ${:.2}/hour",
                ty(r.ty),
                r.used,
                r.instances,
                if r.instances == 1 { "" } else { "s" },
                r.per_instance,
                r.units,
                if r.idle > 0 {
                    format!(" ({} idle)", r.idle)
                } else {
                    String::new()
                },
                r.price_per_hour
            );
        }
    }
    let _ = writeln!(
        s,
        "\nthroughput: {:.4e} samples/s (required {})",
        ev.throughput, pb.constraint.throughput
    );
    let slowest = &ev.stages[ev.bottleneck];
    if ev
        .parameter_servers
        .as_ref()
        .is_some_and(|ps| ps.throughput < slowest.throughput)
    {
        let _ = writeln!(s, "bottleneck: the parameter server");
    } else {
        let _ = writeln!(
            s,
            "bottleneck: stage {} ({} layers {}..={})",
            ev.bottleneck,
            ty(slowest.stage.ty),
            slowest.stage.first,
            slowest.stage.last
        );
    }
    let _ = writeln!(
        s,
        "price: ${:.2}/hour, wall time {:.2} h{}",
        ev.price_per_hour,
        ev.wall_time / 3600.0,
        if ev.billed_time > ev.wall_time {
            format!(" (billed {:.0} s, the catalogue's minimum)", ev.billed_time)
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        s,
        "cost: ${:.2} ({})",
        ev.cost,
        match pb.objective {
            Objective::Duration => "for the job's duration at the plan's throughput",
            Objective::RequiredRate => "fed at the required throughput",
        }
    );
    let _ = writeln!(s, "optimality: {}", optimality(&out.optimality));
    s
}

/// An optimality claim in words.
pub fn optimality(o: &Optimality) -> String {
    match o {
        Optimality::Proven => "proven optimal".to_string(),
        Optimality::NotGuaranteed(why) => format!("not guaranteed ({why})"),
        Optimality::Heuristic => "heuristic".to_string(),
    }
}
