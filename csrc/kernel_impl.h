// The vectorised loops behind kernel.h. Included by kernel_avx512.cpp, kernel_avx2.cpp and
// kernel_base.cpp inside a target region (GCC: #pragma GCC target; clang: #pragma clang attribute
// with a target attribute on every function), with
// SPECDEC_ISA naming the namespace and SPECDEC_VBYTES the native vector width in bytes (64, 32 or 16).
//
// Two kinds of loops:
// * element-wise loops over small stack blocks (`out[i] = f(in[i])`: exp, log, probabilities),
//   which the compiler vectorises on its own (checked with -fopt-info-vec / -Rpass=loop-vectorize);
// * reductions (max, sums, counts), written with vector types as a bundle of 16 lanes held in
//   16 / (native width) registers. Element i always lands in lane i % 16 and the 16 lanes are
//   combined by one fixed tree, so every instruction set (and every thread count) adds in the
//   same order: the AVX2 and AVX-512 builds agree bit for bit, and the portable build differs only
//   through the last bit of its unfused exp / log (fastmath.h).
//
// Philox needs 32x32->64-bit products, which the vectorisers compile poorly, so it is written with
// intrinsics per instruction set (SSE2, AVX2, AVX-512, NEON). One Philox evaluation gives the race
// words of four consecutive ids (stream v2). The race (race_block) skips the ids that provably
// cannot win, first in logit space (no exp, no Philox), before drawing their exponentials.
#ifndef SPECDEC_ISA
#error "define SPECDEC_ISA before including kernel_impl.h"
#endif
#ifndef SPECDEC_VBYTES
#define SPECDEC_VBYTES 16
#endif

#include <cmath>

#include "fastmath.h"
#include "kernel.h"
#include "philox.h"

#if defined(SPECDEC_EMULATE_AVX512)
#include "tests/avx512_emulation.h"
#elif defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace specdec {
namespace SPECDEC_ISA {
namespace {

using fastmath::bf16_to_float;
using fastmath::exp_neg;
using fastmath::half_to_float;
using fastmath::kNegInf;
using fastmath::log_pos;

#define SPECDEC_ALWAYS_INLINE inline __attribute__((always_inline))

constexpr int kLanes = 16;
constexpr int kW = SPECDEC_VBYTES / 4;  // floats per native vector
constexpr int kJ = kLanes / kW;         // native vectors per 16-lane bundle
constexpr int kDW = SPECDEC_VBYTES / 8;  // doubles per native vector
constexpr int kDJ = kLanes / kDW;        // native double vectors per 16-lane bundle
constexpr int64_t kBlock = 512;          // element-wise block (a multiple of 64), kept on the stack
constexpr int kNoDraft = -1;
constexpr float kPruneFactor = 5e-8f;  // below -log(1 - 2^-24), the smallest exponential
constexpr float kLn2Up = 0.693147182f;  // float32 ln 2, rounded up (so b * kLn2Up <= b ln 2 for b < 0)

typedef float vfloat __attribute__((vector_size(SPECDEC_VBYTES)));
typedef int32_t vint __attribute__((vector_size(SPECDEC_VBYTES)));
typedef double vdouble __attribute__((vector_size(SPECDEC_VBYTES)));
typedef float vfhalf __attribute__((vector_size(SPECDEC_VBYTES / 2)));

SPECDEC_ALWAYS_INLINE vfloat vload(const float* p) {
  vfloat v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

SPECDEC_ALWAYS_INLINE vdouble vload_widen(const float* p) {
  vfhalf h;
  __builtin_memcpy(&h, p, sizeof(h));
  return __builtin_convertvector(h, vdouble);
}

template <int DT>
SPECDEC_ALWAYS_INLINE float load(const void* p, int64_t i) {
  if constexpr (DT == kF32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (DT == kBF16) {
    return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  } else {
    return half_to_float(static_cast<const uint16_t*>(p)[i]);
  }
}

// Lane l of a bundle is acc[l / kDW][l % kDW]; the tree below is the same for every width.
SPECDEC_ALWAYS_INLINE double tree_sum(const vdouble* acc) {
  double lanes[kLanes];
  for (int j = 0; j < kDJ; ++j) {
    for (int l = 0; l < kDW; ++l) lanes[j * kDW + l] = acc[j][l];
  }
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

// acc += values[0, n) widened to double, with n a multiple of kLanes.
SPECDEC_ALWAYS_INLINE void bundle_add(const float* values, int64_t n, vdouble* acc) {
  for (int64_t i = 0; i < n; i += kLanes) {
#pragma GCC unroll 8
    for (int j = 0; j < kDJ; ++j) acc[j] += vload_widen(values + i + j * kDW);
  }
}

// Max of values[0, n) (n a multiple of kLanes) into *mx, OR of NaN flags into *nan. Max and OR do
// not depend on the order, so four independent bundles keep the loads streaming.
SPECDEC_ALWAYS_INLINE void bundle_max_nan(const float* values, int64_t n, float* mx, bool* nan) {
  constexpr int kU = 4;
  vfloat m[kU][kJ];
  vint flag[kU][kJ];
  for (int u = 0; u < kU; ++u) {
    for (int j = 0; j < kJ; ++j) {
      m[u][j] = vfloat{} + *mx;
      flag[u][j] = vint{};
    }
  }
  int64_t i = 0;
  for (; i + kU * kLanes <= n; i += kU * kLanes) {
#pragma GCC unroll 16
    for (int u = 0; u < kU; ++u) {
#pragma GCC unroll 4
      for (int j = 0; j < kJ; ++j) {
        const vfloat v = vload(values + i + u * kLanes + j * kW);
        m[u][j] = v > m[u][j] ? v : m[u][j];
        flag[u][j] |= v != v;
      }
    }
  }
  for (; i < n; i += kLanes) {
#pragma GCC unroll 4
    for (int j = 0; j < kJ; ++j) {
      const vfloat v = vload(values + i + j * kW);
      m[0][j] = v > m[0][j] ? v : m[0][j];
      flag[0][j] |= v != v;
    }
  }
  float out = *mx;
  int32_t any = 0;
  for (int u = 0; u < kU; ++u) {
    for (int j = 0; j < kJ; ++j) {
      for (int l = 0; l < kW; ++l) {
        out = m[u][j][l] > out ? m[u][j][l] : out;
        any |= flag[u][j][l];
      }
    }
  }
  *mx = out;
  *nan = *nan || any != 0;
}

// Largest of values[0, n) (n a multiple of kLanes), starting from `floor`.
SPECDEC_ALWAYS_INLINE float bundle_max(const float* values, int64_t n, float floor) {
  vfloat m[kJ];
  for (int j = 0; j < kJ; ++j) m[j] = vfloat{} + floor;
  for (int64_t i = 0; i < n; i += kLanes) {
#pragma GCC unroll 4
    for (int j = 0; j < kJ; ++j) {
      const vfloat v = vload(values + i + j * kW);
      m[j] = v > m[j] ? v : m[j];
    }
  }
  float out = floor;
  for (int j = 0; j < kJ; ++j) {
    for (int l = 0; l < kW; ++l) out = m[j][l] > out ? m[j][l] : out;
  }
  return out;
}

// Number of values[0, n) > bound (n a multiple of kLanes).
SPECDEC_ALWAYS_INLINE int64_t bundle_count_above(const float* values, int64_t n, float bound) {
  vint count[kJ];
  for (int j = 0; j < kJ; ++j) count[j] = vint{};
  for (int64_t i = 0; i < n; i += kLanes) {
#pragma GCC unroll 4
    for (int j = 0; j < kJ; ++j) count[j] -= vload(values + i + j * kW) > bound;  // true is -1
  }
  int64_t total = 0;
  for (int j = 0; j < kJ; ++j) {
    for (int l = 0; l < kW; ++l) total += count[j][l];
  }
  return total;
}

SPECDEC_ALWAYS_INLINE int64_t round_up_lanes(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// Number of i < n (a multiple of kLanes) with values[i] > bounds[i].
SPECDEC_ALWAYS_INLINE int64_t count_above_each(const float* values, const float* bounds, int64_t n) {
  vint count[kJ];
  for (int j = 0; j < kJ; ++j) count[j] = vint{};
  for (int64_t i = 0; i < n; i += kLanes) {
#pragma GCC unroll 4
    for (int j = 0; j < kJ; ++j) count[j] -= vload(values + i + j * kW) > vload(bounds + i + j * kW);
  }
  int64_t total = 0;
  for (int j = 0; j < kJ; ++j) {
    for (int l = 0; l < kW; ++l) total += count[j][l];
  }
  return total;
}

// Bit l set where values[l] > bounds[l], for 16 values.
SPECDEC_ALWAYS_INLINE uint32_t gt_each_mask16(const float* values, const float* bounds) {
  uint32_t mask = 0;
  for (int j = 0; j < kJ; ++j) {
    const vint hit = vload(values + j * kW) > vload(bounds + j * kW);
    for (int l = 0; l < kW; ++l) mask |= static_cast<uint32_t>(hit[l] & 1) << (j * kW + l);
  }
  return mask;
}

// Bit l set where values[l] > t, for 16 values.
SPECDEC_ALWAYS_INLINE uint32_t gt_mask16(const float* values, float t) {
  uint32_t mask = 0;
  for (int j = 0; j < kJ; ++j) {
    const vint hit = vload(values + j * kW) > t;
    for (int l = 0; l < kW; ++l) mask |= static_cast<uint32_t>(hit[l] & 1) << (j * kW + l);
  }
  return mask;
}

// Bit l set where values[l] >= t, for 16 values.
SPECDEC_ALWAYS_INLINE uint32_t ge_mask16(const float* values, float t) {
#if defined(__x86_64__) && SPECDEC_VBYTES == 64
  return _mm512_cmp_ps_mask(_mm512_loadu_ps(values), _mm512_set1_ps(t), _CMP_GE_OQ);
#elif defined(__x86_64__) && SPECDEC_VBYTES == 32
  const __m256 bound = _mm256_set1_ps(t);
  const uint32_t low = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(values), bound, _CMP_GE_OQ)));
  const uint32_t high = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(values + 8), bound, _CMP_GE_OQ)));
  return low | (high << 8);
#elif defined(__x86_64__)
  const __m128 bound = _mm_set1_ps(t);
  uint32_t mask = 0;
  for (int q = 0; q < 4; ++q) mask |= static_cast<uint32_t>(_mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(values + 4 * q), bound))) << (4 * q);
  return mask;
