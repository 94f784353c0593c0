//! A GPT made tensor-parallel (`examples/support/gpt.rs`: vocabulary-parallel embedding
//! and cross-entropy, attention split by heads, the MLP by hidden features) against the
//! same model on one device: each rank's logits are its columns of the whole logits, the
//! loss is the same on every rank, each rank's gradient is its shard of the whole model's
//! gradient — within 1e-5 of the largest value — at P = 1, 2, 4 on rank threads and P = 2, 4
//! over TCP; and ten AdamW steps (candle-nn's, on each rank's shard) give the same losses
//! within 1e-4.

use super::tensor_parallel::close;
use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use coconet::candle::parallel::{Dropout, TensorParallel};
use gpt::{Epilogue, Gpt, ParallelGpt, Shape};

use coconet_example_models::gpt;

use coconet_example_models::replicas;

const SHAPE: Shape = Shape {
    layers: 2,
    width: 16,
    heads: 4,
    context: 8,
    vocab: 12,
};

/// Token ids `[2, 8]` and their next tokens.
fn batch(seed: u32) -> (Tensor, Tensor) {
    let ids: Vec<u32> = (0..2 * 9)
        .map(|i| (i * 7 + seed * 5 + i * i) % SHAPE.vocab as u32)
        .collect();
    let x: Vec<u32> = (0..2)
        .flat_map(|b| ids[b * 9..b * 9 + 8].to_vec())
        .collect();
    let y: Vec<u32> = (0..2)
        .flat_map(|b| ids[b * 9 + 1..b * 9 + 9].to_vec())
        .collect();
    let t = |v: Vec<u32>| Tensor::from_vec(v, (2, 8), &Device::Cpu).unwrap();
    (t(x), t(y))
}

fn vb(varmap: &VarMap) -> VarBuilder<'_> {
    VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu)
}

/// A model with seeded weights (every run tests the same numbers).
fn model() -> Gpt {
    seeded(&VarMap::new())
}

/// A model whose weights, seeded, live in `varmap`.
fn seeded(varmap: &VarMap) -> Gpt {
    let m = Gpt::new(&SHAPE, vb(varmap)).unwrap();
    replicas::initialise(varmap, 7, |name, var| gpt::init_bound(name, var.dims())).unwrap();
    m
}

/// The whole model's logits, loss and gradients (as a model made of them).
fn whole(m: &Gpt, ids: &Tensor, targets: &Tensor) -> (Tensor, f32, Gpt) {
    let logits = m.forward(ids).unwrap();
    let loss = m.loss(ids, targets).unwrap();
    let grads = loss.backward().unwrap();
    let as_model = m
        .map_params(&|p| {
            Ok(grads
                .get(p)
                .expect("every parameter has a gradient")
                .clone())
        })
        .unwrap();
    (logits, loss.to_scalar().unwrap(), as_model)
}

/// Rank `tp`'s logits, loss and gradients, checked against the whole model's.
/// `t`'s elements' bits, in order.
fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

fn check_rank(m: &Gpt, want: &(Tensor, f32, Gpt), tp: &TensorParallel) {
    check_rank_as(m, want, tp, false);
}

/// [`check_rank`], the sequence-parallel variant or not.
fn check_rank_as(m: &Gpt, want: &(Tensor, f32, Gpt), tp: &TensorParallel, sequence: bool) {
    check_rank_with(m, want, tp, sequence, true);
}

/// [`check_rank_as`], the row-parallel epilogues fused or not.
fn check_rank_with(
    m: &Gpt,
    want: &(Tensor, f32, Gpt),
    tp: &TensorParallel,
    sequence: bool,
    fused: bool,
) {
    let mut p = ParallelGpt::shard(m, tp).unwrap();
    p.sequence_parallel = sequence;
    p.epilogue = if fused {
        Epilogue::Fused
    } else {
        Epilogue::Separate
    };
    check_model(
        p,
        want,
        tp,
        if sequence { " (sequence-parallel)" } else { "" },
    );
}

