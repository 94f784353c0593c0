//! Rank-local matrix products by faer: f32 and f64, and f16 and bf16 through f32 (their
//! values are f32 values; the products accumulate in f32, as a GPU's tensor cores and
//! the `gemm` crate's f16 kernels do, and round to the dtype once). Single-threaded: the
//! rank threads are the parallelism.
//!
//! f16 went through `gemm`'s native f16 kernels until faer's f32 product measured 2×
//! faster on every shape of the Megatron layer (e.g. [1024, 512] × [512, 1024]: 15 →
//! 7.8 ms), with the rounding to f16 done by slice conversions.
//!
//! Unlike pointwise work, products are not bitwise equal to the reference interpreter's
//! (which sums in f64, in index order): they sum in the dtype's working precision in a
//! blocked order, as every BLAS and cuBLAS do. The backend suite's matmul tolerance covers
//! the difference. The product of a block of rows equals the same rows of the whole
//! product only up to that same tolerance, so every backend computes a given schedule's
//! matmul with the same blocking.

use coconet_core::DType;
use faer::{Accum, MatMut, MatRef, Par};
use std::ops::Range;

/// A matrix `[rows, k]` or `[k, n]` in the precision its product runs in.
#[derive(Debug)]
enum Data {
    F64(Vec<f64>),
    F32(Vec<f32>),
}

impl Data {
    /// `values` (of a tensor of `dtype`) in the working precision of `dtype`'s products.
    fn new(dtype: DType, values: &[f64]) -> Data {
        match dtype {
            d if in_f32(d) => Data::F32(values.iter().map(|&x| x as f32).collect()),
            _ => Data::F64(values.to_vec()),
        }
    }
}