#else
  uint32_t mask = 0;
  for (int j = 0; j < kJ; ++j) {
    const vint hit = vload(values + j * kW) >= t;
    for (int l = 0; l < kW; ++l) mask |= static_cast<uint32_t>(hit[l] & 1) << (j * kW + l);
  }
  return mask;
#endif
}

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 on vectors of counters. Two layouts:
// * groups: lane g evaluates counter (v0 / 4 + g, p_lo, p_hi, stream) and its four words are
//   stored, transposed, as the race words of ids v0 + 4g .. v0 + 4g + 3 (one evaluation per four ids);
// * list: lane i evaluates the counter of ids[i] and keeps word ids[i] & 3 (sparse id lists).
// Each instruction set supplies: p_set1, p_iota (0, 1, ..., L-1), p_add, p_xor3, p_shr2, p_and3,
// p_mulhilo (high and low words of 32x32-bit products), p_load / p_store, p_store_groups (the 4 x L
// transpose) and p_select (word ids & 3 of the four).

#if defined(__x86_64__) && SPECDEC_VBYTES == 64
#define SPECDEC_PHILOX_LANES 16
typedef __m512i vphilox;
SPECDEC_ALWAYS_INLINE vphilox p_set1(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
SPECDEC_ALWAYS_INLINE vphilox p_iota() { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
SPECDEC_ALWAYS_INLINE vphilox p_add(vphilox a, vphilox b) { return _mm512_add_epi32(a, b); }
SPECDEC_ALWAYS_INLINE vphilox p_xor3(vphilox a, vphilox b, vphilox c) { return _mm512_ternarylogic_epi32(a, b, c, 0x96); }
SPECDEC_ALWAYS_INLINE vphilox p_shr2(vphilox a) { return _mm512_srli_epi32(a, 2); }
SPECDEC_ALWAYS_INLINE vphilox p_load(const uint32_t* in) { return _mm512_loadu_si512(in); }
SPECDEC_ALWAYS_INLINE void p_store(uint32_t* out, vphilox x) { _mm512_storeu_si512(out, x); }
SPECDEC_ALWAYS_INLINE void p_mulhilo(vphilox a, vphilox b, vphilox* hi, vphilox* lo) {
  const vphilox even = _mm512_mul_epu32(a, b);                       // 64-bit products of lanes 0, 2, ...
  const vphilox odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), b);  // of lanes 1, 3, ...
  *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}
