// The vectorised loops behind kernel.h. Included by kernel_avx512.cpp, kernel_avx2.cpp and
// kernel_base.cpp after their `#pragma GCC target`, with SPECDEC_ISA naming the namespace and
// SPECDEC_VBYTES the native vector width in bytes (64, 32 or 16).
//
// Two kinds of loops:
// * element-wise loops over small stack blocks (`out[i] = f(in[i])`: exp, log, probabilities),
//   which GCC vectorises on its own (checked with -fopt-info-vec);
// * reductions (max, sums, counts), written with GCC vector types as a bundle of 16 lanes held in
//   16 / (native width) registers. Element i always lands in lane i % 16 and the 16 lanes are
//   combined by one fixed tree, so every instruction set (and every thread count) adds in the
//   same order: the AVX2 and AVX-512 builds agree bit for bit, and the SSE2 build differs only
//   through the last bit of its unfused exp / log (fastmath.h).
//
// Philox needs 32x32->64-bit products; the vectoriser picks slow 64-bit multiplies for them, so
// that loop uses the pmuludq intrinsics directly (even / odd lanes). The race (race_block) skips
// the ids that provably cannot win before drawing their exponentials.
#ifndef SPECDEC_ISA
#error "define SPECDEC_ISA before including kernel_impl.h"
#endif
#ifndef SPECDEC_VBYTES
#define SPECDEC_VBYTES 16
#endif

#include "fastmath.h"
#include "kernel.h"
#include "philox.h"

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
constexpr int64_t kBlock = 512;         // element-wise block (a multiple of kLanes), kept on the stack
constexpr int kNoDraft = -1;
constexpr int64_t kPrefetchBlocks = 4;  // software prefetch distance of the one-pass statistics
constexpr float kPruneFactor = 5e-8f;  // below -log(1 - 2^-24), the smallest exponential

typedef float vfloat __attribute__((vector_size(SPECDEC_VBYTES)));
typedef int32_t vint __attribute__((vector_size(SPECDEC_VBYTES)));

