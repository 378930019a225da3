// Token-wise verification of chains and sampling (chain.h), and what block verification shares
// with it (block.cpp).
//
// The token-wise walk runs in passes: the first reads position 0 of every sampled row (and every
// target line of a greedy row: argmax scans); between passes each row still accepting tests
// u * q(x) < p(x) at its position, so the next pass reads the next position of the rows still
// accepting, races the rows that just finished and, with `check`, scans the lines no row will
// reach, only for the validity check (a max / NaN scan: the check needs no softmax statistics; the
// memory-bound scans then share a pass with compute-bound races). The exp work follows the
// accepted prefix instead of K. Without `check` the lines after a row's first rejection are never
// read: a row is blanked only for a bad value in a line its verification reads (target and draft
// lines up to the first rejection; a greedy row reads target lines only).
#include "chain.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "philox.h"

namespace specdec {
ChainCall::ChainCall(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, const at::Tensor* draft_tokens,
                     const RowTensors& row_tensors, const at::Tensor* num_draft_tokens, bool check, int64_t logprobs, bool accept_probs, bool sample)
    : logits_(target_logits, draft_logits, -1, "(B, K+1, V)", "(B, K, Vd)", sample),
      batch_(logits_.batch),
      length_(logits_.lines),
      num_positions_(length_ - 1),
      grid_{batch_, length_, num_positions_},
      passes_(kernels(), grid_.size()),
      check_(check),
      logprobs_(logprobs) {
  if (draft_tokens != nullptr) {
    check_cpu_tensor(*draft_tokens, "draft_tokens");
    TORCH_CHECK_VALUE(draft_tokens->dim() == 2 && draft_tokens->size(0) == batch_ && draft_tokens->size(1) == num_positions_,
                      "specdec: draft_tokens must be (B, K)");
    TORCH_CHECK_VALUE(draft_tokens->scalar_type() == at::kLong || draft_tokens->scalar_type() == at::kInt, "specdec: draft_tokens must be int32 or int64");
    tokens_ = IdReader(*draft_tokens, "draft_tokens");
  } else {
    TORCH_CHECK_VALUE(num_positions_ == 0, "specdec: draft_tokens must be (B, K)");
  }
  check_row_tensors(row_tensors, batch_);
  if (num_draft_tokens != nullptr) check_row_vector(*num_draft_tokens, "num_draft_tokens", batch_);
  TORCH_CHECK_VALUE(logprobs >= kLogprobsNone && logprobs <= kLogprobsRaw, "specdec: logprobs must be 0 (none), 1 (processed) or 2 (raw), got ", logprobs);

  // The outputs, allocated directly (at::full / at::zeros through the dispatcher cost more than a
  // tiny call's whole kernel work).
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  out_tokens_ = sample ? new_cpu_tensor({batch_}, at::kLong) : new_cpu_tensor({batch_, length_}, at::kLong);
  std::fill_n(out_tokens_.mutable_data_ptr<int64_t>(), batch_ * length_, int64_t{-1});
  out_accepted_ = new_cpu_tensor({batch_}, at::kLong);
  std::fill_n(out_accepted_.mutable_data_ptr<int64_t>(), batch_, int64_t{0});
  if (logprobs != kLogprobsNone) {
    out_logprobs_ = new_cpu_tensor({batch_, length_}, at::kFloat);
    std::fill_n(out_logprobs_.mutable_data_ptr<float>(), batch_ * length_, kNaN);
  }
  if (accept_probs) {
    out_accept_ = new_cpu_tensor({batch_, num_positions_}, at::kFloat);
    std::fill_n(out_accept_.mutable_data_ptr<float>(), batch_ * num_positions_, kNaN);
  }
  accept_out_ = accept_probs ? out_accept_.mutable_data_ptr<float>() : nullptr;

  // Rows: parameters, keys, offsets, and the value checks that do not need the logits.
  rows_.resize(batch_);
  for (int64_t b = 0; b < batch_; ++b) {
    ChainRow& r = rows_[b];
    r.in = read_row(row_tensors, b);
    r.num_draft = num_draft_tokens != nullptr ? row_int(*num_draft_tokens, b) : num_positions_;
    r.bad = r.in.bad || r.num_draft < 0 || r.num_draft > num_positions_;
    for (int64_t pos = 0; !r.bad && pos < r.num_draft; ++pos) {
      const int64_t x = tokens_(b, pos);
      r.bad = x < 0 || x >= logits_.draft_vocab;
    }
  }

  // Lines. Raw logprobs need the raw normaliser of the emitted (target) lines; greedy rows report
  // the raw log-softmax in both modes.
  for (int64_t b = 0; b < batch_; ++b) {
    const ChainRow& r = rows_[b];
    if (r.bad) continue;
    const bool greedy = r.in.params.greedy;
    const bool want_raw = (greedy && logprobs != kLogprobsNone) || (!greedy && logprobs == kLogprobsRaw);
    for (int64_t pos = 0; pos <= r.num_draft; ++pos) {
      passes_.setup_line(target_index(b, pos), logits_.target.line(b, pos), logits_.target.dtype, logits_.target.vocab, r.in.params, false, want_raw);
    }
    for (int64_t pos = 0; has_draft() && pos < r.num_draft; ++pos) {
      passes_.setup_line(draft_index(b, pos), logits_.draft->line(b, pos), logits_.draft->dtype, logits_.draft_vocab, r.in.params, true, false);
    }
  }
}

int64_t ChainCall::token(int64_t b, int64_t pos) const { return std::min(std::max(tokens_(b, pos), int64_t{0}), logits_.draft_vocab - 1); }

void ChainCall::schedule_rest(int64_t b) {
  const ChainRow& r = rows_[b];
  for (int64_t pos = 0; pos <= r.num_draft; ++pos) passes_.add_line(target_index(b, pos), true);
  for (int64_t pos = 0; check_ && has_draft() && pos < r.num_draft; ++pos) passes_.add_line(draft_index(b, pos), true);
}

Residual ChainCall::token_law(int64_t b, int64_t j, bool rejected, std::vector<int64_t>* excluded) const {
  Residual law = law_of(target_line(b, j));
  law.residual = rejected;
  if (rejected && has_draft()) {
    set_draft(&law, draft_line(b, j));
  } else if (rejected) {
    excluded->push_back(token(b, j));  // a one-hot draft: max(p - 1, 0) is 0 at its id
  }
  return law;
}

void ChainCall::add_race(int64_t b, int64_t j, const Residual& law, std::vector<int64_t> excluded, uint32_t stream) {
  ChainRow& r = rows_[b];
  RaceArgs a;
  static_cast<Residual&>(a) = law;
  set_counters(&a, r.in.key0, r.in.key1, r.in.offset + static_cast<uint64_t>(j), stream);
  r.accepted = j;
  r.race = passes_.add_race(a, target_index(b, j), std::move(excluded));
}

void ChainCall::record_ratio(int64_t b, int64_t pos, float ratio) {
  if (accept_out_ != nullptr) accept_out_[b * num_positions_ + pos] = ratio;
}

void ChainCall::finish() {
  // Validity (every line up to n_b with `check`; otherwise the lines read, which a sampled row's
  // walk already checked), greedy rows' tokens, and the races' winners. (Lines never read are
  // not `bad`.)
  for (int64_t b = 0; b < batch_; ++b) {
    ChainRow& r = rows_[b];
    if (r.bad) continue;
    const bool greedy = r.in.params.greedy;
    if (check_ || !greedy) {
      for (int64_t pos = 0; pos <= r.num_draft && !r.bad; ++pos) r.bad = target_line(b, pos).bad;
      for (int64_t pos = 0; has_draft() && pos < r.num_draft && !r.bad; ++pos) r.bad = draft_line(b, pos).bad;
    }
    if (r.bad) continue;
    if (!greedy) {
      r.winner = passes_.race_winner(r.race);
      continue;
    }
    // The greedy walk stops at a bad line: it blanks the row, with or without `check`.
    int64_t j = 0;
    while (j < r.num_draft && !target_line(b, j).bad) {
      const bool match = token(b, j) == target_line(b, j).argmax;
      record_ratio(b, j, match ? 1.0f : 0.0f);
      if (!match) break;
      ++j;
    }
    r.bad = target_line(b, j).bad;
    r.accepted = j;
    r.winner = target_line(b, j).argmax;
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> ChainCall::outputs(bool lean) {
  if (!lean) {  // (outputs not asked for are empty tensors)
    if (!out_logprobs_.defined()) out_logprobs_ = new_cpu_tensor({0}, at::kFloat);
    if (!out_accept_.defined()) out_accept_ = new_cpu_tensor({0}, at::kFloat);
  }
  int64_t* out_t = out_tokens_.mutable_data_ptr<int64_t>();
  int64_t* out_a = out_accepted_.mutable_data_ptr<int64_t>();
  float* out_lp = logprobs_ != kLogprobsNone ? out_logprobs_.mutable_data_ptr<float>() : nullptr;
  for (int64_t b = 0; b < batch_; ++b) {
    const ChainRow& r = rows_[b];
    if (r.bad) {
      if (accept_out_ != nullptr) std::fill(accept_out_ + b * num_positions_, accept_out_ + (b + 1) * num_positions_, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    for (int64_t pos = 0; pos < r.accepted; ++pos) out_t[b * length_ + pos] = token(b, pos);
    out_t[b * length_ + r.accepted] = r.winner;
    out_a[b] = r.accepted;
    if (out_lp == nullptr) continue;
    for (int64_t pos = 0; pos <= r.accepted; ++pos) {
      const Line& line = target_line(b, pos);
      const int64_t x = out_t[b * length_ + pos];
      float value;
      if (r.in.params.greedy || logprobs_ == kLogprobsRaw) {
        const float raw = load_one(line.ptr, line.dtype, x);
        value = (raw - line.raw_max) - std::log(line.raw_z);
      } else {
        const float s = scaled_at(line, x);
        value = s >= line.tau ? (s - line.m) - std::log(line.z) : -kInf;
      }
      out_lp[b * length_ + pos] = value;
    }
  }
  return {out_tokens_, out_accepted_, out_logprobs_, out_accept_};
}

bool ChainCall::any_bad() const {
  for (const ChainRow& r : rows_) {
    if (r.bad) return true;
  }
  return false;
}

namespace {

// The token-wise walk of every row, then finish().
void walk(ChainCall& call, int64_t stream) {
  Passes& passes = call.passes();
  const bool has_draft = call.has_draft();
  std::vector<int64_t> active;  // sampled rows still accepting, at position row(b).accepted
  for (int64_t b = 0; b < call.batch(); ++b) {
    ChainRow& r = call.row(b);
    if (r.bad) continue;
    if (r.in.params.greedy) {
      call.schedule_rest(b);  // greedy rows need only argmax scans (and the validity of the drafts)
      continue;
    }
    r.accepted = 0;
    active.push_back(b);
    passes.add_line(call.target_index(b, 0), false);
    if (has_draft && r.num_draft > 0) passes.add_line(call.draft_index(b, 0), false);
  }
  while (passes.pending()) {
    passes.run();
    // Acceptance at each active row's position; the next pass reads what the survivors need.
    size_t still = 0;
    for (int64_t b : active) {
      ChainRow& r = call.row(b);
      const int64_t j = r.accepted;
      if (call.target_line(b, j).bad || (has_draft && j < r.num_draft && call.draft_line(b, j).bad)) {
        r.bad = true;  // no need to look further: the row is blanked
        continue;
      }
      bool accepted = false;
      if (j < r.num_draft) {
        const int64_t x = call.token(b, j);
        const float p = prob_at(call.target_line(b, j), x);
        const float q = has_draft ? prob_at(call.draft_line(b, j), x) : 1.0f;
        const float u = philox::coin(r.in.offset + static_cast<uint64_t>(j), 0, r.in.key0, r.in.key1);
        accepted = u * q < p;
        call.record_ratio(b, j, q > 0.0f ? std::min(p / q, 1.0f) : (p > 0.0f ? 1.0f : 0.0f));
      }
      if (accepted) {
        r.accepted = j + 1;
        active[still++] = b;
        passes.add_line(call.target_index(b, j + 1), false);
        if (has_draft && j + 1 < r.num_draft) passes.add_line(call.draft_index(b, j + 1), false);
      } else {
        std::vector<int64_t> excluded;
        const Residual law = call.token_law(b, j, j < r.num_draft, &excluded);
        call.add_race(b, j, law, std::move(excluded), static_cast<uint32_t>(stream));
        if (call.check()) call.schedule_rest(b);
      }
    }
    active.resize(still);
  }
  call.finish();
}

void check_stream(int64_t stream) {
  TORCH_CHECK_VALUE(stream == philox::kVerifyStream || stream == philox::kSampleStream, "specdec: stream must be 1 (verify) or 2 (sample), got ", stream);
}

}  // namespace

VerifyOutputs verify_chain(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, const at::Tensor& draft_tokens,
                           const RowTensors& rows, const at::Tensor& num_draft_tokens, int64_t stream, bool check, int64_t logprobs, bool accept_probs) {
  check_stream(stream);
  ChainCall call(target_logits, draft_logits, draft_tokens, rows, num_draft_tokens, check, logprobs, accept_probs);
  walk(call, stream);
  return call.outputs();
}

VerifyOutputs verify_chain(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, const at::Tensor* draft_tokens,
                           const RowTensors& rows, const at::Tensor* num_draft_tokens, int64_t stream, bool check, int64_t logprobs, bool accept_probs,
                           bool sample, bool* any_bad) {
  check_stream(stream);
  ChainCall call(target_logits, draft_logits, draft_tokens, rows, num_draft_tokens, check, logprobs, accept_probs, sample);
  walk(call, stream);
  if (any_bad != nullptr) *any_bad = call.any_bad();
  return call.outputs(/*lean=*/true);
}

}  // namespace specdec
