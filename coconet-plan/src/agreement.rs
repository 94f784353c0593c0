//! What the processes of a multi-process job must agree on, and the check that they do.
//!
//! Each process binds its own rank's data; a process given another program, other dims,
//! other scalars or another copy of a Replicated input would silently compute something
//! else. Every process fingerprints what must be equal (labelled hashes); the backend
//! gathers the fingerprints (MPI all-gather, the launcher's store) and every process
//! fails the same way, naming the first rank that differs from rank 0.

use crate::RuntimeError;
use crate::plan::Plan;
use coconet_core::{Layout, Op, ValueId};
use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

/// Labelled hashes of what every process must agree on: the program and schedule, the
/// dims, the contents of Replicated inputs (`replicated` feeds a tensor input's bytes to
/// the hasher, or returns false where this process has none), and the scalars.
pub fn fingerprint(
    plan: &Plan,
    rank: usize,
    replicated: &dyn Fn(ValueId, &mut DefaultHasher) -> bool,
    scalars: &HashMap<ValueId, f64>,
) -> Vec<(String, u64)> {
    let hash = |x: &dyn Fn(&mut DefaultHasher)| {
        let mut h = DefaultHasher::new();
        x(&mut h);
        h.finish()
    };
    let p = plan.program();
    let mut out = vec![
        (BOUND.to_string(), 0),
        (
            format!("the program and schedule (`{}`)", plan.schedule().name()),
            hash(&|h| {
                p.to_string().hash(h);
                plan.schedule().name().hash(h);
            }),
        ),
        (
            format!("the dims {:?}", plan.dims),
            hash(&|h| plan.dims.hash(h)),
        ),
    ];
    for id in p.ids() {
        let node = p.node(id);
        if node.op != Op::TensorInput || node.ty.layout != Layout::Replicated {
            continue;
        }
        // Only the input's holders (its group, in a program of several groups) must
        // agree on it; every process lists it, so fingerprints stay aligned.
        let mut h = DefaultHasher::new();
        let held = plan.holders(id).contains(&rank) && replicated(id, &mut h);
        out.push((
            format!("the Replicated input `{}`", p.label(id)),
            if held { h.finish() } else { NOT_HELD },
        ));
    }
    out.extend(scalar_fingerprint(plan, scalars));
    out
}

/// One hash of labelled values (their count and values in order): processes whose
/// digests are equal hold the same values (but for a 2^-64 chance).
pub fn digest(values: &[(String, u64)]) -> u64 {
    let mut h = DefaultHasher::new();
    values.len().hash(&mut h);
    for (_, v) in values {
        v.hash(&mut h);
    }
    h.finish()
}

/// The value of an entry a process does not hold (a Replicated input of another
/// group): not compared. (A real hash equal to it would only skip one comparison.)
const NOT_HELD: u64 = u64::MAX;

/// The first entry of every fingerprint: 0 where the process bound its inputs.
const BOUND: &str = "whether its inputs bound";

/// The fingerprint of a process whose own bindings failed (its own error says why): it
/// still takes part in the check, so that its peers fail too instead of waiting for it.
pub fn failed_to_bind() -> Vec<(String, u64)> {
    vec![(BOUND.to_string(), 1)]
}

/// The scalars' values, labelled.
pub fn scalar_fingerprint(plan: &Plan, scalars: &HashMap<ValueId, f64>) -> Vec<(String, u64)> {
    let p = plan.program();
    p.ids()
        .filter(|&id| p.node(id).op == Op::ScalarInput)
        .map(|id| {
            let x = scalars.get(&id).copied().unwrap_or(f64::NAN);
            (format!("the scalar `{}`", p.label(id)), x.to_bits())
        })
        .collect()
}

/// Compares every rank's fingerprint values (`all[r]`, in rank order) with rank 0's:
/// an error names the first rank and the first thing that differs.
pub fn compare(mine: &[(String, u64)], all: &[Vec<u64>]) -> Result<(), RuntimeError> {
    if let Some(r) = all.iter().position(|theirs| theirs.first() == Some(&1)) {
        return Err(RuntimeError::Plan(format!(
            "rank {r} could not bind its inputs (its own error says why)"
        )));
    }
    for (r, theirs) in all.iter().enumerate() {
        if theirs.len() != all[0].len() {
            return Err(RuntimeError::Plan(format!(
                "rank {r} runs another program than rank 0 ({} checked values, rank 0 has {})",
                theirs.len(),
                all[0].len()
            )));
        }
    }
    for i in 0..all.first().map_or(0, Vec::len) {
        // The first rank holding entry i is the reference for it.
        let Some(first) = all.iter().position(|a| a[i] != NOT_HELD) else {
            continue;
        };
        if let Some(r) =
            (0..all.len()).find(|&r| all[r][i] != NOT_HELD && all[r][i] != all[first][i])
        {
            let what = mine
                .get(i)
                .map_or("its inputs", |(label, _)| label.as_str());
            return Err(RuntimeError::Plan(format!(
                "rank {r} disagrees with rank {first} on {what}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_first_rank_and_item_that_differ() {
        let mine = vec![
            (BOUND.to_string(), 0),
            ("the dims".to_string(), 5),
            ("the scalar `lr`".to_string(), 7),
        ];
        assert!(compare(&mine, &[vec![0, 5, 7], vec![0, 5, 7]]).is_ok());
        let e = compare(&mine, &[vec![0, 5, 7], vec![0, 5, 7], vec![0, 5, 8]]).unwrap_err();
        assert!(
            e.to_string()
                .contains("rank 2 disagrees with rank 0 on the scalar `lr`"),
            "{e}"
        );
        // An entry a rank does not hold (another group's Replicated input) is not
        // compared; the holders are.
        assert!(compare(&mine, &[vec![0, 5, NOT_HELD], vec![0, 5, 7]]).is_ok());
        let e = compare(&mine, &[vec![0, 5, NOT_HELD], vec![0, 5, 7], vec![0, 5, 8]]).unwrap_err();
        assert!(
            e.to_string()
                .contains("rank 2 disagrees with rank 1 on the scalar `lr`"),
            "{e}"
        );
        let e = compare(&mine, &[vec![0, 5, 7], vec![0, 5]]).unwrap_err();
        assert!(e.to_string().contains("rank 1 runs another program"), "{e}");
        // Rank 0 itself failing to bind is named, not blamed on its peers.
        let e = compare(&failed_to_bind(), &[vec![1], vec![0, 5, 7]]).unwrap_err();
        assert!(e.to_string().contains("rank 0 could not bind"), "{e}");
    }
}