SPECDEC_ALWAYS_INLINE vphilox p_select(vphilox c0, vphilox c1, vphilox c2, vphilox c3, vphilox ids) {
  const vphilox which = _mm512_and_si512(ids, _mm512_set1_epi32(3));
  vphilox w = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(which, _mm512_set1_epi32(1)), c0, c1);
  w = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(which, _mm512_set1_epi32(2)), w, c2);
  return _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(which, _mm512_set1_epi32(3)), w, c3);
}
// out[4g + w] = c_w[g] for g < 16: a 4 x 4 transpose inside each 128-bit lane, then one of the
// four 128-bit lanes.
SPECDEC_ALWAYS_INLINE void p_store_groups(uint32_t* out, vphilox c0, vphilox c1, vphilox c2, vphilox c3) {
  const vphilox t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpacklo_epi32(c2, c3);
  const vphilox t2 = _mm512_unpackhi_epi32(c0, c1), t3 = _mm512_unpackhi_epi32(c2, c3);
  const vphilox u0 = _mm512_unpacklo_epi64(t0, t1), u1 = _mm512_unpackhi_epi64(t0, t1);  // groups 4l, 4l + 1 of lane l
  const vphilox u2 = _mm512_unpacklo_epi64(t2, t3), u3 = _mm512_unpackhi_epi64(t2, t3);  // groups 4l + 2, 4l + 3
  const vphilox a01 = _mm512_shuffle_i32x4(u0, u1, 0x44), a23 = _mm512_shuffle_i32x4(u2, u3, 0x44);  // lanes 0, 1
  const vphilox b01 = _mm512_shuffle_i32x4(u0, u1, 0xEE), b23 = _mm512_shuffle_i32x4(u2, u3, 0xEE);  // lanes 2, 3
  p_store(out, _mm512_shuffle_i32x4(a01, a23, 0x88));       // groups 0-3
  p_store(out + 16, _mm512_shuffle_i32x4(a01, a23, 0xDD));  // groups 4-7
  p_store(out + 32, _mm512_shuffle_i32x4(b01, b23, 0x88));  // groups 8-11
  p_store(out + 48, _mm512_shuffle_i32x4(b01, b23, 0xDD));  // groups 12-15
}
#elif defined(__x86_64__) && SPECDEC_VBYTES == 32
#define SPECDEC_PHILOX_LANES 8
typedef __m256i vphilox;
SPECDEC_ALWAYS_INLINE vphilox p_set1(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
SPECDEC_ALWAYS_INLINE vphilox p_iota() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
SPECDEC_ALWAYS_INLINE vphilox p_add(vphilox a, vphilox b) { return _mm256_add_epi32(a, b); }
SPECDEC_ALWAYS_INLINE vphilox p_xor3(vphilox a, vphilox b, vphilox c) { return _mm256_xor_si256(_mm256_xor_si256(a, b), c); }
SPECDEC_ALWAYS_INLINE vphilox p_shr2(vphilox a) { return _mm256_srli_epi32(a, 2); }
SPECDEC_ALWAYS_INLINE vphilox p_load(const uint32_t* in) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)); }
SPECDEC_ALWAYS_INLINE void p_store(uint32_t* out, vphilox x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), x); }
SPECDEC_ALWAYS_INLINE void p_mulhilo(vphilox a, vphilox b, vphilox* hi, vphilox* lo) {
  const vphilox even = _mm256_mul_epu32(a, b);
  const vphilox odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), b);
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}
SPECDEC_ALWAYS_INLINE vphilox p_select(vphilox c0, vphilox c1, vphilox c2, vphilox c3, vphilox ids) {
  const vphilox which = _mm256_and_si256(ids, _mm256_set1_epi32(3));
  vphilox w = _mm256_blendv_epi8(c0, c1, _mm256_cmpeq_epi32(which, _mm256_set1_epi32(1)));
  w = _mm256_blendv_epi8(w, c2, _mm256_cmpeq_epi32(which, _mm256_set1_epi32(2)));
  return _mm256_blendv_epi8(w, c3, _mm256_cmpeq_epi32(which, _mm256_set1_epi32(3)));
}
// out[4g + w] = c_w[g] for g < 8: a 4 x 4 transpose in each 128-bit half, then the halves in order.
SPECDEC_ALWAYS_INLINE void p_store_groups(uint32_t* out, vphilox c0, vphilox c1, vphilox c2, vphilox c3) {
  const vphilox t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpacklo_epi32(c2, c3);
  const vphilox t2 = _mm256_unpackhi_epi32(c0, c1), t3 = _mm256_unpackhi_epi32(c2, c3);
  const vphilox g04 = _mm256_unpacklo_epi64(t0, t1), g15 = _mm256_unpackhi_epi64(t0, t1);  // groups (0 | 4), (1 | 5)
  const vphilox g26 = _mm256_unpacklo_epi64(t2, t3), g37 = _mm256_unpackhi_epi64(t2, t3);  // groups (2 | 6), (3 | 7)
  p_store(out, _mm256_permute2x128_si256(g04, g15, 0x20));
  p_store(out + 8, _mm256_permute2x128_si256(g26, g37, 0x20));
  p_store(out + 16, _mm256_permute2x128_si256(g04, g15, 0x31));
  p_store(out + 24, _mm256_permute2x128_si256(g26, g37, 0x31));
}
#elif defined(__x86_64__)
#define SPECDEC_PHILOX_LANES 4
typedef __m128i vphilox;
SPECDEC_ALWAYS_INLINE vphilox p_set1(uint32_t x) { return _mm_set1_epi32(static_cast<int>(x)); }
SPECDEC_ALWAYS_INLINE vphilox p_iota() { return _mm_setr_epi32(0, 1, 2, 3); }
SPECDEC_ALWAYS_INLINE vphilox p_add(vphilox a, vphilox b) { return _mm_add_epi32(a, b); }
SPECDEC_ALWAYS_INLINE vphilox p_xor3(vphilox a, vphilox b, vphilox c) { return _mm_xor_si128(_mm_xor_si128(a, b), c); }
SPECDEC_ALWAYS_INLINE vphilox p_shr2(vphilox a) { return _mm_srli_epi32(a, 2); }
SPECDEC_ALWAYS_INLINE vphilox p_load(const uint32_t* in) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(in)); }
SPECDEC_ALWAYS_INLINE void p_store(uint32_t* out, vphilox x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(out), x); }
SPECDEC_ALWAYS_INLINE void p_mulhilo(vphilox a, vphilox b, vphilox* hi, vphilox* lo) {
  const vphilox even = _mm_mul_epu32(a, b);                     // [lo0 hi0 lo2 hi2]
  const vphilox odd = _mm_mul_epu32(_mm_srli_epi64(a, 32), b);  // [lo1 hi1 lo3 hi3]
  const vphilox first = _mm_unpacklo_epi32(even, odd);          // [lo0 lo1 hi0 hi1]
  const vphilox second = _mm_unpackhi_epi32(even, odd);         // [lo2 lo3 hi2 hi3]
  *lo = _mm_unpacklo_epi64(first, second);
  *hi = _mm_unpackhi_epi64(first, second);
}
SPECDEC_ALWAYS_INLINE vphilox p_select(vphilox c0, vphilox c1, vphilox c2, vphilox c3, vphilox ids) {
  // No blendv before SSE4.1: and / andnot / or.
  const vphilox which = _mm_and_si128(ids, _mm_set1_epi32(3));
  const vphilox m1 = _mm_cmpeq_epi32(which, _mm_set1_epi32(1)), m2 = _mm_cmpeq_epi32(which, _mm_set1_epi32(2));
  const vphilox m3 = _mm_cmpeq_epi32(which, _mm_set1_epi32(3)), m0 = _mm_cmpeq_epi32(which, _mm_setzero_si128());
  return _mm_or_si128(_mm_or_si128(_mm_and_si128(m0, c0), _mm_and_si128(m1, c1)), _mm_or_si128(_mm_and_si128(m2, c2), _mm_and_si128(m3, c3)));
}
SPECDEC_ALWAYS_INLINE void p_store_groups(uint32_t* out, vphilox c0, vphilox c1, vphilox c2, vphilox c3) {
  const vphilox t0 = _mm_unpacklo_epi32(c0, c1), t1 = _mm_unpacklo_epi32(c2, c3);
  const vphilox t2 = _mm_unpackhi_epi32(c0, c1), t3 = _mm_unpackhi_epi32(c2, c3);
  p_store(out, _mm_unpacklo_epi64(t0, t1));
  p_store(out + 4, _mm_unpackhi_epi64(t0, t1));
  p_store(out + 8, _mm_unpacklo_epi64(t2, t3));
  p_store(out + 12, _mm_unpackhi_epi64(t2, t3));
}
#elif defined(__aarch64__)
#define SPECDEC_PHILOX_LANES 4
typedef uint32x4_t vphilox;
SPECDEC_ALWAYS_INLINE vphilox p_set1(uint32_t x) { return vdupq_n_u32(x); }
SPECDEC_ALWAYS_INLINE vphilox p_iota() {
  static const uint32_t kIota[4] = {0, 1, 2, 3};
  return vld1q_u32(kIota);
}
SPECDEC_ALWAYS_INLINE vphilox p_add(vphilox a, vphilox b) { return vaddq_u32(a, b); }
SPECDEC_ALWAYS_INLINE vphilox p_xor3(vphilox a, vphilox b, vphilox c) { return veorq_u32(veorq_u32(a, b), c); }
SPECDEC_ALWAYS_INLINE vphilox p_shr2(vphilox a) { return vshrq_n_u32(a, 2); }
SPECDEC_ALWAYS_INLINE vphilox p_load(const uint32_t* in) { return vld1q_u32(in); }
SPECDEC_ALWAYS_INLINE void p_store(uint32_t* out, vphilox x) { vst1q_u32(out, x); }
SPECDEC_ALWAYS_INLINE void p_mulhilo(vphilox a, vphilox b, vphilox* hi, vphilox* lo) {
  const uint32x4_t low_products = vreinterpretq_u32_u64(vmull_u32(vget_low_u32(a), vget_low_u32(b)));  // [lo0 hi0 lo1 hi1]
  const uint32x4_t high_products = vreinterpretq_u32_u64(vmull_high_u32(a, b));                       // [lo2 hi2 lo3 hi3]
  *lo = vuzp1q_u32(low_products, high_products);
  *hi = vuzp2q_u32(low_products, high_products);
}
SPECDEC_ALWAYS_INLINE vphilox p_select(vphilox c0, vphilox c1, vphilox c2, vphilox c3, vphilox ids) {
  const uint32x4_t which = vandq_u32(ids, vdupq_n_u32(3));
  uint32x4_t w = vbslq_u32(vceqq_u32(which, vdupq_n_u32(1)), c1, c0);
  w = vbslq_u32(vceqq_u32(which, vdupq_n_u32(2)), c2, w);
  return vbslq_u32(vceqq_u32(which, vdupq_n_u32(3)), c3, w);
}
SPECDEC_ALWAYS_INLINE void p_store_groups(uint32_t* out, vphilox c0, vphilox c1, vphilox c2, vphilox c3) {
  uint32x4x4_t words;
  words.val[0] = c0;
  words.val[1] = c1;
  words.val[2] = c2;
  words.val[3] = c3;
  vst4q_u32(out, words);  // interleaving store: out[4g + w] = c_w[g]
}
#endif

