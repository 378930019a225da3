"""Statistical proof that ``verify(..., method="block")`` follows the target's law, on every backend.

Chains are drafted from a tiny language whose laws depend on the whole prefix (tests/support/tree_laws.py).
Per-depth chi-square of the emitted tokens against p(. | prefix), chi-square of whole emitted
sequences against the exact enumerated law of block verification, and a deliberately wrong sampler
(the exact law of a wrong variant) that the same per-depth check must reject.
"""

from __future__ import annotations

import pytest
import torch
from support.tree_laws import (
    block_law,
    depth_laws_fail,
    draft_tree_batch,
    expected_accepted,
    language,
    one_hot_language,
    sample_law,
    sequence_law_fails,
)

import specdec_ext
from specdec_ext import available_backends

ROWS = 80_000
K = 3
CHAIN = list(range(-1, K - 1))


def _chains(lang, rows, generator):
    tokens, contexts, draft_contexts = draft_tree_batch(lang, CHAIN, "iid", rows, generator)
    return tokens, contexts, draft_contexts[:, :K]


def _check(lang, wrong_variant, params=None, one_hot=False, seed=0):
    params = params or {}
    law = block_law(lang, K)
    for backend in available_backends("cpu", "verify_block", interpreted=False):
        generator = torch.Generator().manual_seed(seed)
        tokens, target_logits, draft_logits = _chains(lang, ROWS, generator)
        out = specdec_ext.verify(target_logits, None if one_hot else draft_logits, tokens, method="block", generator=generator, backend=backend, **params)
        fails, report = depth_laws_fail(lang, out.tokens, out.num_accepted, K)
        assert not fails, f"{backend}: {report}"
        fails, line = sequence_law_fails(law, out.tokens, out.num_accepted, lang.vocab)
        assert not fails, f"{backend}: whole sequences: {line}"
        # The mean accepted length matches the enumerated expectation (5 standard errors).
        mean, spread = out.num_accepted.double().mean().item(), out.num_accepted.double().std().item()
        assert abs(mean - expected_accepted(law)) < 5 * spread / ROWS**0.5
    wrong = block_law(lang, K, wrong_variant)
    tokens, accepted = sample_law(wrong, ROWS, torch.Generator().manual_seed(seed + 1), K + 1)
    fails, report = depth_laws_fail(lang, tokens, accepted, K)
    assert fails, f"the check could not tell the {wrong_variant} variant apart: {report}"


def test_block_verification_follows_the_target():
    # A language on which the token-wise residual after a joint stop is far off (0.039 in probability).
    _check(language(7, vocab=4, depth=K), "token_residual")


@pytest.mark.parametrize("params", [{"temperature": 0.7}, {"top_k": 3}, {"temperature": 1.4, "top_p": 0.85}],
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_temperature_and_filters(params):
    _check(language(7, vocab=4, depth=K, **params), "target_redraw", params=params)


def test_one_hot_drafts():
    """draft_logits=None: deterministic chains (the draft's mode at each step), q a point mass."""
    _check(one_hot_language(language(8, vocab=4, depth=K)), "target_redraw", one_hot=True)


def test_draft_vocabulary_smaller_than_target():
    _check(language(9, vocab=5, depth=K, draft_vocab=3), "target_redraw")


def test_ragged_lengths():
    lang = language(10, vocab=4, depth=K)
    generator = torch.Generator().manual_seed(11)
    tokens, target_logits, draft_logits = _chains(lang, ROWS, generator)
    num_draft = torch.randint(0, K + 1, (ROWS,), generator=generator)
    for backend in available_backends("cpu", "verify_block", interpreted=False):
        out = specdec_ext.verify(target_logits, draft_logits, tokens, num_draft_tokens=num_draft, method="block", generator=generator, backend=backend)
        assert bool((out.num_accepted <= num_draft).all())
        fails, report = depth_laws_fail(lang, out.tokens, out.num_accepted, K)
        assert not fails, f"{backend}: {report}"


def test_block_accepts_more_than_token_wise_on_the_samplers():
    """On the same drafts, the block sampler's mean accepted length exceeds the token-wise one's by the
    enumerated margin (both within 5 standard errors of their exact expectations)."""
    lang = language(7, vocab=4, depth=K)
    generator = torch.Generator().manual_seed(12)
    tokens, target_logits, draft_logits = _chains(lang, ROWS, generator)
    block = specdec_ext.verify(target_logits, draft_logits, tokens, method="block", generator=generator, backend="eager").num_accepted.double()
    token = specdec_ext.verify(target_logits, draft_logits, tokens, generator=generator, backend="eager").num_accepted.double()
    from support.tree_laws import tree_law

    exact_block, exact_token = expected_accepted(block_law(lang, K)), expected_accepted(tree_law(lang, CHAIN, "iid"))
    assert exact_block > exact_token + 0.1
    for got, exact in ((block, exact_block), (token, exact_token)):
        assert abs(got.mean().item() - exact) < 5 * got.std().item() / ROWS**0.5


def test_greedy_rows_verify_token_by_token():
    g = torch.Generator().manual_seed(13)
    target = torch.randn(64, K + 1, 30, generator=g)
    argmax = target.argmax(-1)
    drafts = torch.where(torch.rand(64, K, generator=g) < 0.7, argmax[:, :K], (argmax[:, :K] + 1) % 30)
    draft_logits = torch.randn(64, K, 30, generator=g)
    for backend in available_backends("cpu", "verify_block", interpreted=False):
        block = specdec_ext.verify(target, draft_logits, drafts, temperature=0.0, method="block", backend=backend)
        token = specdec_ext.verify(target, draft_logits, drafts, temperature=0.0, backend="eager")
        assert torch.equal(block.tokens, token.tokens) and torch.equal(block.num_accepted, token.num_accepted)
