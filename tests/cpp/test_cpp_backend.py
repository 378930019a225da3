"""The C++ CPU kernel (csrc/): same seed, same tokens as the eager reference; its own law check;
thread-count independence; and the fallback when the extension is missing."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from support.laws import position_laws_fail, processed_probs
from support.strategies import extreme_verify_inputs

import specdec_ext
from specdec_ext import _cpp_backend, _dispatch
from specdec_ext.reference import process_lines

needs_cpp = pytest.mark.skipif(not _cpp_backend.is_available(), reason=f"C++ extension unavailable: {_cpp_backend.unavailable_reason()}")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def _one_thread():
    # The eager reference dominates these tests; on one intra-op thread it does not stall on a
    # busy machine (tests that are about threads set their own counts).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _sample_processed(logits: torch.Tensor, generator: torch.Generator, temperature=1.0, top_k=None, top_p=None) -> torch.Tensor:
    """(B, K) draws from the processed law of (B, K, V) logits, with per-row parameters."""
    batch, k, vocab = logits.shape
    if k == 0:
        return torch.empty((batch, 0), dtype=torch.int64)

    def per_line(value, default, dtype):
        value = default if value is None else value
        value = torch.as_tensor(value, dtype=dtype).reshape(-1).expand(batch)
        return value.repeat_interleave(k)

    temperature_l = per_line(temperature, 1.0, torch.float32)
    greedy = temperature_l == 0
    lines = process_lines(
        logits.reshape(batch * k, vocab), torch.where(greedy, 1.0, temperature_l), torch.where(greedy, 0, per_line(top_k, 0, torch.int64)),
        torch.where(greedy, 1.0, per_line(top_p, 1.0, torch.float32)),
    )
    return torch.multinomial(lines.probs(), 1, generator=generator).reshape(batch, k)


def _case(batch, k, vocab, dtype, seed, draft_vocab=None, noise=0.5, scale=2.0, **params):
    """Target logits, draft logits close to them (so drafts are often accepted) and drafts drawn
    from the processed draft law, as a real draft model would."""
    g = torch.Generator().manual_seed(seed)
    draft_vocab = draft_vocab or vocab
    target = torch.randn(batch, k + 1, vocab, generator=g) * scale
    draft = target[:, :k, :draft_vocab] + noise * torch.randn(batch, k, draft_vocab, generator=g)
    target, draft = target.to(dtype), draft.to(dtype)
    tokens = _sample_processed(draft.float(), g, **params)
    return target, draft, tokens


def _same_tokens(target, draft, tokens, seeds=(0, 1, 2), **kw):
    """verify on the cpp and eager backends with identical generators; returns the cpp results."""
    results = []
    for seed in seeds:
        a = specdec_ext.verify(target, draft, tokens, generator=torch.Generator().manual_seed(seed), backend="cpp", **kw)
        b = specdec_ext.verify(target, draft, tokens, generator=torch.Generator().manual_seed(seed), backend="eager", **kw)
        assert torch.equal(a.tokens, b.tokens), f"seed {seed}: tokens differ\ncpp:\n{a.tokens}\neager:\n{b.tokens}"
        assert torch.equal(a.num_accepted, b.num_accepted), f"seed {seed}: {a.num_accepted} != {b.num_accepted}"
        results.append(a)
    return results


# --------------------------------------------------------------------------------------------
# Same seed, same tokens.


@needs_cpp
@pytest.mark.parametrize("vocab", [2, 1000, 32000, 50257, 128256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_identity_over_vocabularies_and_dtypes(vocab, dtype):
    batch, k = (4, 3) if vocab <= 32000 else (2, 2)
    target, draft, tokens = _case(batch, k, vocab, dtype, seed=vocab % 89)
    outs = _same_tokens(target, draft, tokens)
    assert any(int(o.num_accepted.sum()) > 0 for o in outs)  # the accepted path is exercised too


@needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 0.7, "top_k": 20},
        {"top_p": 0.9},
        {"temperature": 1.3, "top_k": 50, "top_p": 0.95},
        {"top_k": 1},
        {"top_p": 1e-6},
        {"temperature": torch.tensor([0.5, 1.0, 2.0, 0.8]), "top_k": torch.tensor([0, 5, 100, 2000]), "top_p": torch.tensor([1.0, 0.5, 0.9, 0.99])},
    ],
    ids=["t0.7-k20", "p0.9", "t1.3-k50-p0.95", "k1", "p-tiny", "per-row"],
)
def test_identity_with_top_k_top_p(dtype, params):
    target, draft, tokens = _case(4, 3, 5000, dtype, seed=11, **params)
    _same_tokens(target, draft, tokens, **params)


@needs_cpp
def test_identity_top_p_on_large_vocabulary():
    target, draft, tokens = _case(2, 2, 128256, torch.bfloat16, seed=5, scale=3.0, top_p=0.8, temperature=0.9)
    _same_tokens(target, draft, tokens, top_p=0.8, temperature=0.9, seeds=(0, 1))


@needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
def test_identity_greedy_and_mixed_rows(dtype):
    target, draft, tokens = _case(6, 4, 3000, dtype, seed=2, noise=0.05)
    tokens[0] = target[0, :4].float().argmax(-1)  # a fully accepted greedy row
    _same_tokens(target, draft, tokens, temperature=0.0)
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.6, 1.5, 0.0])
    outs = _same_tokens(target, draft, tokens, temperature=temperature, top_k=torch.tensor([0, 10, 3, 0, 0, 1]))
    assert int(outs[0].num_accepted[0]) == 4


@needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
def test_identity_ragged(dtype):
    target, draft, tokens = _case(5, 4, 32000, dtype, seed=3, noise=0.3)
    num_draft = torch.tensor([4, 0, 2, 1, 3])
    _same_tokens(target, draft, tokens, num_draft_tokens=num_draft)
    # Drafts past num_draft_tokens are never read: garbage there changes nothing.
    spoiled = tokens.clone()
    spoiled[1, :] = -7
    spoiled[3, 1:] = 10**6
    a = specdec_ext.verify(target, draft, tokens, num_draft_tokens=num_draft, generator=torch.Generator().manual_seed(4), backend="cpp")
    b = specdec_ext.verify(target, draft, spoiled, num_draft_tokens=num_draft, generator=torch.Generator().manual_seed(4), backend="cpp", check=False)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted)


@needs_cpp
@pytest.mark.parametrize("vocab", [2, 1000, 50257])
@pytest.mark.parametrize("dtype", DTYPES)
def test_identity_one_hot_drafts(vocab, dtype):
    # Deterministic drafts (draft_logits=None): drafts from a perturbed target, so some are rejected.
    target, perturbed, _ = _case(4, 3, vocab, dtype, seed=7, noise=1.0)
    tokens = _sample_processed(perturbed.float(), torch.Generator().manual_seed(8))
    _same_tokens(target, None, tokens)
    _same_tokens(target, None, tokens, temperature=0.8, top_k=40, top_p=0.9)


@needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("vocab", "draft_vocab"), [(1000, 999), (50257, 50000), (32000, 7)])
def test_identity_smaller_draft_vocabulary(dtype, vocab, draft_vocab):
    target, draft, tokens = _case(3, 3, vocab, dtype, seed=9, draft_vocab=draft_vocab)
    _same_tokens(target, draft, tokens)
    _same_tokens(target, draft, tokens, top_k=50, top_p=0.95)


@needs_cpp
@pytest.mark.parametrize("vocab", [2, 1000, 128256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_identity_sample(vocab, dtype):
    logits = (torch.randn(5, vocab, generator=torch.Generator().manual_seed(vocab)) * 2).to(dtype)
    for kw in ({}, {"temperature": 0.0}, {"temperature": 0.7, "top_k": 30, "top_p": 0.9}):
        for seed in range(3):
            a = specdec_ext.sample(logits, generator=torch.Generator().manual_seed(seed), backend="cpp", **kw)
            b = specdec_ext.sample(logits, generator=torch.Generator().manual_seed(seed), backend="eager", **kw)
            assert torch.equal(a, b), f"{kw} seed {seed}: {a} != {b}"


@needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
def test_identity_invalid_rows_without_check(dtype):
    batch, k, vocab = 12, 3, 1000
    target, draft, tokens = _case(batch, k, vocab, dtype, seed=13)
    target, draft = target.clone(), draft.clone()
    temperature = torch.ones(batch)
    top_p = torch.ones(batch)
    num_draft = torch.full((batch,), k)
    # Position 0 is read by every row; later lines only up to the first rejection (tested in
    # test_validation.py::test_check_false_reads_lines_up_to_the_first_rejection).
    target[1, 0, 17] = float("nan")
    target[2, 0, 5] = float("inf")
    target[3, 0] = float("-inf")  # an empty line
    draft[4, 0, 3] = float("nan")
    tokens[5, 1] = vocab + 5
    tokens[6, 0] = -1
    temperature[7] = -1.0
    top_p[8] = 0.0
    num_draft[9] = k + 1
    temperature[10] = 1e-40  # logits / temperature overflows
    target[11, 3] = float("nan")  # but row 11 only verifies one draft: that line is never used
    num_draft[11] = 1
    outs = _same_tokens(target, draft, tokens, temperature=temperature, top_p=top_p, num_draft_tokens=num_draft, check=False)
    for out in outs:
        assert (out.tokens[1:11] == -1).all() and (out.num_accepted[1:11] == 0).all()
        assert (out.tokens[0] >= 0).any() and (out.tokens[11] >= 0).any()


@needs_cpp
def test_identity_layouts_and_parameter_kinds():
    # Logits that are views (a slice of a longer sequence, an expanded row), int32 drafts, and
    # per-row parameters given as 0-d tensors: read in place, same tokens.
    g = torch.Generator().manual_seed(21)
    sequence = torch.randn(3, 9, 2000, generator=g) * 2
    target = sequence[:, 4:8]  # (3, 4, 2000), not contiguous
    draft = (target[:, :3] + 0.3 * torch.randn(3, 3, 2000, generator=g)).transpose(0, 1).contiguous().transpose(0, 1)
    tokens = _sample_processed(draft, g).int()
    _same_tokens(target, draft, tokens, temperature=torch.tensor(0.9), top_k=torch.tensor(100))
    expanded = sequence[:1, :4].expand(64, -1, -1)
    _same_tokens(expanded, None, tokens[:1].expand(64, -1), seeds=(5,))
    # A vocabulary stride other than 1 falls back to one contiguous copy.
    wide = torch.randn(2, 4, 2000, 2, generator=g)[..., 0]
    _same_tokens(wide, None, torch.randint(0, 2000, (2, 3), generator=g), seeds=(6,))


@needs_cpp
def test_identity_peaked_and_tied_logits():
    g = torch.Generator().manual_seed(31)
    target = (torch.randn(4, 4, 600, generator=g) * 3).round()  # many exact ties, also at top-k cuts
    draft = (target[:, :3] + torch.randint(-1, 2, (4, 3, 600), generator=g)).float()
    tokens = _sample_processed(draft, g)
    for kw in ({}, {"top_k": 7}, {"top_p": 0.6}, {"temperature": 0.05}, {"top_k": 3, "top_p": 0.3}):
        _same_tokens(target, draft, tokens, **kw)
    masked = target.masked_fill(torch.rand(target.shape, generator=g) < 0.8, float("-inf"))
    masked[..., 0] = 0.0
    _same_tokens(masked, None, tokens, top_k=5)


@needs_cpp
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(extreme_verify_inputs(max_vocab=50, huge=3e3, dtypes=DTYPES))  # 3e3 stays finite in fp16
def test_identity_on_extreme_inputs(inputs):
    target, draft, tokens, params, seed = inputs
    _same_tokens(target, draft, tokens, seeds=(seed,), **params)


# --------------------------------------------------------------------------------------------
# Contract v2: per-request keys and offsets, logprobs and accept_probs, token for token with eager.


def _keys(batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, 2**62, (batch,), generator=g)
    offsets = torch.randint(0, 2**40, (batch,), generator=g)  # positions past 2^32: both counter words
    return seeds, offsets


def _same_outputs(target, draft, tokens, seeds, offsets, **kw):
    """cpp and eager with the same keys: tokens equal, logprobs / accept_probs within float rounding."""
    kw.setdefault("return_logprobs", "processed")
    a, b = (specdec_ext.verify(target, draft, tokens, seeds=seeds, offsets=offsets, return_accept_probs=True, backend=backend, **kw) for backend in ("cpp", "eager"))
    assert torch.equal(a.tokens, b.tokens), f"tokens differ\ncpp:\n{a.tokens}\neager:\n{b.tokens}"
    assert torch.equal(a.num_accepted, b.num_accepted)
    torch.testing.assert_close(a.logprobs, b.logprobs, equal_nan=True, rtol=0, atol=1e-5)
    torch.testing.assert_close(a.accept_probs, b.accept_probs, equal_nan=True, rtol=0, atol=1e-5)
    return a


@needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["processed", "raw"])
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"temperature": 0.7, "top_k": 40},
        {"temperature": 1.3, "top_p": 0.9},
        {"temperature": torch.tensor([0.0, 0.8, 1.0, 0.0, 1.7, 0.6]), "top_k": torch.tensor([0, 20, 0, 5, 0, 300]), "top_p": torch.tensor([1.0, 0.9, 0.95, 1.0, 1.0, 0.5])},
    ],
    ids=["plain", "t0.7-k40", "t1.3-p0.9", "per-row-greedy-mixed"],
)
def test_identity_with_keys_offsets_and_outputs(dtype, mode, params):
    target, draft, tokens = _case(6, 4, 20000, dtype, seed=41, noise=0.3, **{n: v for n, v in params.items() if n != "top_p"})
    seeds, offsets = _keys(6, 5)
    num_draft = torch.tensor([4, 0, 3, 4, 1, 2])
    out = _same_outputs(target, draft, tokens, seeds, offsets, return_logprobs=mode, num_draft_tokens=num_draft, **params)
    assert int(out.num_accepted.sum()) > 0
    _same_outputs(target, None, tokens, seeds, offsets, return_logprobs=mode, num_draft_tokens=num_draft, **params)  # one-hot drafts


@needs_cpp
@pytest.mark.parametrize("vocab", [3, 1000, 128256])
def test_sample_identity_with_keys(vocab):
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(vocab)) * 2
    seeds, offsets = _keys(5, vocab)
    for kw in ({}, {"temperature": 0.0}, {"temperature": 0.7, "top_k": 30, "top_p": 0.9}, {"top_p": 0.8}):
        a = specdec_ext.sample(logits, seeds=seeds, offsets=offsets, backend="cpp", **kw)
        b = specdec_ext.sample(logits, seeds=seeds, offsets=offsets, backend="eager", **kw)
        assert torch.equal(a, b), f"{kw}: {a} != {b}"


@needs_cpp
def test_negative_keys_blank_only_their_row():
    target, draft, tokens = _case(4, 3, 3000, torch.float32, seed=43)
    seeds, offsets = _keys(4, 7)
    seeds[1] = -1
    offsets[2] = -(2**40)
    out = _same_outputs(target, draft, tokens, seeds, offsets, check=False)
    assert (out.tokens[1:3] == -1).all() and (out.num_accepted[1:3] == 0).all()
    assert torch.isnan(out.logprobs[1:3]).all() and torch.isnan(out.accept_probs[1:3]).all()
    assert (out.tokens[[0, 3], 0] >= 0).all()


def _run_rows(target, draft, tokens, seeds, offsets, rows, **params):
    rows = torch.as_tensor(rows)
    per_row = {n: (v[rows] if isinstance(v, torch.Tensor) else v) for n, v in params.items()}
    return specdec_ext.verify(
        target[rows], draft[rows], tokens[rows], seeds=seeds[rows], offsets=offsets[rows], return_logprobs="raw", return_accept_probs=True,
        backend="cpp", **per_row,
    )


@needs_cpp
def test_seeded_rows_do_not_depend_on_batch_threads_or_scheduler():
    """A seeded row's tokens, logprobs and accept_probs are bit-identical whatever its neighbours,
    its place in the batch, the batch size, the thread count and the way work is spread over threads
    (lines span several 8192-entry chunks; filtered lines, top-p-only ones too, are split across
    threads)."""
    batch, k, vocab = 6, 3, 40000
    params = {
        "temperature": torch.tensor([1.0, 0.7, 1.2, 0.0, 0.9, 0.5]),
        "top_k": torch.tensor([0, 0, 20, 0, 0, 100]),
        "top_p": torch.tensor([1.0, 0.9, 1.0, 1.0, 0.8, 0.95]),
    }
    target, draft, tokens = _case(batch, k, vocab, torch.float32, seed=47, noise=0.3, temperature=params["temperature"], top_k=params["top_k"])
    seeds, offsets = _keys(batch, 9)
    threads, previous = torch.get_num_threads(), _cpp_backend._C.scheduler()
    reference = _run_rows(target, draft, tokens, seeds, offsets, list(range(batch)), **params)
    layouts = [[5, 4, 3, 2, 1, 0], [2], [0, 0, 0, 0, 0, 0, 0, 0, 0], [1, 3, 5, 1, 3, 5, 0, 2, 4, 0, 2, 4]]
    try:
        for scheduler in ("auto", "openmp", "pool"):
            assert _cpp_backend._C.set_scheduler(scheduler)
            for n in (1, 2, 3):
                torch.set_num_threads(n)
                for rows in layouts:
                    out = _run_rows(target, draft, tokens, seeds, offsets, rows, **params)
                    for name in ("tokens", "num_accepted", "logprobs", "accept_probs"):
                        got, want = getattr(out, name), getattr(reference, name)[torch.tensor(rows)]
                        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)), (scheduler, n, rows, name)
    finally:
        torch.set_num_threads(threads)
        _cpp_backend._C.set_scheduler(previous)


# --------------------------------------------------------------------------------------------
# Law, threads and instruction sets.


@needs_cpp
@pytest.mark.parametrize("one_hot", [False, True])
def test_law_per_position(one_hot):
    """The token emitted at each position follows the processed target law (chi-square at 1e-6)."""
    n, k, vocab = 40000, 3, 7
    params = {"temperature": 0.8, "top_k": 6, "top_p": 0.97}
    g = torch.Generator().manual_seed(17)
    target = torch.randn(k + 1, vocab, generator=g) * 1.5
    draft = torch.randn(k, vocab, generator=g) * 1.5
    if one_hot:
        tokens = torch.tensor([[1, 4, 2]]).expand(n, k)
        out = specdec_ext.verify(target.expand(n, -1, -1), None, tokens, generator=g, backend="cpp", **params)
    else:
        q = processed_probs(draft, **params)
        tokens = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(k)], dim=1)
        out = specdec_ext.verify(target.expand(n, -1, -1), draft.expand(n, -1, -1), tokens, generator=g, backend="cpp", **params)
    fails, report = position_laws_fail(out.tokens, out.num_accepted, processed_probs(target, **params))
    assert not fails, report
    assert 0 < float(out.num_accepted.float().mean()) < k  # both acceptance and rejection happen


@needs_cpp
@pytest.mark.parametrize("scheduler", ["auto", "pool", "openmp"])
def test_tokens_do_not_depend_on_thread_count(scheduler):
    target, draft, tokens = _case(6, 4, 40000, torch.float32, seed=19, noise=0.3)
    top_k = torch.tensor([0, 0, 20, 0, 0, 100])
    top_p = torch.tensor([1.0, 0.9, 1.0, 1.0, 0.8, 1.0])
    temperature = torch.tensor([1.0, 0.7, 1.2, 0.0, 1.0, 0.5])
    threads, previous = torch.get_num_threads(), _cpp_backend._C.scheduler()
    outs = []
    try:
        assert _cpp_backend._C.set_scheduler(scheduler)
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append(specdec_ext.verify(target, draft, tokens, temperature=temperature, top_k=top_k, top_p=top_p, generator=torch.Generator().manual_seed(3), backend="cpp"))
    finally:
        torch.set_num_threads(threads)
        _cpp_backend._C.set_scheduler(previous)
    for out in outs[1:]:
        assert torch.equal(out.tokens, outs[0].tokens) and torch.equal(out.num_accepted, outs[0].num_accepted)


@needs_cpp
def test_instruction_set_variants_agree():
    target, draft, tokens = _case(3, 3, 20000, torch.bfloat16, seed=23)
    seeds, offsets = _keys(3, 11)
    kw = {"top_p": 0.9, "seeds": seeds, "offsets": offsets, "return_logprobs": "processed", "return_accept_probs": True}
    reference = specdec_ext.verify(target, draft, tokens, backend="eager", **kw)
    samples = specdec_ext.sample(target[:, 0], seeds=seeds, offsets=offsets, backend="eager")
    used = _cpp_backend.isa()
    ran = []
    try:
        for isa in ("avx512", "avx2", "neon", "base"):
            if not _cpp_backend._C.set_isa(isa):
                continue  # this CPU lacks it
            ran.append(isa)
            out = specdec_ext.verify(target, draft, tokens, backend="cpp", **kw)
            assert torch.equal(out.tokens, reference.tokens), isa
            torch.testing.assert_close(out.logprobs, reference.logprobs, equal_nan=True, rtol=0, atol=1e-5)
            torch.testing.assert_close(out.accept_probs, reference.accept_probs, equal_nan=True, rtol=0, atol=1e-5)
            assert torch.equal(specdec_ext.sample(target[:, 0], seeds=seeds, offsets=offsets, backend="cpp"), samples), isa
    finally:
        _cpp_backend._C.set_isa(used)
    assert "base" in ran


@needs_cpp
def test_cpp_is_auto_on_cpu():
    assert "cpp" in specdec_ext.available_backends("cpu")
    assert specdec_ext.available_backends("cpu").index("cpp") < specdec_ext.available_backends("cpu").index("eager")
    target, draft, tokens = _case(2, 2, 100, torch.float32, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback warning
        auto = specdec_ext.verify(target, draft, tokens, generator=torch.Generator().manual_seed(0))
    cpp = specdec_ext.verify(target, draft, tokens, generator=torch.Generator().manual_seed(0), backend="cpp")
    assert torch.equal(auto.tokens, cpp.tokens)
    assert _cpp_backend.unavailable_reason() == ""


# --------------------------------------------------------------------------------------------
# The fallback when the extension is missing (simulated: the loaded module is hidden).


@pytest.fixture
def without_extension(monkeypatch):
    monkeypatch.setattr(_cpp_backend, "_C", None)
    monkeypatch.setattr(_cpp_backend, "_IMPORT_ERROR", "specdec_ext._C is not built (simulated)")
    _dispatch.forget()  # resolutions, call plans and the fallback warning, made with the extension
    yield
    _dispatch.forget()  # (and those made without it)


def test_fallback_when_extension_missing(without_extension):
    assert not _cpp_backend.is_available()
    assert "simulated" in _cpp_backend.unavailable_reason()
    assert "cpp" not in specdec_ext.available_backends("cpu")
    target, draft, tokens = _case(2, 2, 100, torch.float32, seed=1)
    with pytest.warns(RuntimeWarning, match="simulated") as record:
        auto = specdec_ext.verify(target, draft, tokens, generator=torch.Generator().manual_seed(0))
        specdec_ext.verify(target, draft, tokens, generator=torch.Generator().manual_seed(0))
        specdec_ext.sample(target[:, 0], generator=torch.Generator().manual_seed(0))
    assert len([w for w in record if issubclass(w.category, RuntimeWarning)]) == 1  # one clear warning, once
    eager = specdec_ext.verify(target, draft, tokens, generator=torch.Generator().manual_seed(0), backend="eager")
    assert torch.equal(auto.tokens, eager.tokens)
    with pytest.raises(ValueError, match="cpp"):
        specdec_ext.verify(target, draft, tokens, backend="cpp")
    with pytest.raises(RuntimeError, match="unavailable"):
        _cpp_backend.verify(None, None)
