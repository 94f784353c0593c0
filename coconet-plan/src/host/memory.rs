//! Typed buffers, and the symmetric-memory registry through which rank threads read and
//! write each other's buffers.
//!
//! Every rank owns its buffers; the registry hands out raw views of all of them to all
//! rank threads. Safety rests on the plan's discipline, which the executor follows: a
//! rank writes a peer's buffer only inside a collective step, only in the region that is
//! its own (its block of a gathered value), and collective steps begin and end with a
//! barrier, so no two ranks touch the same bytes between two barriers unless both read.

use coconet_core::{DType, Element, HostData};
use half::slice::HalfFloatSliceExt;

/// A rank's buffer: elements of one dtype, 8-byte aligned.
/// Not `Clone`: a pieced buffer's table points into its own pieces.
#[derive(Debug)]
pub struct Buffer {
    pub dtype: DType,
    pub len: usize,
    words: Words,
    /// For a tensor bound as separate pieces: each piece's memory, and where it sits.
    parts: Vec<Vec<u64>>,
    table: Vec<Seg>,
}

// SAFETY: a buffer's raw pointers point into its own heap allocations or its place in
// shared memory (neither moves when the buffer does); sharing `&Buffer` only reads.
unsafe impl Send for Buffer {}
// SAFETY: as above.
unsafe impl Sync for Buffer {}

/// A plain buffer's memory: its own allocation, or a place in memory shared with the
/// job's other processes (see [`Buffer::place`]), which outlives the buffer.
#[derive(Debug)]
enum Words {
    Own(Vec<u64>),
    Placed(*mut u64),
}

impl Words {
    fn as_ptr(&self) -> *const u64 {
        match self {
            Words::Own(v) => v.as_ptr(),
            Words::Placed(p) => *p,
        }
    }

    fn as_mut_ptr(&mut self) -> *mut u64 {
        match self {
            Words::Own(v) => v.as_mut_ptr(),
            Words::Placed(p) => *p,
        }
    }
}

/// One piece of a pieced buffer: elements `start..start + len` live at `ptr`.
#[derive(Debug, Clone, Copy)]
pub struct Seg {
    ptr: *mut u8,
    start: usize,
    len: usize,
}

impl Seg {
    /// Elements `start..start + len` of a view, living at `ptr`.
    pub fn new(ptr: *mut u8, start: usize, len: usize) -> Seg {
        Seg { ptr, start, len }
    }
}

impl Buffer {
    /// `len` zeroed elements.
    pub fn zeros(dtype: DType, len: usize) -> Buffer {
        let bytes = len * dtype.size_bytes();
        Buffer {
            dtype,
            len,
            words: Words::Own(zeroed_words(bytes.div_ceil(8)).expect("memory for a buffer")),
            parts: Vec::new(),
            table: Vec::new(),
        }
    }

    /// `len` zeroed elements, or `None` if the memory cannot be allocated (instead of
    /// aborting the process, as a failed `vec!` does).
    pub fn try_zeros(dtype: DType, len: usize) -> Option<Buffer> {
        let bytes = len.checked_mul(dtype.size_bytes())?;
        Some(Buffer {
            dtype,
            len,
            words: Words::Own(zeroed_words(bytes.div_ceil(8))?),
            parts: Vec::new(),
            table: Vec::new(),
        })
    }

