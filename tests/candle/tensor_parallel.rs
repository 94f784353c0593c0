//! Tensor-parallel layers (`coconet::candle::parallel`) against the single-device model:
//! the same output on every rank and the same gradients (each rank's shard's gradient is
//! its block of the whole weight's), within 1e-5 of the largest value, at P = 1, 2, 4 on
//! rank threads and P = 2 over TCP, with and without the matmuls overlapped with their
//! all-reduces; shards gathered back are the original layers bit for
//! bit; a layer that does not split evenly is a clear error.

use candle_core::{D, DType, Device, Module, Tensor, Var};
use candle_nn::{Activation, Linear};
use coconet::candle::parallel::{ParallelMlp, TensorParallel};

/// A whole MLP block (`fc` `[4H, H]`, `proj` `[H, 4H]`, both with biases), its input
/// `[2, 3, H]` and a random direction `r` for the loss `sum(y · r)`.
struct Whole {
    fc: Linear,
    proj: Linear,
    x: Tensor,
    r: Tensor,
}

const H: usize = 8;

fn whole() -> Whole {
    let dev = Device::Cpu;
    let randn = |shape: &[usize], std: f64| {
        Tensor::randn(0f32, std as f32, shape, &dev)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    };
    Whole {
        fc: Linear::new(randn(&[4 * H, H], 0.3), Some(randn(&[4 * H], 0.1))),
        proj: Linear::new(randn(&[H, 4 * H], 0.3), Some(randn(&[H], 0.1))),
        x: randn(&[2, 3, H], 1.0),
        r: randn(&[2, 3, H], 1.0),
    }
}

/// What a rank (or the single device) computed: the output, then the gradients of
/// `fc.w`, `fc.b`, `proj.w`, `proj.b` and of the input.
type Computed = Vec<Tensor>;

fn single(w: &Whole) -> Computed {
    let fc = Linear::new(
        Var::from_tensor(w.fc.weight()).unwrap().as_tensor().clone(),
        Some(
            Var::from_tensor(w.fc.bias().unwrap())
                .unwrap()
                .as_tensor()
                .clone(),
        ),
    );
    let proj = Linear::new(
        Var::from_tensor(w.proj.weight())
            .unwrap()
            .as_tensor()
            .clone(),
        Some(
            Var::from_tensor(w.proj.bias().unwrap())
                .unwrap()
                .as_tensor()
                .clone(),
        ),
    );
    let x = Var::from_tensor(&w.x).unwrap();
    let y = proj
        .forward(
            &Activation::NewGelu
                .forward(&fc.forward(x.as_tensor()).unwrap())
                .unwrap(),
        )
        .unwrap();
    let grads = (&y * &w.r).unwrap().sum_all().unwrap().backward().unwrap();
    let g = |t: &Tensor| grads.get(t).unwrap().clone();
    vec![
        y.clone(),
        g(fc.weight()),
        g(fc.bias().unwrap()),
        g(proj.weight()),
        g(proj.bias().unwrap()),
        g(x.as_tensor()),
    ]
}

fn on_rank(w: &Whole, tp: &TensorParallel) -> Computed {
    on_rank_overlapped(w, tp, None)
}

/// [`on_rank`] with the matmuls overlapped with their all-reduces (`chunks` row chunks).
fn on_rank_overlapped(w: &Whole, tp: &TensorParallel, chunks: Option<usize>) -> Computed {
    let mut mlp = ParallelMlp::shard(&w.fc, Activation::NewGelu, &w.proj, tp).unwrap();
    if let Some(chunks) = chunks {
        mlp = mlp.with_overlap(chunks);
    }
    let x = Var::from_tensor(&w.x).unwrap();
    let y = mlp.forward(x.as_tensor()).unwrap();
    let grads = (&y * &w.r).unwrap().sum_all().unwrap().backward().unwrap();
    let mut out = vec![y];
    for v in mlp.vars() {
        out.push(grads.get(v.as_tensor()).unwrap().clone());
    }
    out.push(grads.get(x.as_tensor()).unwrap().clone());
    out
}

/// Rank `rank`'s block of `whole` along `dim` (of `ranks` equal blocks).
fn block(whole: &Tensor, dim: usize, rank: usize, ranks: usize) -> Tensor {
    let n = whole.dim(dim).unwrap() / ranks;
    whole.narrow(dim, rank * n, n).unwrap()
}

/// `got` within 1e-5 of the largest magnitude of `want`.
pub fn close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}");
    let scale = want
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let diff = (got - want)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(D::Minus1)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(
        diff <= 1e-5 * scale.max(1e-30),
        "{what}: off by {diff} (largest {scale})"
    );
}