/// Rank `tp.rank()`'s model `p` (named `variant` in failures) against the whole model's
/// logits, loss and gradients.
fn check_model(p: ParallelGpt, want: &(Tensor, f32, Gpt), tp: &TensorParallel, variant: &str) {
    let (ids, targets) = batch(0);
    let at = |what: &str| format!("{what} on rank {} of {}{variant}", tp.rank(), tp.size());
    let logits = p.forward(&ids).unwrap();
    let columns = SHAPE.vocab / tp.size();
    close(
        &logits,
        &want.0.narrow(2, tp.rank() * columns, columns).unwrap(),
        &at("logits"),
    );
    let loss = p.loss(&ids, &targets).unwrap();
    let l: f32 = loss.to_scalar().unwrap();
    assert!(
        (l - want.1).abs() <= 1e-5 * want.1.abs(),
        "{}: {l} vs {}",
        at("loss"),
        want.1
    );
    let mut grads = loss.backward().unwrap();
    p.sum_partial_gradients(&mut grads).unwrap();
    // The whole gradient sharded as the model was: this rank's expected gradients, in
    // the order of its parameters.
    let expected = ParallelGpt::shard(&want.2, tp).unwrap().vars;
    assert_eq!(expected.len(), p.vars.len());
    for (i, (v, e)) in p.vars.iter().zip(&expected).enumerate() {
        let g = grads
            .get(v.as_tensor())
            .expect("every parameter has a gradient");
        close(
            g,
            e.as_tensor(),
            &at(&format!("the gradient of parameter {i}")),
        );
    }
}

#[test]
fn a_tensor_parallel_gpt_on_rank_threads_is_the_single_device_gpt() {
    let m = model();
    let (ids, targets) = batch(0);
    let want = whole(&m, &ids, &targets);
    for ranks in [1, 2, 4] {
        std::thread::scope(|s| {
            for tp in TensorParallel::threads(ranks) {
                let (m, want) = (&m, &want);
                s.spawn(move || check_rank(m, want, &tp));
            }
        });
    }
}

#[test]
fn a_sequence_parallel_gpt_on_rank_threads_is_the_single_device_gpt() {
    let m = model();
    let (ids, targets) = batch(0);
    let want = whole(&m, &ids, &targets);
    for ranks in [1, 2, 4] {
        std::thread::scope(|s| {
            for tp in TensorParallel::threads(ranks) {
                let (m, want) = (&m, &want);
                s.spawn(move || check_rank_as(m, want, &tp, true));
            }
        });
    }
}

/// The collectives as one CUDA job for every rank, the ranks' memory lent in place
/// (`TensorParallel::gpu`'s path, on the host emulator over CPU tensors): with dropout,
/// plain, fused and sequence-parallel, the single-device GPT's logits, loss and
/// gradients.
#[test]
fn a_tensor_parallel_gpt_through_one_device_job_is_the_single_device_gpt() {
    let mut m = model();
    m.dropout = Some(Dropout { p: 0.1, seed: 7 });
    let (ids, targets) = batch(0);
    let want = whole(&m, &ids, &targets);
    for ranks in [1, 2] {
        for (sequence, fused) in [(false, true), (false, false), (true, false)] {
            std::thread::scope(|s| {
                for tp in TensorParallel::emulated_gpu(ranks) {
                    let (m, want) = (&m, &want);
                    s.spawn(move || check_rank_with(m, want, &tp, sequence, fused));
                }
            });
        }
    }
}

/// With dropout (10 %) on the embeddings, the attention probabilities and both residual
/// branches: every rank draws its part of the whole model's masks, so the tensor-parallel
/// GPT — plain, with the fused epilogue or the separate calls, and sequence-parallel —
/// still equals the single-device GPT.
#[test]
fn a_tensor_parallel_gpt_with_dropout_draws_the_single_device_masks() {
    let mut m = model();
    m.dropout = Some(Dropout { p: 0.1, seed: 7 });
    let (ids, targets) = batch(0);
    let want = whole(&m, &ids, &targets);
    // Dropout changes the loss (the masks are drawn at all).
    m.dropout = None;
    let plain = whole(&m, &ids, &targets).1;
    assert!((plain - want.1).abs() > 1e-4, "{plain} vs {}", want.1);
    m.dropout = Some(Dropout { p: 0.1, seed: 7 });
    for ranks in [1, 2, 4] {
        for (sequence, fused) in [(false, true), (false, false), (true, false)] {
            std::thread::scope(|s| {
                for tp in TensorParallel::threads(ranks) {
                    let (m, want) = (&m, &want);
                    s.spawn(move || check_rank_with(m, want, &tp, sequence, fused));
                }
            });
        }
    }
}

