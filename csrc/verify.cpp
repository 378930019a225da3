// Fused CPU verification and sampling: the semantics of specdec_ext/reference.py (contract v2:
// per-row keys and offsets, stream v2, logprobs, accept_probs) without (B, K+1, V) temporaries;
// logits are read in place in their own dtype, each line at most once per pass.
//
// The work runs in regions, one parallel pass each (see verify_impl):
// * line statistics: max m, normaliser z and the top-k / top-p threshold tau of a (row, position)
//   line, when a row reaches that position; every line is cut into fixed chunks so one line
//   spreads over all threads (filtered lines too: lines.h, filter.cpp);
// * acceptance between regions: u * q(x) < p(x) (or the argmax test for greedy rows), so the exp
//   work follows the accepted prefix instead of K;
// * the exponential race for the corrected / bonus token of each finished row, in fixed
//   vocabulary chunks (or over the kept ids of a filtered line), sharing a pass with the
//   validity scan of the lines no row reached, when `check` asks for every line up to n_b to be
//   validated (a max / NaN scan: the check needs no softmax statistics). Without it those lines
//   are never read: a row is blanked only for a bad value in a line its verification reads (target
//   and draft lines up to the first rejection; a greedy row reads target lines only).
//
// A row's numbers depend only on its own lines, parameters, key and offset: chunk boundaries never
// depend on the thread count or the batch, partial results are combined in chunk order, and work
// handed out dynamically (an atomic counter) only balances the load.
#include <torch/extension.h>
#include <torch/library.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fastmath.h"
#include "kernel.h"
#include "lines.h"
#include "philox.h"
#include "scheduler.h"

// setup.py passes the torch version as a bare token (a quoted string does not survive every build
// tool's shell quoting); it is turned into a string here.
#define SPECDEC_STRINGIFY2(x) #x
#define SPECDEC_STRINGIFY(x) SPECDEC_STRINGIFY2(x)
#ifdef SPECDEC_TORCH_VERSION
#define SPECDEC_TORCH_VERSION_STRING SPECDEC_STRINGIFY(SPECDEC_TORCH_VERSION)
#else
#define SPECDEC_TORCH_VERSION_STRING "unknown"
#endif

namespace specdec {
namespace {

using fastmath::exp_neg;

constexpr int32_t kLogprobsNone = 0, kLogprobsRaw = 2;  // (1: processed)

// ---------------------------------------------------------------------------------------------
// Instruction-set dispatch.

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

const Kernels& kernels() {
  const Kernels* k = g_kernels.load(std::memory_order_acquire);
  if (k == nullptr) {
    k = best_kernels();
    g_kernels.store(k, std::memory_order_release);
  }
  return *k;
}

// Tests pin each variant to check that they agree.
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

// ---------------------------------------------------------------------------------------------
// Arguments.

// Every tensor the kernel reads must be a dense CPU tensor: a meta tensor has no data and a CUDA
// one would be read as a host pointer.
void check_cpu_tensor(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), "specdec: ", name, " is an undefined tensor");
  TORCH_CHECK_VALUE(t.device().is_cpu(), "specdec: ", name, " must be a CPU tensor for the C++ kernel, got one on ", t.device());
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "specdec: ", name, " must be a dense (strided) tensor, got layout ", t.layout());
}

void check_row_vector(const at::Tensor& t, const char* name, int64_t batch) {
  check_cpu_tensor(t, name);
  TORCH_CHECK_VALUE(t.dim() == 0 || (t.dim() == 1 && t.size(0) == batch), "specdec: ", name, " must be a scalar or a (", batch, ",) tensor, got ", t.sizes());
}

void check_keys(const std::optional<at::Tensor>& t, const char* name, int64_t batch) {
  if (!t.has_value() || !t->defined()) return;
  check_cpu_tensor(*t, name);
  TORCH_CHECK_VALUE(t->scalar_type() == at::kLong, "specdec: ", name, " must be an int64 tensor, got ", t->scalar_type());
  TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == batch, "specdec: ", name, " must have shape (", batch, ",), got ", t->sizes());
}

