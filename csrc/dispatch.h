// The instruction-set variant of the kernel loops (kernel.h) that this CPU runs: chosen once from
// the CPU's features (AVX-512, else AVX2, else the portable build: SSE2 / NEON), or pinned by tests.
#pragma once

#include <string>

#include "kernel.h"

namespace specdec {

// The variant in use.
const Kernels& kernels();

// Pins a variant ('auto', 'avx512', 'avx2', 'neon' or 'base'); false when this CPU lacks it.
bool set_isa(const std::string& name);

// The name of the variant in use.
std::string isa();

}  // namespace specdec