/// Every rank's results against the single device's.
fn check(ranks: usize, all: &[Computed], want: &Computed) {
    let what = ["output", "fc.w", "fc.b", "proj.w", "proj.b", "input"];
    for (rank, got) in all.iter().enumerate() {
        let at = |i: usize| format!("{} on rank {rank} of {ranks}", what[i]);
        close(&got[0], &want[0], &at(0));
        close(&got[1], &block(&want[1], 0, rank, ranks), &at(1));
        close(&got[2], &block(&want[2], 0, rank, ranks), &at(2));
        close(&got[3], &block(&want[3], 1, rank, ranks), &at(3));
        close(&got[4], &want[4], &at(4));
        close(&got[5], &want[5], &at(5));
        // Replicated results are bitwise the same on every rank.
        for i in [0, 4, 5] {
            let (a, b) = (&got[i], &all[0][i]);
            let d = (a - b).unwrap().abs().unwrap().sum_all().unwrap();
            assert_eq!(
                d.to_scalar::<f32>().unwrap(),
                0.0,
                "{} differs between ranks",
                at(i)
            );
        }
    }
}

#[test]
fn the_mlp_block_on_rank_threads_is_the_single_device_block() {
    let w = whole();
    let want = single(&w);
    for ranks in [1, 2, 4] {
        let all: Vec<Computed> = std::thread::scope(|s| {
            let handles: Vec<_> = TensorParallel::threads(ranks)
                .into_iter()
                .map(|tp| {
                    let w = &w;
                    s.spawn(move || on_rank(w, &tp))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        check(ranks, &all, &want);
    }
}

#[test]
fn the_mlp_block_over_tcp_processes_is_the_single_device_block() {
    let w = whole();
    let want = single(&w);
    let name = super::loopback::group_name();
    let all = super::loopback::per_process(2, |r| {
        let tcp = super::loopback::connect(r, 2, &name).unwrap();
        on_rank(&w, &TensorParallel::tcp(tcp))
    });
    check(2, &all, &want);
}

/// The overlapped block at P ranks with `chunks` row chunks, every rank's results.
fn overlapped_on_threads(w: &Whole, ranks: usize, chunks: Option<usize>) -> Vec<Computed> {
    std::thread::scope(|s| {
        let handles: Vec<_> = TensorParallel::threads(ranks)
            .into_iter()
            .map(|tp| s.spawn(move || on_rank_overlapped(w, &tp, chunks)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn the_overlapped_mlp_block_is_the_single_device_block() {
    let w = whole();
    let want = single(&w);
    for ranks in [1, 2, 4] {
        let plain = overlapped_on_threads(&w, ranks, None);
        // One chunk, chunks of 2 and 3 rows, one row each (6 rows in 7 chunks).
        for chunks in [1, 2, 3, 7] {
            let all = overlapped_on_threads(&w, ranks, Some(chunks));
            check(ranks, &all, &want);
            for (got, plain) in all.iter().zip(&plain) {
                for (i, (a, b)) in got.iter().zip(plain).enumerate() {
                    close(a, b, &format!("result {i}, {chunks} chunks, P = {ranks}"));
                }
            }
        }
    }
}

#[test]
fn the_overlapped_mlp_block_over_tcp_processes_is_the_single_device_block() {
    let w = whole();
    let want = single(&w);
    let name = super::loopback::group_name();
    let all = super::loopback::per_process(2, |r| {
        let tcp = super::loopback::connect(r, 2, &name).unwrap();
        on_rank_overlapped(&w, &TensorParallel::tcp(tcp), Some(3))
    });
    check(2, &all, &want);
}

#[test]
fn shards_gathered_back_are_the_whole_layers_bit_for_bit() {
    let w = whole();
    let bits = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    std::thread::scope(|s| {
        for tp in TensorParallel::threads(4) {
            let w = &w;
            s.spawn(move || {
                let mlp = ParallelMlp::shard(&w.fc, Activation::NewGelu, &w.proj, &tp).unwrap();
                let (fc, proj) = mlp.gather().unwrap();
                assert_eq!(bits(fc.weight()), bits(w.fc.weight()));
                assert_eq!(bits(fc.bias().unwrap()), bits(w.fc.bias().unwrap()));
                assert_eq!(bits(proj.weight()), bits(w.proj.weight()));
                assert_eq!(bits(proj.bias().unwrap()), bits(w.proj.bias().unwrap()));
            });
        }
    });
}

#[test]
fn a_layer_that_does_not_split_evenly_is_refused_naming_it() {
    let w = whole();
    let tp = TensorParallel::threads(3).remove(0);
    let e = ParallelMlp::shard(&w.fc, Activation::NewGelu, &w.proj, &tp)
        .expect_err("32 features over 3 ranks");
    assert!(
        e.to_string().contains("column-parallel") && e.to_string().contains("3 ranks"),
        "{e}"
    );
}
