// Tree verification and block verification on the CPU: the semantics of
// specdec_ext/reference_tree.py without (B, N+1, V) temporaries. Logits are read in place in their
// own dtype; a line's statistics (max m, top-k / top-p threshold tau, normaliser z) are computed
// when a row's walk first reaches it, and a residual is never stored: it is the closed form
// w(y) = max(p(y) - c q(y), 0) [y not in S] of a few scalars, re-evaluated on each pass over the
// vocabulary (its mass after a rejection, and the final exponential race, one per row).
//
// Passes over a vocabulary are cut into fixed chunks combined in chunk order, so results never
// depend on the thread count. Rows run in parallel; a batch smaller than the thread count spreads
// each row's passes over the threads instead.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace specdec_tree {
namespace {

constexpr int64_t kChunk = 8192;  // vocabulary entries per work item: fixed for determinism
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 (as triton.language.philox): all four output words.

struct Words {
  uint32_t w[4];
};

inline Words philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint64_t key) {
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t prod_b = static_cast<uint64_t>(c2) * 0xCD9E8D57u;
    const uint64_t prod_a = static_cast<uint64_t>(c0) * 0xD2511F53u;
    const uint32_t next0 = static_cast<uint32_t>(prod_b >> 32) ^ c1 ^ k0;
    const uint32_t next2 = static_cast<uint32_t>(prod_a >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(prod_b);
    c3 = static_cast<uint32_t>(prod_a);
    c0 = next0;
    c2 = next2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

inline float open_uniform(uint32_t x) { return (static_cast<float>(x >> 9) + 0.5f) * 1.1920928955078125e-07f; }

// Acceptance coin of sibling rank r at absolute position P: counter (r, P_lo, P_hi, 0), word 0.
inline float coin(uint64_t key, int64_t position, int64_t rank) {
  const uint64_t p = static_cast<uint64_t>(position);
  return open_uniform(philox(static_cast<uint32_t>(rank), static_cast<uint32_t>(p), static_cast<uint32_t>(p >> 32), 0, key).w[0]);
}

// ---------------------------------------------------------------------------------------------
// Lines.

enum DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

int dtype_code(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return kF32;
    case at::kBFloat16: return kBF16;
    case at::kHalf: return kF16;
    default: TORCH_CHECK(false, "specdec: logits must be float32, bfloat16 or float16, got ", t.scalar_type());
  }
}

struct LineRef {
  const char* ptr = nullptr;
  int dtype = kF32;
  int64_t n = 0;

  float at(int64_t i) const {
    if (dtype == kF32) return reinterpret_cast<const float*>(ptr)[i];
    if (dtype == kBF16) return static_cast<float>(reinterpret_cast<const at::BFloat16*>(ptr)[i]);
    return static_cast<float>(reinterpret_cast<const at::Half*>(ptr)[i]);
  }
};

// Processing parameters of one row.
struct Params {
  float inv_t = 1.0f;  // float32(1 / T), 1 for greedy rows
  bool greedy = false;
  int64_t top_k = 0;
  float top_p = 1.0f;
};

struct Stats {
  bool bad = false;
  float raw_max = -kInf;
  int64_t argmax = 0;  // first index of the raw maximum
  float m = 0.0f, tau = -kInf, z = 1.0f;
};

// Runs fn(chunk_index, begin, end) over [0, n) in fixed chunks, in parallel when `parallel`.
template <typename Fn>
void for_chunks(int64_t n, bool parallel, const Fn& fn) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (parallel && chunks > 1) {
    at::parallel_for(0, chunks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) fn(c, c * kChunk, std::min(n, (c + 1) * kChunk));
    });
  } else {
    for (int64_t c = 0; c < chunks; ++c) fn(c, c * kChunk, std::min(n, (c + 1) * kChunk));
  }
}

