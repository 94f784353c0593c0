//! Full reductions (sum, max, min, 2-norm of a tensor) in the one order every backend
//! follows: blocks of [`REDUCE_BLOCK`] elements, [`REDUCE_LANES`] lanes of eight, a lane
//! tree, then levels over the block results (see [`ReduceAcc`]) — the order a GPU block
//! per 2048 elements reduces in, so the CPU, the GPU and the interpreter agree bit for
//! bit; and the exact, order-free max and min.

/// Full reduction of a tensor to a scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    /// Sum of all elements.
    Sum,
    /// Largest element.
    Max,
    /// Smallest element.
    Min,
    /// Euclidean norm `sqrt(Σ x²)`.
    Norm2,
}

impl ReduceKind {
    /// All full reductions.
    pub const ALL: [ReduceKind; 4] = [
        ReduceKind::Sum,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::Norm2,
    ];

    /// Spelling in the DSL.
    pub fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "reduce_sum",
            ReduceKind::Max => "reduce_max",
            ReduceKind::Min => "reduce_min",
            ReduceKind::Norm2 => "norm2",
        }
    }

    /// Parses [`ReduceKind::name`].
    pub fn from_name(s: &str) -> Option<ReduceKind> {
        ReduceKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Reduces a list of exact values in the reference order (see [`ReduceAcc`]).
    pub fn eval(self, xs: &[f64]) -> f64 {
        let mut acc = ReduceAcc::new(self);
        acc.fold(0, xs);
        acc.finish()
    }
}

/// Lanes of a block of a full reduction (the threads of one GPU block).
pub const REDUCE_LANES: usize = 256;

/// Elements of a block of a full reduction: [`REDUCE_LANES`] lanes of eight.
pub const REDUCE_BLOCK: usize = 8 * REDUCE_LANES;

/// The identity of a full reduction's combination.
fn reduce_identity(kind: ReduceKind) -> f64 {
    match kind {
        ReduceKind::Sum | ReduceKind::Norm2 => -0.0,
        ReduceKind::Max => f64::NEG_INFINITY,
        ReduceKind::Min => f64::INFINITY,
    }
}

/// The larger of `a` and `b`, with -0 < +0, and NaN (the canonical quiet NaN) if either
/// is NaN — as torch's `max` and `all_reduce(MAX)`: a NaN gradient must not vanish in a
/// maximum (loss scaling looks for it). Commutative and associative, bit for bit, so a
/// maximum has one answer whatever the order.
pub fn max_exact(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a > b {
        a
    } else if b > a || a.is_sign_negative() {
        b
    } else {
        a
    }
}

/// The smaller of `a` and `b`, with -0 < +0, NaN if either is (see [`max_exact`]).
pub fn min_exact(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a < b {
        a
    } else if b < a || a.is_sign_positive() {
        b
    } else {
        a
    }
}

#[inline(always)]
fn combine(kind: ReduceKind, a: f64, b: f64) -> f64 {
    match kind {
        ReduceKind::Sum | ReduceKind::Norm2 => a + b,
        ReduceKind::Max => max_exact(a, b),
        ReduceKind::Min => min_exact(a, b),
    }
}

/// One level of the reduction tree: the lanes of its current block and how many values
/// it has received.
#[derive(Debug, Clone)]
struct Level {
    lanes: Vec<f64>,
    count: usize,
}

/// A full reduction in progress, in the reference order every backend follows (so full
/// reductions are bitwise equal everywhere). The values (elements, squared for a norm)
/// are cut into blocks of [`REDUCE_BLOCK`]; in a block, value j goes to lane
/// j mod [`REDUCE_LANES`], each lane folds its eight values in order from the identity
/// (-0 for sums, ∓∞ for max/min), and the lanes combine in a tree: lane l takes lane
/// l + 128, then l + 64, ..., down to lane 0. While more than one value is left, the
/// block results are reduced the same way; a norm takes the square root last. Max and
/// min use [`max_exact`]/[`min_exact`]. This is what a GPU block of 256 threads does
/// with coalesced loads and a shared-memory tree, and what a CPU does a row of 256
/// lanes at a time in SIMD registers.
#[derive(Debug, Clone)]
pub struct ReduceAcc {
    kind: ReduceKind,
    levels: Vec<Level>,
}

impl ReduceAcc {
    /// An empty reduction (empty sums and norms are -0, max -∞, min +∞).
    pub fn new(kind: ReduceKind) -> ReduceAcc {
        ReduceAcc {
            kind,
            levels: vec![],
        }
    }

    fn level(&mut self, k: usize) -> &mut Level {
        while self.levels.len() <= k {
            self.levels.push(Level {
                lanes: vec![reduce_identity(self.kind); REDUCE_LANES],
                count: 0,
            });
        }
        &mut self.levels[k]
    }

