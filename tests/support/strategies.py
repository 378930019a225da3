"""Hypothesis strategy shared by the backends' property tests: random shapes and extreme logits."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

STYLES = ["normal", "huge", "masked", "single", "ties"]


@st.composite
def extreme_verify_inputs(draw, max_vocab: int = 40, huge: float = 1e4, dtypes=(torch.float32,)):
    """(target, draft or None, tokens, params, seed) for one verify call.

    Styles: plain normal logits, logits scaled to +-``huge``, 70% of entries masked to -inf, a single
    finite entry per line, and rounded logits full of exact ties.
    """
    batch, k = draw(st.integers(1, 4)), draw(st.integers(0, 4))
    vocab = draw(st.integers(1, max_vocab))
    draft_vocab = draw(st.integers(1, vocab))
    seed = draw(st.integers(0, 2**31 - 1))
    style = draw(st.sampled_from(STYLES))
    dtype = draw(st.sampled_from(list(dtypes)))
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, k + 1, vocab, generator=g)
    draft = torch.randn(batch, k, draft_vocab, generator=g)
    if style == "huge":
        target, draft = target * huge, draft * huge
    elif style == "masked":
        target = target.masked_fill(torch.rand(target.shape, generator=g) < 0.7, float("-inf"))
        draft = draft.masked_fill(torch.rand(draft.shape, generator=g) < 0.7, float("-inf"))
        target[..., 0] = 0.0  # keep every line non-empty
        draft[..., 0] = 0.0
    elif style == "single":
        target = torch.full_like(target, float("-inf"))
        target[..., vocab - 1] = 3.0
        draft = torch.full_like(draft, float("-inf"))
        draft[..., 0] = 1.0
    elif style == "ties":
        target, draft = target.round(), draft.round()
    params = {
        "temperature": draw(st.sampled_from([0.0, 0.3, 1.0, 2.0])),
        "top_k": draw(st.sampled_from([None, 1, 3, 1000])),
        "top_p": draw(st.sampled_from([None, 0.05, 0.5, 1.0])),
        "num_draft_tokens": torch.randint(0, k + 1, (batch,), generator=g),
    }
    tokens = torch.randint(0, draft_vocab, (batch, k), generator=g)
    one_hot = draw(st.booleans())
    return target.to(dtype), None if one_hot else draft.to(dtype), tokens, params, seed
