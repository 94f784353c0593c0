//! The runtime as the step of a training loop: a job prepared once and run for many
//! iterations, with fresh gradients written into its buffers and scalars (the step
//! counter, a learning-rate schedule) set between runs — bitwise the reference
//! interpreter run from scratch every iteration, on every schedule.

use coconet_example_programs::adam as adam_program;
use coconet_example_programs::data;

use coconet::core::schedule::{Schedule, candidates};
use coconet::prelude::*;
use coconet::runtime::cpu::{Job, RunOptions};
use coconet::runtime::{Plan, RuntimeError};

const ITERATIONS: usize = 20;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The learning rate of iteration `it` (a warm-up then decay schedule).
fn lr_at(it: usize) -> f64 {
    1e-2 * (it as f64 + 1.0).min(5.0) / 5.0 / (1.0 + it as f64 / 10.0)
}

fn grads_at(it: usize, ranks: usize, n: usize) -> Vec<Vec<f32>> {
    (0..ranks)
        .map(|r| data::uniform_f32(1000 * it as u64 + r as u64, n))
        .collect()
}

/// Runs the loop on a job prepared once and on the interpreter from scratch each
/// iteration; `pieces` binds w and g as separate parameter tensors of these lengths.
fn train(ranks: usize, n: usize, pieces: Option<&[usize]>, lend: bool) {
    let p = adam_program::adam();
    let w0 = data::uniform_f32(1, n);
    let (m0, v0) = (vec![0.0f32; n], vec![0.0f32; n]);
    let hp = |it: usize| adam_program::AdamParams {
        lr: lr_at(it),
        step: it as i32 + 1,
        ..Default::default()
    };
    let split = |v: &[f32], lens: &[usize]| {
        let mut at = 0;
        lens.iter()
            .map(|&k| {
                at += k;
                v[at - k..at].to_vec()
            })
            .collect::<Vec<_>>()
    };
    for s in candidates(p.program(), &[p.m.id(), p.v.id()]) {
        let what = format!("{} on {ranks} ranks", s.name());
        let first: Bindings =
            adam_program::adam_args(&grads_at(0, ranks, n), &w0, &m0, &v0, hp(0)).into();
        let first = match pieces {
            Some(lens) => first
                .tensor("w", Binding::pieces(&split(&w0, lens)))
                .tensor(
                    "g",
                    Binding::per_rank_pieces(
                        &grads_at(0, ranks, n)
                            .iter()
                            .map(|g| split(g, lens))
                            .collect::<Vec<_>>(),
                    ),
                ),
            None => first,
        };
        let plan = Plan::lower(&s, ranks, first.dims()).unwrap();
        let mut job = Job::new(&plan, &first, RunOptions::default()).unwrap();
        let (mut w, mut m, mut v) = (w0.clone(), m0.clone(), v0.clone());
        for it in 0..ITERATIONS {
            let grads = grads_at(it, ranks, n);
            if it > 0 && !lend {
                for (r, g) in grads.iter().enumerate() {
                    match pieces {
                        None => job.input_mut::<f32>("g", r).unwrap().copy_from_slice(g),
                        Some(lens) => {
                            for (i, piece) in split(g, lens).iter().enumerate() {
                                job.piece_mut::<f32>("g", r, i)
                                    .unwrap()
                                    .copy_from_slice(piece);
                            }
                        }
                    }
                }
            }
            if it > 0 {
                job.set_scalar("step", it as i32 + 1).unwrap();
                job.set_scalar("lr", lr_at(it)).unwrap();
            }
            let ran = if lend {
                // The gradients are read from the caller's memory, not copied in: one
                // slice per rank, or one per parameter tensor.
                match pieces {
                    None => {
                        let slices: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
                        job.run_with("g", &slices)
                    }
                    Some(lens) => {
                        let owned: Vec<Vec<Vec<f32>>> =
                            grads.iter().map(|g| split(g, lens)).collect();
                        let slices: Vec<Vec<&[f32]>> = owned
                            .iter()
                            .map(|r| r.iter().map(Vec::as_slice).collect())
                            .collect();
                        job.run_with_pieces("g", &slices)
                    }
                }
            } else {
                job.run()
            };
            ran.unwrap_or_else(|e| panic!("{what}, iteration {it}: {e}"));
            let want = p
                .interpret(ranks, adam_program::adam_args(&grads, &w, &m, &v, hp(it)))
                .unwrap();
            w = want.final_input("w").unwrap();
            m = want.final_input("m").unwrap();
            v = want.final_input("v").unwrap();
            for (name, x) in [("w", &w), ("m", &m), ("v", &v)] {
                let got: Vec<f32> = job.final_input(name).unwrap();
                assert_eq!(bits(&got), bits(x), "{what}, iteration {it}: `{name}`");
            }
            // Borrowed views of the updated parameters, rank by rank, no copy.
            for r in 0..ranks {
                let view: Vec<f32> = match pieces {
                    None => job.input::<f32>("w", r).unwrap().to_vec(),
                    Some(lens) => (0..lens.len())
                        .flat_map(|i| job.piece::<f32>("w", r, i).unwrap().to_vec())
                        .collect(),
                };
                assert_eq!(
                    bits(&view),
                    bits(&w),
                    "{what}, iteration {it}: w on rank {r}"
                );
            }
        }
    }
}

