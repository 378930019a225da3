"""Per-request randomness (seeds / offsets), the optional outputs (logprobs, accept_probs) and
their validation, on every backend.

A seeded row's tokens depend only on its own logits, seed and offset: permuting the batch, adding
or removing neighbours and changing the batch size leave them bit-identical.
"""

from __future__ import annotations

import pytest
import torch
from conftest import all_cpu_backends, cpu_backends
from support.laws import position_laws_fail, processed_probs

import specdec_ext

V, K = 300, 3


def _requests(n: int, seed: int = 0, vocab: int = V, k: int = K):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(n, k + 1, vocab, generator=g) * 2
    draft = target[:, :k] + torch.randn(n, k, vocab, generator=g)
    drafts = torch.multinomial(torch.softmax(draft, -1).reshape(-1, vocab), 1, generator=g).reshape(n, k)
    seeds = torch.randint(0, 2**62, (n,), generator=g)
    offsets = torch.randint(0, 2**40, (n,), generator=g)
    return target, draft, drafts, seeds, offsets


def _verify(backend, target, draft, drafts, seeds, offsets, **kw):
    return specdec_ext.verify(target, draft, drafts, seeds=seeds, offsets=offsets, backend=backend, **kw)


NEIGHBOUR_PARAMS = [{}, {"temperature": 0.7, "top_k": 40, "top_p": 0.9}, {"temperature": torch.tensor([0.0, 1.0, 0.5, 0.0, 2.0, 1.0])}]


@pytest.mark.parametrize(
    "backend,params",
    [pytest.param(b, p, id=f"params{i}-{b}", marks=pytest.mark.slow if b == "triton" and i == 1 else ())  # (filtered interpreter run: CI's slow step)
     for i, p in enumerate(NEIGHBOUR_PARAMS) for b in all_cpu_backends()],
)
def test_seeded_rows_ignore_their_neighbours(backend, params):
    target, draft, drafts, seeds, offsets = _requests(6)
    # permuted, alone, a subset, duplicated (the interpreter is slow: fewer and smaller under Triton)
    subsets = ([5, 3, 1, 0, 2, 4], [2], [4, 0], [1, 1, 1]) if backend != "triton" else ([3, 1, 0, 2], [4, 4])
    whole = _verify(backend, target, draft, drafts, seeds, offsets, return_logprobs="processed", return_accept_probs=True, **params)

    def per_row(value, rows):
        return value[rows] if isinstance(value, torch.Tensor) else value

    for rows in subsets:
        rows_t = torch.tensor(rows)
        sub = {name: per_row(value, rows_t) for name, value in params.items()}
        part = _verify(backend, target[rows_t], draft[rows_t], drafts[rows_t], seeds[rows_t], offsets[rows_t], return_logprobs="processed", return_accept_probs=True, **sub)
        assert torch.equal(part.tokens, whole.tokens[rows_t]), rows
        assert torch.equal(part.num_accepted, whole.num_accepted[rows_t])
        torch.testing.assert_close(part.logprobs, whole.logprobs[rows_t], equal_nan=True, rtol=0, atol=0)
        torch.testing.assert_close(part.accept_probs, whole.accept_probs[rows_t], equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("backend", all_cpu_backends())
def test_a_request_is_replayed_by_its_seed_and_offset(backend):
    target, draft, drafts, seeds, offsets = _requests(4, seed=1)
    a = _verify(backend, target, draft, drafts, seeds, offsets)
    b = _verify(backend, target, draft, drafts, seeds.clone(), offsets.clone())
    assert torch.equal(a.tokens, b.tokens)
    # Another offset (a later step of the same request) draws other numbers.
    n = 16 if backend == "triton" else 64  # (the interpreter is slow)
    moved = _verify(backend, target[:1].expand(n, -1, -1), draft[:1].expand(n, -1, -1), drafts[:1].expand(n, -1), seeds[:1].expand(n).contiguous(), torch.arange(n))
    assert moved.tokens.unique(dim=0).shape[0] > 1


@pytest.mark.parametrize("backend", all_cpu_backends())
def test_sample_takes_per_request_keys(backend):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 200, generator=g)
    seeds = torch.tensor([9, 8, 7, 6, 5])
    offsets = torch.tensor([0, 1, 2, 3, 2**35])
    whole = specdec_ext.sample(logits, seeds=seeds, offsets=offsets, backend=backend)
    order = torch.tensor([4, 2, 0])
    assert torch.equal(specdec_ext.sample(logits[order], seeds=seeds[order], offsets=offsets[order], backend=backend), whole[order])


