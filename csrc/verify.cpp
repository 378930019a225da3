// Fused CPU verification and sampling: the semantics of specdec_ext/reference.py without
// (B, K+1, V) temporaries; logits are read in place in their own dtype, each line once.
//
// The work runs in regions, one parallel pass each (see verify_impl):
// * line statistics: max m, normaliser z and the top-k / top-p threshold tau of a (row, position)
//   line, when a row reaches that position; unfiltered lines are cut into fixed chunks so one line
//   spreads over all threads, filtered lines are processed whole with per-thread scratch;
// * acceptance between regions: u * q(x) < p(x) (or the argmax test for greedy rows), so the exp
//   work follows the accepted prefix instead of K;
// * the exponential race for the corrected / bonus token of each finished row, in fixed
//   vocabulary chunks (or over the kept ids of a filtered line), sharing a pass with the
//   validity scan of the lines no row reached, when `check` asks for every line up to n_b to be
//   validated. Without it those lines are never read: a row is blanked only for a bad value in a
//   line its verification reads (target and draft lines up to the first rejection; a greedy row
//   reads target lines only).
//
// Chunk boundaries never depend on the number of threads and partial results are combined in
// chunk order, so the tokens are the same for any thread count. Work is handed out dynamically
// (an atomic counter), which balances uneven items without affecting any result.
#include <torch/extension.h>
#include <torch/library.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "fastmath.h"
#include "kernel.h"
#include "philox.h"

namespace specdec {
namespace {

using fastmath::exp_neg;

constexpr int64_t kChunk = 8192;               // elements per work item; fixed for determinism
constexpr int64_t kSerialElements = 1 << 16;   // below this much work a parallel region costs more than it saves
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// Instruction-set dispatch.

bool cpu_has_avx512() {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
#else
  return false;
#endif
}

bool cpu_has_avx2() {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
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

const Kernels& kernels() {
  const Kernels* k = g_kernels.load(std::memory_order_acquire);
  if (k == nullptr) {
    k = best_kernels();
    g_kernels.store(k, std::memory_order_release);
  }
  return *k;
}

// Tests pin each variant to check that they agree bit for bit.
bool set_isa(const std::string& name) {
  const Kernels* k = nullptr;
  if (name == "auto") {
    k = best_kernels();
  } else if (name == "avx512") {
    k = cpu_has_avx512() ? avx512::kernels() : nullptr;
  } else if (name == "avx2") {
    k = cpu_has_avx2() ? avx2::kernels() : nullptr;
  } else if (name == "base") {
    k = base::kernels();
  }
  if (k == nullptr) return false;
  g_kernels.store(k, std::memory_order_release);
  return true;
}

std::string isa() { return kernels().name; }

// ---------------------------------------------------------------------------------------------
// Small readers for per-row parameters of any layout (a 0-d tensor expanded to (B,) has stride 0).

float row_float(const at::Tensor& t, int64_t b) {
  const char* base = static_cast<const char*>(t.const_data_ptr());
  const int64_t off = t.dim() == 0 ? 0 : b * t.stride(0);
  switch (t.scalar_type()) {
    case at::kFloat: return reinterpret_cast<const float*>(base)[off];
    case at::kDouble: return static_cast<float>(reinterpret_cast<const double*>(base)[off]);
    case at::kHalf: return static_cast<float>(reinterpret_cast<const at::Half*>(base)[off]);
    case at::kBFloat16: return static_cast<float>(reinterpret_cast<const at::BFloat16*>(base)[off]);
    default: TORCH_CHECK(false, "specdec: expected a floating-point parameter tensor, got ", t.scalar_type());
  }
}

int64_t row_int(const at::Tensor& t, int64_t b) {
  const char* base = static_cast<const char*>(t.const_data_ptr());
  const int64_t off = t.dim() == 0 ? 0 : b * t.stride(0);
  switch (t.scalar_type()) {
    case at::kLong: return reinterpret_cast<const int64_t*>(base)[off];
    case at::kInt: return reinterpret_cast<const int32_t*>(base)[off];
    case at::kShort: return reinterpret_cast<const int16_t*>(base)[off];
    case at::kByte: return reinterpret_cast<const uint8_t*>(base)[off];
    default: TORCH_CHECK(false, "specdec: expected an integer parameter tensor, got ", t.scalar_type());
  }
}

int32_t dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return kF32;
    case at::kBFloat16: return kBF16;
    case at::kHalf: return kF16;
    default: TORCH_CHECK(false, "specdec: logits must be float32, bfloat16 or float16, got ", t);
  }
}

int64_t dtype_size(int32_t code) { return code == kF32 ? 4 : 2; }

float load_one(const char* p, int32_t dtype, int64_t i) {
  if (dtype == kF32) return reinterpret_cast<const float*>(p)[i];
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return dtype == kBF16 ? fastmath::bf16_to_float(h) : fastmath::half_to_float(h);
}

// ---------------------------------------------------------------------------------------------
// Lines and their statistics.

enum Mode : int8_t {
  kUnused = 0,
  kArgmax,  // greedy target line: argmax of the raw logits
  kCheck,   // greedy row's draft line: only the validity check reads it
  kStats,   // m and z, no filtering (chunked)
  kFilter,  // top-k / top-p: m, tau, z over the whole line
};

struct Line {
  const char* ptr = nullptr;
  int32_t dtype = kF32;
  int8_t mode = kUnused;
  int64_t n = 0;
  float scale = 1.0f;  // temperature; 1 for greedy rows (the reference divides by 1)
  int64_t top_k = 0;
  float top_p = 1.0f;
  int64_t first_chunk = 0;  // index of its first chunk result (chunked modes)
  // results
  float raw_max = -kInf;
  int64_t argmax = 0;
  float m = 0.0f, z = 1.0f, tau = -kInf;
  bool bad = false;
  bool scan_only = false;      // read only for the validity check (no row reaches this position)
  bool done = false;           // read (statistics or scan) and combined
  bool has_kept = false;       // filtered line whose kept set is small: the race visits only these ids
  std::vector<int64_t> kept;   // ascending ids with s >= tau
};

struct ChunkStats {
  float raw_max;
  int64_t argmax;
  bool nan;
  float m;
  float z;
};

// NaN, +inf, an all -inf line, or logits / temperature overflowing: the rows _params.row_problems rejects.
bool line_is_bad(bool nan, float raw_max, float scale) {
  return nan || raw_max == kInf || raw_max == -kInf || raw_max / scale == kInf;
}

float scaled_max(float raw_max, float scale) { return scale == 1.0f ? raw_max : raw_max / scale; }

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

// Per-thread working memory for filtered lines, O(V) per thread (never O(B * K * V)). Kept across
// calls (thread_local in run_items) so a call does not pay for fresh pages.
struct Scratch {
  Buffer<float> values;  // candidate values s of a filtered line
  Buffer<int64_t> ids;   // and their ids
  Buffer<float> work;
  Buffer<float> window;
  Buffer<float> weights;
  Buffer<int32_t> buckets;
  Buffer<int64_t> kept_ids;
  std::vector<float> sample;
};

// tau of transformers' top-p inside the candidates (the values >= tau_k), as in
// reference.filter_thresholds: the smallest value v whose sorted-order "mass before" (a float
// cumsum accumulated in double, minus its own weight) is below the budget top_p * Z. A quickselect
// on values with masses summed per partition finds it in expected O(n) instead of sorting. Only
// values above the cut contribute to a mass before, so the candidates need only include every
// value down to (at least) the cut.
// `above` is the mass of the values larger than all candidates (0 when they are the top of the line);
// *found is false when no candidate qualifies (then the top value of the line is returned).
float top_p_quickselect(float* cand, int64_t count, float m, float budget, double above, bool* found_out, const Kernels& k) {
  bool found = false;
  float best = m;  // nothing qualifies only if the budget underflows: keep the top value (clamp(min=1))
  int64_t lo = 0, hi = count;
  while (lo < hi) {
    const float a = cand[lo], b = cand[lo + (hi - lo) / 2], c = cand[hi - 1];
    const float pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));
    // Three-way partition, descending: [lo, gt) > pivot, [gt, lt) == pivot, [lt, hi) < pivot.
    int64_t gt = lo, i = lo, lt = hi;
    while (i < lt) {
      if (cand[i] > pivot) {
        std::swap(cand[i++], cand[gt++]);
      } else if (cand[i] < pivot) {
        std::swap(cand[i], cand[--lt]);
      } else {
        ++i;
      }
    }
    const double mass_greater = above + k.mass(cand + lo, gt - lo, m);
    const float w = exp_neg(pivot - m);
    const float before = static_cast<float>(mass_greater + static_cast<double>(w)) - w;
    if (before < budget) {
      found = true;
      best = pivot;
      above = mass_greater + static_cast<double>(w) * static_cast<double>(lt - gt);
      lo = lt;
    } else {
      hi = gt;
    }
  }
  *found_out = found;
  return found ? best : m;
}