    /// The tree over a block's lanes.
    #[inline(always)]
    fn tree(combine: impl Fn(f64, f64) -> f64, lanes: &mut [f64]) -> f64 {
        let mut s = REDUCE_LANES / 2;
        while s > 0 {
            let (low, high) = lanes.split_at_mut(s);
            for (a, &b) in low.iter_mut().zip(&high[..s]) {
                *a = combine(*a, b);
            }
            s /= 2;
        }
        lanes[0]
    }

    /// Adds value `x` to level `k`, closing its block when full.
    fn push(&mut self, k: usize, x: f64) {
        let kind = self.kind;
        let level = self.level(k);
        let lane = level.count % REDUCE_LANES;
        level.lanes[lane] = combine(kind, level.lanes[lane], x);
        level.count += 1;
        if level.count.is_multiple_of(REDUCE_BLOCK) {
            self.close(k);
        }
    }

    /// Reduces level `k`'s current block and passes the result up.
    fn close(&mut self, k: usize) {
        let kind = self.kind;
        let level = &mut self.levels[k];
        let v = Self::tree(|a, b| combine(kind, a, b), &mut level.lanes);
        level.lanes.fill(reduce_identity(kind));
        self.push(k + 1, v);
    }

    /// Folds `xs`, the elements with indices `first..first + xs.len()` (chunks come one
    /// after the other, in index order).
    pub fn fold(&mut self, first: usize, xs: &[f64]) {
        debug_assert_eq!(first, self.levels.first().map_or(0, |l| l.count));
        self.fold_fast(xs);
    }

    /// [`ReduceAcc::fold`] of f32 elements, each widened exactly to f64 as it is folded
    /// (a CPU kernel's f32 register folds without an f64 copy of it).
    pub fn fold_f32(&mut self, first: usize, xs: &[f32]) {
        debug_assert_eq!(first, self.levels.first().map_or(0, |l| l.count));
        #[cfg(target_arch = "x86_64")]
        if matches!(self.kind, ReduceKind::Sum | ReduceKind::Norm2)
            && std::is_x86_feature_detected!("avx2")
        {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { self.fold_f32_blocks_avx2(xs) };
        }
        self.fold_fast(xs);
    }

