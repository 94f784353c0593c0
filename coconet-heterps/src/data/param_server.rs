//! A sharded parameter server for embedding tables.
//!
//! Rows are hash-partitioned over [`ParamServerConfig::shards`] shards, each behind its
//! own lock, so workers pulling and pushing different rows rarely wait for each other.
//! A worker *pulls* the rows its batch touches and *pushes* their gradients; the shard
//! that owns a row applies the sparse optimizer to it (Adagrad: only rows a batch touched
//! change, as with torch's `Adagrad` on a sparse gradient). A row comes into existence on
//! first touch with values drawn from `(seed, key)` alone, so results do not depend on
//! the number of shards or on which worker touched the row first.

use super::error::DataError;
use super::mix::mix;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Adagrad per element of a row: `acc += g²; w -= lr · g / (√acc + eps)` (torch's
/// `Adagrad` without decay).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adagrad {
    /// Step size.
    pub learning_rate: f32,
    /// Starting value of every accumulator.
    pub initial_accumulator: f32,
    /// Added to the root of the accumulator.
    pub eps: f32,
}

impl Default for Adagrad {
    fn default() -> Self {
        Adagrad {
            learning_rate: 0.05,
            initial_accumulator: 0.0,
            eps: 1e-10,
        }
    }
}

/// The table's shape and optimizer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamServerConfig {
    /// Shards the rows are partitioned over.
    pub shards: usize,
    /// Elements per row (the embedding dimension).
    pub dim: usize,
    /// New rows are uniform in `[-init_scale, init_scale]`.
    pub init_scale: f32,
    /// Seed of the new rows' values.
    pub seed: u64,
    /// The sparse optimizer.
    pub optimizer: Adagrad,
}

impl Default for ParamServerConfig {
    /// PaddleRec's CTR-DNN table: rows of 9.
    fn default() -> Self {
        ParamServerConfig {
            shards: 4,
            dim: 9,
            init_scale: 0.05,
            seed: 0,
            optimizer: Adagrad::default(),
        }
    }
}

/// One shard: its rows, their optimizer state, and its traffic.
#[derive(Debug, Default)]
struct Shard {
    /// Key → row index into `values` and `accum` (rows of `dim`).
    index: HashMap<u64, usize>,
    values: Vec<f32>,
    accum: Vec<f32>,
    pulled: u64,
    pushed: u64,
}

/// What one shard holds and has served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardStats {
    /// Rows that exist.
    pub rows: usize,
    /// Rows served by pulls (a row pulled twice counts twice).
    pub pulled: u64,
    /// Row gradients applied (duplicates in one push count once).
    pub pushed: u64,
}

/// The embedding table, sharded, in this process.
#[derive(Debug)]
pub struct ParamServer {
    config: ParamServerConfig,
    shards: Vec<Mutex<Shard>>,
}

/// The values a row of `key` starts with.
fn initial(key: u64, c: &ParamServerConfig) -> impl Iterator<Item = f32> + '_ {
    (0..c.dim).map(move |j| {
        let unit = (mix(c.seed, key, j as u64) >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * unit - 1.0) * c.init_scale
    })
}

impl Shard {
    /// The row of `key`, created with its initial values if new.
    fn row(&mut self, key: u64, c: &ParamServerConfig) -> usize {
        if let Some(&r) = self.index.get(&key) {
            return r;
        }
        let r = self.index.len();
        self.index.insert(key, r);
        self.values.extend(initial(key, c));
        self.accum
            .extend(std::iter::repeat_n(c.optimizer.initial_accumulator, c.dim));
        r
    }
}

impl ParamServer {
    /// An empty table.
    pub fn new(config: ParamServerConfig) -> Result<ParamServer, DataError> {
        if config.shards == 0 || config.dim == 0 {
            return Err(DataError::Invalid(format!(
                "a parameter server needs at least one shard and one element per row (shards {}, dim {})",
                config.shards, config.dim
            )));
        }
        let shards = (0..config.shards).map(|_| Mutex::default()).collect();
        Ok(ParamServer { config, shards })
    }

    /// The configuration.
    pub fn config(&self) -> &ParamServerConfig {
        &self.config
    }

