// Tree verification on the CPU: the semantics of specdec_ext/reference_tree.py (verify_tree_eager)
// on the chain's layers: lines and their statistics (lines.h, filter.cpp), the passes (passes.h),
// the per-ISA race and residual-mass loops (kernel.h) and the Philox stream (philox.h).
//
// Context 0 is the sequence, context i+1 is node i. A sampled row walks from the root: the children
// of its context are tried in node order against the residual w(y) = max(p(y) - c q(y), 0)
// [y not in S] (reference_tree.py), which is never stored: after a rejection its normaliser Z
// (and, without replacement, the remaining draft mass M) is one residual-mass pass over the
// vocabulary, unless the rejection ends the walk (no sibling's test reads them); the final token is
// one race, which falls back to the residual before such a rejection where it is zero everywhere. Rows advance together, one request each per pass (the
// lines of a new context, a rejection's masses, or the final race), so the passes spread over the
// threads whatever the batch. Greedy rows need argmax scans only: all their target lines are
// scanned in the first pass and their walk is read off at the end.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "arguments.h"
#include "dispatch.h"
#include "passes.h"
#include "philox.h"

namespace specdec {
namespace {

struct TreeRow {
  RowInputs in;
  int64_t used = 0;  // nodes 0 .. used - 1
  bool bad = false;
  bool bad_shape = false;                      // a parent out of range or not below its child, or num_nodes outside [0, N]
  std::vector<std::vector<int64_t>> children;  // per context, in node order
  // The walk of a sampled row.
  enum Stage : int8_t { kLines, kMass, kRace, kDone };
  Stage stage = kLines;
  int64_t context = 0, level = 0;  // the current context and its depth
  size_t rank = 0;                 // the sibling under test
  float scale = 0.0f, mass = 1.0f, draft_mass = 1.0f;  // c, Z, M
  std::vector<int64_t> removed;                        // S
  float next_scale = 0.0f;                             // c after the rejection being resolved
  int64_t rejected = -1;                               // its id
  int64_t mass_id = -1, draft_mass_id = -1, race = -1;
  std::vector<int64_t> path;  // nodes entered
  int64_t token = -1;
};

class TreeCall {
 public:
  TreeCall(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, const at::Tensor& draft_tokens, const at::Tensor& parents,
           const RowTensors& row_tensors, const at::Tensor& num_nodes, bool without_replacement, bool check);
  std::tuple<at::Tensor, at::Tensor, at::Tensor> run();

 private:
  int64_t target_index(int64_t b, int64_t c) const { return grid_.target(b, c); }
  int64_t draft_index(int64_t b, int64_t c) const { return grid_.draft(b, c); }
  const Line& target_line(int64_t b, int64_t c) const { return passes_.line(grid_.target(b, c)); }
  const Line& draft_line(int64_t b, int64_t c) const { return passes_.line(grid_.draft(b, c)); }
  // A sampled row reads the draft line of a context whose children it tests.
  bool reads_draft(const TreeRow& r, int64_t c) const { return has_draft_ && !r.children[c].empty(); }
  // Exclusions apply to deterministic siblings and to siblings drawn without replacement.
  bool removes() const { return !has_draft_ || without_replacement_; }

  void read_layout(const IdReader& parents, int64_t b);
  void request_lines(int64_t b);
  void enter(int64_t b, int64_t child);
  void walk(int64_t b);
  Residual residual_law(int64_t b) const;
  void race(int64_t b, const Residual* before, std::vector<int64_t> before_removed);
  void schedule_validation(int64_t b);
  void finish_row(int64_t b);