// The same cut for many candidates: a histogram of their mass over value buckets (1/16 of the
// candidates' range each) locates the bucket where the cumulative mass crosses the budget, and the
// exact quickselect then runs on that bucket and its two neighbours only, with the mass of the
// buckets above as its starting point. Falls back to all candidates if the window holds no cut.
float top_p_threshold(float* cand, int64_t count, float m, float budget, const Kernels& k, Scratch& scratch) {
  bool found = false;
  constexpr int64_t kDirect = 4096;
  if (count <= kDirect) return top_p_quickselect(cand, count, m, budget, 0.0, &found, k);
  // Buckets of 0.1 nat below the maximum; exp(-104) is 0 in float32, so everything lower weighs nothing.
  constexpr int kBuckets = 1024;
  constexpr float kSpan = 104.0f;
  constexpr float kPerNat = static_cast<float>(kBuckets) / kSpan;
  std::vector<double> mass(kBuckets, 0.0);
  float* weight = scratch.weights.get(count);
  int32_t* bucket = scratch.buckets.get(count);
  k.weights(cand, count, m, weight);
  for (int64_t i = 0; i < count; ++i) {
    const float d = m - cand[i];
    bucket[i] = d < kSpan ? static_cast<int32_t>(d * kPerNat) : kBuckets - 1;
  }
  for (int64_t i = 0; i < count; ++i) bucket[i] = bucket[i] < kBuckets - 1 ? bucket[i] : kBuckets - 1;
  for (int64_t i = 0; i < count; ++i) mass[bucket[i]] += static_cast<double>(weight[i]);
  int crossing = kBuckets - 1;
  double cumulative = 0.0;
  for (int b = 0; b < kBuckets; ++b) {
    if (cumulative + mass[b] >= static_cast<double>(budget)) {
      crossing = b;
      break;
    }
    cumulative += mass[b];
  }
  const int first = std::max(crossing - 1, 0), last = std::min(crossing + 1, kBuckets - 1);
  double above = 0.0;
  for (int b = 0; b < first; ++b) above += mass[b];
  float* window = scratch.window.get(count);
  int64_t size = 0;
  for (int64_t i = 0; i < count; ++i) {
    window[size] = cand[i];
    size += bucket[i] >= first && bucket[i] <= last;
  }
  const float cut = top_p_quickselect(window, size, m, budget, above, &found, k);
  return found ? cut : top_p_quickselect(cand, count, m, budget, 0.0, &found, k);
}

constexpr int64_t kSampleRuns = 32;

