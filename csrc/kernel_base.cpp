// The kernel loops for the compiler's default target (SSE2 on x86-64): runs on any CPU.
#include <cstdint>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define SPECDEC_ISA base
#define SPECDEC_VBYTES 16
#include "kernel_impl.h"
