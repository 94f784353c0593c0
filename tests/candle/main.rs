//! The candle trainer (feature `candle`): every optimizer's step is bitwise the reference
//! interpreter running the same program on the same gradients, every replica gets the
//! same weights, bf16 replicas train on f32 master weights, and bad replicas, gradients
//! or programs are clear errors that leave the weights alone.
#![cfg(feature = "candle")]

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use coconet::candle::{
    AdamWConfig, DataParallel, Optimizer, OptimizerProgram, SgdConfig, TrainError,
};
use coconet::prelude::*;
use coconet::runtime::tune::{ProcessKnobs, TuneOptions};

use coconet_test_support::loopback;

mod tensor_parallel;

mod tp_gpt;

fn var(values: &[f32], shape: &[usize]) -> Var {
    Var::from_tensor(&Tensor::from_slice(values, shape, &Device::Cpu).unwrap()).unwrap()
}

fn values(v: &Var) -> Vec<f32> {
    v.as_tensor()
        .flatten_all()
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap()
}

const SHAPES: [&[usize]; 2] = [&[3, 4], &[5]];

fn init(i: usize) -> Vec<f32> {
    let n: usize = SHAPES[i].iter().product();
    (0..n)
        .map(|k| ((k * 7 + i * 3) % 11) as f32 / 10.0 - 0.5)
        .collect()
}

fn replicas(ranks: usize, dtype: DType) -> Vec<Vec<Var>> {
    (0..ranks)
        .map(|_| {
            (0..2)
                .map(|i| {
                    let t = Tensor::from_slice(&init(i), SHAPES[i], &Device::Cpu).unwrap();
                    Var::from_tensor(&t.to_dtype(dtype).unwrap()).unwrap()
                })
                .collect()
        })
        .collect()
}

/// Rank r's gradient of parameter i (made by backpropagating sum(w · c)).
fn coefficient(r: usize, i: usize, step: usize) -> Vec<f32> {
    let n: usize = SHAPES[i].iter().product();
    (0..n)
        .map(|k| ((k * 5 + r * 13 + i * 3 + step * 17) % 19) as f32 / 9.0 - 1.0)
        .collect()
}

