"""Statistical proof that verify's output follows the processed target law.

Each scenario runs the real backends (must pass) and a deliberately wrong sampler (must fail)
through the same per-position chi-square check, whose threshold a correct sampler exceeds with
probability 1e-6.
"""

from __future__ import annotations

import pytest
import torch
from conftest import cpu_backends
from support.laws import naive_verify, position_laws_fail, processed_probs

import specdec_ext


def _draw(probs: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """(n, K) independent draws, position k from probs[k] ((K, V))."""
    k = probs.shape[0]
    if k == 0:
        return torch.empty((n, 0), dtype=torch.int64)
    return torch.stack([torch.multinomial(probs[i], n, replacement=True, generator=generator) for i in range(k)], dim=1)


def _scenario(target_logits, draft_logits, n, seed, params=None, num_draft=None, drafts=None):
    """Run every CPU backend and the naive sampler on n identical rows; return {name: (fails, report)}."""
    params = params or {}
    generator = torch.Generator().manual_seed(seed)
    k = target_logits.shape[0] - 1
    vocab = target_logits.shape[1]
    p = processed_probs(target_logits, **params)
    if draft_logits is not None:
        q_small = processed_probs(draft_logits, **params)
        q = torch.zeros(k, vocab)
        q[:, : q_small.shape[1]] = q_small
        drafts = _draw(q_small, n, generator)
    else:
        q = torch.nn.functional.one_hot(drafts[0], vocab).float() if drafts is not None else None
    drafts = drafts if drafts.shape[0] == n else drafts.expand(n, k)
    target = target_logits.expand(n, -1, -1)
    draft = draft_logits.expand(n, -1, -1) if draft_logits is not None else None
    results = {}
    for backend in cpu_backends():
        out = specdec_ext.verify(target, draft, drafts, num_draft_tokens=num_draft, generator=generator, backend=backend, **params)
        results[backend] = position_laws_fail(out.tokens, out.num_accepted, p, num_draft)
    if num_draft is None:
        q_rows = q.expand(n, -1, -1) if draft_logits is not None or q.dim() == 2 else q
        wrong = naive_verify(p.expand(n, -1, -1).double(), q_rows.double(), drafts, generator)
        results["naive-redraw"] = position_laws_fail(*wrong, p)
    return results


def _assert_exact(results):
    for name, (fails, report) in results.items():
        if name == "naive-redraw":
            assert fails, f"the check could not tell the naive redraw apart: {report}"
        else:
            assert not fails, f"{name}: {report}"


def test_seed_document_example():
    """Target A .6 / B .4, draft A .8 / B .2: acceptance .8, residual always B, final .6 / .4."""
    target = torch.tensor([[0.6, 0.4], [0.5, 0.5]]).log()  # position 1 is the bonus position
    draft = torch.tensor([[0.8, 0.2]]).log()
    n = 200_000
    for backend in cpu_backends():
        generator = torch.Generator().manual_seed(1)
        drafts = torch.multinomial(torch.tensor([0.8, 0.2]), n, replacement=True, generator=generator)[:, None]
        out = specdec_ext.verify(target.expand(n, -1, -1), draft.expand(n, -1, -1), drafts, generator=generator, backend=backend)
        accepted = out.num_accepted == 1
        assert abs(accepted.double().mean().item() - 0.8) < 5 * (0.8 * 0.2 / n) ** 0.5
        assert (out.tokens[~accepted, 0] == 1).all(), "after a rejection the residual must always give B"
        assert (drafts[~accepted, 0] == 0).all(), "only A proposals can be rejected"
        fails, report = position_laws_fail(out.tokens[:, :1], torch.zeros(n, dtype=torch.int64), torch.tensor([[0.6, 0.4]]))
        assert not fails, report
        share_a = (out.tokens[:, 0] == 0).double().mean().item()
        assert abs(share_a - 0.6) < 0.005
    # The naive variant (redraw from the target after a rejection) gives A .72 / B .28 and fails.
    generator = torch.Generator().manual_seed(2)
    drafts = torch.multinomial(torch.tensor([0.8, 0.2]), n, replacement=True, generator=generator)[:, None]
    p = torch.tensor([[0.6, 0.4], [0.5, 0.5]]).expand(n, -1, -1).double()
    q = torch.tensor([[0.8, 0.2]]).expand(n, -1, -1).double()
    tokens, _ = naive_verify(p, q, drafts, generator)
    share_a = (tokens[:, 0] == 0).double().mean().item()
    assert abs(share_a - 0.72) < 0.005
    fails, _ = position_laws_fail(tokens[:, :1], torch.zeros(n, dtype=torch.int64), torch.tensor([[0.6, 0.4]]))
    assert fails


def test_random_p_and_q():
    g = torch.Generator().manual_seed(3)
    target = torch.randn(4, 24, generator=g) * 1.5
    draft = target[:3] + torch.randn(3, 24, generator=g)
    _assert_exact(_scenario(target, draft, 100_000, seed=4))


def test_adversarial_negated_draft():
    """Draft logits = negated target logits: most drafts rejected, residual does nearly all the work."""
    g = torch.Generator().manual_seed(5)
    target = torch.randn(3, 16, generator=g) * 2
    draft = -target[:2]
    _assert_exact(_scenario(target, draft, 200_000, seed=6))


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 0.6},
        {"temperature": 1.7},
        {"top_k": 5},
        {"top_p": 0.7},
        {"temperature": 0.8, "top_k": 9, "top_p": 0.85},
    ],
    ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()),
)
def test_temperature_and_filters(params):
    g = torch.Generator().manual_seed(7)
    target = torch.randn(3, 20, generator=g) * 2
    draft = target[:2] + torch.randn(2, 20, generator=g)
    _assert_exact(_scenario(target, draft, 100_000, seed=8, params=params))