inline __attribute__((always_inline)) vfloat vload(const float* p) {
  vfloat v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

template <int DT>
inline __attribute__((always_inline)) float load(const void* p, int64_t i) {
  if constexpr (DT == kF32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (DT == kBF16) {
    return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  } else {
    return half_to_float(static_cast<const uint16_t*>(p)[i]);
  }
}

// Lane l of a bundle is acc[l / kW][l % kW]; the tree below is the same for every kW.
SPECDEC_ALWAYS_INLINE float tree_sum(const vfloat* acc) {
  float lanes[kLanes];
  for (int j = 0; j < kJ; ++j) {
    for (int l = 0; l < kW; ++l) lanes[j * kW + l] = acc[j][l];
  }
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

// acc += values[0, n) with n a multiple of kLanes.
SPECDEC_ALWAYS_INLINE void bundle_add(const float* values, int64_t n, vfloat* acc) {
  for (int64_t i = 0; i < n; i += kLanes) {
#pragma GCC unroll 4
    for (int j = 0; j < kJ; ++j) acc[j] += vload(values + i + j * kW);
  }
}

// Max of values[0, n) (n a multiple of kLanes) into *mx, OR of NaN flags into *nan.
SPECDEC_ALWAYS_INLINE void bundle_max_nan(const float* values, int64_t n, float* mx, bool* nan) {
  vfloat m[kJ];
  vint flag[kJ];
  for (int j = 0; j < kJ; ++j) {
    m[j] = vfloat{} + *mx;
    flag[j] = vint{};
  }
  for (int64_t i = 0; i < n; i += kLanes) {
#pragma GCC unroll 4
    for (int j = 0; j < kJ; ++j) {
      const vfloat v = vload(values + i + j * kW);
      m[j] = v > m[j] ? v : m[j];
      flag[j] |= v != v;
    }
  }
  float out = *mx;
  int32_t any = 0;
  for (int j = 0; j < kJ; ++j) {
    for (int l = 0; l < kW; ++l) {
      out = m[j][l] > out ? m[j][l] : out;
      any |= flag[j][l];
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

// ---------------------------------------------------------------------------------------------
// Philox word 0 for ids [v0, v0 + n): 16 / 8 / 4 ids per step with pmuludq.

#if defined(__x86_64__) && SPECDEC_VBYTES == 64
// AVX-512: even and odd ids in separate registers of 64-bit lanes whose low words hold the state.
// pmuludq reads only the low words, so the high words may hold garbage and no re-packing is
// needed between rounds (12 instead of 14 operations per round and 16 ids).
#define SPECDEC_PHILOX_AVX512 1
#elif defined(__x86_64__) && SPECDEC_VBYTES == 32
typedef __m256i vphilox;
inline vphilox p_set1(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
inline vphilox p_xor3(vphilox a, vphilox b, vphilox c) { return _mm256_xor_si256(_mm256_xor_si256(a, b), c); }
inline vphilox p_ids(uint32_t base) { return _mm256_add_epi32(p_set1(base), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
inline void p_mulhilo(vphilox a, vphilox b, vphilox* hi, vphilox* lo) {
  const vphilox even = _mm256_mul_epu32(a, b);
  const vphilox odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), b);
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}
inline void p_store(uint32_t* out, vphilox x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), x); }
inline vphilox p_load(const uint32_t* in) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)); }
#define SPECDEC_HAVE_PHILOX_SIMD 1
#elif defined(__x86_64__)
typedef __m128i vphilox;
inline vphilox p_set1(uint32_t x) { return _mm_set1_epi32(static_cast<int>(x)); }
inline vphilox p_xor3(vphilox a, vphilox b, vphilox c) { return _mm_xor_si128(_mm_xor_si128(a, b), c); }
inline vphilox p_ids(uint32_t base) { return _mm_add_epi32(p_set1(base), _mm_setr_epi32(0, 1, 2, 3)); }
inline void p_mulhilo(vphilox a, vphilox b, vphilox* hi, vphilox* lo) {
  const vphilox even = _mm_mul_epu32(a, b);                       // [lo0 hi0 lo2 hi2]
  const vphilox odd = _mm_mul_epu32(_mm_srli_epi64(a, 32), b);    // [lo1 hi1 lo3 hi3]
  const vphilox first = _mm_unpacklo_epi32(even, odd);            // [lo0 lo1 hi0 hi1]
  const vphilox second = _mm_unpackhi_epi32(even, odd);           // [lo2 lo3 hi2 hi3]
  *lo = _mm_unpacklo_epi64(first, second);
  *hi = _mm_unpackhi_epi64(first, second);
}
inline void p_store(uint32_t* out, vphilox x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(out), x); }
inline vphilox p_load(const uint32_t* in) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(in)); }
#define SPECDEC_HAVE_PHILOX_SIMD 1
#endif

// out[i] = word 0 of Philox(id_i, position, row, sample stream) for i < n (n a multiple of kLanes),
// with id_i = ids[i], or v0 + i when ids is null.
void philox_block(const uint32_t* ids, uint32_t v0, int64_t n, uint32_t position, uint32_t row, uint32_t key0, uint32_t key1, uint32_t* out) {
#if defined(SPECDEC_PHILOX_AVX512)
  const __m512i round_a = _mm512_set1_epi64(philox::kRoundA), round_b = _mm512_set1_epi64(philox::kRoundB);
  __m512i keys0[10], keys1[10];
  for (int r = 0; r < 10; ++r) {
    keys0[r] = _mm512_set1_epi64(key0 + static_cast<uint32_t>(r) * philox::kKeyA);
    keys1[r] = _mm512_set1_epi64(key1 + static_cast<uint32_t>(r) * philox::kKeyB);
  }
  const __m512i c1_init = _mm512_set1_epi64(position), c2_init = _mm512_set1_epi64(row);
  const __m512i c3_init = _mm512_set1_epi64(philox::kSampleStream);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t i = 0; i < n; i += 16) {
    // 16 ids as 32-bit lanes: the even ones already sit in the low words of the 64-bit lanes.
    const __m512i x = ids != nullptr ? _mm512_loadu_si512(ids + i) : _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(v0 + static_cast<uint32_t>(i))), iota);
    __m512i e0 = x, e1 = c1_init, e2 = c2_init, e3 = c3_init;
    __m512i o0 = _mm512_srli_epi64(x, 32), o1 = c1_init, o2 = c2_init, o3 = c3_init;