#if defined(SPECDEC_PHILOX_LANES)
constexpr int kPL = SPECDEC_PHILOX_LANES;

struct PhiloxKeys {
  vphilox k0[10], k1[10];
  vphilox c1, c2, c3;
};

SPECDEC_ALWAYS_INLINE void philox_setup(const RaceArgs* a, PhiloxKeys* keys) {
  for (int r = 0; r < 10; ++r) {
    keys->k0[r] = p_set1(a->key0 + static_cast<uint32_t>(r) * philox::kKeyA);
    keys->k1[r] = p_set1(a->key1 + static_cast<uint32_t>(r) * philox::kKeyB);
  }
  keys->c1 = p_set1(a->p_lo);
  keys->c2 = p_set1(a->p_hi);
  keys->c3 = p_set1(a->stream);
}

SPECDEC_ALWAYS_INLINE void philox_rounds(const PhiloxKeys& keys, vphilox* c0, vphilox* c1, vphilox* c2, vphilox* c3) {
  const vphilox round_a = p_set1(philox::kRoundA), round_b = p_set1(philox::kRoundB);
#pragma GCC unroll 10
  for (int r = 0; r < 10; ++r) {
    vphilox hi_b, lo_b, hi_a, lo_a;
    p_mulhilo(*c2, round_b, &hi_b, &lo_b);
    p_mulhilo(*c0, round_a, &hi_a, &lo_a);
    *c0 = p_xor3(hi_b, *c1, keys.k0[r]);
    *c2 = p_xor3(hi_a, *c3, keys.k1[r]);
    *c1 = lo_b;
    *c3 = lo_a;
  }
}
#endif

// out[i] = race word of id v0 + i, for i < n (v0 a multiple of 4, n a multiple of kLanes).
void race_words_groups(const RaceArgs* a, uint32_t v0, int64_t n, uint32_t* out) {
#if defined(SPECDEC_PHILOX_LANES)
  PhiloxKeys keys;
  philox_setup(a, &keys);
  const vphilox iota = p_iota();
  constexpr int64_t kIds = 4 * kPL;  // ids per vector of counters
  int64_t i = 0;
  for (; i < n; i += kIds) {
    vphilox c0 = p_add(p_set1(v0 / 4 + static_cast<uint32_t>(i / 4)), iota), c1 = keys.c1, c2 = keys.c2, c3 = keys.c3;
    philox_rounds(keys, &c0, &c1, &c2, &c3);
    if (i + kIds <= n) {
      p_store_groups(out + i, c0, c1, c2, c3);
    } else {  // the last, partial vector of counters
      alignas(64) uint32_t tail[kIds];
      p_store_groups(tail, c0, c1, c2, c3);
      for (int64_t t = 0; t < n - i; ++t) out[i + t] = tail[t];
    }
  }
#else
  for (int64_t g = 0; g < n / 4; ++g) {
    philox::words4(v0 / 4 + static_cast<uint32_t>(g), a->p_lo, a->p_hi, a->stream, a->key0, a->key1, out + 4 * g);
  }
#endif
}

// out[i] = race word of ids[i], for i < n (n a multiple of kLanes).
void race_words_list(const RaceArgs* a, const uint32_t* ids, int64_t n, uint32_t* out) {
#if defined(SPECDEC_PHILOX_LANES)
  PhiloxKeys keys;
  philox_setup(a, &keys);
  for (int64_t i = 0; i < n; i += kPL) {
    const vphilox id = p_load(ids + i);
    vphilox c0 = p_shr2(id), c1 = keys.c1, c2 = keys.c2, c3 = keys.c3;
    philox_rounds(keys, &c0, &c1, &c2, &c3);
    p_store(out + i, p_select(c0, c1, c2, c3, id));
  }
#else
  for (int64_t i = 0; i < n; ++i) out[i] = philox::race_word(ids[i], a->p_lo, a->p_hi, a->stream, a->key0, a->key1);
#endif
}

// ---------------------------------------------------------------------------------------------
// Line statistics.

template <int DT>
int64_t first_equal(const void* x, int64_t n, float target) {
  // Test 64 values at a time without branching (vectorises), then locate the hit in that group.
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    int hit = 0;
    for (int l = 0; l < 64; ++l) hit |= load<DT>(x, i + l) == target;
    if (hit) break;
  }
  for (; i < n; ++i) {
    if (load<DT>(x, i) == target) return i;
  }
  return 0;
}

// Max and NaN flag of n raw values (any storage type), for the validity scan and the statistics.
template <int DT>
void max_nan(const void* x, int64_t n, float* mx_out, bool* nan_out) {
  float mx = kNegInf;
  bool nan = false;
  if constexpr (DT == kF32) {
    const int64_t body = n / kLanes * kLanes;
    bundle_max_nan(static_cast<const float*>(x), body, &mx, &nan);
    for (int64_t i = body; i < n; ++i) {
      const float v = load<DT>(x, i);
      mx = v > mx ? v : mx;
      nan = nan || v != v;
    }
  } else {
    alignas(64) float buf[kBlock];
    for (int64_t off = 0; off < n; off += kBlock) {
      const int64_t len = n - off < kBlock ? n - off : kBlock;
      for (int64_t i = 0; i < len; ++i) buf[i] = load<DT>(x, off + i);
      const int64_t padded = round_up_lanes(len);
      for (int64_t i = len; i < padded; ++i) buf[i] = kNegInf;
      bundle_max_nan(buf, padded, &mx, &nan);
    }
  }
  *mx_out = mx;
  *nan_out = nan;
}

template <int DT>
void scan_impl(const void* x, int64_t n, bool want_argmax, ScanResult* out) {
  max_nan<DT>(x, n, &out->max, &out->nan);
  out->argmax = want_argmax && !out->nan ? first_equal<DT>(x, n, out->max) : 0;
}

// sum of exp(x * inv_t - m) (or exp(x - m) without SCALED) over n values, in double lanes; with
// HIST also the values' ValueHistogram (`frac` = hist->top - m * kHistPerNat, in [0, 1)), which
// reads the same differences s - m and changes no bit of the sum.
// Values per fastmath::exp_neg_many call in the statistics: four native vectors.
constexpr int kExpGroup = 4 * kW;
constexpr float kLastBucket = static_cast<float>(kHistBuckets - 1);
constexpr float kHistLimit = 131072.0f;  // |m| below this: m * kHistPerNat + kHistBuckets is an exact float

template <int DT, bool SCALED, bool HIST>
double sum_exp_impl(const void* x, int64_t n, float inv_t, float m, float frac, ValueHistogram* hist, int32_t* used_slots) {
  static_assert(kBlock % kExpGroup == 0, "a block holds whole exp groups");
  alignas(64) float buf[kBlock];
  alignas(64) int32_t bucket[HIST ? kBlock : 1];
  vdouble acc[kDJ];
  for (int j = 0; j < kDJ; ++j) acc[j] = vdouble{};
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t len = n - off < kBlock ? n - off : kBlock;
    for (int64_t i = 0; i < len; ++i) {
      float s = load<DT>(x, off + i);
      if constexpr (SCALED) s = s * inv_t;
      buf[i] = s - m;
    }
    if constexpr (HIST) {
      // Grid steps below the top: frac - d * kHistPerNat >= 0 for d = s - m <= 0 (d * 32 is exact);
      // -inf (and anything deeper than the grid) lands in the last bucket. Slot 2j + (i & 1).
      for (int64_t i = 0; i < len; ++i) {
        const float steps = frac - buf[i] * kHistPerNat;
        bucket[i] = 2 * static_cast<int32_t>(steps < kLastBucket ? steps : kLastBucket) + static_cast<int32_t>(i & 1);
      }
      int32_t deepest = 0;
      for (int64_t i = 0; i < len; ++i) deepest = bucket[i] > deepest ? bucket[i] : deepest;
      *used_slots = deepest + 1 > *used_slots ? deepest + 1 : *used_slots;
    }
    // Padding gives exp 0 (clamped at -104), so the padded tail adds nothing to any lane.
    const int64_t grouped = (len + kExpGroup - 1) / kExpGroup * kExpGroup;
    for (int64_t i = len; i < grouped; ++i) buf[i] = kNegInf;
    for (int64_t i = 0; i < grouped; i += kExpGroup) fastmath::exp_neg_many<kExpGroup, true>(buf + i);  // z: largest term 1
    if constexpr (HIST) {
      for (int64_t i = 0; i < len; ++i) hist->slots[bucket[i]] += buf[i];
    }
    bundle_add(buf, round_up_lanes(len), acc);
  }
  return tree_sum(acc);
}