def test_q_must_be_the_distribution_the_drafts_came_from():
    """Drafts sampled at temperature 3 but verified as if at temperature 1 (the processing applied
    on one side only) lose exactness, and the same check sees it."""
    g = torch.Generator().manual_seed(9)
    target = torch.randn(2, 12, generator=g) * 2
    draft = target[:1].clone()
    n = 100_000
    generator = torch.Generator().manual_seed(10)
    drafts = torch.multinomial(processed_probs(draft, temperature=3.0)[0], n, replacement=True, generator=generator)[:, None]
    p = processed_probs(target)
    out = specdec_ext.verify(target.expand(n, -1, -1), draft.expand(n, -1, -1), drafts, generator=generator, backend="eager")
    fails, report = position_laws_fail(out.tokens, out.num_accepted, p)
    assert fails, report


def test_one_hot_drafts():
    """draft_logits=None: deterministic drafts (n-gram / prompt lookup), q is one-hot."""
    g = torch.Generator().manual_seed(11)
    target = torch.randn(4, 10, generator=g)
    drafts = torch.tensor([[int(target[0].argmax()), 3, 7]])
    _assert_exact(_scenario(target, None, 100_000, seed=12, drafts=drafts))


def test_ragged_lengths():
    g = torch.Generator().manual_seed(13)
    target = torch.randn(4, 12, generator=g)
    draft = target[:3] * 0.5 + torch.randn(3, 12, generator=g)
    n = 120_000
    num_draft = torch.randint(0, 4, (n,), generator=g)
    results = _scenario(target, draft, n, seed=14, num_draft=num_draft)
    _assert_exact(results)


def test_draft_vocabulary_smaller_than_target():
    g = torch.Generator().manual_seed(15)
    target = torch.randn(3, 20, generator=g)
    draft = target[:2, :14] + torch.randn(2, 14, generator=g) * 0.5
    _assert_exact(_scenario(target, draft, 100_000, seed=16))


def test_greedy_rows_follow_the_argmax():
    g = torch.Generator().manual_seed(17)
    target = torch.randn(64, 4, 30, generator=g)
    target[0, 0, 5] = target[0, 0, 7] = target[0, 0].max() + 1  # a tie: the lowest index wins
    argmax = target.argmax(-1)
    drafts = torch.where(torch.rand(64, 3, generator=g) < 0.7, argmax[:, :3], (argmax[:, :3] + 1) % 30)
    draft = torch.randn(64, 3, 30, generator=g)
    for backend in specdec_ext.available_backends("cpu"):
        n = 16 if backend == "triton" else 64  # (the interpreter is slow; row 0 holds the tie)
        out = specdec_ext.verify(target[:n], draft[:n], drafts[:n], temperature=0.0, backend=backend)
        match = (drafts[:n] == argmax[:n, :3]).long().cumprod(1).sum(1)
        assert torch.equal(out.num_accepted, match)
        rows = torch.arange(n)
        assert torch.equal(out.tokens[rows, match], argmax[rows, match])