// A threshold t, from a sample of the line, under which the filter's kept set (very likely) lies:
// about 2k + 8 * n / (sample size) values for top-k; for top-p, the values
// holding an estimated (1 + top_p) / 2 of the mass (the known maximum counted exactly, since one
// dominant token is easily missed by a sample). The caller checks the guess and falls back to the
// whole line when it was too high, so the guess affects only speed.
float guess_candidate_threshold(const Line& line, bool use_k, std::vector<float>& sample) {
  const int64_t n = line.n;
  // About n / 64 values (n / 256 for top-p, which sorts them): fewer samples cost less here but
  // leave a looser threshold, i.e. more candidates to select from.
  const int64_t size = std::min(n, use_k ? std::clamp<int64_t>(n / 64, 256, 2048) : std::clamp<int64_t>(n / 256, 128, 512));
  // kSampleRuns evenly spaced runs of consecutive values: a few cache lines each instead of one
  // cache miss per sampled value.
  const int64_t runs = std::min<int64_t>(kSampleRuns, size);
  const int64_t run_length = size / runs, spacing = n / runs;
  sample.resize(runs * run_length);
  for (int64_t r = 0; r < runs; ++r) {
    for (int64_t i = 0; i < run_length; ++i) {
      const float x = load_one(line.ptr, line.dtype, r * spacing + i);
      const float v = line.scale == 1.0f ? x : x / line.scale;
      sample[r * run_length + i] = v == v ? v : -kInf;  // a NaN (the line is then rejected) must not reach the selection
    }
  }
  const int64_t sampled = runs * run_length;
  if (use_k) {
    const int64_t rank = static_cast<int64_t>(std::ceil(2.0 * static_cast<double>(line.top_k) * sampled / n)) + 8;
    if (rank >= sampled) return -kInf;
    std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(), std::greater<float>());
    return sample[rank - 1];
  }
  std::sort(sample.begin(), sample.end(), std::greater<float>());
  const double per_sample = static_cast<double>(n) / static_cast<double>(sampled);
  double total = 1.0;  // the maximum itself
  for (float v : sample) total += per_sample * static_cast<double>(exp_neg(v - line.m));
  const double wanted = 0.5 * (1.0 + static_cast<double>(line.top_p)) * total;
  double mass = 1.0;
  if (mass >= wanted) return line.m;
  for (float v : sample) {
    mass += per_sample * static_cast<double>(exp_neg(v - line.m));
    if (mass >= wanted) return v;
  }
  return -kInf;
}

// A filtered line (top-k and / or top-p): m, tau and z, from a small candidate set when possible.
// The kept set {s >= tau} is the reference's exactly: candidates hold every value >= t, and t is
// checked to lie at or below both cuts (k values reach it; for top-p, its mass reaches the budget,
// so no value below it can be kept).
void process_filter_line(Line& line, Scratch& scratch, const Kernels& k) {
  const int64_t n = line.n;
  const bool use_k = line.top_k > 0 && line.top_k < n;
  const bool use_p = line.top_p < 1.0f;
  float z_all = 0.0f;
  if (!use_k) {
    // Top-p alone: its budget needs the mass of the whole line, so one statistics pass first.
    StatsResult st;
    k.stats(line.ptr, line.dtype, n, line.scale, &st);
    line.raw_max = st.raw_max;
    line.bad = line_is_bad(st.nan, st.raw_max, line.scale);
    if (line.bad) return;
    line.m = st.m;
    z_all = st.z;
  }
  const float budget_all = line.top_p * z_all;

  float* cand = scratch.values.get(n);
  int64_t* ids = scratch.ids.get(n);
  float t = guess_candidate_threshold(line, use_k, scratch.sample);
  float max_s = -kInf;
  bool nan = false;
  int64_t count = k.collect(line.ptr, line.dtype, n, line.scale, t, cand, ids, &max_s, &nan);
  if (use_k) {
    // The collection pass doubles as the validity check: NaN, +inf, all -inf, or overflow of x / T
    // (max(x / T) is max(x) / T, so these are the reference's tests on the raw maximum).
    line.raw_max = max_s;
    line.bad = nan || max_s == kInf || max_s == -kInf;
    if (line.bad) return;
    line.m = max_s;
  }
  // (A small margin keeps a top-p cut that sits at the guess within rounding from depending on it.)
  const bool enough = use_k ? count >= line.top_k : k.mass(cand, count, line.m) >= static_cast<double>(budget_all) * (1.0 + 1e-5);
  if (!enough && t > -kInf) {
    t = -kInf;
    count = k.collect(line.ptr, line.dtype, n, line.scale, t, cand, ids, &max_s, &nan);
  }

  // (Selections below are branch-free compactions: a kept / dropped test on random data would
  // mispredict about half the time.)
  float* work = scratch.work.get(count);
  float tau_k = -kInf;
  if (use_k) {
    std::copy(cand, cand + count, work);
    std::nth_element(work, work + (line.top_k - 1), work + count, std::greater<float>());
    tau_k = work[line.top_k - 1];
  }
  float tau_p = -kInf;
  if (use_p) {
    int64_t top = 0;
    for (int64_t i = 0; i < count; ++i) {
      work[top] = cand[i];
      top += cand[i] >= tau_k;
    }
    // Z: the mass of the top-k set (or of the whole line without top-k), as a float like the reference's sum.
    const float z_kept = use_k ? static_cast<float>(k.mass(work, top, line.m)) : z_all;
    tau_p = top_p_threshold(work, top, line.m, line.top_p * z_kept, k, scratch);
  }
  line.tau = std::max(tau_k, tau_p);

  // z over the kept set, and its ids when few enough that the race should visit only them.
  int64_t* kept_ids = scratch.kept_ids.get(count);
  int64_t kept = 0;
  for (int64_t i = 0; i < count; ++i) {
    work[kept] = cand[i];
    kept_ids[kept] = ids[i];
    kept += cand[i] >= line.tau;
  }
  line.z = static_cast<float>(k.mass(work, kept, line.m));
  line.has_kept = kept * 8 <= n;
  if (line.has_kept) line.kept.assign(kept_ids, kept_ids + kept);
}

