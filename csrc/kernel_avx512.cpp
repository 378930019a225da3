// The kernel loops compiled for AVX-512 (512-bit vectors); used when the CPU reports
// avx512f/bw/dq/vl. GCC and clang both compile them (per-function target attributes), whatever
// the command-line flags; the dispatcher (dispatch.cpp) checks the CPU before calling them.
#include <cmath>
#include <cstdint>

#include "kernel.h"

#if defined(SPECDEC_EMULATE_AVX512)
// Test builds (csrc/tests): the same source on scalar stand-ins of the intrinsics, runnable anywhere.
#define SPECDEC_ISA avx512
#define SPECDEC_VBYTES 64
#define SPECDEC_HAVE_FMA 1
#include "kernel_impl.h"
namespace specdec {
namespace avx512 {
const Kernels* kernels() { return &kTable; }
}  // namespace avx512
}  // namespace specdec
#elif defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi2"))), apply_to = function)
#pragma clang attribute push(__attribute__((min_vector_width(512))), apply_to = function)
#else
#pragma GCC push_options
// GCC 12 reports its own intrinsic headers (_mm512_set1_*) as maybe-uninitialized; nothing here is.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi2,prefer-vector-width=512")
#endif
#define SPECDEC_ISA avx512
#define SPECDEC_VBYTES 64
#define SPECDEC_HAVE_FMA 1
#include "kernel_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
namespace specdec {
namespace avx512 {
const Kernels* kernels() { return &kTable; }
}  // namespace avx512
}  // namespace specdec
#else
// Other architectures: the portable build stands in for this variant (never selected: the CPU check fails).
namespace specdec {
namespace avx512 {
const Kernels* kernels() { return base::kernels(); }
}  // namespace avx512
}  // namespace specdec
#endif