    /// [`ReduceAcc::fold_f32`] of a sum or norm: whole blocks with each group of 16
    /// lanes held in registers over the block's eight rows (the row loop keeps all 256
    /// lanes in memory), the rest as [`ReduceAcc::fold`] does.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn fold_f32_blocks_avx2(&mut self, xs: &[f32]) {
        use std::arch::x86_64::{
            _mm_loadu_ps, _mm256_add_pd, _mm256_cvtps_pd, _mm256_mul_pd, _mm256_set1_pd,
            _mm256_storeu_pd,
        };
        let square = self.kind == ReduceKind::Norm2;
        self.level(0);
        let mut i = 0;
        while i < xs.len() {
            let at = self.levels[0].count;
            let to_block = at.next_multiple_of(REDUCE_BLOCK) - at;
            if to_block > 0 || xs.len() - i < REDUCE_BLOCK {
                // Up to the next block's start (or the end), element by element.
                let n = if to_block > 0 { to_block } else { REDUCE_BLOCK };
                let n = n.min(xs.len() - i);
                self.fold_any(&xs[i..i + n]);
                i += n;
                continue;
            }
            let block = &xs[i..i + REDUCE_BLOCK];
            let mut lanes = [0.0f64; REDUCE_LANES];
            for (g, out) in lanes.chunks_exact_mut(16).enumerate() {
                let mut acc = [_mm256_set1_pd(-0.0); 4];
                for row in 0..8 {
                    let at = row * REDUCE_LANES + g * 16;
                    for (k, a) in acc.iter_mut().enumerate() {
                        let x: &[f32; 4] = block[at + 4 * k..at + 4 * k + 4]
                            .try_into()
                            .expect("four elements");
                        // SAFETY: four f32 in bounds (an unaligned load).
                        let mut x = _mm256_cvtps_pd(unsafe { _mm_loadu_ps(x.as_ptr()) });
                        if square {
                            x = _mm256_mul_pd(x, x);
                        }
                        *a = _mm256_add_pd(*a, x);
                    }
                }
                for (k, a) in acc.iter().enumerate() {
                    let out: &mut [f64; 4] =
                        (&mut out[4 * k..4 * k + 4]).try_into().expect("four lanes");
                    // SAFETY: four f64 in bounds (an unaligned store).
                    unsafe { _mm256_storeu_pd(out.as_mut_ptr(), *a) };
                }
            }
            self.levels[0].count += REDUCE_BLOCK;
            i += REDUCE_BLOCK;
            let v = Self::tree(|a, b| a + b, &mut lanes);
            self.push(1, v);
        }
    }

    /// With AVX2 the row loop runs four f64 lanes per instruction (two without): the
    /// same operations in the same order, so the same bits.
    fn fold_fast<T: Copy + Into<f64>>(&mut self, xs: &[T]) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { self.fold_avx2(xs) };
        }
        self.fold_any(xs);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn fold_avx2<T: Copy + Into<f64>>(&mut self, xs: &[T]) {
        self.fold_any(xs);
    }

    /// One loop per kind, so each compiles to SIMD code.
    #[inline(always)]
    fn fold_any<T: Copy + Into<f64>>(&mut self, xs: &[T]) {
        match self.kind {
            ReduceKind::Sum => self.fold_rows(xs, |x| x.into(), |a, b| a + b),
            ReduceKind::Norm2 => self.fold_rows(
                xs,
                |x| {
                    let x: f64 = x.into();
                    x * x
                },
                |a, b| a + b,
            ),
            ReduceKind::Max => self.fold_rows(xs, |x| x.into(), max_exact),
            ReduceKind::Min => self.fold_rows(xs, |x| x.into(), min_exact),
        }
    }

    #[inline(always)]
    fn fold_rows<T: Copy>(
        &mut self,
        xs: &[T],
        f: impl Fn(T) -> f64,
        combine: impl Fn(f64, f64) -> f64,
    ) {
        self.level(0);
        let mut i = 0;
        while i < xs.len() {
            let level = &mut self.levels[0];
            if level.count.is_multiple_of(REDUCE_LANES) && xs.len() - i >= REDUCE_LANES {
                // A whole row: one value per lane (the compiler vectorises this).
                let row = &xs[i..i + REDUCE_LANES];
                for (lane, &x) in level.lanes.iter_mut().zip(row) {
                    *lane = combine(*lane, f(x));
                }
                level.count += REDUCE_LANES;
                i += REDUCE_LANES;
                if level.count.is_multiple_of(REDUCE_BLOCK) {
                    self.close(0);
                }
            } else {
                self.push(0, f(xs[i]));
                i += 1;
            }
        }
    }

    /// The result.
    pub fn finish(&self) -> f64 {
        let mut acc = self.clone();
        let mut k = 0;
        let s = loop {
            let Some(level) = acc.levels.get(k) else {
                break reduce_identity(acc.kind); // nothing was folded
            };
            if level.count == 1 {
                break level.lanes[0];
            }
            if !level.count.is_multiple_of(REDUCE_BLOCK) {
                acc.close(k);
            }
            k += 1;
        };
        match self.kind {
            ReduceKind::Norm2 => s.sqrt(),
            _ => s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BinaryOp, ReduceOp};

    /// The reference order written out recursively: blocks of 2048, lanes by index
    /// mod 256 within a block, the lane tree, then the same over block results.
    fn reference(kind: ReduceKind, xs: &[f64]) -> f64 {
        let c = |a: f64, b: f64| combine(kind, a, b);
        let mut vals: Vec<f64> = match kind {
            ReduceKind::Norm2 => xs.iter().map(|x| x * x).collect(),
            _ => xs.to_vec(),
        };
        loop {
            let blocks: Vec<f64> = vals
                .chunks(REDUCE_BLOCK)
                .map(|b| {
                    let mut lanes = vec![reduce_identity(kind); REDUCE_LANES];
                    for (j, &x) in b.iter().enumerate() {
                        lanes[j % REDUCE_LANES] = c(lanes[j % REDUCE_LANES], x);
                    }
                    let mut s = REDUCE_LANES / 2;
                    while s > 0 {
                        for l in 0..s {
                            lanes[l] = c(lanes[l], lanes[l + s]);
                        }
                        s /= 2;
                    }
                    lanes[0]
                })
                .collect();
            if blocks.len() <= 1 {
                let v = blocks.first().copied().unwrap_or(reduce_identity(kind));
                return if kind == ReduceKind::Norm2 {
                    v.sqrt()
                } else {
                    v
                };
            }
            vals = blocks;
        }
    }

    /// Any split into chunks folds to the reference's bits, for lengths around the
    /// block and level boundaries; empty reductions.
    #[test]
    fn full_reductions_follow_the_reference_order_in_any_chunking() {
        for n in [
            0,
            1,
            2,
            255,
            256,
            257,
            2047,
            2048,
            2049,
            5000,
            2048 * 2048 + 3,
        ] {
            let xs: Vec<f64> = (0..n)
                .map(|i| ((i * 37 % 101) as f64 - 50.0) / 7.0 * 1.0001f64.powi((i % 5000) as i32))
                .collect();
            for kind in [
                ReduceKind::Sum,
                ReduceKind::Norm2,
                ReduceKind::Max,
                ReduceKind::Min,
            ] {
                let want = reference(kind, &xs);
                assert_eq!(kind.eval(&xs).to_bits(), want.to_bits(), "{kind:?} n={n}");
                if n > 10_000 {
                    continue;
                }
                for cuts in [
                    vec![1, 2, 3],
                    vec![7, 500],
                    vec![256, 300, 1000],
                    vec![2049],
                ] {
                    let mut acc = ReduceAcc::new(kind);
                    let mut at = 0;
                    for c in cuts.into_iter().map(|c| c.min(n)).chain([n]) {
                        acc.fold(at, &xs[at..c]);
                        at = c;
                    }
                    assert_eq!(acc.finish().to_bits(), want.to_bits(), "{kind:?} n={n}");
                }
            }
        }
        let xs: Vec<f64> = (0..5000).map(|i| (i as f64).sin()).collect();
        let exact: f64 = xs.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((ReduceKind::Norm2.eval(&xs) - exact).abs() <= 1e-12 * exact);
        assert_eq!(ReduceKind::Sum.eval(&[]).to_bits(), (-0.0f64).to_bits());
        assert_eq!(ReduceKind::Norm2.eval(&[]).to_bits(), (-0.0f64).to_bits());
        assert_eq!(ReduceKind::Max.eval(&[]), f64::NEG_INFINITY);
        assert_eq!(ReduceKind::Min.eval(&[]), f64::INFINITY);
    }

    /// f32 elements folded as they are (whole blocks in registers where the CPU has
    /// AVX2) give the bits of the same elements widened and folded, in any chunking,
    /// with blocks starting mid-chunk and signed zeros, infinities and NaN among them.
    #[test]
    fn f32_folds_are_the_widened_folds() {
        for n in [0, 5, 2048, 2049, 3 * 2048 + 700, 9 * 2048 + 1] {
            let mut xs: Vec<f32> = (0..n)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 3.0 * 1.001f32.powi((i % 300) as i32))
                .collect();
            let wide = |xs: &[f32]| xs.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
            for special in [None, Some(-0.0f32), Some(f32::INFINITY), Some(f32::NAN)] {
                if let (Some(x), true) = (special, n > 4000) {
                    xs[4000] = x;
                    xs[n - 1] = -x;
                }
                for kind in [
                    ReduceKind::Sum,
                    ReduceKind::Norm2,
                    ReduceKind::Max,
                    ReduceKind::Min,
                ] {
                    let mut want = ReduceAcc::new(kind);
                    want.fold(0, &wide(&xs));
                    let want = want.finish();
                    for cuts in [vec![], vec![7, 2055, 4100], vec![2048, 4096], vec![1]] {
                        let mut acc = ReduceAcc::new(kind);
                        let mut at = 0;
                        for c in cuts.into_iter().map(|c| c.min(n)).chain([n]) {
                            acc.fold_f32(at, &xs[at..c]);
                            at = c;
                        }
                        assert_eq!(
                            acc.finish().to_bits(),
                            want.to_bits(),
                            "{kind:?} n={n} {special:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn max_and_min_do_not_depend_on_order() {
        let vals = [
            0.0,
            -0.0,
            f64::NAN,
            1.0,
            -1.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        for a in vals {
            for b in vals {
                for (f, name) in [
                    (max_exact as fn(f64, f64) -> f64, "max"),
                    (min_exact, "min"),
                ] {
                    assert_eq!(f(a, b).to_bits(), f(b, a).to_bits(), "{name}({a}, {b})");
                    for c in vals {
                        assert_eq!(
                            f(f(a, b), c).to_bits(),
                            f(a, f(b, c)).to_bits(),
                            "{name} of {a}, {b}, {c}"
                        );
                    }
                }
            }
        }
        assert_eq!(max_exact(-0.0, 0.0).to_bits(), 0.0f64.to_bits());
        assert_eq!(min_exact(0.0, -0.0).to_bits(), (-0.0f64).to_bits());
        // NaN propagates, as the canonical quiet NaN whatever the operand's payload.
        let odd_nan = f64::from_bits(0x7ff8_0000_0000_1234);
        for (x, y) in [(odd_nan, 2.0), (2.0, odd_nan), (f64::NAN, f64::INFINITY)] {
            assert_eq!(max_exact(x, y).to_bits(), f64::NAN.to_bits());
            assert_eq!(min_exact(x, y).to_bits(), f64::NAN.to_bits());
        }
        assert!(ReduceOp::Max.combine(1.0, f64::NAN).is_nan());
        assert!(BinaryOp::Min.eval(f64::NAN, 1.0, false).is_nan());
    }
}
