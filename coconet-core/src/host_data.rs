//! Tensor data in host memory, kept in its own dtype.
//!
//! Bindings hold what the user passed as it was passed (a bf16 gradient stays 2 bytes
//! per element); backends copy its bytes straight into their buffers. Only the
//! reference interpreter converts to f64.

use crate::{DType, Element};
use half::{bf16, f16};

/// A vector of elements of one dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    /// `f16` elements.
    F16(Vec<f16>),
    /// `bf16` elements.
    BF16(Vec<bf16>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `f64` elements.
    F64(Vec<f64>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `bool` elements.
    Bool(Vec<bool>),
}

/// Applies `$body` to the vector inside `$data`, bound as `$v`.
macro_rules! each {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            HostData::F16($v) => $body,
            HostData::BF16($v) => $body,
            HostData::F32($v) => $body,
            HostData::F64($v) => $body,
            HostData::I32($v) => $body,
            HostData::I64($v) => $body,
            HostData::Bool($v) => $body,
        }
    };
}

/// Like [`each!`], rebuilding the same variant from the body's vector.
macro_rules! map_same {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            HostData::F16($v) => HostData::F16($body),
            HostData::BF16($v) => HostData::BF16($body),
            HostData::F32($v) => HostData::F32($body),
            HostData::F64($v) => HostData::F64($body),
            HostData::I32($v) => HostData::I32($body),
            HostData::I64($v) => HostData::I64($body),
            HostData::Bool($v) => HostData::Bool($body),
        }
    };
}

impl HostData {
    /// Wraps a vector of any element type (no copy).
    pub fn from_vec<T: Element>(v: Vec<T>) -> HostData {
        T::into_host(v)
    }

    /// The elements' dtype.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::F32(_) => DType::F32,
            HostData::F64(_) => DType::F64,
            HostData::I32(_) => DType::I32,
            HostData::I64(_) => DType::I64,
            HostData::Bool(_) => DType::Bool,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        each!(self, v => v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as `T`, which must be their dtype.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        T::host_slice(self)
    }

    /// The elements as f64 (exact for every dtype but i64 beyond 2^53).
    pub fn to_f64(&self) -> Vec<f64> {
        each!(self, v => v.iter().map(|x| x.to_f64()).collect())
    }

    /// The elements' bytes in memory (a bool is one byte, 0 or 1).
    pub fn as_bytes(&self) -> &[u8] {
        each!(self, v => {
            // SAFETY: every element type here is plain data without padding; the
            // slice covers exactly the vector's initialised elements.
            unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(&v[..])) }
        })
    }

    /// Block `range` along dim `d` of a tensor of `shape` stored in these elements.
    pub(crate) fn slice_dim(
        &self,
        shape: &[usize],
        d: usize,
        range: std::ops::Range<usize>,
    ) -> HostData {
        let inner: usize = shape[d + 1..].iter().product();
        let outer: usize = shape[..d].iter().product();
        let run = range.len() * inner;
        map_same!(self, v => {
            let mut out = Vec::with_capacity(outer * run);
            for o in 0..outer {
                let from = (o * shape[d] + range.start) * inner;
                out.extend_from_slice(&v[from..from + run]);
            }
            out
        })
    }
}

/// Conversions between [`Element`] vectors and [`HostData`], one per element type.
pub trait HostElement: Sized {
    /// Wraps a vector (no copy).
    fn into_host(v: Vec<Self>) -> HostData;
    /// The vector inside, if it holds this type.
    fn host_slice(h: &HostData) -> Option<&[Self]>;
}

macro_rules! host_element {
    ($t:ty, $variant:ident) => {
        impl HostElement for $t {
            fn into_host(v: Vec<Self>) -> HostData {
                HostData::$variant(v)
            }
            fn host_slice(h: &HostData) -> Option<&[Self]> {
                match h {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
host_element!(f16, F16);
host_element!(bf16, BF16);
host_element!(f32, F32);
host_element!(f64, F64);
host_element!(i32, I32);
host_element!(i64, I64);
host_element!(bool, Bool);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_dtype_and_slices_blocks() {
        let h = HostData::from_vec(vec![bf16::from_f32(1.5); 6]);
        assert_eq!(h.dtype(), DType::BF16);
        assert_eq!(h.as_bytes().len(), 12);
        let m = HostData::from_vec((0..6).map(|i| i as f32).collect::<Vec<_>>());
        // A [2, 3] tensor's columns 1..3.
        let block = m.slice_dim(&[2, 3], 1, 1..3);
        assert_eq!(block.as_slice::<f32>(), Some(&[1.0, 2.0, 4.0, 5.0][..]));
        assert_eq!(m.as_slice::<i32>(), None);
        assert_eq!(m.to_f64()[5], 5.0);
    }
}
