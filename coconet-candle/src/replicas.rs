//! Building a data-parallel trainer from a candle-nn model: replicas of a `VarMap` (the
//! original kept as replica 0, so it holds the trained weights), running each rank's
//! forward and backward pass on its own thread, and each rank's shard of a dataset.

use super::error::TrainError;
use candle_core::Var;
use candle_nn::VarMap;
use std::ops::Range;

/// `ranks` replicas of the model whose parameters `varmap` holds: replica 0 is `varmap`
/// itself (a handle to the same variables: whatever the trainer writes into replica 0,
/// the original `VarMap` sees — save it as before), the others deep copies under the
/// same names. Build rank r's model from `VarBuilder::from_varmap(&replicas[r], …)` and
/// hand the replicas to [`DataParallel::from_varmaps`](super::DataParallel::from_varmaps).
pub fn replicate(varmap: &VarMap, ranks: usize) -> Result<Vec<VarMap>, TrainError> {
    if ranks == 0 {
        return Err(TrainError::Mismatch("no ranks".into()));
    }
    let mut out = vec![varmap.clone()];
    let named = named_vars(varmap);
    for _ in 1..ranks {
        let copy = VarMap::new();
        {
            let mut data = copy.data().lock().unwrap_or_else(|e| e.into_inner());
            for (name, var) in &named {
                let fresh = Var::from_tensor(&var.as_tensor().copy()?)?;
                data.insert(name.clone(), fresh);
            }
        }
        out.push(copy);
    }
    Ok(out)
}

/// `varmap`'s variables in the order of their names: the order every replica's
/// parameters are bound in (a `VarMap`'s own order is a hash map's).
pub fn named_vars(varmap: &VarMap) -> Vec<(String, Var)> {
    let data = varmap.data().lock().unwrap_or_else(|e| e.into_inner());
    let mut named: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

/// Runs `f(rank)` for every rank on a thread of its own (each rank's forward and backward
/// pass, say) and returns the results in rank order, or the first rank's error. candle's
/// own kernels still use their thread pool inside each rank.
pub fn for_each_rank<T: Send>(
    ranks: usize,
    f: impl Fn(usize) -> Result<T, TrainError> + Sync,
) -> Result<Vec<T>, TrainError> {
    if ranks == 1 {
        return Ok(vec![f(0)?]);
    }
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks).map(|r| s.spawn(move || f(r))).collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                h.join().unwrap_or_else(|_| {
                    Err(TrainError::Mismatch(format!("rank {r}'s thread panicked")))
                })
            })
            .collect()
    })
}

/// Rank `rank`'s shard of `len` samples when `ranks` ranks share them: contiguous blocks,
/// the first `len % ranks` one sample longer (as coconet slices tensors), covering every
/// sample exactly once.
pub fn shard(len: usize, rank: usize, ranks: usize) -> Range<usize> {
    coconet_core::block_range(len, ranks.max(1), rank)
}
