// The kernel loops compiled for AVX-512 (512-bit vectors); used when the CPU reports avx512f/bw/dq/vl.
#include <cstdint>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>
#pragma GCC push_options
// GCC 12 reports its own intrinsic headers (_mm512_set1_*) as maybe-uninitialized; nothing here is.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi2,prefer-vector-width=512")
#define SPECDEC_ISA avx512
#define SPECDEC_VBYTES 64
#define SPECDEC_HAVE_FMA 1
#include "kernel_impl.h"
#pragma GCC pop_options
#else
// Other compilers and architectures: the portable build stands in for this variant.
#include "kernel.h"
namespace specdec {
namespace avx512 {
const Kernels* kernels() { return base::kernels(); }
}  // namespace avx512
}  // namespace specdec
#endif
