// Philox4x32-10, word 0 only: the random stream shared with specdec_ext/_philox.py and the Triton
// kernels (counters = (vocabulary index, position, row, stream), key = the 64-bit seed's two words).
// Plain integer code so that a loop over vocabulary indices vectorises (32x32->64 multiplies).
#pragma once

#include <cstdint>

namespace specdec {
namespace philox {

static constexpr uint32_t kKeyA = 0x9E3779B9u;
static constexpr uint32_t kKeyB = 0xBB67AE85u;
static constexpr uint32_t kRoundA = 0xD2511F53u;
static constexpr uint32_t kRoundB = 0xCD9E8D57u;
static constexpr uint32_t kAcceptStream = 0;
static constexpr uint32_t kSampleStream = 1;

static inline __attribute__((always_inline)) uint32_t word0(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
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
  return c0;
}

// The open-interval uniform ((x >> 9) + 0.5) * 2^-23; exact in float32, never 0 or 1.
static inline __attribute__((always_inline)) float to_uniform(uint32_t x) {
  return (static_cast<float>(static_cast<int32_t>(x >> 9)) + 0.5f) * 1.1920928955078125e-07f;
}

}  // namespace philox
}  // namespace specdec