template <int DT, bool SCALED>
void stats_impl(const void* x, int64_t n, float inv_t, bool want_raw, StatsResult* out, ValueHistogram* hist) {
  float raw_max;
  bool nan;
  max_nan<DT>(x, n, &raw_max, &nan);
  out->raw_max = raw_max;
  out->nan = nan;
  out->m = kNegInf;
  out->z = 0.0;
  out->raw_z = 0.0;
  if (hist != nullptr) {  // (an empty histogram until the values are known to be usable)
    hist->valid = true;
    hist->top = 0;
    hist->used = 0;
  }
  // NaN / +inf make the line invalid; an all -inf piece contributes nothing; a non-finite scaled
  // maximum (temperature too small) makes the line invalid too.
  if (nan || !(raw_max > kNegInf && raw_max < fastmath::kPosInf)) return;
  const float m = SCALED ? raw_max * inv_t : raw_max;
  if (!(m > kNegInf && m < fastmath::kPosInf)) return;
  out->m = m;
  if (hist != nullptr && m > -kHistLimit && m < kHistLimit) {
    const float top = std::ceil(m * kHistPerNat);
    hist->top = static_cast<int64_t>(top);
    int32_t used_slots = 0;
    out->z = sum_exp_impl<DT, SCALED, true>(x, n, inv_t, m, top - m * kHistPerNat, hist, &used_slots);
    // Fold the two copies (in a fixed order) and leave the working space zero.
    const int32_t used = (used_slots + 1) / 2;
    for (int32_t j = 0; j < used; ++j) hist->mass[j] = hist->slots[2 * j] + hist->slots[2 * j + 1];
    for (int32_t j = 0; j < 2 * used; ++j) hist->slots[j] = 0.0f;
    hist->used = used;
  } else {
    if (hist != nullptr) hist->valid = false;
    out->z = sum_exp_impl<DT, SCALED, false>(x, n, inv_t, m, 0.0f, nullptr, nullptr);
  }
  if (want_raw) out->raw_z = SCALED ? sum_exp_impl<DT, false, false>(x, n, 1.0f, raw_max, 0.0f, nullptr, nullptr) : out->z;
}

void weights_impl(const float* s, int64_t n, float m, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = exp_neg(s[i] - m);
}

double mass_impl(const float* s, int64_t n, float m) {
  alignas(64) float buf[kBlock];
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t len = n - off < kBlock ? n - off : kBlock;
    for (int64_t i = 0; i < len; ++i) buf[i] = exp_neg(s[off + i] - m);
    const int64_t padded = (len + 7) / 8 * 8;
    for (int64_t i = len; i < padded; ++i) buf[i] = 0.0f;
    for (int64_t i = 0; i < padded; i += 8) {
      for (int l = 0; l < 8; ++l) acc[l] += static_cast<double>(buf[i + l]);
    }
  }
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// The values of a filtered line at or above `lo`: every lo <= s < hi stored, found 16 values at a
// time with compare masks, so the cost is about one read of the line plus the stored values (a
// group with several hits is compacted without branches: the out arrays take 16 entries of slack).
// With WINDOW (a finite hi) the values s >= hi are counted and their mass sum exp(s - m) is added
// up in double lanes instead, with the statistics' exp: it flushes only terms below 2^-126, which
// move a line's mass above the window (at least 1: it holds the maximum) by less than 2^-100.
template <int DT, bool SCALED, bool WINDOW>
int64_t collect_impl(const void* x, int64_t n, float inv_t, float lo, float hi, float m, int64_t id_base, float* out_s, int64_t* out_ids,
                     CollectStats* out) {
  alignas(64) float buf[kBlock];
  alignas(64) float weight[WINDOW ? kBlock : 1];
  vdouble acc[kDJ];
  for (int j = 0; j < kDJ; ++j) acc[j] = vdouble{};
  int64_t count = 0, above = 0;
  float mx = kNegInf;
  bool any_nan = false;
  const float below_hi = std::nextafter(hi, kNegInf);  // s > below_hi  <=>  s >= hi
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t len = n - off < kBlock ? n - off : kBlock;
    const int64_t padded = round_up_lanes(len);
    const float* values = buf;
    if (DT == kF32 && !SCALED && len == padded) {
      values = static_cast<const float*>(x) + off;
    } else {
      for (int64_t i = 0; i < len; ++i) {
        float s = load<DT>(x, off + i);
        if constexpr (SCALED) s = s * inv_t;
        buf[i] = s;
      }
      for (int64_t i = len; i < padded; ++i) buf[i] = kNegInf;  // >= lo only when lo is -inf: skipped below
    }
    bundle_max_nan(values, padded, &mx, &any_nan);
    if constexpr (WINDOW) {
      // (Values equal to hi = -inf weigh 0: a block without a value above it adds nothing.)
      if (bundle_count_above(values, padded, below_hi) > 0) {
        const int64_t grouped = (padded + kExpGroup - 1) / kExpGroup * kExpGroup;
        for (int64_t i = 0; i < padded; ++i) weight[i] = values[i] - m;
        for (int64_t i = padded; i < grouped; ++i) weight[i] = kNegInf;
        for (int64_t i = 0; i < grouped; i += kExpGroup) fastmath::exp_neg_many<kExpGroup, true>(weight + i);
        for (int64_t i = 0; i < padded; ++i) weight[i] = values[i] >= hi ? weight[i] : 0.0f;
        bundle_add(weight, padded, acc);
      }
    }
    for (int64_t i = 0; i < padded; i += kLanes) {
      const uint32_t valid = i + kLanes > len ? (1u << (len - i)) - 1u : 0xFFFFu;  // not the padding
      uint32_t mask = ge_mask16(values + i, lo) & valid;
      if constexpr (WINDOW) {
        const uint32_t high = ge_mask16(values + i, hi) & valid;
        above += __builtin_popcount(high);
        mask &= ~high;
      }
      if (mask == 0) continue;
      if ((mask & (mask - 1)) == 0) {  // one hit
        const int64_t at = i + __builtin_ctz(mask);
        out_s[count] = values[at];
        out_ids[count] = id_base + off + at;
        ++count;
        continue;
      }
      for (int l = 0; l < kLanes; ++l) {
        out_s[count] = values[i + l];
        out_ids[count] = id_base + off + i + l;
        count += (mask >> l) & 1u;
      }
    }
  }
  out->max_s = mx;
  out->nan = any_nan;
  out->above = above;
  out->above_mass = WINDOW ? tree_sum(acc) : 0.0;
  return count;
}

// ---------------------------------------------------------------------------------------------
// The race.

