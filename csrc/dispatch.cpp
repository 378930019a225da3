// CPU features and the choice of kernel variant (dispatch.h).
#include "dispatch.h"

#include <atomic>

namespace specdec {
namespace {

bool cpu_has_avx512() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("bmi2");
#else
  return false;
#endif
}

bool cpu_has_avx2() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2");
#else
  return false;
#endif
}

const Kernels* best_kernels() {
  if (cpu_has_avx512()) return avx512::kernels();
  if (cpu_has_avx2()) return avx2::kernels();
  return base::kernels();
}

std::atomic<const Kernels*> g_kernels{nullptr};

}  // namespace

const Kernels& kernels() {
  const Kernels* k = g_kernels.load(std::memory_order_acquire);
  if (k == nullptr) {
    k = best_kernels();
    g_kernels.store(k, std::memory_order_release);
  }
  return *k;
}

bool set_isa(const std::string& name) {
  const Kernels* k = nullptr;
  if (name == "auto") {
    k = best_kernels();
  } else if (name == "avx512") {
    k = cpu_has_avx512() ? avx512::kernels() : nullptr;
  } else if (name == "avx2") {
    k = cpu_has_avx2() ? avx2::kernels() : nullptr;
  } else if (name == "base" || name == base::kernels()->name) {  // "neon" on aarch64
    k = base::kernels();
  }
  if (k == nullptr) return false;
  g_kernels.store(k, std::memory_order_release);
  return true;
}

std::string isa() { return kernels().name; }

}  // namespace specdec