#[test]
fn adam_trained_for_twenty_iterations_equals_the_interpreter() {
    train(3, 37, None, false);
    train(4, 64, None, false);
}

#[test]
fn gradients_lent_as_slices_equal_gradients_written_into_the_job() {
    train(3, 37, None, true);
}

#[test]
fn parameters_bound_as_pieces_are_updated_in_place_every_iteration() {
    train(3, 40, Some(&[7, 1, 20, 12]), false);
}

#[test]
fn gradients_lent_as_one_slice_per_parameter_tensor() {
    train(3, 40, Some(&[7, 1, 20, 12]), true);
}

#[test]
fn views_and_scalars_are_checked_against_the_declared_dtypes() {
    let p = adam_program::adam();
    let n = 8;
    let hp = adam_program::AdamParams {
        lr: 1e-2,
        step: 1,
        ..Default::default()
    };
    let args: Bindings = adam_program::adam_args(
        &grads_at(0, 2, n),
        &vec![1.0; n],
        &vec![0.0; n],
        &vec![0.0; n],
        hp,
    )
    .into();
    let plan = Plan::lower(&Schedule::new(p.program()), 2, args.dims()).unwrap();
    let mut job = Job::new(&plan, &args, RunOptions::default()).unwrap();
    let msg = |e: RuntimeError| e.to_string();
    assert!(msg(job.input::<i32>("w", 0).unwrap_err()).contains("F32"));
    assert!(msg(job.input_mut::<f64>("g", 1).unwrap_err()).contains("F32"));
    assert!(msg(job.input::<f32>("w", 2).unwrap_err()).contains("rank 2"));
    assert!(msg(job.input::<f32>("nope", 0).unwrap_err()).contains("nope"));
    assert!(msg(job.piece::<f32>("w", 0, 1).unwrap_err()).contains("no piece 1"));
    assert!(msg(job.set_scalar("step", 2.0f32).unwrap_err()).contains("step"));
    assert!(msg(job.set_scalar("w", 2.0f32).unwrap_err()).contains("not a scalar"));
    job.run().unwrap();
    assert!(msg(job.final_input::<i32>("w").unwrap_err()).contains("F32"));
    // f64 holds every f32 exactly: a converted read is allowed.
    let w64: Vec<f64> = job.final_input("w").unwrap();
    let w32: &[f32] = job.input("w", 1).unwrap();
    assert!(w64.iter().zip(w32).all(|(a, b)| *a == f64::from(*b)));
    // write_input lays out a whole tensor on every rank.
    job.write_input("w", &vec![2.5f32; n]).unwrap();
    assert_eq!(job.input::<f32>("w", 1).unwrap(), &vec![2.5f32; n][..]);
    assert!(msg(job.write_input("w", &[1.0f32]).unwrap_err()).contains("expected 8"));
    // Lent slices: never for an updated input, one per rank, of the right length.
    let g = vec![0.5f32; n];
    assert!(msg(job.run_with("w", &[&g[..], &g[..]]).unwrap_err()).contains("updated"));
    assert!(msg(job.run_with("g", &[&g[..]]).unwrap_err()).contains("got 1"));
    assert!(msg(job.run_with("g", &[&g[..], &g[..3]]).unwrap_err()).contains("rank 1"));
    assert!(msg(job.run_with("g", &[&[1i32; 8][..], &[1; 8]]).unwrap_err()).contains("F32"));
    job.run_with("g", &[&g[..], &g[..]]).unwrap();
    // Pieces: their lengths add up to the rank's buffer.
    let e = msg(job
        .run_with_pieces("g", &[vec![&g[..3], &g[3..]], vec![&g[..3], &g[..4]]])
        .unwrap_err());
    assert!(e.contains("rank 1") && e.contains("got 7"), "{e}");
    job.run_with_pieces("g", &[vec![&g[..3], &g[3..]], vec![&g[..0], &g[..]]])
        .unwrap();
}

