"""Property-based tests of the whole-line top-k / top-p search (select.py, thresholds.py): random
line families, dtypes, temperatures, filters and launch geometries that force each way of the
search (key bins, value bins, gathers, raw-key passes, sampled starts, the statistics' windows).
Every cut is the eager reference's exactly, and a whole call gives its tokens.

The geometries keep 16 candidates a line and 128-value chunks, so that lines of a few thousand
values leave the candidates and split across many search items, as a serving vocabulary does."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_triton_identity import _args, _keys, _reference_thresholds, _triton_thresholds, assert_same

import specdec_ext
from specdec_ext import _params, _triton_backend
from specdec_ext.reference import verify_eager

pytestmark = pytest.mark.skipif("triton" not in specdec_ext.available_backends("cpu"), reason="triton is not installed")

# Line families: each makes the search take another way (flat lines leave top-p to the whole line,
# ties and a coarse grid put many values at a cut, -inf masks leave fewer finite values than k,
# huge values saturate the weights, signed zeros and equal maxima test the order keys).
FAMILIES = ("normal", "flat", "grid", "masked", "sparse", "huge", "zeros", "equal maxima")


@st.composite
def searched_lines(draw):
    """(target logits (batch, positions, vocab), verify parameters, geometry, seed)."""
    batch, positions = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    vocab = draw(st.sampled_from([200, 600, 1500, 3000]))
    family = draw(st.sampled_from(FAMILIES))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    spread = draw(st.sampled_from([0.05, 0.3, 1.0, 3.0]))
    values = spread * torch.randn(batch, positions, vocab, generator=g)
    if family == "flat":
        values = 0.02 * values
    elif family == "grid":
        values = torch.round(values * 4) / 4
    elif family == "masked":
        values = values.masked_fill(torch.rand(values.shape, generator=g) < 0.5, float("-inf"))
    elif family == "sparse":
        values = values.masked_fill(torch.rand(values.shape, generator=g) < 0.98, float("-inf"))
        values[..., 0] = 0.0  # every line keeps a finite value
    elif family == "huge":
        values = values / spread * 5e3  # (inside fp16's range: a line with +inf values has no cut, its row is blanked)
    elif family == "zeros":
        values = torch.where(values > 0, values, torch.where(torch.rand(values.shape, generator=g) < 0.5, -0.0, 0.0))
    elif family == "equal maxima":
        values[..., : vocab // 3] = values.max()
    top_k = draw(st.sampled_from([None, 1, 7, 40, vocab // 3, vocab - 1, vocab + 5]))
    top_p = draw(st.sampled_from([None, 0.05, 0.5, 0.9, 0.99] if top_k else [0.05, 0.5, 0.9, 0.99]))  # (a filtered call)
    temperature = draw(st.sampled_from([0.3, 0.7, 1.0, 2.0]))
    geometry = {
        "stats_tile": 256, "stats_parts": draw(st.sampled_from([1, 2])), "line_slots": 16, "sort": 16, "select_chunk": 128,
        "select_gather": draw(st.sampled_from([16, 64, 512])),
        "sample_runs": draw(st.sampled_from([0, 2, 4])),
        "key_window": draw(st.booleans()),
        "top_p_window": draw(st.booleans()),
        "histogram_top_k": draw(st.sampled_from([None, 16])),
        "digit_select": draw(st.booleans()),
    }
    params = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    return values.to(dtype), params, {name: value for name, value in geometry.items() if value is not None}, seed


def _check_cuts(target, params, geometry):
    tokens = torch.zeros(target.shape[0], target.shape[1] - 1, dtype=torch.int64)
    args = _params.validate_verify(target, None, tokens, generator=None, check=False, num_draft_tokens=None, **params)
    got, _ = _triton_thresholds(args, **geometry)
    expected = _reference_thresholds(args)
    assert torch.equal(got, expected), f"{got.tolist()} != {expected.tolist()}"


def _check_tokens(target, params, geometry, seed):
    """The whole call with a draft line per position (the target's neighbour), token for token, and
    a block verification's (whose cut-offs take the same search)."""
    from specdec_ext import _triton_tree
    from specdec_ext.reference_tree import verify_block_eager

    batch, positions, vocab = target.shape
    if positions < 2:
        return
    draft = target[:, 1:].roll(1, 0)
    tokens = torch.randint(0, vocab, (batch, positions - 1), generator=torch.Generator().manual_seed(seed))
    seeds, offsets = _keys(batch, seed % 1000)
    args = _args(target, draft, tokens, seeds=seeds, offsets=offsets, return_accept_probs=True, **params)
    assert_same(_triton_backend.verify(args, 3, **geometry), verify_eager(args, 3))
    block = _args(target, draft, tokens, seeds=seeds, offsets=offsets, **params)
    fused, eager = _triton_tree.verify_block(block, 3, **geometry), verify_block_eager(block, 3)
    assert torch.equal(fused[0], eager[0]) and torch.equal(fused[1], eager[1])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(searched_lines())
def test_searched_cuts_are_the_references(case):
    target, params, geometry, seed = case
    _check_cuts(target, params, geometry)


@pytest.mark.slow  # (many more examples, and whole calls: CI's slow step)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(searched_lines())
def test_searched_cuts_and_tokens_are_the_references(case):
    target, params, geometry, seed = case
    _check_cuts(target, params, geometry)
    _check_tokens(target, params, geometry, seed)
