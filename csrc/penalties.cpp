// transformers' repetition penalty for every position of a speculative block, in one call.
//
// The loop applies the penalty to each draft position's logits (the draft's q) and to the target's
// block (its p) with that position's prefix, so both laws are processed alike. In torch that is a
// dozen small tensor ops per call, once per draft token: on a CPU they cost more than the tiny
// draft model's sampling. Here one pass per row marks the ids its prefix holds and rewrites only
// those logits, with transformers' arithmetic (s < 0 ? s * penalty : s / penalty in float32), so
// the result is bit for bit the torch stage's (specdec_ext/processors.py).
#include <torch/extension.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace specdec {

namespace {

void check_ids(const at::Tensor& t, const char* name, int64_t dims) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), "specdec: ", name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK_VALUE(t.scalar_type() == at::kLong, "specdec: ", name, " must be int64, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dims, "specdec: ", name, " must have ", dims, " dimension(s), got shape ", t.sizes());
}

}  // namespace

// scores (b, P, V) float32; sequences (R, W) int64; index, start, end (b,) int64: position j of row
// b has seen sequences[index[b], start[b]:end[b]] and drafts[b, :first + j] (drafts (b, K) int64,
// first + P - 1 <= K). Ids below 0 count as id 0 and ids >= V as none (the torch stage's clamp).
// Returns a new (b, P, V) tensor.
at::Tensor repetition_penalty(const at::Tensor& scores, const at::Tensor& sequences, const at::Tensor& index, const at::Tensor& start,
                              const at::Tensor& end, const std::optional<at::Tensor>& drafts_opt, int64_t first, double penalty) {
  TORCH_CHECK_VALUE(scores.device().is_cpu() && scores.scalar_type() == at::kFloat && scores.dim() == 3,
                    "specdec: scores must be a (b, P, V) float32 CPU tensor, got ", scores.scalar_type(), " ", scores.sizes(), " on ", scores.device());
  check_ids(sequences, "sequences", 2);
  check_ids(index, "index", 1);
  check_ids(start, "start", 1);
  check_ids(end, "end", 1);
  const int64_t batch = scores.size(0), positions = scores.size(1), vocab = scores.size(2);
  TORCH_CHECK_VALUE(index.size(0) == batch && start.size(0) == batch && end.size(0) == batch, "specdec: index, start and end must have one entry per row of scores");
  TORCH_CHECK_VALUE(first >= 0, "specdec: first must be >= 0, got ", first);
  TORCH_CHECK_VALUE(penalty > 0.0, "specdec: penalty must be > 0, got ", penalty);
  at::Tensor drafts;
  if (drafts_opt.has_value() && drafts_opt->defined()) {
    check_ids(*drafts_opt, "drafts", 2);
    drafts = drafts_opt->contiguous();
    TORCH_CHECK_VALUE(drafts.size(0) == batch, "specdec: drafts must have one row per row of scores");
    TORCH_CHECK_VALUE(first + positions - 1 <= drafts.size(1), "specdec: position ", first + positions - 1, " needs more drafts than the ", drafts.size(1), " given");
  } else {
    TORCH_CHECK_VALUE(first == 0 && positions == 1, "specdec: without drafts only one position at first = 0 can be penalised");
  }
  const at::Tensor in = scores.contiguous();
  at::Tensor out = in.clone();
  const at::Tensor seq = sequences.contiguous();
  const int64_t rows = seq.size(0), width = seq.size(1);
  const int64_t* seq_p = seq.const_data_ptr<int64_t>();
  const int64_t* index_p = index.contiguous().const_data_ptr<int64_t>();
  const int64_t* start_p = start.contiguous().const_data_ptr<int64_t>();
  const int64_t* end_p = end.contiguous().const_data_ptr<int64_t>();
  const int64_t* drafts_p = drafts.defined() ? drafts.const_data_ptr<int64_t>() : nullptr;
  const int64_t num_drafts = drafts.defined() ? drafts.size(1) : 0;
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK_VALUE(index_p[b] >= 0 && index_p[b] < rows, "specdec: index[", b, "] = ", index_p[b], " is not a row of sequences");
    TORCH_CHECK_VALUE(end_p[b] >= 0 && end_p[b] <= width, "specdec: end[", b, "] = ", end_p[b], " is outside sequences' ", width, " columns");
  }
  const float factor = static_cast<float>(penalty);
  const float* in_p = in.const_data_ptr<float>();
  float* out_p = out.mutable_data_ptr<float>();
  {
    pybind11::gil_scoped_release no_gil;
    std::vector<uint8_t> seen(static_cast<size_t>(vocab));
    std::vector<int64_t> ids;
    auto add = [&](int64_t id) {
      id = id < 0 ? 0 : id;
      if (id < vocab && !seen[id]) {
        seen[id] = 1;
        ids.push_back(id);
      }
    };
    for (int64_t b = 0; b < batch; ++b) {
      std::fill(seen.begin(), seen.end(), 0);
      ids.clear();
      const int64_t* row = seq_p + index_p[b] * width;
      for (int64_t c = start_p[b] < 0 ? 0 : start_p[b]; c < end_p[b]; ++c) add(row[c]);
      for (int64_t i = 0; i < first; ++i) add(drafts_p[b * num_drafts + i]);
      for (int64_t j = 0; j < positions; ++j) {
        if (j > 0) add(drafts_p[b * num_drafts + first + j - 1]);
        const int64_t line = (b * positions + j) * vocab;
        for (int64_t id : ids) {
          const float s = in_p[line + id];
          out_p[line + id] = s < 0.0f ? s * factor : s / factor;
        }
      }
    }
  }
  return out;
}

}  // namespace specdec
