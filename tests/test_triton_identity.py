"""Same seed, same tokens: the fused Triton kernels (interpreted on CPU) against the eager reference."""

from __future__ import annotations

import pytest
import torch

import specdec_ext
from specdec_ext import _params, _triton_backend
from specdec_ext.reference import verify_eager

pytestmark = pytest.mark.skipif("triton" not in specdec_ext.available_backends("cpu"), reason="triton is not installed")


def _case(batch, k, vocab, dtype, seed, draft_vocab=None, noise=1.0):
    g = torch.Generator().manual_seed(seed)
    draft_vocab = draft_vocab or vocab
    target = (torch.randn(batch, k + 1, vocab, generator=g) * 2).to(dtype)
    draft = (target[:, :k, :draft_vocab].float() + noise * torch.randn(batch, k, draft_vocab, generator=g)).to(dtype)
    probs = draft.float().softmax(-1).reshape(batch * k, draft_vocab) if k else None
    tokens = torch.multinomial(probs, 1, generator=g).reshape(batch, k) if k else torch.empty(batch, 0, dtype=torch.int64)
    return target, draft, tokens


def _both(target, draft, tokens, seed=123, **kw):
    outs = []
    for backend in ("triton", "eager"):
        out = specdec_ext.verify(target, draft, tokens, generator=torch.Generator().manual_seed(seed), backend=backend, **kw)
        outs.append(out)
    (a, b) = outs
    assert torch.equal(a.tokens, b.tokens), f"tokens differ:\n{a.tokens}\n{b.tokens}"
    assert torch.equal(a.num_accepted, b.num_accepted)
    return a


