//! The cost model where this machine cannot go: every candidate schedule predicted on
//! clusters from the shipped parameter sets (`coconet::runtime::model::PRESETS`),
//! nothing run.
//!
//! 1. **CoCoNet's paper setting**: data-parallel Adam in f32 on 128 V100s (8 DGX-2
//!    nodes): the speedup of the model's best schedule over all-reduce + one fused
//!    Adam kernel (AR-C), against the speedups CoCoNet's artifact measured, per size.
//! 2. **Scale-out on DGX H100**, 8 to 1,024 GPUs: Adam over a GPT-3-sized parameter
//!    vector (175·2^30 f32 elements ≈ GPT-3's 175 B) and the Megatron layer at GPT-3's
//!    width (H = 12288, 4 × 2048 tokens, f16), tensor-parallel over every GPU: each
//!    schedule's predicted step and the one the model would choose.
//!
//! 3. **One GPU, measured**: the DGX H100 parameters' kernel terms against the steps
//!    `coconet-gpu-bench` timed on an H100 and an H200 (BENCHMARKS.md), at P = 1 where
//!    no link is involved: the only check of the GPU parameters by a measurement so far.
//!
//! `cargo run --release --example scale_out` (`-- --plot PATH`: where the SVG goes,
//! default `target/scale_out.svg`).

use coconet_example_programs::adam as adam_program;
use coconet_example_programs::megatron as megatron_program;
use coconet_example_programs::sgd as sgd_program;

use coconet::core::Schedule;
use coconet::core::schedule::candidates;
use coconet::prelude::*;
use coconet::runtime::Plan;
use coconet::runtime::model::{Machine, predict};

/// CoCoNet's artifact: fused Adam's speedup over all-reduce + Apex FusedAdam on 128
/// V100s (DGX-2 nodes, fp32, NCCL's default algorithm), derived from its result files
/// (`../shared/reference/overlap-anchors.md`).
const PAPER: &[(u32, f64)] = &[
    (10, 1.26),
    (12, 1.72),
    (17, 0.94),
    (20, 1.55),
    (22, 1.77),
    (30, 1.37),
];

/// The artifact's absolute times at 2^30 (ms per iteration): AR + FusedAdam, fused.
const PAPER_2_30_MS: (f64, f64) = (143.7, 104.7);

/// Steps `coconet-gpu-bench --log2n 28` timed on one GPU (BENCHMARKS.md, "The CUDA
/// backend on an H100" and "Second run, on an H200"): (program, schedule, ms on the
/// H100, ms on the H200). The H100 run did not time SGD's unfused RS-C-AG.
const ONE_GPU_MS: &[(&str, &str, Option<f64>, f64)] = &[
    ("adam", "AR-C", Some(3.400), 2.618),
    ("adam", "fuse(RS-C-AG)", Some(2.568), 1.816),
    ("sgd", "AR-C", Some(1.940), 1.429),
    ("sgd", "RS-C-AG", None, 2.115),
    ("sgd", "fuse(RS-C-AG)", Some(1.077), 0.756),
];

/// The H200's copy bandwidth as coconet's copy kernel measured it (4110 GB/s; torch's
/// `copy_` 4170 GB/s, 0.85 of the HBM3e's 4814 GB/s): an H200 is an H100 with faster,
/// larger memory, the same SMs and the same NVLink.
const H200_MEMORY_BANDWIDTH: f64 = 4.11e12;

/// Every candidate's predicted time (seconds) at `ranks` and `dims`, in candidate order.
fn predictions(
    schedules: &[Schedule],
    ranks: usize,
    dims: &[(&str, usize)],
    machine: &Machine,
) -> Result<Vec<(String, f64)>, Box<dyn std::error::Error>> {
    let mut bindings = Bindings::new();
    for &(name, value) in dims {
        bindings = bindings.dim(name, value);
    }
    schedules
        .iter()
        .map(|s| {
            let plan = Plan::lower(s, ranks, bindings.dims())?;
            let t = predict(&plan, machine).total.as_secs_f64();
            if !(t.is_finite() && t > 0.0) {
                return Err(format!("{}: predicted {t} s", s.name()).into());
            }
            Ok((s.name().to_string(), t))
        })
        .collect()
}

/// The fastest of `rows`.
fn fastest(rows: &[(String, f64)]) -> &(String, f64) {
    rows.iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .expect("a program has candidates")
}

