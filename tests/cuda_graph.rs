//! A CUDA job's runs replayed as one graph (`PreparedJob::use_graph`), on the host
//! emulator: every optimizer on every schedule steps bitwise as when launched one by one
//! while its learning rate and step change; a training loop on lent memory (fresh
//! gradients every step, a 150-tensor parameter list) bitwise the interpreter; one graph
//! built and only changed launches updated; no launch issued one by one; plans with
//! matmuls and ranks with memories of their own replay a graph per run of launches.

use coconet_example_programs::{
    adam as adam_program, data, lamb as lamb_program, megatron as megatron_program,
    sgd as sgd_program,
};

use coconet::prelude::*;
use coconet::runtime::cuda::{DeviceSlice, EmulatedCuda, EmulatedJob, GraphStats, Lent};

const N: usize = 37;

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|y| y.to_bits()).collect()
}

fn grads(seed: u64, ranks: usize, n: usize) -> Vec<Vec<f32>> {
    (0..ranks)
        .map(|r| data::uniform_f32(seed + r as u64, n))
        .collect()
}

fn adam_hp(it: usize) -> adam_program::AdamParams {
    adam_program::AdamParams {
        lr: 1e-2 / (1.0 + it as f64),
        step: it as i32 + 1,
        ..Default::default()
    }
}

/// The optimizers, their schedules and bindings on `ranks` ranks, and the scalars each
/// step sets (`lr`, and `step` where the optimizer counts steps).
fn optimizers(ranks: usize) -> Vec<(&'static str, Vec<Schedule>, Bindings, bool)> {
    let g = grads(40, ranks, N);
    let w = data::uniform_f32(1, N);
    let sgd = sgd_program::sgd();
    let adam = adam_program::adam();
    let lamb = lamb_program::lamb();
    let lamb_hp = lamb_program::LambParams {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-6,
        weight_decay: 0.01,
        step: 1,
    };
    vec![
        (
            "sgd",
            candidates(sgd.program(), &[]),
            sgd_program::sgd::Args {
                N,
                g: TensorArg::PerRank(g.clone()),
                w: TensorArg::Global(w.clone()),
                lr: 0.1,
            }
            .into(),
            false,
        ),
        (
            "adam",
            candidates(adam.program(), &[adam.m.id(), adam.v.id()]),
            adam_program::adam_args(&g, &w, &w, &w, adam_hp(0)).into(),
            true,
        ),
        (
            "lamb",
            candidates(lamb.program(), &[lamb.m.id(), lamb.v.id()]),
            lamb_program::lamb_args(&g, &w, &w, &w, lamb_hp).into(),
            true,
        ),
    ]
}

/// Sets step `it`'s scalars on `job`.
fn set_step(job: &mut EmulatedJob, it: usize, counts_steps: bool) {
    let lr = 1e-2 / (1.0 + it as f64);
    // In the program's dtype (SGD's is f32).
    job.set_scalar("lr", lr)
        .or_else(|_| job.set_scalar("lr", lr as f32))
        .unwrap();
    if counts_steps {
        job.set_scalar("step", it as i32 + 1).unwrap();
    }
}

/// Five steps of every optimizer on every schedule at 1–3 virtual ranks, the learning
/// rate and step changing every step: the graph's job holds bitwise the same values as
/// the job launching one by one after every step, runs no launch one by one, builds
/// one graph and replays it every step.
#[test]
fn every_optimizer_replayed_as_a_graph_steps_as_launched_one_by_one() {
    for ranks in 1..=3 {
        for (name, schedules, args, counts_steps) in optimizers(ranks) {
            for s in schedules {
                let what = format!("{name}, {} on {ranks} ranks", s.name());
                let plan = Plan::lower(&s, ranks, args.dims()).unwrap();
                let mut plain = EmulatedCuda.prepare(&plan, &args).unwrap();
                let mut graph = EmulatedCuda.prepare(&plan, &args).unwrap();
                assert_eq!(graph.graph_stats(), None);
                graph.use_graph(true);
                let launches = graph.device.launches();
                for it in 0..5 {
                    set_step(&mut plain, it, counts_steps);
                    set_step(&mut graph, it, counts_steps);
                    EmulatedCuda.run(&mut plain).unwrap();
                    EmulatedCuda
                        .run(&mut graph)
                        .unwrap_or_else(|e| panic!("{what}, step {it}: {e}"));
                    // SGD holds `w` only: both jobs refuse `m` and `v` alike.
                    for label in ["w", "m", "v"] {
                        for r in 0..ranks {
                            let want = plain.final_input_local::<f32>(label, r);
                            let got = graph.final_input_local::<f32>(label, r);
                            match (want, got) {
                                (Ok(want), Ok(got)) => assert_eq!(
                                    bits(&got),
                                    bits(&want),
                                    "{what}, step {it}: `{label}` on rank {r}"
                                ),
                                (want, got) => {
                                    assert_ne!(label, "w", "{what}: every optimizer holds `w`");
                                    assert_eq!(
                                        want.is_ok(),
                                        got.is_ok(),
                                        "{what}, step {it}: `{label}` on rank {r}"
                                    )
                                }
                            }
                        }
                    }
                }
                assert_eq!(graph.device.launches(), launches, "{what}: one by one");
                assert_eq!(graph.device.replays(), 5, "{what}: replays");
                let stats = graph.graph_stats().unwrap();
                assert_eq!((stats.builds, stats.replays), (1, 5), "{what}: {stats:?}");
            }
        }
    }
}

