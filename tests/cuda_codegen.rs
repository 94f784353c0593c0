//! The CUDA backend without a GPU: the generated source of every example's schedules
//! (insta snapshots, so a change to generated code is reviewed), NVRTC accepting every
//! translation unit (when libnvrtc is present; CI installs it from the
//! `nvidia-cuda-nvrtc-cu12` wheel and sets `COCONET_REQUIRE_NVRTC=1`), and the error a
//! user gets when no driver is present. Values are checked by `backend_cuda_emulated`.

use coconet_example_programs::{
    adam as adam_program, data, lamb as lamb_program, megatron as megatron_program,
    pipeline as pipeline_program, sgd as sgd_program,
};

use coconet::core::schedule::{Schedule, candidates};
use coconet::prelude::*;
use coconet::runtime::Plan;
use coconet::runtime::cuda::CudaProgram;

/// Every example with its schedules and small dims for `ranks` ranks.
fn examples(ranks: usize) -> Vec<(&'static str, Vec<Schedule>, Bindings)> {
    let grads = |n: usize| -> Vec<Vec<f32>> {
        (0..ranks)
            .map(|r| data::uniform_f32(40 + r as u64, n))
            .collect()
    };
    let n = 10;
    let sgd = sgd_program::sgd();
    let adam = adam_program::adam();
    let lamb = lamb_program::lamb();
    let megatron = megatron_program::megatron();
    let pipeline = pipeline_program::pipeline();
    let mut adam_schedules = candidates(adam.program(), &[adam.m.id(), adam.v.id()]);
    adam_schedules.push(adam.by_steps());
    let adam_hp = adam_program::AdamParams {
        lr: 1e-2,
        step: 3,
        ..Default::default()
    };
    let lamb_hp = lamb_program::LambParams {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-6,
        weight_decay: 0.01,
        step: 2,
    };
    let w = data::uniform_f32(1, n);
    vec![
        (
            "sgd",
            candidates(sgd.program(), &[]),
            sgd_program::sgd::Args {
                N: n,
                g: TensorArg::PerRank(grads(n)),
                w: TensorArg::Global(w.clone()),
                lr: 0.1,
            }
            .into(),
        ),
        (
            "adam",
            adam_schedules,
            adam_program::adam_args(&grads(n), &w, &w, &w, adam_hp).into(),
        ),
        (
            "lamb",
            candidates(lamb.program(), &[lamb.m.id(), lamb.v.id()]),
            lamb_program::lamb_args(&grads(n), &w, &w, &w, lamb_hp).into(),
        ),
        (
            "megatron",
            candidates(megatron.program(), &[]),
            megatron_program::megatron_args(2, 2, 4, 1).into(),
        ),
        (
            "pipeline",
            candidates(pipeline.program(), &[]),
            pipeline_program::pipeline::Args {
                B: 2,
                H: 4,
                x: TensorArg::PerRank(
                    (0..ranks / 2)
                        .map(|r| data::uniform_f32(r as u64, 8))
                        .collect(),
                ),
                b: TensorArg::Global(data::uniform_f32(1, 4)),
                r: TensorArg::Global(data::uniform_f32(2, 8)),
                seed: 5,
            }
            .into(),
        ),
    ]
}

/// Every example × schedule on `ranks` ranks, generated.
fn generated(ranks: usize) -> Vec<(String, Plan, CudaProgram)> {
    let mut out = vec![];
    for (name, schedules, args) in examples(ranks) {
        for s in schedules {
            let plan = Plan::lower(&s, ranks, args.dims()).unwrap();
            let program = CudaProgram::generate(&plan)
                .unwrap_or_else(|e| panic!("{name} / {}: {e}", s.name()));
            out.push((format!("{name}__{}", s.name()), plan, program));
        }
    }
    out
}

#[test]
fn generated_source_snapshots() {
    for (name, plan, program) in generated(2) {
        let name: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        insta::assert_snapshot!(
            name,
            format!("{}\n{}", program.describe(&plan), program.kernels_source())
        );
    }
}

#[test]
fn fused_adam_is_one_vectorised_kernel_over_peer_pointers() {
    let p = adam_program::adam();
    let s = p.by_steps();
    let args: Bindings = adam_program::adam_args(
        &[vec![1.0; 64], vec![2.0; 64], vec![3.0; 64], vec![4.0; 64]],
        &[0.5; 64],
        &[0.0; 64],
        &[0.0; 64],
        adam_program::AdamParams {
            step: 1,
            ..Default::default()
        },
    )
    .into();
    let plan = Plan::lower(&s, 4, args.dims()).unwrap();
    let program = CudaProgram::generate(&plan).unwrap();
    let fused: Vec<_> = program
        .kernels
        .iter()
        .filter(|k| k.name.contains("fused") && !k.source.is_empty())
        .collect();
    assert_eq!(fused.len(), 1, "{}", program.kernels_source());
    // With a segmented twin for parameter lists lent as pieces.
    assert!(fused[0].segments.is_some());
    let src = &fused[0].source;
    // Four peers reduced in rank order, float4 loads, results written to every peer.
    assert!(src.contains("float4"), "{src}");
    assert!(src.contains("[3][i0]"), "{src}");
}