    /// A buffer made of separately allocated pieces of the given lengths, holding
    /// `data` (their concatenation, in the buffer's dtype): kernels and collectives
    /// address it by logical index and never flatten it. `None` if the memory cannot be
    /// allocated.
    pub fn pieces(data: &HostData, lens: &[usize]) -> Option<Buffer> {
        let dtype = data.dtype();
        let mut parts: Vec<Vec<u64>> = lens
            .iter()
            .map(|&n| zeroed_words((n * dtype.size_bytes()).div_ceil(8)))
            .collect::<Option<_>>()?;
        let mut start = 0;
        let table = parts
            .iter_mut()
            .zip(lens)
            .map(|(p, &len)| {
                let seg = Seg {
                    ptr: p.as_mut_ptr().cast(),
                    start,
                    len,
                };
                start += len;
                seg
            })
            .collect();
        let b = Buffer {
            dtype,
            len: data.len(),
            words: Words::Own(Vec::new()),
            parts,
            table,
        };
        let (bytes, size) = (data.as_bytes(), dtype.size_bytes());
        for seg in &b.table {
            let from = &bytes[seg.start * size..(seg.start + seg.len) * size];
            // SAFETY: the piece holds `seg.len` elements of `size` bytes.
            unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), seg.ptr, from.len()) };
        }
        Some(b)
    }

    /// Moves the buffer's contents to `at` and keeps them there from now on (memory
    /// shared with the job's other processes, which read and write it directly). A
    /// pieced buffer's pieces go one after the other, so that the elements lie as in a
    /// plain buffer: its raw view is then plain (what peers see), while its pieces stay
    /// addressable one by one.
    ///
    /// # Safety
    /// `at` must be 8-byte aligned, hold the buffer's bytes, overlap no other buffer,
    /// and stay valid until the buffer is dropped.
    pub unsafe fn place(&mut self, at: *mut u8) {
        let size = self.dtype.size_bytes();
        if self.table.is_empty() {
            let bytes = self.len * size;
            // SAFETY: the buffer holds `bytes` bytes; the caller vouches for `at`.
            unsafe { std::ptr::copy_nonoverlapping(self.words.as_ptr().cast::<u8>(), at, bytes) };
        } else {
            for seg in &mut self.table {
                // SAFETY: the piece holds `seg.len` elements, which land at their place
                // in the buffer's logical order inside `at`'s bytes.
                unsafe {
                    let to = at.add(seg.start * size);
                    std::ptr::copy_nonoverlapping(seg.ptr, to, seg.len * size);
                    seg.ptr = to;
                }
            }
            // The pieces' own memory is no longer pointed into.
            self.parts = Vec::new();
        }
        self.words = Words::Placed(at.cast());
    }

    /// The bytes a plain buffer occupies, rounded up to whole words (its size in shared
    /// memory).
    pub fn word_bytes(&self) -> usize {
        (self.len * self.dtype.size_bytes()).next_multiple_of(8)
    }

    /// Number of pieces (1 for a plain buffer).
    pub fn piece_count(&self) -> usize {
        self.table.len().max(1)
    }

    /// A buffer holding `data` (already rounded to `dtype`).
    pub fn from_f64(dtype: DType, data: &[f64]) -> Buffer {
        let mut b = Buffer::zeros(dtype, data.len());
        b.store(0, data);
        b
    }

    /// A buffer holding a copy of `data`'s bytes, in its dtype (no conversion), or
    /// `None` if the memory cannot be allocated.
    pub fn try_from_host(data: &HostData) -> Option<Buffer> {
        let mut b = Buffer::try_zeros(data.dtype(), data.len())?;
        let bytes = data.as_bytes();
        // SAFETY: the buffer's words hold at least `bytes.len()` bytes (same dtype and
        // length; a bool is one byte, 0 or 1, as buffers store it).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                b.words.as_mut_ptr().cast::<u8>(),
                bytes.len(),
            )
        };
        Some(b)
    }

    /// [`Buffer::from_f64`], or `None` if the memory cannot be allocated.
    pub fn try_from_f64(dtype: DType, data: &[f64]) -> Option<Buffer> {
        let mut b = Buffer::try_zeros(dtype, data.len())?;
        b.store(0, data);
        Some(b)
    }

    /// A raw view for the registry.
    ///
    /// # Safety
    /// The memory must stay allocated, and not move, while the view or a copy of it is
    /// used; threads sharing the view follow the barrier discipline of the module docs.
    /// [`Raw`]'s safe accessors rely on both.
    pub unsafe fn raw(&mut self) -> Raw {
        if let Words::Placed(at) = self.words {
            // Placed pieces lie one after the other (see `place`).
            // SAFETY: the caller's promise for this buffer covers its placed memory.
            return unsafe { Raw::from_addr(at.cast(), self.len, self.dtype) };
        }
        Raw {
            ptr: self.words.as_mut_ptr().cast(),
            len: self.len,
            dtype: self.dtype,
            segs: self.table.as_ptr(),
            nsegs: self.table.len(),
        }
    }

    /// Writes `data` (rounded to the dtype) from element `start` on.
    pub fn store(&mut self, start: usize, data: &[f64]) {
        // SAFETY: the view lives only for this call, which holds the buffer exclusively.
        unsafe { self.raw() }.store(start, data);
    }

    /// Copies every element into `dst` (of the same dtype and length).
    pub fn copy_all_to(&mut self, dst: &mut Buffer) {
        // SAFETY: both views live only for this call, which holds both buffers
        // exclusively.
        unsafe { self.raw().copy_all_to(&dst.raw()) }
    }

    /// The contents as f64.
    pub fn to_f64(&self) -> Vec<f64> {
        let raw = Raw {
            ptr: self.words.as_ptr().cast_mut().cast(),
            len: self.len,
            dtype: self.dtype,
            segs: self.table.as_ptr(),
            nsegs: self.table.len(),
        };
        let mut out = vec![0.0; self.len];
        raw.load(0, &mut out);
        out
    }

    /// The contents as `T` (which must be the buffer's dtype).
    pub fn to_vec<T: Element>(&self) -> Vec<T> {
        self.to_f64().into_iter().map(T::from_f64).collect()
    }

    /// Feeds the stored bytes (piece by piece) to `h`: processes compare Replicated
    /// inputs by hash instead of sending them.
    pub fn hash_contents(&self, h: &mut impl std::hash::Hasher) {
        let size = self.dtype.size_bytes();
        for i in 0..self.piece_count() {
            if let Some((ptr, len)) = self.piece_words(i) {
                // SAFETY: the piece holds `len` initialised elements of `size` bytes.
                h.write(unsafe { std::slice::from_raw_parts(ptr.cast_const(), len * size) });
            }
        }
    }

    /// Overwrites the contents with `bytes` (exactly the buffer's size, in its dtype),
    /// piece after piece.
    pub fn write_bytes(&mut self, bytes: &[u8]) {
        let size = self.dtype.size_bytes();
        assert_eq!(bytes.len(), self.len * size, "write of the wrong size");
        let mut at = 0;
        for i in 0..self.piece_count() {
            let (ptr, len) = match self.table.is_empty() {
                true => (self.words.as_mut_ptr().cast::<u8>(), self.len),
                false => (self.table[i].ptr, self.table[i].len),
            };
            // SAFETY: the piece holds `len` elements of `size` bytes; `bytes` has them.
            unsafe { std::ptr::copy_nonoverlapping(bytes[at..].as_ptr(), ptr, len * size) };
            at += len * size;
        }
    }

    /// The lengths of a pieced buffer's pieces (one length for a plain buffer).
    pub fn piece_lens(&self) -> Vec<usize> {
        if self.table.is_empty() {
            vec![self.len]
        } else {
            self.table.iter().map(|s| s.len).collect()
        }
    }

    /// Piece `i`'s memory and length (the whole buffer is piece 0 of a plain buffer).
    fn piece_words(&self, i: usize) -> Option<(*mut u8, usize)> {
        if self.table.is_empty() {
            (i == 0).then(|| (self.words.as_ptr().cast_mut().cast(), self.len))
        } else {
            self.table.get(i).map(|s| (s.ptr, s.len))
        }
    }

    /// Piece `i` as a slice of `T`, which must be the buffer's dtype (`None` otherwise,
    /// or if there is no such piece). A plain buffer is one piece.
    pub fn piece<T: Element>(&self, i: usize) -> Option<&[T]> {
        if T::DTYPE != self.dtype {
            return None;
        }
        let (ptr, len) = self.piece_words(i)?;
        // SAFETY: the piece holds `len` elements of the buffer's dtype, which is T (a bool
        // buffer holds only 0 and 1 bytes, valid bools); its words are 8-byte aligned.
        Some(unsafe { std::slice::from_raw_parts(ptr.cast::<T>().cast_const(), len) })
    }

    /// Piece `i` as a mutable slice of `T` (see [`Buffer::piece`]).
    pub fn piece_mut<T: Element>(&mut self, i: usize) -> Option<&mut [T]> {
        if T::DTYPE != self.dtype {
            return None;
        }
        let (ptr, len) = match self.table.is_empty() {
            true => (i == 0).then(|| (self.words.as_mut_ptr().cast::<u8>(), self.len))?,
            false => self.piece_words(i)?,
        };
        // SAFETY: as in `piece`; `&mut self` makes the borrow exclusive (the registry's
        // raw views are used only while a run holds the job mutably).
        Some(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<T>(), len) })
    }
}