/// After `split`, the handle `p.g1` of the unscheduled program still reads the reduced
/// gradient (the scheduled program's value of that name); where the schedule removed
/// it, the error says so and names the schedule (it said "%11 is not a value of adam").
#[test]
fn handles_of_the_unscheduled_program_survive_split() {
    let p = adam_program::adam();
    let ranks = 3;
    let n = 10;
    let hp = adam_program::AdamParams {
        lr: 1e-2,
        step: 1,
        ..Default::default()
    };
    let (w, z) = (data::uniform_f32(1, n), vec![0.0f32; n]);
    let args: Bindings = adam_program::adam_args(&grads_at(0, ranks, n), &w, &z, &z, hp).into();
    let want: Vec<f32> = p
        .interpret(
            ranks,
            adam_program::adam_args(&grads_at(0, ranks, n), &w, &z, &z, hp),
        )
        .unwrap()
        .logical(p.g1)
        .unwrap();
    let mut split = Schedule::new(p.program());
    split.split(p.g1).unwrap();
    let mut schedules = vec![split];
    schedules.extend(candidates(p.program(), &[p.m.id(), p.v.id()]));
    for s in schedules {
        // Not observed: the all-reduced gradient is readable only where its memory is
        // not reused later in the run; otherwise the error names it and why.
        let plan = Plan::lower(&s, ranks, args.dims()).unwrap();
        let mut job = Job::new(&plan, &args, RunOptions::default()).unwrap();
        job.run().unwrap();
        match job.logical::<f32>(p.g1) {
            Ok(got) => assert_eq!(bits(&got), bits(&want), "{}", s.name()),
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.contains("`g1`") && !e.contains("is not a value"),
                    "{}: {e}",
                    s.name()
                );
            }
        }
        // Observed: read back exactly where the schedule computes it (the unscheduled
        // program, and after split); refused with a reason where reorder removed it.
        let computed = s.program().find("g1").is_some();
        match Plan::lower_observing(&s, ranks, args.dims(), &[p.g1.into()]) {
            Ok(plan) => {
                assert!(computed, "{}", s.name());
                let mut job = Job::new(&plan, &args, RunOptions::default()).unwrap();
                job.run().unwrap();
                let got: Vec<f32> = job.logical(p.g1).unwrap();
                assert_eq!(bits(&got), bits(&want), "{}", s.name());
            }
            Err(e) => {
                assert!(!computed, "{}: {e}", s.name());
                assert!(e.to_string().contains(s.name()), "{e}");
            }
        }
    }
}
