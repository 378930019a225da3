"""vLLM's own objects, built on CPU for the plugin's tests: Model Runner V2's sampler, sampling states,
rejection sampler and input batch, and V1's ``SpecDecodeMetadata`` / ``SamplingMetadata``.

Where vLLM's code needs a GPU the stand-ins are vLLM's own fallbacks: its UVA buffers (pinned host memory,
which needs a driver) fall back to ``NonUvaBuffer``; the drafts and positions that V2's ``__call__`` gathers
with a Triton kernel are gathered here with the same indices (vLLM's Triton is disabled without a GPU).
"""

from __future__ import annotations

import contextlib
import logging
from typing import NamedTuple

import numpy as np
import torch

CPU = torch.device("cpu")


@contextlib.contextmanager
def _without_pinned_memory():
    import vllm.v1.worker.gpu.buffer_utils as buffer_utils

    saved = buffer_utils.is_uva_available
    buffer_utils.is_uva_available = lambda: False
    try:
        yield
    finally:
        buffer_utils.is_uva_available = saved


@contextlib.contextmanager
def plugin_log():
    """The plugin's log records (vLLM's logger tree does not propagate to the root logger pytest captures)."""
    from specdec_ext.integrations.vllm import LOGGER_NAME

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler, log = Keep(level=logging.INFO), logging.getLogger(LOGGER_NAME)
    saved = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield records
    finally:
        log.removeHandler(handler)
        log.setLevel(saved)


def v2_rejection_sampler(max_num_reqs: int, vocab: int, num_speculative_tokens: int, *, method: str = "standard",
                         logprobs_mode: str = "raw_logprobs", custom_logits_processors=()):
    """(RejectionSampler, Sampler) of Model Runner V2, as the runner builds them."""
    from vllm.config import SpeculativeConfig, VllmConfig
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler
    from vllm.v1.worker.gpu.states import RequestState

    with _without_pinned_memory():
        config = VllmConfig()
        request_state = RequestState(max_num_reqs, 64, max_num_reqs * (num_speculative_tokens + 1), num_speculative_tokens, vocab, CPU)
        sampler = Sampler(config, max_num_reqs, vocab, CPU, request_state, logprobs_mode=logprobs_mode,
                          num_speculative_tokens=num_speculative_tokens, custom_logits_processors=custom_logits_processors)
        speculative = SpeculativeConfig(method="ngram", num_speculative_tokens=num_speculative_tokens, prompt_lookup_max=3,
                                        prompt_lookup_min=1, rejection_sample_method=method)
        return RejectionSampler(sampler, speculative, CPU), sampler


def v2_add_requests(sampler, state_indices, params) -> None:
    with _without_pinned_memory():
        for index, sampling_params in zip(state_indices, params, strict=True):
            sampler.add_request(int(index), sampling_params)
        sampler.sampling_states.apply_staged_writes()


class V2Step(NamedTuple):
    input_batch: object  # vllm.v1.worker.gpu.input_batch.InputBatch
    draft_sampled: torch.Tensor  # (num_logits,) the input id at each logits row (drafts at rows 1..n of a request)
    pos: torch.Tensor  # (num_logits,) int64 positions


def v2_step(state_indices, drafts: list[list[int]], positions: list[int]) -> V2Step:
    """A decode step's ``InputBatch``: request b (request state ``state_indices[b]``) feeds its last token and
    its drafts, one logits row each, at positions ``positions[b]``, ``positions[b] + 1``, ..."""
    from vllm.v1.worker.gpu.input_batch import InputBatch

    num_reqs = len(drafts)
    rows = np.array([len(d) + 1 for d in drafts], dtype=np.int32)
    cu = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(rows, out=cu[1:])
    num_logits = int(cu[-1])
    input_ids = torch.tensor([t for d in drafts for t in [0, *d]], dtype=torch.int32)
    pos = torch.tensor([p + i for p, d in zip(positions, drafts, strict=True) for i in range(len(d) + 1)], dtype=torch.int64)
    idx_np = np.asarray(state_indices, dtype=np.intp)
    seq_lens = torch.from_numpy(np.asarray(positions, dtype=np.int32) + rows)
    batch = InputBatch(
        req_ids=[f"req-{i}" for i in idx_np], num_reqs=num_reqs, num_reqs_after_padding=num_reqs,
        idx_mapping=torch.from_numpy(idx_np.astype(np.int64)), idx_mapping_np=idx_np,
        expanded_idx_mapping=torch.from_numpy(np.repeat(idx_np, rows).astype(np.int64)),
        expanded_local_pos=torch.from_numpy(np.concatenate([np.arange(r, dtype=np.int32) for r in rows])),
        num_scheduled_tokens=rows, num_tokens=num_logits, num_tokens_after_padding=num_logits,
        num_draft_tokens=int(rows.sum() - num_reqs), num_draft_tokens_per_req=rows - 1,
        query_start_loc=torch.from_numpy(cu), query_start_loc_np=cu, seq_lens=seq_lens, seq_lens_cpu_upper_bound=seq_lens.clone(),
        dcp_local_seq_lens=None, num_computed_tokens_np=np.asarray(positions, dtype=np.int32), prefill_len_np=np.ones(num_reqs, dtype=np.int32),
        num_computed_prefill_tokens_np=np.ones(num_reqs, dtype=np.int32), is_prefilling_np=np.zeros(num_reqs, dtype=np.bool_),
        has_prefill=False, decode_graph_eligible=False, input_ids=input_ids, positions=pos.clone(),
        is_padding=torch.zeros(num_logits, dtype=torch.bool), logits_indices=torch.arange(num_logits, dtype=torch.int64),
        cu_num_logits=torch.from_numpy(cu), cu_num_logits_np=cu, has_structured_output_reqs=False, prompt_lens=None,
    )
    # What RejectionSampler.__call__'s gather_draft_sampled computes (no placeholders in a decode-only step).
    return V2Step(batch, input_ids[batch.logits_indices].to(torch.int64), pos[batch.logits_indices])