void process_chunk(const Line& line, int64_t chunk, ChunkStats& out, const Kernels& k) {
  const int64_t start = chunk * kChunk;
  const int64_t len = std::min(kChunk, line.n - start);
  const char* p = line.ptr + start * dtype_size(line.dtype);
  if (line.mode == kStats && !line.scan_only) {
    StatsResult st;
    k.stats(p, line.dtype, len, line.scale, &st);
    out.raw_max = st.raw_max;
    out.argmax = 0;
    out.nan = st.nan;
    out.m = st.m;
    out.z = st.z;
    return;
  }
  ScanResult sr;
  k.scan(p, line.dtype, len, line.mode == kArgmax, &sr);
  out.raw_max = sr.max;
  out.argmax = start + sr.argmax;
  out.nan = sr.nan;
  out.m = -kInf;
  out.z = 0.0f;
}

void combine_chunks(Line& line, const ChunkStats* chunks, int64_t count) {
  float raw = -kInf;
  int64_t argmax = 0;
  bool nan = false;
  for (int64_t c = 0; c < count; ++c) {
    nan |= chunks[c].nan;
    if (chunks[c].raw_max > raw) {  // strictly greater: the lowest index wins ties, like torch.argmax
      raw = chunks[c].raw_max;
      argmax = chunks[c].argmax;
    }
  }
  line.raw_max = raw;
  line.argmax = argmax;
  line.bad = line_is_bad(nan, raw, line.scale);
  if (line.mode != kStats || line.bad) return;
  line.m = scaled_max(raw, line.scale);
  line.tau = -kInf;
  if (line.scan_only) return;
  float z = 0.0f;
  for (int64_t c = 0; c < count; ++c) {
    if (chunks[c].m > -kInf) z += chunks[c].z * exp_neg(chunks[c].m - line.m);
  }
  line.z = z;
}


// p(x) for one id, with the same formula as the race loops (and the reference).
float prob_at(const Line& line, int64_t x) {
  float s = load_one(line.ptr, line.dtype, x);
  if (line.scale != 1.0f) s = s / line.scale;
  const float p = exp_neg(s - line.m) / line.z;
  return s >= line.tau ? p : 0.0f;
}

// How items are spread over threads. Every way gives the same results (each item writes only its
// own slot, items are claimed from a shared counter); they differ in how they wait:
// * openmp: at::parallel_for, torch's OpenMP team. Right after a torch op its workers are still
//   spinning and start at once, but the region ends with a barrier that waits for every worker:
//   when other processes keep the cores busy, a worker that is not running costs a scheduler time
//   slice (on this project's 2-core machine with a training job running, a ~0.4 ms call took
//   ~15 ms that way).
// * pool: helper tasks on ATen's inter-op pool; the caller works through the items itself and
//   waits only for items a helper has already claimed, so a helper the OS runs late costs
//   nothing. Waking the helper costs more than reusing a spinning OpenMP worker (~10-30% of a
//   B=1, V=128256 call on an idle machine).
// * auto (default): openmp, until a region's barrier waits more than kBarrierAlarmNs after the
//   work ran out (a sign that a worker was not scheduled); then pool for kPoolHoldNs before
//   trying openmp again.
// bench/bench_cpp.py measures them (--scheduler); SPECDEC_CPU_SCHEDULER=openmp|pool|auto.
enum class Scheduler { kAuto, kPool, kOpenMP };

constexpr int64_t kBarrierAlarmNs = 1000000;  // 1 ms: far above an item's duration (microseconds)
constexpr int64_t kPoolHoldNs = 1000000000;   // 1 s

Scheduler parse_scheduler(const std::string& name, bool* ok) {
  *ok = true;
  if (name == "auto") return Scheduler::kAuto;
  if (name == "pool") return Scheduler::kPool;
  if (name == "openmp") return Scheduler::kOpenMP;
  *ok = false;
  return Scheduler::kAuto;
}

int default_scheduler() {
  const char* env = std::getenv("SPECDEC_CPU_SCHEDULER");
  bool ok = false;
  const Scheduler chosen = env != nullptr ? parse_scheduler(env, &ok) : Scheduler::kAuto;
  return static_cast<int>(ok ? chosen : Scheduler::kAuto);
}

std::atomic<int> g_scheduler{default_scheduler()};
std::atomic<int64_t> g_pool_until_ns{0};  // auto: use the pool until this steady-clock time

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool set_scheduler(const std::string& name) {
  bool ok = false;
  const Scheduler chosen = parse_scheduler(name, &ok);
  if (ok) {
    g_scheduler.store(static_cast<int>(chosen));
    g_pool_until_ns.store(0);
  }
  return ok;
}

std::string scheduler() {
  switch (static_cast<Scheduler>(g_scheduler.load())) {
    case Scheduler::kPool: return "pool";
    case Scheduler::kOpenMP: return "openmp";
    default: return "auto";
  }
}

struct SharedWork {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t count = 0;
  const std::function<void(int64_t, Scratch&)>* fn = nullptr;  // only used for claimed items
};

void drain(SharedWork& work) {
  thread_local Scratch scratch;
  for (int64_t i = work.next.fetch_add(1, std::memory_order_relaxed); i < work.count; i = work.next.fetch_add(1, std::memory_order_relaxed)) {
    (*work.fn)(i, scratch);
    work.done.fetch_add(1, std::memory_order_release);
  }
}