// The kept-set threshold of transformers' top-k then top-p (reference.filter_thresholds): the
// values sorted in descending order, tau_k the k-th, and tau_p the value at the last place whose
// mass strictly before it (a cumulative sum accumulated in double) is below top_p times the mass of
// the top-k set.
float filter_threshold(const LineRef& line, const Params& params, std::vector<float>& scratch) {
  const int64_t n = line.n;
  const bool use_k = params.top_k > 0 && params.top_k < n;
  const bool use_p = params.top_p < 1.0f;
  if (!use_k && !use_p) return -kInf;
  scratch.resize(n);
  for (int64_t i = 0; i < n; ++i) scratch[i] = line.at(i) * params.inv_t;
  std::sort(scratch.begin(), scratch.end(), [](float a, float b) { return a > b; });
  const float tau_k = use_k ? scratch[params.top_k - 1] : -kInf;
  if (!use_p) return tau_k;
  const float top = scratch[0];
  double total = 0.0;
  for (int64_t i = 0; i < n && scratch[i] >= tau_k; ++i) total += static_cast<double>(std::exp(scratch[i] - top));
  const float budget = params.top_p * static_cast<float>(total);
  int64_t keep = 0;
  double cumulative = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float w = scratch[i] >= tau_k ? std::exp(scratch[i] - top) : 0.0f;
    cumulative += static_cast<double>(w);
    const float before = i == 0 ? 0.0f : static_cast<float>(cumulative) - w;
    keep += before < budget;  // a count, as the reference counts (masses before are nondecreasing up to rounding)
  }
  keep = std::max<int64_t>(keep, 1);
  return std::max(tau_k, scratch[keep - 1]);
}

// Validity scan and statistics of one line. Bad (as _params.row_problems): NaN or +inf anywhere,
// every value -inf, or, for a sampled row, a finite raw maximum whose scaled value is not finite.
Stats line_stats(const LineRef& line, const Params& params, bool parallel, std::vector<float>& scratch) {
  Stats s;
  const int64_t chunks = (line.n + kChunk - 1) / kChunk;
  std::vector<float> chunk_max(chunks, -kInf);
  std::vector<int64_t> chunk_arg(chunks, 0);
  std::vector<char> chunk_nan(chunks, 0);
  for_chunks(line.n, parallel, [&](int64_t c, int64_t begin, int64_t end) {
    float best = -kInf;
    int64_t arg = begin;
    bool nan = false;
    for (int64_t i = begin; i < end; ++i) {
      const float v = line.at(i);
      nan |= std::isnan(v);
      if (v > best) {
        best = v;
        arg = i;
      }
    }
    chunk_max[c] = best;
    chunk_arg[c] = arg;
    chunk_nan[c] = nan;
  });
  bool nan = false;
  for (int64_t c = 0; c < chunks; ++c) {
    nan |= chunk_nan[c] != 0;
    if (chunk_max[c] > s.raw_max) {
      s.raw_max = chunk_max[c];
      s.argmax = chunk_arg[c];
    }
  }
  if (nan || s.raw_max == kInf || s.raw_max == -kInf) {
    s.bad = true;
    return s;
  }
  if (params.greedy) return s;
  s.m = s.raw_max * params.inv_t;
  if (!std::isfinite(s.m)) {
    s.bad = true;
    return s;
  }
  s.tau = filter_threshold(line, params, scratch);
  std::vector<double> partial(chunks, 0.0);
  for_chunks(line.n, parallel, [&](int64_t c, int64_t begin, int64_t end) {
    double sum = 0.0;
    for (int64_t i = begin; i < end; ++i) {
      const float v = line.at(i) * params.inv_t;
      if (v >= s.tau) sum += static_cast<double>(std::exp(v - s.m));
    }
    partial[c] = sum;
  });
  double z = 0.0;
  for (double v : partial) z += v;
  s.z = static_cast<float>(z);
  return s;
}

inline float prob_at(const LineRef& line, const Params& params, const Stats& s, int64_t x) {
  const float v = line.at(x) * params.inv_t;
  return v >= s.tau ? std::exp(v - s.m) / s.z : 0.0f;
}

// The residual of one context: w(y) = max(p(y) - c q(y), 0), zero on the removed ids.
struct Residual {
  const LineRef* target;
  const Stats* p_stats;
  const LineRef* draft;  // null: deterministic siblings (q is not part of w)
  const Stats* q_stats;
  const Params* params;
  float scale = 0.0f;
  const std::vector<int64_t>* removed = nullptr;

  inline float q(int64_t y) const {
    if (draft == nullptr || y >= draft->n) return 0.0f;
    return prob_at(*draft, *params, *q_stats, y);
  }

  inline float weight(int64_t y) const {
    const float p = prob_at(*target, *params, *p_stats, y);
    float w = draft == nullptr ? p : std::max(p - scale * q(y), 0.0f);
    if (removed != nullptr && std::find(removed->begin(), removed->end(), y) != removed->end()) w = 0.0f;
    return w;
  }
};

