//! Memory lent to a CUDA job (`coconet::runtime::cuda::Lent`), typed reads and events,
//! on the host emulator (a host slice stands for device memory): a training loop whose
//! gradients and weights live in the caller's memory, bitwise the reference interpreter,
//! on every Adam schedule at 1 to 3 virtual ranks; pieces; and every misuse refused with
//! an error naming the input, the job left as it was.

use coconet_example_programs::{adam as adam_program, data};

use coconet::prelude::*;
use coconet::runtime::cuda::{
    DeviceData, DeviceSlice, EmulatedCuda, EmulatedJob, EmulatedRanks, Lent, Memory, PeerAccess,
};

const N: usize = 37;

fn hp(it: usize) -> adam_program::AdamParams {
    adam_program::AdamParams {
        lr: 1e-2 / (1.0 + it as f64),
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        step: it as i32 + 1,
    }
}

fn grads(it: usize, ranks: usize) -> Vec<Vec<f32>> {
    (0..ranks)
        .map(|r| data::uniform_f32(1000 * it as u64 + r as u64, N))
        .collect()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|y| y.to_bits()).collect()
}

/// A job of schedule `s` on `ranks` ranks of `backend`, bound to zeros (everything
/// that matters is lent or written before the first run).
fn prepare_on<B: Backend>(backend: &B, s: &Schedule, ranks: usize) -> B::Job {
    let zeros = vec![0.0f32; N];
    let args: Bindings =
        adam_program::adam_args(&grads(0, ranks), &zeros, &zeros, &zeros, hp(0)).into();
    let plan = Plan::lower(s, ranks, args.dims()).unwrap();
    backend.prepare(&plan, &args).unwrap()
}

/// A job of schedule `s` on `ranks` virtual ranks of the emulated GPU.
fn prepare(s: &Schedule, ranks: usize) -> EmulatedJob {
    prepare_on(&EmulatedCuda, s, ranks)
}

/// Ranks with memories of their own (emulated devices), reaching peers' memory `access`.
fn separate(access: PeerAccess) -> EmulatedRanks {
    EmulatedRanks {
        access,
        ..EmulatedRanks::default()
    }
}

/// The interpreter's step from `w`, `m`, `v` with gradients `g`.
fn reference(
    s: &Schedule,
    g: &[Vec<f32>],
    (w, m, v): (&[f32], &[f32], &[f32]),
    it: usize,
) -> Execution {
    let args: Bindings = adam_program::adam_args(g, w, m, v, hp(it)).into();
    interpret(s.program(), g.len(), &args).unwrap()
}

/// Writes the Replicated weights on every rank.
fn write_w(job: &mut EmulatedJob, w: &[f32]) {
    for r in 0..job.plan().ranks() {
        job.write_input_local("w", r, w).unwrap();
    }
}

