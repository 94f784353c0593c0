//! Scattered tensors: a model's many parameter tensors (hundreds, of odd sizes) bound as
//! separate pieces and updated by one fused collective in place — bitwise the same as
//! the flat tensor, on every schedule.

use coconet_example_programs::adam as adam_program;
use coconet_example_programs::data;

use coconet::core::schedule::candidates;
use coconet::prelude::*;
use coconet::runtime::Plan;
use coconet::runtime::cpu::{Job, RunOptions};

/// Splits `v` into pieces of the given lengths.
fn split(v: &[f32], lens: &[usize]) -> Vec<Vec<f32>> {
    let mut at = 0;
    lens.iter()
        .map(|&n| {
            let p = v[at..at + n].to_vec();
            at += n;
            p
        })
        .collect()
}

#[test]
fn hundreds_of_pieces_equal_the_flat_tensor() {
    const RANKS: usize = 3;
    // 300 parameter tensors of sizes 1..=97 (odd on purpose).
    let lens: Vec<usize> = (0..300).map(|i| 1 + (i * 37) % 97).collect();
    let n: usize = lens.iter().sum();
    let p = adam_program::adam();
    let grads: Vec<Vec<f32>> = (0..RANKS).map(|r| data::uniform_f32(r as u64, n)).collect();
    let (w, m) = (data::uniform_f32(7, n), data::uniform_f32(8, n));
    let v: Vec<f32> = data::uniform_f32(9, n).iter().map(|x| x * x).collect();
    let hp = adam_program::AdamParams {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        step: 2,
    };
    let flat: Bindings = adam_program::adam_args(&grads, &w, &m, &v, hp).into();
    let pieced = flat
        .clone()
        .tensor(
            "g",
            Binding::per_rank_pieces(&grads.iter().map(|g| split(g, &lens)).collect::<Vec<_>>()),
        )
        .tensor("w", Binding::pieces(&split(&w, &lens)))
        .tensor("m", Binding::pieces(&split(&m, &lens)))
        .tensor("v", Binding::pieces(&split(&v, &lens)));
    for s in candidates(p.program(), &[p.m.id(), p.v.id()]) {
        let plan = Plan::lower(&s, RANKS, flat.dims()).unwrap();
        let mut a = Job::new(&plan, &flat, RunOptions::default()).unwrap();
        let mut b = Job::new(&plan, &pieced, RunOptions::default()).unwrap();
        a.run().unwrap();
        b.run().unwrap();
        // w stays in 300 pieces on every rank (m and v are stored sliced by the sharded
        // schedules, so their blocks are plain buffers there).
        assert_eq!(b.input_pieces("w", 0), Some(300), "{}", s.name());
        assert_eq!(b.input_pieces("g", 2), Some(300), "{}", s.name());
        for name in ["w", "m", "v"] {
            let x: Vec<f32> = a.final_input(name).unwrap();
            let y: Vec<f32> = b.final_input(name).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&x), bits(&y), "{}: `{name}`", s.name());
        }
    }
}

#[test]
fn pieces_that_differ_between_ranks_are_an_error() {
    let p = adam_program::adam();
    let n = 10;
    let hp = adam_program::AdamParams {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        step: 1,
    };
    let z = vec![0.0f32; n];
    let args: Bindings = adam_program::adam_args(&[z.clone(), z.clone()], &z, &z, &z, hp).into();
    let bad = args.tensor(
        "g",
        Binding::per_rank_pieces(&[
            vec![vec![0.0f32; 4], vec![0.0; 6]],
            vec![vec![0.0f32; 5], vec![0.0; 5]],
        ]),
    );
    let plan = Plan::lower(&candidates(p.program(), &[])[0], 2, bad.dims()).unwrap();
    let err = Job::new(&plan, &bad, RunOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "binding: input `g`: rank 1's pieces have other lengths than rank 0's"
    );
}
