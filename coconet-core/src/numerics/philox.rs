//! Philox-4x32-10 (Salmon et al., SC'11), the counter-based RNG behind `dropout`.
//!
//! Written out here (a dozen lines) rather than taken from a crate because every backend
//! must reproduce it bit for bit, including generated CUDA code; this file is the
//! specification they follow, pinned by the Random123 known-answer tests below.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// Philox-4x32 with 10 rounds of `ctr` under `key`.
pub fn philox4x32_10(mut ctr: [u32; 4], mut key: [u32; 2]) -> [u32; 4] {
    for round in 0..10 {
        if round > 0 {
            key = [key[0].wrapping_add(W0), key[1].wrapping_add(W1)];
        }
        let (hi0, lo0) = mulhilo(M0, ctr[0]);
        let (hi1, lo1) = mulhilo(M1, ctr[2]);
        ctr = [hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0];
    }
    ctr
}

/// The 32 random bits that decide whether logical element `index` survives dropout.
pub fn dropout_bits(seed: u64, index: u64) -> u32 {
    let ctr = [index as u32, (index >> 32) as u32, 0, 0];
    let key = [seed as u32, (seed >> 32) as u32];
    philox4x32_10(ctr, key)[0]
}

/// [`dropout_bits`] of eight indices at once: the same rounds written lane by lane, so
/// the compiler turns them into SIMD multiplies (a kernel's dropout stage draws a chunk
/// of elements, and the draw is most of its cost).
#[inline(always)]
pub fn dropout_bits_x8(seed: u64, index: [u64; 8]) -> [u32; 8] {
    let (mut c0, mut c1) = ([0u32; 8], [0u32; 8]);
    let (mut c2, mut c3) = ([0u32; 8], [0u32; 8]);
    for l in 0..8 {
        c0[l] = index[l] as u32;
        c1[l] = (index[l] >> 32) as u32;
    }
    let mut key = [seed as u32, (seed >> 32) as u32];
    for round in 0..10 {
        if round > 0 {
            key = [key[0].wrapping_add(W0), key[1].wrapping_add(W1)];
        }
        for l in 0..8 {
            let p0 = M0 as u64 * c0[l] as u64;
            let p1 = M1 as u64 * c2[l] as u64;
            let next = [
                (p1 >> 32) as u32 ^ c1[l] ^ key[0],
                p1 as u32,
                (p0 >> 32) as u32 ^ c3[l] ^ key[1],
                p0 as u32,
            ];
            (c0[l], c1[l], c2[l], c3[l]) = (next[0], next[1], next[2], next[3]);
        }
    }
    c0
}

/// Element `index` is kept iff `dropout_bits(seed, index) >= dropout_threshold(p)`, which
/// happens with probability `1 - p`. An integer threshold makes every backend agree exactly.
pub fn dropout_threshold(p: f64) -> u64 {
    (p * 4_294_967_296.0).ceil().clamp(0.0, 4_294_967_296.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The eight-lane draw is the scalar one, lane by lane.
    #[test]
    fn eight_lanes_draw_the_scalar_bits() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..1000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let seed = state;
            let index: [u64; 8] =
                std::array::from_fn(|l| state.rotate_left(7 * l as u32) >> (l * 3));
            let lanes = dropout_bits_x8(seed, index);
            for l in 0..8 {
                assert_eq!(lanes[l], dropout_bits(seed, index[l]), "lane {l}");
            }
        }
    }

    #[test]
    fn random123_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn keep_rate_is_one_minus_p() {
        let n = 200_000u64;
        let t = dropout_threshold(0.3);
        let kept = (0..n).filter(|&i| dropout_bits(7, i) as u64 >= t).count();
        let rate = kept as f64 / n as f64;
        assert!((rate - 0.7).abs() < 0.005, "keep rate {rate}");
        assert_eq!(dropout_threshold(0.0), 0);
    }
}