/// The matmuls overlapped with their all-reduces (row chunks of 1 to all the tokens),
/// with dropout: the single-device GPT's logits, loss and gradients.
#[test]
fn an_overlapped_tensor_parallel_gpt_is_the_single_device_gpt() {
    let mut m = model();
    m.dropout = Some(Dropout { p: 0.1, seed: 7 });
    let (ids, targets) = batch(0);
    let want = whole(&m, &ids, &targets);
    for ranks in [1, 2, 4] {
        for chunks in [1, 3, 1000] {
            std::thread::scope(|s| {
                for tp in TensorParallel::threads(ranks) {
                    let (m, want) = (&m, &want);
                    s.spawn(move || {
                        let p = ParallelGpt::shard(m, &tp).unwrap().with_overlap(chunks);
                        check_model(p, want, &tp, &format!(" (overlapped, {chunks} chunks)"));
                    });
                }
            });
        }
    }
}

#[test]
fn a_tensor_parallel_gpt_over_tcp_processes_is_the_single_device_gpt() {
    let m = model();
    let (ids, targets) = batch(0);
    let want = whole(&m, &ids, &targets);
    for (ranks, sequence) in [(2, false), (4, false), (4, true)] {
        let name = super::loopback::group_name();
        super::loopback::per_process(ranks, |r| {
            let tcp = super::loopback::connect(r, ranks, &name).unwrap();
            check_rank_as(&m, &want, &TensorParallel::tcp(tcp), sequence);
        });
    }
}

#[test]
fn ten_adamw_steps_of_the_tensor_parallel_gpt_follow_the_single_device_losses() {
    let params = ParamsAdamW {
        lr: 3e-3,
        ..Default::default()
    };
    let varmap = VarMap::new();
    let m = seeded(&varmap);
    // Shard before training: the whole model's Vars change below.
    let start = m.map_params(&|p| p.copy()).unwrap();
    let mut opt = AdamW::new(varmap.all_vars(), params.clone()).unwrap();
    let want: Vec<f32> = (0..10)
        .map(|step| {
            let (x, y) = batch(step);
            let loss = m.loss(&x, &y).unwrap();
            opt.backward_step(&loss).unwrap();
            loss.to_scalar().unwrap()
        })
        .collect();
    std::thread::scope(|s| {
        for tp in TensorParallel::threads(2) {
            let (start, want, params) = (&start, &want, &params);
            s.spawn(move || {
                let p = ParallelGpt::shard(start, &tp).unwrap();
                let mut opt = AdamW::new(p.vars.clone(), params.clone()).unwrap();
                for (step, want) in want.iter().enumerate() {
                    let (x, y) = batch(step as u32);
                    let loss = p.loss(&x, &y).unwrap();
                    opt.backward_step(&loss).unwrap();
                    let got: f32 = loss.to_dtype(DType::F32).unwrap().to_scalar().unwrap();
                    assert!(
                        (got - want).abs() <= 1e-4 * want.abs(),
                        "step {step}, rank {}: {got} vs {want}",
                        tp.rank()
                    );
                }
            });
        }
    });
}

#[test]
fn the_fused_epilogue_is_bitwise_the_separate_calls() {
    let mut m = model();
    // The fused program's dropout and candle's draw the same mask.
    m.dropout = Some(Dropout { p: 0.25, seed: 11 });
    let (ids, targets) = batch(3);
    for ranks in [2, 4] {
        std::thread::scope(|s| {
            for tp in TensorParallel::threads(ranks) {
                let (m, ids, targets) = (&m, &ids, &targets);
                s.spawn(move || {
                    let mut p = ParallelGpt::shard(m, &tp).unwrap();
                    let mut runs = Vec::new();
                    for epilogue in [Epilogue::Fused, Epilogue::Separate] {
                        p.epilogue = epilogue;
                        let logits = p.forward(ids).unwrap();
                        let loss = p.loss(ids, targets).unwrap();
                        let grads = loss.backward().unwrap();
                        let g: Vec<Tensor> = p
                            .vars
                            .iter()
                            .map(|v| grads.get(v.as_tensor()).unwrap().clone())
                            .collect();
                        runs.push((logits, loss, g));
                    }
                    let ((l0, s0, g0), (l1, s1, g1)) = (&runs[0], &runs[1]);
                    assert_eq!(bits(l0), bits(l1), "logits, P = {ranks}");
                    assert_eq!(bits(s0), bits(s1), "loss, P = {ranks}");
                    for (i, (a, b)) in g0.iter().zip(g1).enumerate() {
                        close(a, b, &format!("gradient {i}, P = {ranks}"));
                    }
                });
            }
        });
    }
}

