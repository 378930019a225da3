"""Model Runner V2 (vLLM's default runner): ``RejectionSampler._verify`` through specdec_ext.

vLLM's ``_verify`` writes a processed float32 copy of the logits (``Sampler.apply_sampling_params``:
pre-temperature processors, temperature, min-p, top-k / top-p) and hands it to ``rejection_sample``. The
replacement keeps the pre-temperature processors (vLLM's own, on a float32 copy, and only when a request of
the chunk uses one), masks min-p, and verifies the raw or processed-before-temperature logits with fused
temperature / top-k / top-p: no processed copy on the common path. It returns what vLLM's returns:
``(logits for logprobs, sampled (num_reqs, K+1) int64, num_sampled (num_reqs,) int32)``; the first is the
processed logits (specdec_ext's exact law) only when a processed-logprobs mode needs them.
"""

from __future__ import annotations

import numpy as np
import torch

from . import verification

# Samplers' per-request "does this processor touch the logits" flags, by processor class: vLLM calls every
# processor once per step and each skips itself when no request of the batch uses it; knowing that ahead
# of time spares the float32 copy. A processor not listed here is assumed to be in use.
_ACTIVE_FLAGS = {
    "LogitBiasState": lambda p, rows: bool(np.any(p.use_logit_bias[rows])),
    "PenaltiesState": lambda p, rows: bool(np.any(p.use_penalty[rows])),
    "BadWordsState": lambda p, rows: bool(np.any(p.num_bad_words.np[rows] > 0)),
}


def passthrough_reason(rejection_sampler) -> str | None:
    """Why this sampler's verification must stay vLLM's own (None: specdec_ext verifies it)."""
    if rejection_sampler.synthetic_conditional_rates is not None:
        return 'rejection_sample_method="synthetic"'
    if rejection_sampler.fly_window_size > 0:
        return 'rejection_sample_method="fly"'
    if rejection_sampler.watermark_key is not None:
        return "watermarking"
    if rejection_sampler.enable_adaptive_verification:
        return "adaptive verification"
    if rejection_sampler.sampler.return_sampling_mask:
        return "sampling masks (return_sampling_mask)"
    return None


def _uses_pre_temperature_processing(sampler, rows: np.ndarray) -> bool:
    for processor in sampler.logits_processors:
        flag = _ACTIVE_FLAGS.get(type(processor).__name__)
        if flag is None or flag(processor, rows):
            return True
    budget = sampler.thinking_budget_state
    return bool(budget.enabled and np.any(budget.use_thinking_budget[rows]))


def _pre_temperature_logits(sampler, logits, expanded_idx_mapping, idx_mapping, idx_mapping_np, pos, input_ids, expanded_local_pos, seq_lens_upper_bound_np):
    """vLLM's own processing before temperature (the first half of ``Sampler.apply_sampling_params``), on a
    float32 copy: bias, penalties, bad words, custom processors, then thinking-budget forcing."""
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext

    logits = torch.empty_like(logits, dtype=torch.float32).copy_(logits)
    ctx = LogitsContext(
        expanded_idx_mapping=expanded_idx_mapping, idx_mapping=idx_mapping, idx_mapping_np=idx_mapping_np,
        expanded_local_pos=expanded_local_pos, input_ids=input_ids, pos=pos, seq_lens_upper_bound_np=seq_lens_upper_bound_np,
    )
    for processor in sampler.logits_processors:
        logits = processor.apply(logits, ctx)
    sampler.thinking_budget_state.apply(logits, ctx)
    return logits


def _contiguous_rows(idx_mapping_np: np.ndarray) -> slice | None:
    """The slice of request-state rows when the batch's requests occupy consecutive states, else None."""
    if idx_mapping_np.size == 0:
        return None
    first = int(idx_mapping_np[0])
    if np.array_equal(idx_mapping_np, np.arange(first, first + idx_mapping_np.size)):
        return slice(first, first + idx_mapping_np.size)
    return None