// Runs fn(i, scratch) for i in [0, count): serially when the work is small (a parallel start costs
// more than it saves), else on up to torch.get_num_threads() threads pulling item indices from a
// shared counter. The thread count changes only who computes an item, never its result.
template <typename F>
void run_items(int64_t count, int64_t elements, const F& fn) {
  if (count <= 0) return;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), count);
  if (elements < kSerialElements || threads <= 1 || at::in_parallel_region()) {
    thread_local Scratch scratch;
    for (int64_t i = 0; i < count; ++i) fn(i, scratch);
    return;
  }
  const Scheduler mode = static_cast<Scheduler>(g_scheduler.load(std::memory_order_relaxed));
  const bool use_pool = mode == Scheduler::kPool || (mode == Scheduler::kAuto && now_ns() < g_pool_until_ns.load(std::memory_order_relaxed));
  if (!use_pool) {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> ran_out_ns{0};  // when a thread first found no item left
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
      thread_local Scratch scratch;
      for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < count; i = next.fetch_add(1, std::memory_order_relaxed)) fn(i, scratch);
      int64_t expected = 0;
      ran_out_ns.compare_exchange_strong(expected, now_ns(), std::memory_order_relaxed);
    });
    if (mode == Scheduler::kAuto) {
      const int64_t end = now_ns();
      if (end - ran_out_ns.load(std::memory_order_relaxed) > kBarrierAlarmNs) g_pool_until_ns.store(end + kPoolHoldNs, std::memory_order_relaxed);
    }
    return;
  }
  // The state lives in a shared_ptr so a helper that starts after this call returned still finds it.
  const std::function<void(int64_t, Scratch&)> call = [&fn](int64_t i, Scratch& scratch) { fn(i, scratch); };
  auto work = std::make_shared<SharedWork>();
  work->count = count;
  work->fn = &call;
  const int64_t helpers = std::min<int64_t>(threads - 1, static_cast<int64_t>(at::get_num_interop_threads()));
  for (int64_t h = 0; h < helpers; ++h) at::launch([work] { drain(*work); });
  drain(*work);
  // Every item is claimed; wait for the ones helpers are still computing (a few microseconds each).
  while (work->done.load(std::memory_order_acquire) < count) std::this_thread::yield();
}

struct Row {
  float temperature = 1.0f;
  int64_t top_k = 0;
  float top_p = 1.0f;
  int64_t num_draft = 0;
  bool bad = false;
  bool greedy = false;
  int64_t accepted = 0;
  int64_t winner = -1;
};

// One unit of parallel work: a chunk of a line (statistics, or the max / argmax / validity scan),
// a whole filtered line, or a chunk of a race (or a whole race over a kept-id list).
struct Item {
  enum Kind : int8_t { kLineChunk, kFilterLine, kRace };
  Kind kind;
  int32_t index;  // line or race
  int32_t chunk;
};

