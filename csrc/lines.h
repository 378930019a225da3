// Logits lines (one row at one position) and their statistics: what the passes (passes.h) schedule,
// what the filter (filter.cpp) and the walks of the drivers read. A line is cut into fixed chunks of kChunk
// entries, each chunk is one work item, and chunk results are combined in chunk order, so no
// number depends on how many threads ran the chunks.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "fastmath.h"
#include "kernel.h"

namespace specdec {

constexpr int64_t kChunk = 8192;  // elements per work item; fixed for determinism
constexpr float kInf = std::numeric_limits<float>::infinity();

// How a row processes its lines (reference.py: process_lines).
struct LineParams {
  float inv_t = 1.0f;  // float32(1 / T), rounded once (IEEE division); 1 for greedy rows
  int64_t top_k = 0;   // 0 = off
  float top_p = 1.0f;  // 1 = off
  bool greedy = false;
};

enum Mode : int8_t {
  kUnused = 0,
  kArgmax,  // greedy target line: argmax of the raw logits
  kCheck,   // greedy row's draft line: only the validity check reads it
  kStats,   // m and z, no filtering
  kFilter,  // top-k / top-p: m, tau and z (filter.cpp)
};

// Candidates (guess <= s < window_hi) that one chunk of a filtered line found, ascending ids, and
// the count and mass of its values s >= window_hi (a top-p window: kernel.h, collect).
struct Candidates {
  std::vector<float> values;
  std::vector<int64_t> ids;
  int64_t above = 0;
  double above_mass = 0.0;
};

// The used part of one chunk's ValueHistogram (kernel.h), kept for the line's top-p window.
struct ChunkHistogram {
  bool valid = false;
  int64_t top = 0;
  std::vector<float> mass;
};

struct ChunkStats {
  float raw_max;
  int64_t argmax;  // (kArgmax lines)
  bool nan;
  float m;
  double z;
  double raw_z;
};

struct Line {
  const char* ptr = nullptr;
  int32_t dtype = kF32;
  int8_t mode = kUnused;
  int64_t n = 0;
  float inv_t = 1.0f;  // 1 / temperature as float32 (1 for greedy rows): s = x * inv_t
  int64_t top_k = 0;
  float top_p = 1.0f;
  bool want_raw = false;    // logprobs: the raw normaliser too
  int64_t first_chunk = 0;  // index of its first chunk result
  int64_t chunks = 0;
  // results
  float raw_max = -kInf;
  int64_t argmax = -1;     // first index of the raw maximum, when known (argmax / filtered lines)
  int64_t max_chunk = 0;   // first chunk holding the raw maximum
  float m = 0.0f, z = 1.0f, tau = -kInf;
  float raw_z = 1.0f;      // sum exp(x - raw_max) (with want_raw)
  double z_all = 0.0;      // normaliser of the whole scaled line (filtered lines: the top-p budget)
  bool bad = false;
  bool scan_only = false;  // read only for the validity check (no row reaches this position)
  bool done = false;       // read (statistics or scan) and combined
  bool has_kept = false;   // filtered line whose kept set is small: the race visits only these ids
  float guess = -kInf;     // filtered lines: candidates are the values >= this
  float window_hi = kInf;  // top-p-only lines: values >= this are not collected, only their mass (kInf: none)
  std::once_flag guess_once;           // the guess is made by the first chunk that needs it
  bool guess_ready = false;            // filtered lines: the next chunk pass collects candidates
  bool top_p_first_pass_done = false;  // top-p-only lines: m, z_all (and validity) came from a first pass
  std::vector<int64_t> kept;  // ascending ids with s >= tau
  std::vector<Candidates> candidates;  // filtered lines: per chunk
  std::vector<ChunkHistogram> histograms;  // top-p-only lines: per chunk, from the statistics pass
};

// NaN, +inf, an all -inf line, or a temperature so small that the scaled maximum is not finite
// (the "temperature too small" rule): the rows _params.row_problems rejects.
inline bool line_is_bad(bool nan, float raw_max, float inv_t) {
  if (nan || raw_max == kInf || raw_max == -kInf) return true;
  const float scaled = inv_t == 1.0f ? raw_max : raw_max * inv_t;
  return !(scaled > -kInf && scaled < kInf);
}

inline int64_t dtype_size(int32_t code) { return code == kF32 ? 4 : 2; }

inline float load_one(const char* p, int32_t dtype, int64_t i) {
  if (dtype == kF32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return dtype == kBF16 ? fastmath::bf16_to_float(h) : fastmath::half_to_float(h);
}

// s of one id as every loop computes it.
inline float scaled_at(const Line& line, int64_t x) {
  const float raw = load_one(line.ptr, line.dtype, x);
  return line.inv_t == 1.0f ? raw : raw * line.inv_t;
}

// A growable buffer that is never zero-filled (std::vector::resize would write every element).
template <typename T>
struct Buffer {
  std::unique_ptr<T[]> data;
  int64_t capacity = 0;
  T* get(int64_t n) {
    if (n > capacity) {
      data.reset(new T[n]);
      capacity = n;
    }
    return data.get();
  }
};

// Per-thread working memory for filtered lines, O(V) per thread. Kept across calls (thread_local)
// so a call does not pay for fresh pages.
struct Scratch {
  Buffer<float> values;
  Buffer<int64_t> ids;
  Buffer<float> work;
  Buffer<float> window;
  Buffer<float> weights;
  Buffer<int32_t> buckets;
  Buffer<int64_t> kept_ids;
  std::vector<float> sample;
  std::unique_ptr<ValueHistogram> histogram;  // one chunk's, while the statistics pass fills it
};

Scratch& thread_scratch();

// One chunk of a line: its statistics (kStats, and kFilter lines without top-k, whose top-p
// budget needs the whole line's normaliser), its max / argmax / validity scan, or, for a filtered
// line with its guess set, the statistics it needs and its candidates.
void process_chunk(Line& line, int64_t chunk, ChunkStats& out, const Kernels& k);

// Combines a line's chunk results (in chunk order): raw max, validity, m, z (and raw z).
void combine_chunks(Line& line, const ChunkStats* chunks, const Kernels& k);

// Filtered lines (filter.cpp). prepare_filter_line makes a line's next chunk pass collect its
// candidates. With top-k, the first of those chunks to run guesses the threshold from a sample of
// the line (so the guesses of many lines are made in parallel). A top-p-only line first has its
// statistics pass, whose chunks also fill value histograms; from them prepare_filter_line (given
// the chunk results) places the cut in a narrow window of values: the collection pass stores the
// values inside it and only adds up the mass of those above. finish_filter_line turns the
// candidates into tau, z and the kept ids (O(candidates), on one thread).
bool filter_needs_stats_first(const Line& line);
void prepare_filter_line(Line& line, const ChunkStats* chunks);
void finish_filter_line(Line& line, const Kernels& k);

// p(x) for one id, with the same formula as the race loops (and the reference).
float prob_at(const Line& line, int64_t x);

}  // namespace specdec
