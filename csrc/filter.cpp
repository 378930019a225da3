// Line statistics per chunk and their combination, and the top-k / top-p filter, whose kept set
// {s >= tau} is the reference's exactly (specdec_ext/reference.py: filter_thresholds).
//
// A filtered line is read in chunks like any other, so one line spreads over every thread. Its
// chunks collect the candidates s >= t for a threshold t: with top-k, guessed from a sample of the
// line; for top-p alone, placed from value histograms that the first pass of chunk statistics (the
// line's exact maximum and normaliser) gathers while it reads the line. A top-p window also has an
// upper end: the values above it are certainly kept, so the collection pass only adds up their mass,
// and the exact selection runs on the window's values. Each guess is then checked (k values reach
// t; for top-p, the mass at or above t reaches the budget, and the mass above the window stays
// below it), with a fall back to the whole line, so the guess only changes the work. Every step is
// a function of the line (fixed chunks, fixed sample positions, candidates in id order, histograms
// combined in chunk order), never of the thread count or of the batch.
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
constexpr int64_t kCollectSlack = 16;  // collect's compaction writes up to 16 entries past its count

// A threshold t, from a sample of the line, under which the top-k set (very likely) lies: about
// 2k + 8 * n / (sample size) values.
float guess_top_k_threshold(const Line& line, std::vector<float>& sample) {
  const int64_t n = line.n;
  // About n / 64 values: fewer samples cost less here but leave a looser threshold, i.e. more
  // candidates to select from.
  const int64_t size = std::min(n, std::clamp<int64_t>(n / 64, 256, 2048));
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
  const int64_t rank = static_cast<int64_t>(std::ceil(2.0 * static_cast<double>(line.top_k) * sampled / n)) + 8;
  if (rank >= sampled) return -kInf;
  std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(), std::greater<float>());
  return sample[rank - 1];
}

// The top-p budget top_p * Z, Z the whole line's normaliser, as a float like the reference's.
float top_p_budget(const Line& line) { return line.top_p * static_cast<float>(line.z_all); }

// Relative margins: the window is placed so that its estimated masses clear the budget by
// kPlanMargin; the exact masses must clear it by kCheckMargin (the histogram's float32 sums and
// their rescaling err far less than the difference).
constexpr double kPlanMargin = 1e-4;
constexpr double kCheckMargin = 1e-5;

