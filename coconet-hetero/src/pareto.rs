//! Cost/throughput frontier: the exact DP at log-spaced throughput requirements.
//!
//! Cheap because the DP is: one sweep of 40 points on a 100-layer model takes well
//! under a second. A point is *Pareto-optimal* when no other point of the sweep meets
//! at least its throughput requirement for at most its cost. Costs are at the required
//! rate (see [`crate::cost`]); the CSV also lists each plan's capacity.

use std::path::Path;

use crate::constraint::Constraint;
use crate::cost::Problem;
use crate::schedulers::{Dp, Outcome, Scheduler, SearchConfig};

/// One point of the sweep.
#[derive(Debug, Clone)]
pub struct SweepPoint {
    /// Required throughput, samples/s.
    pub required: f64,
    /// The optimal plan, or `None` if infeasible at this throughput.
    pub plan: Option<Outcome>,
    /// Not dominated by another point of the sweep.
    pub pareto: bool,
}

/// Runs the DP at `points` log-spaced requirements in `[from, to]`; `progress(i)` is called after each.
pub fn sweep(
    pb: &Problem,
    from: f64,
    to: f64,
    points: usize,
    mut progress: impl FnMut(usize),
) -> Vec<SweepPoint> {
    let mut out: Vec<SweepPoint> = (0..points)
        .map(|i| {
            let f = if points == 1 {
                0.0
            } else {
                i as f64 / (points - 1) as f64
            };
            let required = from * (to / from).powf(f);
            let plan = Constraint::new(required, pb.constraint.samples)
                .ok()
                .and_then(|c| {
                    Dp::default()
                        .schedule(&pb.with_constraint(c), &SearchConfig::default())
                        .ok()
                });
            progress(i + 1);
            SweepPoint {
                required,
                plan,
                pareto: false,
            }
        })
        .collect();
    let pts: Vec<Option<(f64, f64)>> = out
        .iter()
        .map(|p| {
            p.plan
                .as_ref()
                .map(|o| (o.evaluation.throughput, o.evaluation.cost))
        })
        .collect();
    for (i, p) in out.iter_mut().enumerate() {
        if let Some((x, c)) = pts[i] {
            p.pareto = !pts.iter().enumerate().any(|(j, q)| {
                j != i && q.is_some_and(|(x2, c2)| x2 >= x && c2 <= c && (x2 > x || c2 < c))
            });
        }
    }
    out
}

/// CSV with one row per point.
pub fn to_csv(pb: &Problem, points: &[SweepPoint]) -> String {
    let mut s = String::from(
        "required_samples_per_s,throughput_samples_per_s,cost_usd,price_usd_per_hour,stages,pareto,plan\n",
    );
    for p in points {
        match &p.plan {
            Some(o) => {
                let plan: Vec<String> = o
                    .evaluation
                    .stages
                    .iter()
                    .map(|r| {
                        format!(
                            "{}-{}:{}x{}",
                            r.stage.first, r.stage.last, pb.catalog.types[r.stage.ty].name, r.units
                        )
                    })
                    .collect();
                s += &format!(
                    "{},{},{},{},{},{},{}\n",
                    p.required,
                    o.evaluation.throughput,
                    o.evaluation.cost,
                    o.evaluation.price_per_hour,
                    o.plan.stages.len(),
                    p.pareto,
                    plan.join(" ")
                );
            }
            None => s += &format!("{},,,,,false,infeasible\n", p.required),
        }
    }
    s
}

/// Writes the frontier (minimum cost against the required throughput, log-log) as SVG.
pub fn plot(pb: &Problem, points: &[SweepPoint], path: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    let data: Vec<(f64, f64, bool)> = points
        .iter()
        .filter_map(|p| {
            p.plan
                .as_ref()
                .map(|o| (o.evaluation.throughput, o.evaluation.cost, p.pareto))
        })
        .collect();
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    if data.is_empty() {
        return Err(format!(
            "{}: no feasible point in the sweep",
            path.display()
        ));
    }
    let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, 0.0f64, f64::INFINITY, 0.0f64);
    for &(x, y, _) in &data {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: cost vs throughput (exact DP)", pb.model.name),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (x0 * 0.9..x1 * 1.1).log_scale(),
            (y0 * 0.9..y1 * 1.1).log_scale(),
        )
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("required throughput (samples/s)")
        .y_desc("total cost ($)")
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new(
            data.iter().filter(|d| d.2).map(|&(x, y, _)| (x, y)),
            &BLUE,
        ))
        .map_err(|e| err(&e))?
        .label("Pareto frontier");
    chart
        .draw_series(
            data.iter().map(|&(x, y, p)| {
                Circle::new((x, y), 3, if p { BLUE.filled() } else { RED.filled() })
            }),
        )
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