// sum_y w(y), chunked in a fixed order.
float residual_mass(const Residual& r, int64_t vocab, bool parallel) {
  const int64_t chunks = (vocab + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
  for_chunks(vocab, parallel, [&](int64_t c, int64_t begin, int64_t end) {
    double sum = 0.0;
    for (int64_t y = begin; y < end; ++y) sum += static_cast<double>(r.weight(y));
    partial[c] = sum;
  });
  double total = 0.0;
  for (double v : partial) total += v;
  return static_cast<float>(total);
}

// sum of q over the ids not removed (the draft mass siblings drawn without replacement came from).
float remaining_draft_mass(const Residual& r, int64_t draft_vocab, bool parallel) {
  const int64_t chunks = (draft_vocab + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
  for_chunks(draft_vocab, parallel, [&](int64_t c, int64_t begin, int64_t end) {
    double sum = 0.0;
    for (int64_t y = begin; y < end; ++y) {
      if (std::find(r.removed->begin(), r.removed->end(), y) == r.removed->end()) sum += static_cast<double>(r.q(y));
    }
    partial[c] = sum;
  });
  double total = 0.0;
  for (double v : partial) total += v;
  return static_cast<float>(total);
}

// The exponential race argmax_y w(y) / E_y at absolute position P (stream 1); when no w(y) is
// positive, argmax_y p(y) / E_y. Ties go to the lowest id.
int64_t race(const Residual& r, int64_t vocab, uint64_t key, int64_t position, bool parallel) {
  const int64_t chunks = (vocab + kChunk - 1) / kChunk;
  std::vector<float> best(chunks, 0.0f), best_p(chunks, -1.0f);
  std::vector<int64_t> arg(chunks, -1), arg_p(chunks, -1);
  const uint64_t pos = static_cast<uint64_t>(position);
  const uint32_t p_lo = static_cast<uint32_t>(pos), p_hi = static_cast<uint32_t>(pos >> 32);
  for_chunks(vocab, parallel, [&](int64_t c, int64_t begin, int64_t end) {
    float top = 0.0f, top_p = -1.0f;
    int64_t at = -1, at_p = -1;
    Words words{};
    for (int64_t y = begin; y < end; ++y) {
      if (y == begin || (y & 3) == 0) words = philox(static_cast<uint32_t>(y >> 2), p_lo, p_hi, 1, key);
      const float e = -std::log(open_uniform(words.w[y & 3]));
      const float value = r.weight(y) / e;
      if (value > top) {
        top = value;
        at = y;
      }
      const float by_p = prob_at(*r.target, *r.params, *r.p_stats, y) / e;
      if (by_p > top_p) {
        top_p = by_p;
        at_p = y;
      }
    }
    best[c] = top;
    arg[c] = at;
    best_p[c] = top_p;
    arg_p[c] = at_p;
  });
  float top = 0.0f, top_p = -1.0f;
  int64_t at = -1, at_p = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    if (best[c] > top) {
      top = best[c];
      at = arg[c];
    }
    if (best_p[c] > top_p) {
      top_p = best_p[c];
      at_p = arg_p[c];
    }
  }
  return at >= 0 ? at : at_p;
}

Params row_params(float temperature, int64_t top_k, float top_p) {
  Params p;
  p.greedy = temperature == 0.0f;
  p.inv_t = p.greedy ? 1.0f : 1.0f / temperature;
  p.top_k = p.greedy ? 0 : top_k;
  p.top_p = p.greedy ? 1.0f : top_p;
  return p;
}

bool bad_params(float temperature, int64_t top_k, float top_p, int64_t key, int64_t offset) {
  return !(temperature >= 0.0f) || std::isinf(temperature) || top_k < 0 || !(top_p > 0.0f && top_p <= 1.0f) || key < 0 || offset < 0;
}

// ---------------------------------------------------------------------------------------------
// Tree verification.

struct TreeRow {
  bool bad_shape = false;
  std::vector<int64_t> depth;                  // of each used node (1 = child of the root)
  std::vector<std::vector<int64_t>> children;  // per context, in node order
};

TreeRow tree_row(const int64_t* parents, int64_t nodes, int64_t used) {
  TreeRow row;
  if (used < 0 || used > nodes) {
    row.bad_shape = true;
    return row;
  }
  for (int64_t i = 0; i < used; ++i) {
    if (parents[i] < -1 || parents[i] >= i) {
      row.bad_shape = true;
      return row;
    }
  }
  row.depth.resize(used);
  row.children.assign(used + 1, {});
  for (int64_t i = 0; i < used; ++i) {
    row.depth[i] = parents[i] < 0 ? 1 : row.depth[parents[i]] + 1;
    row.children[parents[i] + 1].push_back(i);
  }
  return row;
}

struct TreeInputs {
  const char* target;
  int target_dtype;
  int64_t target_row_stride, target_line_stride;  // in elements
  const char* draft;
  int draft_dtype;
  int64_t draft_row_stride, draft_line_stride;
  int64_t vocab, draft_vocab, nodes;
  const int64_t* tokens;
  const int64_t* parents;
  const float* temperature;
  const int64_t* top_k;
  const float* top_p;
  const int64_t* num_nodes;
  const int64_t* keys;
  const int64_t* offsets;
  bool without_replacement;
  bool check;
};

LineRef target_line(const TreeInputs& in, int64_t b, int64_t context) {
  const int64_t size = in.target_dtype == kF32 ? 4 : 2;
  return {in.target + size * (b * in.target_row_stride + context * in.target_line_stride), in.target_dtype, in.vocab};
}

LineRef draft_line(const TreeInputs& in, int64_t b, int64_t context) {
  const int64_t size = in.draft_dtype == kF32 ? 4 : 2;
  return {in.draft + size * (b * in.draft_row_stride + context * in.draft_line_stride), in.draft_dtype, in.draft_vocab};
}

struct TreeOut {
  std::vector<int64_t> path;  // nodes entered
  int64_t token = -1;         // the final token
  bool bad = false;
};

TreeOut walk_tree(const TreeInputs& in, int64_t b, const TreeRow& shape, bool parallel) {
  TreeOut out;
  const int64_t nodes = in.nodes;
  const int64_t used = in.num_nodes[b];
  const int64_t* tokens = in.tokens + b * nodes;
  const Params params = row_params(in.temperature[b], in.top_k[b], in.top_p[b]);
  const bool deterministic = in.draft == nullptr;
  const bool wor = in.without_replacement && !deterministic;
  const uint64_t key = static_cast<uint64_t>(in.keys[b]);
  const int64_t offset = in.offsets[b];
  std::vector<float> scratch;
  if (bad_params(in.temperature[b], in.top_k[b], in.top_p[b], in.keys[b], offset)) {
    out.bad = true;
    return out;
  }
  for (int64_t i = 0; i < used; ++i) {
    if (tokens[i] < 0 || tokens[i] >= in.draft_vocab) {
      out.bad = true;
      return out;
    }
  }
  if (in.check) {  // every line a row could use: the target line of each context, the draft line of each context with children
    for (int64_t c = 0; c <= used && !out.bad; ++c) {
      out.bad |= line_stats(target_line(in, b, c), params, parallel, scratch).bad;
      if (!deterministic && !shape.children[c].empty()) out.bad |= line_stats(draft_line(in, b, c), params, parallel, scratch).bad;
    }
    if (out.bad) return out;
  }
  int64_t context = 0, depth = 0;
  while (true) {
    const LineRef p_line = target_line(in, b, context);
    const Stats p_stats = line_stats(p_line, params, parallel, scratch);
    if (p_stats.bad) {
      out.bad = true;
      return out;
    }
    const std::vector<int64_t>& children = shape.children[context];
    LineRef q_line;
    Stats q_stats;
    if (!deterministic && !children.empty() && !params.greedy) {
      q_line = draft_line(in, b, context);
      q_stats = line_stats(q_line, params, parallel, scratch);
      if (q_stats.bad) {
        out.bad = true;
        return out;
      }
    }
    std::vector<int64_t> removed;
    Residual r{&p_line, &p_stats, deterministic ? nullptr : &q_line, &q_stats, &params, 0.0f, (deterministic || wor) ? &removed : nullptr};
    float mass = 1.0f, draft_mass = 1.0f;
    int64_t entered = -1;
    for (size_t rank = 0; rank < children.size(); ++rank) {
      const int64_t child = children[rank];
      const int64_t x = tokens[child];
      if (params.greedy) {
        if (x == p_stats.argmax) {
          entered = child;
          break;
        }
        continue;
      }
      const bool x_removed = std::find(removed.begin(), removed.end(), x) != removed.end();
      const float p_x = prob_at(p_line, params, p_stats, x);
      const float q_x = deterministic ? 0.0f : prob_at(q_line, params, q_stats, x);
      float w_x = deterministic ? p_x : std::max(p_x - r.scale * q_x, 0.0f);
      if (r.removed != nullptr && x_removed) w_x = 0.0f;
      const float proposal = deterministic ? 1.0f : (wor && x_removed ? 0.0f : q_x);
      const float u = coin(key, offset + depth, static_cast<int64_t>(rank));
      if (u * proposal * mass < w_x * draft_mass) {
        entered = child;
        break;
      }
      // Rejected: the next residual, unless it would be zero everywhere.
      const float old_scale = r.scale;
      if (!deterministic) r.scale = old_scale + mass / draft_mass;
      if (r.removed != nullptr) removed.push_back(x);
      const float new_mass = residual_mass(r, in.vocab, parallel);
      float new_draft_mass = draft_mass;
      if (wor) new_draft_mass = remaining_draft_mass(r, in.draft_vocab, parallel);
      if (new_mass > 0.0f) {
        mass = new_mass;
        draft_mass = new_draft_mass;
      } else {
        r.scale = old_scale;
        if (r.removed != nullptr) removed.pop_back();
      }
    }
    if (entered < 0) {
      out.token = params.greedy ? p_stats.argmax : race(r, in.vocab, key, offset + depth, parallel);
      return out;
    }
    out.path.push_back(entered);
    context = entered + 1;
    depth += 1;
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_verify(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits,
                                                           const at::Tensor& draft_tokens, const at::Tensor& parents,
                                                           const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                                                           const at::Tensor& num_nodes, const at::Tensor& keys, const at::Tensor& offsets,
                                                           bool without_replacement, bool check) {
  TORCH_CHECK(target_logits.dim() == 3 && target_logits.stride(2) == 1, "specdec: target_logits must be (B, N+1, V) with unit vocabulary stride");
  const int64_t batch = target_logits.size(0), nodes = target_logits.size(1) - 1;
  const at::Tensor tokens = draft_tokens.to(at::kLong).contiguous();
  const at::Tensor parent = parents.to(at::kLong).contiguous();
  const at::Tensor t = temperature.to(at::kFloat).contiguous(), k = top_k.to(at::kLong).contiguous(), p = top_p.to(at::kFloat).contiguous();
  const at::Tensor n = num_nodes.to(at::kLong).contiguous(), key = keys.to(at::kLong).contiguous(), off = offsets.to(at::kLong).contiguous();
  TreeInputs in{};
  in.target = static_cast<const char*>(target_logits.const_data_ptr());
  in.target_dtype = dtype_code(target_logits);
  in.target_row_stride = target_logits.stride(0);
  in.target_line_stride = target_logits.stride(1);
  at::Tensor draft;
  if (draft_logits.has_value()) {
    draft = *draft_logits;
    TORCH_CHECK(draft.dim() == 3 && draft.stride(2) == 1, "specdec: draft_logits must be (B, N+1, Vd) with unit vocabulary stride");
    in.draft = static_cast<const char*>(draft.const_data_ptr());
    in.draft_dtype = dtype_code(draft);
    in.draft_row_stride = draft.stride(0);
    in.draft_line_stride = draft.stride(1);
    in.draft_vocab = draft.size(2);
  } else {
    in.draft = nullptr;
    in.draft_vocab = target_logits.size(2);
  }
  in.vocab = target_logits.size(2);
  in.nodes = nodes;
  in.tokens = tokens.const_data_ptr<int64_t>();
  in.parents = parent.const_data_ptr<int64_t>();
  in.temperature = t.const_data_ptr<float>();
  in.top_k = k.const_data_ptr<int64_t>();
  in.top_p = p.const_data_ptr<float>();
  in.num_nodes = n.const_data_ptr<int64_t>();
  in.keys = key.const_data_ptr<int64_t>();
  in.offsets = off.const_data_ptr<int64_t>();
  in.without_replacement = without_replacement;
  in.check = check;

  std::vector<TreeRow> shapes(batch);
  int64_t max_depth = 0;
  for (int64_t b = 0; b < batch; ++b) {
    shapes[b] = tree_row(in.parents + b * nodes, nodes, in.num_nodes[b]);
    for (int64_t d : shapes[b].depth) max_depth = std::max(max_depth, d);
  }
  std::vector<TreeOut> outs(batch);
  const bool rows_parallel = batch >= at::get_num_threads();
  auto run_row = [&](int64_t b, bool inner_parallel) {
    if (shapes[b].bad_shape) {
      outs[b].bad = true;
      return;
    }
    outs[b] = walk_tree(in, b, shapes[b], inner_parallel);
  };
  if (rows_parallel) {
    at::parallel_for(0, batch, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) run_row(b, false);
    });
  } else {
    for (int64_t b = 0; b < batch; ++b) run_row(b, true);
  }
  at::Tensor out_tokens = at::full({batch, max_depth + 1}, -1, at::kLong);
  at::Tensor out_accepted = at::zeros({batch}, at::kLong);
  at::Tensor out_nodes = at::full({batch, max_depth}, -1, at::kLong);
  int64_t* tok = out_tokens.data_ptr<int64_t>();
  int64_t* acc = out_accepted.data_ptr<int64_t>();
  int64_t* path = out_nodes.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    if (outs[b].bad) continue;
    const std::vector<int64_t>& nodes_entered = outs[b].path;
    for (size_t d = 0; d < nodes_entered.size(); ++d) {
      path[b * max_depth + d] = nodes_entered[d];
      tok[b * (max_depth + 1) + d] = in.tokens[b * nodes + nodes_entered[d]];
    }
    tok[b * (max_depth + 1) + nodes_entered.size()] = outs[b].token;
    acc[b] = static_cast<int64_t>(nodes_entered.size());
  }
  return {out_tokens, out_accepted, out_nodes};
}

