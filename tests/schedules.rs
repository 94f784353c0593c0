//! The paper's schedules for every example, checked on the reference interpreter against
//! the unscheduled program, for several rank counts and sizes that do not divide them.
//!
//! Tolerance: every schedule gives bitwise the same outputs and updated inputs as the
//! program as written, except LAMB's, whose norms become per-rank partial sums plus an
//! all-reduce (reassociated: relative error ≤ 1e-6 in f32).

use coconet_example_programs::{
    adam as adam_program, data, lamb as lamb_program, megatron as megatron_program,
    pipeline as pipeline_program, sgd as sgd_program,
};

use coconet::core::Layout;
use coconet::core::schedule::{Schedule, candidates};
use coconet::prelude::*;

/// Every output and updated input of `reference`, as values: the logical value for
/// Replicated/Sliced ones, each rank's for Local ones.
fn observable(run: &Execution, reference: &Program) -> Vec<(String, Vec<f64>)> {
    let mut values = Vec::new();
    for (input, _) in reference.updates() {
        let name = reference.label(input);
        match run.final_input::<f64>(&name) {
            Ok(v) => values.push((format!("input {name} after the step"), v)),
            Err(_) => {
                for r in 0..run.ranks() {
                    if let Ok(v) = run.final_input_local::<f64>(&name, r) {
                        values.push((format!("input {name} on rank {r}"), v));
                    }
                }
            }
        }
    }
    for &o in reference.outputs() {
        let label = format!("output {}", reference.label(o));
        if run.program().node(o).ty.layout == Layout::Local {
            for r in 0..run.ranks() {
                if let Some(v) = run.local::<f64>(o, r) {
                    values.push((format!("{label} on rank {r}"), v));
                }
            }
        } else {
            values.push((label, run.logical::<f64>(o).expect("readable")));
        }
    }
    values
}

fn check_schedules(schedules: &[Schedule], ranks: usize, args: Bindings, tolerance: f64) {
    let original = schedules[0].original();
    let want = observable(&interpret(original, ranks, &args).unwrap(), original);
    assert!(!want.is_empty());
    for s in schedules {
        let run = interpret(s.program(), ranks, &args)
            .unwrap_or_else(|e| panic!("{} on {ranks} ranks: {e}", s.name()));
        let got = observable(&run, original);
        assert_eq!(got.len(), want.len(), "{}", s.name());
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            if tolerance == 0.0 {
                let (gb, wb): (Vec<u64>, Vec<u64>) = (
                    g.iter().map(|x| x.to_bits()).collect(),
                    w.iter().map(|x| x.to_bits()).collect(),
                );
                assert_eq!(
                    gb,
                    wb,
                    "schedule {} on {ranks} ranks: {name} differs",
                    s.name()
                );
            } else {
                let err = data::max_rel_err(g, w);
                assert!(
                    err <= tolerance,
                    "schedule {} on {ranks} ranks: {name} off by {err}",
                    s.name()
                );
            }
        }
    }
}

fn names(s: &[Schedule]) -> Vec<&str> {
    s.iter().map(Schedule::name).collect()
}

fn grads(ranks: usize, n: usize) -> Vec<Vec<f32>> {
    (0..ranks)
        .map(|r| data::uniform_f32(7 + r as u64, n))
        .collect()
}

fn per_rank(ranks: usize, n: usize) -> TensorArg<f32> {
    TensorArg::PerRank(grads(ranks, n))
}

#[test]
fn sgd_schedules() {
    let p = sgd_program::sgd();
    let schedules = candidates(p.program(), &[]);
    assert_eq!(names(&schedules), ["AR-C", "RS-C-AG", "fuse(RS-C-AG)"]);
    for ranks in [1, 2, 3, 4, 5, 8] {
        let n = 23;
        let args = sgd_program::sgd::Args {
            N: n,
            g: per_rank(ranks, n),
            w: TensorArg::Global(data::uniform_f32(1, n)),
            lr: 0.1,
        };
        check_schedules(&schedules, ranks, args.into(), 0.0);
    }
}

fn adam_args(ranks: usize, n: usize) -> adam_program::adam::Args {
    let hp = adam_program::AdamParams {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        step: 3,
    };
    let v: Vec<f32> = data::uniform_f32(3, n).iter().map(|x| x * x).collect();
    adam_program::adam_args(
        &grads(ranks, n),
        &data::uniform_f32(1, n),
        &data::uniform_f32(2, n),
        &v,
        hp,
    )
}

#[test]
fn adam_schedules() {
    let p = adam_program::adam();
    let schedules = candidates(p.program(), &[p.m.id(), p.v.id()]);
    assert_eq!(names(&schedules), ["AR-C", "RS-C-AG", "fuse(RS-C-AG)"]);
    for ranks in [1, 2, 3, 4, 5, 8] {
        for n in [1, 10, 37] {
            check_schedules(&schedules, ranks, adam_args(ranks, n).into(), 0.0);
        }
    }
}

/// Schedules named in the attribute are the same as the enumerated ones.
#[test]
fn adam_schedules_from_the_attribute() {
    let p = adam_program::adam();
    let fused = &candidates(p.program(), &[p.m.id(), p.v.id()])[2];
    for s in [p.sharded(), p.by_steps()] {
        assert_eq!(s.program(), fused.program(), "{}", s.name());
        assert_eq!(s.fusions(), fused.fusions());
    }
    assert_eq!(p.sharded().name(), "sharded");
    check_schedules(&[p.by_steps()], 3, adam_args(3, 11).into(), 0.0);
}