def test_sample_and_verify_never_share_noise():
    """sample() races on its own stream: with the same key and position, verify's bonus draw and
    sample's draw are independent (they agree at the rate of two independent draws)."""
    n, vocab = 20_000, 4
    logits = torch.zeros(n, vocab)
    seeds = torch.arange(n)
    sampled = specdec_ext.sample(logits, seeds=seeds, backend="eager")
    bonus = specdec_ext.verify(logits[:, None], None, torch.empty(n, 0, dtype=torch.int64), seeds=seeds, backend="eager").tokens[:, 0]
    agree = (sampled == bonus).double().mean().item()
    assert abs(agree - 1 / vocab) < 6 * (0.25 * 0.75 / n) ** 0.5, agree


@pytest.mark.parametrize("backend", all_cpu_backends())
def test_generator_rows_are_keyed_base_plus_row(backend):
    """Without seeds, row b is keyed base_key + b: a generator call equals the seeded call with
    those keys."""
    target, draft, drafts, _, _ = _requests(3, seed=4)
    g = torch.Generator().manual_seed(11)
    base = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(11)))
    a = specdec_ext.verify(target, draft, drafts, generator=g, backend=backend)
    b = specdec_ext.verify(target, draft, drafts, seeds=base + torch.arange(3), backend=backend)
    assert torch.equal(a.tokens, b.tokens)


# ---------------------------------------------------------------------------------------------
# Optional outputs


def _independent_log_probs(target, params):
    """log p of every token under transformers' warpers (processed) and log_softmax (raw)."""
    processed = processed_probs(target, **params).log()
    raw = torch.log_softmax(target.float(), dim=-1)
    return processed, raw


@pytest.mark.parametrize("params", [{}, {"temperature": 0.6, "top_k": 30, "top_p": 0.8}, {"temperature": 1.7}])
@pytest.mark.parametrize(
    "backend,dtype",
    [(b, d) if b != "triton" or d == torch.float32 else pytest.param(b, d, marks=pytest.mark.slow)  # (interpreter: bf16 in CI's slow step)
     for b in all_cpu_backends() for d in (torch.float32, torch.bfloat16)],
)
def test_logprobs_match_log_softmax(backend, params, dtype):
    batch = 2 if backend == "triton" else 8  # (the interpreter is slow)
    target, draft, drafts, seeds, offsets = _requests(batch, seed=5)
    target, draft = target.to(dtype), draft.to(dtype)
    processed_lp, raw_lp = _independent_log_probs(target, params)
    for mode, expected_lp in (("processed", processed_lp), ("raw", raw_lp)):
        out = _verify(backend, target, draft, drafts, seeds, offsets, return_logprobs=mode, **params)
        assert out.logprobs.shape == (batch, K + 1) and out.logprobs.dtype == torch.float32
        emitted = out.tokens >= 0
        assert torch.isnan(out.logprobs[~emitted]).all()
        rows, positions = emitted.nonzero(as_tuple=True)
        expected = expected_lp[rows, positions, out.tokens[rows, positions]]
        torch.testing.assert_close(out.logprobs[rows, positions], expected, rtol=0, atol=1e-5)
        assert torch.isfinite(out.logprobs[emitted]).all()
    assert out.accept_probs is None
    assert specdec_ext.verify(target, draft, drafts, backend=backend, **params).logprobs is None