// Small readers for per-row parameters of any layout (a 0-d tensor expanded to (B,) has stride 0).
float row_float(const at::Tensor& t, int64_t b) {
  const char* base = static_cast<const char*>(t.const_data_ptr());
  const int64_t off = t.dim() == 0 ? 0 : b * t.stride(0);
  switch (t.scalar_type()) {
    case at::kFloat: return reinterpret_cast<const float*>(base)[off];
    case at::kDouble: return static_cast<float>(reinterpret_cast<const double*>(base)[off]);
    case at::kHalf: return static_cast<float>(reinterpret_cast<const at::Half*>(base)[off]);
    case at::kBFloat16: return static_cast<float>(reinterpret_cast<const at::BFloat16*>(base)[off]);
    default: TORCH_CHECK_VALUE(false, "specdec: expected a floating-point parameter tensor, got ", t.scalar_type());
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
    default: TORCH_CHECK_VALUE(false, "specdec: expected an integer parameter tensor, got ", t.scalar_type());
  }
}

int32_t dtype_code(at::ScalarType t, const char* name) {
  switch (t) {
    case at::kFloat: return kF32;
    case at::kBFloat16: return kBF16;
    case at::kHalf: return kF16;
    default: TORCH_CHECK_VALUE(false, "specdec: ", name, " must be float32, bfloat16 or float16, got ", t);
  }
}

// ---------------------------------------------------------------------------------------------

struct Row {
  float temperature = 1.0f;
  float inv_t = 1.0f;  // 1 / T rounded once to float32 (IEEE division); 1 for greedy rows
  int64_t top_k = 0;
  float top_p = 1.0f;
  int64_t num_draft = 0;
  uint32_t key0 = 0, key1 = 0;
  uint64_t offset = 0;
  bool bad = false;
  bool greedy = false;
  int64_t accepted = 0;
  int64_t winner = -1;
};

// One unit of parallel work: a chunk of a line (statistics, candidates, or the max / argmax /
// validity scan), a chunk of a race (or a whole race over a kept-id list), or the selection of a
// filtered line.
struct Item {
  enum Kind : int8_t { kLineChunk, kRace, kFinishFilter };
  Kind kind;
  int32_t index;  // line or race
  int32_t chunk;
};

using VerifyOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