/// Tensor parallelism inside, data parallelism across: a 2 × 2 grid of rank threads —
/// two tensor-parallel groups of two, each on its half of every batch, and for each
/// tensor-parallel rank a `DataParallel` trainer over its two replicas (coconet's fused
/// AdamW) — follows the single-device model trained on the whole batch with candle's
/// AdamW, and the two replicas of each shard stay bitwise equal.
#[test]
fn tensor_parallel_inside_data_parallel_across_follows_the_single_device_losses() {
    use coconet::candle::{AdamWConfig, DataParallel};
    let config = AdamWConfig {
        lr: 3e-3,
        ..Default::default()
    };
    let params = ParamsAdamW {
        lr: 3e-3,
        ..Default::default()
    };
    let varmap = VarMap::new();
    let m = seeded(&varmap);
    let start = m.map_params(&|p| p.copy()).unwrap();
    let mut opt = AdamW::new(varmap.all_vars(), params).unwrap();
    let steps = 5;
    let want: Vec<f32> = (0..steps)
        .map(|step| {
            let (x, y) = batch(step);
            let loss = m.loss(&x, &y).unwrap();
            opt.backward_step(&loss).unwrap();
            loss.to_scalar().unwrap()
        })
        .collect();
    // groups[d][t]: data-parallel replica d's tensor-parallel rank t.
    let groups: Vec<Vec<ParallelGpt>> = (0..2)
        .map(|_| {
            std::thread::scope(|s| {
                let handles: Vec<_> = TensorParallel::threads(2)
                    .into_iter()
                    .map(|tp| {
                        let start = &start;
                        s.spawn(move || ParallelGpt::shard(start, &tp).unwrap())
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            })
        })
        .collect();
    let mut trainers: Vec<DataParallel> = (0..2)
        .map(|t| {
            let replicas = (0..2).map(|d| groups[d][t].vars.clone()).collect();
            DataParallel::new(replicas, config).unwrap()
        })
        .collect();
    for (step, want) in want.iter().enumerate() {
        let (x, y) = batch(step as u32);
        // Every grid rank's loss and gradients on its replica's half of the batch.
        let results: Vec<Vec<(f32, candle_core::backprop::GradStore)>> = std::thread::scope(|s| {
            let handles: Vec<Vec<_>> = groups
                .iter()
                .enumerate()
                .map(|(d, group)| {
                    let (x, y) = (x.narrow(0, d, 1).unwrap(), y.narrow(0, d, 1).unwrap());
                    group
                        .iter()
                        .map(|model| {
                            let (x, y) = (x.clone(), y.clone());
                            s.spawn(move || {
                                let loss = model.loss(&x, &y).unwrap();
                                (loss.to_scalar::<f32>().unwrap(), loss.backward().unwrap())
                            })
                        })
                        .collect()
                })
                .collect();
            handles
                .into_iter()
                .map(|g| g.into_iter().map(|h| h.join().unwrap()).collect())
                .collect()
        });
        let got = (results[0][0].0 + results[1][0].0) / 2.0;
        assert!(
            (got - want).abs() <= 1e-4 * want.abs(),
            "step {step}: {got} vs {want}"
        );
        let mut by_rank: Vec<Vec<_>> = vec![Vec::new(), Vec::new()];
        for replica in results {
            for (t, (_, grads)) in replica.into_iter().enumerate() {
                by_rank[t].push(grads);
            }
        }
        for (trainer, grads) in trainers.iter_mut().zip(&by_rank) {
            trainer.step(grads).unwrap();
        }
    }
    for (t, (one, other)) in groups[0].iter().zip(&groups[1]).enumerate() {
        for (a, b) in one.vars.iter().zip(&other.vars) {
            let bits = |v: &candle_core::Var| v.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(
                bits(a),
                bits(b),
                "tensor-parallel rank {t}'s replicas differ"
            );
        }
    }
}

/// The layer norms fused into the all-reduces too (the paper's whole epilogue, each rank
/// normalising its block of the rows): with dropout, the single-device GPT's logits, loss
/// and gradients at P = 1, 2, 4 on rank threads and at P = 2 through one device job.
#[test]
fn a_tensor_parallel_gpt_with_its_norms_fused_is_the_single_device_gpt() {
    let mut m = model();
    m.dropout = Some(Dropout { p: 0.1, seed: 7 });
    let (ids, targets) = batch(0);
    let want = whole(&m, &ids, &targets);
    for (ranks, one_device) in [(1, false), (2, false), (4, false), (2, true)] {
        let group = if one_device {
            TensorParallel::emulated_gpu(ranks)
        } else {
            TensorParallel::threads(ranks)
        };
        std::thread::scope(|s| {
            for tp in group {
                let (m, want) = (&m, &want);
                s.spawn(move || {
                    let mut p = ParallelGpt::shard(m, &tp).unwrap();
                    p.epilogue = Epilogue::FusedWithNorm;
                    check_model(p, want, &tp, " (norms fused)");
                });
            }
        });
    }
}

/// The fused epilogue with its norm: the residual stream bitwise the epilogue without
/// it, the norm within rounding of candle's layer norm of that stream, and every
/// gradient (partial products, bias, residual, the norm's weight and bias) within 1e-5
/// of candle's autograd through the separate calls, at P = 1, 2, 4, with dropout.
#[test]
fn the_fused_norm_is_the_separate_calls() {
    use coconet::candle::parallel::{NORM_EPS, reduce_bias_residual, reduce_bias_residual_norm};
    let (t, h) = (6, 8);
    let dev = Device::Cpu;
    let det = |seed: u64, n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u64 * 2654435761 + seed * 97) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    };
    let var = |seed: u64, dims: &[usize]| {
        candle_core::Var::from_tensor(
            &Tensor::from_vec(det(seed, dims.iter().product()), dims, &dev).unwrap(),
        )
        .unwrap()
    };
    let d = Dropout { p: 0.2, seed: 3 };
    for ranks in [1, 2, 4] {
        std::thread::scope(|s| {
            for tp in TensorParallel::threads(ranks) {
                let var = &var;
                s.spawn(move || {
                    let r = tp.rank() as u64;
                    let (p, b, res) = (var(10 + r, &[t, h]), var(1, &[h]), var(2, &[t, h]));
                    let (g, be) = (var(3, &[h]), var(4, &[h]));
                    let dir = (var(5, &[t, h]), var(6, &[t, h]));
                    let loss = |y: &Tensor, n: &Tensor| {
                        ((y * dir.0.as_tensor()).unwrap().sum_all().unwrap()
                            + (n * dir.1.as_tensor()).unwrap().sum_all().unwrap())
                        .unwrap()
                    };
                    let vars = [&p, &b, &res, &g, &be];
                    // Fused.
                    let (y, n) = reduce_bias_residual_norm(
                        p.as_tensor(),
                        b.as_tensor(),
                        res.as_tensor(),
                        (g.as_tensor(), be.as_tensor()),
                        Some(&d),
                        &tp,
                    )
                    .unwrap();
                    let fused = loss(&y, &n).backward().unwrap();
                    // Separate: the epilogue, then candle's layer norm.
                    let y2 = reduce_bias_residual(
                        p.as_tensor(),
                        b.as_tensor(),
                        res.as_tensor(),
                        Some(&d),
                        &tp,
                    )
                    .unwrap();
                    let mean = y2.mean_keepdim(1).unwrap();
                    let c = y2.broadcast_sub(&mean).unwrap();
                    let inv = c
                        .sqr()
                        .unwrap()
                        .mean_keepdim(1)
                        .unwrap()
                        .affine(1.0, NORM_EPS)
                        .unwrap()
                        .sqrt()
                        .unwrap()
                        .recip()
                        .unwrap();
                    let n2 = c
                        .broadcast_mul(&inv)
                        .unwrap()
                        .broadcast_mul(g.as_tensor())
                        .unwrap()
                        .broadcast_add(be.as_tensor())
                        .unwrap();
                    let separate = loss(&y2, &n2).backward().unwrap();
                    let at = |w: &str| format!("{w}, rank {r} of {ranks}");
                    assert_eq!(bits(&y), bits(&y2), "{}", at("the residual stream"));
                    close(&n, &n2, &at("the norm"));
                    for (i, v) in vars.iter().enumerate() {
                        close(
                            fused.get(v.as_tensor()).unwrap(),
                            separate.get(v.as_tensor()).unwrap(),
                            &at(&format!("the gradient of input {i}")),
                        );
                    }
                });
            }
        });
    }
}
