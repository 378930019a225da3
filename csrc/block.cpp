// Block verification of chains (Sun et al., ICLR 2025; specdec_ext/reference_tree.py:
// verify_block_eager) on the chain's rows, lines and outputs (chain.h).
//
// A sampled row reads every line up to n_b in the first pass (the block is judged as a whole).
// Then, with p_0 = 1 and p_i = min(1, p_{i-1} p(x_i) / q(x_i)), the walk goes back from i = n_b
// (accept all if eta < p_{n_b}) and stops at the first i whose coin passes
// eta_i * (S_i + (1 - p_i)) < S_i, S_i = sum_y max(p_i P_i(y) - Q_i(y), 0): each S_i is one
// residual-mass pass over line i, computed only when the walk gets there and the coin's outcome
// is not already settled by bounds on S_i (below), one pass per step for all rows still walking (a
// well-matched draft stops at n_b and needs none). The final token is raced from
// max(p_tau P_tau - Q_tau, 0) (P at tau = n_b), in a pass shared with the next step's masses.
// Greedy rows verify token by token, exactly as in token-wise verification.
#include <cstdint>
#include <vector>

#include "chain.h"
#include "philox.h"

namespace specdec {
namespace {

// p_1 .. p_n of a row (carried[0] = p_0 = 1), from the lines' statistics (prob_at, as the walk of
// token-wise verification evaluates p(x) and q(x)).
std::vector<float> carried_weights(const ChainCall& call, int64_t b, int64_t n) {
  std::vector<float> carried(n + 1, 1.0f);
  for (int64_t i = 1; i <= n; ++i) {
    const int64_t x = call.token(b, i - 1);
    const float p_x = prob_at(call.target_line(b, i - 1), x);
    const float q_x = call.has_draft() ? prob_at(call.draft_line(b, i - 1), x) : 1.0f;
    const float joint = carried[i - 1] * p_x;
    const float ratio = q_x > 0.0f ? joint / q_x : (joint > 0.0f ? 1.0f : 0.0f);
    carried[i] = ratio < 1.0f ? ratio : 1.0f;
  }
  return carried;
}

// The block residual at line i < n_b: max(p_i P_i - Q_i, 0), Q_i the draft's law there or the
// point mass at x_{i+1} (a one-hot draft: excluded, since p_i P_i(x) <= 1).
Residual block_law(const ChainCall& call, int64_t b, int64_t i, float weight, std::vector<int64_t>* excluded) {
  Residual law = call.token_law(b, i, true, excluded);
  law.p_scale = weight;
  return law;
}

// The coin at line i, eta (S_i + (1 - p_i)) < S_i, is affine in S_i, and 0 <= S_i <= p_i (1 + 1e-5)
// (the p of a line sums to 1 within float rounding; the terms of S_i are at most p_i P_i(y)), while
// any one term max(p_i P_i(y) - Q_i(y), 0) is a lower bound. So when the test, taken with a margin
// for its float32 rounding (kRounding, relative, far above three roundings), fails at both ends of
// [0, upper], or holds at both ends of [lower, upper], its outcome is the one the exact S_i gives,
// and S_i's pass is skipped (the winner never depends on S_i itself).
constexpr double kRounding = 1e-6;
constexpr double kTermMargin = 1e-5;  // (relative) the upper bound's slack over p_i
constexpr double kTermError = 1e-6;   // (relative to p_i P(y) + Q(y)) prob_at's p and q against the mass loop's, a few ulps
enum class Coin { kFails, kPasses, kNeedsMass };

Coin settle_coin(ChainCall& call, int64_t b, int64_t i, float weight, float eta) {
  const double e = static_cast<double>(eta), d = static_cast<double>(1.0f - weight);  // (1 - p_i as the test rounds it)
  auto holds = [&](double inner) { return e * (inner + d) * (1.0 + kRounding) < inner; };
  auto fails = [&](double inner) { return e * (inner + d) * (1.0 - kRounding) >= inner; };
  const double upper = static_cast<double>(weight) * (1.0 + kTermMargin);
  if (fails(0.0) && fails(upper)) return Coin::kFails;
  // A lower bound: the term of the target's most likely id.
  const Line& p_line = call.target_line(b, i);
  const int64_t y = call.passes().argmax(call.target_index(b, i));
  if (y < 0) return Coin::kNeedsMass;
  const float q_y = call.has_draft() ? (y < call.draft_line(b, i).n ? prob_at(call.draft_line(b, i), y) : 0.0f) : (y == call.token(b, i) ? 1.0f : 0.0f);
  const double scaled_p = static_cast<double>(weight) * static_cast<double>(prob_at(p_line, y));
  const double lower = (scaled_p - static_cast<double>(q_y) - kTermError * (scaled_p + static_cast<double>(q_y))) * (1.0 - kTermError);
  if (lower > 0.0 && holds(lower) && holds(upper)) return Coin::kPasses;
  return Coin::kNeedsMass;
}

struct BlockWalk {
  std::vector<float> carried;
  int64_t i = 0;      // the line whose S_i is being computed
  int64_t mass = -1;  // its mass in the pass
};

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_block_chain(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits,
                                                                  const at::Tensor& draft_tokens, const RowTensors& rows, const at::Tensor& num_draft_tokens,
                                                                  bool check, int64_t logprobs) {
  ChainCall call(target_logits, draft_logits, draft_tokens, rows, num_draft_tokens, check, logprobs, false);
  Passes& passes = call.passes();
  const bool has_draft = call.has_draft();
  const uint32_t stream = philox::kVerifyStream;
  std::vector<int64_t> sampled;
  for (int64_t b = 0; b < call.batch(); ++b) {
    ChainRow& r = call.row(b);
    if (r.bad) continue;
    if (r.in.params.greedy) {
      call.schedule_rest(b);
      continue;
    }
    sampled.push_back(b);
    for (int64_t pos = 0; pos <= r.num_draft; ++pos) passes.add_line(call.target_index(b, pos), false);
    for (int64_t pos = 0; has_draft && pos < r.num_draft; ++pos) passes.add_line(call.draft_index(b, pos), false);
  }
  passes.run();

  std::vector<BlockWalk> walks(call.batch());
  std::vector<int64_t> walking;
  // The final draw at tau: the block residual, or P itself at tau = n_b.
  auto race_at = [&](int64_t b, int64_t tau) {
    const ChainRow& r = call.row(b);
    std::vector<int64_t> excluded;
    const Residual law = tau < r.num_draft ? block_law(call, b, tau, walks[b].carried[tau], &excluded) : call.token_law(b, tau, false, &excluded);
    call.add_race(b, tau, law, std::move(excluded), stream);
  };
  // The next steps back from line i, down to one that needs S_i's mass, or tau = 0 below line 1.
  auto step = [&](int64_t b, int64_t i) {
    BlockWalk& w = walks[b];
    const ChainRow& r = call.row(b);
    for (; i >= 1; --i) {
      const float eta = philox::coin(r.in.offset + static_cast<uint64_t>(i - 1), 0, r.in.key0, r.in.key1);
      const Coin coin = settle_coin(call, b, i, w.carried[i], eta);
      if (coin == Coin::kPasses) {
        race_at(b, i);
        return;
      }
      if (coin == Coin::kNeedsMass) break;
    }
    w.i = i;
    if (i == 0) {
      race_at(b, 0);
      return;
    }
    std::vector<int64_t> excluded;
    const Residual law = block_law(call, b, i, w.carried[i], &excluded);
    w.mass = passes.add_mass(law, call.target_index(b, i), std::move(excluded));
    walking.push_back(b);
  };
  for (int64_t b : sampled) {
    ChainRow& r = call.row(b);
    const int64_t n = r.num_draft;
    for (int64_t pos = 0; pos <= n && !r.bad; ++pos) r.bad = call.target_line(b, pos).bad;
    for (int64_t pos = 0; has_draft && pos < n && !r.bad; ++pos) r.bad = call.draft_line(b, pos).bad;
    if (r.bad) continue;
    walks[b].carried = carried_weights(call, b, n);
    // At i = n_b: eta_n < p_n (eta_i: the chain's coin of draft i, at position offset + i - 1).
    if (n >= 1 && philox::coin(r.in.offset + static_cast<uint64_t>(n - 1), 0, r.in.key0, r.in.key1) < walks[b].carried[n]) {
      race_at(b, n);
    } else {
      step(b, n >= 1 ? n - 1 : 0);
    }
  }
  while (passes.pending()) {
    passes.run();
    std::vector<int64_t> masses_done;
    masses_done.swap(walking);
    for (int64_t b : masses_done) {
      const ChainRow& r = call.row(b);
      const BlockWalk& w = walks[b];
      const float inner = static_cast<float>(passes.mass(w.mass));
      const float weight = w.carried[w.i];
      const float eta = philox::coin(r.in.offset + static_cast<uint64_t>(w.i - 1), 0, r.in.key0, r.in.key1);
      if (eta * (inner + (1.0f - weight)) < inner) {
        race_at(b, w.i);
      } else {
        step(b, w.i - 1);
      }
    }
  }
  call.finish();
  auto [tokens, accepted, logprobs_out, accept] = call.outputs();
  (void)accept;
  return {tokens, accepted, logprobs_out};
}

}  // namespace specdec
