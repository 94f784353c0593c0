//! Plain row-major array helpers for the interpreter (and backends): slicing a block along a dim,
//! concatenating blocks, and numpy-broadcast evaluation. Deliberately simple.

/// Elements of a shape.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Rows `range` along `dim` of a row-major array of `shape`.
pub fn slice_dim(
    data: &[f64],
    shape: &[usize],
    dim: usize,
    range: std::ops::Range<usize>,
) -> Vec<f64> {
    let outer = numel(&shape[..dim]);
    let len = shape[dim];
    let inner = numel(&shape[dim + 1..]);
    let mut out = Vec::with_capacity(outer * range.len() * inner);
    for o in 0..outer {
        let base = o * len * inner;
        out.extend_from_slice(&data[base + range.start * inner..base + range.end * inner]);
    }
    out
}

/// Concatenates blocks along `dim`; `blocks[i]` has shape `shape` with `dim` = its length.
pub fn concat_dim(blocks: &[(&[f64], usize)], shape: &[usize], dim: usize) -> Vec<f64> {
    let outer = numel(&shape[..dim]);
    let inner = numel(&shape[dim + 1..]);
    let mut out = Vec::with_capacity(numel(shape));
    for o in 0..outer {
        for (data, rows) in blocks {
            out.extend_from_slice(&data[o * rows * inner..(o + 1) * rows * inner]);
        }
    }
    out
}

/// Evaluates `f` elementwise over operands broadcast (numpy rules, trailing-aligned) to
/// `out_shape`. Returns `None` if an operand's shape does not broadcast.
pub fn broadcast_map(
    out_shape: &[usize],
    operands: &[(&[f64], &[usize])],
    f: impl Fn(&[f64]) -> f64,
) -> Option<Vec<f64>> {
    let rr = out_shape.len();
    // Per operand: stride for each output dim (0 where broadcast or absent).
    let mut strides = Vec::with_capacity(operands.len());
    for (_, s) in operands {
        if s.len() > rr {
            return None;
        }
        let mut st = vec![0usize; rr];
        let mut acc = 1;
        for k in (0..s.len()).rev() {
            let od = k + rr - s.len();
            if s[k] == out_shape[od] && s[k] != 1 {
                st[od] = acc;
            } else if s[k] != 1 {
                return None;
            }
            acc *= s[k];
        }
        strides.push(st);
    }
    let n = numel(out_shape);
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; rr];
    let mut args = vec![0.0; operands.len()];
    for _ in 0..n {
        for (j, (data, _)) in operands.iter().enumerate() {
            let off: usize = idx.iter().zip(&strides[j]).map(|(i, s)| i * s).sum();
            args[j] = data[off];
        }
        out.push(f(&args));
        for k in (0..rr).rev() {
            idx[k] += 1;
            if idx[k] < out_shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_and_concat_are_inverse() {
        let shape = [2, 5, 3];
        let data: Vec<f64> = (0..30).map(f64::from).collect();
        let a = slice_dim(&data, &shape, 1, 0..3);
        let b = slice_dim(&data, &shape, 1, 3..5);
        assert_eq!(a[..3], [0.0, 1.0, 2.0]);
        assert_eq!(b[..3], [9.0, 10.0, 11.0]);
        assert_eq!(concat_dim(&[(&a, 3), (&b, 2)], &shape, 1), data);
    }

    #[test]
    fn broadcast_bias_over_rows() {
        let x = [1.0, 2.0, 3.0, 4.0];
        let b = [10.0, 20.0];
        let out = broadcast_map(&[2, 2], &[(&x, &[2, 2]), (&b, &[2])], |a| a[0] + a[1]).unwrap();
        assert_eq!(out, vec![11.0, 22.0, 13.0, 24.0]);
        assert!(broadcast_map(&[2, 2], &[(&b, &[3])], |a| a[0]).is_none());
    }
}
