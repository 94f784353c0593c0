//! Instances to measure planners on: the synthetic chain of any length (four resource
//! types, layers of three kinds, optional caps) that the benches, examples and scale
//! tests share, and the shipped models at the throughputs BENCHMARKS.md reports. A
//! scheduler of one's own is compared on the same instances.

pub mod cases;
pub mod chain;