def verify(
    rejection_sampler, logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping, idx_mapping_np,
    expanded_idx_mapping, expanded_local_pos, seq_lens_upper_bound_np, verify_draft_sampled,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """specdec_ext's ``RejectionSampler._verify`` (same arguments and results as vLLM's)."""
    from vllm.config.model import PROCESSED_LOGPROBS_MODES
    from vllm.v1.worker.gpu.sample.states import NO_LOGPROBS

    sampler = rejection_sampler.sampler
    states = sampler.sampling_states
    num_logits, vocab = logits.shape
    num_reqs = idx_mapping.shape[0]
    width = rejection_sampler.num_speculative_steps + 1

    # Per-request parameters, gathered on the device from vLLM's sampling states (no host sync).
    temperature = states.temperature.gpu[idx_mapping].to(torch.float32)
    top_k = states.top_k.gpu[idx_mapping].to(torch.int64)
    top_k = torch.where(top_k >= vocab, torch.zeros_like(top_k), top_k)  # vLLM writes vocab_size for "off"
    top_p = states.top_p.gpu[idx_mapping].to(torch.float32)
    starts = cu_num_logits[:-1].to(torch.int64)
    counts = cu_num_logits[1:].to(torch.int64) - starts

    # Host-side facts of the batch (numpy mirrors of the same states).
    rows = idx_mapping_np
    sampled_rows = states.temperature.np[rows] != 0.0
    filtered = sampled_rows & ((states.top_k.np[rows] < vocab) | (states.top_p.np[rows] < 1.0))
    uses_min_p = bool(np.any(sampled_rows & (states.min_p.np[rows] != 0.0)))

    # Logits before temperature: raw (no copy) unless a processor or min-p changes them.
    pre = logits
    if _uses_pre_temperature_processing(sampler, rows):
        pre = _pre_temperature_logits(sampler, logits, expanded_idx_mapping, idx_mapping, idx_mapping_np, pos, draft_sampled,
                                      expanded_local_pos, seq_lens_upper_bound_np)
    if uses_min_p:
        pre = verification.mask_min_p(pre, states.temperature.gpu[expanded_idx_mapping], states.min_p.gpu[expanded_idx_mapping])

    uniform = num_logits == num_reqs * width
    target = verification.pad_rows(pre, starts, counts, width, uniform)
    index, real = verification.padded_slots(starts + 1, counts - 1, width - 1, num_logits)
    drafts = torch.where(real, verify_draft_sampled[index], torch.full_like(index, -1))
    drafts, num_draft = verification.drafts_until_placeholder(drafts, counts - 1)

    draft = None
    if draft_logits is not None:
        # Cached per request state: (max_num_reqs, K, Vd), unscaled. A slice when the states are consecutive.
        state_rows = _contiguous_rows(rows)
        draft = draft_logits[state_rows] if state_rows is not None else draft_logits[idx_mapping]
        shared = min(vocab, draft.shape[-1])  # vLLM verifies over the vocabulary both sides have
        target, draft = target[..., :shared], draft[..., :shared]
        if bool(np.any(filtered)):
            target = verification.mask_to_filtered_support(target, temperature, top_k, top_p)
            top_k, top_p = torch.zeros_like(top_k), torch.ones_like(top_p)

    block = verification.Block(
        target, draft, drafts, num_draft, temperature, top_k, top_p,
        seeds=verification.request_keys(states.seeds.gpu[idx_mapping]), offsets=pos[starts].to(torch.int64),
    )
    result = verification.run_verification(block, method="block" if rejection_sampler.use_block_verification else "token")
    sampled = result.tokens
    num_sampled = verification.emitted_counts(result).to(torch.int32)

    logits_for_logprobs = logits
    if sampler.logprobs_mode in PROCESSED_LOGPROBS_MODES and states.max_num_logprobs(rows) != NO_LOGPROBS:
        # Flat row i belongs to request `owner[i]` at its position `expanded_local_pos[i]`.
        owner = torch.searchsorted(cu_num_logits[1:].to(torch.int64), torch.arange(num_logits, device=logits.device), right=True)
        logits_for_logprobs = verification.processed_logits(block, vocab)[owner, expanded_local_pos.to(torch.int64)]
    return logits_for_logprobs, sampled, num_sampled
