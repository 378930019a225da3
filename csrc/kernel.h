// The vectorised inner loops, compiled once per instruction set (kernel_*.cpp) and picked at run
// time by the CPU's features (verify.cpp), so one build runs everywhere and uses AVX-512 or AVX2
// where the machine has them. Plain pointers only: these files include no torch headers.
#pragma once

#include <cstdint>

namespace specdec {

// Logits storage types, read in place and widened to float32 in registers.
enum DType : int32_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

struct ScanResult {
  float max;       // largest value (NaNs ignored; see nan)
  int64_t argmax;  // first index of max (only when asked for)
  bool nan;        // any NaN
};

// One residual / bonus exponential race over a vocabulary range: argmax_v r(v) / E(v).
struct RaceArgs {
  const void* target;  // the target line, raw logits
  int32_t target_dtype;
  float scale;  // temperature (1 = none)
  float p_max, p_norm, p_tau;  // m, z, tau of the target line
  const void* draft;  // the draft line (nullptr: no dense draft)
  int32_t draft_dtype;
  int64_t draft_vocab;
  float q_max, q_norm, q_tau;
  int64_t one_hot;  // >= 0: q is one-hot at this id (draft_logits=None); -1: none
  bool residual;    // r = max(p - q, 0) after a rejection, else r = p (bonus token)
  uint32_t key0, key1, position, row;  // Philox key and counters c1, c2
  // Best race value any chunk of this race has seen so far, as float bits (non-negative floats
  // order like their bits); only ever raised. It only prunes work (see race_block): results never
  // depend on when another thread publishes its best. May be null.
  uint32_t* shared_best;
};

struct RaceBest {
  float value;    // the largest race value r / E seen, 0 if none was positive
  int64_t index;  // its first index, -1 if none was positive
};

struct StatsResult {
  float raw_max;  // largest raw value (NaNs ignored; see nan)
  bool nan;       // any NaN
  float m;        // max of s = x / scale (-inf when every value is -inf or a NaN / +inf was seen)
  float z;        // sum of exp(s - m) (0 in those cases)
};

struct Kernels {
  const char* name;
  // max, NaN flag and (want_argmax) the first argmax of n raw values.
  void (*scan)(const void* x, int32_t dtype, int64_t n, bool want_argmax, ScanResult* out);
  // Max, NaN flag and sum of exp(s - max(s)), s = x / scale, in one pass over memory.
  void (*stats)(const void* x, int32_t dtype, int64_t n, float scale, StatsResult* out);
  // sum of exp(s - m), s = x / scale, for a known m; fixed lane order (thread-count independent).
  float (*sum_exp)(const void* x, int32_t dtype, int64_t n, float scale, float m);
  // sum of exp(s - m) over float32 values, accumulated in double (top-p masses).
  double (*mass)(const float* s, int64_t n, float m);
  // out = exp(s - m), element-wise.
  void (*weights)(const float* s, int64_t n, float m, float* out);
  // Appends every s = x / scale >= t (values and ids, ascending ids) to out_s / out_ids and returns
  // the count; also reports max(s) and whether any value is NaN (the line's validity check).
  int64_t (*collect)(const void* x, int32_t dtype, int64_t n, float scale, float t, float* out_s, int64_t* out_ids, float* max_s, bool* nan);
  // race over ids [begin, begin + n); updates *best (strictly greater wins: lowest id on ties).
  void (*race)(const RaceArgs* args, int64_t begin, int64_t n, RaceBest* best);
  // The same race over a list of ascending ids (the kept set of a filtered line): same arithmetic.
  void (*race_list)(const RaceArgs* args, const int64_t* ids, int64_t count, RaceBest* best);
};

namespace avx512 {
const Kernels* kernels();
}
namespace avx2 {
const Kernels* kernels();
}
namespace base {
const Kernels* kernels();
}

}  // namespace specdec