// ---------------------------------------------------------------------------------------------
// Block verification of chains.

struct BlockOut {
  int64_t tau = 0;
  int64_t token = -1;
  bool bad = false;
  std::vector<float> logprobs;
};

float raw_log_softmax(const LineRef& line, int64_t x, bool parallel) {
  float top = -kInf;
  for (int64_t i = 0; i < line.n; ++i) top = std::max(top, line.at(i));
  const int64_t chunks = (line.n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
  for_chunks(line.n, parallel, [&](int64_t c, int64_t begin, int64_t end) {
    double sum = 0.0;
    for (int64_t i = begin; i < end; ++i) sum += static_cast<double>(std::exp(line.at(i) - top));
    partial[c] = sum;
  });
  double z = 0.0;
  for (double v : partial) z += v;
  return (line.at(x) - top) - std::log(static_cast<float>(z));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> block_verify(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits,
                                                            const at::Tensor& draft_tokens, const at::Tensor& temperature, const at::Tensor& top_k,
                                                            const at::Tensor& top_p, const at::Tensor& num_draft, const at::Tensor& keys,
                                                            const at::Tensor& offsets, bool check, int64_t logprobs) {
  TORCH_CHECK(target_logits.dim() == 3 && target_logits.stride(2) == 1, "specdec: target_logits must be (B, K+1, V) with unit vocabulary stride");
  const int64_t batch = target_logits.size(0), positions = target_logits.size(1) - 1, vocab = target_logits.size(2);
  const at::Tensor tokens = draft_tokens.to(at::kLong).contiguous();
  const at::Tensor t = temperature.to(at::kFloat).contiguous(), k = top_k.to(at::kLong).contiguous(), p = top_p.to(at::kFloat).contiguous();
  const at::Tensor n_t = num_draft.to(at::kLong).contiguous(), key_t = keys.to(at::kLong).contiguous(), off_t = offsets.to(at::kLong).contiguous();
  const int target_dtype = dtype_code(target_logits);
  const char* target = static_cast<const char*>(target_logits.const_data_ptr());
  const int64_t t_size = target_dtype == kF32 ? 4 : 2;
  at::Tensor draft;
  const char* draft_ptr = nullptr;
  int draft_dtype = kF32;
  int64_t draft_vocab = vocab, d_size = 4;
  if (draft_logits.has_value() && positions > 0) {
    draft = *draft_logits;
    TORCH_CHECK(draft.dim() == 3 && draft.stride(2) == 1, "specdec: draft_logits must be (B, K, Vd) with unit vocabulary stride");
    draft_ptr = static_cast<const char*>(draft.const_data_ptr());
    draft_dtype = dtype_code(draft);
    draft_vocab = draft.size(2);
    d_size = draft_dtype == kF32 ? 4 : 2;
  }
  const int64_t* tok = tokens.const_data_ptr<int64_t>();
  auto tline = [&](int64_t b, int64_t i) {
    return LineRef{target + t_size * (b * target_logits.stride(0) + i * target_logits.stride(1)), target_dtype, vocab};
  };
  auto dline = [&](int64_t b, int64_t i) { return LineRef{draft_ptr + d_size * (b * draft.stride(0) + i * draft.stride(1)), draft_dtype, draft_vocab}; };

  std::vector<BlockOut> outs(batch);
  auto run_row = [&](int64_t b, bool parallel) {
    BlockOut& out = outs[b];
    const float temp = t.const_data_ptr<float>()[b];
    const int64_t kk = k.const_data_ptr<int64_t>()[b];
    const float pp = p.const_data_ptr<float>()[b];
    const int64_t key = key_t.const_data_ptr<int64_t>()[b], offset = off_t.const_data_ptr<int64_t>()[b];
    const int64_t n = n_t.const_data_ptr<int64_t>()[b];
    if (bad_params(temp, kk, pp, key, offset) || n < 0 || n > positions) {
      out.bad = true;
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      if (tok[b * positions + i] < 0 || tok[b * positions + i] >= draft_vocab) {
        out.bad = true;
        return;
      }
    }
    const Params params = row_params(temp, kk, pp);
    std::vector<float> scratch;
    std::vector<Stats> ps(n + 1), qs(n);
    // Greedy rows verify token by token and read target lines up to their first mismatch
    // (check=False); sampled rows read every line up to n.
    if (check) {
      for (int64_t i = 0; i <= n; ++i) {
        ps[i] = line_stats(tline(b, i), params, parallel, scratch);
        if (ps[i].bad) out.bad = true;
        if (i < n && draft_ptr != nullptr) {
          if (line_stats(dline(b, i), params, parallel, scratch).bad) out.bad = true;
        }
      }
      if (out.bad) return;
    }
    if (params.greedy) {
      int64_t j = 0;
      while (true) {
        if (!check) ps[j] = line_stats(tline(b, j), params, parallel, scratch);
        if (ps[j].bad) {
          out.bad = true;
          return;
        }
        if (j == n || tok[b * positions + j] != ps[j].argmax) break;
        ++j;
      }
      out.tau = j;
      out.token = ps[j].argmax;
    } else {
      for (int64_t i = 0; i <= n; ++i) {
        if (!check) ps[i] = line_stats(tline(b, i), params, parallel, scratch);
        if (ps[i].bad) {
          out.bad = true;
          return;
        }
        if (i < n && draft_ptr != nullptr) {
          qs[i] = line_stats(dline(b, i), params, parallel, scratch);
          if (qs[i].bad) {
            out.bad = true;
            return;
          }
        }
      }
      // p_i = min(1, p_{i-1} p(x_i) / q(x_i)), p_0 = 1.
      std::vector<float> carried(n + 1, 1.0f);
      for (int64_t i = 1; i <= n; ++i) {
        const int64_t x = tok[b * positions + i - 1];
        const float p_x = prob_at(tline(b, i - 1), params, ps[i - 1], x);
        const float q_x = draft_ptr != nullptr ? prob_at(dline(b, i - 1), params, qs[i - 1], x) : 1.0f;
        const float joint = carried[i - 1] * p_x;
        const float ratio = q_x > 0.0f ? joint / q_x : (joint > 0.0f ? 1.0f : 0.0f);
        carried[i] = std::min(ratio, 1.0f);
      }
      // The last i whose coin passes: eta_i * (S_i + (1 - p_i)) < S_i inside, eta_n < p_n at the end.
      int64_t tau = 0;
      for (int64_t i = n; i >= 1 && tau == 0; --i) {
        const float eta = coin(static_cast<uint64_t>(key), offset + i - 1, 0);
        if (i == n) {
          if (eta < carried[i]) tau = i;
          continue;
        }
        const LineRef big_p = tline(b, i);
        const LineRef big_q = draft_ptr != nullptr ? dline(b, i) : LineRef{};
        const int64_t next = tok[b * positions + i];
        const float weight = carried[i];
        const int64_t chunks = (vocab + kChunk - 1) / kChunk;
        std::vector<double> partial(chunks, 0.0);
        for_chunks(vocab, parallel, [&](int64_t c, int64_t begin, int64_t end) {
          double sum = 0.0;
          for (int64_t y = begin; y < end; ++y) {
            const float q = draft_ptr != nullptr ? (y < draft_vocab ? prob_at(big_q, params, qs[i], y) : 0.0f) : (y == next ? 1.0f : 0.0f);
            sum += static_cast<double>(std::max(weight * prob_at(big_p, params, ps[i], y) - q, 0.0f));
          }
          partial[c] = sum;
        });
        double total = 0.0;
        for (double v : partial) total += v;
        const float inner = static_cast<float>(total);
        if (eta * (inner + (1.0f - weight)) < inner) tau = i;
      }
      out.tau = tau;
      // The final draw at tau: the block residual max(p_tau P - Q, 0), or P at tau = n.
      const LineRef p_line = tline(b, tau);
      LineRef q_line = draft_ptr != nullptr && tau < n ? dline(b, tau) : LineRef{};
      struct BlockResidual {
        const LineRef* p_line;
        const Stats* p_stats;
        const LineRef* q_line;
        const Stats* q_stats;
        const Params* params;
        float weight;
        int64_t one_hot;  // >= 0: Q is the point mass there
        bool residual;
        int64_t draft_vocab;
      } br{&p_line, &ps[tau], &q_line, tau < n && draft_ptr != nullptr ? &qs[tau] : nullptr, &params, carried[tau],
           draft_ptr == nullptr && tau < n ? tok[b * positions + tau] : -1, tau < n, draft_vocab};
      const uint64_t pos = static_cast<uint64_t>(offset + tau);
      const uint32_t p_lo = static_cast<uint32_t>(pos), p_hi = static_cast<uint32_t>(pos >> 32);
      const int64_t chunks = (vocab + kChunk - 1) / kChunk;
      std::vector<float> best(chunks, 0.0f), best_p(chunks, -1.0f);
      std::vector<int64_t> arg(chunks, -1), arg_p(chunks, -1);
      for_chunks(vocab, parallel, [&](int64_t c, int64_t begin, int64_t end) {
        float top = 0.0f, top_p = -1.0f;
        int64_t at = -1, at_p = -1;
        Words words{};
        for (int64_t y = begin; y < end; ++y) {
          if (y == begin || (y & 3) == 0) words = philox(static_cast<uint32_t>(y >> 2), p_lo, p_hi, 1, static_cast<uint64_t>(key));
          const float e = -std::log(open_uniform(words.w[y & 3]));
          const float py = prob_at(*br.p_line, *br.params, *br.p_stats, y);
          float w = py;
          if (br.residual) {
            float q = 0.0f;
            if (br.one_hot >= 0) {
              q = y == br.one_hot ? 1.0f : 0.0f;
            } else if (br.q_stats != nullptr && y < br.draft_vocab) {
              q = prob_at(*br.q_line, *br.params, *br.q_stats, y);
            }
            w = std::max(br.weight * py - q, 0.0f);
          }
          const float value = w / e;
          if (value > top) {
            top = value;
            at = y;
          }
          const float by_p = py / e;
          if (by_p > top_p) {
            top_p = by_p;
            at_p = y;
          }
        }
        best[c] = top;
        arg[c] = at;
        best_p[c] = top_p;
        arg_p[c] = at_p;
      });
      float top = 0.0f, top_p = -1.0f;
      int64_t at = -1, at_p = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        if (best[c] > top) {
          top = best[c];
          at = arg[c];
        }
        if (best_p[c] > top_p) {
          top_p = best_p[c];
          at_p = arg_p[c];
        }
      }
      out.token = at >= 0 ? at : at_p;
    }
    if (logprobs != 0) {
      out.logprobs.assign(out.tau + 1, 0.0f);
      for (int64_t i = 0; i <= out.tau; ++i) {
        const int64_t x = i < out.tau ? tok[b * positions + i] : out.token;
        const LineRef line = tline(b, i);
        if (logprobs == 2 || params.greedy) {
          out.logprobs[i] = raw_log_softmax(line, x, parallel);
        } else {
          const float s = line.at(x) * params.inv_t;
          out.logprobs[i] = s >= ps[i].tau ? (s - ps[i].m) - std::log(ps[i].z) : -kInf;
        }
      }
    }
  };
  if (batch >= at::get_num_threads()) {
    at::parallel_for(0, batch, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) run_row(b, false);
    });
  } else {
    for (int64_t b = 0; b < batch; ++b) run_row(b, true);
  }
  at::Tensor out_tokens = at::full({batch, positions + 1}, -1, at::kLong);
  at::Tensor out_accepted = at::zeros({batch}, at::kLong);
  at::Tensor out_logprobs = logprobs != 0 ? at::full({batch, positions + 1}, std::numeric_limits<float>::quiet_NaN(), at::kFloat) : at::empty({0}, at::kFloat);
  int64_t* ot = out_tokens.data_ptr<int64_t>();
  int64_t* oa = out_accepted.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    if (outs[b].bad) continue;
    for (int64_t i = 0; i < outs[b].tau; ++i) ot[b * (positions + 1) + i] = tok[b * positions + i];
    ot[b * (positions + 1) + outs[b].tau] = outs[b].token;
    oa[b] = outs[b].tau;
    if (logprobs != 0) {
      float* ol = out_logprobs.data_ptr<float>();
      for (int64_t i = 0; i <= outs[b].tau; ++i) ol[b * (positions + 1) + i] = outs[b].logprobs[i];
    }
  }
  return {out_tokens, out_accepted, out_logprobs};
}

}  // namespace
}  // namespace specdec_tree

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Tree and block verification on the CPU (see specdec_ext/reference_tree.py for the semantics)";
  m.def("tree_verify", &specdec_tree::tree_verify, "Tree verification: (tokens (B, D+1), num_accepted (B,), accepted_nodes (B, D))");
  m.def("block_verify", &specdec_tree::block_verify, "Block verification of chains: (tokens (B, K+1), num_accepted (B,), logprobs or empty)");
}