VerifyOutputs verify_impl(const at::Tensor& target_in, const std::optional<at::Tensor>& draft_opt, const at::Tensor& tokens, const at::Tensor& temperature,
                          const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& num_draft, const std::optional<at::Tensor>& seeds_opt,
                          const std::optional<at::Tensor>& offsets_opt, int64_t base_key, int64_t stream, bool check, int64_t logprobs,
                          bool accept_probs) {
  check_cpu_tensor(target_in, "target_logits");
  TORCH_CHECK_VALUE(target_in.dim() == 3, "specdec: target_logits must be (B, K+1, V), got ", target_in.sizes());
  const int64_t batch = target_in.size(0), length = target_in.size(1), vocab = target_in.size(2);
  TORCH_CHECK_VALUE(length >= 1 && vocab >= 1, "specdec: target_logits needs a position and a vocabulary entry");
  TORCH_CHECK_VALUE(vocab <= (int64_t{1} << 32), "specdec: vocabularies above 2^32 entries are not supported");
  const int64_t num_positions = length - 1;
  check_cpu_tensor(tokens, "draft_tokens");
  TORCH_CHECK_VALUE(tokens.dim() == 2 && tokens.size(0) == batch && tokens.size(1) == num_positions, "specdec: draft_tokens must be (B, K)");
  TORCH_CHECK_VALUE(tokens.scalar_type() == at::kLong || tokens.scalar_type() == at::kInt, "specdec: draft_tokens must be int32 or int64");
  check_row_vector(temperature, "temperature", batch);
  check_row_vector(top_k, "top_k", batch);
  check_row_vector(top_p, "top_p", batch);
  check_row_vector(num_draft, "num_draft_tokens", batch);
  check_keys(seeds_opt, "seeds", batch);
  check_keys(offsets_opt, "offsets", batch);
  TORCH_CHECK_VALUE(stream == philox::kVerifyStream || stream == philox::kSampleStream, "specdec: stream must be 1 (verify) or 2 (sample), got ", stream);
  TORCH_CHECK_VALUE(logprobs >= kLogprobsNone && logprobs <= kLogprobsRaw, "specdec: logprobs must be 0 (none), 1 (processed) or 2 (raw), got ", logprobs);
  const int32_t t_dtype = dtype_code(target_in.scalar_type(), "target_logits");

  // Logits are read in place; only a vocabulary stride other than 1 forces a copy.
  const at::Tensor target = target_in.stride(2) == 1 ? target_in : target_in.contiguous();
  at::Tensor draft;
  const bool has_draft = draft_opt.has_value() && draft_opt->defined();
  int64_t draft_vocab = vocab;
  int32_t d_dtype = kF32;
  if (has_draft) {
    const at::Tensor& d = *draft_opt;
    check_cpu_tensor(d, "draft_logits");
    TORCH_CHECK_VALUE(d.dim() == 3 && d.size(0) == batch && d.size(1) == num_positions && d.size(2) >= 1 && d.size(2) <= vocab,
                      "specdec: draft_logits must be (B, K, Vd) with 1 <= Vd <= V, got ", d.sizes());
    d_dtype = dtype_code(d.scalar_type(), "draft_logits");
    draft = d.stride(2) == 1 ? d : d.contiguous();
    draft_vocab = d.size(2);
  }

  const auto float_options = target.options().dtype(at::kFloat);
  at::Tensor out_tokens = at::full({batch, length}, -1, target.options().dtype(at::kLong));
  at::Tensor out_accepted = at::zeros({batch}, target.options().dtype(at::kLong));
  at::Tensor out_logprobs = logprobs != kLogprobsNone ? at::full({batch, length}, std::numeric_limits<float>::quiet_NaN(), float_options) : at::empty({0}, float_options);
  at::Tensor out_accept = accept_probs ? at::full({batch, num_positions}, std::numeric_limits<float>::quiet_NaN(), float_options) : at::empty({0}, float_options);
  if (batch == 0) return {out_tokens, out_accepted, out_logprobs, out_accept};

  const Kernels& k = kernels();
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

  const bool has_seeds = seeds_opt.has_value() && seeds_opt->defined();
  const bool has_offsets = offsets_opt.has_value() && offsets_opt->defined();

  // Rows: parameters, keys, offsets, and the value checks that do not need the logits.
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
    r.inv_t = r.greedy || r.bad ? 1.0f : 1.0f / r.temperature;
    // Key: seeds[b], else base_key + b (int64 arithmetic, as the reference). A negative seed or
    // offset blanks the row (check=True has raised in Python before this runs).
    const int64_t key = has_seeds ? row_int(*seeds_opt, b) : static_cast<int64_t>(static_cast<uint64_t>(base_key) + static_cast<uint64_t>(b));
    const int64_t offset = has_offsets ? row_int(*offsets_opt, b) : 0;
    r.bad = r.bad || (has_seeds && key < 0) || offset < 0;
    r.key0 = static_cast<uint32_t>(static_cast<uint64_t>(key) & 0xFFFFFFFFu);
    r.key1 = static_cast<uint32_t>((static_cast<uint64_t>(key) >> 32) & 0xFFFFFFFFu);
    r.offset = static_cast<uint64_t>(offset);
    for (int64_t pos = 0; !r.bad && pos < r.num_draft; ++pos) {
      const int64_t x = token_at(b, pos);
      r.bad = x < 0 || x >= draft_vocab;
    }
  }
  auto position_words = [&](const Row& r, int64_t j, uint32_t* lo, uint32_t* hi) {
    const uint64_t p = r.offset + static_cast<uint64_t>(j);
    *lo = static_cast<uint32_t>(p & 0xFFFFFFFFu);
    *hi = static_cast<uint32_t>((p >> 32) & 0xFFFFFFFFu);
  };

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
    line.inv_t = r.inv_t;
    line.top_k = r.top_k;
    line.top_p = r.top_p;
    const bool filtered = !r.greedy && ((r.top_k > 0 && r.top_k < n) || r.top_p < 1.0f);
    line.mode = r.greedy ? (is_draft ? kCheck : kArgmax) : (filtered ? kFilter : kStats);
    // Raw logprobs need the raw normaliser of the emitted (target) lines; greedy rows report the
    // raw log-softmax in both modes.
    line.want_raw = !is_draft && ((r.greedy && logprobs != kLogprobsNone) || (!r.greedy && logprobs == kLogprobsRaw));
    line.first_chunk = num_chunks;
    line.chunks = (n + kChunk - 1) / kChunk;
    num_chunks += line.chunks;
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

  // accept_probs: min(1, p / q) at each position the walk examines (NaN elsewhere).
  float* accept_out = accept_probs ? out_accept.mutable_data_ptr<float>() : nullptr;
  auto record_ratio = [&](int64_t b, int64_t pos, float ratio) {
    if (accept_out != nullptr) accept_out[b * num_positions + pos] = ratio;
  };

  // The work runs in regions (one parallel pass each). The first reads position 0 of every row
  // (and every target line of a greedy row); each later one reads the next position of the rows
  // still accepting, races the rows that just finished and, with `check`, scans the lines no row
  // will reach, only for the validity check (a bad value anywhere a row looks makes the row
  // invalid; the memory-bound scans then share a pass with compute-bound races). The exp work
  // follows the accepted prefix instead of K. Every line is read at most once per pass.
  std::vector<Item> region;
  std::vector<int64_t> region_lines;
  int64_t region_work = 0;
  auto add_chunks = [&](int64_t index) {
    const Line& line = lines[index];
    for (int64_t c = 0; c < line.chunks; ++c) region.push_back({Item::kLineChunk, static_cast<int32_t>(index), static_cast<int32_t>(c)});
    region_work += line.n;
  };
  auto add_line = [&](int64_t index, bool scan_only) {
    Line& line = lines[index];
    line.scan_only = scan_only;
    region_lines.push_back(index);
    // A filtered line with top-k collects its candidates in this pass (the guess needs only a
    // sample); a top-p-only line reads its statistics first (the guess uses its exact maximum).
    if (line.mode == kFilter && !scan_only && !filter_needs_stats_first(line)) prepare_filter_line(line);
    add_chunks(index);
  };
  auto add_race = [&](int64_t b) {
    Row& r = rows[b];
    const int64_t j = r.accepted;
    const Line& t = target_line(b, j);
    const bool rejected = j < r.num_draft;
    RaceArgs a{};
    a.target = t.ptr;
    a.target_dtype = t.dtype;
    a.inv_t = t.inv_t;
    a.p_max = t.m;
    a.p_norm = t.z;
    a.p_tau = t.tau;
    a.draft = nullptr;
    a.draft_dtype = kF32;
    a.draft_vocab = 0;
    a.q_max = 0.0f;
    a.q_norm = 1.0f;
    a.q_tau = -kInf;
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
    a.key0 = r.key0;
    a.key1 = r.key1;
    position_words(r, j, &a.p_lo, &a.p_hi);
    a.stream = static_cast<uint32_t>(stream);
    // Seed the pruning bound with the race value of the target's argmax, a likely winner, so the
    // chunks skip most of a peaked vocabulary from their first block on (results do not change).
    int64_t seed_id = t.argmax;
    if (seed_id < 0 && t.mode == kStats) {
      const int64_t start = t.max_chunk * kChunk;
      ScanResult sr;
      k.scan(t.ptr + start * t_size, t.dtype, std::min(kChunk, vocab - start), true, &sr);
      seed_id = start + sr.argmax;
    }
    if (seed_id >= 0) {
      RaceArgs probe = a;
      probe.shared_best = nullptr;
      RaceBest seed{0.0f, -1};
      k.race_list(&probe, &seed_id, 1, &seed);
      shared_best[b] = fastmath::float_to_bits(seed.value);
    }
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
  auto run_region = [&]() {
    run_items(static_cast<int64_t>(region.size()), region_work, [&](int64_t i) {
      const Item item = region[i];
      if (item.kind == Item::kRace) {
        RaceBest best{0.0f, -1};
        run_race(race_args[item.index], *race_lines[item.index], item.chunk, &best);
        race_best[race_first[item.index] + item.chunk] = best;
      } else if (item.kind == Item::kFinishFilter) {
        finish_filter_line(lines[item.index], k);
      } else {
        Line& line = lines[item.index];
        process_chunk(line, item.chunk, chunk_stats[line.first_chunk + item.chunk], k);
      }
    });
    region.clear();
    region_work = 0;
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
    run_region();
    std::vector<int64_t> filtered;
    for (int64_t index : region_lines) {
      Line& line = lines[index];
      combine_chunks(line, chunk_stats.data() + line.first_chunk, k);
      if (line.mode == kFilter && !line.scan_only && !line.bad) filtered.push_back(index);
    }
    // Filtered lines: a top-p-only line now collects its candidates (a second pass), then every
    // filtered line's selection runs, one item per line.
    for (int64_t index : filtered) {
      Line& line = lines[index];
      if (!line.guess_ready) {
        prepare_filter_line(line);
        add_chunks(index);
      }
    }
    if (!region.empty()) {
      run_region();
      for (int64_t index : filtered) combine_chunks(lines[index], chunk_stats.data() + lines[index].first_chunk, k);
    }
    for (int64_t index : filtered) region.push_back({Item::kFinishFilter, static_cast<int32_t>(index), 0});
    if (!region.empty()) {
      region_work = 0;
      for (int64_t index : filtered) region_work += lines[index].n;
      run_region();
    }
    for (int64_t index : region_lines) lines[index].done = true;
    region_lines.clear();

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
        uint32_t p_lo, p_hi;
        position_words(r, j, &p_lo, &p_hi);
        const float u = philox::to_uniform(philox::word0(0, p_lo, p_hi, philox::kAcceptStream, r.key0, r.key1));
        accepted = u * q < p;
        record_ratio(b, j, q > 0.0f ? std::min(p / q, 1.0f) : (p > 0.0f ? 1.0f : 0.0f));
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
    while (j < r.num_draft && !target_line(b, j).bad) {
      const bool match = clamp_token(token_at(b, j)) == target_line(b, j).argmax;
      record_ratio(b, j, match ? 1.0f : 0.0f);
      if (!match) break;
      ++j;
    }
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
  float* out_lp = logprobs != kLogprobsNone ? out_logprobs.mutable_data_ptr<float>() : nullptr;
  for (int64_t b = 0; b < batch; ++b) {
    const Row& r = rows[b];
    if (r.bad) {
      if (accept_out != nullptr) std::fill(accept_out + b * num_positions, accept_out + (b + 1) * num_positions, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    for (int64_t pos = 0; pos < r.accepted; ++pos) out_t[b * length + pos] = clamp_token(token_at(b, pos));
    out_t[b * length + r.accepted] = r.winner;
    out_a[b] = r.accepted;
    if (out_lp == nullptr) continue;
    for (int64_t pos = 0; pos <= r.accepted; ++pos) {
      const Line& line = target_line(b, pos);
      const int64_t x = out_t[b * length + pos];
      float value;
      if (r.greedy || logprobs == kLogprobsRaw) {
        const float raw = load_one(line.ptr, line.dtype, x);
        value = (raw - line.raw_max) - std::log(line.raw_z);
      } else {
        const float s = scaled_at(line, x);
        value = s >= line.tau ? (s - line.m) - std::log(line.z) : -kInf;
      }
      out_lp[b * length + pos] = value;
    }
  }
  return {out_tokens, out_accepted, out_logprobs, out_accept};
}

VerifyOutputs verify_cpu(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, const at::Tensor& draft_tokens,
                         const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& num_draft_tokens,
                         const std::optional<at::Tensor>& seeds, const std::optional<at::Tensor>& offsets, int64_t base_key, int64_t stream, bool check,
                         int64_t logprobs, bool accept_probs) {
  return verify_impl(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, num_draft_tokens, seeds, offsets, base_key, stream, check,
                     logprobs, accept_probs);
}

// sample = the bonus draw of verify with K = 0, raced on the sample stream.
at::Tensor sample_cpu(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                      const std::optional<at::Tensor>& seeds, const std::optional<at::Tensor>& offsets, int64_t base_key) {
  check_cpu_tensor(logits, "logits");
  TORCH_CHECK_VALUE(logits.dim() == 2, "specdec: logits must be (B, V), got ", logits.sizes());
  const int64_t batch = logits.size(0);
  const at::Tensor no_drafts = at::empty({batch, 0}, logits.options().dtype(at::kLong));
  const at::Tensor zeros = at::zeros({batch}, logits.options().dtype(at::kLong));
  auto result = verify_impl(logits.unsqueeze(1), std::nullopt, no_drafts, temperature, top_k, top_p, zeros, seeds, offsets, base_key,
                            philox::kSampleStream, /*check=*/true, kLogprobsNone, false);
  return std::get<0>(result).select(1, 0).contiguous();
}

// Benchmark hook (bench/bench_cpp.py): nanoseconds per bonus race (r = p, no draft) over a whole
// float32 line, on the calling thread, chunk after chunk as a verify call runs it, seeded with the
// argmax as verify seeds it (seed_argmax); a fresh key each repetition. The line statistics are
// computed once, outside the timing.
double race_ns(const at::Tensor& line, int64_t reps, bool seed_argmax) {
  TORCH_CHECK_VALUE(line.dim() == 1 && line.scalar_type() == at::kFloat && line.device().is_cpu() && line.is_contiguous(),
                    "specdec: race_ns takes a contiguous (V,) float32 CPU tensor");
  TORCH_CHECK_VALUE(reps >= 1, "specdec: reps must be >= 1");
  const Kernels& k = kernels();
  const int64_t vocab = line.size(0);
  StatsResult st;
  k.stats(line.const_data_ptr(), kF32, vocab, 1.0f, false, &st);
  ScanResult sr;
  k.scan(line.const_data_ptr(), kF32, vocab, true, &sr);
  RaceArgs a{};
  a.target = line.const_data_ptr();
  a.target_dtype = kF32;
  a.inv_t = 1.0f;
  a.p_max = st.m;
  a.p_norm = static_cast<float>(st.z);
  a.p_tau = -kInf;
  a.draft = nullptr;
  a.q_norm = 1.0f;
  a.q_tau = -kInf;
  a.one_hot = -1;
  a.residual = false;
  a.p_lo = 7;
  a.p_hi = 0;
  a.stream = philox::kVerifyStream;
  int64_t sink = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t rep = 0; rep < reps; ++rep) {
    uint32_t shared = 0;
    a.key0 = static_cast<uint32_t>(rep);
    a.key1 = 0x5EEDu;
    if (seed_argmax) {
      RaceArgs probe = a;
      probe.shared_best = nullptr;
      RaceBest seed{0.0f, -1};
      k.race_list(&probe, &sr.argmax, 1, &seed);
      shared = fastmath::float_to_bits(seed.value);
    }
    a.shared_best = &shared;
    RaceBest best{0.0f, -1};
    for (int64_t begin = 0; begin < vocab; begin += kChunk) {
      RaceBest part{0.0f, -1};
      k.race(&a, begin, std::min(kChunk, vocab - begin), &part);
      if (part.index >= 0 && part.value > best.value) best = part;
    }
    sink += best.index;
  }
  const auto elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  TORCH_CHECK(sink >= 0, "specdec: race_ns found no winner");
  return static_cast<double>(elapsed) / static_cast<double>(reps);
}

// Test hook: m and z of each line of a (N, V) float32 tensor at one temperature, through the
// chunked statistics verify uses (z as float64, before its float32 rounding).
std::tuple<at::Tensor, at::Tensor> line_stats(const at::Tensor& logits, double temperature) {
  TORCH_CHECK_VALUE(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu() && logits.is_contiguous(),
                    "specdec: line_stats takes a contiguous (N, V) float32 CPU tensor");
  const Kernels& k = kernels();
  const int64_t count = logits.size(0), n = logits.size(1);
  at::Tensor m_out = at::empty({count}, logits.options());
  at::Tensor z_out = at::empty({count}, logits.options().dtype(at::kDouble));
  for (int64_t i = 0; i < count; ++i) {
    Line line;
    line.ptr = static_cast<const char*>(logits.const_data_ptr()) + i * n * 4;
    line.dtype = kF32;
    line.n = n;
    line.mode = kStats;
    line.inv_t = temperature == 1.0 ? 1.0f : 1.0f / static_cast<float>(temperature);
    line.chunks = (n + kChunk - 1) / kChunk;
    std::vector<ChunkStats> chunks(line.chunks);
    for (int64_t c = 0; c < line.chunks; ++c) process_chunk(line, c, chunks[c], k);
    combine_chunks(line, chunks.data(), k);
    // (combine_chunks keeps z as float32 for the kernels; recombine in double for the test)
    double z = 0.0;
    for (const ChunkStats& c : chunks) {
      if (c.m > -kInf && c.z > 0.0) z += c.z * std::exp(static_cast<double>(c.m) - static_cast<double>(line.m));
    }
    m_out[i] = line.m;
    z_out[i] = z;
  }
  return {m_out, z_out};
}

std::string torch_version_at_build() { return SPECDEC_TORCH_VERSION_STRING; }

std::string compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " __VERSION__;
#else
  return "unknown";
#endif
}

}  // namespace
}  // namespace specdec