def v2_verify(rejection_sampler, step: V2Step, logits: torch.Tensor, draft_logits: torch.Tensor | None = None):
    """vLLM's own chunked verification of a step (``_verify_in_chunks``, which calls ``_verify``):
    returns (sampled (num_reqs, K+1), num_sampled (num_reqs,))."""
    from vllm.v1.worker.gpu.sample.states import NO_LOGPROBS
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import get_max_chunk_logits

    sampled, num_sampled, _, _ = rejection_sampler._verify_in_chunks(
        logits, step.input_batch, draft_logits, step.draft_sampled, step.pos, get_max_chunk_logits(logits.shape[1]), NO_LOGPROBS,
    )
    return sampled, num_sampled


def v2_verify_once(rejection_sampler, step: V2Step, logits: torch.Tensor, draft_logits: torch.Tensor | None = None):
    """One ``_verify`` call on the whole step: (logits for logprobs, sampled, num_sampled)."""
    batch = step.input_batch
    return rejection_sampler._verify(
        logits, draft_logits, step.draft_sampled, step.pos, batch.cu_num_logits, batch.idx_mapping, batch.idx_mapping_np,
        batch.expanded_idx_mapping, batch.expanded_local_pos, batch.seq_lens_cpu_upper_bound.numpy(), step.draft_sampled,
    )


def v1_spec_metadata(drafts: list[list[int]]):
    """V1's ``SpecDecodeMetadata`` for requests whose logits rows are their drafts' rows then their bonus row."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    num_draft = [len(d) for d in drafts]
    target_rows, bonus_rows, row = [], [], 0
    for n in num_draft:
        target_rows += list(range(row, row + n))
        bonus_rows.append(row + n)
        row += n + 1
    return SpecDecodeMetadata(
        draft_token_ids=torch.tensor([t for d in drafts for t in d], dtype=torch.int32), num_draft_tokens=num_draft,
        cu_num_draft_tokens=torch.tensor(np.cumsum(num_draft), dtype=torch.int32),
        cu_num_sampled_tokens=torch.tensor(np.cumsum([n + 1 for n in num_draft]), dtype=torch.int32),
        target_logits_indices=torch.tensor(target_rows, dtype=torch.int32), bonus_logits_indices=torch.tensor(bonus_rows, dtype=torch.int32),
        logits_indices=torch.arange(row, dtype=torch.int32),
    )


def v1_sampling_metadata(temperature: list[float], *, top_k: list[int] | None = None, top_p: list[float] | None = None,
                         generators: dict[int, torch.Generator] | None = None, max_num_logprobs: int | None = None, logitsprocs=None):
    """V1's ``SamplingMetadata`` of a batch without penalties (what the V1 input batch builds)."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    batch = len(temperature)
    temps = torch.tensor(temperature, dtype=torch.float32)
    return SamplingMetadata(
        temperature=temps, all_greedy=bool((temps == 0).all()), all_random=bool((temps > 0).all()),
        top_p=None if top_p is None else torch.tensor(top_p, dtype=torch.float32),
        top_k=None if top_k is None else torch.tensor(top_k, dtype=torch.int32),
        generators=generators or {}, max_num_logprobs=max_num_logprobs, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch), repetition_penalties=torch.ones(batch),
        output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=logitsprocs or LogitsProcessors(),
    )


def v1_rejection_sampler(logprobs_mode: str = "raw_logprobs"):
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    return RejectionSampler(Sampler(logprobs_mode=logprobs_mode))
