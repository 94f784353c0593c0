//! Typed buffers, and the symmetric-memory registry through which rank threads read and
//! write each other's buffers.
//!
//! Every rank owns its buffers; the registry hands out raw views of all of them to all
//! rank threads. Safety rests on the plan's discipline, which the executor follows: a
//! rank writes a peer's buffer only inside a collective step, only in the region that is
//! its own (its block of a gathered value), and collective steps begin and end with a
//! barrier, so no two ranks touch the same bytes between two barriers unless both read.

use coconet_core::{DType, Element};

/// A rank's buffer: elements of one dtype, 8-byte aligned.
#[derive(Debug, Clone)]
pub struct Buffer {
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    words: Vec<u64>,
}

impl Buffer {
    /// `len` zeroed elements.
    pub fn zeros(dtype: DType, len: usize) -> Buffer {
        let bytes = len * dtype.size_bytes();
        Buffer {
            dtype,
            len,
            words: vec![0; bytes.div_ceil(8)],
        }
    }

    /// A buffer holding `data` (already rounded to `dtype`).
    pub fn from_f64(dtype: DType, data: &[f64]) -> Buffer {
        let mut b = Buffer::zeros(dtype, data.len());
        b.raw().store(0, data);
        b
    }

    /// A raw view for the registry (crate-private: a `Raw` must not outlive its buffer).
    pub(crate) fn raw(&mut self) -> Raw {
        Raw {
            ptr: self.words.as_mut_ptr().cast(),
            len: self.len,
            dtype: self.dtype,
        }
    }

    /// The contents as f64.
    pub fn to_f64(&self) -> Vec<f64> {
        let raw = Raw {
            ptr: self.words.as_ptr().cast_mut().cast(),
            len: self.len,
            dtype: self.dtype,
        };
        let mut out = vec![0.0; self.len];
        raw.load(0, &mut out);
        out
    }

    /// The contents as `T` (which must be the buffer's dtype).
    pub fn to_vec<T: Element>(&self) -> Vec<T> {
        self.to_f64().into_iter().map(T::from_f64).collect()
    }
}

/// A raw, shareable view of a buffer (see the module docs for the rules).
#[derive(Debug, Clone, Copy)]
pub struct Raw {
    ptr: *mut u8,
    pub(crate) len: usize,
    pub(crate) dtype: DType,
}

// SAFETY: `Raw` is a pointer into a buffer that outlives every rank thread of a run (the
// job owns the buffers and joins the threads before touching them); concurrent access
// follows the barrier discipline described in the module docs.
unsafe impl Send for Raw {}
// SAFETY: as above.
unsafe impl Sync for Raw {}

macro_rules! typed {
    ($self:ident, $t:ident, $body:expr) => {
        match $self.dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F64 => {
                type $t = f64;
                $body
            }
            DType::F16 => {
                type $t = half::f16;
                $body
            }
            DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            DType::I32 => {
                type $t = i32;
                $body
            }
            DType::I64 => {
                type $t = i64;
                $body
            }
            DType::Bool => {
                type $t = u8;
                $body
            }
        }
    };
}

/// Conversion of stored elements to and from f64 (bool is stored as a byte).
trait Stored: Copy {
    fn get(self) -> f64;
    fn put(x: f64) -> Self;
}

macro_rules! stored_as {
    ($($t:ty),*) => {$(
        impl Stored for $t {
            #[inline(always)]
            fn get(self) -> f64 { self as f64 }
            #[inline(always)]
            fn put(x: f64) -> Self { x as $t }
        }
    )*};
}
stored_as!(f32, f64, i32, i64);

impl Stored for u8 {
    #[inline(always)]
    fn get(self) -> f64 {
        f64::from(self)
    }
    #[inline(always)]
    fn put(x: f64) -> Self {
        u8::from(x != 0.0)
    }
}

impl Stored for half::f16 {
    #[inline(always)]
    fn get(self) -> f64 {
        self.to_f64()
    }
    #[inline(always)]
    fn put(x: f64) -> Self {
        half::f16::from_f64(x)
    }
}

impl Stored for half::bf16 {
    #[inline(always)]
    fn get(self) -> f64 {
        self.to_f64()
    }
    #[inline(always)]
    fn put(x: f64) -> Self {
        half::bf16::from_f64(x)
    }
}

impl Raw {
    /// Number of elements.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Loads `out.len()` elements starting at `start`, as f64.
    #[inline]
    pub fn load(&self, start: usize, out: &mut [f64]) {
        assert!(start + out.len() <= self.len, "load out of bounds");
        typed!(self, T, {
            // SAFETY: in bounds (checked above); the buffer holds `len` elements of T.
            let src =
                unsafe { std::slice::from_raw_parts(self.ptr.cast::<T>().add(start), out.len()) };
            for (o, s) in out.iter_mut().zip(src) {
                *o = Stored::get(*s);
            }
        })
    }

    /// Stores `data` (rounded to the dtype by the conversion) starting at `start`.
    #[inline]
    pub fn store(&self, start: usize, data: &[f64]) {
        assert!(start + data.len() <= self.len, "store out of bounds");
        typed!(self, T, {
            // SAFETY: in bounds; writers of a region are exclusive between barriers.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(self.ptr.cast::<T>().add(start), data.len())
            };
            for (d, x) in dst.iter_mut().zip(data) {
                *d = <T as Stored>::put(*x);
            }
        })
    }

    /// The bytes of elements `start..start + n`.
    ///
    /// # Safety
    /// No other rank may write these elements while the slice lives.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub unsafe fn bytes(&self, start: usize, n: usize) -> &[u8] {
        assert!(start + n <= self.len, "bytes out of bounds");
        let size = self.dtype.size_bytes();
        // SAFETY: in bounds; the caller guarantees no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.ptr.add(start * size), n * size) }
    }

    /// The bytes of the whole buffer, to write into.
    ///
    /// # Safety
    /// No other rank may read or write the buffer while the slice lives.
    #[allow(clippy::mut_from_ref)]
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: the whole buffer; the caller guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len * self.dtype.size_bytes()) }
    }

    /// Loads one element.
    #[inline]
    pub fn get(&self, i: usize) -> f64 {
        let mut x = [0.0];
        self.load(i, &mut x);
        x[0]
    }

    /// Copies `n` elements from `src[src_start..]` to `self[dst_start..]` (same dtype).
    pub fn copy_from(&self, dst_start: usize, src: &Raw, src_start: usize, n: usize) {
        assert_eq!(self.dtype, src.dtype, "copy between dtypes");
        assert!(
            dst_start + n <= self.len && src_start + n <= src.len,
            "copy out of bounds"
        );
        let size = self.dtype.size_bytes();
        // SAFETY: both ranges are in bounds; they belong to different buffers or are
        // disjoint regions, per the barrier discipline.
        unsafe {
            std::ptr::copy(
                src.ptr.add(src_start * size),
                self.ptr.add(dst_start * size),
                n * size,
            );
        }
    }
}
