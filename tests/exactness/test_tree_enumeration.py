"""Exact float64 enumeration of tree and block verification over a tiny language.

Every draft tree (or chain) and every accept / reject branch of the literal algorithm is enumerated
(tests/support/tree_laws.py); the round is exact when each emitted token follows the target's law given the
tokens before it. Each algorithm also runs deliberately wrong variants through the same check, which
must reject them, and block verification's expected accepted length is compared with token-wise
verification's exactly.
"""

from __future__ import annotations

import pytest
import torch
from support.tree_laws import block_law, expected_accepted, language, max_violation, tree_law

from specdec_ext.reference_tree import residual_weights

SHAPES = {
    "two_siblings": [-1, -1],
    "three_siblings": [-1, -1, -1],
    "binary_depth_2": [-1, -1, 0, 0, 1],
    "siblings_at_depth_2": [-1, 0, 0, 1],
}
PROCESSING = [
    {},
    {"temperature": 0.7},
    {"top_k": 2},
    {"temperature": 1.3, "top_p": 0.8},
]
EXACT = 1e-12  # float64 rounding of a few hundred products
WRONG = 1e-6  # a wrong variant must break the law by six orders of magnitude more than rounding does


def _languages(params):
    return [language(seed, vocab=3, depth=3, **params) for seed in range(2)]


# i.i.d. siblings under every processing; siblings drawn without replacement under the first two.
SIBLING_CASES = [("iid", params) for params in PROCESSING] + [("without_replacement", params) for params in PROCESSING[:2]]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(("siblings", "params"), SIBLING_CASES,
                         ids=lambda case: case if isinstance(case, str) else ",".join(f"{k}={v}" for k, v in case.items()) or "plain")
def test_siblings_are_exact(shape, siblings, params):
    for lang in _languages(params):
        law = tree_law(lang, SHAPES[shape], siblings)
        assert abs(sum(law.values()) - 1) < EXACT
        assert max_violation(lang, law) < EXACT
        # Testing the second sibling against p instead of the residual left by the first is biased.
        assert max_violation(lang, tree_law(lang, SHAPES[shape], siblings, "reuse_r")) > WRONG


def test_without_replacement_needs_the_renormalised_proposal():
    """Verifying siblings drawn without replacement as if they were i.i.d. is biased."""
    for lang in _languages({}):
        for shape in ("binary_depth_2", "siblings_at_depth_2"):
            assert max_violation(lang, tree_law(lang, SHAPES[shape], "without_replacement", "no_removal")) > WRONG


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_deterministic_siblings_are_exact(shape):
    for lang in _languages({}) + _languages({"top_k": 2}):
        law = tree_law(lang, SHAPES[shape], "deterministic")
        assert abs(sum(law.values()) - 1) < EXACT
        assert max_violation(lang, law) < EXACT
        # Forgetting to remove a rejected sibling from the residual can emit it again: biased.
        assert max_violation(lang, tree_law(lang, SHAPES[shape], "deterministic", "reuse_r")) > WRONG


@pytest.mark.parametrize("length", [1, 2, 3])
@pytest.mark.parametrize("params", PROCESSING, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "plain")
def test_block_verification_is_exact(length, params):
    for lang in _languages(params):
        law = block_law(lang, length)
        assert abs(sum(law.values()) - 1) < EXACT
        assert max_violation(lang, law) < EXACT


@pytest.mark.parametrize("length", [2, 3])
def test_block_verification_needs_its_own_residual(length):
    """After a joint stop at tau, drawing from the token-wise residual max(P - Q, 0) instead of
    max(p_tau P - Q, 0) is biased. (Not on every language: with three tokens the two residuals often
    normalise to the same law; these two languages tell them apart.)"""
    for seed in range(2):
        for params in ({}, {"temperature": 0.7}):
            lang = language(seed, vocab=3, depth=3, **params)
            assert max_violation(lang, block_law(lang, length, "token_residual")) > WRONG