std::tuple<at::Tensor, at::Tensor> verify_impl(const at::Tensor& target_in, const std::optional<at::Tensor>& draft_opt, const at::Tensor& tokens,
                                               const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                                               const at::Tensor& num_draft, const at::Tensor& seed, bool check) {
  TORCH_CHECK(target_in.dim() == 3, "specdec: target_logits must be (B, K+1, V), got ", target_in.sizes());
  TORCH_CHECK(target_in.device().is_cpu(), "specdec: the C++ kernel needs CPU tensors");
  const int64_t batch = target_in.size(0), length = target_in.size(1), vocab = target_in.size(2);
  TORCH_CHECK(length >= 1 && vocab >= 1, "specdec: target_logits needs a position and a vocabulary entry");
  const int64_t num_positions = length - 1;
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == batch && tokens.size(1) == num_positions, "specdec: draft_tokens must be (B, K)");
  TORCH_CHECK(tokens.scalar_type() == at::kLong || tokens.scalar_type() == at::kInt, "specdec: draft_tokens must be int32 or int64");
  for (const at::Tensor* t : {&temperature, &top_k, &top_p, &num_draft}) {
    TORCH_CHECK(t->device().is_cpu() && (t->dim() == 0 || (t->dim() == 1 && t->size(0) == batch)), "specdec: per-row parameters must be (B,) CPU tensors");
  }
  TORCH_CHECK(seed.numel() >= 1 && seed.scalar_type() == at::kLong && seed.device().is_cpu(), "specdec: seed must be an int64 CPU tensor");

  // Logits are read in place; only a vocabulary stride other than 1 forces a copy.
  const at::Tensor target = target_in.stride(2) == 1 ? target_in : target_in.contiguous();
  at::Tensor draft;
  const bool has_draft = draft_opt.has_value() && draft_opt->defined();
  int64_t draft_vocab = vocab;
  if (has_draft) {
    const at::Tensor& d = *draft_opt;
    TORCH_CHECK(d.dim() == 3 && d.size(0) == batch && d.size(1) == num_positions && d.size(2) >= 1 && d.size(2) <= vocab,
                "specdec: draft_logits must be (B, K, Vd) with 1 <= Vd <= V, got ", d.sizes());
    TORCH_CHECK(d.device().is_cpu(), "specdec: the C++ kernel needs CPU tensors");
    draft = d.stride(2) == 1 ? d : d.contiguous();
    draft_vocab = d.size(2);
  }

  at::Tensor out_tokens = at::full({batch, length}, -1, target.options().dtype(at::kLong));
  at::Tensor out_accepted = at::zeros({batch}, target.options().dtype(at::kLong));
  if (batch == 0) return {out_tokens, out_accepted};

  const Kernels& k = kernels();
  const int32_t t_dtype = dtype_code(target.scalar_type());
  const int32_t d_dtype = has_draft ? dtype_code(draft.scalar_type()) : kF32;
  const char* t_base = static_cast<const char*>(target.const_data_ptr());
  const char* d_base = has_draft ? static_cast<const char*>(draft.const_data_ptr()) : nullptr;
  const int64_t t_size = dtype_size(t_dtype), d_size = dtype_size(d_dtype);

  const char* tok_base = static_cast<const char*>(tokens.const_data_ptr());
  const bool tok_long = tokens.scalar_type() == at::kLong;
  const int64_t tok_s0 = tokens.stride(0), tok_s1 = tokens.stride(1);
  auto token_at = [&](int64_t b, int64_t pos) -> int64_t {
    const int64_t off = b * tok_s0 + pos * tok_s1;
    return tok_long ? reinterpret_cast<const int64_t*>(tok_base)[off] : reinterpret_cast<const int32_t*>(tok_base)[off];
  };
  auto clamp_token = [&](int64_t x) { return std::min(std::max(x, int64_t{0}), draft_vocab - 1); };

  const int64_t seed_value = seed.const_data_ptr<int64_t>()[0];
  const uint32_t key0 = static_cast<uint32_t>(static_cast<uint64_t>(seed_value) & 0xFFFFFFFFu);
  const uint32_t key1 = static_cast<uint32_t>((static_cast<uint64_t>(seed_value) >> 32) & 0xFFFFFFFFu);

  // Rows: parameters, and the value checks that do not need the logits.
  std::vector<Row> rows(batch);
  for (int64_t b = 0; b < batch; ++b) {
    Row& r = rows[b];
    r.temperature = row_float(temperature, b);
    r.top_k = row_int(top_k, b);
    r.top_p = row_float(top_p, b);
    r.num_draft = row_int(num_draft, b);
    r.bad = !(r.temperature >= 0.0f) || std::isinf(r.temperature) || r.top_k < 0 || !(r.top_p > 0.0f && r.top_p <= 1.0f) || r.num_draft < 0 ||
            r.num_draft > num_positions;
    r.greedy = r.temperature == 0.0f;
    for (int64_t pos = 0; !r.bad && pos < r.num_draft; ++pos) {
      const int64_t x = token_at(b, pos);
      r.bad = x < 0 || x >= draft_vocab;
    }
  }

  // Lines: target (b, pos) at b * (K+1) + pos, draft (b, pos) after all target lines.
  const int64_t num_target_lines = batch * length;
  std::vector<Line> lines(num_target_lines + batch * num_positions);
  auto target_index = [&](int64_t b, int64_t pos) { return b * length + pos; };
  auto draft_index = [&](int64_t b, int64_t pos) { return num_target_lines + b * num_positions + pos; };
  auto target_line = [&](int64_t b, int64_t pos) -> Line& { return lines[target_index(b, pos)]; };
  auto draft_line = [&](int64_t b, int64_t pos) -> Line& { return lines[draft_index(b, pos)]; };
  int64_t num_chunks = 0;
  auto setup_line = [&](Line& line, const char* ptr, int32_t dtype, int64_t n, const Row& r, bool is_draft) {
    line.ptr = ptr;
    line.dtype = dtype;
    line.n = n;
    line.scale = r.greedy ? 1.0f : r.temperature;
    line.top_k = r.top_k;
    line.top_p = r.top_p;
    const bool filtered = !r.greedy && ((r.top_k > 0 && r.top_k < n) || r.top_p < 1.0f);
    line.mode = r.greedy ? (is_draft ? kCheck : kArgmax) : (filtered ? kFilter : kStats);
    line.first_chunk = num_chunks;
    num_chunks += (n + kChunk - 1) / kChunk;
  };
  for (int64_t b = 0; b < batch; ++b) {
    const Row& r = rows[b];
    if (r.bad) continue;
    for (int64_t pos = 0; pos <= r.num_draft; ++pos) {
      setup_line(target_line(b, pos), t_base + (b * target.stride(0) + pos * target.stride(1)) * t_size, t_dtype, vocab, r, false);
    }
    for (int64_t pos = 0; has_draft && pos < r.num_draft; ++pos) {
      setup_line(draft_line(b, pos), d_base + (b * draft.stride(0) + pos * draft.stride(1)) * d_size, d_dtype, draft_vocab, r, true);
    }
  }
  std::vector<ChunkStats> chunk_stats(num_chunks);

  // Races: one per non-greedy row, set up once the row's accepted prefix is known.
  const int64_t chunks_per_race = (vocab + kChunk - 1) / kChunk;
  std::vector<int64_t> race_rows;
  std::vector<RaceArgs> race_args;
  std::vector<const Line*> race_lines;
  std::vector<int64_t> race_first;  // first result slot of each race
  std::vector<RaceBest> race_best;
  race_rows.reserve(batch);
  race_args.reserve(batch);
  race_lines.reserve(batch);
  std::vector<uint32_t> shared_best(batch, 0);  // see RaceArgs::shared_best

  // The work runs in regions (one parallel pass each). The first reads position 0 of every row
  // (and every target line of a greedy row); each later one reads the next position of the rows
  // still accepting, races the rows that just finished and, with `check`, reads the lines no row
  // will reach, only for the validity check (a bad value anywhere a row looks makes the row
  // invalid; the memory-bound scans then share a pass with compute-bound races). The exp work
  // follows the accepted prefix instead of K. Every line is read at most once.
  std::vector<Item> region;
  std::vector<int64_t> region_lines;
  int64_t region_work = 0;
  auto add_line = [&](int64_t index, bool scan_only) {
    Line& line = lines[index];
    line.scan_only = scan_only;
    region_lines.push_back(index);
    region_work += line.n;
    if (line.mode == kFilter && !scan_only) {
      region.push_back({Item::kFilterLine, static_cast<int32_t>(index), 0});
      return;
    }
    const int64_t count = (line.n + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < count; ++c) region.push_back({Item::kLineChunk, static_cast<int32_t>(index), static_cast<int32_t>(c)});
  };
  auto add_race = [&](int64_t b) {
    Row& r = rows[b];
    const int64_t j = r.accepted;
    const Line& t = target_line(b, j);
    const bool rejected = j < r.num_draft;
    RaceArgs a{};
    a.target = t.ptr;
    a.target_dtype = t.dtype;
    a.scale = t.scale;
    a.p_max = t.m;
    a.p_norm = t.z;
    a.p_tau = t.tau;
    a.draft = nullptr;
    a.draft_dtype = kF32;
    a.draft_vocab = 0;
    a.q_norm = 1.0f;
    a.one_hot = -1;
    a.residual = rejected;
    if (rejected && has_draft) {
      const Line& d = draft_line(b, j);
      a.draft = d.ptr;
      a.draft_dtype = d.dtype;
      a.draft_vocab = d.n;
      a.q_max = d.m;
      a.q_norm = d.z;
      a.q_tau = d.tau;
    } else if (rejected) {
      a.one_hot = clamp_token(token_at(b, j));
    }
    a.key0 = key0;
    a.key1 = key1;
    a.position = static_cast<uint32_t>(j);
    a.row = static_cast<uint32_t>(b);
    a.shared_best = &shared_best[b];
    const int64_t race = static_cast<int64_t>(race_rows.size());
    race_rows.push_back(b);
    race_args.push_back(a);
    race_lines.push_back(&t);
    const int64_t parts = t.has_kept ? 1 : chunks_per_race;
    race_first.push_back(static_cast<int64_t>(race_best.size()));
    race_best.resize(race_best.size() + parts, RaceBest{0.0f, -1});
    for (int64_t c = 0; c < parts; ++c) region.push_back({Item::kRace, static_cast<int32_t>(race), static_cast<int32_t>(c)});
    region_work += t.has_kept ? static_cast<int64_t>(t.kept.size()) * 16 : vocab;
  };
  auto run_race = [&](const RaceArgs& a, const Line& line, int64_t chunk, RaceBest* best) {
    if (line.has_kept) {
      k.race_list(&a, line.kept.data(), static_cast<int64_t>(line.kept.size()), best);
    } else {
      k.race(&a, chunk * kChunk, std::min(kChunk, vocab - chunk * kChunk), best);
    }
  };
  // The lines of a finished row that the verification did not read: scanned for the validity
  // check only. A greedy row reads its target lines (argmax) and, with `check`, its draft lines.
  auto schedule_rest = [&](int64_t b) {
    const Row& r = rows[b];
    for (int64_t pos = 0; pos <= r.num_draft; ++pos) {
      if (!target_line(b, pos).done) add_line(target_index(b, pos), true);
    }
    for (int64_t pos = 0; check && has_draft && pos < r.num_draft; ++pos) {
      if (!draft_line(b, pos).done) add_line(draft_index(b, pos), true);
    }
  };

  std::vector<int64_t> active;  // non-greedy rows still accepting, at position rows[b].accepted
  for (int64_t b = 0; b < batch; ++b) {
    Row& r = rows[b];
    if (r.bad) continue;
    if (r.greedy) {
      schedule_rest(b);  // greedy rows need only argmax scans (and the validity of the drafts)
      continue;
    }
    r.accepted = 0;
    active.push_back(b);
    add_line(target_index(b, 0), false);
    if (has_draft && r.num_draft > 0) add_line(draft_index(b, 0), false);
  }

  while (!region.empty()) {
    run_items(static_cast<int64_t>(region.size()), region_work, [&](int64_t i, Scratch& scratch) {
      const Item item = region[i];
      if (item.kind == Item::kRace) {
        RaceBest best{0.0f, -1};
        run_race(race_args[item.index], *race_lines[item.index], item.chunk, &best);
        race_best[race_first[item.index] + item.chunk] = best;
        return;
      }
      Line& line = lines[item.index];
      if (item.kind == Item::kFilterLine) {
        process_filter_line(line, scratch, k);
      } else {
        process_chunk(line, item.chunk, chunk_stats[line.first_chunk + item.chunk], k);
      }
    });
    for (int64_t index : region_lines) {
      Line& line = lines[index];
      if (line.mode != kFilter || line.scan_only) combine_chunks(line, chunk_stats.data() + line.first_chunk, (line.n + kChunk - 1) / kChunk);
      line.done = true;
    }
    region.clear();
    region_lines.clear();
    region_work = 0;

    // Acceptance at each active row's position; the next region reads what the survivors need.
    size_t still = 0;
    for (int64_t b : active) {
      Row& r = rows[b];
      const int64_t j = r.accepted;
      if (target_line(b, j).bad || (has_draft && j < r.num_draft && draft_line(b, j).bad)) {
        r.bad = true;  // no need to look further: the row is blanked
        continue;
      }
      bool accepted = false;
      if (j < r.num_draft) {
        const int64_t x = clamp_token(token_at(b, j));
        const float p = prob_at(target_line(b, j), x);
        const float q = has_draft ? prob_at(draft_line(b, j), x) : 1.0f;
        const float u = philox::to_uniform(philox::word0(0, static_cast<uint32_t>(j), static_cast<uint32_t>(b), philox::kAcceptStream, key0, key1));
        accepted = u * q < p;
      }
      if (accepted) {
        r.accepted = j + 1;
        active[still++] = b;
        add_line(target_index(b, j + 1), false);
        if (has_draft && j + 1 < r.num_draft) add_line(draft_index(b, j + 1), false);
      } else {
        add_race(b);
        if (check) schedule_rest(b);
      }
    }
    active.resize(still);
  }

  // Validity (every line up to n_b with `check`; otherwise the lines read, which a non-greedy row's
  // walk already checked), greedy rows' tokens, and the races' winners. (Lines never read are
  // not `bad`.)
  for (int64_t b = 0; b < batch; ++b) {
    Row& r = rows[b];
    if (r.bad) continue;
    if (check || !r.greedy) {
      for (int64_t pos = 0; pos <= r.num_draft && !r.bad; ++pos) r.bad = target_line(b, pos).bad;
      for (int64_t pos = 0; has_draft && pos < r.num_draft && !r.bad; ++pos) r.bad = draft_line(b, pos).bad;
    }
    if (r.bad || !r.greedy) continue;
    // The greedy walk stops at a bad line: it blanks the row, with or without `check`.
    int64_t j = 0;
    while (j < r.num_draft && !target_line(b, j).bad && clamp_token(token_at(b, j)) == target_line(b, j).argmax) ++j;
    r.bad = target_line(b, j).bad;
    r.accepted = j;
    r.winner = target_line(b, j).argmax;
  }
  const int64_t num_races = static_cast<int64_t>(race_rows.size());
  for (int64_t race = 0; race < num_races; ++race) {
    Row& r = rows[race_rows[race]];
    if (r.bad) continue;
    const int64_t parts = race_lines[race]->has_kept ? 1 : chunks_per_race;
    RaceBest best{0.0f, -1};
    for (int64_t c = 0; c < parts; ++c) {
      const RaceBest& part = race_best[race_first[race] + c];
      if (part.index >= 0 && part.value > best.value) best = part;  // chunk order: lowest id on ties
    }
    if (best.index < 0) {
      // The residual is zero everywhere (p equals q up to rounding): race on p, as the reference does.
      RaceArgs a = race_args[race];
      a.residual = false;
      a.shared_best = nullptr;
      for (int64_t c = 0; c < parts; ++c) {
        RaceBest part{0.0f, -1};
        run_race(a, *race_lines[race], c, &part);
        if (part.index >= 0 && part.value > best.value) best = part;
      }
    }
    r.winner = best.index >= 0 ? best.index : 0;
  }

  // Output.
  int64_t* out_t = out_tokens.mutable_data_ptr<int64_t>();
  int64_t* out_a = out_accepted.mutable_data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const Row& r = rows[b];
    if (r.bad) continue;
    for (int64_t pos = 0; pos < r.accepted; ++pos) out_t[b * length + pos] = clamp_token(token_at(b, pos));
    out_t[b * length + r.accepted] = r.winner;
    out_a[b] = r.accepted;
  }
  return {out_tokens, out_accepted};
}

