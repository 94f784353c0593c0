//! Human-readable reports of plans and comparisons.
//!
//! Quantities are written by one function per kind, so that every report shows them
//! alike: [`money`] for dollars (and dollars per hour), [`duration`] for times.

use std::fmt::Write;

use crate::constraint::rate;
use crate::cost::Problem;
use crate::objective::Objective;
use crate::schedulers::{Optimality, Outcome};

/// `v` (finite, > 0) in fixed notation with at least `digits` significant digits: as
/// many decimals as that takes, none once the integer part has them all.
fn significant(v: f64, digits: i32) -> String {
    let magnitude = v.log10().floor() as i32;
    let decimals = (digits - 1 - magnitude).max(0) as usize;
    format!("{v:.decimals$}")
}

/// Dollars with at least four significant digits, so that small jobs can be told apart:
/// `$0.03123`, `$1.894`, `$12.35`, and two decimals from $100 on (`$320715.93`);
/// scientific below $0.0001 and from $10^12 on (`$1.234e-7`, `$1.760e22`). `$0.00` for
/// zero, `$inf` (`-$inf`) for an infinite amount, `NaN` for an undefined one. For a
/// price, append `/hour`.
pub fn money(v: f64) -> String {
    signed(v, |a| {
        let digits = if a.is_infinite() {
            "inf".to_string()
        } else if a == 0.0 {
            "0.00".to_string()
        } else if !(1e-4..1e12).contains(&a) {
            format!("{a:.3e}")
        } else if a >= 100.0 {
            format!("{a:.2}")
        } else {
            significant(a, 4)
        };
        format!("${digits}")
    })
}

/// `NaN` for NaN, else `body` of `|v|`, with a minus sign before it where `v < 0`.
fn signed(v: f64, body: impl Fn(f64) -> String) -> String {
    if v.is_nan() {
        return "NaN".to_string();
    }
    let sign = if v < 0.0 { "-" } else { "" };
    format!("{sign}{}", body(v.abs()))
}

/// A time given in seconds, in the unit that suits it with four significant digits:
/// seconds below two minutes (`0.2500 s`, `45.20 s`), minutes below two hours
/// (`16.67 min`), hours beyond (`2.000 h`, `123457 h`); scientific below a millisecond
/// and from 10^9 hours on (`1.000e-6 s`). `0 s` for zero, `inf` for an infinite time (a
/// plan that never finishes), `NaN` for an undefined one.
pub fn duration(seconds: f64) -> String {
    signed(seconds, |a| {
        if a.is_infinite() {
            "inf".to_string()
        } else if a == 0.0 {
            "0 s".to_string()
        } else if a < 1e-3 {
            format!("{a:.3e} s")
        } else if a < 120.0 {
            format!("{} s", significant(a, 4))
        } else if a < 7200.0 {
            format!("{} min", significant(a / 60.0, 4))
        } else if a / 3600.0 < 1e9 {
            format!("{} h", significant(a / 3600.0, 4))
        } else {
            format!("{:.3e} h", a / 3600.0)
        }
    })
}

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
        "  stage  layers      type        units{}   s/batch     samples/s     price/hour",
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
            "  {:>5}  {:>4}..{:<4}  {:<10} {:>6}{}   {:<10.4e}  {:<12.4e} {:>10}{}",
            i,
            r.stage.first,
            r.stage.last,
            ty(r.stage.ty),
            r.units,
            batch,
            r.time_per_batch,
            r.throughput,
            money(r.price_per_hour),
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
            "  parameter server: {} shard{} of {}, rows for {:.4e} samples/s, {}/hour",
            ps.shards,
            if ps.shards == 1 { "" } else { "s" },
            ty(ps.ty),
            ps.throughput,
            money(ps.price_per_hour)
        );
    }
    // What is rented per type: where whole instances are, the instances and idle units.
    if ev.rented.iter().any(|r| r.per_instance > 1) {
        let _ = writeln!(s, "\nrented (whole instances, idle units paid):");
        for r in &ev.rented {
            let _ = writeln!(
                s,
                "  {:<10} {:>6} units used, {} instance{} of {} = {} units{}, {}/hour",
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
                money(r.price_per_hour)
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
        "price: {}/hour, wall time {}{}",
        money(ev.price_per_hour),
        duration(ev.wall_time),
        if ev.billed_time > ev.wall_time {
            format!(
                " (billed {}, the catalogue's minimum)",
                duration(ev.billed_time)
            )
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        s,
        "cost: {} ({})",
        money(ev.cost),
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

#[cfg(test)]
mod tests {
    use super::{duration, money};

    #[test]
    fn money_keeps_four_significant_digits() {
        // Tiny, ordinary and large amounts.
        assert_eq!(money(0.031234), "$0.03123");
        assert_eq!(money(0.00012346), "$0.0001235");
        assert_eq!(money(3.2e-7), "$3.200e-7");
        assert_eq!(money(1.8939), "$1.894");
        assert_eq!(money(0.5), "$0.5000");
        assert_eq!(money(32.768), "$32.77");
        assert_eq!(money(99.5), "$99.50");
        assert_eq!(money(100.0), "$100.00");
        assert_eq!(money(320715.9321), "$320715.93");
        assert_eq!(money(1.76e22), "$1.760e22");
        assert_eq!(money(-1.8939), "-$1.894");
        // Zero and the non-finite.
        assert_eq!(money(0.0), "$0.00");
        assert_eq!(money(-0.0), "$0.00");
        assert_eq!(money(f64::INFINITY), "$inf");
        assert_eq!(money(f64::NEG_INFINITY), "-$inf");
        assert_eq!(money(f64::NAN), "NaN");
    }

    #[test]
    fn durations_pick_their_unit() {
        // Seconds below two minutes, minutes below two hours, hours beyond.
        assert_eq!(duration(2.0466e-3), "0.002047 s");
        assert_eq!(duration(0.25), "0.2500 s");
        assert_eq!(duration(45.2), "45.20 s");
        assert_eq!(duration(119.0), "119.0 s");
        assert_eq!(duration(120.0), "2.000 min");
        assert_eq!(duration(1000.0), "16.67 min");
        assert_eq!(duration(7199.0), "120.0 min");
        assert_eq!(duration(7200.0), "2.000 h");
        assert_eq!(duration(3600.0 * 123456.7), "123457 h");
        // Tiny and huge ones in scientific notation.
        assert_eq!(duration(1e-6), "1.000e-6 s");
        assert_eq!(duration(3600.0 * 1.76e22), "1.760e22 h");
        // Zero and the non-finite.
        assert_eq!(duration(0.0), "0 s");
        assert_eq!(duration(f64::INFINITY), "inf");
        assert_eq!(duration(f64::NAN), "NaN");
        assert_eq!(duration(-30.0), "-30.00 s");
    }
}