fn grads(replica: &[Var], r: usize, step: usize, only: usize) -> GradStore {
    let dtype = replica[0].dtype();
    let mut loss = Tensor::zeros((), dtype, &Device::Cpu).unwrap();
    for (i, v) in replica.iter().enumerate().take(only) {
        let c = Tensor::from_slice(&coefficient(r, i, step), SHAPES[i], &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        loss = (loss + (v.as_tensor() * c).unwrap().sum_all().unwrap()).unwrap();
    }
    loss.backward().unwrap()
}

/// Trains `ranks` replicas for 5 steps with `optimizer` and checks every step against
/// the interpreter running the trainer's schedule on the same gradients (bitwise), and
/// the optimizer's program as written (within 1e-6: a clipping norm is summed in
/// another order once it is sharded).
fn bitwise_the_interpreter(ranks: usize, optimizer: Optimizer) {
    let reps = replicas(ranks, DType::F32);
    let mut trainer = DataParallel::new(reps.clone(), optimizer.clone()).unwrap();
    assert_eq!(trainer.schedule().name(), "fuse(RS-C-AG)");
    let scheduled = trainer.schedule().program().clone();
    let op = optimizer.to_program();
    let p = op.program();
    let mut w: Vec<f32> = (0..2).flat_map(init).collect();
    let n = w.len();
    let state: Vec<String> = p
        .inputs()
        .filter(|&id| p.node(id).op == coconet::core::Op::TensorInput)
        .map(|id| p.label(id))
        .filter(|name| name != "g" && name != "w")
        .collect();
    let mut held: Vec<Vec<f32>> = state.iter().map(|_| vec![0.0f32; n]).collect();
    for step in 0..5 {
        let stores: Vec<GradStore> = (0..ranks).map(|r| grads(&reps[r], r, step, 2)).collect();
        trainer.step(&stores).unwrap();
        let g: Vec<Vec<f32>> = (0..ranks)
            .map(|r| (0..2).flat_map(|i| coefficient(r, i, step)).collect())
            .collect();
        let mut args = Bindings::new()
            .dim("N", n)
            .tensor("g", Binding::per_rank(&g))
            .tensor("w", Binding::global(&w));
        for (name, value) in state.iter().zip(&held) {
            args = args.tensor(name, Binding::global(value));
        }
        for (name, value) in op.scalars() {
            let dtype = p.node(p.find(name).unwrap()).ty.dtype;
            args = args.scalar_as(name, dtype, *value);
        }
        if p.find("step").is_some() {
            args = args.scalar("step", step as i32 + 1);
        }
        let written: Vec<f32> = interpret(p, ranks, &args)
            .unwrap()
            .final_input("w")
            .unwrap();
        let want = interpret(&scheduled, ranks, &args).unwrap();
        w = want.final_input("w").unwrap();
        for (a, b) in written.iter().zip(&w) {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
        }
        for (name, value) in state.iter().zip(&mut held) {
            *value = want.final_input(name).unwrap();
        }
        for (r, replica) in reps.iter().enumerate() {
            let got: Vec<f32> = replica.iter().flat_map(values).collect();
            let bits = |x: &[f32]| x.iter().map(|y| y.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&w),
                "{} step {step}, replica {r}",
                p.name()
            );
        }
    }
    assert_eq!(trainer.steps(), 5);
    // Each rank holds 1/P of the optimizer state.
    assert!(trainer.state_bytes_per_rank() <= state.len() * 4 * n.div_ceil(ranks));
}

#[test]
fn adamw_steps_are_bitwise_the_interpreter_and_replicas_agree() {
    let config = AdamWConfig {
        lr: 0.01,
        ..AdamWConfig::default()
    };
    bitwise_the_interpreter(3, config.into());
    // Clipped to a norm below the gradients' (they are around 2), so clipping acts.
    let clipped = AdamWConfig {
        max_grad_norm: Some(0.5),
        ..config
    };
    bitwise_the_interpreter(2, clipped.into());
}

#[test]
fn sgd_steps_are_bitwise_the_interpreter() {
    // candle's SGD (no momentum), then torch's with momentum.
    bitwise_the_interpreter(3, SgdConfig::default().into());
    let momentum = SgdConfig {
        momentum: 0.9,
        ..SgdConfig::default()
    };
    bitwise_the_interpreter(2, momentum.into());
    let nesterov = SgdConfig {
        momentum: 0.9,
        nesterov: true,
        weight_decay: 0.01,
        max_grad_norm: Some(0.5),
        ..SgdConfig::default()
    };
    bitwise_the_interpreter(4, nesterov.into());
}

/// Hyper-parameters no step should run with are refused when the trainer is made (and a
/// learning rate set later), naming the optimizer and the value; defaults are candle's.
#[test]
fn bad_hyper_parameters_are_refused_and_defaults_are_candles() {
    let reps = replicas(2, DType::F32);
    let refused = |o: Optimizer, want: &str| {
        let e = DataParallel::new(reps.clone(), o)
            .err()
            .expect(want)
            .to_string();
        assert!(e.contains(want), "`{e}` should say `{want}`");
    };
    let adamw = AdamWConfig::default();
    refused(
        AdamWConfig {
            lr: f64::NAN,
            ..adamw
        }
        .into(),
        "AdamW: lr is NaN",
    );
    refused(
        AdamWConfig {
            eps: -1e-8,
            ..adamw
        }
        .into(),
        "AdamW: eps is -0.00000001",
    );
    refused(
        AdamWConfig {
            beta2: 1.0,
            ..adamw
        }
        .into(),
        "AdamW: beta2 is 1; it must be in [0, 1)",
    );
    refused(
        AdamWConfig {
            max_grad_norm: Some(0.0),
            ..adamw
        }
        .into(),
        "AdamW: max_grad_norm is 0",
    );
    let sgd = SgdConfig::default();
    assert_eq!(sgd.momentum, 0.0, "candle's SGD has no momentum");
    refused(
        SgdConfig {
            lr: f64::INFINITY,
            ..sgd
        }
        .into(),
        "SGD: lr is inf",
    );
    refused(
        SgdConfig {
            nesterov: true,
            ..sgd
        }
        .into(),
        "nesterov needs a momentum > 0",
    );
    let mut trainer = DataParallel::new(reps, adamw).unwrap();
    let e = trainer.set_learning_rate(f64::NAN).unwrap_err().to_string();
    assert!(e.contains("the learning rate is NaN"), "{e}");
    trainer.set_learning_rate(0.5).unwrap();
}

