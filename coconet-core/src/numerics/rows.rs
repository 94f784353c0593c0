//! Row sums and layer normalisation in the order of a GPU block of [`ROW_LANES`] threads
//! per row, which every backend reproduces.

/// Lanes of a layer-norm row's sums: lane l adds the row's elements l, l + `ROW_LANES`,
/// l + 2·`ROW_LANES`, ... in order from −0, then the lanes combine as a tree (lane l
/// adds lane l + s for s = `ROW_LANES`/2, ..., 1). It is the order of a GPU block of
/// `ROW_LANES` threads per row, with coalesced loads and a shared-memory reduction; every
/// backend sums in it, so all agree bit for bit.
pub const ROW_LANES: usize = 256;

/// `f(0) + ... + f(n − 1)` in the order of [`ROW_LANES`].
pub fn row_sum(n: usize, f: impl Fn(usize) -> f64) -> f64 {
    let mut lanes = [-0.0f64; ROW_LANES];
    for c in 0..n {
        lanes[c % ROW_LANES] += f(c);
    }
    // Lanes at or past `width` still hold −0 (adding it changes nothing), so the tree
    // skips them: short rows cost what they hold.
    let mut width = n.min(ROW_LANES);
    let mut s = ROW_LANES / 2;
    while s > 0 {
        for l in 0..s.min(width.saturating_sub(s)) {
            lanes[l] += lanes[l + s];
        }
        width = width.min(s);
        s /= 2;
    }
    lanes[0]
}

/// Layer normalisation of one row: `(x - mean) / sqrt(var + eps) * gamma + beta`, with
/// the biased variance, both sums in the order of [`row_sum`]. `gamma` and `beta` are
/// indexed like `row` (the single definition shared by the interpreter and the backends).
pub fn layer_norm_row(row: &[f64], gamma: &[f64], beta: &[f64], eps: f64, out: &mut [f64]) {
    let h = row.len() as f64;
    let mean = row_sum(row.len(), |c| row[c]) / h;
    let var = row_sum(row.len(), |c| {
        let d = row[c] - mean;
        d * d
    }) / h;
    let inv = 1.0 / (var + eps).sqrt();
    for (i, (o, v)) in out.iter_mut().zip(row).enumerate() {
        *o = (v - mean) * inv * gamma[i] + beta[i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `row_sum` equals the full tree over every lane (what a GPU block computes),
    /// including signed zeros and rows shorter than a block.
    #[test]
    fn row_sum_is_the_full_lane_tree() {
        let full = |xs: &[f64]| {
            let mut lanes = vec![-0.0f64; ROW_LANES];
            for (c, &x) in xs.iter().enumerate() {
                lanes[c % ROW_LANES] += x;
            }
            let mut s = ROW_LANES / 2;
            while s > 0 {
                for l in 0..s {
                    lanes[l] += lanes[l + s];
                }
                s /= 2;
            }
            lanes[0]
        };
        for n in [0, 1, 2, 3, 7, 100, 255, 256, 257, 513, 1024, 5000] {
            let xs: Vec<f64> = (0..n)
                .map(|i| ((i * 7919 % 1013) as f64 - 506.0) * 1.000001f64.powi(i as i32) / 3.0)
                .collect();
            assert_eq!(
                row_sum(n, |c| xs[c]).to_bits(),
                full(&xs).to_bits(),
                "n = {n}"
            );
            let zeros = vec![-0.0; n];
            assert_eq!(row_sum(n, |c| zeros[c]).to_bits(), full(&zeros).to_bits());
        }
    }
}