/// Whether products of `dtype` run in f32 (f32, f16, bf16: their values are f32 values).
pub fn in_f32(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// `a × b` for row-major `a` `[M, K]` and `b` `[K, N]`, computable by blocks of rows.
#[derive(Debug)]
pub struct MatMul {
    dtype: DType,
    a: Data,
    b: Data,
    k: usize,
    n: usize,
}

impl MatMul {
    /// The product of `a` (`[M, k]`) and `b` (`[k, n]`), values of tensors of `dtype`, the
    /// result's dtype.
    pub fn new(dtype: DType, a: &[f64], b: &[f64], k: usize, n: usize) -> MatMul {
        assert_eq!(b.len(), k * n, "matmul: b is [k, n]");
        assert!(a.len().is_multiple_of(k.max(1)), "matmul: a is [M, k]");
        MatMul {
            dtype,
            a: Data::new(dtype, a),
            b: Data::new(dtype, b),
            k,
            n,
        }
    }

    /// The product of f32, f16 or bf16 operands already widened to f32 (`a` `[M, k]`,
    /// `b` `[k, n]`): no round trip through f64.
    pub fn narrow(dtype: DType, a: Vec<f32>, b: Vec<f32>, k: usize, n: usize) -> MatMul {
        assert!(in_f32(dtype), "{dtype:?} products run in f64");
        assert_eq!(b.len(), k * n, "matmul: b is [k, n]");
        assert!(a.len().is_multiple_of(k.max(1)), "matmul: a is [M, k]");
        MatMul {
            dtype,
            a: Data::F32(a),
            b: Data::F32(b),
            k,
            n,
        }
    }

    /// Rows `rows` of a product that runs in f32 (see [`in_f32`]; made by either
    /// constructor) into `out` (`[rows.len(), n]`), as f32 values rounded to the dtype.
    pub fn rows_f32(&self, rows: Range<usize>, out: &mut [f32]) {
        let (m, k, n) = (rows.len(), self.k, self.n);
        assert_eq!(out.len(), m * n, "matmul: out is [rows, n]");
        let (Data::F32(av), Data::F32(bv)) = (&self.a, &self.b) else {
            unreachable!("rows_f32 of a product that runs in f64")
        };
        if m == 0 || n == 0 {
            return;
        }
        faer_product((&av[rows.start * k..rows.end * k], bv, out), (m, k, n), 1.0);
        self.dtype.round_f32_slice(out);
    }

    /// Rows `rows` of the product into `out` (`[rows.len(), n]`, row-major), rounded to
    /// the dtype.
    pub fn rows(&self, rows: Range<usize>, out: &mut [f64]) {
        let (m, k, n) = (rows.len(), self.k, self.n);
        assert_eq!(out.len(), m * n, "matmul: out is [rows, n]");
        if m == 0 || n == 0 {
            return;
        }
        let a = rows.start * k..rows.end * k;
        match (&self.a, &self.b) {
            (Data::F64(av), Data::F64(bv)) => {
                faer_product((&av[a], bv, out), (m, k, n), 1.0);
                if self.dtype != DType::F64 {
                    out.iter_mut().for_each(|x| *x = self.dtype.round(*x));
                }
            }
            (Data::F32(..), Data::F32(..)) => {
                let mut o = vec![0f32; m * n];
                self.rows_f32(rows, &mut o);
                out.iter_mut().zip(o).for_each(|(x, y)| *x = y as f64);
            }
            _ => unreachable!("both operands are converted alike"),
        }
    }
}

/// `out = a × b` (row-major `[m, k]`, `[k, n]`, `[m, n]`) by faer.
fn faer_product<T: faer::traits::ComplexField>(
    (a, b, out): (&[T], &[T], &mut [T]),
    (m, k, n): (usize, usize, usize),
    one: T,
) {
    let a = MatRef::from_row_major_slice(a, m, k);
    let b = MatRef::from_row_major_slice(b, k, n);
    let c = MatMut::from_row_major_slice_mut(out, m, n);
    faer::linalg::matmul::matmul(c, Accum::Replace, a, b, one, Par::Seq);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Products of every dtype against the f64 product in index order (the interpreter's),
    /// within the working precision; blocks of rows agree with the whole product.
    #[test]
    fn products_match_the_exact_product_within_working_precision() {
        let (m, k, n) = (37, 129, 23);
        let value = |i: usize| ((i * 7919 % 1000) as f64 - 500.0) / 256.0;
        for (dtype, tol) in [
            (DType::F64, 1e-12),
            (DType::F32, 1e-5),
            (DType::BF16, 1e-2),
            (DType::F16, 2e-3),
        ] {
            let a: Vec<f64> = (0..m * k).map(|i| dtype.round(value(i))).collect();
            let b: Vec<f64> = (0..k * n).map(|i| dtype.round(value(i + 5))).collect();
            let product = MatMul::new(dtype, &a, &b, k, n);
            let mut whole = vec![0.0; m * n];
            product.rows(0..m, &mut whole);
            for i in 0..m {
                for j in 0..n {
                    let exact: f64 = (0..k).map(|t| a[i * k + t] * b[t * n + j]).sum();
                    let scale: f64 = (0..k).map(|t| (a[i * k + t] * b[t * n + j]).abs()).sum();
                    let got = whole[i * n + j];
                    assert_eq!(got, dtype.round(got), "{dtype:?}: rounded to the dtype");
                    assert!(
                        (got - exact).abs() <= tol * scale.max(1.0),
                        "{dtype:?} [{i}, {j}]: {got} vs {exact}"
                    );
                }
            }
            let mut block = vec![0.0; 5 * n];
            product.rows(10..15, &mut block);
            for (x, y) in block.iter().zip(&whole[10 * n..15 * n]) {
                assert!((x - y).abs() <= tol * y.abs().max(1.0), "{dtype:?} block");
            }
        }
    }

    /// Empty dims: no rows, no columns, and an empty inner dim (a zero product).
    #[test]
    fn empty_dims() {
        let p = MatMul::new(DType::F32, &[], &[], 0, 3);
        let mut out = vec![1.0; 6];
        p.rows(0..2, &mut out);
        assert_eq!(out, vec![0.0; 6]);
        let p = MatMul::new(DType::F16, &[], &[], 0, 2);
        let mut out = vec![1.0; 2];
        p.rows(0..1, &mut out);
        assert_eq!(out, vec![0.0; 2]);
        let p = MatMul::new(DType::F64, &[1.0, 2.0], &[], 2, 0);
        p.rows(0..1, &mut []);
    }
}
