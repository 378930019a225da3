// The kernel loops compiled for AVX2 (256-bit vectors); used when the CPU has AVX2 but not AVX-512.
#include <cstdint>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>
#pragma GCC push_options
// GCC 12 reports its own intrinsic headers (_mm512_set1_*) as maybe-uninitialized; nothing here is.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx2,fma,f16c,bmi2")
#define SPECDEC_ISA avx2
#define SPECDEC_VBYTES 32
#define SPECDEC_HAVE_FMA 1
#include "kernel_impl.h"
#pragma GCC pop_options
#else
#include "kernel.h"
namespace specdec {
namespace avx2 {
const Kernels* kernels() { return base::kernels(); }
}  // namespace avx2
}  // namespace specdec
#endif
