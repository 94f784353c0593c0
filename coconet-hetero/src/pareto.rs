//! Cost/throughput frontier: the exact DP at log-spaced throughput requirements.
//!
//! Cheap because the DP is: one sweep of 40 points on a 100-layer model takes well
//! under a second. A point is *Pareto-optimal* when no other point of the sweep meets
//! at least its throughput requirement for at most its cost. Costs are at the required
//! rate (see [`crate::cost`]); the CSV also lists each plan's capacity.

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

/// Ticks of a log axis over `[lo, hi]`: 1, 2 and 5 times each power of ten inside.
#[cfg(any(feature = "plot", test))]
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powi(lo.log10().floor() as i32);
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let t = m * decade;
            if t >= lo && t <= hi {
                ticks.push(t);
            }
        }
        decade *= 10.0;
    }
    ticks
}

/// A tick label: at most 3 significant digits, in scientific notation past 10^5.
#[cfg(any(feature = "plot", test))]
fn tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1e5 || v.abs() < 1e-2 {
        let s = format!("{v:.2e}");
        let (mantissa, exponent) = s.split_once('e').unwrap_or((&s, "0"));
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        format!("{mantissa}e{exponent}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
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
                s += &format!(
                    "{},{},{},{},{},{},{}\n",
                    p.required,
                    o.evaluation.throughput,
                    o.evaluation.cost,
                    o.evaluation.price_per_hour,
                    o.plan.stages.len(),
                    p.pareto,
                    o.evaluation.stage_summary(&pb.catalog)
                );
            }
            None => s += &format!("{},,,,,false,infeasible\n", p.required),
        }
    }
    s
}

/// Writes the sweep as SVG: each point's cost (linear axis) against the throughput its
/// plan reaches (log axis), the non-dominated ones joined as the frontier (feature `plot`).
#[cfg(feature = "plot")]
pub fn plot(pb: &Problem, points: &[SweepPoint], path: &std::path::Path) -> Result<(), String> {
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
    // Costs of one sweep rarely span a decade: a linear axis keeps its tick labels
    // (a log axis inside one decade has none).
    let pad = ((y1 - y0) * 0.08).max(y1 * 0.02);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: cost vs throughput (exact DP)", pb.model.name),
            ("sans-serif", 20),
        )
        .margin(15)
        .margin_right(40)
        .x_label_area_size(45)
        .y_label_area_size(90)
        .build_cartesian_2d(
            (x0 * 0.8..x1 * 1.25)
                .log_scale()
                .with_key_points(log_ticks(x0 * 0.8, x1 * 1.25)),
            (y0 - pad).max(0.0)..y1 + pad,
        )
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc("throughput the plan reaches (samples/s)")
        .y_desc("total cost ($)")
        .x_label_formatter(&|x| tick(*x))
        .y_label_formatter(&|y| format!("${}", tick(*y)))
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new(
            data.iter().filter(|d| d.2).map(|&(x, y, _)| (x, y)),
            &BLUE,
        ))
        .map_err(|e| err(&e))?
        .label("Pareto frontier")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(
            data.iter()
                .filter(|d| d.2)
                .map(|&(x, y, _)| Circle::new((x, y), 3, BLUE.filled())),
        )
        .map_err(|e| err(&e))?
        .label("optimal plan, not dominated")
        .legend(|(x, y)| Circle::new((x + 10, y), 3, BLUE.filled()));
    chart
        .draw_series(
            data.iter()
                .filter(|d| !d.2)
                .map(|&(x, y, _)| Circle::new((x, y), 3, RED.filled())),
        )
        .map_err(|e| err(&e))?
        .label("optimal plan, dominated (a faster one costs no more)")
        .legend(|(x, y)| Circle::new((x + 10, y), 3, RED.filled()));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_read_as_people_write_them() {
        assert_eq!(tick(1e6), "1e6");
        assert_eq!(tick(2.5e5), "2.5e5");
        assert_eq!(tick(3200.0), "3200");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(0.0), "0");
        assert_eq!(
            log_ticks(40.0, 2500.0),
            [50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0]
        );
    }
}
