//! Planner benchmarks (filled in with the schedulers).

fn main() {}
