// Scalar stand-ins for the AVX-512 intrinsics kernel_impl.h uses, written from Intel's
// definitions. Test builds only (csrc/tests/Makefile, -DSPECDEC_EMULATE_AVX512): the AVX-512
// variant's lane bookkeeping (the Philox transpose and word selection, the candidate compression,
// the masks) then runs and is checked on any CPU, including one without AVX-512 and the CI machine.
#pragma once

#include <cstdint>
#include <cstring>

struct __m512i {
  uint32_t u[16];
};
struct __m512 {
  float f[16];
};
typedef uint16_t __mmask16;

#define _CMP_GE_OQ 29
#define _CMP_GT_OQ 30

static inline __m512i _mm512_set1_epi32(int x) {
  __m512i r;
  for (int i = 0; i < 16; ++i) r.u[i] = static_cast<uint32_t>(x);
  return r;
}
static inline __m512i _mm512_setr_epi32(int e0, int e1, int e2, int e3, int e4, int e5, int e6, int e7, int e8, int e9, int e10, int e11, int e12,
                                        int e13, int e14, int e15) {
  const int e[16] = {e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15};
  __m512i r;
  for (int i = 0; i < 16; ++i) r.u[i] = static_cast<uint32_t>(e[i]);
  return r;
}
static inline __m512 _mm512_set1_ps(float x) {
  __m512 r;
  for (int i = 0; i < 16; ++i) r.f[i] = x;
  return r;
}
static inline __m512i _mm512_loadu_si512(const void* p) {
  __m512i r;
  std::memcpy(r.u, p, 64);
  return r;
}
static inline void _mm512_storeu_si512(void* p, __m512i x) { std::memcpy(p, x.u, 64); }
static inline __m512 _mm512_loadu_ps(const void* p) {
  __m512 r;
  std::memcpy(r.f, p, 64);
  return r;
}
static inline __m512i _mm512_add_epi32(__m512i a, __m512i b) {
  for (int i = 0; i < 16; ++i) a.u[i] += b.u[i];
  return a;
}
static inline __m512i _mm512_and_si512(__m512i a, __m512i b) {
  for (int i = 0; i < 16; ++i) a.u[i] &= b.u[i];
  return a;
}
static inline __m512i _mm512_srli_epi32(__m512i a, unsigned n) {
  for (int i = 0; i < 16; ++i) a.u[i] = n > 31 ? 0 : a.u[i] >> n;
  return a;
}
// 64-bit lanes: element j is (u[2j + 1] << 32) | u[2j].
static inline uint64_t emu_lane64(const __m512i& a, int j) { return (static_cast<uint64_t>(a.u[2 * j + 1]) << 32) | a.u[2 * j]; }
static inline void emu_set_lane64(__m512i* a, int j, uint64_t v) {
  a->u[2 * j] = static_cast<uint32_t>(v);
  a->u[2 * j + 1] = static_cast<uint32_t>(v >> 32);
}
static inline __m512i _mm512_srli_epi64(__m512i a, unsigned n) {
  __m512i r;
  for (int j = 0; j < 8; ++j) emu_set_lane64(&r, j, n > 63 ? 0 : emu_lane64(a, j) >> n);
  return r;
}
static inline __m512i _mm512_slli_epi64(__m512i a, unsigned n) {
  __m512i r;
  for (int j = 0; j < 8; ++j) emu_set_lane64(&r, j, n > 63 ? 0 : emu_lane64(a, j) << n);
  return r;
}
// Unsigned 32 x 32 -> 64-bit products of the low words of each 64-bit lane.
static inline __m512i _mm512_mul_epu32(__m512i a, __m512i b) {
  __m512i r;
  for (int j = 0; j < 8; ++j) emu_set_lane64(&r, j, static_cast<uint64_t>(a.u[2 * j]) * b.u[2 * j]);
  return r;
}
// Bit (a << 2 | b << 1 | c) of imm: any three-input boolean function.
static inline __m512i _mm512_ternarylogic_epi32(__m512i a, __m512i b, __m512i c, int imm) {
  __m512i r;
  for (int i = 0; i < 16; ++i) {
    uint32_t out = 0;
    for (int bit = 0; bit < 32; ++bit) {
      const unsigned index = (((a.u[i] >> bit) & 1u) << 2) | (((b.u[i] >> bit) & 1u) << 1) | ((c.u[i] >> bit) & 1u);
      out |= static_cast<uint32_t>((imm >> index) & 1) << bit;
    }
    r.u[i] = out;
  }
  return r;
}
// Lane i from b where bit i of k is set, else from a.
static inline __m512i _mm512_mask_blend_epi32(__mmask16 k, __m512i a, __m512i b) {
  for (int i = 0; i < 16; ++i) a.u[i] = ((k >> i) & 1) ? b.u[i] : a.u[i];
  return a;
}
static inline __mmask16 _mm512_cmpeq_epi32_mask(__m512i a, __m512i b) {
  __mmask16 k = 0;
  for (int i = 0; i < 16; ++i) k = static_cast<__mmask16>(k | ((a.u[i] == b.u[i] ? 1u : 0u) << i));
  return k;
}
static inline __mmask16 _mm512_cmp_ps_mask(__m512 a, __m512 b, int predicate) {
  __mmask16 k = 0;
  for (int i = 0; i < 16; ++i) {
    const bool hit = predicate == _CMP_GE_OQ ? a.f[i] >= b.f[i] : a.f[i] > b.f[i];  // ordered: false with a NaN
    k = static_cast<__mmask16>(k | ((hit ? 1u : 0u) << i));
  }
  return k;
}
static inline void _mm512_mask_compressstoreu_ps(void* p, __mmask16 k, __m512 a) {
  float* out = static_cast<float*>(p);
  for (int i = 0; i < 16; ++i) {
    if ((k >> i) & 1) *out++ = a.f[i];
  }
}
static inline void _mm512_mask_compressstoreu_epi32(void* p, __mmask16 k, __m512i a) {
  uint32_t* out = static_cast<uint32_t*>(p);
  for (int i = 0; i < 16; ++i) {
    if ((k >> i) & 1) *out++ = a.u[i];
  }
}
// Interleaves within each 128-bit lane l (elements 4l .. 4l + 3).
static inline __m512i _mm512_unpacklo_epi32(__m512i a, __m512i b) {
  __m512i r;
  for (int l = 0; l < 4; ++l) {
    const int o = 4 * l;
    r.u[o] = a.u[o];
    r.u[o + 1] = b.u[o];
    r.u[o + 2] = a.u[o + 1];
    r.u[o + 3] = b.u[o + 1];
  }
  return r;
}
static inline __m512i _mm512_unpackhi_epi32(__m512i a, __m512i b) {
  __m512i r;
  for (int l = 0; l < 4; ++l) {
    const int o = 4 * l;
    r.u[o] = a.u[o + 2];
    r.u[o + 1] = b.u[o + 2];
    r.u[o + 2] = a.u[o + 3];
    r.u[o + 3] = b.u[o + 3];
  }
  return r;
}
static inline __m512i _mm512_unpacklo_epi64(__m512i a, __m512i b) {
  __m512i r;
  for (int l = 0; l < 4; ++l) {
    emu_set_lane64(&r, 2 * l, emu_lane64(a, 2 * l));
    emu_set_lane64(&r, 2 * l + 1, emu_lane64(b, 2 * l));
  }
  return r;
}
static inline __m512i _mm512_unpackhi_epi64(__m512i a, __m512i b) {
  __m512i r;
  for (int l = 0; l < 4; ++l) {
    emu_set_lane64(&r, 2 * l, emu_lane64(a, 2 * l + 1));
    emu_set_lane64(&r, 2 * l + 1, emu_lane64(b, 2 * l + 1));
  }
  return r;
}
// 128-bit lanes: [a[imm & 3], a[(imm >> 2) & 3], b[(imm >> 4) & 3], b[(imm >> 6) & 3]].
static inline __m512i _mm512_shuffle_i32x4(__m512i a, __m512i b, int imm) {
  __m512i r;
  const __m512i* source[4] = {&a, &a, &b, &b};
  for (int l = 0; l < 4; ++l) {
    const int pick = (imm >> (2 * l)) & 3;
    for (int e = 0; e < 4; ++e) r.u[4 * l + e] = source[l]->u[4 * pick + e];
  }
  return r;
}
