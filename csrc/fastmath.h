// Element-wise float helpers written so that GCC vectorises loops that call them (exp through
// exp_neg_many: a loop calling exp_neg per element is not vectorised).
//
// Every function is branch-free (selects only) and `static inline`: this header is compiled once per
// instruction set (kernel_avx512.cpp, kernel_avx2.cpp, kernel_base.cpp) and once more for the scalar
// code of the drivers (filter.cpp, chain.cpp, tree.cpp, ...), and internal linkage keeps the linker
// from merging an AVX-512 copy into the baseline code. Results are deterministic for a given build and CPU; the AVX2 and AVX-512 variants
// (both with FMA) agree bit for bit, and differ from the SSE2 variant at most in the last bit.
#pragma once

#include <cstdint>

namespace specdec {
namespace fastmath {

// a * b + c: fused in the AVX2 and AVX-512 builds (they define SPECDEC_HAVE_FMA and therefore
// agree bit for bit), two roundings elsewhere. Explicit, because -ffp-contract=off keeps the
// compiler from fusing anything on its own.
#if defined(SPECDEC_HAVE_FMA)
#define SPECDEC_MADD(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define SPECDEC_MADD(a, b, c) ((a) * (b) + (c))
#endif

#if defined(__has_builtin) && __has_builtin(__builtin_bit_cast)
static inline __attribute__((always_inline)) float bits_to_float(uint32_t x) { return __builtin_bit_cast(float, x); }
static inline __attribute__((always_inline)) uint32_t float_to_bits(float x) { return __builtin_bit_cast(uint32_t, x); }
#else  // older compilers: memcpy, which they turn into the same register move
static inline __attribute__((always_inline)) float bits_to_float(uint32_t x) {
  float f;
  __builtin_memcpy(&f, &x, sizeof(f));
  return f;
}
static inline __attribute__((always_inline)) uint32_t float_to_bits(float x) {
  uint32_t u;
  __builtin_memcpy(&u, &x, sizeof(u));
  return u;
}
#endif

static constexpr float kNegInf = -__builtin_huge_valf();
static constexpr float kPosInf = __builtin_huge_valf();

// exp(x) for x <= 0 (the kernels only exponentiate s - max(s) <= 0); about 1 ulp, like Cephes'
// expf. Denormal results are produced (2^n is applied in two halves) so tiny probabilities are not
// flushed to zero where PyTorch's exp keeps them. x is clamped at -104, where the result rounds to
// exactly 0, so -inf (a masked logit) gives 0 without a final select.
//
// exp_neg_many<N> takes N values in place, one step at a time for all of them: each value goes
// through the same operations as exp_neg (the N = 1 case), but the N dependency chains (a dozen
// dependent multiply-adds each) sit side by side in the instruction stream, so a core's FP pipes
// stay busy instead of waiting on one chain (about 1.2x on a first-generation EPYC).
//
// FLUSH_SUBNORMAL (the statistics' sums): results below 2^-126 become 0 and 2^n is one factor, two
// integer operations and a multiply fewer per value (about 1.15x). Every other result is the same
// bits: for n >= -126, 2^n is a normal float and y * 2^n is the one rounding of the same product the
// two-factor form rounds last. The flushed terms cannot change a sum whose largest term is
// exp(0) = 1 held in float64 (each is below 2^-126, far under half an ulp of 1).
template <int N, bool FLUSH_SUBNORMAL = false>
static inline __attribute__((always_inline)) void exp_neg_many(float* v) {
  float xc[N], shifted[N], r[N], y[N];
  for (int i = 0; i < N; ++i) xc[i] = v[i] < -104.0f ? -104.0f : v[i];
  // Round x * log2(e) to the nearest integer with the 1.5 * 2^23 trick (no SSE4.1 round needed).
  for (int i = 0; i < N; ++i) shifted[i] = SPECDEC_MADD(xc[i], 1.44269504088896341f, 12582912.0f);
  // Cody-Waite reduction: r = x - n * ln 2 in two steps.
  for (int i = 0; i < N; ++i) {
    const float fn = shifted[i] - 12582912.0f;
    r[i] = SPECDEC_MADD(fn, 2.12194440e-4f, SPECDEC_MADD(fn, -0.693359375f, xc[i]));
  }
  for (int i = 0; i < N; ++i) y[i] = SPECDEC_MADD(1.9875691500e-4f, r[i], 1.3981999507e-3f);
  for (int i = 0; i < N; ++i) y[i] = SPECDEC_MADD(y[i], r[i], 8.3334519073e-3f);
  for (int i = 0; i < N; ++i) y[i] = SPECDEC_MADD(y[i], r[i], 4.1665795894e-2f);
  for (int i = 0; i < N; ++i) y[i] = SPECDEC_MADD(y[i], r[i], 1.6666665459e-1f);
  for (int i = 0; i < N; ++i) y[i] = SPECDEC_MADD(y[i], r[i], 5.0000001201e-1f);
  for (int i = 0; i < N; ++i) y[i] = SPECDEC_MADD(y[i], r[i] * r[i], r[i]) + 1.0f;
  if constexpr (FLUSH_SUBNORMAL) {
    for (int i = 0; i < N; ++i) {
      int32_t e = static_cast<int32_t>(float_to_bits(shifted[i])) - (0x4B400000 - 127);  // n + 127
      e = e > 0 ? e : 0;  // 2^n below the normal range: a zero factor
      v[i] = y[i] * bits_to_float(static_cast<uint32_t>(e) << 23);
    }
    return;
  }
  // 2^n with n in [-150, 0] split into two factors that are each a normal float.
  for (int i = 0; i < N; ++i) {
    const int32_t n = static_cast<int32_t>(float_to_bits(shifted[i])) - 0x4B400000;
    const int32_t n1 = n >> 1;
    const int32_t n2 = n - n1;
    v[i] = (y[i] * bits_to_float(static_cast<uint32_t>(n1 + 127) << 23)) * bits_to_float(static_cast<uint32_t>(n2 + 127) << 23);
  }
}

static inline __attribute__((always_inline)) float exp_neg(float x) {
  exp_neg_many<1>(&x);
  return x;
}

// log(x) for a positive normal x (the kernels take logs of uniforms in [2^-24, 1)); Cephes' logf.
static inline __attribute__((always_inline)) float log_pos(float x) {
  const uint32_t bits = float_to_bits(x);
  int32_t e = static_cast<int32_t>(bits >> 23) - 126;  // x = f * 2^e, f in [0.5, 1)
  float f = bits_to_float((bits & 0x007FFFFFu) | 0x3F000000u);
  const bool small = f < 0.707106781186547524f;
  e = small ? e - 1 : e;
  f = small ? (f + f) - 1.0f : f - 1.0f;
  const float z = f * f;
  float y = 7.0376836292e-2f;
  y = SPECDEC_MADD(y, f, -1.1514610310e-1f);
  y = SPECDEC_MADD(y, f, 1.1676998740e-1f);
  y = SPECDEC_MADD(y, f, -1.2420140846e-1f);
  y = SPECDEC_MADD(y, f, 1.4249322787e-1f);
  y = SPECDEC_MADD(y, f, -1.6668057665e-1f);
  y = SPECDEC_MADD(y, f, 2.0000714765e-1f);
  y = SPECDEC_MADD(y, f, -2.4999993993e-1f);
  y = SPECDEC_MADD(y, f, 3.3333331174e-1f);
  y = y * f * z;
  const float fe = static_cast<float>(e);
  y = SPECDEC_MADD(fe, -2.12194440e-4f, y);
  y = SPECDEC_MADD(-0.5f, z, y);
  return SPECDEC_MADD(fe, 0.693359375f, f + y);
}

// Exact float16 -> float32 conversion without F16C (so it vectorises on any x86-64 and elsewhere).
static inline __attribute__((always_inline)) float half_to_float(uint16_t h) {
  const uint32_t magnitude = static_cast<uint32_t>(h & 0x7FFFu) << 13;
  const uint32_t exponent = magnitude & 0x0F800000u;
  uint32_t normal = magnitude + ((127u - 15u) << 23);
  normal = exponent == 0x0F800000u ? normal + ((128u - 16u) << 23) : normal;  // inf / NaN
  // Zero and subnormals: let the float unit renormalise.
  const float sub = bits_to_float(magnitude + (113u << 23)) - bits_to_float(113u << 23);
  const uint32_t out = exponent == 0 ? float_to_bits(sub) : normal;
  return bits_to_float(out | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

static inline __attribute__((always_inline)) float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

}  // namespace fastmath
}  // namespace specdec
