//! The backend suite on a real GPU (cargo feature `cuda`): every example × schedule ×
//! P virtual ranks on GPU 0 against the reference interpreter. Build here, run on a GPU
//! machine (see DEVELOPERS.md):
//!
//! ```text
//! cargo test --release --features cuda --test backend_cuda --no-run
//! ```
#![cfg(feature = "cuda")]

coconet_backend_suite::backend_suite!(coconet::runtime::cuda::Cuda::new(0).expect("a CUDA GPU"));

/// Memory lent from cudarc slices on GPU 0 (what a framework's tensors are): a training
/// loop in the caller's memory, a parameter list as pieces, ordering through the
/// caller's stream and events, typed reads, and lent memory the GPU can tell is wrong.
mod lending {
    use coconet::prelude::*;
    use coconet::runtime::cuda::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
    use coconet::runtime::cuda::{Cuda, CudaJob, DeviceData, DeviceSlice, Lent, Memory};
    use coconet_example_programs::{adam as adam_program, data};
    use std::sync::Arc;

    const N: usize = 1 << 20;

    fn stream() -> Arc<CudaStream> {
        CudaContext::new(0).unwrap().new_stream().unwrap()
    }

    fn hp(it: usize) -> adam_program::AdamParams {
        adam_program::AdamParams {
            lr: 1e-2 / (1.0 + it as f64),
            step: it as i32 + 1,
            ..Default::default()
        }
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|y| y.to_bits()).collect()
    }

    fn prepare(s: &Schedule, ranks: usize, n: usize) -> CudaJob {
        let z = vec![0.0f32; n];
        let g = vec![z.clone(); ranks];
        let args: Bindings = adam_program::adam_args(&g, &z, &z, &z, hp(0)).into();
        let plan = Plan::lower(s, ranks, args.dims()).unwrap();
        Cuda::new(0).unwrap().prepare(&plan, &args).unwrap()
    }

    /// Ten Adam steps with w in cudarc slices (one per rank) and each step's gradients
    /// uploaded on the caller's stream just before the run: bitwise the interpreter,
    /// launched one by one and replayed as a CUDA graph.
    #[test]
    fn a_training_loop_on_cudarc_slices() {
        let p = adam_program::adam();
        let st = stream();
        for (ranks, graph) in [(1, false), (2, false), (1, true), (2, true)] {
            for s in candidates(p.program(), &[p.m.id(), p.v.id()]) {
                let what = format!("{} on {ranks} ranks, graph {graph}", s.name());
                let mut job = prepare(&s, ranks, N);
                job.use_graph(graph);
                let (mut w, mut m, mut v) =
                    (data::uniform_f32(1, N), vec![0.0f32; N], vec![0.0f32; N]);
                let mut weights: Vec<CudaSlice<f32>> =
                    (0..ranks).map(|_| st.clone_htod(&w).unwrap()).collect();
                for it in 0..10 {
                    let g: Vec<Vec<f32>> = (0..ranks)
                        .map(|r| data::uniform_f32(100 * it as u64 + r as u64, N))
                        .collect();
                    let mut grads: Vec<CudaSlice<f32>> =
                        g.iter().map(|x| st.clone_htod(x).unwrap()).collect();
                    job.set_scalar("step", hp(it).step).unwrap();
                    job.set_scalar("lr", hp(it).lr).unwrap();
                    let mut lent = Lent::new();
                    for (r, (wr, gr)) in weights.iter_mut().zip(grads.iter_mut()).enumerate() {
                        lent = lent.input("w", r, DeviceSlice::cuda(wr)).input(
                            "g",
                            r,
                            DeviceSlice::cuda(gr),
                        );
                    }
                    // Ordered after the uploads on `st`, and `st` after the run.
                    job.run_after(&lent, None)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    drop(lent);
                    let args: Bindings = adam_program::adam_args(&g, &w, &m, &v, hp(it)).into();
                    let want = interpret(s.program(), ranks, &args).unwrap();
                    let exp: Vec<f32> = want.final_input("w").unwrap();
                    for (r, wr) in weights.iter().enumerate() {
                        let got = st.clone_dtoh(wr).unwrap();
                        assert_eq!(bits(&got), bits(&exp), "{what}, step {it}: `w` on rank {r}");
                    }
                    let mid = job.plan().tensor_input("m").unwrap();
                    for r in 0..ranks {
                        let e: Vec<f32> = want.final_input_local("m", r).unwrap();
                        let mut got = vec![0.0f32; e.len()];
                        job.read(mid, r, &mut got).unwrap();
                        assert_eq!(bits(&got), bits(&e), "{what}, step {it}: `m` on rank {r}");
                        let mut dev: CudaSlice<f32> = st.alloc_zeros(e.len()).unwrap();
                        job.read_to(mid, r, &DeviceSlice::cuda(&mut dev)).unwrap();
                        let done = job.record().unwrap();
                        st.wait(&done).unwrap();
                        assert_eq!(
                            bits(&st.clone_dtoh(&dev).unwrap()),
                            bits(&e),
                            "{what}: read_to"
                        );
                    }
                    w = exp;
                    m = want.final_input("m").unwrap();
                    v = want.final_input("v").unwrap();
                }
                if graph {
                    let stats = job.graph_stats().unwrap();
                    assert_eq!((stats.builds, stats.replays), (1, 10), "{what}: {stats:?}");
                }
            }
        }
    }

    /// GPT-2-like parameter list (148 uneven tensors) lent as cudarc slices: stepped in
    /// place, bitwise the interpreter.
    #[test]
    fn a_parameter_list_of_cudarc_slices() {
        let p = adam_program::adam();
        let sizes: Vec<usize> = (0..148)
            .map(|i| [768, 3, 2304 * 7, 1, 0, 40_000][i % 6] + i)
            .collect();
        let n: usize = sizes.iter().sum();
        let st = stream();
        for s in candidates(p.program(), &[p.m.id(), p.v.id()]) {
            let w = data::uniform_f32(5, n);
            let g = data::uniform_f32(6, n);
            let z = vec![0.0f32; n];
            let mut job = prepare(&s, 1, n);
            let cut = |x: &[f32], st: &Arc<CudaStream>| -> Vec<CudaSlice<f32>> {
                let mut at = 0;
                sizes
                    .iter()
                    .map(|&k| {
                        at += k;
                        if k == 0 {
                            st.alloc_zeros(0).unwrap()
                        } else {
                            st.clone_htod(&x[at - k..at]).unwrap()
                        }
                    })
                    .collect()
            };
            let (mut wp, mut gp) = (cut(&w, &st), cut(&g, &st));
            let lent = Lent::new()
                .pieces("w", 0, wp.iter_mut().map(DeviceSlice::cuda).collect())
                .pieces("g", 0, gp.iter_mut().map(DeviceSlice::cuda).collect());
            job.run_lent(&lent).unwrap();
            drop(lent);
            let args: Bindings = adam_program::adam_args(&[g], &w, &z, &z, hp(0)).into();
            let want: Vec<f32> = interpret(s.program(), 1, &args)
                .unwrap()
                .final_input("w")
                .unwrap();
            let got: Vec<f32> = wp.iter().flat_map(|b| st.clone_dtoh(b).unwrap()).collect();
            assert_eq!(bits(&got), bits(&want), "{}", s.name());
        }
    }

    /// Memory the GPU can tell is wrong is refused naming the input: a host address, an
    /// allocation shorter than the length claimed.
    #[test]
    fn memory_the_gpu_can_tell_is_wrong_is_refused() {
        let p = adam_program::adam();
        let mut job = prepare(&Schedule::new(p.program()), 1, N);
        let host = vec![0.0f32; N];
        // SAFETY: refused before anything reads it.
        let fake =
            unsafe { DeviceSlice::from_raw(host.as_ptr() as u64, N, DType::F32, Memory::Gpu(0)) };
        let e = job.run_lent(&Lent::new().input("g", 0, fake)).unwrap_err();
        assert!(e.to_string().contains("not device memory"), "{e}");
        let st = stream();
        let short: CudaSlice<f32> = st.alloc_zeros(N / 2).unwrap();
        let at = {
            use coconet::runtime::cuda::cudarc::driver::DevicePtr;
            let (a, _g) = short.device_ptr(&st);
            a
        };
        // SAFETY: refused before anything reads it.
        let long = unsafe { DeviceSlice::from_raw(at, N, DType::F32, Memory::Gpu(0)) };
        let e = job.run_lent(&Lent::new().input("g", 0, long)).unwrap_err();
        assert!(
            e.to_string().contains("past the end of their allocation"),
            "{e}"
        );
        // The job still runs.
        Cuda::new(0).unwrap().run(&mut job).unwrap();
    }
}