/// `n` zeroed words from the allocator (lazily zeroed pages, like `vec![0; n]`), or
/// `None` where the allocation fails.
fn zeroed_words(n: usize) -> Option<Vec<u64>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u64>(n).ok()?;
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<u64>();
    if ptr.is_null() {
        return None;
    }
    advise_huge_pages(ptr.cast(), n * 8);
    // SAFETY: allocated by the global allocator with the layout of `n` u64s, all
    // initialised (zero is a valid u64).
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// Asks Linux to back the 2 MiB-aligned part of a large, untouched allocation with
/// huge pages (where transparent huge pages are `madvise`, as on this project's
/// machines): a step streams its tensors through the TLB 512× less often, and a
/// process-to-process copy (MPI's CMA) pins one page per 2 MiB instead of per 4 KiB. A
/// hint only: refused or unsupported, nothing changes.
fn advise_huge_pages(ptr: *mut u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize + bytes) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside the allocation just made; MADV_HUGEPAGE
            // changes no contents.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes);
}

/// A raw, shareable view of a buffer (see the module docs for the rules).
#[derive(Debug, Clone, Copy)]
pub struct Raw {
    ptr: *mut u8,
    pub len: usize,
    pub dtype: DType,
    /// The piece table of a pieced buffer (`nsegs == 0` for a plain one).
    segs: *const Seg,
    nsegs: usize,
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
        // Rounded first: `from_f64` goes through f32, rounding twice.
        half::f16::from_f64(DType::F16.round(x))
    }
}

