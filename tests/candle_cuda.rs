//! The candle trainer on candle's CUDA device (feature `candle-cuda`; needs a GPU to run):
//! replicas' `Var`s in GPU memory stepped in place, bitwise the same trainer on the CPU
//! given the same gradients, every replica equal; a checkpoint taken there resumes
//! bitwise; one process per GPU (`DataParallel::distributed`, one process here) steps as
//! the one-GPU trainer. Build with the CUDA toolkit of
//! `scripts/gpu/setup-cuda13.sh` (see `scripts/gpu/candle-cuda.md`).
#![cfg(feature = "candle-cuda")]

use candle_core::{DType, Device, Tensor, Var};
use coconet::candle::{AdamWConfig, DataParallel};
use coconet::runtime::cuda::{Distributed, PeerAccess};

const SHAPES: [&[usize]; 3] = [&[64, 33], &[33], &[1000]];

fn init(i: usize) -> Vec<f32> {
    let n: usize = SHAPES[i].iter().product();
    (0..n)
        .map(|k| ((k * 7 + i * 3) % 11) as f32 / 10.0 - 0.5)
        .collect()
}

fn replicas(ranks: usize, device: &Device) -> Vec<Vec<Var>> {
    replicas_of(ranks, device, DType::F32)
}

fn replicas_of(ranks: usize, device: &Device, dtype: DType) -> Vec<Vec<Var>> {
    (0..ranks)
        .map(|_| {
            (0..SHAPES.len())
                .map(|i| {
                    let t = Tensor::from_slice(&init(i), SHAPES[i], device).unwrap();
                    Var::from_tensor(&t.to_dtype(dtype).unwrap()).unwrap()
                })
                .collect()
        })
        .collect()
}

/// sum(w · c) per parameter: its gradient is exactly `c` on any device.
fn losses(reps: &[Vec<Var>], step: usize) -> Vec<Tensor> {
    reps.iter()
        .enumerate()
        .map(|(r, replica)| {
            let (device, dtype) = (replica[0].device(), replica[0].dtype());
            let mut loss = Tensor::zeros((), dtype, device).unwrap();
            for (i, v) in replica.iter().enumerate() {
                let n: usize = SHAPES[i].iter().product();
                let c: Vec<f32> = (0..n)
                    .map(|k| ((k * 5 + r * 13 + i * 3 + step * 17) % 19) as f32 / 9.0 - 1.0)
                    .collect();
                let c = Tensor::from_slice(&c, SHAPES[i], device)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                loss = (loss + (v.as_tensor() * c).unwrap().sum_all().unwrap()).unwrap();
            }
            loss
        })
        .collect()
}

