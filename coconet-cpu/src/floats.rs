//! Floats of every kind for the tests of bit-exact kernels: random bit patterns
//! (subnormals, huge values, NaN), values near 1, signed zeros and infinities.

/// `n` floats from `seed`, cycling through the kinds above element by element.
pub(crate) fn every_kind(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed | 1;
    let specials = [0.0, -0.0, 1.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
    (0..n)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            match i % 4 {
                0 => f32::from_bits(state as u32),
                1 => 1.0 + (state % 1_000_000) as f32 * 1e-6,
                2 => specials[(state % 6) as usize],
                _ => (state % 2000) as f32 * 1e-3 - 1.0,
            }
        })
        .collect()
}
