//! Per-type batch sizes: how a layer's time, memory and boundary transfers scale when a
//! type's replicas step with a batch other than the model's.
//!
//! A model is profiled at one batch `B` (its `batch_size`), but the right batch differs
//! by hardware: small on a CPU, large on a GPU, where a tiny layer's time is mostly fixed
//! cost (kernel launches, framework dispatch) that a larger batch spreads over more
//! samples. A type with batch `b` (ratio `s = b / B`) is modelled as follows:
//!
//! * **time** is affine in the batch: `c(b) = o + (c − o)·s`, with `o = min(overhead, c)`
//!   the type's fixed per-layer cost (the catalogue's `layer_overhead_us`) and `c` the
//!   profiled seconds per batch of `B`. The roofline part scales with the samples, the
//!   fixed part does not. A measured profile is scaled the same way, so a measured
//!   time's fixed share is taken to be the catalogue's overhead;
//! * **memory** keeps the parameters and optimizer state and scales the activations a
//!   replica keeps for the backward pass: `m(b) = m − a' + a'·s` with `a'` the layer's
//!   `activation_memory_bytes` (by default `2·a`, the activation and its gradient,
//!   [`crate::model::default_memory_bytes`]'s share; `34·s·b·h` for a transformer
//!   block);
//! * **transfers** at a stage's boundaries move `a·s` bytes per batch each way (the
//!   activation bytes per sample do not change);
//! * **synchronisation** still moves the stage's dense parameters once per step, so a
//!   larger batch synchronises less often per sample; throughput is `k·b / T(k)`.
//!
//! Stages of different batches meet at a boundary where the larger batch gathers
//! several smaller ones (and the gradients are split back), which costs no extra time in
//! the model. What a larger batch does to convergence (statistical efficiency) is not
//! priced: the user chooses the batches, the planner prices them.
//!
//! A batch, the model's or a type's, is at most [`MAX_BATCH_SIZE`] = 2^32 samples: far
//! beyond any real one, and so what a larger number in a file is taken for, a mistake
//! (`batch_size = 18446744073709551615` planned 1.76e22 samples/s).

/// The largest batch a model or a type may step with: 2^32 = 4,294,967,296 samples
/// (see the module docs). Samples are counted in f64, exact far beyond it.
pub const MAX_BATCH_SIZE: f64 = 4_294_967_296.0;

/// The fixed part of `time` seconds per batch on a type whose per-layer overhead is
/// `overhead`: at most the whole time.
fn fixed(time: f64, overhead: f64) -> f64 {
    overhead.clamp(0.0, time.max(0.0))
}

/// Seconds per batch at `ratio` times the profiled batch, from `time` at the profiled
/// batch: `o + (time − o)·ratio` (see the module docs).
pub fn scale_time(time: f64, overhead: f64, ratio: f64) -> f64 {
    if ratio == 1.0 {
        return time;
    }
    let o = fixed(time, overhead);
    o + (time - o) * ratio
}

/// Bytes one replica of a layer needs at `ratio` times the profiled batch, from `memory`
/// at the profiled batch, `kept` of it activations (see the module docs).
pub fn scale_memory(memory: f64, kept: f64, ratio: f64) -> f64 {
    if ratio == 1.0 {
        return memory;
    }
    let kept = kept.min(memory);
    memory - kept + kept * ratio
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_keeps_its_fixed_part_and_scales_the_rest() {
        // 100 µs per batch, 60 µs of it fixed: 8× the batch is 60 + 8·40 = 380 µs.
        let t = scale_time(100e-6, 60e-6, 8.0);
        assert!((t - 380e-6).abs() < 1e-15, "{t}");
        // A time below the overhead is all fixed: the batch changes nothing.
        assert_eq!(scale_time(30e-6, 60e-6, 8.0), 30e-6);
        // No overhead: linear.
        assert!((scale_time(2.0, 0.0, 0.25) - 0.5).abs() < 1e-15);
        // The profiled batch is the profile, to the bit.
        assert_eq!(scale_time(0.1 + 0.2, 60e-6, 1.0), 0.1 + 0.2);
    }

    #[test]
    fn memory_scales_only_the_activations() {
        // 4 GB of state + 2 GB of activations; twice the batch adds 2 GB.
        assert_eq!(scale_memory(6e9, 2e9, 2.0), 8e9);
        assert_eq!(scale_memory(6e9, 2e9, 0.5), 5e9);
        // Activations beyond the memory are capped at it: it scales as a whole.
        assert_eq!(scale_memory(1e9, 2e9, 3.0), 3e9);
    }
}