// Raise the race's shared best to `value` (a compare-and-swap loop on the float's bits).
SPECDEC_ALWAYS_INLINE void publish_best(const RaceArgs* a, float value) {
  if (a->shared_best == nullptr) return;
  const uint32_t bits = fastmath::float_to_bits(value);
  uint32_t seen = __atomic_load_n(a->shared_best, __ATOMIC_RELAXED);
  while (seen < bits && !__atomic_compare_exchange_n(a->shared_best, &seen, bits, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

SPECDEC_ALWAYS_INLINE float known_best(const RaceArgs* a, const RaceBest* best) {
  if (a->shared_best == nullptr) return best->value;
  const float shared = fastmath::bits_to_float(__atomic_load_n(a->shared_best, __ATOMIC_RELAXED));
  return shared > best->value ? shared : best->value;
}

// r / E with E = -log(u): the race value of one id (the sparse path; same arithmetic as the block loop).
SPECDEC_ALWAYS_INLINE float race_value(float r, uint32_t id, const RaceArgs* a) {
  const float u = philox::to_uniform(philox::race_word(id, a->p_lo, a->p_hi, a->stream, a->key0, a->key1));
  return r / -log_pos(u);
}

// Whether the law zeroes id v (a handful of ids: a linear scan).
SPECDEC_ALWAYS_INLINE bool excluded_id(const Residual* a, int64_t v) {
  for (int64_t e = 0; e < a->num_excluded; ++e) {
    if (a->excluded[e] == v) return true;
  }
  return false;
}

// r(v) of one id from its processed logit s (kernel.h: Residual). The same float operations as
// the block loops below (apply_residual), so the same value.
template <int DDT, bool SCALED>
SPECDEC_ALWAYS_INLINE float residual_at(const Residual* a, int64_t v, float s, float p_inv, float q_inv) {
  float r = s >= a->p_tau ? exp_neg(s - a->p_max) * p_inv : 0.0f;
  if (a->residual) {
    r = r * a->p_scale;
    if constexpr (DDT != kNoDraft) {
      if (v < a->draft_vocab) {
        float sq = load<DDT>(a->draft, v);
        if constexpr (SCALED) sq = sq * a->inv_t;
        const float q = sq >= a->q_tau ? exp_neg(sq - a->q_max) * q_inv : 0.0f;
        const float d = r - a->q_scale * q;
        r = d > 0.0f ? d : 0.0f;
      }
    }
    if (excluded_id(a, v)) r = 0.0f;
  }
  return r;
}

// exp(x[i]) for i < len (x <= 0; len <= kBlock, x holding kBlock values), in place, in groups of
// kExpGroup values through fastmath::exp_neg_many (the same operations as exp_neg for each value;
// a loop calling exp_neg per element does not vectorise).
SPECDEC_ALWAYS_INLINE void exp_block(float* x, int64_t len) {
  const int64_t grouped = (len + kExpGroup - 1) / kExpGroup * kExpGroup;
  for (int64_t i = len; i < grouped; ++i) x[i] = kNegInf;
  for (int64_t i = 0; i < grouped; i += kExpGroup) fastmath::exp_neg_many<kExpGroup>(x + i);
}

// r over ids [v0, v0 + len), or (LIST) over the ascending ids[0, len), given r = p there: the
// residual's scale, draft and exclusions. (The law's fields are read into locals first: a float
// store to r could otherwise alias them.)
template <int DDT, bool SCALED, bool LIST>
SPECDEC_ALWAYS_INLINE void apply_residual(const Residual* a, int64_t v0, const int64_t* ids, int64_t len, float q_inv, float* r) {
  const float p_scale = a->p_scale, q_scale = a->q_scale, inv_t = a->inv_t, q_max = a->q_max, q_tau = a->q_tau;
  if (p_scale != 1.0f) {
    for (int64_t i = 0; i < len; ++i) r[i] = r[i] * p_scale;
  }
  if constexpr (DDT != kNoDraft) {
    alignas(64) float sq[kBlock];
    alignas(64) float q[kBlock];
    const void* draft = a->draft;
    const int64_t draft_vocab = a->draft_vocab;
    // A range is dense up to the draft's vocabulary; a list has its ids beyond it skipped (q = 0).
    int64_t count = len;
    if constexpr (!LIST) {
      count = draft_vocab - v0;
      count = count < 0 ? 0 : (count > len ? len : count);
    }
    for (int64_t i = 0; i < count; ++i) {
      const int64_t v = LIST ? ids[i] : v0 + i;
      float x = load<DDT>(draft, LIST && v >= draft_vocab ? 0 : v);
      if constexpr (SCALED) x = x * inv_t;
      sq[i] = x;
      q[i] = x - q_max;
    }
    exp_block(q, count);
    for (int64_t i = 0; i < count; ++i) {
      const float qv = sq[i] >= q_tau ? q[i] * q_inv : 0.0f;
      const float d = r[i] - q_scale * qv;
      const float residual = d > 0.0f ? d : 0.0f;
      r[i] = LIST && ids[i] >= draft_vocab ? r[i] : residual;
    }
  }
  for (int64_t e = 0; e < a->num_excluded; ++e) {
    const int64_t v = a->excluded[e];
    if constexpr (LIST) {
      int64_t lo = 0, hi = len;  // first index with ids[i] >= v
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (ids[mid] < v) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      if (lo < len && ids[lo] == v) r[lo] = 0.0f;
    } else if (v >= v0 && v < v0 + len) {
      r[v - v0] = 0.0f;
    }
  }
}

// p over ids [v0, v0 + len) from their processed logits s (0 below the filter's threshold); r
// holds kBlock values.
SPECDEC_ALWAYS_INLINE void probs_block(const Residual* a, const float* s, int64_t len, float p_inv, float* r) {
  const float p_max = a->p_max, p_tau = a->p_tau;
  for (int64_t i = 0; i < len; ++i) r[i] = s[i] - p_max;
  exp_block(r, len);
  for (int64_t i = 0; i < len; ++i) r[i] = s[i] >= p_tau ? r[i] * p_inv : 0.0f;
}

// The largest processed logit an id may have and still be unable to win, given a bound on r:
// s <= cut implies p(v) = exp(s - m) / z <= (bound / p_scale) * e^-0.001 (computed in double, with
// a margin far above the float rounding of s - m, of exp and of adding up to 24 ln 2 to the cut in
// float32), so r <= p_scale * p <= bound (p_scale = 1 unless a residual scales p).
SPECDEC_ALWAYS_INLINE float logit_cut(const RaceArgs* a, float bound) {
  if (!(bound > 0.0f)) return kNegInf;
  double p_bound = static_cast<double>(bound);
  if (a->residual) p_bound /= static_cast<double>(a->p_scale);
  double cut = static_cast<double>(a->p_max) + std::log(p_bound * static_cast<double>(a->p_norm));
  cut -= 1e-3 + (std::fabs(cut) + 20.0) * 2.5e-7;
  float cut_f = static_cast<float>(cut);
  if (static_cast<double>(cut_f) > cut) cut_f = std::nextafter(cut_f, kNegInf);
  return cut_f;
}

// Race values r / E of one block (r[0, padded), padded a multiple of kLanes, zero past len) for ids
// ids[i] (or v0 + i when ids is null); updates *best: strictly greater wins, so the lowest id
// among equal values (ids ascend).
//
// An id can only win if r / E > best. Every E = -log(u) is at least -log(1 - 2^-24) = 5.96e-8
// (u <= 1 - 2^-24), so r <= best * 5e-8 gives r / E <= 0.84 * best: such ids are skipped without
// drawing their exponential. This changes no result, only the work.
// `known_words`: the race words of the block's ids when the caller already drew them (else null).
SPECDEC_ALWAYS_INLINE void race_block(const float* r, const uint32_t* ids, int64_t v0, int64_t len, int64_t padded, float bound, const RaceArgs* a,
                                      RaceBest* best, const uint32_t* known_words) {
  alignas(64) float value[kBlock];
  alignas(64) uint32_t drawn[kBlock];
  const int64_t candidates = bundle_count_above(r, padded, bound);
  if (candidates == 0) return;
  auto id_at = [&](int64_t i) -> int64_t { return ids != nullptr ? static_cast<int64_t>(ids[i]) : v0 + i; };
  if (candidates * 16 <= len) {
    // Few candidates (top-k / top-p, a peaked distribution): scalar draws for them only.
    for (int64_t i = 0; i < len; ++i) {
      if (r[i] > bound) {
        const float v = known_words != nullptr ? r[i] / -log_pos(philox::to_uniform(known_words[i])) : race_value(r[i], static_cast<uint32_t>(id_at(i)), a);
        if (v > best->value) {
          best->value = v;
          best->index = id_at(i);
          publish_best(a, v);
        }
      }
    }
    return;
  }
#if defined(__x86_64__) && SPECDEC_VBYTES == 64
  if (candidates * 4 <= len * 3) {
    // Compress the candidates (vpcompressd) so Philox and the log run only on them.
    alignas(64) float kept_r[kBlock];
    alignas(64) uint32_t kept_ids[kBlock];
    alignas(64) uint32_t kept_words[kBlock];
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 limit = _mm512_set1_ps(bound);
    int64_t count = 0;
    for (int64_t i = 0; i < padded; i += kLanes) {
      const __m512 rv = _mm512_loadu_ps(r + i);
      const __mmask16 mask = _mm512_cmp_ps_mask(rv, limit, _CMP_GT_OQ);
      const __m512i idv = ids != nullptr ? _mm512_loadu_si512(ids + i) : _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(v0 + i)), iota);
      _mm512_mask_compressstoreu_ps(kept_r + count, mask, rv);
      _mm512_mask_compressstoreu_epi32(kept_ids + count, mask, idv);
      if (known_words != nullptr) _mm512_mask_compressstoreu_epi32(kept_words + count, mask, _mm512_loadu_si512(known_words + i));
      count += __builtin_popcount(static_cast<unsigned>(mask));
    }
    const int64_t kept_padded = round_up_lanes(count);
    for (int64_t i = count; i < kept_padded; ++i) {
      kept_r[i] = 0.0f;
      kept_ids[i] = 0;
      kept_words[i] = 0;
    }
    if (known_words == nullptr) race_words_list(a, kept_ids, kept_padded, kept_words);
    for (int64_t i = 0; i < kept_padded; ++i) value[i] = kept_r[i] / -log_pos(philox::to_uniform(kept_words[i]));
    const float block_max = bundle_max(value, kept_padded, 0.0f);
    if (block_max > best->value) {
      int64_t at = 0;
      while (value[at] != block_max) ++at;
      best->value = block_max;
      best->index = kept_ids[at];
      publish_best(a, block_max);
    }
    return;
  }
#endif
  const uint32_t* words = known_words;
  if (words == nullptr) {
    if (ids != nullptr) {
      race_words_list(a, ids, padded, drawn);
    } else {
      race_words_groups(a, static_cast<uint32_t>(v0), padded, drawn);
    }
    words = drawn;
  }
  for (int64_t i = 0; i < padded; ++i) value[i] = r[i] / -log_pos(philox::to_uniform(words[i]));
  const float block_max = bundle_max(value, padded, 0.0f);
  if (block_max > best->value) {
    int64_t at = 0;
    while (value[at] != block_max) ++at;
    best->value = block_max;
    best->index = id_at(at);
    publish_best(a, block_max);
  }
}

// The race over ids [begin, begin + n) (begin a multiple of 4). Per block of 512 ids: the processed
// logits s first; the ids whose s cannot reach the current bound (logit_cut) are dropped before
// any exp; a block without a candidate costs one read; few candidates are drawn one by one;
// otherwise r is computed for the whole block and race_block draws what survives its bound.
template <int TDT, int DDT, bool SCALED>
void race_impl(const RaceArgs* a, int64_t begin, int64_t n, RaceBest* best) {
  alignas(64) float s[kBlock];
  alignas(64) float r[kBlock];
  alignas(64) float cut_of[kBlock];
  alignas(64) uint32_t words[kBlock];
  const float p_inv = 1.0f / a->p_norm, q_inv = 1.0f / a->q_norm;
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t len = n - off < kBlock ? n - off : kBlock;
    const int64_t v0 = begin + off;
    const int64_t padded = round_up_lanes(len);
    for (int64_t i = 0; i < len; ++i) {
      float x = load<TDT>(a->target, v0 + i);
      if constexpr (SCALED) x = x * a->inv_t;
      s[i] = x;
    }
    for (int64_t i = len; i < padded; ++i) s[i] = kNegInf;
    const float bound = known_best(a, best) * kPruneFactor;
    // Below the filter's threshold p is 0; below the cut it is too small to win.
    const float cut_tau = std::nextafter(a->p_tau, kNegInf);  // s > cut_tau  <=>  s >= tau
    const float cut_bound = logit_cut(a, bound);
    const float cut = cut_tau > cut_bound ? cut_tau : cut_bound;
    const int64_t alive = bundle_count_above(s, padded, cut);
    if (alive == 0) continue;
    if (alive * 16 <= len) {
      for (int64_t i = 0; i < padded; i += kLanes) {
        uint32_t mask = gt_mask16(s + i, cut);
        while (mask != 0) {
          const int64_t at = i + __builtin_ctz(mask);
          mask &= mask - 1;
          const float rv = residual_at<DDT, SCALED>(a, v0 + at, s[at], p_inv, q_inv);
          if (rv > bound) {
            const float v = race_value(rv, static_cast<uint32_t>(v0 + at), a);
            if (v > best->value) {
              best->value = v;
              best->index = v0 + at;
              publish_best(a, v);
            }
          }
        }
      }
      continue;
    }
    // Many ids are left: draw their words (one Philox evaluation per four ids) and prune with each
    // id's own exponential bound, E = -log u >= 1 - u >= 2^b (b the binary exponent of 1 - u, exact
    // in float32): an id whose s <= cut(best) + b * ln 2 has r / E < best, so it needs no exp, log
    // or divide. (Most ids have u < 1/2, i.e. b = -1: they go unless p > best / 2.)
    race_words_groups(a, static_cast<uint32_t>(v0), padded, words);
    const float base = logit_cut(a, known_best(a, best));
    if (base > kNegInf) {
      for (int64_t i = 0; i < padded; ++i) {
        const float one_minus_u = 1.0f - philox::to_uniform(words[i]);
        const int32_t b = static_cast<int32_t>(fastmath::float_to_bits(one_minus_u) >> 23) - 127;
        const float own_cut = base + static_cast<float>(b) * kLn2Up;
        cut_of[i] = own_cut > cut ? own_cut : cut;
      }
      const int64_t kept = count_above_each(s, cut_of, padded);
      if (kept == 0) continue;
      if (kept * 16 <= len) {
        for (int64_t i = 0; i < padded; i += kLanes) {
          uint32_t mask = gt_each_mask16(s + i, cut_of + i);
          while (mask != 0) {
            const int64_t at = i + __builtin_ctz(mask);
            mask &= mask - 1;
            const float rv = residual_at<DDT, SCALED>(a, v0 + at, s[at], p_inv, q_inv);
            if (rv > 0.0f) {
              const float v = rv / -log_pos(philox::to_uniform(words[at]));
              if (v > best->value) {
                best->value = v;
                best->index = v0 + at;
                publish_best(a, v);
              }
            }
          }
        }
        continue;
      }
    }
    probs_block(a, s, len, p_inv, r);
    if (a->residual) apply_residual<DDT, SCALED, false>(a, v0, nullptr, len, q_inv, r);
    for (int64_t i = len; i < padded; ++i) r[i] = 0.0f;
    race_block(r, nullptr, v0, len, padded, bound, a, best, words);
  }
}