std::tuple<at::Tensor, at::Tensor> verify_cpu(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits,
                                              const at::Tensor& draft_tokens, const at::Tensor& temperature, const at::Tensor& top_k,
                                              const at::Tensor& top_p, const at::Tensor& num_draft_tokens, const at::Tensor& seed, bool check) {
  return verify_impl(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, num_draft_tokens, seed, check);
}

// sample = verify with K = 0 (the bonus draw), so both share one stream.
at::Tensor sample_cpu(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& seed) {
  TORCH_CHECK(logits.dim() == 2, "specdec: logits must be (B, V), got ", logits.sizes());
  const int64_t batch = logits.size(0);
  const at::Tensor no_drafts = at::empty({batch, 0}, logits.options().dtype(at::kLong));
  const at::Tensor zeros = at::zeros({batch}, logits.options().dtype(at::kLong));
  auto result = verify_impl(logits.unsqueeze(1), std::nullopt, no_drafts, temperature, top_k, top_p, zeros, seed, /*check=*/true);
  return std::get<0>(result).select(1, 0);
}

// Benchmark hook (bench/bench_cpp.py): nanoseconds per bonus race (r = p, no draft) over a whole
// float32 line, on the calling thread, chunk after chunk as a verify call runs it; a fresh key
// each repetition. The line statistics are computed once, outside the timing.
double race_ns(const at::Tensor& line, int64_t reps) {
  TORCH_CHECK(line.dim() == 1 && line.scalar_type() == at::kFloat && line.device().is_cpu() && line.is_contiguous(),
              "specdec: race_ns takes a contiguous (V,) float32 CPU tensor");
  TORCH_CHECK(reps >= 1, "specdec: reps must be >= 1");
  const Kernels& k = kernels();
  const int64_t vocab = line.size(0);
  StatsResult st;
  k.stats(line.const_data_ptr(), kF32, vocab, 1.0f, &st);
  RaceArgs a{};
  a.target = line.const_data_ptr();
  a.target_dtype = kF32;
  a.scale = 1.0f;
  a.p_max = st.m;
  a.p_norm = st.z;
  a.p_tau = -kInf;
  a.draft = nullptr;
  a.q_norm = 1.0f;
  a.one_hot = -1;
  a.residual = false;
  int64_t sink = 0;
  const int64_t start = now_ns();
  for (int64_t rep = 0; rep < reps; ++rep) {
    uint32_t shared = 0;
    a.key0 = static_cast<uint32_t>(rep);
    a.key1 = 0x5EEDu;
    a.shared_best = &shared;
    RaceBest best{0.0f, -1};
    for (int64_t begin = 0; begin < vocab; begin += kChunk) {
      RaceBest part{0.0f, -1};
      k.race(&a, begin, std::min(kChunk, vocab - begin), &part);
      if (part.index >= 0 && part.value > best.value) best = part;
    }
    sink += best.index;
  }
  const int64_t elapsed = now_ns() - start;
  TORCH_CHECK(sink >= 0, "specdec: race_ns found no winner");
  return static_cast<double>(elapsed) / static_cast<double>(reps);
}

}  // namespace
}  // namespace specdec