fn bits(v: &Var) -> Vec<u32> {
    v.as_tensor()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// Every replica's every parameter of `a` bitwise `b`'s (`what` names the case).
fn assert_same(a: &[Vec<Var>], b: &[Vec<Var>], what: &str) {
    for (r, (x, y)) in a.iter().zip(b).enumerate() {
        for (i, (v, w)) in x.iter().zip(y).enumerate() {
            assert_eq!(bits(v), bits(w), "{what}, replica {r}, parameter {i}");
        }
    }
}

fn config() -> AdamWConfig {
    AdamWConfig {
        lr: 1e-2,
        ..Default::default()
    }
}

/// Launched one by one and replayed as a CUDA graph (`use_cuda_graph`).
#[test]
fn replicas_on_a_gpu_step_in_place_bitwise_the_cpu_trainer() {
    let gpu = Device::new_cuda(0).expect("a CUDA GPU");
    for (ranks, graph) in [(1, false), (2, false), (1, true), (2, true)] {
        let config = config();
        let (on_gpu, on_cpu) = (replicas(ranks, &gpu), replicas(ranks, &Device::Cpu));
        let mut a = DataParallel::new(on_gpu.clone(), config).unwrap();
        a.use_cuda_graph(graph).unwrap();
        let mut b = DataParallel::new(on_cpu.clone(), config).unwrap();
        for step in 0..5 {
            a.backward_step(&losses(&on_gpu, step)).unwrap();
            b.backward_step(&losses(&on_cpu, step)).unwrap();
            assert_same(
                &on_gpu,
                &on_cpu,
                &format!("P={ranks}, graph {graph}, step {step}"),
            );
        }
    }
}

/// A checkpoint taken on the GPU (`state`: the Vars as master weights, the optimizer
/// state downloaded rank by rank) and loaded into a fresh trainer continues bitwise as
/// the uninterrupted one.
#[test]
fn a_checkpoint_on_a_gpu_resumes_bitwise() {
    let gpu = Device::new_cuda(0).expect("a CUDA GPU");
    let config = config();
    for ranks in [1, 2] {
        let (whole, resumed) = (replicas(ranks, &gpu), replicas(ranks, &gpu));
        let mut a = DataParallel::new(whole.clone(), config).unwrap();
        for step in 0..3 {
            a.backward_step(&losses(&whole, step)).unwrap();
        }
        let state = a.state().unwrap();
        assert_eq!(state.steps, 3);
        let mut b = DataParallel::new(resumed.clone(), config).unwrap();
        b.load_state(&state).unwrap();
        assert_eq!(b.state().unwrap(), state, "P={ranks}: the state loaded");
        for step in 3..6 {
            a.backward_step(&losses(&whole, step)).unwrap();
            b.backward_step(&losses(&resumed, step)).unwrap();
        }
        assert_same(&whole, &resumed, &format!("P={ranks}"));
    }
}

/// This process as the one rank of a job of one process per GPU, its memory exchanged
/// through NCCL or mapped (CUDA IPC, no peer to map).
fn one_process(mapped: bool) -> Distributed {
    let mut d = Distributed::single_process().expect("a CUDA GPU with NCCL");
    if mapped {
        d.access = PeerAccess::Mapped;
    }
    d
}

/// `DataParallel::distributed` (one process per GPU; here the job's one process) steps
/// bitwise as the one-GPU trainer, exchanged and mapped; its state reads back, and the
/// mean over ranks is this rank's value. A model on the CPU is refused, naming the GPU.
#[test]
fn one_process_per_gpu_steps_as_the_one_gpu_trainer() {
    let gpu = Device::new_cuda(0).expect("a CUDA GPU");
    let config = config();
    for mapped in [false, true] {
        let (a_vars, b_vars) = (replicas(1, &gpu), replicas(1, &gpu));
        let mut a = DataParallel::new(a_vars.clone(), config).unwrap();
        let mut b =
            DataParallel::distributed(b_vars[0].clone(), one_process(mapped), config).unwrap();
        for step in 0..5 {
            a.backward_step(&losses(&a_vars, step)).unwrap();
            b.backward_step(&losses(&b_vars, step)).unwrap();
            assert_same(&a_vars, &b_vars, &format!("mapped {mapped}, step {step}"));
        }
        assert_eq!(a.state().unwrap(), b.state().unwrap(), "mapped {mapped}");
        assert_eq!(b.mean_over_ranks(&[2.5]).unwrap(), 2.5);
    }
    let on_cpu = replicas(1, &Device::Cpu).remove(0);
    let e = DataParallel::distributed(on_cpu, one_process(false), config)
        .err()
        .expect("a model on the CPU");
    assert!(e.to_string().contains("GPU 0"), "{e}");
}

/// bf16 replicas on a GPU train in mixed precision as on the CPU: f32 master weights
/// updated in place (here candle tensors on the GPU), the bf16 gradients widened and the
/// new weights rounded into the Vars; bitwise the CPU trainer, and a checkpoint holds the
/// f32 masters.
#[test]
fn bf16_replicas_on_a_gpu_train_as_on_the_cpu() {
    let gpu = Device::new_cuda(0).expect("a CUDA GPU");
    let config = config();
    for ranks in [1, 2] {
        let on_gpu = replicas_of(ranks, &gpu, DType::BF16);
        let on_cpu = replicas_of(ranks, &Device::Cpu, DType::BF16);
        let mut a = DataParallel::new(on_gpu.clone(), config).unwrap();
        let mut b = DataParallel::new(on_cpu.clone(), config).unwrap();
        for step in 0..5 {
            a.backward_step(&losses(&on_gpu, step)).unwrap();
            b.backward_step(&losses(&on_cpu, step)).unwrap();
            assert_same(&on_gpu, &on_cpu, &format!("P={ranks}, step {step}"));
        }
        assert_eq!(
            a.state().unwrap(),
            b.state().unwrap(),
            "P={ranks}: the state"
        );
    }
}
