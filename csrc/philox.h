// Philox4x32-10: the random stream shared with specdec_ext/_philox.py and the Triton kernels
// (stream v2). Row b is keyed by its own 64-bit key (k0 = low word, k1 = high word); counters are
//   acceptance coin at position P:      (0,      P_lo, P_hi, 0), word 0
//   race exponential of vocabulary id v: (v >> 2, P_lo, P_hi, S), word v & 3
// with S = 1 for verify and 2 for sample. One evaluation serves four consecutive ids.
// Plain integer code (the vectorised versions live in kernel_impl.h).
#pragma once

#include <cstdint>

namespace specdec {
namespace philox {

static constexpr uint32_t kKeyA = 0x9E3779B9u;
static constexpr uint32_t kKeyB = 0xBB67AE85u;
static constexpr uint32_t kRoundA = 0xD2511F53u;
static constexpr uint32_t kRoundB = 0xCD9E8D57u;
static constexpr uint32_t kAcceptStream = 0;
static constexpr uint32_t kVerifyStream = 1;
static constexpr uint32_t kSampleStream = 2;

// The four output words of Philox4x32-10 for counter (c0, c1, c2, c3) and key (k0, k1).
static inline __attribute__((always_inline)) void words4(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                                                         uint32_t out[4]) {
#pragma GCC unroll 10
  for (int round = 0; round < 10; ++round) {
    const uint64_t prod_b = static_cast<uint64_t>(c2) * kRoundB;
    const uint64_t prod_a = static_cast<uint64_t>(c0) * kRoundA;
    const uint32_t next0 = static_cast<uint32_t>(prod_b >> 32) ^ c1 ^ k0;
    const uint32_t next2 = static_cast<uint32_t>(prod_a >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(prod_b);
    c3 = static_cast<uint32_t>(prod_a);
    c0 = next0;
    c2 = next2;
    k0 += kKeyA;
    k1 += kKeyB;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

static inline __attribute__((always_inline)) uint32_t word0(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  uint32_t w[4];
  words4(c0, c1, c2, c3, k0, k1, w);
  return w[0];
}

// The race word of vocabulary id v: word v & 3 of counter (v >> 2, p_lo, p_hi, stream).
static inline __attribute__((always_inline)) uint32_t race_word(uint32_t v, uint32_t p_lo, uint32_t p_hi, uint32_t stream, uint32_t k0, uint32_t k1) {
  uint32_t w[4];
  words4(v >> 2, p_lo, p_hi, stream, k0, k1, w);
  return w[v & 3u];
}

// The two counter words of absolute position P: (P_lo, P_hi).
static inline __attribute__((always_inline)) void position_words(uint64_t position, uint32_t* lo, uint32_t* hi) {
  *lo = static_cast<uint32_t>(position & 0xFFFFFFFFu);
  *hi = static_cast<uint32_t>(position >> 32);
}

// The open-interval uniform ((x >> 9) + 0.5) * 2^-23; exact in float32, never 0 or 1.
static inline __attribute__((always_inline)) float to_uniform(uint32_t x) {
  return (static_cast<float>(static_cast<int32_t>(x >> 9)) + 0.5f) * 1.1920928955078125e-07f;
}

// The acceptance coin of the sibling of rank r (0 in a chain) at absolute position P: word 0 of
// counter (r, P_lo, P_hi, 0), as an open-interval uniform.
static inline float coin(uint64_t position, uint32_t rank, uint32_t k0, uint32_t k1) {
  uint32_t lo, hi;
  position_words(position, &lo, &hi);
  return to_uniform(word0(rank, lo, hi, kAcceptStream, k0, k1));
}

}  // namespace philox
}  // namespace specdec