// The race over a list of ascending ids, in blocks: the same arithmetic as race_impl (so the same
// winner), with gathered loads, and Philox counters taken from the list.
template <int TDT, int DDT, bool SCALED>
void race_list_impl(const RaceArgs* a, const int64_t* ids, int64_t count, RaceBest* best) {
  alignas(64) float s[kBlock];
  alignas(64) float r[kBlock];
  alignas(64) uint32_t ids32[kBlock];
  const float p_inv = 1.0f / a->p_norm, q_inv = 1.0f / a->q_norm, inv_t = a->inv_t;
  const void* target = a->target;
  for (int64_t off = 0; off < count; off += kBlock) {
    const int64_t len = count - off < kBlock ? count - off : kBlock;
    if (len <= 0) break;  // (never: tells GCC's array-bounds analysis that len is positive)
    const int64_t* block = ids + off;
    for (int64_t i = 0; i < len; ++i) {
      float x = load<TDT>(target, block[i]);
      if constexpr (SCALED) x = x * inv_t;
      s[i] = x;
    }
    probs_block(a, s, len, p_inv, r);
    if (a->residual) apply_residual<DDT, SCALED, true>(a, 0, block, len, q_inv, r);
    const int64_t padded = round_up_lanes(len);
    for (int64_t i = len; i < padded; ++i) r[i] = 0.0f;
    for (int64_t i = 0; i < len; ++i) ids32[i] = static_cast<uint32_t>(block[i]);
    for (int64_t i = len; i < padded; ++i) ids32[i] = 0;
    race_block(r, ids32, 0, len, padded, known_best(a, best) * kPruneFactor, a, best, nullptr);
  }
}