/// A user's optimizer: Adagrad, written as a `#[coconet]` program.
#[coconet]
fn adagrad(
    g: Tensor<f32, Local, [N]>,
    w: Tensor<f32, Replicated, [N]>,
    sum_sq: Tensor<f32, Replicated, [N]>,
    lr: f32,
    eps: f32,
) {
    let g1 = all_reduce(Avg, g);
    let s1 = update(sum_sq, sum_sq + g1 * g1);
    let w1 = update(w, w - lr * g1 / (sqrt(s1) + eps));
}

#[test]
fn a_users_program_runs_fused_and_bitwise() {
    let program = OptimizerProgram::new(adagrad().program().clone())
        .scalar("lr", 0.1)
        .scalar("eps", 1e-10);
    bitwise_the_interpreter(2, program.into());
}

#[test]
fn a_model_shared_by_every_rank_thread_steps_as_replicas_do() {
    let ranks = 3;
    let config = AdamWConfig {
        lr: 0.01,
        ..AdamWConfig::default()
    };
    let reps = replicas(ranks, DType::F32);
    let shared = replicas(1, DType::F32).remove(0);
    let mut apart = DataParallel::new(reps.clone(), config).unwrap();
    let mut together = DataParallel::shared(shared.clone(), ranks, config).unwrap();
    for step in 0..4 {
        apart
            .step(
                &(0..ranks)
                    .map(|r| grads(&reps[r], r, step, 2))
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        // Every rank's backward pass over the same Vars.
        together
            .step(
                &(0..ranks)
                    .map(|r| grads(&shared, r, step, 2))
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        for (a, b) in reps[0].iter().zip(&shared) {
            assert_eq!(values(a), values(b), "step {step}");
        }
    }
    let e = DataParallel::shared(shared, 0, config).err().unwrap();
    assert!(e.to_string().contains("no ranks"), "{e}");
}

/// One replica per process over TCP (`DataParallel::tcp`: each process binds only its own
/// gradient; here the processes are threads on loopback, as in the backend suite) steps
/// bitwise as the rank-thread trainer does, with 1/P of the optimizer state per process,
/// moving bytes in messages copied once and with the job's buffers in shared memory.
#[test]
fn processes_over_tcp_step_bitwise_as_rank_threads() {
    use coconet::runtime::cpu::DataPath;
    let ranks = 3;
    let adamw = AdamWConfig {
        lr: 0.01,
        max_grad_norm: Some(0.5),
        ..AdamWConfig::default()
    };
    for (optimizer, path) in [
        (Optimizer::from(adamw), DataPath::SingleCopy),
        (Optimizer::from(adamw), DataPath::SharedMemory),
        (
            Optimizer::from(SgdConfig::default()),
            DataPath::SharedMemory,
        ),
    ] {
        let reps = replicas(ranks, DType::F32);
        let mut threads = DataParallel::new(reps.clone(), optimizer.clone()).unwrap();
        let err = threads
            .tune(&ProcessKnobs::rounds(&[1, 4]), &TuneOptions::default())
            .unwrap_err();
        assert!(err.to_string().contains("rank threads"), "{err}");
        let mean = threads.mean_over_ranks(&[1.0, 2.0, 6.0]).unwrap();
        assert_eq!(mean, 3.0);
        assert!(threads.mean_over_ranks(&[1.0]).is_err());
        let mut want = Vec::new();
        for step in 0..4 {
            let all: Vec<_> = (0..ranks).map(|r| grads(&reps[r], r, step, 2)).collect();
            threads.step(&all).unwrap();
            want.push(
                reps.iter()
                    .map(|v| v.iter().flat_map(values).collect::<Vec<_>>())
                    .collect::<Vec<_>>(),
            );
        }
        let name = loopback::group_name();
        let got = loopback::per_process(ranks, |r| {
            let mine = replicas(1, DType::F32).remove(0);
            let tcp = loopback::connect_on(r, ranks, &name, path).unwrap();
            let mut trainer = DataParallel::tcp(mine.clone(), tcp, optimizer.clone()).unwrap();
            assert_eq!(trainer.shares_memory(), path == DataPath::SharedMemory);
            // Tuned first: the steps below must be those of an untuned trainer.
            let knobs = ProcessKnobs::grid(&[1, 4], &[256, 4096]);
            let options = TuneOptions {
                cache: None,
                warmup: 1,
                rounds: 2,
                ..TuneOptions::default()
            };
            let tuning = trainer.tune(&knobs, &options).unwrap();
            assert_eq!(tuning.table.len(), knobs.len(), "{tuning}");
            let n: usize = mine.iter().map(|v| v.elem_count()).sum();
            assert!(trainer.state_bytes_per_rank() <= 2 * 4 * n.div_ceil(ranks));
            // A loss for logging, averaged over the processes.
            let mean = trainer.mean_over_ranks(&[r as f64 + 0.5]).unwrap();
            assert_eq!(
                mean,
                (0..ranks).map(|q| q as f64 + 0.5).sum::<f64>() / ranks as f64
            );
            (0..4)
                .map(|step| {
                    trainer.step(&[grads(&mine, r, step, 2)]).unwrap();
                    mine.iter().flat_map(values).collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        });
        for step in 0..4 {
            for r in 0..ranks {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got[r][step]),
                    bits(&want[step][r]),
                    "rank {r}, step {step}, {path:?}"
                );
            }
        }
    }
}

#[test]
fn sgd_momentum_matches_torch_semantics() {
    // torch.optim.SGD(momentum=0.9, nesterov=False): buf = g at step 1, then
    // buf = 0.9 buf + g; w -= lr buf. One rank, one parameter, f64 arithmetic rounded
    // to f32 per op as the program does.
    let reps = vec![vec![var(&[1.0, -2.0], &[2])]];
    let config = SgdConfig {
        lr: 0.5,
        momentum: 0.9,
        ..SgdConfig::default()
    };
    let mut trainer = DataParallel::new(reps.clone(), config).unwrap();
    let (mut w, mut buf) = ([1.0f32, -2.0], [0.0f32; 2]);
    for step in 0..3 {
        let c = [0.25f32 * (step + 1) as f32, -0.75];
        let loss = (reps[0][0].as_tensor() * Tensor::from_slice(&c, 2, &Device::Cpu).unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
        trainer.step(&[loss.backward().unwrap()]).unwrap();
        for k in 0..2 {
            buf[k] = if step == 0 { c[k] } else { 0.9 * buf[k] + c[k] };
            w[k] -= 0.5 * buf[k];
        }
        assert_eq!(values(&reps[0][0]), w, "step {step}");
    }
}

#[test]
fn bf16_replicas_train_on_f32_master_weights() {
    let ranks = 2;
    let config = AdamWConfig {
        lr: 0.01,
        ..AdamWConfig::default()
    };
    let reps = replicas(ranks, DType::BF16);
    let mut trainer = DataParallel::new(reps.clone(), config).unwrap();
    // The f32 reference: the same bf16 gradients widened, the same initial weights
    // rounded to bf16 and widened.
    let f32_reps: Vec<Vec<Var>> = (0..ranks)
        .map(|r| reps[r].iter().map(|v| var(&values(v), v.dims())).collect())
        .collect();
    let mut master = DataParallel::new(f32_reps.clone(), config).unwrap();
    for step in 0..4 {
        let stores: Vec<GradStore> = (0..ranks).map(|r| grads(&reps[r], r, step, 2)).collect();
        trainer.step(&stores).unwrap();
        // The bf16 gradients, widened, into the f32 trainer.
        let widened: Vec<GradStore> = (0..ranks)
            .map(|r| {
                let mut s = grads(&f32_reps[r], r, step, 2);
                for (i, v) in reps[r].iter().enumerate() {
                    let g = stores[r].get(v.as_tensor()).unwrap();
                    s.insert(f32_reps[r][i].as_tensor(), g.to_dtype(DType::F32).unwrap());
                }
                s
            })
            .collect();
        master.step(&widened).unwrap();
        for r in 0..ranks {
            for (v, m) in reps[r].iter().zip(&f32_reps[r]) {
                assert_eq!(v.dtype(), DType::BF16);
                let rounded: Vec<f32> = values(m)
                    .iter()
                    .map(|&x| bf16::from_f32(x).to_f32())
                    .collect();
                assert_eq!(values(v), rounded, "step {step}, replica {r}");
            }
        }
    }
    // Steps smaller than bf16 resolves (lr 1e-4 against a spacing of 2^-8 near 0.5):
    // bf16 weights updated alone would round back to themselves every step; the f32
    // masters accumulate 40 steps until the rounded weights move.
    let small = AdamWConfig {
        lr: 1e-4,
        ..AdamWConfig::default()
    };
    let reps = replicas(1, DType::BF16);
    let before = values(&reps[0][0]);
    let mut trainer = DataParallel::new(reps.clone(), small).unwrap();
    for step in 0..40 {
        trainer.step(&[grads(&reps[0], 0, step, 2)]).unwrap();
    }
    assert_ne!(
        values(&reps[0][0]),
        before,
        "f32 masters accumulate small updates"
    );
}

#[test]
fn bad_replicas_gradients_and_programs_are_clear_errors_that_change_nothing() {
    let mismatch = |e: TrainError| match e {
        TrainError::Mismatch(m) => m,
        other => panic!("expected a mismatch, got {other}"),
    };
    let adamw = AdamWConfig::default;
    let mut reps = replicas(2, DType::F32);
    reps[1][0] = var(&[0.0; 12], &[3, 4]);
    let e = mismatch(DataParallel::new(reps, adamw()).err().unwrap());
    assert!(e.contains("parameter 0 of replica 1 differs"), "{e}");
    let mut reps = replicas(2, DType::F32);
    reps[1][1] = var(&init(1)[..4], &[4]);
    let e = mismatch(DataParallel::new(reps, adamw()).err().unwrap());
    assert!(e.contains("parameter 1 of replica 1"), "{e}");
    let f64_var = Var::from_tensor(&Tensor::zeros(3, DType::F64, &Device::Cpu).unwrap()).unwrap();
    let e = mismatch(
        DataParallel::new(vec![vec![f64_var]], adamw())
            .err()
            .unwrap(),
    );
    assert!(e.contains("F64"), "{e}");

    // Programs that break the contract.
    let e = mismatch(
        DataParallel::new(
            replicas(1, DType::F32),
            OptimizerProgram::new(adagrad().program().clone()).scalar("lr", 0.1),
        )
        .err()
        .unwrap(),
    );
    assert!(e.contains("no value given for scalar `eps`"), "{e}");
    let e = mismatch(
        DataParallel::new(
            replicas(1, DType::F32),
            OptimizerProgram::new(adagrad().program().clone())
                .scalar("lr", 0.1)
                .scalar("eps", 0.1)
                .scalar("momentum", 0.9),
        )
        .err()
        .unwrap(),
    );
    assert!(
        e.contains("`momentum`, which is not one of its scalar inputs"),
        "{e}"
    );
    let e = mismatch(
        DataParallel::new(
            replicas(1, DType::F32),
            OptimizerProgram::new(local_weights().program().clone()),
        )
        .err()
        .unwrap(),
    );
    assert!(e.contains("`w` is F32 Local"), "{e}");

    let reps = replicas(2, DType::F32);
    let mut trainer = DataParallel::new(reps.clone(), adamw()).unwrap();
    // CUDA graphs are for trainers on GPUs.
    let e = mismatch(trainer.use_cuda_graph(true).unwrap_err());
    assert!(e.contains("only trainers on GPUs"), "{e}");
    let before: Vec<Vec<f32>> = reps.iter().flat_map(|r| r.iter().map(values)).collect();
    let unchanged = || {
        let now: Vec<Vec<f32>> = reps.iter().flat_map(|r| r.iter().map(values)).collect();
        assert_eq!(now, before);
    };
    // A gradient missing for one rank.
    let stores = vec![grads(&reps[0], 0, 0, 2), grads(&reps[1], 1, 0, 1)];
    let e = mismatch(trainer.step(&stores).unwrap_err());
    assert!(
        e.contains("no gradient for parameter 1 of replica 1"),
        "{e}"
    );
    unchanged();
    // One store for two replicas.
    let e = mismatch(trainer.step(&stores[..1]).unwrap_err());
    assert!(e.contains("1 gradient stores for 2 ranks"), "{e}");
    unchanged();
    // A gradient of the wrong dtype.
    let mut wrong = grads(&reps[1], 1, 0, 2);
    wrong.insert(
        reps[1][0].as_tensor(),
        Tensor::zeros((3, 4), DType::F64, &Device::Cpu).unwrap(),
    );
    let e = mismatch(
        trainer
            .step(&[grads(&reps[0], 0, 0, 2), wrong])
            .unwrap_err(),
    );
    assert!(e.contains("parameter 0 of replica 1 is F64"), "{e}");
    unchanged();
    // A gradient whose shape is not its parameter's (a model rebuilt with another
    // shape between steps).
    let mut reshaped = grads(&reps[1], 1, 0, 2);
    reshaped.insert(
        reps[1][1].as_tensor(),
        Tensor::zeros(6, DType::F32, &Device::Cpu).unwrap(),
    );
    let e = mismatch(
        trainer
            .step(&[grads(&reps[0], 0, 0, 2), reshaped])
            .unwrap_err(),
    );
    assert!(
        e.contains("parameter 1 of replica 1 is F32 [6]") && e.contains("did its shape change"),
        "{e}"
    );
    unchanged();
    // An unknown scalar.
    let e = mismatch(trainer.set_scalar("momentum", 0.5).unwrap_err());
    assert!(e.contains("no scalar `momentum`"), "{e}");
    // The trainer still works after refusing a step.
    let stores = vec![grads(&reps[0], 0, 0, 2), grads(&reps[1], 1, 0, 2)];
    trainer.set_learning_rate(0.002).unwrap();
    trainer.step(&stores).unwrap();
    assert_eq!(trainer.steps(), 1);
}

/// Breaks the contract: the weights are Local.
#[coconet]
fn local_weights(g: Tensor<f32, Local, [N]>, w: Tensor<f32, Local, [N]>) {
    let w1 = update(w, w - all_reduce(Sum, g));
}

/// Takes `steps` steps of `trainer` from step `from` on, every replica's gradients.
fn train_steps(trainer: &mut DataParallel, reps: &[Vec<Var>], from: usize, steps: usize) {
    for step in from..from + steps {
        let gs: Vec<GradStore> = reps
            .iter()
            .enumerate()
            .map(|(r, rep)| grads(rep, r, step, 2))
            .collect();
        trainer.step(&gs).unwrap();
    }
}

#[test]
fn a_trainer_restored_from_its_state_continues_bitwise_as_if_never_stopped() {
    for (ranks, dtype, optimizer) in [
        (3, DType::F32, Optimizer::from(AdamWConfig::default())),
        (2, DType::BF16, Optimizer::from(AdamWConfig::default())),
        (
            2,
            DType::F32,
            Optimizer::from(SgdConfig {
                momentum: 0.9,
                ..SgdConfig::default()
            }),
        ),
    ] {
        let reps = replicas(ranks, dtype);
        let mut straight = DataParallel::new(reps.clone(), optimizer.clone()).unwrap();
        train_steps(&mut straight, &reps, 0, 7);
        let expected: Vec<Vec<f32>> = reps[0].iter().map(values).collect();
        let expected_state = straight.state().unwrap();

        let first = replicas(ranks, dtype);
        let mut stopped = DataParallel::new(first.clone(), optimizer.clone()).unwrap();
        train_steps(&mut stopped, &first, 0, 3);
        let saved = stopped.state().unwrap();
        assert_eq!(saved.steps, 3);
        assert!(saved.tensors.iter().all(|t| !t.data.is_empty()));
        drop(stopped);

        // A new process's worth: fresh replicas from the initial weights, then the state.
        let fresh = replicas(ranks, dtype);
        let mut resumed = DataParallel::new(fresh.clone(), optimizer.clone()).unwrap();
        resumed.load_state(&saved).unwrap();
        assert_eq!(
            fresh[1].iter().map(values).collect::<Vec<_>>(),
            first[0].iter().map(values).collect::<Vec<_>>()
        );
        train_steps(&mut resumed, &fresh, 3, 4);
        for rep in &fresh {
            assert_eq!(
                rep.iter().map(values).collect::<Vec<_>>(),
                expected,
                "{ranks} ranks, {dtype:?}"
            );
        }
        assert_eq!(resumed.state().unwrap(), expected_state);
    }
}

#[test]
fn a_state_that_does_not_fit_is_an_error_and_changes_nothing() {
    let reps = replicas(2, DType::F32);
    let mut trainer = DataParallel::new(reps.clone(), AdamWConfig::default()).unwrap();
    train_steps(&mut trainer, &reps, 0, 2);
    let state = trainer.state().unwrap();
    let before = trainer.state().unwrap();

    let other_ranks = replicas(3, DType::F32);
    let mut three = DataParallel::new(other_ranks, AdamWConfig::default()).unwrap();
    let e = three.load_state(&state).unwrap_err().to_string();
    assert!(e.contains("another rank count"), "{e}");

    let mut sgd_state = state.clone();
    sgd_state.tensors.truncate(1);
    let e = trainer.load_state(&sgd_state).unwrap_err().to_string();
    assert!(e.contains("another optimizer"), "{e}");
    let mut short = state.clone();
    short.weights[1].pop();
    let e = trainer.load_state(&short).unwrap_err().to_string();
    assert!(
        e.contains("parameter 1 has 4 elements, the model's 5"),
        "{e}"
    );
    assert_eq!(
        trainer.state().unwrap(),
        before,
        "a refused state changes nothing"
    );
}

/// A candle-nn model's `VarMap`, replicated: replica 0 is the original map, so after
/// training it holds the trained weights (bitwise every replica's); each rank's forward
/// and backward pass runs on its own thread through `backward_step`, on its shard.
#[test]
fn varmap_replicas_train_and_the_original_map_holds_the_weights() {
    use candle_nn::{Module, VarBuilder, VarMap};
    use coconet::candle::{named_vars, replicate, shard};
    let original = VarMap::new();
    let build = |map: &VarMap| {
        let vb = VarBuilder::from_varmap(map, DType::F32, &Device::Cpu);
        candle_nn::linear(4, 2, vb.pp("layer")).unwrap()
    };
    let _ = build(&original);
    let before: Vec<Vec<f32>> = named_vars(&original)
        .iter()
        .map(|(_, v)| values(v))
        .collect();
    let ranks = 3;
    let maps = replicate(&original, ranks).unwrap();
    let models: Vec<_> = maps.iter().map(build).collect();
    let mut trainer = DataParallel::from_varmaps(&maps, AdamWConfig::default()).unwrap();
    let xs: Vec<f32> = (0..40).map(|k| (k % 7) as f32 / 7.0 - 0.4).collect();
    let batch = Tensor::from_slice(&xs, (10, 4), &Device::Cpu).unwrap();
    let mut covered = 0;
    for _ in 0..3 {
        let losses: Vec<Tensor> = (0..ranks)
            .map(|r| {
                let rows = shard(10, r, ranks);
                covered += rows.len();
                let x = batch.narrow(0, rows.start, rows.len()).unwrap();
                models[r]
                    .forward(&x)
                    .unwrap()
                    .sqr()
                    .unwrap()
                    .mean_all()
                    .unwrap()
            })
            .collect();
        trainer.backward_step(&losses).unwrap();
    }
    assert_eq!(covered, 30, "every sample in exactly one shard");
    let after: Vec<Vec<f32>> = named_vars(&original)
        .iter()
        .map(|(_, v)| values(v))
        .collect();
    assert_ne!(after, before, "the original map holds trained weights");
    for map in &maps[1..] {
        let other: Vec<Vec<f32>> = named_vars(map).iter().map(|(_, v)| values(v)).collect();
        let bits =
            |x: &Vec<Vec<f32>>| -> Vec<u32> { x.iter().flatten().map(|y| y.to_bits()).collect() };
        assert_eq!(
            bits(&other),
            bits(&after),
            "replicas agree with the original map"
        );
    }
}

/// A parameter without a gradient is named in the error; allowed, it counts as a zero
/// gradient (AdamW then only decays it) on every replica.
#[test]
fn a_parameter_without_a_gradient_is_named_or_counted_as_zero() {
    use candle_nn::VarMap;
    use coconet::candle::{named_vars, replicate};
    let original = VarMap::new();
    {
        let mut data = original.data().lock().unwrap();
        data.insert("used.w".into(), var(&[0.5, -0.25], &[2]));
        data.insert("unused.w".into(), var(&[1.0, 2.0], &[2]));
    }
    let maps = replicate(&original, 2).unwrap();
    let used = |m: &VarMap| {
        named_vars(m)
            .into_iter()
            .find(|(n, _)| n == "used.w")
            .unwrap()
            .1
    };
    let losses = || -> Vec<Tensor> {
        maps.iter()
            .map(|m| used(m).as_tensor().sqr().unwrap().sum_all().unwrap())
            .collect()
    };
    let config = AdamWConfig::default();
    let mut trainer = DataParallel::from_varmaps(&maps, config).unwrap();
    let e = trainer.backward_step(&losses()).unwrap_err().to_string();
    assert!(e.contains("no gradient for `unused.w` of replica 0"), "{e}");
    trainer.allow_missing_gradients(true);
    trainer.backward_step(&losses()).unwrap();
    let decayed = |x: f32| x * (1.0 - config.lr as f32 * config.weight_decay as f32);
    for m in &maps {
        let unused = named_vars(m)
            .into_iter()
            .find(|(n, _)| n == "unused.w")
            .unwrap()
            .1;
        assert_eq!(values(&unused), vec![decayed(1.0), decayed(2.0)]);
    }
}
