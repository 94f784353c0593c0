//! The device functions every generated translation unit starts with: dtype conversions
//! that round exactly like [`coconet_core::DType::round`], Philox-4x32-10 for dropout,
//! and the few definitions that let the same source compile with NVRTC (no headers
//! needed) and as plain C++ for the host emulator (`COCONET_EMULATE`).
//!
//! Half-precision conversions are written with integer operations instead of
//! `cuda_fp16.h`: NVRTC then needs no include path, and the emulator runs the very same
//! code. A double is first rounded to float *to odd* and then to nearest-even half, which
//! equals rounding the double directly (float keeps more than 2 + 11 bits).

/// The prelude's CUDA C source.
pub const PRELUDE: &str = r#"// ---- coconet prelude ----
#ifdef COCONET_EMULATE
#include <cmath>
#include <cstring>
#define CC_DEV static inline
#define CC_KERNEL static void
using std::sqrt; using std::fabs; using std::trunc; using std::fmin; using std::fmax;
using std::ceil; using std::floor; using std::copysign;
struct cc_dim3 { unsigned x, y, z; };
static thread_local cc_dim3 threadIdx, blockIdx, blockDim, gridDim;
struct float4 { float x, y, z, w; };
struct double2 { double x, y; };
struct uint2 { unsigned x, y; };
CC_DEV unsigned cc_fbits(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
CC_DEV float cc_bitsf(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
CC_DEV unsigned long long cc_dbits(double d) { unsigned long long u; std::memcpy(&u, &d, 8); return u; }
CC_DEV double cc_bitsd(unsigned long long u) { double d; std::memcpy(&d, &u, 8); return d; }
CC_DEV bool cc_signbit(double x) { return std::signbit(x); }
// Block-level kernels run once per block here: each stretch between barriers is a loop
// over the block's threads.
#define CC_SHARED
#define CC_THREADS(t) for (unsigned t = 0; t < blockDim.x; t++) {
#define CC_END_THREADS }
#else
#define CC_DEV __device__ __forceinline__
#define CC_KERNEL extern "C" __global__ void
CC_DEV unsigned cc_fbits(float f) { return __float_as_uint(f); }
CC_DEV float cc_bitsf(unsigned u) { return __uint_as_float(u); }
CC_DEV unsigned long long cc_dbits(double d) { return (unsigned long long)__double_as_longlong(d); }
CC_DEV double cc_bitsd(unsigned long long u) { return __longlong_as_double((long long)u); }
CC_DEV bool cc_signbit(double x) { return signbit(x); }
#define CC_SHARED __shared__
#define CC_THREADS(t) { const unsigned t = threadIdx.x;
#define CC_END_THREADS __syncthreads(); }
#endif
typedef unsigned short cc_half;
typedef unsigned short cc_bhalf;
typedef long long cc_i64;
typedef unsigned long long cc_u64;

// Grid-stride loop bounds over 64-bit indices.
CC_DEV cc_i64 cc_tid() { return (cc_i64)blockIdx.x * blockDim.x + threadIdx.x; }
CC_DEV cc_i64 cc_nthreads() { return (cc_i64)blockDim.x * gridDim.x; }

// Positions before the first `w`-byte aligned element of a pointer to `s`-byte elements
// (at most n): a vectorised loop peels them so the rest is aligned.
CC_DEV cc_i64 cc_peel(cc_u64 addr, cc_u64 w, cc_u64 s, cc_i64 n) {
  cc_i64 h = (cc_i64)(((w - addr % w) % w) / s);
  return h < n ? h : (n > 0 ? n : 0);
}

// Max and min with -0 < +0, and the canonical quiet NaN if either operand is NaN
// (coconet_core::numerics::max_exact, min_exact): any order of a reduction gives the same bits.
CC_DEV double cc_nan() { return (double)cc_bitsf(0x7fc00000u); }
CC_DEV double cc_max(double a, double b) {
  if (a != a || b != b) return cc_nan();
  return a > b ? a : (b > a || cc_signbit(a)) ? b : a;
}
CC_DEV double cc_min(double a, double b) {
  if (a != a || b != b) return cc_nan();
  return a < b ? a : (b < a || !cc_signbit(a)) ? b : a;
}

// A double rounded to float toward zero, then with its last bit set when inexact.
CC_DEV float cc_to_float_odd(double d) {
  float f = (float)d;
  if (d != d || f == 0.0f) return f;
  unsigned u = cc_fbits(f);
  if (fabs((double)f) > fabs(d)) u -= 1;
  if ((double)cc_bitsf(u) != d) u |= 1;
  return cc_bitsf(u);
}

// IEEE half <-> float, round to nearest even, subnormals, infinities and NaN.
CC_DEV float cc_half_to_float(cc_half h) {
  unsigned s = (unsigned)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return cc_bitsf(s | 0x7f800000u | (m << 13));
  if (e == 0) {
    float v = (float)m * 5.9604644775390625e-08f;  // m * 2^-24
    return s ? -v : v;
  }
  return cc_bitsf(s | ((e + 112) << 23) | (m << 13));
}
CC_DEV cc_half cc_float_to_half(float f) {
  unsigned u = cc_fbits(f), s = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (cc_half)(s | 0x7e00);            // NaN
  if (a >= 0x477ff000u) return (cc_half)(s | 0x7c00);           // overflow to inf
  if (a < 0x38800000u) {                                         // subnormal half or zero
    unsigned m = (a & 0x7fffff) | 0x800000, e = a >> 23;
    if (e < 102) return (cc_half)s;
    unsigned shift = 126 - e, r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r += 1;
    return (cc_half)(s | r);
  }
  unsigned r = a + 0xc8000fffu + ((a >> 13) & 1);                // rebias and round
  return (cc_half)(s | (r >> 13));
}
CC_DEV cc_half cc_double_to_half(double d) { return cc_float_to_half(cc_to_float_odd(d)); }

// bfloat16 <-> float.
CC_DEV float cc_bhalf_to_float(cc_bhalf h) { return cc_bitsf((unsigned)h << 16); }
CC_DEV cc_bhalf cc_float_to_bhalf(float f) {
  unsigned u = cc_fbits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (cc_bhalf)((u >> 16) | 0x40);
  return (cc_bhalf)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
CC_DEV cc_bhalf cc_double_to_bhalf(double d) { return cc_float_to_bhalf(cc_to_float_odd(d)); }

// Rounding a computed value to a node's dtype (as DType::round does).
CC_DEV float cc_round_f16(float x) { return cc_half_to_float(cc_float_to_half(x)); }
CC_DEV float cc_round_f16d(double x) { return cc_half_to_float(cc_double_to_half(x)); }
CC_DEV float cc_round_bf16(float x) { return cc_bhalf_to_float(cc_float_to_bhalf(x)); }
CC_DEV float cc_round_bf16d(double x) { return cc_bhalf_to_float(cc_double_to_bhalf(x)); }
CC_DEV double cc_round_i64(double x) {
  if (x != x || x - x != 0.0) return 0.0;                         // NaN or infinite
  if (x >= 9223372036854775807.0) return 9223372036854775807.0;
  if (x <= -9223372036854775808.0) return -9223372036854775808.0;
  return (double)(cc_i64)x;
}
CC_DEV double cc_round_i32(double x) {
  return (double)(int)(unsigned)(cc_u64)(cc_i64)cc_round_i64(x);
}
CC_DEV double cc_round_bool(double x) { return x != 0.0 ? 1.0 : 0.0; }

// Philox-4x32-10 (see coconet_core::numerics::philox, the specification).
CC_DEV unsigned cc_dropout_bits(cc_u64 seed, cc_u64 index) {
  unsigned c0 = (unsigned)index, c1 = (unsigned)(index >> 32), c2 = 0, c3 = 0;
  unsigned k0 = (unsigned)seed, k1 = (unsigned)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    if (r > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    cc_u64 p0 = (cc_u64)0xD2511F53u * c0, p1 = (cc_u64)0xCD9E8D57u * c2;
    unsigned n0 = (unsigned)(p1 >> 32) ^ c1 ^ k0, n1 = (unsigned)p1;
    unsigned n2 = (unsigned)(p0 >> 32) ^ c3 ^ k1, n3 = (unsigned)p0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
  }
  return c0;
}
CC_DEV cc_u64 cc_dropout_threshold(double p) {
  double t = ceil(p * 4294967296.0);
  if (!(t > 0.0)) return 0;
  if (t > 4294967296.0) return 4294967296ull;
  return (cc_u64)t;
}
// ---- end of prelude ----
"#;