/// Twenty Adam steps with the weights lent in place and each step's gradients in
/// freshly allocated memory (new addresses every step), replayed as one graph: the
/// caller's weights and the job's moments bitwise the interpreter's, on every schedule.
#[test]
fn a_training_loop_on_lent_memory_replayed_as_a_graph_is_bitwise_the_interpreter() {
    let p = adam_program::adam();
    for ranks in 1..=3 {
        for s in candidates(p.program(), &[p.m.id(), p.v.id()]) {
            let what = format!("{} on {ranks} ranks", s.name());
            let zeros = vec![0.0f32; N];
            let args: Bindings =
                adam_program::adam_args(&grads(0, ranks, N), &zeros, &zeros, &zeros, adam_hp(0))
                    .into();
            let plan = Plan::lower(&s, ranks, args.dims()).unwrap();
            let mut job = EmulatedCuda.prepare(&plan, &args).unwrap();
            job.use_graph(true);
            let (mut w, mut m, mut v) = (data::uniform_f32(1, N), zeros.clone(), zeros.clone());
            let mut weights: Vec<Vec<f32>> = vec![w.clone(); ranks];
            for it in 0..20 {
                let mut g = grads(1000 * it as u64, ranks, N);
                job.set_scalar("step", adam_hp(it).step).unwrap();
                job.set_scalar("lr", adam_hp(it).lr).unwrap();
                let mut lent = Lent::new();
                for (r, (wr, gr)) in weights.iter_mut().zip(g.iter_mut()).enumerate() {
                    lent = lent.input("w", r, DeviceSlice::host(wr)).input(
                        "g",
                        r,
                        DeviceSlice::host(gr),
                    );
                }
                job.run_after(&lent, None)
                    .unwrap_or_else(|e| panic!("{what}, step {it}: {e}"));
                drop(lent);
                let args: Bindings = adam_program::adam_args(&g, &w, &m, &v, adam_hp(it)).into();
                let want = interpret(s.program(), ranks, &args).unwrap();
                let exp: Vec<f32> = want.final_input("w").unwrap();
                for (r, wr) in weights.iter().enumerate() {
                    assert_eq!(bits(wr), bits(&exp), "{what}, step {it}: `w` on rank {r}");
                }
                for r in 0..ranks {
                    for name in ["m", "v"] {
                        let e: Vec<f32> = want.final_input_local(name, r).unwrap();
                        let got: Vec<f32> = job.final_input_local(name, r).unwrap();
                        assert_eq!(
                            bits(&got),
                            bits(&e),
                            "{what}, step {it}: `{name}` on rank {r}"
                        );
                    }
                }
                w = exp;
                m = want.final_input("m").unwrap();
                v = want.final_input("v").unwrap();
            }
            let stats = job.graph_stats().unwrap();
            assert_eq!((stats.builds, stats.replays), (1, 20), "{what}: {stats:?}");
        }
    }
}

