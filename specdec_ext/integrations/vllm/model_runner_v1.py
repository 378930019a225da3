"""The V1 runner (``VLLM_USE_V2_MODEL_RUNNER=0``): ``RejectionSampler.forward`` through specdec_ext.

vLLM's V1 forward samples the bonus tokens with its regular sampler, builds a temperature-scaled, sort-
filtered float32 copy of the draft positions' logits and a softmax of it, then runs its Triton kernels. The
replacement verifies every position, bonus included, from the logits after vLLM's own pre-temperature
processing (its two ``apply_logits_processors`` methods, run only when a request uses a processor) with
fused temperature / top-k / top-p, and returns vLLM's ``SamplerOutput``: ``sampled_token_ids`` (B,
max_spec_len + 1) int32 with -1 placeholders, logprobs through vLLM's own ``_get_logprobs_tensors``.

Randomness: V1 hands the sampler a ``torch.Generator`` per seeded request (``SamplingMetadata.generators``),
not a seed and a position. Each step draws a seeded request's key from its own generator (one draw, as
vLLM's own uniform draw advances it), so its tokens depend on its own history only, never on the batch;
the other requests' keys come from torch's default generator. Offsets are 0: every step has fresh keys.
"""

from __future__ import annotations

import numpy as np
import torch

from specdec_ext._philox import draw_row_keys

from . import verification

_SAMPLING_EPS = 1e-5  # vLLM V1 treats temperatures below this as greedy
_ACTIVE_FLAGS = {
    "LogitBiasLogitsProcessor": lambda p: bool(p.biases),
    "MinTokensLogitsProcessor": lambda p: bool(p.min_toks),
}


def passthrough_reason(rejection_sampler, sampling_metadata) -> str | None:
    """Why this call must stay vLLM's own (None: specdec_ext verifies it)."""
    if rejection_sampler.use_fly:
        return 'rejection_sample_method="fly"'
    if rejection_sampler.synthetic_mode:
        return 'rejection_sample_method="synthetic"'
    for processor in sampling_metadata.logitsprocs.argmax_invariant:
        if type(processor).__name__ != "MinPLogitsProcessor":
            return f"an argmax-invariant logits processor ({type(processor).__name__}) applied after temperature"
    return None


def _uses_pre_temperature_processing(sm) -> bool:
    if not sm.no_penalties or sm.allowed_token_ids_mask is not None or sm.bad_words_token_ids:
        return True
    holder = sm.thinking_budget_state_holder
    if holder is not None and holder.has_tracked_requests():
        return True
    for processor in sm.logitsprocs.non_argmax_invariant:
        flag = _ACTIVE_FLAGS.get(type(processor).__name__)
        if flag is None or flag(processor):
            return True
    return False


def _min_p(sm) -> torch.Tensor | None:
    """(B,) min-p of each request, or None when no request uses it."""
    for processor in sm.logitsprocs.argmax_invariant:
        if type(processor).__name__ == "MinPLogitsProcessor" and processor.min_p_count:
            return processor.min_p
    return None


def _request_parameters(sm, batch: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B,) temperature (0 = greedy), top_k (0 = off), top_p (1 = off) from V1's sampling metadata."""
    if sm.all_greedy or sm.temperature is None:
        temperature = torch.zeros(batch, dtype=torch.float32, device=device)
    else:
        temperature = sm.temperature.to(torch.float32)
        temperature = torch.where(temperature < _SAMPLING_EPS, torch.zeros_like(temperature), temperature)
    top_k = torch.zeros(batch, dtype=torch.int64, device=device) if sm.top_k is None else sm.top_k.to(torch.int64)
    top_k = torch.where((top_k >= vocab) | (top_k < 0), torch.zeros_like(top_k), top_k)
    top_p = torch.ones(batch, dtype=torch.float32, device=device) if sm.top_p is None else sm.top_p.to(torch.float32)
    return temperature, top_k, top_p


def request_keys(generators: dict[int, torch.Generator], batch: int, device: torch.device) -> torch.Tensor:
    """(B,) keys: a seeded request's drawn from its own generator, the others from torch's default one."""
    keys = draw_row_keys(None, batch, device)
    for row, generator in generators.items():
        if row < batch:
            keys[row] = draw_row_keys(generator, 1, device)[0]
    return keys