#pragma GCC unroll 10
    for (int r = 0; r < 10; ++r) {
      const __m512i prod_be = _mm512_mul_epu32(e2, round_b), prod_ae = _mm512_mul_epu32(e0, round_a);
      const __m512i prod_bo = _mm512_mul_epu32(o2, round_b), prod_ao = _mm512_mul_epu32(o0, round_a);
      e0 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(prod_be, 32), e1, keys0[r], 0x96);
      e2 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(prod_ae, 32), e3, keys1[r], 0x96);
      e1 = prod_be;
      e3 = prod_ae;
      o0 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(prod_bo, 32), o1, keys0[r], 0x96);
      o2 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(prod_ao, 32), o3, keys1[r], 0x96);
      o1 = prod_bo;
      o3 = prod_ao;
    }
    _mm512_storeu_si512(out + i, _mm512_mask_blend_epi32(0xAAAA, e0, _mm512_slli_epi64(o0, 32)));
  }
#elif defined(SPECDEC_HAVE_PHILOX_SIMD)
  constexpr int kStep = SPECDEC_VBYTES / 4;
  const vphilox round_a = p_set1(philox::kRoundA), round_b = p_set1(philox::kRoundB);
  vphilox keys0[10], keys1[10];
  for (int r = 0; r < 10; ++r) {
    keys0[r] = p_set1(key0 + static_cast<uint32_t>(r) * philox::kKeyA);
    keys1[r] = p_set1(key1 + static_cast<uint32_t>(r) * philox::kKeyB);
  }
  const vphilox c1_init = p_set1(position), c2_init = p_set1(row), c3_init = p_set1(philox::kSampleStream);
  for (int64_t i = 0; i < n; i += kStep) {
    vphilox c0 = ids != nullptr ? p_load(ids + i) : p_ids(v0 + static_cast<uint32_t>(i)), c1 = c1_init, c2 = c2_init, c3 = c3_init;
#pragma GCC unroll 10
    for (int r = 0; r < 10; ++r) {
      vphilox hi_b, lo_b, hi_a, lo_a;
      p_mulhilo(c2, round_b, &hi_b, &lo_b);
      p_mulhilo(c0, round_a, &hi_a, &lo_a);
      c0 = p_xor3(hi_b, c1, keys0[r]);
      c2 = p_xor3(hi_a, c3, keys1[r]);
      c1 = lo_b;
      c3 = lo_a;
    }
    p_store(out + i, c0);
  }
#else
  for (int64_t i = 0; i < n; ++i) {
    out[i] = philox::word0(ids != nullptr ? ids[i] : v0 + static_cast<uint32_t>(i), position, row, philox::kSampleStream, key0, key1);
  }
#endif
}

// ---------------------------------------------------------------------------------------------

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

template <int DT>
void scan_impl(const void* x, int64_t n, bool want_argmax, ScanResult* out) {
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
  out->max = mx;
  out->nan = nan;
  out->argmax = want_argmax && !nan ? first_equal<DT>(x, n, mx) : 0;
}

template <int DT, bool SCALED>
float sum_exp_impl(const void* x, int64_t n, float scale, float m) {
  alignas(64) float buf[kBlock];
  vfloat acc[kJ];
  for (int j = 0; j < kJ; ++j) acc[j] = vfloat{};
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t len = n - off < kBlock ? n - off : kBlock;
    for (int64_t i = 0; i < len; ++i) {
      float s = load<DT>(x, off + i);
      if constexpr (SCALED) s = s / scale;
      buf[i] = exp_neg(s - m);
    }
    const int64_t padded = round_up_lanes(len);
    for (int64_t i = len; i < padded; ++i) buf[i] = 0.0f;
    bundle_add(buf, padded, acc);
  }
  return tree_sum(acc);
}

