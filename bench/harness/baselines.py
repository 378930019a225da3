"""The calls every benchmark times: specdec_ext's (any backend, the eager reference included) and
transformers' own verification and sampling steps they are measured against.

Each function prepares what does not belong to the timed work and returns a no-argument callable.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable


def warpers(params: dict):
    """transformers' own warpers, in the order its generation config applies them."""
    from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    return LogitsProcessorList([TemperatureLogitsWarper(params["temperature"]), TopKLogitsWarper(params["top_k"]), TopPLogitsWarper(params["top_p"])])


def verify_call(backend: str, target, draft, drafts, **options) -> Callable[[], object]:
    """``specdec_ext.verify`` on one backend (``"eager"``: the reference); ``options`` go to the call."""
    import specdec_ext

    return lambda: specdec_ext.verify(target, draft, drafts, backend=backend, **options)


def sample_call(backend: str, logits, **options) -> Callable[[], object]:
    """``specdec_ext.sample`` on one backend; ``options`` go to the call."""
    import specdec_ext

    return lambda: specdec_ext.sample(logits, backend=backend, **options)


def transformers_verify(target, draft, drafts, params: dict | None = None) -> Callable[[], object]:
    """What transformers' assisted decoding does per verification, one row at a time.

    ``_speculative_sampling`` takes batch 1, so B > 1 loops over rows. As in ``_assisted_decoding``,
    the target logits are cast to float32 and each position runs through the logits processors
    (``params``: temperature, top_k, top_p; none when empty); the draft logits get the same
    processing (the assistant applies it while drafting, and specdec_ext does it inside ``verify``),
    so both sides start from the same raw logits.
    """
    import torch
    from transformers.generation.utils import _speculative_sampling

    # Older transformers releases take a required is_done_candidate (False = plain verification).
    done = {"is_done_candidate": False} if "is_done_candidate" in inspect.signature(_speculative_sampling).parameters else {}
    batch, k_plus_1, _ = target.shape
    k = k_plus_1 - 1
    # A one-token prompt, then the K drafts: only the last K ids are read.
    ids = torch.cat([torch.zeros_like(drafts[:, :1]), drafts], dim=1)
    warp = warpers(params) if params else None

    def as_float32(logits: torch.Tensor) -> torch.Tensor:
        return logits if logits.dtype == torch.float32 else logits.to(torch.float32)

    def process(logits: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(logits)
        for i in range(logits.shape[1]):
            out[:, i, :] = warp(row_ids[:, : 1 + i], logits[:, i, :])
        return out

    def call():
        results = []
        for b in range(batch):
            row_ids = ids[b : b + 1]
            new_logits = as_float32(target[b : b + 1])
            candidate_logits = as_float32(draft[b : b + 1])
            if warp is not None:
                new_logits = process(new_logits, row_ids)
                candidate_logits = process(candidate_logits, row_ids)
            results.append(_speculative_sampling(row_ids, candidate_logits, k, new_logits, **done))
        return results

    return call


def multinomial_sample(logits, params: dict | None = None) -> Callable[[], object]:
    """transformers' sampling step: processors, softmax, ``torch.multinomial``."""
    import torch

    warp = warpers(params) if params else None
    no_ids = torch.zeros((logits.shape[0], 1), dtype=torch.long, device=logits.device)

    def call():
        scores = logits.to(torch.float32)
        if warp is not None:
            scores = warp(no_ids, scores)
        return torch.multinomial(scores.softmax(dim=-1), num_samples=1)

    return call