def forward(rejection_sampler, metadata, draft_probs, logits, sampling_metadata):
    """specdec_ext's ``RejectionSampler.forward`` (same arguments and result as vLLM's)."""
    from vllm.utils.torch_utils import async_tensor_h2d
    from vllm.v1.outputs import SamplerOutput

    sm = sampling_metadata
    device = logits.device
    vocab = logits.shape[-1]
    num_draft_list = metadata.num_draft_tokens
    batch = len(num_draft_list)
    width = metadata.max_spec_len + 1
    num_tokens = metadata.draft_token_ids.shape[0]
    drafted_counts = async_tensor_h2d(np.asarray(num_draft_list, dtype=np.int64), device)  # pinned: no host wait
    draft_starts = metadata.cu_num_draft_tokens.to(torch.int64) - drafted_counts

    # Logits before temperature, flat as [draft positions..., bonus positions...] (raw rows of `logits`
    # unless vLLM's processors change them: then one float32 copy, processed by vLLM's own methods).
    draft_rows = metadata.target_logits_indices.to(torch.int64)
    bonus_rows = metadata.bonus_logits_indices.to(torch.int64)
    source = logits
    if _uses_pre_temperature_processing(sm):
        drafted = rejection_sampler.apply_logits_processors(logits[draft_rows].to(torch.float32), sm, metadata)
        bonus = rejection_sampler.sampler.apply_logits_processors(logits[bonus_rows].to(torch.float32), sm, True)
        source = torch.cat([drafted, bonus])
        draft_rows = torch.arange(num_tokens, device=device)
        bonus_rows = num_tokens + torch.arange(batch, device=device)

    temperature, top_k, top_p = _request_parameters(sm, batch, vocab, device)
    slot, real = verification.padded_slots(draft_starts, drafted_counts, width, num_tokens)
    rows = torch.where(real, draft_rows[slot] if num_tokens else bonus_rows[:, None], bonus_rows[:, None])
    target = source[rows.reshape(-1)].unflatten(0, (batch, width))
    min_p = _min_p(sm)
    if min_p is not None:
        flat = target.reshape(batch * width, vocab)
        target = verification.mask_min_p(flat, temperature.repeat_interleave(width), min_p.repeat_interleave(width)).reshape(batch, width, vocab)

    draft_slot, draft_real = slot[:, :-1], real[:, :-1]
    if num_tokens:
        drafts = torch.where(draft_real, metadata.draft_token_ids.to(torch.int64)[draft_slot], torch.zeros_like(draft_slot))
    else:
        drafts = torch.zeros((batch, width - 1), dtype=torch.int64, device=device)
    drafts, num_draft = verification.drafts_until_placeholder(drafts, drafted_counts)

    draft = None
    if draft_probs is not None and num_tokens:
        draft = verification.draft_logits_from_probs(draft_probs[draft_slot], temperature[:, None])
        # vLLM drew these drafts without top-k / top-p (see verification.py). Whether a row is filtered is only
        # known on the device: any filter in the batch takes the masked path, exact either way.
        if sm.top_k is not None or sm.top_p is not None:
            target = verification.mask_to_filtered_support(target, temperature, top_k, top_p)
            top_k, top_p = torch.zeros_like(top_k), torch.ones_like(top_p)

    block = verification.Block(target, draft, drafts, num_draft, temperature, top_k, top_p,
                               seeds=request_keys(sm.generators, batch, device), offsets=torch.zeros(batch, dtype=torch.int64, device=device))
    result = verification.run_verification(block)
    output_token_ids = result.tokens.to(torch.int32)  # -1 after each row's last token, as vLLM's placeholders

    logprobs_tensors = None
    if sm.max_num_logprobs is not None:
        if rejection_sampler.is_processed_logprobs_mode:
            processed = verification.processed_logits(block, vocab)
            owner = async_tensor_h2d(np.repeat(np.arange(batch, dtype=np.int64), num_draft_list), device)
            position = torch.arange(num_tokens, device=device) - draft_starts[owner]
            target_lines, bonus_lines = processed[owner, position], processed[torch.arange(batch, device=device), drafted_counts]
        else:
            target_lines = logits[metadata.target_logits_indices].to(torch.float32)
            bonus_lines = logits[metadata.bonus_logits_indices].to(torch.float32)
        logprobs_tensors = rejection_sampler._get_logprobs_tensors(sm.max_num_logprobs, metadata, logits, target_lines, bonus_lines, output_token_ids)
    return SamplerOutput(sampled_token_ids=output_token_ids, logprobs_tensors=logprobs_tensors)
