// The vectorised inner loops, compiled once per instruction set (kernel_*.cpp) and picked at run
// time by the CPU's features (verify.cpp), so one build runs everywhere and uses AVX-512 or AVX2
// where the machine has them. Plain pointers only: these files include no torch headers (the
// standalone tests in csrc/tests/ link them without torch, also for aarch64 under qemu).
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
  float inv_t;                 // 1 / temperature, rounded once to float32 (1 = none): s = x * inv_t
  float p_max, p_norm, p_tau;  // m, z, tau of the target line
  const void* draft;           // the draft line (nullptr: no dense draft)
  int32_t draft_dtype;
  int64_t draft_vocab;
  float q_max, q_norm, q_tau;
  int64_t one_hot;  // >= 0: q is one-hot at this id (draft_logits=None); -1: none
  bool residual;    // r = max(p - q, 0) after a rejection, else r = p (bonus token)
  uint32_t key0, key1;          // the row's Philox key
  uint32_t p_lo, p_hi, stream;  // counter words c1, c2, c3 (absolute position, race stream)
  // Best race value any chunk of this race has seen so far, as float bits (non-negative floats
  // order like their bits); only ever raised. It only prunes work (see race_block): results never
  // depend on when another thread publishes its best. May be null.
  uint32_t* shared_best;
};

struct RaceBest {
  float value;    // the largest race value r / E seen, 0 if none was positive
  int64_t index;  // its first index, -1 if none was positive
};

// Softmax statistics of a piece of a line (one chunk): the raw maximum, the scaled maximum
// m = raw_max * inv_t and sum exp(s - m) in float64 lanes, so the normaliser of a 128k line keeps
// float32 accuracy (a float32 running sum loses up to ~1e-6 relative).
struct StatsResult {
  float raw_max;  // largest raw value (NaNs ignored; see nan)
  bool nan;       // any NaN
  float m;        // max of s = x * inv_t (-inf when nothing finite: then z = 0)
  double z;       // sum of exp(s - m)
  double raw_z;   // sum of exp(x - raw_max) (only when asked; equals z when inv_t = 1)
};

struct Kernels {
  const char* name;
  // max, NaN flag and (want_argmax) the first argmax of n raw values.
  void (*scan)(const void* x, int32_t dtype, int64_t n, bool want_argmax, ScanResult* out);
  // Raw max, NaN flag, scaled max and sum of exp(s - max(s)), s = x * inv_t; with want_raw also the
  // raw sum. Two passes over the (cache-sized) piece: the max first, so no running rescaling.
  void (*stats)(const void* x, int32_t dtype, int64_t n, float inv_t, bool want_raw, StatsResult* out);
  // sum of exp(s - m) over float32 values, accumulated in double (top-p masses).
  double (*mass)(const float* s, int64_t n, float m);
  // out = exp(s - m), element-wise.
  void (*weights)(const float* s, int64_t n, float m, float* out);
  // Appends every s = x * inv_t >= t (values and ids + id_base, ascending ids) to out_s / out_ids and
  // returns the count; also reports max(s) and whether any value is NaN (the line's validity check).
  int64_t (*collect)(const void* x, int32_t dtype, int64_t n, float inv_t, float t, int64_t id_base, float* out_s, int64_t* out_ids, float* max_s,
                     bool* nan);
  // race over ids [begin, begin + n); updates *best (strictly greater wins: lowest id on ties).
  void (*race)(const RaceArgs* args, int64_t begin, int64_t n, RaceBest* best);
  // The same race over a list of ascending ids (the kept set of a filtered line): same arithmetic.
  void (*race_list)(const RaceArgs* args, const int64_t* ids, int64_t count, RaceBest* best);
  // Race words of ids [v0, v0 + n) (v0 a multiple of 4, n of 16) and of a list of n ids (n a
  // multiple of 16): the vectorised Philox, exposed for the tests.
  void (*race_words)(const RaceArgs* args, uint32_t v0, int64_t n, uint32_t* out);
  void (*race_words_list)(const RaceArgs* args, const uint32_t* ids, int64_t n, uint32_t* out);
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