@pytest.mark.parametrize("backend", all_cpu_backends())
def test_greedy_rows_report_the_model_log_softmax(backend):
    target, draft, drafts, seeds, offsets = _requests(4, seed=6)
    temperature = torch.tensor([0.0, 0.5, 0.0, 2.0])
    raw_lp = torch.log_softmax(target, dim=-1)
    for mode in ("processed", "raw"):
        out = _verify(backend, target, draft, drafts, seeds, offsets, temperature=temperature, return_logprobs=mode)
        for row in (0, 2):
            n = int(out.num_accepted[row]) + 1
            expected = raw_lp[row, torch.arange(n), out.tokens[row, :n]]
            torch.testing.assert_close(out.logprobs[row, :n], expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", all_cpu_backends())
@pytest.mark.parametrize("one_hot", [False, True])
def test_accept_probs_are_min_one_p_over_q(backend, one_hot):
    target, draft, drafts, seeds, offsets = _requests(8, seed=7)
    params = {"temperature": torch.tensor([0.8, 0.8, 0.0, 1.3, 0.8, 1.0, 0.0, 0.9]), "top_k": 50}
    num_draft = torch.tensor([3, 2, 3, 0, 1, 3, 2, 3])
    out = specdec_ext.verify(
        target, None if one_hot else draft, drafts, num_draft_tokens=num_draft, seeds=seeds, offsets=offsets, return_accept_probs=True, backend=backend, **params
    )
    assert out.accept_probs.shape == (8, K) and out.logprobs is None
    for row in range(8):
        t = float(params["temperature"][row])
        examined = min(int(num_draft[row]), int(out.num_accepted[row]) + 1)
        for k in range(K):
            value = float(out.accept_probs[row, k])
            if k >= examined:
                assert value != value, (row, k)  # NaN
                continue
            x = int(drafts[row, k])
            if t == 0:
                expected = float(x == int(target[row, k].argmax()))
            else:
                p = float(processed_probs(target[row, k], temperature=t, top_k=50)[x])
                q = 1.0 if one_hot else float(processed_probs(draft[row, k], temperature=t, top_k=50)[x])
                expected = min(1.0, p / q) if q > 0 else float(p > 0)
            assert abs(value - expected) < 1e-5, (row, k, value, expected)


@pytest.mark.parametrize("backend", cpu_backends())
def test_accept_probs_average_to_the_acceptance_rate(backend):
    """E[min(1, p/q)] over draws x ~ q is the acceptance probability: the mean of accept_probs at
    position 0 and the accepted share agree within sampling error."""
    n, vocab = 40_000, 12
    g = torch.Generator().manual_seed(8)
    target = torch.randn(1, 2, vocab, generator=g).expand(n, -1, -1)
    draft = torch.randn(1, 1, vocab, generator=g).expand(n, -1, -1)
    drafts = torch.multinomial(torch.softmax(draft[0, 0], -1), n, replacement=True, generator=g)[:, None]
    out = specdec_ext.verify(target, draft, drafts, seeds=torch.arange(n), return_accept_probs=True, backend=backend)
    p, q = torch.softmax(target[0, 0], -1), torch.softmax(draft[0, 0], -1)
    exact = float(torch.minimum(p, q).sum())
    assert abs(out.accept_probs[:, 0].double().mean().item() - exact) < 0.01
    assert abs((out.num_accepted == 1).double().mean().item() - exact) < 6 * (exact * (1 - exact) / n) ** 0.5


# ---------------------------------------------------------------------------------------------
# Validation and blanking


def test_bad_seeds_and_offsets_name_the_argument():
    target, draft, drafts, seeds, offsets = _requests(3)
    bad = {
        "seeds must be an int64 tensor": {"seeds": seeds.int()},
        r"seeds must have shape \(3,\)": {"seeds": seeds[:2]},
        "seeds must be None or a": {"seeds": [1, 2, 3]},
        "seeds is on meta": {"seeds": seeds.to("meta")},
        "offsets must be an int64 tensor": {"offsets": offsets.float()},
        r"offsets must have shape \(3,\)": {"offsets": offsets[None]},
        "return_logprobs must be False, 'processed' or 'raw'": {"return_logprobs": "log"},
        "return_accept_probs must be a bool": {"return_accept_probs": 1},
    }
    for match, kwargs in bad.items():
        with pytest.raises(ValueError, match=match):
            specdec_ext.verify(target, draft, drafts, backend="eager", **kwargs)
    with pytest.raises(ValueError, match="seeds must be an int64 tensor"):
        specdec_ext.sample(target[:, 0], seeds=seeds.int(), backend="eager")


@pytest.mark.parametrize("backend", all_cpu_backends())
@pytest.mark.parametrize("name", ["seeds", "offsets"])
def test_negative_seeds_or_offsets_raise_or_blank(backend, name):
    target, draft, drafts, seeds, offsets = _requests(3, seed=9)
    values = {"seeds": seeds, "offsets": offsets}
    values[name] = values[name].clone()
    values[name][1] = -5
    with pytest.raises(ValueError, match=f"{name}: row 1 is negative"):
        specdec_ext.verify(target, draft, drafts, backend=backend, **values)
    out = specdec_ext.verify(target, draft, drafts, backend=backend, check=False, return_logprobs="raw", return_accept_probs=True, **values)
    clean = specdec_ext.verify(target, draft, drafts, backend=backend, seeds=seeds, offsets=offsets)
    assert (out.tokens[1] == -1).all() and int(out.num_accepted[1]) == 0
    assert torch.isnan(out.logprobs[1]).all() and torch.isnan(out.accept_probs[1]).all()
    keep = torch.tensor([0, 2])
    assert torch.equal(out.tokens[keep], clean.tokens[keep])
    with pytest.raises(ValueError, match=f"{name}: row 1 is negative"):
        specdec_ext.sample(target[:, 0], backend=backend, **values)


@pytest.mark.parametrize("backend", all_cpu_backends())
def test_temperature_too_small_is_refused_on_every_path(backend):
    """Negative logits divided by 1e-39 are not finite: with draft logits, with one-hot drafts and in
    sample() every backend raises naming the temperature (check=True) or blanks the row (False);
    never another token."""
    target = -torch.rand(2, 3, 20) - 1.0  # all negative
    draft = -torch.rand(2, 2, 20) - 1.0
    drafts = torch.zeros(2, 2, dtype=torch.int64)
    temperature = torch.tensor([1e-39, 1.0])
    for d in (draft, None):
        with pytest.raises(ValueError, match="temperature: row 0 is so small"):
            specdec_ext.verify(target, d, drafts, temperature=temperature, backend=backend)
        out = specdec_ext.verify(target, d, drafts, temperature=temperature, backend=backend, check=False)
        assert (out.tokens[0] == -1).all() and (out.tokens[1, 0] >= 0)
    with pytest.raises(ValueError, match="temperature: row 0 is so small"):
        specdec_ext.sample(target[:, 0], temperature=temperature, backend=backend)
    assert specdec_ext.sample(target[:, 0], temperature=temperature, backend=backend, check=False)[0] == -1
    # A small temperature whose scaled logits stay finite keeps the argmax's law (no refusal).
    logits = torch.tensor([[-1.0, -3.0, -2.0, 1.0e-37]])  # scaled: -1e38, -3e38, -2e38, 10
    assert specdec_ext.sample(logits, temperature=1e-38, backend=backend).tolist() == [3]


@pytest.mark.parametrize("backend", [pytest.param(b, marks=pytest.mark.slow) if b == "eager" else b for b in cpu_backends()])
def test_drafting_and_verifying_with_the_same_keys_is_exact(backend):
    """A serving loop keys drafting (sample) and verification (verify) by the same seeds and
    offsets. sample() races on its own stream, so the output law is the target's; a drafter that
    shares verify's stream (a K = 0 verify on the draft logits) correlates the draft with the
    residual draw, and the same check rejects it."""
    n, vocab, k = 200_000, 6, 2
    g = torch.Generator().manual_seed(0)
    target = torch.randn(1, k + 1, vocab, generator=g) * 1.5
    draft = -target[:, :k] * 0.7 + 0.3 * torch.randn(1, k, vocab, generator=g)  # a poor draft: many residual draws
    seeds = torch.arange(n) * 7919
    offsets = torch.randint(0, 1000, (n,), generator=g)
    target_rows, draft_rows = target.expand(n, -1, -1), draft.expand(n, -1, -1)
    no_drafts = torch.empty(n, 0, dtype=torch.int64)
    drafters = {
        "sample": lambda pos: specdec_ext.sample(draft_rows[:, pos], seeds=seeds, offsets=offsets + pos, backend=backend),
        "shared-stream": lambda pos: specdec_ext.verify(draft_rows[:, pos : pos + 1], None, no_drafts, seeds=seeds, offsets=offsets + pos, backend=backend).tokens[:, 0],
    }
    law = processed_probs(target)[0]
    for name, drafter in drafters.items():
        drafts = torch.stack([drafter(pos) for pos in range(k)], dim=1)
        out = specdec_ext.verify(target_rows, draft_rows, drafts, seeds=seeds, offsets=offsets, backend=backend)
        fails, report = position_laws_fail(out.tokens, out.num_accepted, law)
        assert fails == (name == "shared-stream"), f"{name}: {report}"