    /// The shard that owns `key`.
    pub fn shard_of(&self, key: u64) -> usize {
        (mix(0x5eed, key, 0) % self.shards.len() as u64) as usize
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        // Every update of a shard completes before its lock is released unless memory
        // runs out mid-row; a poisoned shard is still consistent row by row.
        self.shards[shard].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Positions of `keys` grouped by owning shard.
    fn by_shard(&self, keys: &[u64]) -> Vec<Vec<usize>> {
        let mut groups = vec![Vec::new(); self.shards.len()];
        for (i, &k) in keys.iter().enumerate() {
            groups[self.shard_of(k)].push(i);
        }
        groups
    }

    /// The rows of `keys`, concatenated (`keys.len() × dim` values); a row never pushed
    /// reads as its initial values and is not created (pushes create rows). Counted as
    /// traffic. Each shard is locked once.
    pub fn pull(&self, keys: &[u64]) -> Vec<f32> {
        self.read_rows(keys, true)
    }

    /// The rows of `keys` like [`ParamServer::pull`], but without counting traffic
    /// (evaluation): a row never pushed reads as its initial values.
    pub fn lookup(&self, keys: &[u64]) -> Vec<f32> {
        self.read_rows(keys, false)
    }

    /// The rows of `keys`, counted as pulled traffic if `count`. A row is created by the
    /// first push to it, not by a read: a read of keys nobody trains (a worker's bug, a
    /// probe) costs no memory, and an absent row reads as the initial values its push
    /// would create it with.
    fn read_rows(&self, keys: &[u64], count: bool) -> Vec<f32> {
        let dim = self.config.dim;
        let mut out = vec![0.0; keys.len() * dim];
        for (s, positions) in self.by_shard(keys).into_iter().enumerate() {
            if positions.is_empty() {
                continue;
            }
            let mut shard = self.lock(s);
            if count {
                shard.pulled += positions.len() as u64;
            }
            for i in positions {
                let dst = &mut out[i * dim..(i + 1) * dim];
                match shard.index.get(&keys[i]) {
                    Some(&r) => dst.copy_from_slice(&shard.values[r * dim..(r + 1) * dim]),
                    None => dst
                        .iter_mut()
                        .zip(initial(keys[i], &self.config))
                        .for_each(|(d, v)| *d = v),
                }
            }
        }
        out
    }

    /// Applies the gradients `grads` (`keys.len() × dim`, row `i` for `keys[i]`) with
    /// the optimizer. Gradients of a key that appears several times are summed first
    /// (one optimizer step per row per push, as for a coalesced sparse gradient).
    pub fn push(&self, keys: &[u64], grads: &[f32]) -> Result<(), DataError> {
        self.push_merged(&[(keys, grads)], 1.0)
    }

    /// One synchronous step's pushes from every worker, in worker order: the gradients
    /// of each row are summed over all pushes (in that order, so the result does not
    /// depend on which worker finished first), multiplied by `scale` (`1 / workers`: the
    /// mean over workers, as the dense gradients are averaged) and applied as one
    /// optimizer step per row. Every push is checked before anything changes.
    pub fn push_merged(&self, pushes: &[(&[u64], &[f32])], scale: f32) -> Result<(), DataError> {
        let dim = self.config.dim;
        for (w, (keys, grads)) in pushes.iter().enumerate() {
            if grads.len() != keys.len() * dim {
                return Err(DataError::Invalid(format!(
                    "push {w}: {} keys need {} gradient values ({} per row), got {}",
                    keys.len(),
                    keys.len() * dim,
                    dim,
                    grads.len()
                )));
            }
        }
        let total: usize = pushes.iter().map(|(k, _)| k.len()).sum();
        let mut unique: HashMap<u64, usize> = HashMap::with_capacity(total);
        let mut summed_keys = Vec::with_capacity(total);
        let mut summed: Vec<f32> = Vec::with_capacity(total * dim);
        for (keys, grads) in pushes {
            for (i, &k) in keys.iter().enumerate() {
                let g = &grads[i * dim..(i + 1) * dim];
                match unique.get(&k) {
                    Some(&u) => summed[u * dim..(u + 1) * dim]
                        .iter_mut()
                        .zip(g)
                        .for_each(|(s, g)| *s += g),
                    None => {
                        unique.insert(k, summed_keys.len());
                        summed_keys.push(k);
                        summed.extend_from_slice(g);
                    }
                }
            }
        }
        if scale != 1.0 {
            summed.iter_mut().for_each(|g| *g *= scale);
        }
        let opt = self.config.optimizer;
        for (s, positions) in self.by_shard(&summed_keys).into_iter().enumerate() {
            if positions.is_empty() {
                continue;
            }
            let mut shard = self.lock(s);
            for u in positions {
                let r = shard.row(summed_keys[u], &self.config);
                let g = &summed[u * dim..(u + 1) * dim];
                let Shard { values, accum, .. } = &mut *shard;
                let (w, acc) = (
                    &mut values[r * dim..(r + 1) * dim],
                    &mut accum[r * dim..(r + 1) * dim],
                );
                for ((w, acc), &g) in w.iter_mut().zip(acc.iter_mut()).zip(g) {
                    *acc += g * g;
                    *w -= opt.learning_rate * g / (acc.sqrt() + opt.eps);
                }
                shard.pushed += 1;
            }
        }
        Ok(())
    }

    /// Each shard's rows and traffic so far.
    pub fn stats(&self) -> Vec<ShardStats> {
        (0..self.shards.len())
            .map(|s| {
                let shard = self.lock(s);
                ShardStats {
                    rows: shard.index.len(),
                    pulled: shard.pulled,
                    pushed: shard.pushed,
                }
            })
            .collect()
    }

    /// Every row and its optimizer state, sorted by key: what a checkpoint saves.
    pub fn export(&self) -> TableSnapshot {
        let dim = self.config.dim;
        let mut rows: Vec<(u64, usize, usize)> = Vec::new();
        let shards: Vec<MutexGuard<'_, Shard>> =
            (0..self.shards.len()).map(|s| self.lock(s)).collect();
        for (s, shard) in shards.iter().enumerate() {
            rows.extend(shard.index.iter().map(|(&k, &r)| (k, s, r)));
        }
        rows.sort_unstable_by_key(|row| row.0);
        let mut snapshot = TableSnapshot {
            dim,
            keys: Vec::with_capacity(rows.len()),
            values: Vec::with_capacity(rows.len() * dim),
            accum: Vec::with_capacity(rows.len() * dim),
        };
        for (k, s, r) in rows {
            snapshot.keys.push(k);
            snapshot
                .values
                .extend_from_slice(&shards[s].values[r * dim..(r + 1) * dim]);
            snapshot
                .accum
                .extend_from_slice(&shards[s].accum[r * dim..(r + 1) * dim]);
        }
        snapshot
    }

    /// Replaces every row with those of `snapshot` (a checkpoint's), traffic counters
    /// reset. The snapshot is checked first: on an error the table is unchanged.
    pub fn restore(&self, snapshot: &TableSnapshot) -> Result<(), DataError> {
        let dim = self.config.dim;
        let n = snapshot.keys.len();
        if snapshot.dim != dim
            || snapshot.values.len() != n * dim
            || snapshot.accum.len() != n * dim
        {
            return Err(DataError::Invalid(format!(
                "a table snapshot of {n} rows of {} ({} values, {} accumulators) does not fit a table with rows of {dim}",
                snapshot.dim,
                snapshot.values.len(),
                snapshot.accum.len()
            )));
        }
        let mut seen = std::collections::HashSet::with_capacity(n);
        if let Some(k) = snapshot.keys.iter().find(|&&k| !seen.insert(k)) {
            return Err(DataError::Invalid(format!(
                "a table snapshot holds key {k} twice"
            )));
        }
        let mut shards: Vec<MutexGuard<'_, Shard>> =
            (0..self.shards.len()).map(|s| self.lock(s)).collect();
        shards.iter_mut().for_each(|s| **s = Shard::default());
        for (i, &k) in snapshot.keys.iter().enumerate() {
            let shard = &mut shards[self.shard_of(k)];
            let r = shard.index.len();
            shard.index.insert(k, r);
            shard
                .values
                .extend_from_slice(&snapshot.values[i * dim..(i + 1) * dim]);
            shard
                .accum
                .extend_from_slice(&snapshot.accum[i * dim..(i + 1) * dim]);
        }
        Ok(())
    }
}

/// A table's rows and optimizer state, flat and sorted by key.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSnapshot {
    /// Elements per row.
    pub dim: usize,
    /// The rows' keys, ascending.
    pub keys: Vec<u64>,
    /// The rows' values, `dim` per key.
    pub values: Vec<f32>,
    /// The rows' Adagrad accumulators, `dim` per key.
    pub accum: Vec<f32>,
}