// One pass: each 512-value block is read from memory once, its max found, then its exps summed
// while it sits in L1. The running sum is kept relative to the running max and rescaled when a
// later block raises the max (rare after the first blocks), so memory streaming and the exp work
// interleave instead of running as two passes.
template <int DT, bool SCALED>
void stats_impl(const void* x, int64_t n, float scale, StatsResult* out) {
  alignas(64) float raw[kBlock];
  alignas(64) float buf[kBlock];
  vfloat acc[kJ];
  for (int j = 0; j < kJ; ++j) acc[j] = vfloat{};
  float raw_max = kNegInf, m = kNegInf;
  bool nan = false;
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t len = n - off < kBlock ? n - off : kBlock;
    const int64_t padded = round_up_lanes(len);
    // Request the block kPrefetchBlocks ahead now, so memory keeps streaming during the exps.
    const int64_t ahead = off + kPrefetchBlocks * kBlock;
    if (ahead < n) {
      const char* p = static_cast<const char*>(x) + ahead * (DT == kF32 ? 4 : 2);
      const int64_t bytes = (n - ahead < kBlock ? n - ahead : kBlock) * (DT == kF32 ? 4 : 2);
      for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
    }
    const float* values;
    if constexpr (DT == kF32) {
      if (len == padded) {
        values = static_cast<const float*>(x) + off;
      } else {
        for (int64_t i = 0; i < len; ++i) raw[i] = load<DT>(x, off + i);
        for (int64_t i = len; i < padded; ++i) raw[i] = kNegInf;
        values = raw;
      }
    } else {
      for (int64_t i = 0; i < len; ++i) raw[i] = load<DT>(x, off + i);
      for (int64_t i = len; i < padded; ++i) raw[i] = kNegInf;
      values = raw;
    }
    float block_max = kNegInf;
    bool block_nan = false;
    bundle_max_nan(values, padded, &block_max, &block_nan);
    raw_max = block_max > raw_max ? block_max : raw_max;
    nan = nan || block_nan;
    if (nan || raw_max == fastmath::kPosInf) continue;  // the line is invalid; only the flags matter now
    if (block_max == kNegInf) continue;                   // contributes exp(-inf) = 0
    const float block_m = SCALED ? block_max / scale : block_max;
    if (block_m > m) {
      if (m > kNegInf) {
        const float factor = exp_neg(m - block_m);
        for (int j = 0; j < kJ; ++j) acc[j] *= factor;
      }
      m = block_m;
    }
    for (int64_t i = 0; i < padded; ++i) {
      float s = values[i];
      if constexpr (SCALED) s = s / scale;
      buf[i] = exp_neg(s - m);
    }
    bundle_add(buf, padded, acc);
  }
  out->raw_max = raw_max;
  out->nan = nan;
  const bool finite = !nan && raw_max < fastmath::kPosInf && m > kNegInf && m < fastmath::kPosInf;
  out->m = finite ? m : kNegInf;
  out->z = finite ? tree_sum(acc) : 0.0f;
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

// p(v) = exp(s - m) / z on the kept set {s >= tau}, else 0. The race multiplies by 1 / z: a
// vector division costs as much as the exp, and a last-bit difference in p can only change the
// winner at an exact tie of two race values. (Acceptance, p(x) of single ids, divides as the
// reference does; s itself is always computed exactly, so {s >= tau} is the reference's kept set.)
template <int DT, bool SCALED>
inline void probs_block(const void* x, int64_t v0, int64_t len, float scale, float m, float inv_z, float tau, float* out) {
  for (int64_t i = 0; i < len; ++i) {
    float s = load<DT>(x, v0 + i);
    if constexpr (SCALED) s = s / scale;
    const float p = exp_neg(s - m) * inv_z;
    out[i] = s >= tau ? p : 0.0f;
  }
}

// r = max(p - q, 0) with q from the draft line.
template <int DT, bool SCALED>
inline void residual_block(const void* x, int64_t v0, int64_t len, float scale, float m, float inv_z, float tau, float* r) {
  for (int64_t i = 0; i < len; ++i) {
    float s = load<DT>(x, v0 + i);
    if constexpr (SCALED) s = s / scale;
    const float q = s >= tau ? exp_neg(s - m) * inv_z : 0.0f;
    const float d = r[i] - q;
    r[i] = d > 0.0f ? d : 0.0f;
  }
}

// r / E with E = -log(u): the race value of one id (the sparse path; same arithmetic as the block loop).
SPECDEC_ALWAYS_INLINE float race_value(float r, uint32_t id, const RaceArgs* a) {
  const float u = philox::to_uniform(philox::word0(id, a->position, a->row, philox::kSampleStream, a->key0, a->key1));
  return r / -log_pos(u);
}

// Race values r / E of one block (r[0, padded), padded a multiple of kLanes, zero past len) for ids
// ids[i] (or v0 + i when ids is null); updates *best: strictly greater wins, so the lowest id
// among equal values (ids ascend).
//
// An id can only win if r / E > best. Every E = -log(u) is at least -log(1 - 2^-24) = 5.96e-8
// (u <= 1 - 2^-24), so r <= best * 5e-8 gives r / E <= 0.84 * best: such ids are skipped without
// drawing their exponential. This changes no result, only the work: in a peaked distribution
// much of the vocabulary is below the bound once a likely id has been seen.
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