/// Runs a job of `B` with lent memory.
type RunLent<B> = fn(&B, &mut <B as Backend>::Job, &Lent<'_>) -> Result<(), RuntimeError>;

/// Twenty Adam steps with the weights in the caller's memory (one slice per rank, lent
/// every run and updated there) and each step's gradients in freshly allocated caller
/// memory: the caller's weights and the job's moments bitwise the interpreter's, on
/// every schedule.
fn train_on_lent_memory<B: Backend>(backend: &B, run: RunLent<B>, rank_counts: &[usize])
where
    B::Job: DeviceData,
{
    let p = adam_program::adam();
    for &ranks in rank_counts {
        for s in candidates(p.program(), &[p.m.id(), p.v.id()]) {
            let what = format!("{} on {ranks} ranks", s.name());
            let mut job = prepare_on(backend, &s, ranks);
            let (mut w, mut m, mut v) = (data::uniform_f32(1, N), vec![0.0f32; N], vec![0.0f32; N]);
            let mut weights: Vec<Vec<f32>> = vec![w.clone(); ranks];
            for it in 0..20 {
                let mut g = grads(it, ranks);
                job.set_scalar("step", hp(it).step).unwrap();
                job.set_scalar("lr", hp(it).lr).unwrap();
                let mut lent = Lent::new();
                for (r, (wr, gr)) in weights.iter_mut().zip(g.iter_mut()).enumerate() {
                    lent = lent.input("w", r, DeviceSlice::host(wr)).input(
                        "g",
                        r,
                        DeviceSlice::host(gr),
                    );
                }
                run(backend, &mut job, &lent)
                    .unwrap_or_else(|e| panic!("{what}, iteration {it}: {e}"));
                let want = reference(&s, &g, (&w, &m, &v), it);
                let exp_w: Vec<f32> = want.final_input("w").unwrap();
                for (r, wr) in weights.iter().enumerate() {
                    assert_eq!(
                        bits(wr),
                        bits(&exp_w),
                        "{what}, iteration {it}: `w` on rank {r}"
                    );
                }
                for name in ["m", "v"] {
                    let id = job.plan().tensor_input(name).unwrap();
                    for r in 0..ranks {
                        let exp: Vec<f32> = want.final_input_local(name, r).unwrap();
                        let mut got = vec![0.0f32; exp.len()];
                        job.read(id, r, &mut got).unwrap();
                        assert_eq!(
                            bits(&got),
                            bits(&exp),
                            "{what}, iteration {it}: `{name}` on rank {r}"
                        );
                    }
                }
                w = exp_w;
                m = want.final_input("m").unwrap();
                v = want.final_input("v").unwrap();
            }
        }
    }
}

#[test]
fn a_training_loop_on_lent_memory_is_bitwise_the_interpreter() {
    train_on_lent_memory(&EmulatedCuda, |_, job, lent| job.run_lent(lent), &[1, 2, 3]);
}

/// Ranks with memories of their own, exchanging: lent memory is used in place.
#[test]
fn a_training_loop_on_lent_memory_of_separate_ranks_is_bitwise_the_interpreter() {
    let backend = separate(PeerAccess::default());
    train_on_lent_memory(&backend, |b, job, lent| b.run_lent(job, lent), &[1, 2, 3]);
}

/// Ranks that map each other's buffers: lent memory is gathered into the mapped buffers
/// and scattered back.
#[test]
fn a_training_loop_on_lent_memory_of_mapped_ranks_is_bitwise_the_interpreter() {
    let backend = separate(PeerAccess::Mapped);
    train_on_lent_memory(&backend, |b, job, lent| b.run_lent(job, lent), &[2, 3]);
}

/// Weights and gradients lent as pieces (a model's parameter tensors, empty ones
/// included) are read as their concatenation, and the updated weights land in the
/// pieces: bitwise the interpreter on every schedule and kind of ranks.
#[test]
fn pieces_are_read_as_their_concatenation_and_updated_in_place() {
    pieces_on(&EmulatedCuda, |_, job, lent| job.run_lent(lent));
    for access in [PeerAccess::default(), PeerAccess::Mapped] {
        pieces_on(&separate(access), |b, job, lent| b.run_lent(job, lent));
    }
}

fn pieces_on<B: Backend>(backend: &B, run: RunLent<B>) {
    let p = adam_program::adam();
    let cuts = [0, 10, 10, 31, N];
    let split = |x: &mut Vec<f32>| -> Vec<Vec<f32>> {
        cuts.windows(2).map(|c| x[c[0]..c[1]].to_vec()).collect()
    };
    for ranks in [1, 3] {
        for s in candidates(p.program(), &[p.m.id(), p.v.id()]) {
            let what = format!("{} on {ranks} ranks", s.name());
            let mut job = prepare_on(backend, &s, ranks);
            let mut w = data::uniform_f32(3, N);
            let (m, v) = (vec![0.0f32; N], vec![0.0f32; N]);
            let mut g = grads(0, ranks);
            let mut w_pieces: Vec<Vec<Vec<f32>>> = (0..ranks).map(|_| split(&mut w)).collect();
            let mut g_pieces: Vec<Vec<Vec<f32>>> = g.iter_mut().map(split).collect();
            let mut lent = Lent::new();
            for (r, (wp, gp)) in w_pieces.iter_mut().zip(g_pieces.iter_mut()).enumerate() {
                lent = lent
                    .pieces(
                        "w",
                        r,
                        wp.iter_mut().map(|x| DeviceSlice::host(x)).collect(),
                    )
                    .pieces(
                        "g",
                        r,
                        gp.iter_mut().map(|x| DeviceSlice::host(x)).collect(),
                    );
            }
            run(backend, &mut job, &lent).unwrap_or_else(|e| panic!("{what}: {e}"));
            drop(lent);
            let want = reference(&s, &g, (&w, &m, &v), 0);
            let exp: Vec<f32> = want.final_input("w").unwrap();
            for (r, wp) in w_pieces.iter().enumerate() {
                assert_eq!(bits(&wp.concat()), bits(&exp), "{what}: `w` on rank {r}");
            }
        }
    }
}

/// A model's parameter list (150 tensors of uneven sizes, empty and unaligned ones
/// among them, one longer than a segment table's rows) lent as pieces is stepped in
/// place: as many kernel launches as one contiguous tensor, no copies, bitwise the
/// interpreter, on every schedule.
#[test]
fn a_parameter_list_is_stepped_in_the_launches_of_one_tensor() {
    let p = adam_program::adam();
    let sizes: Vec<usize> = (0..150)
        .map(|i| [0, 1, 3, 7, 64, 129][i % 6] + i % 5)
        .collect();
    let n: usize = sizes.iter().sum();
    let split = |x: &[f32]| -> Vec<Vec<f32>> {
        let mut at = 0;
        sizes
            .iter()
            .map(|&k| {
                at += k;
                x[at - k..at].to_vec()
            })
            .collect()
    };
    let ranks = 2;
    for s in candidates(p.program(), &[p.m.id(), p.v.id()]) {
        let what = s.name().to_string();
        let w = data::uniform_f32(13, n);
        let zeros = vec![0.0f32; n];
        let g: Vec<Vec<f32>> = (0..ranks)
            .map(|r| data::uniform_f32(20 + r as u64, n))
            .collect();
        let args: Bindings = adam_program::adam_args(&g, &w, &zeros, &zeros, hp(0)).into();
        let plan = Plan::lower(&s, ranks, args.dims()).unwrap();
        // Contiguous: the job's own buffers.
        let mut whole = EmulatedCuda.prepare(&plan, &args).unwrap();
        let before = whole.device.launches();
        EmulatedCuda.run(&mut whole).unwrap();
        let contiguous = whole.device.launches() - before;
        // Pieces.
        let mut job = EmulatedCuda.prepare(&plan, &args).unwrap();
        let mut w_pieces: Vec<Vec<Vec<f32>>> = (0..ranks).map(|_| split(&w)).collect();
        let mut g_pieces: Vec<Vec<Vec<f32>>> = g.iter().map(|x| split(x)).collect();
        let mut lent = Lent::new();
        for (r, (wp, gp)) in w_pieces.iter_mut().zip(g_pieces.iter_mut()).enumerate() {
            lent = lent
                .pieces(
                    "w",
                    r,
                    wp.iter_mut().map(|x| DeviceSlice::host(x)).collect(),
                )
                .pieces(
                    "g",
                    r,
                    gp.iter_mut().map(|x| DeviceSlice::host(x)).collect(),
                );
        }
        let (launches, copies) = (job.device.launches(), job.device.copies());
        job.run_lent(&lent)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        drop(lent);
        assert_eq!(job.device.copies() - copies, 0, "{what}: no copies");
        assert_eq!(
            job.device.launches() - launches,
            contiguous,
            "{what}: launches"
        );
        let want = interpret(s.program(), ranks, &args).unwrap();
        let exp: Vec<f32> = want.final_input("w").unwrap();
        for (r, wp) in w_pieces.iter().enumerate() {
            assert_eq!(bits(&wp.concat()), bits(&exp), "{what}: `w` on rank {r}");
        }
        let got: Vec<f32> = whole.final_input("w").unwrap();
        assert_eq!(bits(&got), bits(&exp), "{what}: contiguous `w`");
    }
}

/// Every misuse of lending is refused before anything runs, naming the input (and the
/// piece); the job still runs afterwards, bitwise as if nothing had been tried.
#[test]
fn misuse_is_refused_naming_the_input_and_changes_nothing() {
    let p = adam_program::adam();
    let s = Schedule::new(p.program());
    let ranks = 2;
    let mut job = prepare(&s, ranks);
    let w0 = data::uniform_f32(5, N);
    write_w(&mut job, &w0);
    let mut g = grads(0, ranks);
    let mut short = vec![0.0f32; N - 1];
    let mut wide = vec![0.0f64; N];
    let mut refused = |lent: Lent<'_>, want: &str| {
        let e = job.run_lent(&lent).expect_err(want);
        assert!(matches!(e, RuntimeError::Lend(_)), "{want}: {e:?}");
        assert!(e.to_string().contains(want), "`{e}` should say `{want}`");
    };
    refused(
        Lent::new().input("g", 0, DeviceSlice::host(&mut wide)),
        "`g` on rank 0 is F64 memory; `g` holds F32",
    );
    refused(
        Lent::new().input("g", 1, DeviceSlice::host(&mut short)),
        "`g` on rank 1 holds 37 elements ([37]); 36 lent",
    );
    refused(
        Lent::new().input("g", 2, DeviceSlice::host(&mut short)),
        "rank 2 does not exist (the job has 2 ranks)",
    );
    {
        let (a, b) = g.split_at_mut(1);
        refused(
            Lent::new()
                .input("g", 0, DeviceSlice::host(&mut a[0]))
                .input("g", 0, DeviceSlice::host(&mut b[0])),
            "`g` on rank 0 is lent twice",
        );
    }
    {
        let at = g[0].as_mut_ptr() as u64;
        let (head, tail) = g[0].split_at_mut(20);
        refused(
            Lent::new()
                .pieces(
                    "g",
                    0,
                    vec![DeviceSlice::host(head), DeviceSlice::host(tail)],
                )
                // SAFETY: refused (it overlaps) before anything reads it.
                .input("g", 1, unsafe {
                    DeviceSlice::from_raw(at, N, DType::F32, Memory::Host)
                }),
            "overlaps the memory lent for `g` on rank",
        );
    }
    // Another device's memory.
    // SAFETY: refused before anything reads it.
    let elsewhere = unsafe { DeviceSlice::from_raw(0x1000, N, DType::F32, Memory::Gpu(0)) };
    refused(
        Lent::new().input("g", 0, elsewhere),
        "`g` on rank 0 is in GPU 0; the job runs on host memory",
    );
    let e = job
        .run_lent(&Lent::new().input("q", 0, DeviceSlice::host(&mut short)))
        .unwrap_err();
    assert!(e.to_string().contains("`q` is not a tensor input"), "{e}");
    // Nothing changed: a plain run is the interpreter's step from the written weights.
    let g = grads(0, ranks);
    for (r, gr) in g.iter().enumerate() {
        job.write_input_local("g", r, gr).unwrap();
    }
    EmulatedCuda.run(&mut job).unwrap();
    let zeros = vec![0.0f32; N];
    let want = reference(&s, &g, (&w0, &zeros, &zeros), 0);
    let got: Vec<f32> = job.final_input("w").unwrap();
    assert_eq!(bits(&got), bits(&want.final_input::<f32>("w").unwrap()));
}