impl Stored for half::bf16 {
    #[inline(always)]
    fn get(self) -> f64 {
        self.to_f64()
    }
    #[inline(always)]
    fn put(x: f64) -> Self {
        half::bf16::from_f64(DType::BF16.round(x))
    }
}

impl Raw {
    /// A plain (unpieced) buffer of `len` elements at `ptr` (the CUDA emulator's host
    /// memory).
    ///
    /// # Safety
    /// The memory must stay allocated, and not move, while the view or a copy of it is
    /// used; threads sharing the view follow the barrier discipline of the module docs.
    /// [`Raw`]'s safe accessors rely on both.
    pub unsafe fn from_addr(ptr: *mut u8, len: usize, dtype: DType) -> Raw {
        Raw {
            ptr,
            len,
            dtype,
            segs: std::ptr::null(),
            nsegs: 0,
        }
    }

    /// A view of `len` elements held in the pieces `table` describes, in order.
    ///
    /// # Safety
    /// The table and the pieces it describes must stay allocated, and not move, while the view or a copy of it is
    /// used; threads sharing the view follow the barrier discipline of the module docs.
    /// [`Raw`]'s safe accessors rely on both.
    pub unsafe fn from_segs(table: &[Seg], len: usize, dtype: DType) -> Raw {
        Raw {
            ptr: std::ptr::null_mut(),
            len,
            dtype,
            segs: table.as_ptr(),
            nsegs: table.len(),
        }
    }

    /// Whether the view is made of separately allocated pieces.
    pub fn is_pieced(&self) -> bool {
        self.nsegs > 0
    }