// ---------------------------------------------------------------------------------------------
// The residual's mass: sum r(y) in double lanes, r as the race evaluates it.

// Over ids [begin, begin + n), or (LIST) over the ascending ids[0, n).
template <int TDT, int DDT, bool SCALED, bool LIST>
double residual_mass_impl(const Residual* a, int64_t begin, const int64_t* ids, int64_t n) {
  alignas(64) float s[kBlock];
  alignas(64) float r[kBlock];
  vdouble acc[kDJ];
  for (int j = 0; j < kDJ; ++j) acc[j] = vdouble{};
  const float p_inv = 1.0f / a->p_norm, q_inv = 1.0f / a->q_norm, inv_t = a->inv_t;
  const void* target = a->target;
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t len = n - off < kBlock ? n - off : kBlock;
    const int64_t v0 = begin + off;
    const int64_t* block = LIST ? ids + off : nullptr;
    for (int64_t i = 0; i < len; ++i) {
      float x = load<TDT>(target, LIST ? block[i] : v0 + i);
      if constexpr (SCALED) x = x * inv_t;
      s[i] = x;
    }
    probs_block(a, s, len, p_inv, r);
    if (a->residual) apply_residual<DDT, SCALED, LIST>(a, v0, block, len, q_inv, r);
    const int64_t padded = round_up_lanes(len);
    for (int64_t i = len; i < padded; ++i) r[i] = 0.0f;
    bundle_add(r, padded, acc);
  }
  return tree_sum(acc);
}

// ---------------------------------------------------------------------------------------------
// Dispatch on storage types and on whether a temperature scales the logits: F<TDT, DDT, SCALED>::run
// for a law's target and draft storage types (DDT = kNoDraft when the law reads no draft).

template <template <int, int, bool> class F, int TDT, int DDT, typename... Args>
SPECDEC_ALWAYS_INLINE auto with_scaling(const Residual* a, Args... args) {
  if (a->inv_t == 1.0f) return F<TDT, DDT, false>::run(args...);
  return F<TDT, DDT, true>::run(args...);
}

template <template <int, int, bool> class F, int TDT, typename... Args>
SPECDEC_ALWAYS_INLINE auto with_draft(const Residual* a, Args... args) {
  if (a->draft == nullptr || !a->residual) return with_scaling<F, TDT, kNoDraft>(a, args...);
  if (a->draft_dtype == kF32) return with_scaling<F, TDT, kF32>(a, args...);
  if (a->draft_dtype == kBF16) return with_scaling<F, TDT, kBF16>(a, args...);
  return with_scaling<F, TDT, kF16>(a, args...);
}

template <template <int, int, bool> class F, typename... Args>
auto dispatch_law(const Residual* a, Args... args) {
  if (a->target_dtype == kF32) return with_draft<F, kF32>(a, args...);
  if (a->target_dtype == kBF16) return with_draft<F, kBF16>(a, args...);
  return with_draft<F, kF16>(a, args...);
}

template <int TDT, int DDT, bool SCALED>
struct RaceRange {
  static void run(const RaceArgs* a, int64_t begin, int64_t n, RaceBest* best) { race_impl<TDT, DDT, SCALED>(a, begin, n, best); }
};
template <int TDT, int DDT, bool SCALED>
struct RaceList {
  static void run(const RaceArgs* a, const int64_t* ids, int64_t count, RaceBest* best) { race_list_impl<TDT, DDT, SCALED>(a, ids, count, best); }
};
template <int TDT, int DDT, bool SCALED>
struct MassRange {
  static double run(const Residual* a, int64_t begin, int64_t n) { return residual_mass_impl<TDT, DDT, SCALED, false>(a, begin, nullptr, n); }
};
template <int TDT, int DDT, bool SCALED>
struct MassList {
  static double run(const Residual* a, const int64_t* ids, int64_t count) { return residual_mass_impl<TDT, DDT, SCALED, true>(a, 0, ids, count); }
};

void race(const RaceArgs* a, int64_t begin, int64_t n, RaceBest* best) { dispatch_law<RaceRange>(a, a, begin, n, best); }
void race_list(const RaceArgs* a, const int64_t* ids, int64_t count, RaceBest* best) { dispatch_law<RaceList>(a, a, ids, count, best); }
double residual_mass(const Residual* a, int64_t begin, int64_t n) { return dispatch_law<MassRange>(a, a, begin, n); }
double residual_mass_list(const Residual* a, const int64_t* ids, int64_t count) { return dispatch_law<MassList>(a, a, ids, count); }

template <int DT, bool SCALED>
int64_t collect_window(const void* x, int64_t n, float inv_t, float lo, float hi, float m, int64_t id_base, float* out_s, int64_t* out_ids,
                       CollectStats* out) {
  if (hi < fastmath::kPosInf) return collect_impl<DT, SCALED, true>(x, n, inv_t, lo, hi, m, id_base, out_s, out_ids, out);
  return collect_impl<DT, SCALED, false>(x, n, inv_t, lo, hi, m, id_base, out_s, out_ids, out);
}

template <int DT>
int64_t collect_scaled(const void* x, int64_t n, float inv_t, float lo, float hi, float m, int64_t id_base, float* out_s, int64_t* out_ids,
                       CollectStats* out) {
  if (inv_t == 1.0f) return collect_window<DT, false>(x, n, inv_t, lo, hi, m, id_base, out_s, out_ids, out);
  return collect_window<DT, true>(x, n, inv_t, lo, hi, m, id_base, out_s, out_ids, out);
}

int64_t collect(const void* x, int32_t dtype, int64_t n, float inv_t, float lo, float hi, float m, int64_t id_base, float* out_s, int64_t* out_ids,
                CollectStats* out) {
  if (dtype == kF32) return collect_scaled<kF32>(x, n, inv_t, lo, hi, m, id_base, out_s, out_ids, out);
  if (dtype == kBF16) return collect_scaled<kBF16>(x, n, inv_t, lo, hi, m, id_base, out_s, out_ids, out);
  return collect_scaled<kF16>(x, n, inv_t, lo, hi, m, id_base, out_s, out_ids, out);
}

void scan(const void* x, int32_t dtype, int64_t n, bool want_argmax, ScanResult* out) {
  if (dtype == kF32) {
    scan_impl<kF32>(x, n, want_argmax, out);
  } else if (dtype == kBF16) {
    scan_impl<kBF16>(x, n, want_argmax, out);
  } else {
    scan_impl<kF16>(x, n, want_argmax, out);
  }
}

template <int DT>
void stats_scaled(const void* x, int64_t n, float inv_t, bool want_raw, StatsResult* out, ValueHistogram* hist) {
  if (inv_t == 1.0f) return stats_impl<DT, false>(x, n, inv_t, want_raw, out, hist);
  return stats_impl<DT, true>(x, n, inv_t, want_raw, out, hist);
}

void stats(const void* x, int32_t dtype, int64_t n, float inv_t, bool want_raw, StatsResult* out, ValueHistogram* hist) {
  if (dtype == kF32) return stats_scaled<kF32>(x, n, inv_t, want_raw, out, hist);
  if (dtype == kBF16) return stats_scaled<kBF16>(x, n, inv_t, want_raw, out, hist);
  return stats_scaled<kF16>(x, n, inv_t, want_raw, out, hist);
}

#define SPECDEC_STRINGIFY2(x) #x
#define SPECDEC_STRINGIFY(x) SPECDEC_STRINGIFY2(x)
#ifndef SPECDEC_ISA_NAME
#define SPECDEC_ISA_NAME SPECDEC_STRINGIFY(SPECDEC_ISA)
#endif

const Kernels kTable = {SPECDEC_ISA_NAME, scan, stats, mass_impl, weights_impl, collect, race, race_list, residual_mass, residual_mass_list,
                        race_words_groups, race_words_list};

}  // namespace
}  // namespace SPECDEC_ISA
}  // namespace specdec
// (The including file defines SPECDEC_ISA::kernels() after its target region: an exported function
// keeps the declaration's plain target, so no compiler treats it as a multiversioned function.)