SPECDEC_ALWAYS_INLINE void race_block(const float* r, const uint32_t* ids, int64_t v0, int64_t len, int64_t padded, const RaceArgs* a, RaceBest* best) {
  alignas(64) float value[kBlock];
  alignas(64) uint32_t words[kBlock];
  // Pruning may use any value some id of this race reaches (here or in another chunk): the final
  // winner's value is at least that, so a pruned id could neither win nor tie.
  const float bound = known_best(a, best) * kPruneFactor;
  const int64_t candidates = bundle_count_above(r, padded, bound);
  if (candidates == 0) return;
  auto id_at = [&](int64_t i) -> int64_t { return ids != nullptr ? static_cast<int64_t>(ids[i]) : v0 + i; };
  if (candidates * 16 <= len) {
    // Few candidates (top-k / top-p, a peaked distribution): scalar draws for them only.
    for (int64_t i = 0; i < len; ++i) {
      if (r[i] > bound) {
        const float v = race_value(r[i], static_cast<uint32_t>(id_at(i)), a);
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
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 limit = _mm512_set1_ps(bound);
    int64_t count = 0;
    for (int64_t i = 0; i < padded; i += kLanes) {
      const __m512 rv = _mm512_loadu_ps(r + i);
      const __mmask16 mask = _mm512_cmp_ps_mask(rv, limit, _CMP_GT_OQ);
      const __m512i idv = ids != nullptr ? _mm512_loadu_si512(ids + i) : _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(v0 + i)), iota);
      _mm512_mask_compressstoreu_ps(kept_r + count, mask, rv);
      _mm512_mask_compressstoreu_epi32(kept_ids + count, mask, idv);
      count += __builtin_popcount(static_cast<unsigned>(mask));
    }
    const int64_t kept_padded = round_up_lanes(count);
    for (int64_t i = count; i < kept_padded; ++i) {
      kept_r[i] = 0.0f;
      kept_ids[i] = 0;
    }
    philox_block(kept_ids, 0, kept_padded, a->position, a->row, a->key0, a->key1, words);
    for (int64_t i = 0; i < kept_padded; ++i) value[i] = kept_r[i] / -log_pos(philox::to_uniform(words[i]));
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
  philox_block(ids, static_cast<uint32_t>(v0), padded, a->position, a->row, a->key0, a->key1, words);
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

template <int TDT, int DDT, bool SCALED>
void race_impl(const RaceArgs* a, int64_t begin, int64_t n, RaceBest* best) {
  alignas(64) float r[kBlock];
  const float p_inv = 1.0f / a->p_norm, q_inv = 1.0f / a->q_norm;
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t len = n - off < kBlock ? n - off : kBlock;
    const int64_t v0 = begin + off;
    probs_block<TDT, SCALED>(a->target, v0, len, a->scale, a->p_max, p_inv, a->p_tau, r);
    if (a->residual) {
      if constexpr (DDT != kNoDraft) {
        int64_t dense = a->draft_vocab - v0;
        dense = dense < 0 ? 0 : (dense > len ? len : dense);
        residual_block<DDT, SCALED>(a->draft, v0, dense, a->scale, a->q_max, q_inv, a->q_tau, r);
      }
      if (a->one_hot >= v0 && a->one_hot < v0 + len) {
        const float d = r[a->one_hot - v0] - 1.0f;
        r[a->one_hot - v0] = d > 0.0f ? d : 0.0f;
      }
    }
    const int64_t padded = round_up_lanes(len);
    for (int64_t i = len; i < padded; ++i) r[i] = 0.0f;
    race_block(r, nullptr, v0, len, padded, a, best);
  }
}

// The race over a list of ascending ids, in blocks: the same arithmetic as race_impl (so the same
// winner), with gathered loads, and Philox counters taken from the list.
template <int TDT, int DDT, bool SCALED>
void race_list_impl(const RaceArgs* a, const int64_t* ids, int64_t count, RaceBest* best) {
  alignas(64) float r[kBlock];
  alignas(64) uint32_t ids32[kBlock];
  const float p_inv = 1.0f / a->p_norm, q_inv = 1.0f / a->q_norm;
  for (int64_t off = 0; off < count; off += kBlock) {
    const int64_t len = count - off < kBlock ? count - off : kBlock;
    if (len <= 0) break;  // (never: tells GCC's array-bounds analysis that len is positive)
    const int64_t* block = ids + off;
    for (int64_t i = 0; i < len; ++i) {
      float s = load<TDT>(a->target, block[i]);
      if constexpr (SCALED) s = s / a->scale;
      const float p = exp_neg(s - a->p_max) * p_inv;
      r[i] = s >= a->p_tau ? p : 0.0f;
    }
    if (a->residual) {
      if constexpr (DDT != kNoDraft) {
        for (int64_t i = 0; i < len; ++i) {
          const int64_t v = block[i];
          const bool dense = v < a->draft_vocab;
          float sq = load<DDT>(a->draft, dense ? v : 0);
          if constexpr (SCALED) sq = sq / a->scale;
          const float q = sq >= a->q_tau ? exp_neg(sq - a->q_max) * q_inv : 0.0f;
          const float d = r[i] - q;
          r[i] = dense ? (d > 0.0f ? d : 0.0f) : r[i];
        }
      }
      for (int64_t i = 0; i < len; ++i) {
        if (block[i] == a->one_hot) {
          const float d = r[i] - 1.0f;
          r[i] = d > 0.0f ? d : 0.0f;
        }
      }
    }
    const int64_t padded = round_up_lanes(len);
    for (int64_t i = len; i < padded; ++i) r[i] = 0.0f;
    for (int64_t i = 0; i < len; ++i) ids32[i] = static_cast<uint32_t>(block[i]);
    for (int64_t i = len; i < padded; ++i) ids32[i] = 0;
    race_block(r, ids32, 0, len, padded, a, best);
  }
}

template <int TDT, int DDT>
void race_list_scaled(const RaceArgs* a, const int64_t* ids, int64_t count, RaceBest* best) {
  if (a->scale == 1.0f) {
    race_list_impl<TDT, DDT, false>(a, ids, count, best);
  } else {
    race_list_impl<TDT, DDT, true>(a, ids, count, best);
  }
}

template <int TDT>
void race_list_target(const RaceArgs* a, const int64_t* ids, int64_t count, RaceBest* best) {
  if (a->draft == nullptr || !a->residual) {
    race_list_scaled<TDT, kNoDraft>(a, ids, count, best);
  } else if (a->draft_dtype == kF32) {
    race_list_scaled<TDT, kF32>(a, ids, count, best);
  } else if (a->draft_dtype == kBF16) {
    race_list_scaled<TDT, kBF16>(a, ids, count, best);
  } else {
    race_list_scaled<TDT, kF16>(a, ids, count, best);
  }
}

void race_list(const RaceArgs* a, const int64_t* ids, int64_t count, RaceBest* best) {
  if (a->target_dtype == kF32) {
    race_list_target<kF32>(a, ids, count, best);
  } else if (a->target_dtype == kBF16) {
    race_list_target<kBF16>(a, ids, count, best);
  } else {
    race_list_target<kF16>(a, ids, count, best);
  }
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
  for (int l = 0; l < 16; ++l) mask |= static_cast<uint32_t>(values[l] >= t) << l;
  return mask;
#endif
}

// Candidates of a filtered line: every s >= t, found 16 values at a time with a compare mask, so
// the cost is about one read of the line plus the candidates themselves.
template <int DT, bool SCALED>
int64_t collect_impl(const void* x, int64_t n, float scale, float t, float* out_s, int64_t* out_ids, float* max_s, bool* nan) {
  alignas(64) float buf[kBlock];
  int64_t count = 0;
  float mx = kNegInf;
  bool any_nan = false;
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t len = n - off < kBlock ? n - off : kBlock;
    const int64_t padded = round_up_lanes(len);
    const float* values = buf;
    if (DT == kF32 && !SCALED && len == padded) {
      values = static_cast<const float*>(x) + off;
    } else {
      for (int64_t i = 0; i < len; ++i) {
        float s = load<DT>(x, off + i);
        if constexpr (SCALED) s = s / scale;
        buf[i] = s;
      }
      for (int64_t i = len; i < padded; ++i) buf[i] = kNegInf;  // >= t only when t is -inf: skipped below
    }
    bundle_max_nan(values, padded, &mx, &any_nan);
    for (int64_t i = 0; i < padded; i += kLanes) {
      uint32_t mask = ge_mask16(values + i, t);
      while (mask != 0) {
        const int64_t at = i + __builtin_ctz(mask);
        mask &= mask - 1;
        if (at >= len) break;  // padding
        out_s[count] = values[at];
        out_ids[count] = off + at;
        ++count;
      }
    }
  }
  *max_s = mx;
  *nan = any_nan;
  return count;
}