impl TableSnapshot {
    /// The rows whose key `keep` accepts (e.g. one server's part of a table).
    pub fn rows_where(&self, keep: impl Fn(u64) -> bool) -> TableSnapshot {
        let mut part = TableSnapshot {
            dim: self.dim,
            keys: Vec::new(),
            values: Vec::new(),
            accum: Vec::new(),
        };
        let d = self.dim;
        for (i, &k) in self.keys.iter().enumerate() {
            if keep(k) {
                part.keys.push(k);
                part.values
                    .extend_from_slice(&self.values[i * d..(i + 1) * d]);
                part.accum
                    .extend_from_slice(&self.accum[i * d..(i + 1) * d]);
            }
        }
        part
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The same table as one dense array: every row initialised, Adagrad applied to the
    /// summed gradient of each touched row.
    struct Dense {
        values: Vec<f32>,
        accum: Vec<f32>,
    }

    #[test]
    fn pulls_and_pushes_match_a_dense_table_for_any_shard_count() {
        let vocabulary = 50u64;
        let base = ParamServerConfig {
            dim: 3,
            seed: 9,
            ..ParamServerConfig::default()
        };
        let one = ParamServer::new(ParamServerConfig {
            shards: 1,
            ..base.clone()
        })
        .unwrap();
        let all: Vec<u64> = (0..vocabulary).collect();
        let init = one.pull(&all);
        let mut dense = Dense {
            values: init.clone(),
            accum: vec![0.0; init.len()],
        };
        let servers: Vec<ParamServer> = [1, 3, 7]
            .iter()
            .map(|&shards| {
                ParamServer::new(ParamServerConfig {
                    shards,
                    ..base.clone()
                })
                .unwrap()
            })
            .collect();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let opt = base.optimizer;
        for _ in 0..20 {
            // A batch with repeated keys, as a batch's categories have.
            let keys: Vec<u64> = (0..12).map(|_| rng.random_range(0..vocabulary)).collect();
            let grads: Vec<f32> = (0..keys.len() * 3)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let mut sum: HashMap<u64, Vec<f32>> = HashMap::new();
            for (i, &k) in keys.iter().enumerate() {
                let e = sum.entry(k).or_insert_with(|| vec![0.0; 3]);
                e.iter_mut()
                    .zip(&grads[i * 3..i * 3 + 3])
                    .for_each(|(s, g)| *s += g);
            }
            for (k, g) in sum {
                for (j, g) in g.iter().enumerate() {
                    let x = k as usize * 3 + j;
                    dense.accum[x] += g * g;
                    dense.values[x] -= opt.learning_rate * g / (dense.accum[x].sqrt() + opt.eps);
                }
            }
            for ps in &servers {
                let pulled = ps.pull(&keys);
                for (i, &k) in keys.iter().enumerate() {
                    assert_eq!(
                        pulled[i * 3..i * 3 + 3],
                        ps.pull(&[k])[..],
                        "a pull returns the same row wherever it sits in the batch"
                    );
                }
                ps.push(&keys, &grads).unwrap();
            }
        }
        for ps in &servers {
            assert_eq!(ps.pull(&all), dense.values, "{} shards", ps.config().shards);
            let stats = ps.stats();
            assert_eq!(
                stats.iter().map(|s| s.rows).sum::<usize>(),
                vocabulary as usize
            );
            if stats.len() > 1 {
                assert!(stats.iter().all(|s| s.rows > 0), "every shard owns rows");
            }
        }
        let fresh = [vocabulary + 1, 3];
        assert_eq!(servers[1].lookup(&fresh)[3..], servers[1].pull(&[3])[..]);
        assert_eq!(
            servers[1].lookup(&fresh)[..3],
            one.pull(&[vocabulary + 1])[..]
        );
        let snapshot = servers[1].export();
        assert_eq!(snapshot.keys, all);
        assert_eq!(snapshot.accum, dense.accum);
        // Restored into a table of another shard count, it reads the same.
        servers[2].restore(&snapshot).unwrap();
        assert_eq!(servers[2].export(), snapshot);
        assert_eq!(servers[2].pull(&all), dense.values);
        let mut torn = snapshot.clone();
        torn.accum.pop();
        assert!(servers[0].restore(&torn).is_err());
        assert_eq!(
            servers[0].export(),
            snapshot,
            "a bad snapshot changes nothing"
        );
    }

    #[test]
    fn a_push_with_the_wrong_gradient_size_is_an_error_and_changes_nothing() {
        let ps = ParamServer::new(ParamServerConfig::default()).unwrap();
        let before = ps.pull(&[1, 2]);
        let e = ps.push(&[1, 2], &[0.5; 17]).unwrap_err().to_string();
        assert!(
            e.contains("2 keys need 18 gradient values (9 per row), got 17"),
            "{e}"
        );
        assert_eq!(ps.pull(&[1, 2]), before);
        assert!(
            ParamServer::new(ParamServerConfig {
                shards: 0,
                ..ParamServerConfig::default()
            })
            .is_err()
        );
    }

    /// Pulls create no rows (a pull of 100,000 keys nobody trains costs no memory); the
    /// first push creates a row from the same initial values the pull returned.
    #[test]
    fn rows_are_created_by_pushes_not_pulls() {
        let ps = ParamServer::new(ParamServerConfig::default()).unwrap();
        let dim = ps.config().dim;
        let keys: Vec<u64> = (0..100_000).collect();
        let pulled = ps.pull(&keys);
        assert_eq!(pulled, ps.lookup(&keys));
        assert_eq!(ps.stats().iter().map(|s| s.rows).sum::<usize>(), 0);
        assert_eq!(ps.stats().iter().map(|s| s.pulled).sum::<u64>(), 100_000);
        let fresh = ParamServer::new(ParamServerConfig::default()).unwrap();
        ps.push(&[7], &vec![0.5; dim]).unwrap();
        fresh.push(&[7], &vec![0.5; dim]).unwrap();
        assert_eq!(ps.stats().iter().map(|s| s.rows).sum::<usize>(), 1);
        assert_eq!(
            ps.pull(&[7]),
            fresh.pull(&[7]),
            "a row pulled first trains the same"
        );
    }
}