/// After a run with `w` lent in place, the job's own copy of `w` is stale: reads of it
/// and runs on it are refused (naming it) until it is written or lent again.
#[test]
fn the_jobs_copy_of_memory_lent_in_place_is_not_used_again() {
    let p = adam_program::adam();
    let s = Schedule::new(p.program());
    let mut job = prepare(&s, 1);
    let mut w = data::uniform_f32(7, N);
    job.run_lent(&Lent::new().input("w", 0, DeviceSlice::host(&mut w)))
        .unwrap();
    let e = job.final_input_local::<f32>("w", 0).unwrap_err();
    assert!(e.to_string().contains("lent for the last run"), "{e}");
    let e = EmulatedCuda.run(&mut job).unwrap_err();
    assert!(
        e.to_string()
            .contains("`w` on rank 0 was lent in the last run"),
        "{e}"
    );
    // Lent again: runs.
    job.run_lent(&Lent::new().input("w", 0, DeviceSlice::host(&mut w)))
        .unwrap();
    // Written: runs and reads again.
    write_w(&mut job, &w);
    EmulatedCuda.run(&mut job).unwrap();
    assert_eq!(job.final_input_local::<f32>("w", 0).unwrap().len(), N);
}

/// Typed reads: in the value's own dtype only (no conversion), into exactly its length,
/// a Sliced value's block per rank; and into lent memory, the same bits.
#[test]
fn typed_reads_take_the_values_own_dtype_and_length() {
    let p = adam_program::adam();
    let sharded = candidates(p.program(), &[p.m.id(), p.v.id()])
        .into_iter()
        .find(|s| s.name().contains("RS"))
        .expect("a sharded schedule");
    let ranks = 3;
    let mut job = prepare(&sharded, ranks);
    let w = data::uniform_f32(9, N);
    write_w(&mut job, &w);
    let g = grads(1, ranks);
    for (r, gr) in g.iter().enumerate() {
        job.write_input_local("g", r, gr).unwrap();
    }
    EmulatedCuda.run(&mut job).unwrap();
    let m = job.plan().tensor_input("m").unwrap();
    for r in 0..ranks {
        let want: Vec<f32> = job.final_input_local("m", r).unwrap();
        let mut got = vec![0.0f32; want.len()];
        job.read(m, r, &mut got).unwrap();
        assert_eq!(bits(&got), bits(&want), "`m` on rank {r}");
        let mut device = vec![0.0f32; want.len()];
        job.read_to(m, r, &DeviceSlice::host(&mut device)).unwrap();
        assert_eq!(
            bits(&device),
            bits(&want),
            "`m` on rank {r}, into device memory"
        );
    }
    let block = job.final_input_local::<f32>("m", 0).unwrap().len();
    let mut wide = vec![0.0f64; block];
    let e = job.read(m, 0, &mut wide).unwrap_err();
    assert!(e.to_string().contains("holds F32 elements, not F64"), "{e}");
    let mut long = vec![0.0f32; block + 1];
    let e = job.read(m, 0, &mut long).unwrap_err();
    assert!(e.to_string().contains("the destination holds"), "{e}");
    let e = job.read(m, 3, &mut long).unwrap_err();
    assert!(e.to_string().contains("rank 3 does not hold `m`"), "{e}");
}

/// Runs queued with `run_after` hand back events in the order of the runs, and a run
/// may wait on the event of the one before (the emulator runs work as it is queued).
#[test]
fn runs_hand_back_events_in_order() {
    let p = adam_program::adam();
    let s = Schedule::new(p.program());
    let mut job = prepare(&s, 1);
    let mut w = data::uniform_f32(11, N);
    let first = job
        .run_after(&Lent::new().input("w", 0, DeviceSlice::host(&mut w)), None)
        .unwrap();
    let second = job
        .run_after(
            &Lent::new().input("w", 0, DeviceSlice::host(&mut w)),
            Some(&first),
        )
        .unwrap();
    assert!(second > first);
    assert!(job.record().unwrap() > second);
}
