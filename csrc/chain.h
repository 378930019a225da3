// One verify call on chains (chain.cpp: token-wise and sample; block.cpp: block verification):
// the semantics of specdec_ext/reference.py and reference_tree.verify_block_eager without
// (B, K+1, V) temporaries. Logits are read in place in their own dtype, each line at most once
// per pass (passes.h). A row's numbers depend only on its own lines, parameters, key and offset.
//
// What the two methods share: the rows (parameters, keys, offsets, draft ids), the lines (target
// (b, pos) at b * (K+1) + pos, draft (b, pos) after all target lines), greedy rows (token by
// token: argmax scans), the validity rules and the outputs. They differ in the walk of a sampled
// row: token-wise verification reads the lines position by position and stops at the first
// rejection; block verification reads every line up to n_b, then walks back from n_b.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "arguments.h"
#include "dispatch.h"
#include "drivers.h"
#include "passes.h"

namespace specdec {

struct ChainRow {
  RowInputs in;
  int64_t num_draft = 0;
  int64_t accepted = 0;
  int64_t winner = -1;
  int64_t race = -1;  // the race of its final token (sampled rows)
  bool bad = false;
};

class ChainCall {
 public:
  ChainCall(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, const at::Tensor& draft_tokens, const RowTensors& row_tensors,
            const at::Tensor& num_draft_tokens, bool check, int64_t logprobs, bool accept_probs)
      : ChainCall(target_logits, draft_logits, &draft_tokens, row_tensors, &num_draft_tokens, check, logprobs, accept_probs, false) {}
  // The same with optional draft ids and counts: no draft_tokens only when K = 0, no
  // num_draft_tokens for K drafts in every row; `sample` takes (B, V) logits (read as (B, 1, V))
  // and makes (B,) tokens.
  ChainCall(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, const at::Tensor* draft_tokens, const RowTensors& row_tensors,
            const at::Tensor* num_draft_tokens, bool check, int64_t logprobs, bool accept_probs, bool sample);

  int64_t batch() const { return batch_; }
  int64_t num_positions() const { return num_positions_; }
  bool has_draft() const { return logits_.draft.has_value(); }
  bool check() const { return check_; }
  ChainRow& row(int64_t b) { return rows_[b]; }
  Passes& passes() { return passes_; }

  int64_t target_index(int64_t b, int64_t pos) const { return grid_.target(b, pos); }
  int64_t draft_index(int64_t b, int64_t pos) const { return grid_.draft(b, pos); }
  const Line& target_line(int64_t b, int64_t pos) const { return passes_.line(grid_.target(b, pos)); }
  const Line& draft_line(int64_t b, int64_t pos) const { return passes_.line(grid_.draft(b, pos)); }
  // Draft id at (b, pos), clamped into the draft vocabulary (the row is bad when it was not in it).
  int64_t token(int64_t b, int64_t pos) const;

  // Schedules the lines of row b its walk has not read, as scans: its target lines (all of a greedy
  // row's, whose walk needs argmax scans only) and, with `check`, its draft lines (validity only).
  void schedule_rest(int64_t b);
  // The race of row b's final token at position j (its accepted count, recorded) from a law
  // (kernel.h: Residual) with `excluded` ids, on `stream`.
  void add_race(int64_t b, int64_t j, const Residual& law, std::vector<int64_t> excluded, uint32_t stream);
  // The law of the token-wise residual at (b, j): max(p - q, 0) after a rejection, else p.
  Residual token_law(int64_t b, int64_t j, bool rejected, std::vector<int64_t>* excluded) const;
  void record_ratio(int64_t b, int64_t pos, float ratio);

  // After the walks: validity, greedy rows' walks, race winners; then the output tensors.
  void finish();
  // (lean: logprobs / accept_probs not asked for are undefined tensors, else empty ones)
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> outputs(bool lean = false);
  // Whether a row was blanked (after finish()).
  bool any_bad() const;

 private:
  CallLogits logits_;  // (checked first: the sizes below come from it)
  int64_t batch_, length_, num_positions_;
  LineGrid grid_;  // target (b, pos) at b * (K+1) + pos, draft (b, pos) after all target lines
  Passes passes_;
  IdReader tokens_;
  bool check_;
  int64_t logprobs_;
  std::vector<ChainRow> rows_;
  at::Tensor out_tokens_, out_accepted_, out_logprobs_, out_accept_;
  float* accept_out_ = nullptr;
};

}  // namespace specdec