    /// Copies every element of `self` into `dst` (same dtype and length; at most one of
    /// the two pieced), as bytes, piece by piece: to send a pieced buffer through an
    /// API that takes contiguous memory, to land received bytes in one, or to save and
    /// restore a job's state.
    pub fn copy_all_to(&self, dst: &Raw) {
        assert!(
            self.dtype == dst.dtype && self.len == dst.len,
            "copy between unlike buffers"
        );
        assert!(
            self.nsegs == 0 || dst.nsegs == 0,
            "copy between two pieced buffers"
        );
        let size = self.dtype.size_bytes();
        let (pieced, plain, out) = if self.nsegs > 0 {
            (self, dst, true)
        } else if dst.nsegs > 0 {
            (dst, self, false)
        } else {
            // SAFETY: both hold `len` elements; distinct buffers.
            unsafe { std::ptr::copy_nonoverlapping(self.ptr, dst.ptr, self.len * size) };
            return;
        };
        // SAFETY: the table outlives the view; every piece holds `seg.len` elements and
        // lies at `seg.start` of the plain buffer's `len`.
        let segs = unsafe { std::slice::from_raw_parts(pieced.segs, pieced.nsegs) };
        for seg in segs {
            unsafe {
                let at = plain.ptr.add(seg.start * size);
                let (from, to) = if out { (seg.ptr, at) } else { (at, seg.ptr) };
                std::ptr::copy_nonoverlapping(from, to, seg.len * size);
            }
        }
    }

