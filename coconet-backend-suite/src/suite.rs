//! The suite itself: one macro that expands to a test module of `#[test]` functions.

/// Instantiates the backend suite for `$backend` (an expression giving a `Backend`), on
/// 1, 2, 3, 4 and 8 ranks or on the rank counts given.
#[macro_export]
macro_rules! backend_suite {
    ($backend:expr) => {
        $crate::backend_suite!(@all $backend, [1, 2, 3, 4, 8], true);
    };
    ($backend:expr, [$($ranks:expr),*]) => {
        $crate::backend_suite!(@all $backend, [$($ranks),*], false);
    };
    (@all $backend:expr, [$($ranks:expr),*], $every_test_rank:expr) => {
        use $crate::__coconet::core::Layout;
        use $crate::__coconet::core::schedule::{Schedule, candidates};
        use $crate::__coconet::prelude::*;
        use $crate::__coconet::runtime::{Backend, JobData, Plan};

        fn check(schedules: &[Schedule], ranks: usize, args: Bindings, matmul: bool) {
            let backend = $backend;
            let original = schedules[0].original();
            for s in schedules {
                let want = interpret(s.program(), ranks, &args)
                    .unwrap_or_else(|e| panic!("{} on {ranks} ranks: {e}", s.name()));
                let plan = Plan::lower(s, ranks, args.dims()).unwrap();
                let mut jobs = Vec::new();
                for _ in 0..2 {
                    let mut job = backend.prepare(&plan, &args).unwrap();
                    backend
                        .run(&mut job)
                        .unwrap_or_else(|e| panic!("{} on {ranks} ranks: {e}", s.name()));
                    jobs.push(job);
                }
                let what = format!("schedule {} on {ranks} ranks", s.name());
                // Updated inputs and outputs, against the interpreter.
                let mut names: Vec<(String, $crate::__coconet::core::ValueId)> = original
                    .updates()
                    .map(|(t, _)| (original.label(t), t))
                    .collect();
                names.extend(original.outputs().iter().map(|&o| (original.label(o), o)));
                for (name, id) in names {
                    let layout = s.program().node(id).ty.layout;
                    let is_input = s.program().node(id).op == $crate::__coconet::core::Op::TensorInput;
                    for r in 0..ranks {
                        let got: Option<Vec<f64>> = if is_input {
                            jobs[0].final_input_local::<f64>(&name, r).ok()
                        } else {
                            jobs[0].local::<f64>(id, r)
                        };
                        let exp: Option<Vec<f64>> = if is_input {
                            want.final_input_local::<f64>(&name, r).ok()
                        } else {
                            want.local::<f64>(id, r)
                        };
                        assert_eq!(
                            got.is_some(),
                            exp.is_some(),
                            "{what}: `{name}` held on rank {r}"
                        );
                        let (Some(g), Some(e)) = (got, exp) else {
                            continue;
                        };
                        assert_eq!(g.len(), e.len(), "{what}: `{name}` on rank {r}");
                        for (i, (a, b)) in g.iter().zip(&e).enumerate() {
                            let ok = if matmul {
                                (a - b).abs() <= 2e-3 * b.abs().max(1.0)
                            } else {
                                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
                            };
                            assert!(
                                ok,
                                "{what}: `{name}`[{i}] on rank {r}: {a} vs interpreter {b}"
                            );
                        }
                        // Replicated values are bitwise identical on every rank.
                        if layout == Layout::Replicated && !is_input {
                            let r0 = (0..ranks)
                                .find(|&q| jobs[0].local::<f64>(id, q).is_some())
                                .unwrap();
                            let first: Vec<u64> = jobs[0]
                                .local::<f64>(id, r0)
                                .unwrap()
                                .iter()
                                .map(|x| x.to_bits())
                                .collect();
                            let mine: Vec<u64> = g.iter().map(|x| x.to_bits()).collect();
                            assert_eq!(
                                mine, first,
                                "{what}: Replicated `{name}` differs on rank {r}"
                            );
                        }
                        // Two runs give the same bits.
                        let again: Option<Vec<f64>> = if is_input {
                            jobs[1].final_input_local::<f64>(&name, r).ok()
                        } else {
                            jobs[1].local::<f64>(id, r)
                        };
                        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&again.unwrap()),
                            bits(&g),
                            "{what}: `{name}` not deterministic"
                        );
                    }
                }
            }
        }

        fn grads(ranks: usize, n: usize) -> Vec<Vec<f32>> {
            (0..ranks)
                .map(|r| $crate::__programs::data::uniform_f32(40 + r as u64, n))
                .collect()
        }

        const RANKS: &[usize] = &[$($ranks),*];

        /// Whether a test with its own rank counts runs on `ranks`.
        fn wanted(ranks: usize) -> bool {
            $every_test_rank || RANKS.contains(&ranks)
        }

        #[test]
        fn sgd() {
            let p = $crate::__programs::sgd::sgd();
            let schedules = candidates(p.program(), &[]);
            for &ranks in RANKS {
                for n in [1, 13, 5000] {
                    let args = $crate::__programs::sgd::sgd::Args {
                        N: n,
                        g: TensorArg::PerRank(grads(ranks, n)),
                        w: TensorArg::Global($crate::__programs::data::uniform_f32(1, n)),
                        lr: 0.1,
                    };
                    check(&schedules, ranks, args.into(), false);
                }
            }
        }

        #[test]
        fn adam() {
            let p = $crate::__programs::adam::adam();
            let mut schedules = candidates(p.program(), &[p.m.id(), p.v.id()]);
            schedules.push(p.by_steps());
            let hp = $crate::__programs::adam::AdamParams {
                lr: 1e-2,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                step: 3,
            };
            for &ranks in RANKS {
                for n in [7, 4099] {
                    let v: Vec<f32> = $crate::__programs::data::uniform_f32(3, n).iter().map(|x| x * x).collect();
                    let args = $crate::__programs::adam::adam_args(
                        &grads(ranks, n),
                        &$crate::__programs::data::uniform_f32(1, n),
                        &$crate::__programs::data::uniform_f32(2, n),
                        &v,
                        hp,
                    );
                    check(&schedules, ranks, args.into(), false);
                }
            }
        }

        #[test]
        fn lamb() {
            let p = $crate::__programs::lamb::lamb();
            let schedules = candidates(p.program(), &[p.m.id(), p.v.id()]);
            let hp = $crate::__programs::lamb::LambParams {
                lr: 1e-2,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-6,
                weight_decay: 0.01,
                step: 2,
            };
            for &ranks in RANKS {
                for n in [5, 3001] {
                    let v: Vec<f32> = $crate::__programs::data::uniform_f32(3, n).iter().map(|x| x * x).collect();
                    let args = $crate::__programs::lamb::lamb_args(
                        &grads(ranks, n),
                        &$crate::__programs::data::uniform_f32(1, n),
                        &$crate::__programs::data::uniform_f32(2, n),
                        &v,
                        hp,
                    );
                    check(&schedules, ranks, args.into(), false);
                }
            }
        }

        #[test]
        fn megatron() {
            let p = $crate::__programs::megatron::megatron();
            let schedules = candidates(p.program(), &[]);
            for &ranks in RANKS {
                let (b, s, h) = (3, 2, 6);
                let args = $crate::__programs::megatron::megatron_args(b, s, h, 17);
                check(&schedules, ranks, args.into(), true);
            }
        }

        #[test]
        fn pipeline() {
            let p = $crate::__programs::pipeline::pipeline();
            let schedules = candidates(p.program(), &[]);
            for ranks in [2, 4, 6, 8].into_iter().filter(|&r| wanted(r)) {
                let (b, h) = (3, 5);
                let args = $crate::__programs::pipeline::pipeline::Args {
                    B: b,
                    H: h,
                    x: TensorArg::PerRank(grads(ranks / 2, b * h)),
                    b: TensorArg::Global($crate::__programs::data::uniform_f32(1, h)),
                    r: TensorArg::Global($crate::__programs::data::uniform_f32(2, b * h)),
                    seed: 5,
                };
                check(&schedules, ranks, args.into(), false);
            }
        }

        /// The step of a training loop: a job prepared once and run 20 times, with each
        /// rank's fresh gradient written into it and the step counter and learning rate
        /// set between runs, every iteration bitwise equal to the interpreter running
        /// the same schedule from scratch.
        #[test]
        fn training_loop() {
            let p = $crate::__programs::adam::adam();
            let n = 37;
            let hp = |it: usize| $crate::__programs::adam::AdamParams {
                lr: 1e-2 / (1.0 + it as f64),
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                step: it as i32 + 1,
            };
            let grads_at = |it: usize, ranks: usize| -> Vec<Vec<f32>> {
                (0..ranks)
                    .map(|r| $crate::__programs::data::uniform_f32(1000 * it as u64 + r as u64, n))
                    .collect()
            };
            let backend = $backend;
            let ranks = RANKS.iter().copied().filter(|&r| r <= 3).max().unwrap_or(1);
            for s in candidates(p.program(), &[p.m.id(), p.v.id()]) {
                let (mut w, mut m, mut v) =
                    ($crate::__programs::data::uniform_f32(1, n), vec![0.0f32; n], vec![0.0f32; n]);
                let first: Bindings =
                    $crate::__programs::adam::adam_args(&grads_at(0, ranks), &w, &m, &v, hp(0)).into();
                let plan = Plan::lower(&s, ranks, first.dims()).unwrap();
                let mut job = backend.prepare(&plan, &first).unwrap();
                let what = format!("training loop, {} on {ranks} ranks", s.name());
                for it in 0..20 {
                    let grads = grads_at(it, ranks);
                    if it > 0 {
                        for (r, g) in grads.iter().enumerate() {
                            job.write_input_local("g", r, g).unwrap();
                        }
                        job.set_scalar("step", hp(it).step).unwrap();
                        job.set_scalar("lr", hp(it).lr).unwrap();
                    }
                    backend
                        .run(&mut job)
                        .unwrap_or_else(|e| panic!("{what}, iteration {it}: {e}"));
                    let args: Bindings =
                        $crate::__programs::adam::adam_args(&grads, &w, &m, &v, hp(it)).into();
                    let want = interpret(s.program(), ranks, &args).unwrap();
                    for name in ["w", "m", "v"] {
                        for r in 0..ranks {
                            let got: Vec<f32> = job.final_input_local(name, r).unwrap();
                            let exp: Vec<f32> = want.final_input_local(name, r).unwrap();
                            let bits = |x: &[f32]| x.iter().map(|y| y.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(&got),
                                bits(&exp),
                                "{what}, iteration {it}: `{name}` on rank {r}"
                            );
                        }
                    }
                    w = want.final_input("w").unwrap();
                    m = want.final_input("m").unwrap();
                    v = want.final_input("v").unwrap();
                }
            }
        }

        /// Layer norm after an all-reduce and a bias, bitwise on every backend: rows
        /// shorter and longer than a GPU block's lanes (`coconet::core::numerics::ROW_LANES`), in
        /// f64, f32 and f16, on every schedule (the fused ones normalise inside the fused
        /// all-reduce's kernel).
        #[test]
        fn layer_norm() {
            use $crate::__coconet::core::{BinaryOp, DType, Dim, ReduceOp, Shape};
            // 12000 f32 columns do not fit a GPU block's row cache: recomputed in each pass.
            for (dtype, rows, h) in [(DType::F64, 5, 700), (DType::F16, 7, 300), (DType::F32, 9, 40), (DType::F32, 2, 12_000)] {
                let mut b = ProgramBuilder::new("norm");
                let x = b
                    .tensor_input(
                        "x",
                        dtype,
                        Layout::Local,
                        Shape::new(vec![Dim::sym("R"), Dim::sym("H")]),
                        0,
                    )
                    .unwrap();
                let hs = Shape::new(vec![Dim::sym("H")]);
                let bias = b
                    .tensor_input("bias", dtype, Layout::Replicated, hs.clone(), 0)
                    .unwrap();
                let gamma = b
                    .tensor_input("gamma", dtype, Layout::Replicated, hs.clone(), 0)
                    .unwrap();
                let beta = b
                    .tensor_input("beta", dtype, Layout::Replicated, hs, 0)
                    .unwrap();
                let s = b.all_reduce(ReduceOp::Sum, x).unwrap();
                let y = b.binary(BinaryOp::Add, s, bias).unwrap();
                let n = b.layer_norm(y, gamma, beta, 1e-5).unwrap();
                // A second norm of the first's output plus its input, in the same row
                // kernel: its passes read the first norm's input where it was kept.
                let z = b.binary(BinaryOp::Add, n, y).unwrap();
                let n2 = b.layer_norm(z, gamma, beta, 1e-3).unwrap();
                b.output(n).unwrap();
                b.output(n2).unwrap();
                let prog = b.finish();
                let schedules = candidates(&prog, &[]);
                for ranks in [1, 3].into_iter().filter(|&r| wanted(r)) {
                    let per: Vec<Vec<f64>> = (0..ranks)
                        .map(|r| $crate::__programs::data::uniform(90 + r as u64, rows * h).iter().map(|x| x * 3.0 + 0.5).collect())
                        .collect();
                    let args = Bindings::new()
                        .dim("R", rows)
                        .dim("H", h)
                        .tensor("x", Binding::per_rank_as(dtype, &per))
                        .tensor("bias", Binding::global_as(dtype, &$crate::__programs::data::uniform(95, h)))
                        .tensor("gamma", Binding::global_as(dtype, &$crate::__programs::data::uniform(96, h).iter().map(|x| 1.0 + x).collect::<Vec<_>>()))
                        .tensor("beta", Binding::global_as(dtype, &$crate::__programs::data::uniform(97, h)));
                    check(&schedules, ranks, args, false);
                }
            }
        }

        /// exp, log, tanh, gelu, sqrt, rsqrt and pow in f32 and f64 on special values
        /// (signed zeros, subnormals, overflow and underflow edges, infinities, NaN,
        /// negative bases) and spread ones: every backend computes coconet's own
        /// functions (`coconet::core::math`), bit for bit the interpreter's.
        #[test]
        fn transcendentals() {
            use $crate::__coconet::core::{BinaryOp, DType, Dim, Shape, UnaryOp};
            let special = [
                0.0, -0.0, 1.0, -1.0, 0.5, 2.0, -2.5, 3.0, -3.0, 1e-300, 5e-324, -5e-324,
                1e300, 709.7, 710.0, -745.0, -746.0, 22.5, 0.625, 0.6249, 1e-9, 88.7, -103.9,
                f64::INFINITY, f64::NEG_INFINITY, f64::NAN,
            ];
            let powers = [0.0, -0.0, 1.0, 2.0, 0.5, -1.0, 3.0, -3.0, 1.0 / 3.0, 1e4, f64::NAN];
            let n = 1001;
            for dtype in [DType::F32, DType::F64] {
                let mut b = ProgramBuilder::new("transcendentals");
                let shape = Shape::new(vec![Dim::sym("N")]);
                let x = b
                    .tensor_input("x", dtype, Layout::Local, shape.clone(), 0)
                    .unwrap();
                let y = b.tensor_input("y", dtype, Layout::Local, shape, 0).unwrap();
                for op in [
                    UnaryOp::Exp,
                    UnaryOp::Log,
                    UnaryOp::Tanh,
                    UnaryOp::Gelu,
                    UnaryOp::Sqrt,
                    UnaryOp::Rsqrt,
                ] {
                    let o = b.unary(op, x).unwrap();
                    b.output(o).unwrap();
                }
                let p = b.binary(BinaryOp::Pow, x, y).unwrap();
                b.output(p).unwrap();
                let prog = b.finish();
                let schedules = candidates(&prog, &[]);
                for ranks in [1, 2].into_iter().filter(|&r| wanted(r)) {
                    let values = |r: usize, y: bool| -> Vec<f64> {
                        let spread = $crate::__programs::data::uniform(70 + 2 * r as u64 + y as u64, n);
                        (0..n)
                            .map(|i| match (y, i) {
                                (false, i) if i < 3 * special.len() => special[i % special.len()],
                                (true, i) if i < 3 * special.len() => powers[(i / 3 + r) % powers.len()],
                                (false, i) if i % 2 == 0 => spread[i] * 40.0,
                                (_, i) => spread[i] * 8.0,
                            })
                            .collect()
                    };
                    let bind = |y: bool| -> Binding {
                        let per: Vec<Vec<f64>> = (0..ranks).map(|r| values(r, y)).collect();
                        Binding::per_rank_as(dtype, &per)
                    };
                    let args = Bindings::new()
                        .dim("N", n)
                        .tensor("x", bind(false))
                        .tensor("y", bind(true));
                    check(&schedules, ranks, args, false);
                }
            }
        }

        /// Dropout of values sliced along each dim, with blocks long enough for the
        /// kernels' eight-lane draws and runs along the sliced dim that end inside a
        /// group of eight: every rank draws each element's logical index.
        #[test]
        fn dropout_of_slices() {
            use $crate::__coconet::core::{DType, Dim, Shape};
            let dims = [("A", 5usize), ("B", 13), ("C", 11)];
            for layout in [Layout::Replicated, Layout::Sliced(0), Layout::Sliced(1), Layout::Sliced(2)] {
                let mut b = ProgramBuilder::new("dropout");
                let shape = Shape::new(dims.iter().map(|&(d, _)| Dim::sym(d)).collect());
                let x = b.tensor_input("x", DType::F32, layout, shape, 0).unwrap();
                let seed = b.scalar_input("seed", DType::I64).unwrap();
                let y = b.dropout(x, 0.3, seed).unwrap();
                b.output(y).unwrap();
                let prog = b.finish();
                let schedules = candidates(&prog, &[]);
                let n: usize = dims.iter().map(|(_, n)| n).product();
                for &ranks in RANKS {
                    let mut args = Bindings::new()
                        .scalar("seed", 11i64)
                        .tensor("x", Binding::global(&$crate::__programs::data::uniform_f32(90, n)));
                    for (d, len) in dims {
                        args = args.dim(d, len);
                    }
                    check(&schedules, ranks, args, false);
                }
            }
        }

        /// Every dtype through a kernel, a collective and a fused all-reduce.
        #[test]
        fn dtypes() {
            use $crate::__coconet::core::{BinaryOp, DType, Dim, ReduceOp, Shape, UnaryOp};
            for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
                let mut b = ProgramBuilder::new("axpy");
                let n = Shape::new(vec![Dim::sym("N")]);
                let g = b
                    .tensor_input("g", dtype, Layout::Local, n.clone(), 0)
                    .unwrap();
                let w = b
                    .tensor_input("w", dtype, Layout::Replicated, n, 0)
                    .unwrap();
                let s = b.all_reduce(ReduceOp::Sum, g).unwrap();
                let t = b.unary(UnaryOp::Tanh, s).unwrap();
                let u = b.binary(BinaryOp::Sub, w, t).unwrap();
                let _ = b.update(w, u).unwrap();
                let prog = b.finish();
                let schedules = candidates(&prog, &[]);
                assert_eq!(schedules.len(), 3);
                for ranks in [1, 3, 4].into_iter().filter(|&r| wanted(r)) {
                    let n = 1001;
                    let conv =
                        |v: Vec<f64>| v.into_iter().map(|x| dtype.round(x)).collect::<Vec<f64>>();
                    let per: Vec<Vec<f64>> = (0..ranks)
                        .map(|r| conv($crate::__programs::data::uniform(60 + r as u64, n)))
                        .collect();
                    let mut args = Bindings::new().dim("N", n);
                    args = args
                        .tensor("g", Binding::per_rank_as(dtype, &per))
                        .tensor("w", Binding::global_as(dtype, &$crate::__programs::data::uniform(9, n)));
                    check(&schedules, ranks, args, false);
                }
            }
        }

        /// Mixed precision through a fused all-reduce, in every dtype: the reduced
        /// gradients kept in a state of their dtype (an update that passes them on),
        /// and cast to f32 with that state to update f32 weights (casts that compile
        /// from narrow registers and buffers, or not).
        #[test]
        fn dtypes_passed_on() {
            use $crate::__coconet::core::{BinaryOp, DType, Dim, ReduceOp, Shape};
            for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
                let mut b = ProgramBuilder::new("mixed");
                let n = Shape::new(vec![Dim::sym("N")]);
                let g = b
                    .tensor_input("g", dtype, Layout::Local, n.clone(), 0)
                    .unwrap();
                let m = b
                    .tensor_input("m", dtype, Layout::Replicated, n.clone(), 0)
                    .unwrap();
                let w = b
                    .tensor_input("w", DType::F32, Layout::Replicated, n, 0)
                    .unwrap();
                let s = b.all_reduce(ReduceOp::Sum, g).unwrap();
                let _ = b.update(m, s).unwrap();
                let wide = b.cast(DType::F32, s).unwrap();
                let kept = b.cast(DType::F32, m).unwrap();
                let both = b.binary(BinaryOp::Add, wide, kept).unwrap();
                let next = b.binary(BinaryOp::Sub, w, both).unwrap();
                let _ = b.update(w, next).unwrap();
                let prog = b.finish();
                let schedules = candidates(&prog, &[]);
                for ranks in [1, 3, 4].into_iter().filter(|&r| wanted(r)) {
                    let n = 1001;
                    let per: Vec<Vec<f64>> = (0..ranks)
                        .map(|r| {
                            let v = $crate::__programs::data::uniform(70 + r as u64, n);
                            v.into_iter().map(|x| dtype.round(x)).collect()
                        })
                        .collect();
                    let args = Bindings::new()
                        .dim("N", n)
                        .tensor("g", Binding::per_rank_as(dtype, &per))
                        .tensor("m", Binding::global_as(dtype, &$crate::__programs::data::uniform(11, n)))
                        .tensor("w", Binding::global_as(DType::F32, &$crate::__programs::data::uniform(12, n)));
                    check(&schedules, ranks, args, false);
                }
            }
        }
    };
}