/// A program to scale out: its title, its candidates, its dims.
type Case<'a> = (String, &'a [Schedule], Vec<(&'static str, usize)>);

/// A curve of the plot: its label and its points.
type Curve = (String, Vec<(f64, f64)>);

/// A panel of the plot: its title, the x axis' name, its curves.
type Panel = (String, &'static str, Vec<Curve>);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let plot_path = match args.iter().position(|a| a == "--plot") {
        Some(i) => args.get(i + 1).ok_or("--plot needs a path")?.clone(),
        None => "target/scale_out.svg".into(),
    };
    let adam = adam_program::adam();
    let adam_schedules = candidates(adam.program(), &[adam.m.id(), adam.v.id()]);
    let mut panels = vec![paper_setting(&adam_schedules)?];
    panels.extend(scale_out(&adam_schedules)?);
    one_gpu(&adam_schedules)?;
    plot(&plot_path, &panels)?;
    println!("plot: {plot_path}");
    Ok(())
}

/// The predicted time of the schedule called `name` among `rows`.
fn by_name(rows: &[(String, f64)], name: &str) -> Result<f64, String> {
    rows.iter()
        .find(|r| r.0 == name)
        .map(|r| r.1)
        .ok_or_else(|| format!("no schedule {name}"))
}

/// Part 1, the paper's setting: Adam on 128 V100s, the model's speedups against the
/// artifact's (a table, and the panel of the three curves).
fn paper_setting(adam_schedules: &[Schedule]) -> Result<Panel, Box<dyn std::error::Error>> {
    let dgx2 = Machine::preset("dgx2-v100")?;
    println!("## Adam f32 on 128 V100s (8 DGX-2 nodes): the model against CoCoNet's artifact\n");
    println!(
        "| N | AR-C ms | fuse(RS-C-AG) ms | model's choice | predicted speedup | artifact | error |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut paper_curve = Vec::new();
    let mut model_curve = Vec::new();
    let mut fused_curve = Vec::new();
    let mut errors = Vec::new();
    for &(log2, measured) in PAPER {
        let rows = predictions(adam_schedules, 128, &[("N", 1 << log2)], &dgx2)?;
        let arc = by_name(&rows, "AR-C")?;
        let fused = by_name(&rows, "fuse(RS-C-AG)")?;
        let best = fastest(&rows);
        let speedup = arc / best.1;
        let error = speedup / measured - 1.0;
        errors.push(error.abs());
        println!(
            "| 2^{log2} | {:.3} | {:.3} | {} | {speedup:.2}× | {measured:.2}× | {:+.0} % |",
            arc * 1e3,
            fused * 1e3,
            best.0,
            error * 100.0
        );
        paper_curve.push((log2 as f64, measured));
        model_curve.push((log2 as f64, speedup));
        fused_curve.push((log2 as f64, arc / fused));
        if log2 == 30 {
            println!(
                "\nAt 2^30 the artifact measured {:.1} ms (AR + FusedAdam) and {:.1} ms (fused); \
                 predicted {:.1} ms and {:.1} ms.\n",
                PAPER_2_30_MS.0,
                PAPER_2_30_MS.1,
                arc * 1e3,
                fused * 1e3
            );
            if fused >= arc {
                return Err("the model has fused Adam no faster than AR-C at 2^30".into());
            }
        }
    }
    errors.sort_by(f64::total_cmp);
    println!(
        "median |error| of the speedup {:.0} %, largest {:.0} %\n",
        errors[errors.len() / 2] * 100.0,
        errors.last().copied().unwrap_or(0.0) * 100.0
    );

    Ok((
        "Adam on 128 V100s: speedup over AR-C".into(),
        "log2 N",
        vec![
            ("CoCoNet artifact (its best schedule)".into(), paper_curve),
            ("cost model, its best schedule".into(), model_curve),
            ("cost model, fuse(RS-C-AG)".into(), fused_curve),
        ],
    ))
}

/// Part 2, scale-out on DGX H100, 8 to 1,024 GPUs: Adam at GPT-3's size and the
/// Megatron layer at GPT-3's width (a table and a panel each).
fn scale_out(adam_schedules: &[Schedule]) -> Result<Vec<Panel>, Box<dyn std::error::Error>> {
    let h100 = Machine::preset("dgx-h100")?;
    let gpus: Vec<usize> = (3..=10).map(|k| 1usize << k).collect();
    let n = 175usize << 30;
    let megatron = megatron_program::megatron();
    let megatron_schedules = candidates(megatron.program(), &[]);
    let (b, s, h) = (4usize, 2048usize, 12288usize);
    let cases: [Case; 2] = [
        (
            format!(
                "Adam f32, N = 175·2^30 ({:.0} G parameters)",
                n as f64 / 1e9
            ),
            adam_schedules,
            vec![("N", n)],
        ),
        (
            format!("Megatron layer f16, [B, S, H] = [{b}, {s}, {h}], tensor-parallel"),
            &megatron_schedules,
            vec![("B", b), ("S", s), ("H", h)],
        ),
    ];
    let mut panels: Vec<Panel> = Vec::new();
    for (title, schedules, dims) in &cases {
        println!("## {title} on DGX H100 (8 GPUs per node), predicted ms per step\n");
        print!("| GPUs |");
        for sc in schedules.iter() {
            print!(" {} |", sc.name());
        }
        println!(" model's choice |");
        println!("|---|{}---|", "---|".repeat(schedules.len()));
        let mut curves: Vec<Curve> = schedules
            .iter()
            .map(|sc| (sc.name().to_string(), Vec::new()))
            .collect();
        for &p in &gpus {
            let rows = predictions(schedules, p, dims, &h100)?;
            print!("| {p} |");
            for (i, (_, t)) in rows.iter().enumerate() {
                print!(" {:.2} |", t * 1e3);
                curves[i].1.push(((p as f64).log2(), t * 1e3));
            }
            println!(" {} |", fastest(&rows).0);
        }
        println!();
        panels.push((format!("{title}: ms per step"), "log2 GPUs", curves));
    }
    Ok(panels)
}

/// Part 3, one GPU: the DGX H100 parameters' kernel terms against the steps measured on
/// an H100 and an H200 (fails past 25 %).
fn one_gpu(adam_schedules: &[Schedule]) -> Result<(), Box<dyn std::error::Error>> {
    let h100 = Machine::preset("dgx-h100")?;
    let mut h200 = h100.clone();
    h200.name = "H200".into();
    h200.memory_bandwidth = H200_MEMORY_BANDWIDTH;
    let sgd = sgd_program::sgd();
    let sgd_schedules = candidates(sgd.program(), &[]);
    println!("## One GPU, N = 2^28 f32, P = 1: predicted against measured (ms)\n");
    println!(
        "| step | H100 predicted | H100 measured | error | H200 predicted | H200 measured | error |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut worst = 0.0f64;
    for &(program, schedule, h100_ms, h200_ms) in ONE_GPU_MS {
        let schedules = if program == "adam" {
            adam_schedules
        } else {
            &sgd_schedules
        };
        let at = |machine: &Machine| -> Result<f64, Box<dyn std::error::Error>> {
            let rows = predictions(schedules, 1, &[("N", 1 << 28)], machine)?;
            Ok(by_name(&rows, schedule)? * 1e3)
        };
        let error = |predicted: f64, measured: f64| predicted / measured - 1.0;
        let (p100, p200) = (at(&h100)?, at(&h200)?);
        let e200 = error(p200, h200_ms);
        worst = worst.max(e200.abs());
        let h100_cells = match h100_ms {
            Some(m) => {
                worst = worst.max(error(p100, m).abs());
                format!("{m:.3} | {:+.0} %", error(p100, m) * 100.0)
            }
            None => "— | —".into(),
        };
        println!(
            "| {program} {schedule} | {p100:.3} | {h100_cells} | {p200:.3} | {h200_ms:.3} | {:+.0} % |",
            e200 * 100.0
        );
    }
    println!("\nlargest |error| {:.0} %\n", worst * 100.0);
    // Issue 14's bar for a prediction; the inputs are fixed, so a miss is a change of
    // the model, not noise.
    if worst > 0.25 {
        return Err("a one-GPU prediction is off its measurement by more than 25 %".into());
    }
    Ok(())
}

/// The panels side by side as one SVG (y: a speedup, or ms).
fn plot(path: &str, panels: &[Panel]) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    if let Some(dir) = std::path::Path::new(path).parent() {
        std::fs::create_dir_all(dir)?;
    }
    let root = SVGBackend::new(path, (1500, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((1, panels.len()));
    let colours = [BLACK, RED, BLUE, GREEN, MAGENTA, CYAN];
    for ((title, x_desc, curves), area) in panels.iter().zip(&areas) {
        let points = curves.iter().flat_map(|c| c.1.iter());
        let (x0, x1, y1) = points.fold((f64::MAX, f64::MIN, 0.0f64), |(a, b, c), &(x, y)| {
            (a.min(x), b.max(x), c.max(y))
        });
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 15))
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(x0..x1, 0.0..y1 * 1.1)?;
        chart
            .configure_mesh()
            .x_desc(*x_desc)
            .y_desc(if title.contains("speedup") {
                "×"
            } else {
                "ms"
            })
            .draw()?;
        for (i, (label, pts)) in curves.iter().enumerate() {
            let colour = colours[i % colours.len()];
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), colour.stroke_width(2)))?
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
