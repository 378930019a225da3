"""Property-based tests: random shapes and extreme logits never give an out-of-range id, and the
output layout is always the accepted prefix, one emitted token, then -1."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.strategies import extreme_verify_inputs
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

import specdec_ext
from specdec_ext.reference import process_lines


def _check_layout(out, tokens, num_draft, vocab):
    batch, k_plus_1 = out.tokens.shape
    for b in range(batch):
        n = int(out.num_accepted[b])
        assert 0 <= n <= int(num_draft[b])
        assert torch.equal(out.tokens[b, :n], tokens[b, :n].long())
        assert 0 <= int(out.tokens[b, n]) < vocab
        assert (out.tokens[b, n + 1 :] == -1).all()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(extreme_verify_inputs())
def test_eager_layout_and_range(inputs):
    target, draft, tokens, params, seed = inputs
    for backend in [b for b in specdec_ext.available_backends("cpu") if b != "triton"]:
        out = specdec_ext.verify(target, draft, tokens, backend=backend, generator=torch.Generator().manual_seed(seed), **params)
        _check_layout(out, tokens, params["num_draft_tokens"], target.shape[-1])


@pytest.mark.skipif("triton" not in specdec_ext.available_backends("cpu"), reason="triton is not installed")
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(extreme_verify_inputs(max_vocab=24))
def test_triton_matches_eager_on_extreme_inputs(inputs):
    _triton_matches_eager(inputs)


@pytest.mark.slow  # (more examples: CI's slow step)
@pytest.mark.skipif("triton" not in specdec_ext.available_backends("cpu"), reason="triton is not installed")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(extreme_verify_inputs(max_vocab=24))
def test_triton_matches_eager_on_more_extreme_inputs(inputs):
    _triton_matches_eager(inputs)


def _triton_matches_eager(inputs):
    target, draft, tokens, params, seed = inputs
    outs = []
    for backend in ("triton", "eager"):
        outs.append(specdec_ext.verify(target, draft, tokens, backend=backend, generator=torch.Generator().manual_seed(seed), **params))
    _check_layout(outs[0], tokens, params["num_draft_tokens"], target.shape[-1])
    assert torch.equal(outs[0].tokens, outs[1].tokens) and torch.equal(outs[0].num_accepted, outs[1].num_accepted)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 60), st.integers(0, 70), st.sampled_from([None, 0.1, 0.5, 0.9, 0.99]), st.integers(0, 2**31 - 1), st.booleans())
def test_filters_keep_what_transformers_keeps(vocab, top_k, top_p, seed, coarse):
    """Our thresholds select the same set as TopK then TopP warpers (no ties at the cut-off)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, vocab, generator=g) * (4 if coarse else 1)
    scores = logits.clone()
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None:
        scores = TopPLogitsWarper(top_p)(None, scores)
    lines = process_lines(logits, torch.ones(3), torch.full((3,), top_k), torch.full((3,), top_p or 1.0))
    ours = lines.scaled >= lines.threshold[:, None]
    theirs = scores > float("-inf")
    # Exact float ties at the cut-off are ordered arbitrarily by a sort; we keep them together.
    assert torch.equal(ours, theirs) or bool((logits.unsqueeze(-1) == logits.unsqueeze(-2)).sum() > 3 * vocab)
