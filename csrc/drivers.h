// The verification drivers, as the bindings (bindings.cpp) call them. Each checks its arguments,
// reads the logits in place and runs its walk on the shared passes (passes.h); row b's Philox key
// is seeds[b] when given, else base_key + b, and its offset offsets[b] (0 when not given).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "arguments.h"

namespace specdec {

constexpr int32_t kLogprobsNone = 0, kLogprobsRaw = 2;  // logprobs modes (1: processed)

using VerifyOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Token-wise verification (stream 1) and sample (K = 0, stream 2), chain.cpp:
// (tokens (B, K+1), num_accepted (B,), logprobs (B, K+1) or empty, accept_probs (B, K) or empty).
VerifyOutputs verify_chain(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, const at::Tensor& draft_tokens,
                           const RowTensors& rows, const at::Tensor& num_draft_tokens, int64_t stream, bool check, int64_t logprobs, bool accept_probs);
// The same with optional draft ids (only for K = 0) and counts (none: K in every row); `sample`
// takes (B, V) logits and makes (B,) tokens; `any_bad` (if given) says whether a row was blanked.
// Logprobs and accept_probs not asked for are undefined tensors.
VerifyOutputs verify_chain(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, const at::Tensor* draft_tokens,
                           const RowTensors& rows, const at::Tensor* num_draft_tokens, int64_t stream, bool check, int64_t logprobs, bool accept_probs,
                           bool sample, bool* any_bad);

// Block verification of chains (stream 1), block.cpp: (tokens (B, K+1), num_accepted (B,), logprobs or empty).
std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_block_chain(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits,
                                                                  const at::Tensor& draft_tokens, const RowTensors& rows, const at::Tensor& num_draft_tokens,
                                                                  bool check, int64_t logprobs);

// Tree verification, tree.cpp: (tokens (B, N+1), num_accepted (B,), accepted_nodes (B, N)), -1 beyond
// each row's accepted path.
std::tuple<at::Tensor, at::Tensor, at::Tensor> verify_tree(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits,
                                                           const at::Tensor& draft_tokens, const at::Tensor& parents, const RowTensors& rows,
                                                           const at::Tensor& num_nodes, bool without_replacement, bool check);

}  // namespace specdec