// The operator schemas (specdec_ext/ops.py holds the same strings) live here so that compiled
// graphs call the C++ kernel without Python; ops.py adds the CUDA (Triton) and fake kernels, and
// specdec_ext._cpp_backend imports it as soon as this extension loads.
TORCH_LIBRARY(specdec, m) {
  m.set_python_module("specdec_ext.ops");
  m.def(
      "verify(Tensor target_logits, Tensor? draft_logits, Tensor draft_tokens, Tensor temperature, Tensor top_k, Tensor top_p, "
      "Tensor num_draft_tokens, Tensor? seeds, Tensor? offsets, int base_key, int stream=1, bool check=True, int logprobs=0, "
      "bool accept_probs=False) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("sample(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor? seeds, Tensor? offsets, int base_key) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("verify", &specdec::verify_cpu);
  m.impl("sample", &specdec::sample_cpu);
}

namespace specdec {
at::Tensor repetition_penalty(const at::Tensor& scores, const at::Tensor& sequences, const at::Tensor& index, const at::Tensor& start,
                              const at::Tensor& end, const std::optional<at::Tensor>& drafts, int64_t first, double penalty);
}

namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specdec_ext C++ CPU kernel";
  // The kernels run without the GIL: other Python threads keep running during a call.
  m.def("verify", &specdec::verify_cpu,
        "Fused verification: (tokens (B, K+1) int64, num_accepted (B,) int64, logprobs (B, K+1) float32 or empty, accept_probs (B, K) float32 or empty)",
        py::arg("target_logits"), py::arg("draft_logits"), py::arg("draft_tokens"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
        py::arg("num_draft_tokens"), py::arg("seeds"), py::arg("offsets"), py::arg("base_key"), py::arg("stream") = 1, py::arg("check") = true,
        py::arg("logprobs") = 0, py::arg("accept_probs") = false, py::call_guard<py::gil_scoped_release>());
  m.def("sample", &specdec::sample_cpu, "One token per row (the bonus draw of verify with K = 0, on the sample stream)", py::arg("logits"),
        py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("seeds"), py::arg("offsets"), py::arg("base_key"),
        py::call_guard<py::gil_scoped_release>());
  m.def("repetition_penalty", &specdec::repetition_penalty,
        "transformers' repetition penalty at every position of a (b, P, V) float32 block: position j of row b has seen "
        "sequences[index[b], start[b]:end[b]] and drafts[b, :first + j]",
        py::arg("scores"), py::arg("sequences"), py::arg("index"), py::arg("start"), py::arg("end"), py::arg("drafts"), py::arg("first"),
        py::arg("penalty"));
  m.def("isa", &specdec::isa, "The instruction-set variant in use");
  m.def("set_isa", &specdec::set_isa, "Pin a variant ('auto', 'avx512', 'avx2', 'neon', 'base'); False if this CPU lacks it");
  m.def("scheduler", &specdec::scheduler, "How work is spread over threads: 'auto' (default), 'openmp' or 'pool'");
  m.def("set_scheduler", &specdec::set_scheduler, "Choose 'auto', 'openmp' or 'pool'; False for an unknown name");
  m.def("openmp_linked", &specdec::openmp_linked, "Whether the extension runs on torch's OpenMP runtime (else 'openmp' uses the pool)");
  m.def("torch_version_at_build", &specdec::torch_version_at_build, "The torch version this extension was compiled against");
  m.def("compiler", &specdec::compiler, "The compiler that built this extension");
  m.def("race_ns", &specdec::race_ns, "Benchmark hook: ns per bonus race over a (V,) float32 line on one thread", py::arg("line"), py::arg("reps"),
        py::arg("seed_argmax") = true, py::call_guard<py::gil_scoped_release>());
  m.def("line_stats", &specdec::line_stats, "Test hook: (m, z as float64) of each line of (N, V) float32 logits, through verify's chunked statistics",
        py::arg("logits"), py::arg("temperature") = 1.0);
  m.def("scheduler_selftest", &specdec::scheduler_selftest, "Test hook: run items that throw on the caller or a helper thread", py::arg("scheduler"),
        py::arg("count"), py::arg("item_us"), py::arg("throw_on"), py::call_guard<py::gil_scoped_release>());
  m.def("scheduler_selftest_started", &specdec::scheduler_selftest_started, "Test hook: items of scheduler_selftest started so far");
}