/// A 150-tensor parameter list lent as pieces: one graph for every step, updated only
/// where a launch changed (the segment tables' rows when the list changes shape;
/// nothing when a step repeats the last one's scalars and memory), a new graph when the
/// kernels change (the list lent as one slice each: plain kernels, not their segmented
/// twins); bitwise the interpreter throughout.
#[test]
fn a_parameter_list_replays_one_graph_until_it_changes_shape() {
    let p = adam_program::adam();
    let s = Schedule::new(p.program());
    let ranks = 2;
    let sizes: Vec<usize> = (0..150).map(|i| [1, 3, 7, 64][i % 4] + i % 5).collect();
    let n: usize = sizes.iter().sum();
    let cut = |x: &[f32], sizes: &[usize]| -> Vec<Vec<f32>> {
        let mut at = 0;
        sizes
            .iter()
            .map(|&k| {
                at += k;
                x[at - k..at].to_vec()
            })
            .collect()
    };
    let zeros = vec![0.0f32; n];
    let args: Bindings =
        adam_program::adam_args(&grads(0, ranks, n), &zeros, &zeros, &zeros, adam_hp(0)).into();
    let plan = Plan::lower(&s, ranks, args.dims()).unwrap();
    let mut job = EmulatedCuda.prepare(&plan, &args).unwrap();
    job.use_graph(true);
    let (mut w, mut m, mut v) = (data::uniform_f32(5, n), zeros.clone(), zeros.clone());
    // Steps 0-2 in 150 pieces (fresh gradient memory each step), step 3 in 75, step 4
    // as one slice each.
    let halves: Vec<usize> = sizes.chunks(2).map(|c| c.iter().sum()).collect();
    let mut stats_before = GraphStats::default();
    for it in 0..5 {
        let whole = [n];
        let shape: &[usize] = match it {
            0..3 => &sizes,
            3 => &halves,
            _ => &whole,
        };
        let hp = adam_hp(it);
        let g = grads(1000 * it as u64, ranks, n);
        job.set_scalar("step", hp.step).unwrap();
        job.set_scalar("lr", hp.lr).unwrap();
        let mut w_pieces: Vec<Vec<Vec<f32>>> = (0..ranks).map(|_| cut(&w, shape)).collect();
        let mut g_pieces: Vec<Vec<Vec<f32>>> = g.iter().map(|x| cut(x, shape)).collect();
        let mut lent = Lent::new();
        for (r, (wp, gp)) in w_pieces.iter_mut().zip(g_pieces.iter_mut()).enumerate() {
            lent = if it < 4 {
                lent.pieces(
                    "w",
                    r,
                    wp.iter_mut().map(|x| DeviceSlice::host(x)).collect(),
                )
                .pieces(
                    "g",
                    r,
                    gp.iter_mut().map(|x| DeviceSlice::host(x)).collect(),
                )
            } else {
                lent.input("w", r, DeviceSlice::host(&mut wp[0])).input(
                    "g",
                    r,
                    DeviceSlice::host(&mut gp[0]),
                )
            };
        }
        let copies = job.device.copies();
        job.run_lent(&lent)
            .unwrap_or_else(|e| panic!("step {it}: {e}"));
        drop(lent);
        assert_eq!(job.device.copies(), copies, "step {it}: no copies");
        let args: Bindings = adam_program::adam_args(&g, &w, &m, &v, hp).into();
        let want = interpret(s.program(), ranks, &args).unwrap();
        let exp: Vec<f32> = want.final_input("w").unwrap();
        for (r, wp) in w_pieces.iter().enumerate() {
            assert_eq!(bits(&wp.concat()), bits(&exp), "step {it}: `w` on rank {r}");
        }
        w = exp;
        m = want.final_input("m").unwrap();
        v = want.final_input("v").unwrap();
        let stats = job.graph_stats().unwrap();
        let builds = if it < 4 { 1 } else { 2 };
        assert_eq!(stats.builds, builds, "step {it}: {stats:?}");
        assert_eq!(stats.replays, it + 1, "step {it}: {stats:?}");
        stats_before = stats;
    }
    // The same step on the same memory twice: the second updates nothing.
    let mut pieces: Vec<Vec<Vec<f32>>> = (0..ranks).map(|_| cut(&w, &sizes)).collect();
    let mut g_pieces: Vec<Vec<Vec<f32>>> =
        grads(9, ranks, n).iter().map(|x| cut(x, &sizes)).collect();
    let mut updates = vec![];
    for _ in 0..2 {
        let mut lent = Lent::new();
        for (r, (wp, gp)) in pieces.iter_mut().zip(g_pieces.iter_mut()).enumerate() {
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
        job.run_lent(&lent).unwrap();
        drop(lent);
        updates.push(job.graph_stats().unwrap().updates);
    }
    assert_eq!(job.graph_stats().unwrap().builds, stats_before.builds + 1);
    assert_eq!(updates[1], updates[0], "a repeated step updates nothing");
}

/// Turning the graphs off launches one by one again; a plan with matmuls (cuBLAS on its
/// own stream between the kernels) replays a graph for each run of launches between
/// them, bitwise as launched one by one.
#[test]
fn graphs_off_and_plans_with_matmuls() {
    let p = adam_program::adam();
    let s = Schedule::new(p.program());
    let zeros = vec![0.0f32; N];
    let args: Bindings =
        adam_program::adam_args(&grads(0, 1, N), &zeros, &zeros, &zeros, adam_hp(0)).into();
    let plan = Plan::lower(&s, 1, args.dims()).unwrap();
    let mut job = EmulatedCuda.prepare(&plan, &args).unwrap();
    job.use_graph(true);
    EmulatedCuda.run(&mut job).unwrap();
    job.use_graph(false);
    assert_eq!(job.graph_stats(), None);
    let launches = job.device.launches();
    EmulatedCuda.run(&mut job).unwrap();
    assert!(
        job.device.launches() > launches,
        "launched one by one again"
    );

    let megatron = megatron_program::megatron();
    let args: Bindings = megatron_program::megatron_args(2, 2, 4, 1).into();
    for s in candidates(megatron.program(), &[]) {
        let plan = Plan::lower(&s, 2, args.dims()).unwrap();
        let mut plain = EmulatedCuda.prepare(&plan, &args).unwrap();
        let mut graph = EmulatedCuda.prepare(&plan, &args).unwrap();
        graph.use_graph(true);
        let launches = graph.device.launches();
        for _ in 0..2 {
            EmulatedCuda.run(&mut plain).unwrap();
            EmulatedCuda.run(&mut graph).unwrap();
        }
        assert_eq!(
            graph.device.launches(),
            launches,
            "{}: one by one",
            s.name()
        );
        let out = megatron.program().outputs()[0];
        for r in 0..2 {
            let (want, got) = (plain.local::<f16>(out, r), graph.local::<f16>(out, r));
            assert!(want.is_some(), "{}: rank {r} holds the output", s.name());
            let bits =
                |v: Option<Vec<f16>>| v.map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            assert_eq!(bits(got), bits(want), "{}: rank {r}", s.name());
        }
        // A graph for each run of launches between the matmuls (none before a leading
        // matmul), built once, replayed every run.
        let stats = graph.graph_stats().unwrap();
        assert!(stats.builds >= 1, "{}: {stats:?}", s.name());
        assert_eq!(stats.replays, 2 * stats.builds, "{}: {stats:?}", s.name());
    }
}

/// Ranks with memories of their own (emulated devices; exchanged through mailboxes or
/// mapped): every rank's launches between its exchanges and barriers replayed as graphs,
/// five Adam steps with the learning rate and step changing, bitwise the ranks launching
/// one by one, on every schedule.
#[test]
fn ranks_with_their_own_memories_replay_graphs_between_their_exchanges() {
    use coconet::runtime::cuda::{EmulatedRanks, PeerAccess, Pipelining};
    let p = adam_program::adam();
    let ranks = 2;
    let g = grads(40, ranks, N);
    let w = data::uniform_f32(1, N);
    let args: Bindings = adam_program::adam_args(&g, &w, &w, &w, adam_hp(0)).into();
    for access in [
        PeerAccess::Exchanged(Pipelining {
            chunk_bytes: 64,
            ..Pipelining::default()
        }),
        PeerAccess::Mapped,
    ] {
        let backend = EmulatedRanks {
            access,
            ..EmulatedRanks::default()
        };
        for s in candidates(p.program(), &[p.m.id(), p.v.id()]) {
            let what = format!("{} over {access:?}", s.name());
            let plan = Plan::lower(&s, ranks, args.dims()).unwrap();
            let mut plain = backend.prepare(&plan, &args).unwrap();
            let mut graph = backend.prepare(&plan, &args).unwrap();
            graph.use_graph(true);
            for it in 0..5 {
                for job in [&mut plain, &mut graph] {
                    job.set_scalar("lr", adam_hp(it).lr).unwrap();
                    job.set_scalar("step", adam_hp(it).step).unwrap();
                    backend
                        .run(job)
                        .unwrap_or_else(|e| panic!("{what}, step {it}: {e}"));
                }
                for name in ["w", "m", "v"] {
                    for r in 0..ranks {
                        let want = plain.final_input_local::<f32>(name, r).unwrap();
                        let got = graph.final_input_local::<f32>(name, r).unwrap();
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{what}, step {it}: `{name}` on rank {r}"
                        );
                    }
                }
            }
            for r in 0..ranks {
                let stats = graph.graph_stats(r).unwrap();
                assert!(
                    stats.builds >= 1 && stats.replays >= 5,
                    "{what}, rank {r}: {stats:?}"
                );
            }
        }
    }
}