// Where a top-p-only line's cut lies, from the chunk histograms of its statistics pass: the
// buckets of the line's grid (the chunks' buckets shifted to the line's top, masses rescaled to the
// line's maximum, in chunk order) are walked down to the one where the mass reaches the budget;
// the window spans it, widened by whole buckets until its estimated masses clear the budget by
// kPlanMargin on both sides. Sets guess (the window's low end) and window_hi; false when the histograms
// cannot place the cut (a huge logit, or a cut deeper than the grid).
bool place_top_p_window(Line& line, const ChunkStats* chunks) {
  int64_t top = std::numeric_limits<int64_t>::min();
  for (const ChunkHistogram& h : line.histograms) {
    if (!h.valid) return false;
    if (!h.mass.empty()) top = std::max(top, h.top);
  }
  if (top == std::numeric_limits<int64_t>::min()) return false;
  std::vector<double> mass(kHistBuckets, 0.0);
  for (int64_t c = 0; c < line.chunks; ++c) {
    const ChunkHistogram& h = line.histograms[c];
    if (h.mass.empty()) continue;
    const double scale = std::exp(static_cast<double>(chunks[c].m) - static_cast<double>(line.m));
    const int64_t shift = top - h.top;
    for (size_t j = 0; j < h.mass.size(); ++j) {
      const int64_t b = std::min<int64_t>(shift + static_cast<int64_t>(j), kHistBuckets - 1);
      mass[b] += static_cast<double>(h.mass[j]) * scale;
    }
  }
  const double budget = static_cast<double>(top_p_budget(line));
  std::vector<double> before(kHistBuckets + 1, 0.0);  // mass of the buckets above b
  for (int b = 0; b < kHistBuckets; ++b) before[b + 1] = before[b] + mass[b];
  int crossing = 0;
  while (crossing < kHistBuckets && before[crossing + 1] < budget) ++crossing;
  int first = std::min(crossing, kHistBuckets - 1), last = first;
  while (first > 0 && before[first] > budget * (1.0 - kPlanMargin)) --first;
  while (last < kHistBuckets - 1 && before[last + 1] < budget * (1.0 + kPlanMargin)) ++last;
  if (last >= kHistBuckets - 1) return false;  // the cut may lie below the grid
  // Bucket j of the line holds the values with grid position A - j - 1 < s * kHistPerNat <= A - j.
  line.guess = static_cast<float>(top - last - 1) / kHistPerNat;
  line.window_hi = first == 0 ? kInf : std::nextafter(static_cast<float>(top - first) / kHistPerNat, kInf);
  // A small enough line top (its kept set may be raced alone) is collected whole above the window.
  // Its size, estimated from the masses: a value in bucket b weighs exp(s - m) within e^(1/64)
  // of exp(centre_b - m).
  double at_or_above = 0.0;
  for (int b = 0; b <= last; ++b) {
    const double centre = (static_cast<double>(top - b) - 0.5) / kHistPerNat;
    at_or_above += mass[b] * std::exp(static_cast<double>(line.m) - centre);
  }
  if (at_or_above * 8.0 <= static_cast<double>(line.n)) line.window_hi = kInf;
  return true;
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
    // A top-p-only line's first pass also gathers the histogram that places its window.
    const bool with_histogram = line.mode == kFilter;
    Scratch& scratch = thread_scratch();
    if (with_histogram && !scratch.histogram) scratch.histogram = std::make_unique<ValueHistogram>();
    ValueHistogram* hist = with_histogram ? scratch.histogram.get() : nullptr;
    k.stats(p, line.dtype, len, line.inv_t, line.want_raw, &st, hist);
    if (with_histogram) {
      ChunkHistogram& kept = line.histograms[chunk];
      kept.valid = hist->valid;
      kept.top = hist->top;
      kept.mass.assign(hist->mass, hist->mass + hist->used);
    }
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
    if (uses_top_k(line)) std::call_once(line.guess_once, [&] { line.guess = guess_top_k_threshold(line, scratch.sample); });
    float* values = scratch.values.get(len + kCollectSlack);
    int64_t* ids = scratch.ids.get(len + kCollectSlack);
    CollectStats cs;
    const int64_t count = k.collect(p, line.dtype, len, line.inv_t, line.guess, line.window_hi, line.m, start, values, ids, &cs);
    Candidates& found = line.candidates[chunk];
    found.values.assign(values, values + count);
    found.ids.assign(ids, ids + count);
    found.above = cs.above;
    found.above_mass = cs.above_mass;
    out.nan = cs.nan;
    out.m = cs.max_s;
    out.raw_max = cs.max_s;  // (validity from the scaled maximum; the raw one comes with want_raw)
    if (line.want_raw && !line.top_p_first_pass_done) {
      StatsResult raw;
      k.stats(p, line.dtype, len, 1.0f, false, &raw, nullptr);
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
    k.stats(p, line.dtype, len, 1.0f, false, &raw, nullptr);
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

void prepare_filter_line(Line& line, const ChunkStats* chunks) {
  line.guess_ready = true;
  line.candidates.assign(line.chunks, Candidates{});
  if (!uses_top_k(line) && !place_top_p_window(line, chunks)) {
    line.guess = -kInf;  // the whole line
    line.window_hi = kInf;
  }
  line.histograms.clear();
}

namespace {

// Gathers a line's candidates from its chunks (ascending ids) into cand / ids; returns the count.
int64_t gather_candidates(Line& line, float* cand, int64_t* ids, double* above_mass, int64_t* above) {
  int64_t count = 0;
  *above_mass = 0.0;
  *above = 0;
  for (const Candidates& part : line.candidates) {
    std::copy(part.values.begin(), part.values.end(), cand + count);
    std::copy(part.ids.begin(), part.ids.end(), ids + count);
    count += static_cast<int64_t>(part.values.size());
    *above_mass += part.above_mass;
    *above += part.above;
  }
  line.candidates.clear();
  return count;
}

// A top-p window's selection: the exact cut among the window's values, given the exact mass above
// it; false when the window turns out not to hold the cut (then the caller takes the whole line).
bool finish_top_p_window(Line& line, float* cand, int64_t count, double above, const Kernels& k) {
  const double budget = static_cast<double>(top_p_budget(line));
  const double window_mass = k.mass(cand, count, line.m);
  // Every value above the window kept (its mass before stays below the budget), and the value
  // below the window dropped (the mass at or above the window reaches the budget).
  if (!(above * (1.0 + kCheckMargin) < budget) || !(above + window_mass >= budget * (1.0 + kCheckMargin))) return false;
  bool found = false;
  const float tau = top_p_quickselect(cand, count, line.m, top_p_budget(line), above, &found, k);
  if (!found) return false;
  // (top_p_quickselect reordered cand: the kept window values are those >= tau, in any order.)
  int64_t kept = 0;
  for (int64_t i = 0; i < count; ++i) {
    cand[kept] = cand[i];
    kept += cand[i] >= tau;
  }
  line.tau = tau;
  line.z = static_cast<float>(above + k.mass(cand, kept, line.m));
  line.argmax = -1;  // (above the window: found by a scan when the race needs it)
  line.has_kept = false;
  return true;
}

}  // namespace

void finish_filter_line(Line& line, const Kernels& k) {
  if (line.bad) {
    line.candidates.clear();
    return;
  }
  Scratch& scratch = thread_scratch();
  const int64_t n = line.n;
  const bool use_k = uses_top_k(line);
  const bool use_p = line.top_p < 1.0f;
  float* cand = scratch.values.get(n + kCollectSlack);
  int64_t* ids = scratch.ids.get(n + kCollectSlack);
  double above_mass;
  int64_t above;
  int64_t count = gather_candidates(line, cand, ids, &above_mass, &above);
  const bool window = line.window_hi < kInf;
  if (window && finish_top_p_window(line, cand, count, above_mass, k)) return;
  const float budget_all = top_p_budget(line);
  // (A small margin keeps a top-p cut that sits at the guess within rounding from depending on it.)
  const bool enough = !window && (use_k ? count >= line.top_k : k.mass(cand, count, line.m) >= static_cast<double>(budget_all) * (1.0 + kCheckMargin));
  if (!enough && (line.guess > -kInf || window)) {
    CollectStats cs;
    count = k.collect(line.ptr, line.dtype, n, line.inv_t, -kInf, kInf, line.m, 0, cand, ids, &cs);
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