    /// The address of element 0 of a plain buffer.
    pub fn addr(&self) -> *mut u8 {
        self.ptr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Loads `out.len()` elements starting at `start`, as f64.
    #[inline]
    pub fn load(&self, start: usize, out: &mut [f64]) {
        assert!(start + out.len() <= self.len, "load out of bounds");
        if self.nsegs > 0 {
            return self.piecewise(start, out.len(), |piece, at, range| {
                piece.load(at, &mut out[range])
            });
        }
        if self.in_half_blocks(out.len()) {
            return self.half_blocks(start, out.len(), |at, block| {
                for (o, x) in out[at..at + block.len()].iter_mut().zip(block) {
                    *o = f64::from(*x);
                }
            });
        }
        typed!(self, T, {
            // SAFETY: in bounds (checked above); the buffer holds `len` elements of T.
            let src =
                unsafe { std::slice::from_raw_parts(self.ptr.cast::<T>().add(start), out.len()) };
            for (o, s) in out.iter_mut().zip(src) {
                *o = Stored::get(*s);
            }
        })
    }

    /// Whether `n` elements of this buffer go through block conversions: a plain f16
    /// or bf16 buffer, and enough elements to pay for a block (single elements, as
    /// [`Raw::get`] reads them, convert one by one).
    #[inline]
    fn in_half_blocks(&self, n: usize) -> bool {
        self.nsegs == 0 && matches!(self.dtype, DType::F16 | DType::BF16) && n >= 16
    }

    /// Elements `start..start + n` of a plain f16 or bf16 buffer, widened to f32 by the
    /// hardware's slice conversions (F16C where present) in blocks that stay in L1:
    /// `f(offset from start, block)` for consecutive blocks. Converting element by
    /// element costs several times more.
    #[inline(always)]
    fn half_blocks(&self, start: usize, n: usize, mut f: impl FnMut(usize, &[f32])) {
        const BLOCK: usize = 256;
        let mut block = [0f32; BLOCK];
        let mut at = 0;
        while at < n {
            let len = BLOCK.min(n - at);
            self.load_f32(start + at, &mut block[..len]);
            f(at, &block[..len]);
            at += len;
        }
    }

    /// `acc[i] = f(acc[i], self[start + i])` for every i: one pass over the source, no
    /// temporary (a reduction's inner loop).
    #[inline(always)]
    pub fn combine_into(&self, start: usize, acc: &mut [f64], f: impl Fn(f64, f64) -> f64 + Copy) {
        assert!(start + acc.len() <= self.len, "load out of bounds");
        if self.nsegs > 0 {
            return self.piecewise(start, acc.len(), |piece, at, range| {
                piece.combine_into(at, &mut acc[range], f)
            });
        }
        if self.in_half_blocks(acc.len()) {
            return self.half_blocks(start, acc.len(), |at, block| {
                for (a, x) in acc[at..at + block.len()].iter_mut().zip(block) {
                    *a = f(*a, f64::from(*x));
                }
            });
        }
        typed!(self, T, {
            let src = self.slice::<T>(start, acc.len());
            for (a, s) in acc.iter_mut().zip(src) {
                *a = f(*a, Stored::get(*s));
            }
        })
    }

    /// Stores `data` (rounded to the dtype by the conversion) starting at `start`.
    #[inline]
    pub fn store(&self, start: usize, data: &[f64]) {
        assert!(start + data.len() <= self.len, "store out of bounds");
        if self.nsegs > 0 {
            return self.piecewise(start, data.len(), |piece, at, range| {
                piece.store(at, &data[range])
            });
        }
        if self.in_half_blocks(data.len()) {
            // Rounded by the slice conversions (round to odd through f32, then the
            // hardware's f32 → half), in blocks that stay in L1.
            const BLOCK: usize = 256;
            let (mut wide, mut narrow) = ([0f64; BLOCK], [0f32; BLOCK]);
            for (k, block) in data.chunks(BLOCK).enumerate() {
                let (wide, narrow) = (&mut wide[..block.len()], &mut narrow[..block.len()]);
                wide.copy_from_slice(block);
                self.dtype.round_slice(wide);
                for (n, w) in narrow.iter_mut().zip(&*wide) {
                    *n = *w as f32;
                }
                self.store_f32(start + k * BLOCK, narrow);
            }
            return;
        }
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

    /// Loads `out.len()` elements starting at `start` of an f32, f16 or bf16 buffer, as
    /// f32 (exact: every value of those dtypes is an f32).
    #[inline]
    pub fn load_f32(&self, start: usize, out: &mut [f32]) {
        assert!(start + out.len() <= self.len, "load out of bounds");
        if self.nsegs > 0 {
            return self.piecewise(start, out.len(), |piece, at, range| {
                piece.load_f32(at, &mut out[range])
            });
        }
        match self.dtype {
            DType::F32 => out.copy_from_slice(self.slice::<f32>(start, out.len())),
            DType::F16 => self
                .slice::<half::f16>(start, out.len())
                .convert_to_f32_slice(out),
            DType::BF16 => self
                .slice::<half::bf16>(start, out.len())
                .convert_to_f32_slice(out),
            d => unreachable!("{d:?} values are not all f32 values"),
        }
    }

    /// Stores f32 values (already rounded to the buffer's dtype: f32, f16 or bf16)
    /// starting at `start`.
    #[inline]
    pub fn store_f32(&self, start: usize, data: &[f32]) {
        assert!(start + data.len() <= self.len, "store out of bounds");
        if self.nsegs > 0 {
            return self.piecewise(start, data.len(), |piece, at, range| {
                piece.store_f32(at, &data[range])
            });
        }
        match self.dtype {
            DType::F32 => self
                .slice_mut::<f32>(start, data.len())
                .copy_from_slice(data),
            DType::F16 => self
                .slice_mut::<half::f16>(start, data.len())
                .convert_from_f32_slice(data),
            DType::BF16 => self
                .slice_mut::<half::bf16>(start, data.len())
                .convert_from_f32_slice(data),
            d => unreachable!("{d:?} buffers do not store f32 values"),
        }
    }

    /// [`Raw::store_f32`] with non-temporal stores where the buffer is a plain f32 one on
    /// x86-64: for results written to a peer and not read again in this step, it saves
    /// the read of each destination line that a normal store would cost. The caller
    /// must call [`store_fence`] before other threads may read what it wrote.
    #[inline]
    pub fn store_f32_streaming(&self, start: usize, data: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.nsegs == 0 && self.dtype == DType::F32 {
            use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
            assert!(start + data.len() <= self.len, "store out of bounds");
            let dst = self.slice_mut::<f32>(start, data.len());
            // Elements before the first 16-byte boundary, then whole lines of 4.
            let head = dst.as_ptr().align_offset(16).min(dst.len());
            let body = (dst.len() - head) / 4 * 4;
            dst[..head].copy_from_slice(&data[..head]);
            for i in (head..head + body).step_by(4) {
                // SAFETY: SSE is part of x86-64; `dst[i..i + 4]` is in bounds and 16-byte
                // aligned (i - head is a multiple of 4 from an aligned start), `data[i..
                // i + 4]` is in bounds (unaligned load).
                unsafe {
                    _mm_stream_ps(dst.as_mut_ptr().add(i), _mm_loadu_ps(data.as_ptr().add(i)))
                };
            }
            dst[head + body..].copy_from_slice(&data[head + body..]);
            return;
        }
        self.store_f32(start, data);
    }

    /// Elements `start..start + n` in place, if this is a plain f32 buffer (kernels read
    /// such operands without copying them). The rank's discipline (module docs) makes
    /// sure nobody writes them while the slice lives.
    #[inline]
    pub fn f32_slice(&self, start: usize, n: usize) -> Option<&[f32]> {
        (self.nsegs == 0 && self.dtype == DType::F32 && start + n <= self.len)
            .then(|| self.slice::<f32>(start, n))
    }

    /// Whether elements `start..start + n` are f32 values in memory, plain or pieced
    /// (compiled kernels read and write them in place, piece by piece).
    pub fn holds_f32(&self, start: usize, n: usize) -> bool {
        self.dtype == DType::F32 && start.checked_add(n).is_some_and(|end| end <= self.len)
    }

    /// A pointer to element `start` of an f32 buffer with `n` elements from there in
    /// one piece (compiled kernels read and write through it; the rank's discipline,
    /// module docs, decides who may). `None` out of bounds, for another dtype, or where
    /// the elements span pieces.
    pub fn f32_ptr(&self, start: usize, n: usize) -> Option<*mut f32> {
        if !self.holds_f32(start, n) {
            return None;
        }
        if self.nsegs == 0 {
            // SAFETY: in bounds (checked just above).
            return Some(unsafe { self.ptr.cast::<f32>().add(start) });
        }
        let mut one = None;
        self.piecewise(start, n, |piece, at, range| {
            if range.len() == n {
                // SAFETY: `at + n` is within the piece (piecewise's contract).
                one = Some(unsafe { piece.ptr.cast::<f32>().add(at) });
            }
        });
        one
    }

    /// Calls `f(piece, element of the piece, range of the request)` for every run of
    /// elements `start..start + n` (in bounds) that lies in one piece: a plain buffer
    /// is one run.
    pub fn runs(
        &self,
        start: usize,
        n: usize,
        mut f: impl FnMut(Raw, usize, std::ops::Range<usize>),
    ) {
        if self.nsegs == 0 {
            f(*self, start, 0..n);
        } else {
            self.piecewise(start, n, f);
        }
    }

    /// Elements `start..start + n` of a plain buffer of `T`s (the caller checked the
    /// bounds and the dtype).
    #[inline]
    fn slice<T>(&self, start: usize, n: usize) -> &[T] {
        debug_assert!(self.nsegs == 0 && start + n <= self.len);
        // SAFETY: in bounds; the buffer holds `len` elements of T.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<T>().add(start), n) }
    }

    /// Elements `start..start + n` of a plain buffer of `T`s, to write (the caller
    /// checked the bounds and the dtype).
    #[inline]
    #[allow(clippy::mut_from_ref)]
    fn slice_mut<T>(&self, start: usize, n: usize) -> &mut [T] {
        debug_assert!(self.nsegs == 0 && start + n <= self.len);
        // SAFETY: in bounds; writers of a region are exclusive between barriers.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<T>().add(start), n) }
    }

    /// The bytes of elements `start..start + n`.
    ///
    /// # Safety
    /// No other rank may write these elements while the slice lives.
    pub unsafe fn bytes(&self, start: usize, n: usize) -> &[u8] {
        assert!(start + n <= self.len, "bytes out of bounds");
        assert_eq!(self.nsegs, 0, "pieced buffers have no contiguous bytes");
        let size = self.dtype.size_bytes();
        // SAFETY: in bounds; the caller guarantees no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.ptr.add(start * size), n * size) }
    }

    /// The bytes of the whole buffer, to write into.
    ///
    /// # Safety
    /// No other rank may read or write the buffer while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self) -> &mut [u8] {
        assert_eq!(self.nsegs, 0, "pieced buffers have no contiguous bytes");
        // SAFETY: the whole buffer; the caller guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len * self.dtype.size_bytes()) }
    }

    /// Calls `f(piece, offset in piece, range of the request)` for every piece that
    /// elements `start..start + n` of a pieced buffer touch.
    fn piecewise(
        &self,
        start: usize,
        n: usize,
        mut f: impl FnMut(Raw, usize, std::ops::Range<usize>),
    ) {
        // SAFETY: the table outlives the Raw (both belong to the buffer).
        let segs = unsafe { std::slice::from_raw_parts(self.segs, self.nsegs) };
        let mut i = segs.partition_point(|s| s.start + s.len <= start);
        let mut done = 0;
        while done < n {
            let seg = segs[i];
            let at = start + done - seg.start;
            let take = (seg.len - at).min(n - done);
            let piece = Raw {
                ptr: seg.ptr,
                len: seg.len,
                dtype: self.dtype,
                segs: std::ptr::null(),
                nsegs: 0,
            };
            f(piece, at, done..done + take);
            done += take;
            i += 1;
        }
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
        if self.nsegs > 0 || src.nsegs > 0 {
            let mut tmp = vec![0.0; n];
            src.load(src_start, &mut tmp);
            self.store(dst_start, &tmp);
            return;
        }
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

/// Orders this thread's earlier non-temporal stores ([`Raw::store_f32_streaming`]) before
/// its later stores (a barrier's release included).
#[inline]
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f16 and bf16 buffers read, combine and store through block conversions: loads
    /// widen exactly, stores round every f64 (near-halfway cases, subnormals, overflow,
    /// NaN) as the interpreter does (`DType::round`, correctly rounded — `half`'s
    /// `from_f64` goes through f32 and rounds 127.59374988672192 up to 127.625).
    #[test]
    fn half_buffers_convert_like_element_by_element() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut values: Vec<f64> = (0..2000)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let unit = (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
                unit * 2f64.powi((i % 60) - 30)
            })
            .collect();
        // Halfway between neighbouring f16 (and bf16) values, and edges.
        values.extend([
            1.0 + 2f64.powi(-11),
            1.0 + 3.0 * 2f64.powi(-11),
            65520.0,
            65519.0,
        ]);
        values.push(127.593_749_886_721_92);
        values.extend([
            1.0 + 2f64.powi(-8),
            2f64.powi(-25),
            -0.0,
            f64::INFINITY,
            f64::NAN,
        ]);
        let n = values.len();
        for dtype in [DType::F16, DType::BF16] {
            let mut buf = Buffer::zeros(dtype, n);
            // SAFETY: `buf` outlives `raw`, used by this thread only.
            let raw = unsafe { buf.raw() };
            raw.store(0, &values);
            let want: Vec<f64> = values.iter().map(|&x| dtype.round(x)).collect();
            let mut got = vec![0.0; n];
            raw.load(0, &mut got);
            for i in 0..n {
                assert!(
                    got[i].to_bits() == want[i].to_bits() || (got[i].is_nan() && want[i].is_nan()),
                    "{dtype:?}: {} stored as {} (want {})",
                    values[i],
                    got[i],
                    want[i]
                );
            }
            // An offset, unaligned range; combine adds exactly the stored values.
            let mut acc = vec![0.5; n - 3];
            raw.combine_into(3, &mut acc, |a, x| a + x);
            for i in 0..n - 3 {
                let w = 0.5 + want[i + 3];
                assert!(acc[i].to_bits() == w.to_bits() || (acc[i].is_nan() && w.is_nan()));
            }
        }
    }
}