/// NVRTC accepts every generated translation unit (P = 2, 4, 6: blocks of 10 elements
/// uneven) for sm_80 and sm_90.
#[cfg(feature = "cuda")]
#[test]
fn nvrtc_compiles_every_generated_program() {
    if !coconet::runtime::cuda::nvrtc_present() {
        assert!(
            std::env::var_os("COCONET_REQUIRE_NVRTC").is_none(),
            "COCONET_REQUIRE_NVRTC is set but libnvrtc.so could not be loaded"
        );
        eprintln!("skipped: libnvrtc.so is not present");
        return;
    }
    let mut seen = std::collections::HashSet::new();
    for ranks in [2, 4, 6] {
        for (name, _, program) in generated(ranks) {
            let source = program.source();
            if !seen.insert(source.clone()) {
                continue;
            }
            // PTX for A100 (the text, for inspection); a CUBIN for H100 — what a GPU
            // loads: machine code for its architecture (an ELF image naming every
            // kernel), not PTX the driver would have to JIT. One compile per program and
            // architecture keeps CI's time.
            let ptx = coconet::runtime::cuda::compile(&source, "sm_80")
                .unwrap_or_else(|e| panic!("{name} on {ranks} ranks, sm_80: {e}"));
            for k in &program.kernels {
                assert!(ptx.contains(&k.name), "{name}: {} missing from PTX", k.name);
            }
            let cubin = coconet::runtime::cuda::compile_cubin(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{name} on {ranks} ranks, sm_90: {e}"));
            assert_eq!(&cubin[..4], b"\x7fELF", "{name}: not a CUBIN");
            for k in &program.kernels {
                let named = cubin.windows(k.name.len()).any(|w| w == k.name.as_bytes());
                assert!(named, "{name}: {} missing from the CUBIN", k.name);
            }
        }
    }
}

#[test]
fn no_driver_is_a_clear_error() {
    use coconet::runtime::cuda::Cuda;
    #[cfg(feature = "cuda")]
    {
        if coconet::runtime::cuda::driver_present() {
            eprintln!("skipped: a CUDA driver is present");
            return;
        }
        let e = Cuda::new(0).unwrap_err().to_string();
        assert!(e.contains("no CUDA driver"), "{e}");
        // The multi-process backend says so too, before any rendezvous.
        use coconet::runtime::launch::{JobSecret, LaunchEnv, StoreServer};
        let secret = JobSecret::generate().unwrap();
        let server = StoreServer::bind("127.0.0.1:0", secret.clone()).unwrap();
        let env = LaunchEnv {
            launcher: coconet::runtime::launch::Launcher::Coconet,
            rank: 1,
            world_size: 2,
            local_rank: 0,
            local_world_size: Some(2),
            master_addr: server.local_addr().ip().to_string(),
            master_port: server.local_addr().port(),
            timeout: std::time::Duration::from_secs(5),
            secret,
        };
        let store = env.connect().unwrap();
        let e = coconet::runtime::cuda::Distributed::join(store, &env)
            .err()
            .expect("no driver")
            .to_string();
        assert!(e.contains("no CUDA driver"), "{e}");
        server.shutdown();
        // And the backend of several GPUs in one process.
        let e = coconet::runtime::cuda::MultiGpu::new(&[0, 1])
            .err()
            .expect("no driver")
            .to_string();
        assert!(e.contains("no CUDA driver"), "{e}");
    }
    #[cfg(not(feature = "cuda"))]
    {
        let e = Cuda::new(0).unwrap_err().to_string();
        assert!(e.contains("without the `cuda` feature"), "{e}");
    }
}

/// Bindings for other dims than the plan was lowered for are refused before anything is
/// allocated (kernels sized for the plan would read and write out of bounds).
#[test]
fn bindings_with_other_dims_are_refused() {
    let p = sgd_program::sgd();
    let s = Schedule::new(p.program());
    let args = |n: usize| -> Bindings {
        sgd_program::sgd::Args {
            N: n,
            g: TensorArg::PerRank(vec![vec![1.0; n]; 2]),
            w: TensorArg::Global(vec![0.5; n]),
            lr: 0.1,
        }
        .into()
    };
    let plan = Plan::lower(&s, 2, args(4).dims()).unwrap();
    let e = coconet::runtime::cuda::EmulatedCuda
        .prepare(&plan, &args(8))
        .err()
        .expect("other dims must be refused")
        .to_string();
    assert!(e.contains("lowered for dims"), "{e}");
}
