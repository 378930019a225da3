// Line statistics per chunk and their combination, and the top-k / top-p filter, whose kept set
// {s >= tau} is the reference's exactly (specdec_ext/reference.py: filter_thresholds).
//
// A filtered line is read in chunks like any other, so one line spreads over every thread. Its
// chunks collect the candidates s >= t for a threshold t guessed from a sample of the line (for
// top-p, with the line's exact maximum and normaliser, from a first pass of chunk statistics); t is
// then checked to lie at or below both cuts (k values reach it; for top-p, its mass reaches the
// budget), with a fall back to the whole line, so the guess only changes the work. The selection
// then runs on the candidates alone. Every step is a function of the line (fixed chunks, fixed
// sample positions, candidates in id order), never of the thread count or of the batch.
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "lines.h"

namespace specdec {

using fastmath::exp_neg;

Scratch& thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

namespace {

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
// about 2k + 8 * n / (sample size) values for top-k; for top-p, the values holding an estimated
// (1 + top_p) / 2 of the mass (the exactly known maximum counted exactly, since one dominant token
// is easily missed by a sample).
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
      const float v = scaled_at(line, r * spacing + i);
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
  // The mass is estimated from the sample itself (so the walk below always ends on a sample value);
  // the caller checks the guess against the exact normaliser.
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

bool uses_top_k(const Line& line) { return line.top_k > 0 && line.top_k < line.n; }

// The first id holding the line's maximum among ascending candidates (the race's pruning seed).
int64_t first_max_id(const float* cand, const int64_t* ids, int64_t count, float m) {
  for (int64_t i = 0; i < count; ++i) {
    if (cand[i] == m) return ids[i];
  }
  return -1;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Chunks.

void process_chunk(Line& line, int64_t chunk, ChunkStats& out, const Kernels& k) {
  const int64_t start = chunk * kChunk;
  const int64_t len = std::min(kChunk, line.n - start);
  const char* p = line.ptr + start * dtype_size(line.dtype);
  out.argmax = 0;
  out.m = -kInf;
  out.z = 0.0;
  out.raw_z = 0.0;
  const bool collecting = line.mode == kFilter && !line.scan_only && line.guess_ready;
  const bool statistics = !line.scan_only && (line.mode == kStats || (line.mode == kFilter && !line.guess_ready));
  if (statistics) {
    StatsResult st;
    k.stats(p, line.dtype, len, line.inv_t, line.want_raw, &st);
    out.raw_max = st.raw_max;
    out.nan = st.nan;
    out.m = st.m;
    out.z = st.z;
    out.raw_z = st.raw_z;
    return;
  }
  if (collecting) {
    // Candidates s >= guess; the pass also reports max(s) and NaN, the line's validity check.
    Scratch& scratch = thread_scratch();
    std::call_once(line.guess_once, [&] { line.guess = guess_candidate_threshold(line, uses_top_k(line), scratch.sample); });
    float* values = scratch.values.get(len);
    int64_t* ids = scratch.ids.get(len);
    float max_s;
    bool nan;
    const int64_t count = k.collect(p, line.dtype, len, line.inv_t, line.guess, start, values, ids, &max_s, &nan);
    Candidates& found = line.candidates[chunk];
    found.values.assign(values, values + count);
    found.ids.assign(ids, ids + count);
    out.nan = nan;
    out.m = max_s;
    out.raw_max = max_s;  // (validity from the scaled maximum; the raw one comes with want_raw)
    if (line.want_raw && !line.top_p_first_pass_done) {
      StatsResult raw;
      k.stats(p, line.dtype, len, 1.0f, false, &raw);
      out.raw_max = raw.raw_max;
      out.raw_z = raw.z;
    }
    return;
  }
  ScanResult sr;
  k.scan(p, line.dtype, len, line.mode == kArgmax, &sr);
  out.raw_max = sr.max;
  out.argmax = start + sr.argmax;
  out.nan = sr.nan;
  if (line.mode == kArgmax && line.want_raw && !sr.nan) {  // (greedy rows' target lines: logprobs)
    StatsResult raw;
    k.stats(p, line.dtype, len, 1.0f, false, &raw);
    out.raw_z = raw.z;
  }
}

namespace {

// sum_c z_c * exp(m_c - m) in double: the chunks' normalisers relative to the line's maximum.
double rescaled_sum(const ChunkStats* chunks, int64_t count, float m, bool raw) {
  double z = 0.0;
  for (int64_t c = 0; c < count; ++c) {
    const float mc = raw ? chunks[c].raw_max : chunks[c].m;
    const double zc = raw ? chunks[c].raw_z : chunks[c].z;
    if (mc > -kInf && zc > 0.0) z += zc * std::exp(static_cast<double>(mc) - static_cast<double>(m));
  }
  return z;
}

}  // namespace

void combine_chunks(Line& line, const ChunkStats* chunks, const Kernels& k) {
  (void)k;
  const int64_t count = line.chunks;
  const bool collected = line.mode == kFilter && !line.scan_only && line.guess_ready;
  float raw = -kInf, scaled = -kInf;
  int64_t argmax = 0, max_chunk = 0;
  bool nan = false;
  for (int64_t c = 0; c < count; ++c) {
    nan |= chunks[c].nan;
    if (chunks[c].raw_max > raw) {  // strictly greater: the lowest index wins ties, like torch.argmax
      raw = chunks[c].raw_max;
      argmax = chunks[c].argmax;
      max_chunk = c;
    }
    scaled = chunks[c].m > scaled ? chunks[c].m : scaled;
  }
  if (collected) {
    // A filtered line's collection pass: validity from max(s) (see process_chunk); m = max(s).
    if (line.top_p_first_pass_done) return;  // statistics came from the first pass
    line.bad = nan || !(scaled > -kInf && scaled < kInf);
    line.m = scaled;
    if (line.want_raw && !line.bad) {
      line.raw_max = raw;
      line.raw_z = static_cast<float>(rescaled_sum(chunks, count, raw, true));
    }
    return;
  }
  line.raw_max = raw;
  if (line.mode == kArgmax) line.argmax = argmax;
  line.max_chunk = max_chunk;
  line.bad = line_is_bad(nan, raw, line.inv_t);
  if (line.bad) return;
  if (line.mode == kArgmax) {  // (a greedy row's target lines are scheduled as scans)
    if (line.want_raw) line.raw_z = static_cast<float>(rescaled_sum(chunks, count, raw, true));
    return;
  }
  if (line.scan_only) return;
  if (line.mode != kStats && line.mode != kFilter) return;
  line.m = line.inv_t == 1.0f ? raw : raw * line.inv_t;
  line.tau = -kInf;
  const double z = rescaled_sum(chunks, count, line.m, false);
  if (line.want_raw) line.raw_z = line.inv_t == 1.0f ? static_cast<float>(z) : static_cast<float>(rescaled_sum(chunks, count, raw, true));
  if (line.mode == kStats) {
    line.z = static_cast<float>(z);
  } else {
    line.z_all = z;  // a top-p-only line's first pass: the budget's normaliser
    line.top_p_first_pass_done = true;
  }
}

// ---------------------------------------------------------------------------------------------
// Filtered lines.

bool filter_needs_stats_first(const Line& line) { return !uses_top_k(line); }

void prepare_filter_line(Line& line) {
  line.guess_ready = true;
  line.candidates.assign(line.chunks, Candidates{});
}

void finish_filter_line(Line& line, const Kernels& k) {
  if (line.bad) {
    line.candidates.clear();
    return;
  }
  Scratch& scratch = thread_scratch();
  const int64_t n = line.n;
  const bool use_k = uses_top_k(line);
  const bool use_p = line.top_p < 1.0f;
  float* cand = scratch.values.get(n);
  int64_t* ids = scratch.ids.get(n);
  int64_t count = 0;
  for (const Candidates& part : line.candidates) {
    std::copy(part.values.begin(), part.values.end(), cand + count);
    std::copy(part.ids.begin(), part.ids.end(), ids + count);
    count += static_cast<int64_t>(part.values.size());
  }
  line.candidates.clear();
  const float budget_all = line.top_p * static_cast<float>(line.z_all);
  // (A small margin keeps a top-p cut that sits at the guess within rounding from depending on it.)
  const bool enough = use_k ? count >= line.top_k : k.mass(cand, count, line.m) >= static_cast<double>(budget_all) * (1.0 + 1e-5);
  if (!enough && line.guess > -kInf) {
    float max_s;
    bool nan;
    count = k.collect(line.ptr, line.dtype, n, line.inv_t, -kInf, 0, cand, ids, &max_s, &nan);
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
    const float z_kept = use_k ? static_cast<float>(k.mass(work, top, line.m)) : static_cast<float>(line.z_all);
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
  line.argmax = first_max_id(work, kept_ids, kept, line.m);
  line.has_kept = kept * 8 <= n;
  if (line.has_kept) line.kept.assign(kept_ids, kept_ids + kept);
}

float prob_at(const Line& line, int64_t x) {
  const float s = scaled_at(line, x);
  const float p = exp_neg(s - line.m) / line.z;
  return s >= line.tau ? p : 0.0f;
}

}  // namespace specdec
