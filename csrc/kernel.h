// The vectorised inner loops, compiled once per instruction set (kernel_*.cpp) and picked at run
// time by the CPU's features (dispatch.cpp), so one build runs everywhere and uses AVX-512 or AVX2
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

// The law a race draws from and a mass loop sums, over a vocabulary range:
//   r(y) = p(y)                                                        (residual = false)
//   r(y) = max(p_scale * p(y) - q_scale * q(y), 0), 0 for excluded y   (residual = true)
// with p(y) = exp(s - p_max) / p_norm where s = x * inv_t >= p_tau, else 0, and q(y) the same on the
// draft line (0 without a dense draft and for y >= draft_vocab). Every residual the backends meet
// has this form: the chain's max(p - q, 0) (scales 1; a one-hot draft excludes its id, where
// max(p - 1, 0) is 0), a tree's max(p - c q, 0) [y not in S], block verification's
// max(c p - q, 0). Scales of 1 leave p and q unrounded (1 * x is exact).
struct Residual {
  const void* target = nullptr;  // the target line, raw logits
  int32_t target_dtype = kF32;
  float inv_t = 1.0f;  // 1 / temperature, rounded once to float32 (1 = none): s = x * inv_t
  float p_max = 0.0f, p_norm = 1.0f, p_tau = -__builtin_huge_valf();  // m, z, tau of the target line
  const void* draft = nullptr;                                         // the draft line (nullptr: no dense draft)
  int32_t draft_dtype = kF32;
  int64_t draft_vocab = 0;
  float q_max = 0.0f, q_norm = 1.0f, q_tau = -__builtin_huge_valf();
  float p_scale = 1.0f, q_scale = 1.0f;  // (residual only) p_scale in (0, 1], q_scale >= 0
  const int64_t* excluded = nullptr;     // (residual only) ids whose r is 0, any order (a handful)
  int64_t num_excluded = 0;
  bool residual = false;
};

// One corrected / bonus exponential race over a vocabulary range: argmax_v r(v) / E(v).
struct RaceArgs : Residual {
  uint32_t key0 = 0, key1 = 0;                  // the row's Philox key
  uint32_t p_lo = 0, p_hi = 0, stream = 0;      // counter words c1, c2, c3 (absolute position, race stream)
  // Best race value any chunk of this race has seen so far, as float bits (non-negative floats
  // order like their bits); only ever raised. It only prunes work (see race_block): results never
  // depend on when another thread publishes its best. May be null.
  uint32_t* shared_best = nullptr;
};

// The mass of a chunk's scaled values on a fixed grid, kHistPerNat buckets per nat below the
// chunk's maximum m rounded up to the grid (grid index `top` = ceil(m * kHistPerNat)): bucket j
// holds the mass sum exp(s - m) (float32) of the values about j to j + 1 steps below the top; the
// last bucket also everything lower. Bucket edges are approximate (within rounding): the top-p
// filter uses the histogram only to choose which values to select from exactly.
constexpr int32_t kHistBuckets = 2048;
constexpr float kHistPerNat = 32.0f;
struct ValueHistogram {
  bool valid;    // false: |m| too large for the grid (the filter then does without)
  int64_t top;   // grid index of the top
  int32_t used;  // buckets 0 .. used - 1 may be non-empty (only those are written)
  float mass[kHistBuckets];
  // Working space: two interleaved copies (even and odd elements), so that consecutive values in
  // one bucket do not wait on each other's update. Zero on entry, left zero.
  float slots[2 * kHistBuckets];
};

// What collect reports beside the values it stores.
struct CollectStats {
  float max_s;        // max(s) (the line's validity check)
  bool nan;           // any NaN
  int64_t above;      // values s >= hi (not stored)
  double above_mass;  // their sum exp(s - m), float64 lanes
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
  // raw sum; with a histogram (may be null) also the mass of the values on its grid. Two passes over
  // the (cache-sized) piece: the max first, so no running rescaling.
  void (*stats)(const void* x, int32_t dtype, int64_t n, float inv_t, bool want_raw, StatsResult* out, ValueHistogram* hist);
  // sum of exp(s - m) over float32 values, accumulated in double (top-p masses).
  double (*mass)(const float* s, int64_t n, float m);
  // out = exp(s - m), element-wise.
  void (*weights)(const float* s, int64_t n, float m, float* out);
  // Appends every s = x * inv_t with lo <= s < hi (values and ids + id_base, ascending ids) to
  // out_s / out_ids (room for n + 16 entries: compaction writes past the count) and returns the count; values s >= hi are counted and their mass
  // sum exp(s - m) added up instead (hi = +inf: none); also reports max(s) and whether any value is
  // NaN (the line's validity check).
  int64_t (*collect)(const void* x, int32_t dtype, int64_t n, float inv_t, float lo, float hi, float m, int64_t id_base, float* out_s,
                     int64_t* out_ids, CollectStats* out);
  // race over ids [begin, begin + n); updates *best (strictly greater wins: lowest id on ties).
  void (*race)(const RaceArgs* args, int64_t begin, int64_t n, RaceBest* best);
  // The same race over a list of ascending ids (the kept set of a filtered line): same arithmetic.
  void (*race_list)(const RaceArgs* args, const int64_t* ids, int64_t count, RaceBest* best);
  // sum of r(y) over ids [begin, begin + n) in float64 lanes, r evaluated as the race evaluates it
  // (a residual's normaliser: a tree's Z after a rejection, block verification's S_i).
  double (*residual_mass)(const Residual* law, int64_t begin, int64_t n);
  // The same sum over a list of ascending ids (r is 0 off the target's kept set).
  double (*residual_mass_list)(const Residual* law, const int64_t* ids, int64_t count);
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