int64_t collect(const void* x, int32_t dtype, int64_t n, float scale, float t, float* out_s, int64_t* out_ids, float* max_s, bool* nan) {
  if (scale == 1.0f) {
    if (dtype == kF32) return collect_impl<kF32, false>(x, n, scale, t, out_s, out_ids, max_s, nan);
    if (dtype == kBF16) return collect_impl<kBF16, false>(x, n, scale, t, out_s, out_ids, max_s, nan);
    return collect_impl<kF16, false>(x, n, scale, t, out_s, out_ids, max_s, nan);
  }
  if (dtype == kF32) return collect_impl<kF32, true>(x, n, scale, t, out_s, out_ids, max_s, nan);
  if (dtype == kBF16) return collect_impl<kBF16, true>(x, n, scale, t, out_s, out_ids, max_s, nan);
  return collect_impl<kF16, true>(x, n, scale, t, out_s, out_ids, max_s, nan);
}

template <int TDT, int DDT>
void race_scaled(const RaceArgs* a, int64_t begin, int64_t n, RaceBest* best) {
  if (a->scale == 1.0f) {
    race_impl<TDT, DDT, false>(a, begin, n, best);
  } else {
    race_impl<TDT, DDT, true>(a, begin, n, best);
  }
}

template <int TDT>
void race_target(const RaceArgs* a, int64_t begin, int64_t n, RaceBest* best) {
  if (a->draft == nullptr || !a->residual) {
    race_scaled<TDT, kNoDraft>(a, begin, n, best);
  } else if (a->draft_dtype == kF32) {
    race_scaled<TDT, kF32>(a, begin, n, best);
  } else if (a->draft_dtype == kBF16) {
    race_scaled<TDT, kBF16>(a, begin, n, best);
  } else {
    race_scaled<TDT, kF16>(a, begin, n, best);
  }
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

void stats(const void* x, int32_t dtype, int64_t n, float scale, StatsResult* out) {
  if (scale == 1.0f) {
    if (dtype == kF32) return stats_impl<kF32, false>(x, n, scale, out);
    if (dtype == kBF16) return stats_impl<kBF16, false>(x, n, scale, out);
    return stats_impl<kF16, false>(x, n, scale, out);
  }
  if (dtype == kF32) return stats_impl<kF32, true>(x, n, scale, out);
  if (dtype == kBF16) return stats_impl<kBF16, true>(x, n, scale, out);
  return stats_impl<kF16, true>(x, n, scale, out);
}

template <bool SCALED>
float sum_exp_typed(const void* x, int32_t dtype, int64_t n, float scale, float m) {
  if (dtype == kF32) return sum_exp_impl<kF32, SCALED>(x, n, scale, m);
  if (dtype == kBF16) return sum_exp_impl<kBF16, SCALED>(x, n, scale, m);
  return sum_exp_impl<kF16, SCALED>(x, n, scale, m);
}

float sum_exp(const void* x, int32_t dtype, int64_t n, float scale, float m) {
  return scale == 1.0f ? sum_exp_typed<false>(x, dtype, n, scale, m) : sum_exp_typed<true>(x, dtype, n, scale, m);
}


void race(const RaceArgs* a, int64_t begin, int64_t n, RaceBest* best) {
  if (a->target_dtype == kF32) {
    race_target<kF32>(a, begin, n, best);
  } else if (a->target_dtype == kBF16) {
    race_target<kBF16>(a, begin, n, best);
  } else {
    race_target<kF16>(a, begin, n, best);
  }
}

#define SPECDEC_STRINGIFY2(x) #x
#define SPECDEC_STRINGIFY(x) SPECDEC_STRINGIFY2(x)

const Kernels kTable = {SPECDEC_STRINGIFY(SPECDEC_ISA), scan, stats, sum_exp, mass_impl, weights_impl, collect, race, race_list};

}  // namespace

const Kernels* kernels() { return &kTable; }

}  // namespace SPECDEC_ISA
}  // namespace specdec