@pytest.mark.parametrize("vocab", [2, 1000, 32000, 50257, 128256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_identity_over_vocabularies_and_dtypes(vocab, dtype):
    batch, k = (3, 3) if vocab <= 32000 else (2, 2)
    target, draft, tokens = _case(batch, k, vocab, dtype, seed=vocab % 97, noise=0.3)
    _both(target, draft, tokens)


def test_identity_greedy_and_mixed_rows():
    target, draft, tokens = _case(4, 4, 3000, torch.float32, seed=1, noise=0.05)
    tokens[0] = target[0, :4].argmax(-1)  # a fully accepted greedy row
    _both(target, draft, tokens, temperature=0.0)
    _both(target, draft, tokens, temperature=torch.tensor([0.0, 1.0, 0.0, 0.6]))


@pytest.mark.parametrize("params", [{"top_k": 7}, {"top_p": 0.9}, {"top_k": 40, "top_p": 0.8, "temperature": 0.7}, {"top_k": torch.tensor([0, 3, 2999])}])
def test_identity_with_filters(params):
    target, draft, tokens = _case(3, 3, 1500, torch.float32, seed=2, noise=0.2)
    _both(target, draft, tokens, **params)


def test_identity_ragged_one_hot_and_small_draft_vocab():
    target, draft, tokens = _case(4, 4, 2000, torch.float32, seed=3, draft_vocab=1500, noise=0.1)
    _both(target, draft, tokens, num_draft_tokens=torch.tensor([0, 1, 4, 2]))
    _both(target, None, tokens, num_draft_tokens=torch.tensor([4, 3, 0, 2]))
    _both(target[:, :1], None, tokens[:, :0])  # K = 0: a plain draw


def test_identity_across_chunks_and_ragged_tiles():
    """Several vocabulary chunks per row and a last tile that is mostly padding."""
    target, draft, tokens = _case(3, 3, 1000, torch.float32, seed=4, noise=0.5)
    seed = torch.tensor([987654321123], dtype=torch.int64)
    for params, layouts in [({"top_k": None, "top_p": None}, [(3, 128), (8, 64), (2, 512)]), ({"top_k": 50, "top_p": 0.95}, [(3, 256)])]:
        args = _params.validate_verify(target, draft, tokens, temperature=0.9, num_draft_tokens=None, generator=None, check=True, **params)
        expected = verify_eager(args, seed)
        for num_chunks, block in layouts:
            got = _triton_backend.verify(args, seed, num_chunks=num_chunks, block=block)
            assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), (params, num_chunks, block)


def test_invalid_rows_without_check_give_minus_one():
    target, draft, tokens = _case(4, 2, 300, torch.float32, seed=5)
    target[1, 0, 7] = float("nan")
    draft[2, 1, 0] = float("inf")
    tokens[3, 0] = 300  # out of range
    out = _both(target, draft, tokens, check=False)
    assert (out.tokens[1:] == -1).all() and (out.num_accepted[1:] == 0).all()
    assert (out.tokens[0] >= 0).sum() == out.num_accepted[0] + 1


def test_unused_positions_may_hold_garbage():
    """Positions beyond a row's n_b are never read for values: NaN there is fine."""
    target, draft, tokens = _case(2, 3, 400, torch.float32, seed=6)
    target[0, 3] = float("nan")
    draft[0, 2] = float("nan")
    tokens[0, 2] = -1
    out = _both(target, draft, tokens, num_draft_tokens=torch.tensor([2, 3]))
    assert (out.tokens >= -1).all() and out.tokens[0, 0] >= 0


def _reference_thresholds(args) -> torch.Tensor:
    """Eager tau of every target line (-inf for greedy rows and unused positions)."""
    from specdec_ext.reference import filter_thresholds

    batch, length, vocab = args.target_logits.shape
    greedy = args.temperature == 0
    scale = torch.where(greedy, torch.ones_like(args.temperature), args.temperature)
    scaled = args.target_logits.float() / scale[:, None, None]
    per_line = lambda x: x.repeat_interleave(length)  # noqa: E731
    tau = filter_thresholds(scaled.reshape(-1, vocab), per_line(torch.where(greedy, 0, args.top_k)), per_line(torch.where(greedy, 1.0, args.top_p)))
    used = (torch.arange(length)[None, :] <= args.num_draft_tokens[:, None]).reshape(-1)
    return torch.where(used, tau, float("-inf"))


@pytest.mark.parametrize(
    "name,logits_fn,params",
    [
        # top-k found among the candidates (k well below the 64 slots per chunk) ...
        ("top-k small", lambda g: 2 * torch.randn(2, 3, 3000, generator=g), {"top_k": torch.tensor([5, 40])}),
        # ... and on the whole line (k beyond what the candidates above the floor cover).
        ("top-k large", lambda g: 2 * torch.randn(2, 3, 3000, generator=g), {"top_k": 900}),
        # top-p alone: peaked logits put the cut among the candidates, flat ones below their floor.
        ("top-p peaked", lambda g: 6 * torch.randn(2, 3, 3000, generator=g), {"top_p": 0.9}),
        ("top-p flat", lambda g: 0.3 * torch.randn(2, 3, 3000, generator=g), {"top_p": 0.95}),
        ("top-k + top-p", lambda g: 2 * torch.randn(2, 3, 3000, generator=g), {"temperature": 0.7, "top_k": 50, "top_p": 0.8}),
        # Ties at the chunks' floors (slots overflow), and -inf entries (chunks with few finite values).
        ("ties", lambda g: torch.round(2 * torch.randn(2, 3, 3000, generator=g)), {"top_k": 30, "top_p": 0.9}),
        ("ties top-p", lambda g: torch.round(torch.randn(2, 3, 3000, generator=g)), {"top_p": 0.6}),
        ("-inf", lambda g: torch.where(torch.rand(2, 3, 3000, generator=g) < 0.97, float("-inf"), torch.randn(2, 3, 3000, generator=g)), {"top_k": 20, "top_p": 0.9}),
        ("greedy and ragged", lambda g: torch.randn(2, 3, 3000, generator=g), {"temperature": torch.tensor([0.0, 1.0]), "top_k": 10, "num_draft_tokens": torch.tensor([2, 1])}),
    ],
)
def test_thresholds_match_the_reference(name, logits_fn, params):
    """The candidate search (several 256-value chunks per line here) finds the reference's cut-offs
    exactly, whether it resolves among the candidates or falls back to the whole line."""
    g = torch.Generator().manual_seed(len(name))
    target = logits_fn(g)
    tokens = torch.zeros(target.shape[0], target.shape[1] - 1, dtype=torch.int64)
    kw = {"temperature": 1.0, "top_k": None, "top_p": None, "num_draft_tokens": None} | params
    args = _params.validate_verify(target, None, tokens, generator=None, check=False, **kw)
    got = _triton_backend.thresholds(args, target, target.shape[1], 0, target.shape[2], block=1024, candidate_chunk=256)
    expected = _reference_thresholds(args)
    assert torch.equal(got, expected), f"{name}: {got.tolist()} != {expected.tolist()}"
