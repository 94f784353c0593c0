//! The shipped benchmark cases the examples share: each shipped model with the three
//! required throughputs (samples/s) BENCHMARKS.md reports it at.

/// (model file in `data/`, three required throughputs in samples/s).
pub const CASES: [(&str, [f64; 3]); 5] = [
    ("ctr-dnn", [2e5, 2e6, 2e7]),
    ("two-tower", [2e4, 2e5, 2e6]),
    ("word2vec-nce", [1e5, 1e6, 1e7]),
    ("bert-large", [100.0, 400.0, 1600.0]),
    ("gpt-96", [10.0, 20.0, 40.0]),
];