  CallLogits logits_;  // (checked first: the sizes below come from it)
  int64_t batch_, contexts_, nodes_;
  LineGrid grid_;  // target (b, context c) at b * (N+1) + c, draft (b, c) after all target lines
  Passes passes_;
  bool has_draft_;
  IdReader tokens_;
  bool without_replacement_, check_;  // (siblings without replacement only with a draft)
  std::vector<TreeRow> rows_;
};

TreeCall::TreeCall(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, const at::Tensor& draft_tokens, const at::Tensor& parents,
                   const RowTensors& row_tensors, const at::Tensor& num_nodes, bool without_replacement, bool check)
    : logits_(target_logits, draft_logits, 0, "(B, N+1, V)", "(B, N+1, Vd)"),
      batch_(logits_.batch),
      contexts_(logits_.lines),
      nodes_(contexts_ - 1),
      grid_{batch_, contexts_, contexts_},
      passes_(kernels(), grid_.size()),
      has_draft_(logits_.draft.has_value()),
      without_replacement_(without_replacement && has_draft_),
      check_(check) {
  for (const auto& [ids, name] : {std::pair<const at::Tensor&, const char*>{draft_tokens, "draft_tokens"}, {parents, "parents"}}) {
    check_cpu_tensor(ids, name);
    TORCH_CHECK_VALUE(ids.dim() == 2 && ids.size(0) == batch_ && ids.size(1) == nodes_, "specdec: ", name, " must be (B, N), got ", ids.sizes());
  }
  tokens_ = IdReader(draft_tokens, "draft_tokens");
  const IdReader parent_ids(parents, "parents");
  check_row_tensors(row_tensors, batch_);
  check_row_vector(num_nodes, "num_nodes", batch_);

  rows_.resize(batch_);
  for (int64_t b = 0; b < batch_; ++b) {
    TreeRow& r = rows_[b];
    r.in = read_row(row_tensors, b);
    r.used = row_int(num_nodes, b);
    read_layout(parent_ids, b);
    r.bad = r.in.bad || r.bad_shape;
    for (int64_t i = 0; !r.bad && i < r.used; ++i) {
      const int64_t x = tokens_(b, i);
      r.bad = x < 0 || x >= logits_.draft_vocab;
    }
    if (r.bad) continue;
    // Every line the row could use: the target line of each context, the draft line of each
    // context with children.
    for (int64_t c = 0; c <= r.used; ++c) {
      const Logits& t = logits_.target;
      passes_.setup_line(target_index(b, c), t.line(b, c), t.dtype, t.vocab, r.in.params, false, false);
      if (reads_draft(r, c)) passes_.setup_line(draft_index(b, c), logits_.draft->line(b, c), logits_.draft->dtype, logits_.draft_vocab, r.in.params, true, false);
    }
  }
}

void TreeCall::read_layout(const IdReader& parents, int64_t b) {
  TreeRow& r = rows_[b];
  if (r.used < 0 || r.used > nodes_) {
    r.bad_shape = true;
    return;
  }
  for (int64_t i = 0; i < r.used; ++i) {
    const int64_t parent = parents(b, i);
    if (parent < -1 || parent >= i) {
      r.bad_shape = true;
      return;
    }
  }
  r.children.assign(r.used + 1, {});
  for (int64_t i = 0; i < r.used; ++i) {
    const int64_t parent = parents(b, i);
    r.children[parent + 1].push_back(i);
  }
}

void TreeCall::request_lines(int64_t b) {
  TreeRow& r = rows_[b];
  r.stage = TreeRow::kLines;
  passes_.add_line(target_index(b, r.context), false);
  if (reads_draft(r, r.context)) passes_.add_line(draft_index(b, r.context), false);
}

void TreeCall::enter(int64_t b, int64_t child) {
  TreeRow& r = rows_[b];
  r.path.push_back(child);
  r.context = child + 1;
  r.level += 1;
  r.rank = 0;
  r.scale = 0.0f;
  r.mass = 1.0f;
  r.draft_mass = 1.0f;
  r.removed.clear();
  request_lines(b);
}

// With `check`, every line the row could use is validated: the lines the walk did not read get a
// validity scan.
void TreeCall::schedule_validation(int64_t b) {
  const TreeRow& r = rows_[b];
  for (int64_t c = 0; c <= r.used; ++c) {
    passes_.add_line(target_index(b, c), true);
    if (reads_draft(r, c)) passes_.add_line(draft_index(b, c), true);
  }
}

// Advances a sampled row past the request the last pass answered, up to its next request.
void TreeCall::walk(int64_t b) {
  TreeRow& r = rows_[b];
  if (r.stage == TreeRow::kRace) {
    r.token = passes_.race_winner(r.race);
    r.stage = TreeRow::kDone;
    return;
  }
  if (r.stage == TreeRow::kLines) {
    if (target_line(b, r.context).bad || (reads_draft(r, r.context) && draft_line(b, r.context).bad)) {
      r.bad = true;
      r.stage = TreeRow::kDone;
      return;
    }
  } else {  // kMass: the rejected sibling's new residual, unless it would be zero everywhere
    const float new_mass = static_cast<float>(passes_.mass(r.mass_id));
    if (new_mass > 0.0f) {
      r.scale = r.next_scale;
      r.mass = new_mass;
      if (r.draft_mass_id >= 0) r.draft_mass = static_cast<float>(passes_.mass(r.draft_mass_id));
      if (removes()) r.removed.push_back(r.rejected);
    }
    ++r.rank;
  }
  const Line& p_line = target_line(b, r.context);
  const std::vector<int64_t>& children = r.children[r.context];
  const uint64_t position = r.in.offset + static_cast<uint64_t>(r.level);
  if (r.rank < children.size()) {
    const int64_t child = children[r.rank];
    const int64_t x = tokens_(b, child);
    const bool x_removed = removes() && std::find(r.removed.begin(), r.removed.end(), x) != r.removed.end();
    const float p_x = prob_at(p_line, x);
    const float q_x = has_draft_ ? prob_at(draft_line(b, r.context), x) : 0.0f;
    float w_x = has_draft_ ? std::max(p_x - r.scale * q_x, 0.0f) : p_x;
    if (x_removed) w_x = 0.0f;
    const float proposal = !has_draft_ ? 1.0f : (x_removed ? 0.0f : q_x);
    const float u = philox::coin(position, static_cast<uint32_t>(r.rank), r.in.key0, r.in.key1);
    if (u * proposal * r.mass < w_x * r.draft_mass) {
      enter(b, child);
      return;
    }
    // Rejected: the masses of the next residual, c <- c + Z / M, S <- S + {x}.
    r.next_scale = has_draft_ ? r.scale + r.mass / r.draft_mass : r.scale;
    r.rejected = x;
    if (r.rank + 1 == children.size()) {
      // The walk ends at this rejection, and nothing reads the new residual's masses but the test
      // that it is not zero everywhere: the race makes it (its weights are these) and races the
      // residual before where it is. One pass over the line less.
      const Residual before = residual_law(b);
      std::vector<int64_t> before_removed = before.residual ? r.removed : std::vector<int64_t>{};
      r.scale = r.next_scale;
      if (removes()) r.removed.push_back(x);
      ++r.rank;
      race(b, &before, std::move(before_removed));
      return;
    }
    std::vector<int64_t> removed = r.removed;
    if (removes()) removed.push_back(x);
    Residual law = law_of(p_line);
    law.residual = true;
    if (has_draft_) {
      set_draft(&law, draft_line(b, r.context));
      law.q_scale = r.next_scale;
    }
    r.draft_mass_id = -1;
    if (without_replacement_) {
      Residual draft_law = law_of(draft_line(b, r.context));  // q without S
      draft_law.residual = true;
      r.draft_mass_id = passes_.add_mass(draft_law, draft_index(b, r.context), removed);
    }
    r.mass_id = passes_.add_mass(law, target_index(b, r.context), removes() ? std::move(removed) : std::vector<int64_t>{});
    r.stage = TreeRow::kMass;
    return;
  }
  // Every child rejected, or a leaf: one token from the residual (p when it is p).
  race(b, nullptr, {});
}

// The row's residual w(y) = max(p(y) - c q(y), 0) [y not in S] at its context (p when it is p).
Residual TreeCall::residual_law(int64_t b) const {
  const TreeRow& r = rows_[b];
  Residual law = law_of(target_line(b, r.context));
  law.residual = r.scale != 0.0f || !r.removed.empty();
  if (law.residual && has_draft_) {
    set_draft(&law, draft_line(b, r.context));
    law.q_scale = r.scale;
  }
  return law;
}

// The row's final race on its residual; where that is zero everywhere, on `before` (the residual
// before a rejection whose mass the walk left to the race) or, without it, on p.
void TreeCall::race(int64_t b, const Residual* before, std::vector<int64_t> before_removed) {
  TreeRow& r = rows_[b];
  const Residual law = residual_law(b);
  RaceArgs a;
  static_cast<Residual&>(a) = law;
  set_counters(&a, r.in.key0, r.in.key1, r.in.offset + static_cast<uint64_t>(r.level), philox::kVerifyStream);
  r.race = passes_.add_race(a, target_index(b, r.context), law.residual ? r.removed : std::vector<int64_t>{});
  if (before != nullptr) passes_.set_race_fallback(r.race, *before, std::move(before_removed));
  r.stage = TreeRow::kRace;
  if (check_) schedule_validation(b);
}

// Validity with `check`, and a greedy row's walk: the first child equal to the argmax is entered,
// and the argmax is emitted where none is (a bad line on the way blanks the row).
void TreeCall::finish_row(int64_t b) {
  TreeRow& r = rows_[b];
  if (r.bad) return;
  if (check_) {
    for (int64_t c = 0; c <= r.used && !r.bad; ++c) r.bad = target_line(b, c).bad || (reads_draft(r, c) && draft_line(b, c).bad);
    if (r.bad) return;
  }
  if (!r.in.params.greedy) return;
  int64_t context = 0;
  while (true) {
    const Line& line = target_line(b, context);
    if (line.bad) {
      r.bad = true;
      return;
    }
    int64_t entered = -1;
    for (int64_t child : r.children[context]) {
      if (tokens_(b, child) == line.argmax) {
        entered = child;
        break;
      }
    }
    if (entered < 0) {
      r.token = line.argmax;
      return;
    }
    r.path.push_back(entered);
    context = entered + 1;
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> TreeCall::run() {
  std::vector<int64_t> walking;
  for (int64_t b = 0; b < batch_; ++b) {
    TreeRow& r = rows_[b];
    if (r.bad) continue;
    if (r.in.params.greedy) {
      for (int64_t c = 0; c <= r.used; ++c) passes_.add_line(target_index(b, c), true);  // argmax scans
      if (check_) schedule_validation(b);
      continue;
    }
    walking.push_back(b);
    request_lines(b);
  }
  while (passes_.pending()) {
    passes_.run();
    size_t still = 0;
    for (int64_t b : walking) {
      walk(b);
      if (rows_[b].stage != TreeRow::kDone) walking[still++] = b;
    }
    walking.resize(still);
  }
  // The outputs are as wide as the deepest path N nodes allow, whatever the rows entered: the width
  // every backend gives, since a device backend sizes its outputs before its walk has run.
  const auto long_options = at::TensorOptions().dtype(at::kLong);  // (CPU)
  at::Tensor out_tokens = at::full({batch_, nodes_ + 1}, -1, long_options);
  at::Tensor out_accepted = at::zeros({batch_}, long_options);
  at::Tensor out_nodes = at::full({batch_, nodes_}, -1, long_options);
  int64_t* tok = out_tokens.mutable_data_ptr<int64_t>();
  int64_t* acc = out_accepted.mutable_data_ptr<int64_t>();
  int64_t* nodes = out_nodes.mutable_data_ptr<int64_t>();
  for (int64_t b = 0; b < batch_; ++b) {
    finish_row(b);
    const TreeRow& r = rows_[b];
    if (r.bad) continue;
    const int64_t entered = static_cast<int64_t>(r.path.size());
    for (int64_t d = 0; d < entered; ++d) {
      nodes[b * nodes_ + d] = r.path[d];
      tok[b * (nodes_ + 1) + d] = tokens_(b, r.path[d]);
    }
    tok[b * (nodes_ + 1) + entered] = r.token;
    acc[b] = entered;
  }
  return {out_tokens, out_accepted, out_nodes};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_tree(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits,
                                                           const at::Tensor& draft_tokens, const at::Tensor& parents, const RowTensors& rows,
                                                           const at::Tensor& num_nodes, bool without_replacement, bool check) {
  TreeCall call(target_logits, draft_logits, draft_tokens, parents, rows, num_nodes, without_replacement, check);
  return call.run();
}

}  // namespace specdec
