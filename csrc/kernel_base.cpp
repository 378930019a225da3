// The portable kernel loops, compiled for an explicit baseline target: setup.py builds this file
// on its own with -march=x86-64 (SSE2 only, 128-bit vectors) or -march=armv8-a (NEON; reported as
// "neon"), ignoring CFLAGS / CXXFLAGS, so a distribution's default flags (say -march=x86-64-v3)
// cannot make the fallback use instructions an older CPU lacks. Elsewhere: plain C++ the compiler
// vectorises as it can.
#if defined(__x86_64__) && (defined(__AVX__) || defined(__SSE4_1__))
#error "kernel_base.cpp is the portable fallback: compile it for the baseline (-march=x86-64), see setup.py"
#endif
#if defined(__aarch64__) && (defined(__ARM_FEATURE_SVE) || defined(__ARM_FEATURE_SVE2))
#error "kernel_base.cpp is the portable fallback: compile it for the baseline (-march=armv8-a), see setup.py"
#endif

#include <cmath>
#include <cstdint>

#include "kernel.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#define SPECDEC_ISA_NAME "neon"
#endif

#define SPECDEC_ISA base
#define SPECDEC_VBYTES 16
#include "kernel_impl.h"

namespace specdec {
namespace base {
const Kernels* kernels() { return &kTable; }
}  // namespace base
}  // namespace specdec