def test_block_accepts_at_least_as_many_tokens_as_token_wise():
    """E[accepted] of block verification >= token-wise verification's, exactly, on every language."""
    gains = []
    for seed in range(6):
        for params in PROCESSING:
            lang = language(seed, vocab=3, depth=3, **params)
            for length in (1, 2, 3):
                block = expected_accepted(block_law(lang, length))
                token = expected_accepted(tree_law(lang, list(range(-1, length - 1)), "iid"))
                assert block >= token - EXACT, (seed, params, length, block, token)
                if length == 1:
                    assert block == pytest.approx(token, abs=EXACT)  # one draft: the two coincide
                gains.append(block - token)
    assert max(gains) > 1e-2  # and strictly more where it can


def test_paper_example_eleven_ninths():
    """Sun et al.'s example: target (1/3, 2/3), draft (2/3, 1/3) at every prefix, two drafts:
    token-wise verification accepts 10/9 drafts in expectation, block verification 11/9."""
    lang = language(0, vocab=2, depth=2)
    lang.p[:] = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)
    lang.q[:] = torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)
    assert expected_accepted(tree_law(lang, [-1, 0], "iid")) == pytest.approx(10 / 9, abs=EXACT)
    assert expected_accepted(block_law(lang, 2)) == pytest.approx(11 / 9, abs=EXACT)
    assert max_violation(lang, block_law(lang, 2)) < EXACT


def test_more_siblings_accept_more():
    """A second i.i.d. sibling never lowers the chance of entering a child (a sanity check on the laws)."""
    for lang in _languages({}):
        one = expected_accepted(tree_law(lang, [-1], "iid"))
        two = expected_accepted(tree_law(lang, [-1, -1], "iid"))
        three = expected_accepted(tree_law(lang, [-1, -1, -1], "without_replacement"))
        assert one <= two + EXACT <= three + 2 * EXACT


@pytest.mark.parametrize("mode", ["iid", "without_replacement", "deterministic"])
def test_closed_form_residual_matches_the_recursion(mode):
    """The backends keep a residual as (c, S, Z, M) scalars: w = max(p - c q, 0) [y not in S]. In float64,
    after any sequence of rejectable siblings, w / Z equals the literal norm(max(r - q', 0)) recursion."""
    g = torch.Generator().manual_seed(3)
    vocab = 9
    checked = 0
    for _ in range(200):
        p = torch.rand(vocab, generator=g, dtype=torch.float64) ** 3
        p /= p.sum()
        q = torch.rand(vocab, generator=g, dtype=torch.float64) ** 3
        q /= q.sum()
        r = p.clone()
        scale, mass, draft_mass = torch.zeros(1, dtype=torch.float64), 1.0, 1.0
        removed = torch.zeros(1, vocab, dtype=torch.bool)
        for _sibling in range(4):
            if mode == "deterministic":
                proposal = torch.zeros(vocab, dtype=torch.float64)
                candidates = (r < 1).nonzero()[:, 0]
                x = int(candidates[torch.randint(len(candidates), (1,), generator=g)])
                proposal[x] = 1.0
            else:
                proposal = q.clone()
                if mode == "without_replacement":
                    proposal[removed[0]] = 0
                    proposal /= proposal.sum()
                rejectable = ((r < proposal) & (proposal > 0)).nonzero()[:, 0]
                if not len(rejectable):
                    break
                x = int(rejectable[torch.randint(len(rejectable), (1,), generator=g)])
            residual = (r - proposal).clamp(min=0)
            if residual.sum() <= 0:
                break
            r = residual / residual.sum()
            # The closed-form update (reference_tree's docstring).
            if mode != "deterministic":
                scale = scale + mass / draft_mass
            if mode != "iid":
                removed[0, x] = True
            if mode == "without_replacement":
                draft_mass = float(torch.where(removed[0], 0.0, q).sum())
            w = residual_weights(p[None], None if mode == "deterministic" else q[None], scale, None if mode == "iid" else removed)[0]
            mass = float(w.sum())
            torch.testing.assert_close(w / mass, r, rtol=1e-9, atol=1e-12)
            checked += 1
    assert checked > 300
