//! The parameter server: a CTR batch's pull and push (512 records × 26 Zipf-distributed
//! keys, rows of 9, Adagrad) by 1 and 2 concurrent workers, over 1, 2, 4 and 8 shards.
//! Throughput is in rows (keys pulled plus rows pushed).

// criterion_group! generates an undocumented pub fn.
#![allow(missing_docs)]

use coconet_heterps::data::{ParamServer, ParamServerConfig};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rand::SeedableRng;
use rand_distr::{Distribution, Zipf};

/// `batches` batches of 512 × 26 keys, Zipf over 1,000,001 rows.
fn batches(batches: usize, seed: u64) -> Vec<Vec<u64>> {
    let zipf = Zipf::new(1_000_001.0, 1.1).expect("valid");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..batches)
        .map(|_| {
            (0..512 * 26)
                .map(|_| zipf.sample(&mut rng) as u64 - 1)
                .collect()
        })
        .collect()
}

/// One worker's step against the table: pull the batch's distinct rows, push them.
fn step(ps: &ParamServer, keys: &[u64]) -> usize {
    let mut unique = keys.to_vec();
    unique.sort_unstable();
    unique.dedup();
    let rows = ps.pull(&unique);
    ps.push(&unique, &rows).expect("sizes match");
    2 * unique.len()
}

fn param_server(c: &mut Criterion) {
    let work: Vec<Vec<Vec<u64>>> = (0..2).map(|w| batches(8, w)).collect();
    let rows_per_round: usize = work[0]
        .iter()
        .map(|k| {
            let mut u = k.clone();
            u.sort_unstable();
            u.dedup();
            2 * u.len()
        })
        .sum();
    let mut group = c.benchmark_group("param_server");
    for clients in [1usize, 2] {
        group.throughput(Throughput::Elements((rows_per_round * clients) as u64));
        for shards in [1usize, 2, 4, 8] {
            let ps = ParamServer::new(ParamServerConfig {
                shards,
                ..ParamServerConfig::default()
            })
            .expect("valid");
            group.bench_function(
                format!("pull_push/{clients}_workers/{shards}_shards"),
                |b| {
                    b.iter(|| {
                        std::thread::scope(|s| {
                            for w in work.iter().take(clients) {
                                let ps = &ps;
                                s.spawn(move || w.iter().map(|k| step(ps, k)).sum::<usize>());
                            }
                        })
                    })
                },
            );
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = param_server
}
criterion_main!(benches);
