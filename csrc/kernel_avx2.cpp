// The kernel loops compiled for AVX2 + FMA (256-bit vectors); used when the CPU has AVX2 but not
// AVX-512. GCC and clang both compile them (per-function target attributes), whatever the
// command-line flags; the dispatcher (dispatch.cpp) checks the CPU before calling them.
#include <cmath>
#include <cstdint>

#include "kernel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,bmi2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi2")
#endif
#define SPECDEC_ISA avx2
#define SPECDEC_VBYTES 32
#define SPECDEC_HAVE_FMA 1
#include "kernel_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
namespace specdec {
namespace avx2 {
const Kernels* kernels() { return &kTable; }
}  // namespace avx2
}  // namespace specdec
#else
// Other architectures: the portable build stands in for this variant (never selected: the CPU check fails).
namespace specdec {
namespace avx2 {
const Kernels* kernels() { return base::kernels(); }
}  // namespace avx2
}  // namespace specdec
#endif