// The operator schema lives here so that compiled graphs call the C++ kernel without Python;
// specdec_ext/ops.py adds the CUDA (Triton) and fake implementations.
TORCH_LIBRARY(specdec, m) {
  m.set_python_module("specdec_ext.ops");
  m.def(
      "verify(Tensor target_logits, Tensor? draft_logits, Tensor draft_tokens, Tensor temperature, Tensor top_k, Tensor top_p, "
      "Tensor num_draft_tokens, Tensor seed, bool check=True) -> (Tensor, Tensor)");
  m.def("sample(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor seed) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("verify", &specdec::verify_cpu);
  m.impl("sample", &specdec::sample_cpu);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specdec_ext C++ CPU kernel";
  m.def("verify", &specdec::verify_cpu, "Fused verification: (tokens (B, K+1) int64, num_accepted (B,) int64)", pybind11::arg("target_logits"),
        pybind11::arg("draft_logits"), pybind11::arg("draft_tokens"), pybind11::arg("temperature"), pybind11::arg("top_k"), pybind11::arg("top_p"),
        pybind11::arg("num_draft_tokens"), pybind11::arg("seed"), pybind11::arg("check") = true);
  m.def("sample", &specdec::sample_cpu, "One token per row (verify with K = 0)");
  m.def("race_ns", &specdec::race_ns, "Benchmark hook: ns per bonus race over a (V,) float32 line on one thread", pybind11::arg("line"),
        pybind11::arg("reps"));
  m.def("isa", &specdec::isa, "The instruction-set variant in use");
  m.def("set_isa", &specdec::set_isa, "Pin a variant ('auto', 'avx512', 'avx2', 'base'); False if this CPU lacks it");
  m.def("scheduler", &specdec::scheduler, "How work is spread over threads: 'auto' (default), 'openmp' or 'pool'");
  m.def("set_scheduler", &specdec::set_scheduler, "Choose 'auto', 'openmp' or 'pool'; False for an unknown name");
}