#[test]
fn adam_state_shrinks_to_one_pth() {
    let p = adam_program::adam();
    let schedules = candidates(p.program(), &[p.m.id(), p.v.id()]);
    let dims = [("N".to_string(), 1usize << 20)].into_iter().collect();
    let fp: Vec<_> = schedules
        .iter()
        .map(|s| s.footprint(&dims, 4).unwrap())
        .collect();
    let mib = 1u64 << 20;
    // AR-C: w, m, v whole (4 MiB each); sharded: w whole, m and v at 1/4.
    assert_eq!(fp[0].state, 12 * mib);
    assert_eq!(fp[1].state, 6 * mib);
    assert_eq!(fp[2].state, 6 * mib);
    assert_eq!(fp[0].inputs, 4 * mib);
    // Fusion keeps intermediates in registers: AR-C's fused update materialises only
    // the all-reduced gradient (4 MiB) and scalars, RS-C-AG the reduce-scattered
    // gradient and the gathered weights, the fused all-reduce almost nothing.
    assert!(fp[0].intermediates <= 4 * mib + 64, "{fp:?}");
    assert!(fp[1].intermediates <= 5 * mib + 64, "{fp:?}");
    assert!(fp[2].intermediates < mib / 1024, "{fp:?}");
    // m and v are Sliced inputs of the sharded programs.
    for s in &schedules[1..] {
        assert_eq!(s.program().node(p.m.id()).ty.layout, Layout::Sliced(0));
        assert_eq!(s.program().node(p.w.id()).ty.layout, Layout::Replicated);
    }
}

/// A shape whose byte count overflows is refused by the footprint as by `Plan::lower`,
/// never reported as a small number (it wrapped before).
#[test]
fn a_footprint_that_overflows_is_an_error() {
    let mut b = ProgramBuilder::new("big");
    let shape = coconet::core::Shape::new(vec![
        coconet::core::Dim::sym("A"),
        coconet::core::Dim::sym("B"),
    ]);
    let x = b
        .tensor_input("x", DType::F32, Layout::Local, shape, 0)
        .unwrap();
    b.all_reduce(coconet::core::ReduceOp::Sum, x).unwrap();
    let p = b.finish();
    let dims = [
        ("A".to_string(), 1usize << 33),
        ("B".to_string(), 1usize << 30),
    ]
    .into_iter()
    .collect();
    let e = Schedule::new(&p).footprint(&dims, 2).unwrap_err();
    assert!(matches!(e, InterpError::TooLarge { .. }), "{e:?}");
    assert!(Plan::lower(&Schedule::new(&p), 2, &dims).is_err());
}

#[test]
fn lamb_schedules() {
    let p = lamb_program::lamb();
    let schedules = candidates(p.program(), &[p.m.id(), p.v.id()]);
    assert_eq!(names(&schedules), ["AR-C", "RS-C-AG", "fuse(RS-C-AG)"]);
    for ranks in [1, 2, 3, 4, 5, 8] {
        for n in [3, 41] {
            let args = lamb_program::lamb_args(
                &grads(ranks, n),
                &data::uniform_f32(1, n),
                &data::uniform_f32(2, n),
                &data::uniform_f32(3, n)
                    .iter()
                    .map(|x| x * x)
                    .collect::<Vec<_>>(),
                lamb_program::LambParams {
                    lr: 1e-2,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-6,
                    weight_decay: 0.01,
                    step: 3,
                },
            );
            check_schedules(&schedules, ranks, args.into(), 1e-6);
        }
    }
}

#[test]
fn megatron_schedules_keep_bias_dropout_residual_and_layer_norm() {
    let p = megatron_program::megatron();
    let schedules = candidates(p.program(), &[]);
    assert_eq!(
        names(&schedules),
        [
            "MM-AR-C",
            "MM-RS-C-AG",
            "fuse(RS-C-AG)",
            "ol(MM, fuse(RS-C-AG))"
        ]
    );
    let text = schedules[3].to_string();
    for op in [
        "matmul",
        "reduce_scatter",
        "dropout",
        "layer_norm",
        "all_gather",
        "overlap: partial",
    ] {
        assert!(text.contains(op), "{op} missing from\n{text}");
    }
    for ranks in [1, 2, 3, 4, 8] {
        let (b, s, h) = (3, 2, 5);
        let args = megatron_program::megatron_args(b, s, h, 17);
        check_schedules(&schedules, ranks, args.into(), 0.0);
    }
}

#[test]
fn pipeline_schedules() {
    let p = pipeline_program::pipeline();
    let schedules = candidates(p.program(), &[]);
    assert_eq!(
        names(&schedules),
        [
            "AR-C-P2P",
            "RS-C-P2P-AG",
            "fuse(RS-C)-P2P-AG",
            "ol(RS, fuse(C-P2P), AG)"
        ]
    );
    // The sliced schedules send 1/P of the data: the send moves a Sliced value.
    let send = |s: &Schedule| {
        let prog = s.program();
        prog.ids()
            .find(|&v| prog.node(v).op.name() == "send")
            .map(|v| prog.node(v).ty.layout)
    };
    assert_eq!(send(&schedules[0]), Some(Layout::Replicated));
    assert_eq!(send(&schedules[1]), Some(Layout::Sliced(0)));
    for ranks in [2, 4, 6, 8] {
        let (b, h) = (3, 4);
        let args = pipeline_program::pipeline::Args {
            B: b,
            H: h,
            x: per_rank(ranks / 2, b * h),
            b: TensorArg::Global(data::uniform_f32(1, h)),
            r: TensorArg::Global(data::uniform_f32(2, b * h)),
            seed: 5,
        };
        check_schedules(&schedules, ranks, args.into(), 0.0);
    }
}
