"""Same keys, same tokens: the fused Triton kernels (interpreted on CPU) against the eager reference.

Tokens and num_accepted must be identical; logprobs agree to float rounding (atol 1e-5, NaN where
nothing is emitted), accept_probs likewise. The launch geometry (race chunks, tiles) never changes
a result, and a seeded row never depends on its neighbours.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import all_cpu_backends

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


def _keys(batch, seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2**62, (batch,), generator=g), torch.randint(0, 2**40, (batch,), generator=g)


def assert_same(a, b):
    assert torch.equal(a[0], b[0]), f"tokens differ:\n{a[0]}\n{b[0]}"
    assert torch.equal(a[1], b[1]), f"num_accepted differ: {a[1]} {b[1]}"
    for got, want in zip(a[2:], b[2:], strict=True):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5, equal_nan=True)


def _both(target, draft, tokens, seed=123, **kw):
    outs = [specdec_ext.verify(target, draft, tokens, generator=torch.Generator().manual_seed(seed), backend=backend, **kw) for backend in ("triton", "eager")]
    assert_same(*outs)
    return outs[0]


@pytest.mark.parametrize("vocab", [2, 1000, 50257, 128256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_identity_over_vocabularies_and_dtypes(vocab, dtype):
    batch, k = (3, 3) if vocab <= 1000 else (2, 2)
    target, draft, tokens = _case(batch, k, vocab, dtype, seed=vocab % 97, noise=0.3)
    seeds, offsets = _keys(batch)
    _both(target, draft, tokens, seeds=seeds, offsets=offsets, return_logprobs="processed", return_accept_probs=True)


def test_identity_greedy_and_mixed_rows():
    target, draft, tokens = _case(4, 4, 3000, torch.float32, seed=1, noise=0.05)
    tokens[0] = target[0, :4].argmax(-1)  # a fully accepted greedy row
    _both(target, draft, tokens, temperature=0.0, return_logprobs="processed")
    _both(target, draft, tokens, temperature=torch.tensor([0.0, 1.0, 0.0, 0.6]), return_logprobs="raw", return_accept_probs=True)


@pytest.mark.parametrize("params", [{"top_k": 7}, {"top_p": 0.9}, {"top_k": 40, "top_p": 0.8, "temperature": 0.7}, {"top_k": torch.tensor([0, 3, 1499])}])
def test_identity_with_filters(params):
    target, draft, tokens = _case(3, 3, 1500, torch.float32, seed=2, noise=0.2)
    _both(target, draft, tokens, return_logprobs="processed", return_accept_probs=True, **params)


def test_identity_ragged_one_hot_small_draft_vocab_and_sample():
    target, draft, tokens = _case(4, 4, 2000, torch.float32, seed=3, draft_vocab=1500, noise=0.1)
    _both(target, draft, tokens, num_draft_tokens=torch.tensor([0, 1, 4, 2]), return_accept_probs=True)
    _both(target, None, tokens, num_draft_tokens=torch.tensor([4, 3, 0, 2]), return_logprobs="raw", return_accept_probs=True)
    _both(target[:, :1], None, tokens[:, :0], return_logprobs="processed")  # K = 0: a plain draw
    seeds, offsets = _keys(4)
    for kw in ({}, {"top_k": 20, "temperature": 0.8}):
        got = specdec_ext.sample(target[:, 0], seeds=seeds, offsets=offsets, backend="triton", **kw)
        assert torch.equal(got, specdec_ext.sample(target[:, 0], seeds=seeds, offsets=offsets, backend="eager", **kw))


def _args(target, draft, tokens, **kw):
    kw = {"temperature": 0.9, "top_k": None, "top_p": None, "num_draft_tokens": None, "generator": None, "check": True} | kw
    return _params.validate_verify(target, draft, tokens, **kw)


_GEOMETRIES = [
    {"race_chunks": 3, "race_block": 128, "stats_tile": 512},
    {"race_chunks": 1, "race_block": 256, "stats_tile": 512, "stats_parts": 1},  # one statistics program loops over both tiles
    {"race_chunks": 8, "race_block": 64},
    {"race_chunks": 2, "race_block": 512, "stats_tile": 128, "stats_parts": 2},  # candidates from 2 parts of 4 values per lane
]


@pytest.mark.parametrize("calls", [pytest.param("unfiltered", id="unfiltered"), pytest.param("filtered", id="filtered", marks=pytest.mark.slow)])
def test_identity_across_launch_geometries(calls):
    """Several race chunks per row, ragged last tiles (race, statistics, candidates) and a Vd < V
    draft with fewer statistics tiles give the reference's results."""
    target, draft, tokens = _case(3, 3, 1000, torch.float32, seed=4, draft_vocab=700, noise=0.5)
    seeds, offsets = _keys(3)
    layouts = _GEOMETRIES
    # Every layout without filters, and a greedy-mixed call on the layout with the smallest candidate
    # chunks; the filtered calls (slow in the interpreter) in make test-slow, on that layout and on the
    # one-program statistics, with the greedy-mixed call on the latter.
    if calls == "unfiltered":
        cases = (({}, layouts), ({"temperature": torch.tensor([0.0, 0.7, 1.2]), "return_logprobs": "processed"}, layouts[3:]))
    else:
        cases = (({"top_k": 50, "top_p": 0.95, "return_logprobs": "raw"}, layouts[1::2]),
                 ({"temperature": torch.tensor([0.0, 0.7, 1.2]), "return_logprobs": "processed"}, layouts[1:2]))
    for params, chosen in cases:
        args = _args(target, draft, tokens, seeds=seeds, offsets=offsets, return_accept_probs=True, **params)
        expected = verify_eager(args, 0)
        for layout in chosen:
            assert_same(_triton_backend.verify(args, 0, **layout), expected)


def test_identity_bf16_statistics_tiles_and_ragged_rows():
    """16-bit lines are read 8 values per thread and row: several tiles, a ragged last one."""
    target, draft, tokens = _case(2, 3, 2500, torch.bfloat16, seed=14, noise=0.4)
    args = _args(target, draft, tokens, num_draft_tokens=torch.tensor([3, 1]), return_logprobs="raw", return_accept_probs=True)
    expected = verify_eager(args, 77)
    assert_same(_triton_backend.verify(args, 77, stats_tile=1024, race_chunks=3, race_block=256), expected)
    assert_same(_triton_backend.verify(args, 77, stats_tile=1024, stats_parts=2), expected)  # parts of 2 and 1 tiles


def test_seeded_rows_do_not_depend_on_batch_or_chunking():
    """A seeded row's tokens, logprobs and accept_probs are bit-identical whatever its neighbours,
    its row and the number of race chunks (which follows the batch size on a GPU)."""
    target, draft, tokens = _case(4, 3, 900, torch.float32, seed=9, noise=0.6)
    seeds, offsets = _keys(4, seed=2)
    temperature = torch.tensor([0.8, 0.0, 1.1, 0.8])
    common = {"return_logprobs": "processed", "return_accept_probs": True, "check": False}
    whole = _triton_backend.verify(_args(target, draft, tokens, seeds=seeds, offsets=offsets, temperature=temperature, **common), 0, race_chunks=2, race_block=128)
    for rows, chunks in (([3, 1, 0, 2], 5), ([2], 1), ([0, 3], 3), ([1, 1], 4)):
        r = torch.tensor(rows)
        args = _args(target[r], draft[r], tokens[r], seeds=seeds[r], offsets=offsets[r], temperature=temperature[r], **common)
        part = _triton_backend.verify(args, 0, race_chunks=chunks, race_block=128)
        for got, want in zip(part, whole, strict=True):
            torch.testing.assert_close(got, want[r], rtol=0, atol=0, equal_nan=True)


def test_invalid_rows_without_check_give_minus_one():
    target, draft, tokens = _case(4, 2, 300, torch.float32, seed=5)
    target[1, 0, 7] = float("nan")
    draft[2, 1, 0] = float("inf")
    tokens[3, 0] = 300  # out of range
    out = _both(target, draft, tokens, check=False, return_logprobs="processed", return_accept_probs=True)
    assert (out.tokens[1:] == -1).all() and (out.num_accepted[1:] == 0).all()
    assert torch.isnan(out.logprobs[1:]).all() and torch.isnan(out.accept_probs[1:]).all()
    assert (out.tokens[0] >= 0).sum() == out.num_accepted[0] + 1


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": torch.tensor([-1.0, 1.0, float("inf"), 0.5])},
        {"temperature": torch.tensor([1.0, float("nan"), 0.7, 0.0])},
        {"top_k": torch.tensor([5, -1, 0, 3])},
        {"top_p": torch.tensor([0.0, 0.9, 1.5, 1.0])},
        {"num_draft_tokens": torch.tensor([2, -1, 3, 1])},
    ],
)
def test_bad_parameters_blank_their_rows_without_check(params):
    """check=False: a row whose own parameter is out of range is blanked (tokens -1, num_accepted 0)
    like the reference does, never drawn with a nonsense temperature or cut-off."""
    target, draft, tokens = _case(4, 2, 300, torch.float32, seed=6, noise=0.3)
    out = _both(target, draft, tokens, check=False, **params)
    bad = _params.invalid_rows(_args(target, draft, tokens, check=False, **params))
    assert bad.any() and (out.tokens[bad] == -1).all() and (out.num_accepted[bad] == 0).all()
    assert (out.tokens[~bad, 0] >= 0).all()


def test_unused_positions_may_hold_garbage():
    """Positions beyond a row's n_b are never read for values: NaN there is fine."""
    target, draft, tokens = _case(2, 3, 400, torch.float32, seed=6)
    target[0, 3] = float("nan")
    draft[0, 2] = float("nan")
    tokens[0, 2] = -1
    out = _both(target, draft, tokens, num_draft_tokens=torch.tensor([2, 3]))
    assert (out.tokens >= -1).all() and out.tokens[0, 0] >= 0


def test_an_all_zero_residual_races_on_p():
    """A rejected draft whose residual max(p - q, 0) is zero everywhere: p = (1, e) and q = (1, 2e)
    with e < 2**-24 (both normalisers round to 1), the draft proposing id 1. The finalising program
    races p over the whole line, as the reference does."""
    vocab = 600
    target = torch.full((1, 2, vocab), float("-inf"))
    target[0, :, 0] = 0.0
    target[0, :, 1] = -30 * 0.6931472  # e = 2**-30
    draft = target[:, :1].clone()
    draft[0, 0, 1] = -29 * 0.6931472  # 2e
    tokens = torch.tensor([[1]])
    rejected = 0
    for seed in range(6):  # about half the keys reject id 1 (u >= p / q = 1/2)
        args = _args(target, draft, tokens, temperature=1.0, seeds=torch.tensor([seed]), return_logprobs="processed", return_accept_probs=True)
        expected = verify_eager(args, 0)
        rejected += int(expected[1][0]) == 0
        assert_same(_triton_backend.verify(args, 0, race_chunks=3, race_block=128), expected)
    assert rejected > 0


def _reference_thresholds(args) -> torch.Tensor:
    """Eager tau of every target line (-inf for greedy rows and unused positions)."""
    from specdec_ext._params import inverse_temperature
    from specdec_ext.reference import filter_thresholds

    batch, length, vocab = args.target_logits.shape
    greedy = args.temperature == 0
    scaled = args.target_logits.float() * inverse_temperature(args.temperature)[:, None, None]
    per_line = lambda x: x.repeat_interleave(length)  # noqa: E731
    tau = filter_thresholds(scaled.reshape(-1, vocab), per_line(torch.where(greedy, 0, args.top_k)), per_line(torch.where(greedy, 1.0, args.top_p)))
    used = (torch.arange(length)[None, :] <= args.num_draft_tokens[:, None]).reshape(-1)
    return torch.where(used, tau, float("-inf"))


def _triton_thresholds(args, **geometry) -> tuple[torch.Tensor, torch.Tensor]:
    """(tau, resolved) of every target line after a whole call (the cut-offs launch settles each cut
    from the candidates or by the whole-line search; resolved 0 marks a line the search cut: one
    the launch listed for it), read from the call's workspace."""
    _triton_backend.verify(args, 0, **geometry)
    args = _triton_backend.prepare(args)
    geo = _triton_backend.geometry(args.target_logits.device, **geometry)
    layout = _triton_backend._layout(args, geo)
    ws = _triton_backend.workspace(args.target_logits.device)
    bufs = _triton_backend.buffers(ws.floats, ws.ints, ws.counters, layout, args.batch, geo.line_slots, geo.sort)
    lines = args.batch * args.target_logits.shape[1]
    resolved = torch.ones(lines, dtype=torch.int32)
    listed = bufs.search_list[: int(bufs.searching[0])].long()
    resolved[listed[listed < lines]] = 0
    return bufs.tau[:lines].clone(), resolved


# Several statistics parts per line (ragged last tile), six values per lane: candidates from each part.
_PARTS = {"stats_tile": 256, "stats_parts": 2}


@pytest.mark.parametrize(
    "name,logits_fn,params,path",
    [
        # top-k found among the candidates (k well below the values above the line's floor) ...
        # (the candidate-path cases alone also run inside "top-k + top-p": CI's slow step repeats them)
        pytest.param("top-k small", lambda g: 2 * torch.randn(2, 3, 3000, generator=g), {"top_k": torch.tensor([5, 40])}, "candidates", marks=pytest.mark.slow),
        # ... and on the whole line (k beyond what the candidates above the floor cover).
        ("top-k large", lambda g: 2 * torch.randn(2, 3, 3000, generator=g), {"top_k": 900}, "search"),
        # top-p alone: peaked logits put the cut among the candidates, flat ones below their floor.
        pytest.param("top-p peaked", lambda g: 6 * torch.randn(2, 3, 3000, generator=g), {"top_p": 0.9}, "candidates", marks=pytest.mark.slow),
        ("top-p flat", lambda g: 0.3 * torch.randn(2, 3, 3000, generator=g), {"top_p": 0.95}, "search"),
        ("top-k + top-p", lambda g: 2 * torch.randn(2, 3, 3000, generator=g), {"temperature": 0.7, "top_k": 50, "top_p": 0.8}, "candidates"),
        # Ties at the parts' floors, and -inf entries (lanes with few finite values).
        ("ties", lambda g: torch.round(2 * torch.randn(2, 3, 3000, generator=g)), {"top_k": 30, "top_p": 0.9}, None),
        ("ties top-p", lambda g: torch.round(torch.randn(2, 3, 3000, generator=g)), {"top_p": 0.6}, None),
        ("-inf", lambda g: torch.where(torch.rand(2, 3, 3000, generator=g) < 0.97, float("-inf"), torch.randn(2, 3, 3000, generator=g)),
         {"top_k": 20, "top_p": 0.9}, "candidates"),
        ("greedy and ragged", lambda g: torch.randn(2, 3, 3000, generator=g), {"temperature": torch.tensor([0.0, 1.0]), "top_k": 10,
                                                                              "num_draft_tokens": torch.tensor([2, 1])}, "candidates"),
    ],
)
def test_thresholds_match_the_reference(name, logits_fn, params, path):
    """The cut-offs from the candidates (two statistics parts per line here) are the reference's
    exactly, whether they settle among the candidates or fall back to the whole line."""
    g = torch.Generator().manual_seed(len(name))
    target = logits_fn(g)
    tokens = torch.zeros(target.shape[0], target.shape[1] - 1, dtype=torch.int64)
    kw = {"temperature": 1.0, "top_k": None, "top_p": None, "num_draft_tokens": None} | params
    args = _params.validate_verify(target, None, tokens, generator=None, check=False, **kw)
    got, resolved = _triton_thresholds(args, **_PARTS)
    expected = _reference_thresholds(args)
    assert torch.equal(got, expected), f"{name}: {got.tolist()} != {expected.tolist()}"
    if path is not None:  # the case takes the way it is meant to test (resolved 0: the whole-line search)
        assert bool((resolved == (0 if path == "search" else 1)).any()), (name, resolved.tolist())


def _flat_with_ties(g):
    """Flat logits rounded to a coarse grid: many values tie at any cut."""
    return torch.round(0.2 * torch.randn(2, 2, 600, generator=g) * 8) / 8


@pytest.mark.parametrize(
    "name,logits_fn,params",
    [
        # top-k far beyond the candidates: the search over the whole line, split across programs.
        ("large top-k", lambda g: 2 * torch.randn(2, 2, 600, generator=g), {"top_k": torch.tensor([450, 599])}),
        # top-p alone over a flat line: the cut lies below the candidates' floor.
        ("flat top-p 0.99", lambda g: 0.2 * torch.randn(2, 2, 600, generator=g), {"top_p": torch.tensor([0.99, 0.9])}),
        # Both searches on the whole line: top-k's passes, then top-p's, in the one launch.
        ("large top-k then flat top-p", lambda g: 0.3 * torch.randn(2, 2, 600, generator=g), {"top_k": 500, "top_p": 0.97}),
        ("ties at the cut", _flat_with_ties, {"top_k": torch.tensor([300, 0]), "top_p": torch.tensor([1.0, 0.95])}),
        # -inf entries: fewer finite values than k (the cut is -inf), and a line mostly -inf.
        ("-inf", lambda g: torch.where(torch.rand(2, 2, 600, generator=g) < 0.5, float("-inf"), torch.randn(2, 2, 600, generator=g)), {"top_k": 400}),
    ],
)
def test_whole_line_search_matches_the_reference(name, logits_fn, params):
    """Cuts the candidates cannot settle are found by the whole-line search over 128-value chunks (a ragged
    last one), exactly the reference's."""
    g = torch.Generator().manual_seed(len(name))
    target = logits_fn(g)
    tokens = torch.zeros(target.shape[0], target.shape[1] - 1, dtype=torch.int64)
    kw = {"temperature": 0.9, "top_k": None, "top_p": None, "num_draft_tokens": None} | params
    args = _params.validate_verify(target, None, tokens, generator=None, check=False, **kw)
    got, resolved = _triton_thresholds(args, **_PARTS, select_chunk=128)
    expected = _reference_thresholds(args)
    assert torch.equal(got, expected), f"{name}: {got.tolist()} != {expected.tolist()}"


def _search_line(seed: int) -> torch.Tensor:
    """One line of 600 logits of a family of spreads (every seventh on a grid of 1/8: ties; a
    negative seed's capped at 2.0, a quarter of them tied at the top)."""
    if seed < 0:
        return torch.clamp(3 * torch.randn(600, generator=torch.Generator().manual_seed(-seed)), max=2.0)
    g = torch.Generator().manual_seed(seed)
    line = [0.2, 0.3, 1.0, 2.0, 3.0][seed % 5] * torch.randn(600, generator=g)
    return torch.round(line * 8) / 8 if seed % 7 == 0 else line


def _capped_line() -> torch.Tensor:
    """600 logits: 308 normal ones below 0.0 and 292 tied at 0.0, the line max."""
    return torch.clamp(3 * torch.randn(600, generator=torch.Generator().manual_seed(6)), max=0.0)


# Too few candidate slots to settle any cut: every line goes to the whole-line search (128-value chunks).
# (The statistics' top windows off: these lines' top-k takes the search; the windows' own tests set it.)
# (sample_runs 0: the search from its first pass, as where tl.histogram is shared-memory atomics; the sampled start has its own tests)
# (digit_select: ranks by byte histograms and top-p windows of twice the gather's slots on every Triton,
# so that each path below is the one select_search takes; tests that run both ways set it)
_SEARCHED = _PARTS | {"line_slots": 16, "sort": 16, "select_chunk": 128, "key_window": False, "sample_runs": 0, "digit_select": True}

# (line seed, top-k, top-p, gather slots, the stages of the search's passes: select.py's 1 top-k key
# bins, 2 top-p value bins, 6 value bins again, 3 exact key bins, 4 / 5 a gather; a top-p window, 5, takes twice the slots)
_SEARCH_PATHS = [
    (0, 450, 1.0, 16, [1, 1, 1, 1]),  # top-k over key bins to a single key (too many values to gather)
    (1, 40, 0.9, 64, [1, 4]),  # a gather settles top-k, then top-p inside the gathered top-k set
    (0, 40, 0.9, 64, [1, 1, 4]),
    (0, 0, 0.99, 64, [2, 5]),  # value bins place the window, the gather finds the cut in it
    (1, 0, 0.9, 16, [2, 6, 5]),  # the window holds too many values: its bins are binned again first
    (3, 0, 0.9, 16, [2, 5]),  # a window of twice the gather's slots holds what half of it missed
    (23, 0, 0.9, 16, [2, 5, 3, 3, 3]),  # the window misses the cut: exact key bins over the bracket
    (0, 0, 0.99, 16, [2, 6, 3, 3, 3, 3]),  # still too many after binning again: exact key bins
    (8, 0, 0.99, 16, [2, 6, 5, 3, 3, 3, 3]),  # binned again, and the window still misses the cut
    (0, 40, 0.9, 16, [1, 1, 1, 1, 2, 6, 3, 3, 3]),  # top-k over key bins, then top-p
    (1, 300, 0.97, 16, [1, 1, 1, 1, 2, 5]),
    (28, 300, 0.98, 16, [1, 1, 1, 1, 2, 6, 5, 3, 3, 3, 3]),  # the longest: every kind, eleven passes (PASSES)
    (0, 0, 0.99999, 16, [3, 3, 3, 3]),  # no floor (the budget is within the margin of the mass): exact key bins
    # At temperature 1 a max of 2.0 makes the first pass's top bin one key (2.0's): that pass sums
    # the mass above (the others only count) and ends top-k; top-p inside the tied top-k set.
    (-1, 100, 0.5, 16, [1]),
    (-1, 200, 0.9, 16, [1, 1, 1, 1, 2, 5]),  # ... and does not end it (fewer than k tied at the top)
    # A top-k above HISTOGRAM_TOP_K: the statistics launch counted the first pass (bins of 2**24
    # keys), a gather or key bins take the second; at a max of 0.0 (its bin's first key) the cut's
    # bin is that one key, and one pass over it counts the kept set and sums its mass.
    (1, 300, 0.97, 512, [1, 4]),
    ("capped", 280, 1.0, 16, [1, 1]),
    ("capped", 280, 0.9, 16, [1, 1]),
]


@pytest.mark.parametrize("seed,top_k,top_p,gather,stages", _SEARCH_PATHS)
def test_whole_line_search_takes_the_modelled_passes(seed, top_k, top_p, gather, stages):
    """Each way through the whole-line search finds the reference's cut, with the passes that
    bench.gpu_model.select_search (select.py's search in numpy, which the GPU model counts) takes:
    the kernel records each pass's stage in the line's state (a top-k pass that only counts as 7).
    The paths are small (a gather of 16 or 64 slots, 600 values) so that every way is taken."""
    from bench.gpu_model import select_search
    from specdec_ext._params import inverse_temperature

    temperature = 1.0 if seed == "capped" or seed < 0 else 0.9
    target = (_capped_line() if seed == "capped" else _search_line(seed)).reshape(1, 1, 600)
    args = _params.validate_verify(target, None, torch.zeros(1, 0, dtype=torch.int64), generator=None, check=False, temperature=temperature,
                                   top_k=top_k, top_p=top_p, num_draft_tokens=None)
    got, resolved = _triton_thresholds(args, **_SEARCHED, select_gather=gather)
    assert torch.equal(got, _reference_thresholds(args)), got.tolist()
    assert resolved.tolist() == [0]  # the whole-line search cut it
    path = int(_triton_backend.workspace(target.device).ints[_search_state_offset(args, gather) + 7])
    kernel_stages = [int(d, 16) for d in hex(path)[2:]] if path else []
    scaled = (target[0, 0].float() * inverse_temperature(torch.tensor([temperature]))).numpy()
    modelled = select_search(scaled, top_k, top_p, gather=gather)
    assert modelled["stages"] == stages
    assert kernel_stages == modelled["path"][:7]  # (the state records the first seven passes)


def _underflowing_line() -> torch.Tensor:
    """600 logits: 100 standard normal ones among 500 bf16 subnormals, which 1 / temperature = 1e-10
    scales to 0 (distinct bits, one scaled value)."""
    g = torch.Generator().manual_seed(2)
    tiny = torch.randint(1, 61, (500,), generator=g).to(torch.int16).view(torch.bfloat16).float()
    line = torch.cat([torch.randn(100, generator=g), tiny])
    return line[torch.randperm(600, generator=g)]


def _signed_zeros_line() -> torch.Tensor:
    """600 logits: 300 standard normal ones (143 positive) among 150 +0.0 and 150 -0.0."""
    g = torch.Generator().manual_seed(4)
    line = torch.cat([torch.randn(300, generator=g), torch.zeros(150), -torch.zeros(150)])
    return line[torch.randperm(600, generator=g)]


def _grid_line(seed: int) -> torch.Tensor:
    """600 standard normal logits rounded to a grid of 1/4: ties whose values sit on the grid, not
    at the value bins' middles (the bins' estimated masses then place the cut too high or too low)."""
    return torch.round(4 * torch.randn(600, generator=torch.Generator().manual_seed(seed))) / 4


# 16-bit lines (dtype, line: a seed or a kind, temperature, top-k, top-p, stages): top-k over the
# raw keys of their bits (select.py's stage 7): 256 bins of the high byte, then single keys; then
# top-p: value bins (once or twice), then a window of 256 single raw keys around the cut's
# estimated bin (stage 8) where it covers the bins either side, else as for any line. When the raw
# key below the top-k cut scales to the cut's own value (underflow; -0.0 below +0.0), one pass over
# that scaled key (stage 1) finds the kept set.
_RAW_PATHS = [
    (torch.bfloat16, 1, 0.9, 450, 1.0, [7, 7]),
    (torch.bfloat16, 1, 0.9, 40, 0.9, [7, 7, 2, 8]),
    (torch.float16, 1, 0.9, 300, 0.97, [7, 7, 2, 5]),  # no window covers: a gather
    (torch.bfloat16, -1, 1.0, 200, 0.9, [7, 7, 2, 8]),  # ties at the top
    (torch.bfloat16, None, 1e10, 200, 1.0, [7, 7, 1]),  # the cut and the keys below it scale to 0
    (torch.bfloat16, None, 1e10, 200, 0.9, [7, 7, 1, 2, 6, 3, 3, 3, 3]),
    (torch.bfloat16, "zeros", 0.9, 200, 1.0, [7, 7, 1]),  # the cut at +0.0, -0.0 just below it
    (torch.float16, "zeros", 0.9, 400, 1.0, [7, 7]),  # the cut at -0.0: every zero kept
    (torch.bfloat16, -3, 1.0, 0, 0.9, [2, 8]),  # top-p alone: the raw window holds the cut
    (torch.float16, -3, 1.0, 0, 0.5, [2, 8]),
    (torch.float16, -3, 1.0, 0, 0.9, [2, 5]),  # a gather reaches further around the estimated bin: no window
    (torch.bfloat16, -3, 1.0, 300, 0.97, [7, 7, 2, 8]),  # top-p inside the top-k set
    (torch.bfloat16, 38, 0.9, 0, 0.99, [2, 8, 3, 3, 3, 3]),  # the cut above the window: exact key bins above it
    (torch.float16, 38, 0.9, 300, 0.97, [7, 7, 2, 8, 3, 3, 3, 3]),
    (torch.float16, ("grid", 16), 1.0, 0, 0.99, [2, 8, 3, 3, 3]),  # the cut below the window: exact key bins below it
    (torch.float16, ("grid", 11), 1.0, 0, 0.95, [2, 6, 8, 3, 3, 3]),  # value bins twice, then the window
]


@pytest.mark.parametrize("dtype,seed,temperature,top_k,top_p,stages", _RAW_PATHS)
def test_whole_line_search_of_16_bit_lines_takes_raw_key_passes(dtype, seed, temperature, top_k, top_p, stages):
    """A bf16 or fp16 line's top-k takes two passes over the raw keys of its logits (the scaled
    values' order), its top-p a window of single raw keys after value bins; the cut is the
    reference's; the kernel's passes are select_search's (its path records a raw top-k pass as a
    scaled key pass: 7 that only counts, 1 that ends; a raw window as 8)."""
    import numpy as np

    from bench.gpu_model import select_search
    from specdec_ext._params import inverse_temperature

    if isinstance(seed, tuple):
        line = _grid_line(seed[1])
    else:
        line = _underflowing_line() if seed is None else _signed_zeros_line() if seed == "zeros" else _search_line(seed)
    target = line.to(dtype).reshape(1, 1, 600)
    args = _params.validate_verify(target, None, torch.zeros(1, 0, dtype=torch.int64), generator=None, check=False, temperature=temperature,
                                   top_k=top_k, top_p=top_p, num_draft_tokens=None)
    got, resolved = _triton_thresholds(args, **_SEARCHED, select_gather=16)
    assert torch.equal(got, _reference_thresholds(args)), got.tolist()
    assert resolved.tolist() == [0]
    path = int(_triton_backend.workspace(target.device).ints[_search_state_offset(args, 16) + 7])
    inv_t = inverse_temperature(torch.tensor([temperature]))
    raw = (target[0, 0].view(torch.int16).numpy(), "bf16" if dtype == torch.bfloat16 else "fp16", np.float32(inv_t.item()))
    modelled = select_search((target[0, 0].float() * inv_t).numpy(), top_k, top_p, gather=16, raw=raw)
    assert modelled["stages"] == stages
    assert [int(d, 16) for d in hex(path)[2:]] == modelled["path"][:7]


def test_whole_line_search_of_merged_raw_keys_gives_the_reference_tokens():
    """When 1 / temperature merges the raw keys at and below the top-k cut into one scaled value,
    the kept set is every value at or above it (its count and mass found by one more pass): token
    for token, with the probabilities, through the whole call."""
    line = _underflowing_line()
    target = torch.stack([line, line.flip(0)]).to(torch.bfloat16).reshape(1, 2, 600)
    draft = line.roll(7).to(torch.bfloat16).reshape(1, 1, 600)
    tokens = torch.tensor([[3]])
    seeds, offsets = _keys(1)
    for params in ({"top_k": 200}, {"top_k": 200, "top_p": 0.9}):
        args = _args(target, draft, tokens, seeds=seeds, offsets=offsets, temperature=1e10, return_logprobs="processed", return_accept_probs=True,
                     **params)
        assert_same(_triton_backend.verify(args, 3, **_SEARCHED), verify_eager(args, 3))


# (programs of the cut-offs launch, the chunks a search item takes: 14 lines of 15 chunks each take
# runs of 8, 4, 2 or 1 of them as they outnumber the programs 32-, 16-, 8-fold or less; cutoffs.py)
@pytest.mark.parametrize("programs,merge", [(5, 8), (9, 4), (20, 2), (30, 1)])
def test_whole_line_search_in_runs_of_chunks_gives_the_reference_tokens(programs, merge):
    """A search item takes a run of ``merge`` chunks of a line, its last run short (15 chunks of
    128 ids over 1900): top-k then top-p through key bins and a gather, and a flat top-p through
    value bins and a window, target and draft lines, token for token with the probabilities."""
    chunks, lines = 15, 14
    assert 1 + (lines * chunks >= 8 * programs) + 2 * (lines * chunks >= 16 * programs) + 4 * (lines * chunks >= 32 * programs) == merge
    g = torch.Generator().manual_seed(31)
    tokens = torch.randint(0, 1900, (2, 3), generator=g)
    seeds, offsets = _keys(2)
    for scale, params in ((3.0, {"top_k": 300, "top_p": 0.9}), (0.2, {"top_p": 0.99})):
        target = scale * torch.randn(2, 4, 1900, generator=g)
        draft = target[:, :3] + 0.5 * torch.randn(2, 3, 1900, generator=g)
        args = _args(target, draft, tokens, seeds=seeds, offsets=offsets, return_logprobs="processed", return_accept_probs=True, **params)
        assert_same(_triton_backend.verify(args, 3, **_SEARCHED, select_programs=programs), verify_eager(args, 3))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_whole_line_search_through_raw_windows_gives_the_reference_tokens(dtype):
    """Top-p on 16-bit lines through raw windows (select.py's stage 8) that hold the cut and that
    miss it above (and, fp16, below), and through gathers: token for token, with the
    probabilities (the kept mass), through the whole call, target and draft lines, two
    temperatures."""
    target = torch.stack([_search_line(8), _search_line(4), _grid_line(16), _search_line(-3)]).to(dtype).reshape(2, 2, 600)
    draft = torch.stack([_grid_line(11), _grid_line(11).flip(0)]).to(dtype).reshape(2, 1, 600)
    tokens = torch.tensor([[5], [7]])
    seeds, offsets = _keys(2)
    for top_p in (0.9, 0.99):
        args = _args(target, draft, tokens, seeds=seeds, offsets=offsets, temperature=torch.tensor([0.9, 1.0]), top_p=top_p, return_logprobs="processed",
                     return_accept_probs=True)
        assert_same(_triton_backend.verify(args, 3, **_SEARCHED, select_gather=16), verify_eager(args, 3))  # (16 slots: windows, not gathers)


def _search_state_offset(args, gather: int, **geometry) -> int:
    """Where line 0's search state lies in the integer workspace."""
    geo = _triton_backend.geometry(args.target_logits.device, **(_SEARCHED | geometry | {"select_gather": gather}))
    layout = _triton_backend._layout(_triton_backend.prepare(args), geo)
    ws = _triton_backend.workspace(args.target_logits.device)
    bufs = _triton_backend.buffers(ws.floats, ws.ints, ws.counters, layout, args.batch, geo.line_slots, geo.sort)
    return bufs.search.storage_offset()


def _sampled_line(kind: str, vocab: int = 3000) -> torch.Tensor:
    """A line for the sampled start (4 runs of 256 ids over 3000): 3 * N(0, 1); "short", the sampled
    runs 20 higher (the sample reads the line's top as three times denser than it is: too few values
    from its lo up); "ties", every value up to 5 is 0 (the sample's rank lands on them: too many)."""
    from bench.gpu_model import sample_ids

    line = 3 * torch.randn(vocab, generator=torch.Generator().manual_seed(7))
    if kind == "short":
        line[torch.from_numpy(sample_ids(vocab, 4))] += 20.0
    elif kind == "ties":
        line = torch.where(line > 5.0, line, torch.zeros(()))
    return line


_SAMPLED = _SEARCHED | {"sample_runs": 4, "select_gather": 512}


def _sampled_search(target, top_k, top_p, **geometry) -> tuple:
    """(args, the search state's path word) of one sampled line's call at T=0.9 (_SAMPLED, and
    ``geometry``), after checking its cut is the reference's and that the search took it."""
    args = _params.validate_verify(target, None, torch.zeros(1, 0, dtype=torch.int64), generator=None, check=False, temperature=0.9,
                                   top_k=top_k, top_p=top_p, num_draft_tokens=None)
    got, resolved = _triton_thresholds(args, **(_SAMPLED | geometry))
    assert torch.equal(got, _reference_thresholds(args)), got.tolist()
    assert resolved.tolist() == [0]
    return args, int(_triton_backend.workspace(target.device).ints[_search_state_offset(args, 512, sample_runs=4) + 7])

# (line, vocab, top-k, top-p, the stages of the passes for float32 and for bf16)
_SAMPLED_PATHS = [
    ("plain", 3000, 100, 1.0, [4], [4]),  # the sampled gather holds the cut: one pass
    ("plain", 3000, 100, 0.9, [4], [4]),  # ... and top-p inside its top-k set
    ("plain", 600, 100, 1.0, [4], [4]),  # the sample is the whole line: its own k-th key's prefix
    ("short", 3000, 100, 1.0, [4, 1, 1, 4], [4, 7, 7]),  # fewer than k values from lo up: key bins over the line
    ("short", 3000, 100, 0.8, [4, 1, 1, 4], [4, 7, 7, 2, 8]),
    ("ties", 3000, 100, 1.0, [4, 1, 4], [4, 1, 4]),  # more than the slots: key bins over [lo, line max], then a gather
    ("plain", 3000, 300, 1.0, [1, 1, 4], [7, 7]),  # 2k above the slots: no sample
]


@pytest.mark.parametrize("digits", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind,vocab,top_k,top_p,stages32,stages16", _SAMPLED_PATHS)
def test_a_sampled_gather_starts_a_top_k_search(dtype, kind, vocab, top_k, top_p, stages32, stages16, digits):
    """Where tl.histogram is warp ballots (sample_runs), a top-k line the candidates leave starts
    with a gather whose lo a sample of the line places (thresholds.py): the reference's cut
    whichever way it goes, with the passes bench.gpu_model.select_search takes (one gather when it
    holds the cut; else key bins over the side that does), the sample's rank found by halvings or
    by byte histograms (``digits``) alike."""
    from bench.gpu_model import select_search
    from specdec_ext._params import inverse_temperature

    target = _sampled_line(kind, vocab).to(dtype).reshape(1, 1, vocab)
    args, path = _sampled_search(target, top_k, top_p, digit_select=digits)
    inv_t = inverse_temperature(torch.tensor([0.9]))
    raw = (target[0, 0].view(torch.int16).numpy(), "bf16", np.float32(inv_t.item())) if dtype == torch.bfloat16 else None
    modelled = select_search((target[0, 0].float() * inv_t).numpy(), top_k, top_p, gather=512, raw=raw, sample_runs=4, histogram_top_k=1024,
                             window_gather=(2 if digits else 1) * 512)
    assert modelled["stages"] == (stages32 if dtype == torch.float32 else stages16)
    assert modelled["sampled"] == (2 * top_k <= 512)
    assert [int(d, 16) for d in hex(path)[2:]] == modelled["path"][:7]
    if modelled["stages"] == [4]:  # (the sampled lo itself: as many values from it up as the model's, the slot counter after the pass)
        gathered = int(_triton_backend.workspace(target.device).ints[_search_state_offset(args, 512, sample_runs=4) + 6])
        assert gathered == round(modelled["passes"][0]["binned"] * vocab) and top_k <= gathered <= 512


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampled_gathers_give_the_reference_tokens(dtype):
    """Sampled starts that hold the cut and that miss it (both ways), target and draft lines, with
    top-p inside the top-k set: token for token, with the probabilities, through the whole call."""
    target = torch.stack([_sampled_line("plain"), _sampled_line("short"), _sampled_line("ties"), _sampled_line("plain").flip(0)]).to(dtype)
    draft = torch.stack([_sampled_line("short").roll(5), _sampled_line("plain").roll(11)]).to(dtype).reshape(2, 1, 3000)
    tokens = torch.tensor([[5], [7]])
    seeds, offsets = _keys(2)
    for params in ({"top_k": 100}, {"top_k": torch.tensor([100, 60]), "top_p": 0.9}):
        args = _args(target.reshape(2, 2, 3000), draft, tokens, seeds=seeds, offsets=offsets, temperature=torch.tensor([0.9, 1.0]),
                     return_logprobs="processed", return_accept_probs=True, **params)
        assert_same(_triton_backend.verify(args, 3, **_SAMPLED), verify_eager(args, 3))


def _window_line(kind: str, vocab: int = 3000) -> torch.Tensor:
    """A flat line for the sampled raw window (sample_runs 4: a top-p sample takes half, 2 runs of
    256 ids over 3000): 0.2 * N(0, 1); "low", the sampled runs 0.5 lower (the sample reads too
    little mass high up: the window lies below the cut); "high", 0.5 higher (it lies above the cut)."""
    from bench.gpu_model import sample_ids

    line = 0.2 * torch.randn(vocab, generator=torch.Generator().manual_seed(9))
    sampled = torch.from_numpy(sample_ids(vocab, 2))
    if kind != "flat":
        line[sampled] += 0.5 if kind == "high" else -0.5
    return line


# (line, dtype, top-p, the stages of the passes: 8 the raw window, then 2 / 6 value bins, 5 a gather, 8 a raw window again)
_WINDOW_PATHS = [
    ("flat", torch.bfloat16, 0.99, [8]),  # the sampled window holds the cut: one pass
    ("flat", torch.bfloat16, 0.9, [8]),
    ("low", torch.bfloat16, 0.5, [8, 2, 8]),  # the cut above the window: value bins over [past it, line max]
    ("high", torch.bfloat16, 0.9, [8, 6, 8]),  # below it: value bins over [floor, its first value], the mass above summed
    ("flat", torch.float16, 0.9, [8]),
    ("low", torch.float16, 0.5, [8, 2, 5]),  # (fp16's 256 keys are a quarter binade: a gather after the value bins)
    ("high", torch.float16, 0.9, [8, 6, 5]),
]


@pytest.mark.parametrize("kind,dtype,top_p,stages", _WINDOW_PATHS)
def test_a_sampled_raw_window_starts_a_top_p_search(kind, dtype, top_p, stages):
    """Where tl.histogram is warp ballots (sample_runs), a 16-bit line cut by top-p alone that the
    candidates leave starts with a raw window (select.py's stage 8) that a sample of the line
    places (thresholds.py), its counts added by global atomics: the reference's cut whichever way
    it goes, with the passes bench.gpu_model.select_search takes (the candidates' floor as the
    kernel has it). One pass when the window holds the cut; else value bins over the side that
    does, as the line would have started."""
    from bench.gpu_model import candidate_outcome, select_search
    from specdec_ext._params import inverse_temperature

    target = _window_line(kind).to(dtype).reshape(1, 1, 3000)
    args, path = _sampled_search(target, None, top_p)
    inv_t = inverse_temperature(torch.tensor([0.9]))
    scaled = (target[0, 0].float() * inv_t).numpy()
    stats = _triton_backend.launches_for(args, 0, **_SAMPLED)[0]
    c = stats.constexprs
    floor_key = candidate_outcome(scaled, stats.grid[1], c["T_LANES"], c["T_ROWS"], stats.args[-1], c["LINE_SLOTS"], c["SORT"], 0, top_p)["floor_key"]
    raw = (target[0, 0].view(torch.int16).numpy(), "bf16" if dtype == torch.bfloat16 else "fp16", np.float32(inv_t.item()))
    modelled = select_search(scaled, 0, top_p, gather=512, raw=raw, floor_key=floor_key, sample_runs=4)
    assert modelled["sampled_window"] and modelled["stages"] == stages, modelled["stages"]
    assert [int(d, 16) for d in hex(path)[2:]] == modelled["path"][:7]


# (line, top-p, the stages of the passes: 5 the sampled gather, then 2 / 6 value bins, 5 a gather)
_GATHER_PATHS = [
    ("flat", 0.99, [5]),  # the sampled gather holds the cut: one pass
    ("flat", 0.9, [5]),
    ("flat", 0.5, [5]),
    ("low", 0.9, [5, 2, 5]),  # the cut above the gather: value bins over [past it, line max]
    ("high", 0.9, [5, 6, 5]),  # below it: value bins over [floor, its first value], the mass above summed
]


@pytest.mark.parametrize("digits", [False, True])
@pytest.mark.parametrize("kind,top_p,stages", _GATHER_PATHS)
def test_a_sampled_gather_starts_a_float32_top_p_search(kind, top_p, stages, digits):
    """In a call of 32-bit lines (sample_runs), a line cut by top-p alone that the candidates
    leave starts with a gather (select.py's stage 5) that a sample of the line places
    (thresholds.py's _sampled_top_p_gather): the reference's cut whichever way it goes, with the
    passes bench.gpu_model.select_search takes (the candidates' floor as the kernel has it). One
    pass when the gather holds the cut; else value bins over the side that does, as the line would
    have started. The window's bounds by halvings or by byte histograms (``digits``) alike: the
    same slots filled."""
    from bench.gpu_model import candidate_outcome, select_search
    from specdec_ext._params import inverse_temperature

    target = _window_line(kind).reshape(1, 1, 3000)
    args, path = _sampled_search(target, None, top_p, digit_select=digits)
    scaled = (target[0, 0] * inverse_temperature(torch.tensor([0.9]))).numpy()
    stats = _triton_backend.launches_for(args, 0, **_SAMPLED)[0]
    c = stats.constexprs
    floor_key = candidate_outcome(scaled, stats.grid[1], c["T_LANES"], c["T_ROWS"], stats.args[-1], c["LINE_SLOTS"], c["SORT"], 0, top_p)["floor_key"]
    modelled = select_search(scaled, 0, top_p, gather=512, floor_key=floor_key, sample_runs=4, top_p_gather=True, window_gather=(2 if digits else 1) * 512)
    assert modelled["sampled_window"] and modelled["stages"] == stages, modelled["stages"]
    assert [int(d, 16) for d in hex(path)[2:]] == modelled["path"][:7]
    if stages == [5]:  # (the sampled gather's own window: as many values as the model's, the slot counter after its one pass)
        gathered = int(_triton_backend.workspace(target.device).ints[_search_state_offset(args, 512, sample_runs=4) + 6])
        assert gathered == round(modelled["passes"][0]["binned"] * 3000) and 0 < gathered <= (2 if digits else 1) * 512


def test_a_sampled_raw_window_holds_the_cut_of_trained_logits():
    """The embedded target's bf16 logits on a demo document (peaked: the max often outweighs the
    rest, and more candidates than the sort hold; the default 32 runs, whose half for top-p hold
    the line's 1832 values): each sampled window holds the cut, one pass (the estimate never climbs above the line max,
    where no value lies), with the reference's cut and the passes bench.gpu_model.select_search
    takes."""
    from bench.gpu_model import _demo_lines, candidate_outcome, select_search

    lines = _demo_lines(torch.bfloat16)[1][:48:8].to(torch.bfloat16)
    vocab = lines.shape[-1]
    target = lines.reshape(1, 6, vocab)
    args = _params.validate_verify(target, None, torch.zeros(1, 5, dtype=torch.int64), generator=None, check=False, temperature=1.0,
                                   top_k=None, top_p=0.95, num_draft_tokens=None)
    geometry = _SAMPLED | {"sample_runs": 32}
    got, resolved = _triton_thresholds(args, **geometry)
    assert torch.equal(got, _reference_thresholds(args)), got.tolist()
    stats = _triton_backend.launches_for(args, 0, **geometry)[0]
    c = stats.constexprs
    offset = _search_state_offset(args, 512, sample_runs=32)
    searched = 0
    for n, line in enumerate(lines):
        scaled = line.float().numpy()
        outcome = candidate_outcome(scaled, stats.grid[1], c["T_LANES"], c["T_ROWS"], stats.args[-1], c["LINE_SLOTS"], c["SORT"], 0, 0.95)
        if resolved[n]:
            continue
        searched += 1
        modelled = select_search(scaled, 0, 0.95, gather=512, raw=(line.view(torch.int16).numpy(), "bf16", np.float32(1.0)),
                                 floor_key=outcome["floor_key"], sample_runs=32)
        assert modelled["sampled_window"] and modelled["stages"] == [8], (n, modelled["stages"])
        assert int(_triton_backend.workspace(target.device).ints[offset + 8 * n + 7]) == 8
    assert searched >= 3


@pytest.mark.parametrize("dtype,draft_dtype", [(torch.bfloat16, None), (torch.float16, None), (torch.float32, None), (torch.float32, torch.bfloat16)],
                         ids=["bf16", "fp16", "fp32", "fp32-bf16"])
def test_sampled_raw_windows_give_the_reference_tokens(dtype, draft_dtype):
    """Sampled raw windows (16-bit lines) and sampled gathers (a call of 32-bit lines) that hold the
    cut and that miss it (both ways), target and draft lines, two temperatures: token for token,
    with the probabilities (the kept mass), through the whole call, and a block verification's
    cut-offs (the same search). In a mixed call the 16-bit drafts sample, the float32 targets do not."""
    from specdec_ext import _triton_tree
    from specdec_ext.reference_tree import verify_block_eager

    target = torch.stack([_window_line("flat"), _window_line("low"), _window_line("high"), _window_line("flat").flip(0)]).to(dtype)
    draft = torch.stack([_window_line("high").roll(5), _window_line("flat").roll(11)]).to(draft_dtype or dtype).reshape(2, 1, 3000)
    tokens = torch.tensor([[5], [7]])
    seeds, offsets = _keys(2)
    for top_p in (0.9, 0.99):
        args = _args(target.reshape(2, 2, 3000), draft, tokens, seeds=seeds, offsets=offsets, temperature=torch.tensor([0.9, 1.0]), top_p=top_p,
                     return_logprobs="processed", return_accept_probs=True)
        assert_same(_triton_backend.verify(args, 3, **_SAMPLED), verify_eager(args, 3))
    block = _args(target.reshape(2, 2, 3000), draft, tokens, seeds=seeds, offsets=offsets, temperature=0.9, top_p=0.9)
    fused, eager = _triton_tree.verify_block(block, 3, **_SAMPLED), verify_block_eager(block, 3)
    assert torch.equal(fused[0], eager[0]) and torch.equal(fused[1], eager[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_sampled_line_leaves_its_candidates_unsorted(dtype):
    """A top-k line its candidates cannot settle and a sample starts needs none of them sorted
    (thresholds.py): its threshold item skips the sort (a third of its instructions). Its cut stays the
    reference's. Its candidates sorted: a line they settle (exactly the lines the search does
    not list, top-k 10 here, and a k of exactly a line's candidates), and every line the sample
    does not start (no sample, or a k beyond half the slots). (No statistics count keys here:
    HISTOGRAM_TOP_K 1024.)"""
    target = torch.stack([_sampled_line("plain"), _sampled_line("short"), _sampled_line("ties")]).to(dtype).reshape(1, 3, 3000)
    geometry = _SAMPLED | {"histogram_top_k": 1024, "line_slots": 256, "sort": 64}
    call = lambda top_k: _params.validate_verify(target, None, torch.zeros(1, 2, dtype=torch.int64), generator=None, check=False,  # noqa: E731
                                                 temperature=0.9, top_k=top_k, top_p=0.9, num_draft_tokens=None)
    least = min(_packed_candidates(call(100), **(geometry | {"sample_runs": 0})))  # (every line's candidates, packed without a sample)
    for top_k, sample_runs in ((100, 4), (100, 0), (300, 4), (10, 4), (least, 4)):
        args = call(top_k)
        geometry = geometry | {"sample_runs": sample_runs}
        sorted_lines = _sorted_lines(args, **geometry)
        got, resolved = _triton_thresholds(args, **geometry)
        assert torch.equal(got, _reference_thresholds(args)), (top_k, sample_runs, got.tolist())
        sampled_route = sample_runs > 0 and 2 * top_k <= 512
        assert sorted_lines == ([bool(r) for r in resolved.tolist()] if sampled_route else [True] * 3), (top_k, sample_runs, resolved.tolist())
        assert any(sorted_lines) == (top_k != 100 or sample_runs == 0), (top_k, sample_runs)  # (top-k 100: 64 candidates settle none)
        assert top_k != least or any(sorted_lines)  # (a line with exactly k candidates: they settle it)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_top_p_line_its_candidates_leave_stays_unsorted(dtype):
    """A line cut by top-p alone that a sample starts needs only its candidates' mass, an integer
    sum in any order: its threshold item sorts them only when that mass may reach the budget
    (thresholds.py). Sorted: exactly the lines they settle, the third line (64 or 66 candidates)
    at top-p just below their share of its mass (1 - 1e-3 of it); unsorted: the flat lines, the
    third at 1 + 1e-3 of that share (past the 2**-12 margin kept for the float sums), and with 32
    sort slots (more candidates than those even above the level-two floor). Every line is sorted without a sample. The cuts stay the
    reference's."""
    from bench.gpu_model import _order_keys, candidate_outcome

    target = torch.stack([_window_line("flat"), _window_line("low"), _sampled_line("plain")]).to(dtype).reshape(1, 3, 3000)
    geometry = _SAMPLED | {"line_slots": 256, "sort": 128}
    call = lambda top_p: _params.validate_verify(target, None, torch.zeros(1, 2, dtype=torch.int64), generator=None, check=False,  # noqa: E731
                                                 temperature=0.9, top_k=None, top_p=top_p, num_draft_tokens=None)
    stats = _triton_backend.launches_for(call(0.9), 0, **geometry)[0]
    c = stats.constexprs
    scaled = (target[0, 2].float() * _params.inverse_temperature(torch.tensor([0.9]))).numpy()
    outcome = candidate_outcome(scaled, stats.grid[1], c["T_LANES"], c["T_ROWS"], stats.args[-1], c["LINE_SLOTS"], c["SORT"], 0, 0.9)
    weights = np.exp(scaled.astype(np.float64) - scaled.max())
    share = float(weights[_order_keys(scaled) > outcome["floor_key"]].sum() / weights.sum())
    assert 64 <= outcome["above_floor"] <= 66 and 0.8 < share < 0.9, (outcome, share)
    # (top-p, sample runs, sort slots, whether the third line is sorted)
    for top_p, sample_runs, sort, third in ((share * (1 - 1e-3), 4, 128, True), (share * (1 + 1e-3), 4, 128, False), (0.99, 4, 128, False),
                                            (share * (1 - 1e-3), 4, 32, False), (share * (1 - 1e-3), 0, 128, True), (0.99, 0, 32, True)):
        args = call(top_p)
        case = geometry | {"sample_runs": sample_runs, "sort": sort}
        sorted_lines = _sorted_lines(args, **case)
        got, resolved = _triton_thresholds(args, **case)
        assert torch.equal(got, _reference_thresholds(args)), (top_p, sample_runs, sort, got.tolist())
        assert sorted_lines == [sample_runs == 0] * 2 + [third], (top_p, sample_runs, sort, sorted_lines)
        assert resolved.tolist() == [0, 0, int(third and sort == 128)], (top_p, sample_runs, sort, resolved.tolist())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("geometry", [_SEARCHED, _SAMPLED], ids=["key-bins", "sampled"])
def test_fewer_finite_values_than_k_keep_them_all_and_top_p_cuts_inside(dtype, geometry):
    """A line with fewer finite values than k (the rest -inf: a processor's mask): its top-k set is
    every finite value, and top-p cuts inside it. The search's gather from the lowest key holds them
    all, fewer than k: the cut, not a sampled gather that missed it (which would search below the
    lowest key and keep the whole line, top-p unapplied). Then the whole call, token for token, a
    block verification's, and the smallest case: two finite values, top-k 3, top-p 0.05 keeps the
    max alone."""
    from bench.gpu_model import select_search
    from specdec_ext import _triton_tree
    from specdec_ext._params import inverse_temperature
    from specdec_ext.reference_tree import verify_block_eager

    g = torch.Generator().manual_seed(11)
    lines = torch.full((2, 3000), float("-inf"))
    for line, finite in zip(lines, (40, 99), strict=True):
        ids = torch.randperm(3000, generator=g)[:finite]
        line[ids] = 3 * torch.randn(finite, generator=g)
    target = lines.to(dtype).reshape(1, 2, 3000)
    gather = geometry.get("select_gather", 64)
    geometry = geometry | {"select_gather": gather}
    for top_p in (1.0, 0.5):
        args = _params.validate_verify(target, None, torch.zeros(1, 1, dtype=torch.int64), generator=None, check=False, temperature=0.9,
                                       top_k=100, top_p=top_p, num_draft_tokens=None)
        got, resolved = _triton_thresholds(args, **geometry)
        assert torch.equal(got, _reference_thresholds(args)), (top_p, got.tolist())
        assert resolved.tolist() == [0, 0]
        path = int(_triton_backend.workspace(target.device).ints[_search_state_offset(args, gather, **geometry) + 7])
        inv_t = inverse_temperature(torch.tensor([0.9]))
        raw = (target[0, 0].view(torch.int16).numpy(), "bf16", np.float32(inv_t.item())) if dtype == torch.bfloat16 else None
        cutoff = next(launch for launch in _triton_backend.launches_for(args, 0, **geometry) if launch.name == "cutoff")
        modelled = select_search((target[0, 0].float() * inv_t).numpy(), 100, top_p, gather=gather, raw=raw, sample_runs=geometry["sample_runs"],
                                 histogram_top_k=1024, window_gather=cutoff.constexprs["WINDOW_GATHER"])
        assert dtype != torch.float32 or 4 in modelled["stages"], modelled  # (a float32 line's top-k set: one gather from the lowest key)
        assert [int(d, 16) for d in hex(path)[2:]] == modelled["path"][:7]
    seeds, offsets = _keys(1)
    full = _args(target, target[:, :1].roll(7, -1), torch.tensor([[int(target[0, 0].float().argmin())]]), seeds=seeds, offsets=offsets,
                 temperature=0.9, top_k=100, top_p=0.5, return_logprobs="processed", return_accept_probs=True)
    assert_same(_triton_backend.verify(full, 3, **geometry), verify_eager(full, 3))
    block = _args(target, target[:, :1].roll(7, -1), full.draft_tokens, seeds=seeds, offsets=offsets, temperature=0.9, top_k=100, top_p=0.5)
    fused, eager = _triton_tree.verify_block(block, 3, **geometry), verify_block_eager(block, 3)
    assert torch.equal(fused[0], eager[0]) and torch.equal(fused[1], eager[1])  # (block verification's cut-offs: the same search)
    inf = float("-inf")
    tiny = torch.tensor([[[0.0, 0.638] + [inf] * 8, [0.0, inf, inf, inf, inf, inf, 0.7359, 0.0667, inf, inf]]]).to(dtype)
    for draft in (torch.zeros(1, 1, 1, dtype=dtype), tiny[:, :1].roll(-1, -1)):
        small = _args(tiny, draft, torch.tensor([[0]]), seeds=seeds, offsets=offsets, temperature=0.3, top_k=3, top_p=0.05,
                      return_accept_probs=True)
        fused, eager = _triton_backend.verify(small, 3, **geometry), verify_eager(small, 3)
        assert_same(fused, eager)
        assert fused[0].tolist() == [[1, -1]], fused  # token 0 has no mass once top-p keeps the max alone: rejected, the max drawn


@pytest.mark.parametrize("vectors", [False, True])
@pytest.mark.parametrize("digits", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_top_k_gather_reads_raw_keys(dtype, digits, vectors):
    """A 16-bit line's top-k gather tests and writes the raw bits of its logits from the lowest raw
    key whose scaled value reaches lo (select.py's _raw_floor), where 1 / temperature merges raw keys
    into one scaled value (subnormals scaled to 0, -0.0 beside +0.0) and where the cut lies among
    them: the reference's cut and tokens, by one gather, its k-th largest key from the keys sorted
    or by byte histograms (``digits``: many tied keys, empty slots). Where no column is a lane's
    (no digits), a lane's vector of 8 values takes its run of slots (``vectors``: lines of 608
    values, -inf past the 600; _triton_backend.vector_lines), or each value its own (600)."""
    cases = [(_underflowing_line(), 1e10, 200), (_signed_zeros_line(), 0.9, 250), (_signed_zeros_line(), 0.9, 120)]
    geometry = _SAMPLED | {"select_gather": 1024, "digit_select": digits}
    for line, temperature, top_k in cases:
        if vectors:
            line = torch.cat([line, torch.full((8,), float("-inf"))])
        target = torch.stack([line, line.flip(0)]).to(dtype).reshape(1, 2, -1)
        args = _params.validate_verify(target, None, torch.zeros(1, 1, dtype=torch.int64), generator=None, check=False, temperature=temperature,
                                       top_k=top_k, top_p=None, num_draft_tokens=None)
        assert _triton_backend.vector_lines(args) == vectors
        got, resolved = _triton_thresholds(args, **geometry)
        assert torch.equal(got, _reference_thresholds(args)), (temperature, top_k, got.tolist())
        assert resolved.tolist() == [0, 0]
        path = int(_triton_backend.workspace(target.device).ints[_search_state_offset(args, 1024, sample_runs=4) + 7])
        assert path == 4, hex(path)  # (the line is its own sample: one gather)
        seeds, offsets = _keys(1)
        full = _args(target, target[:, :1].roll(3, -1), torch.tensor([[2]]), seeds=seeds, offsets=offsets, temperature=temperature, top_k=top_k,
                     return_logprobs="processed")
        assert_same(_triton_backend.verify(full, 3, **geometry), verify_eager(full, 3))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_statistics_count_the_keys_that_start_a_top_k_search(dtype):
    """A filtered line under a top-k above HISTOGRAM_TOP_K has its keys counted by the statistics
    launch (two parts per line, a ragged last tile; stats.py) in the bins of the search's first
    pass: a 16-bit line's raw keys' high byte, a float32 line's scaled order keys'; the values it
    skips in bin 0, whose count nothing reads. The cut-offs launch starts the search from them,
    leaves zeros, and finds the reference's cut; planted counts that move the bin of the cut give
    another cut (the launch reads them)."""
    from bench.gpu_model import _order_keys, _raw_keys

    g = torch.Generator().manual_seed(3)
    logits = 4 * torch.randn(2, 2, 700, generator=g)
    logits[0, 0, :60] = float("-inf")
    target = logits.to(dtype)
    top_k = torch.tensor([300, _triton_backend.HISTOGRAM_TOP_K])  # row 1: at the limit, not counted
    args = _params.validate_verify(target, None, torch.zeros(2, 1, dtype=torch.int64), generator=None, check=False, temperature=0.9,
                                   top_k=top_k, top_p=None, num_draft_tokens=None)
    geometry = _SEARCHED | {"line_slots": 64, "sort": 64}

    def run(planted=None):
        stats, cutoff = _triton_backend.launches_for(args, 0, **geometry)[:2]
        geo = _triton_backend.geometry(target.device, **geometry)
        layout = _triton_backend._layout(_triton_backend.prepare(args), geo)
        ws = _triton_backend.workspace(target.device)
        counts = _triton_backend.buffers(ws.floats, ws.ints, ws.counters, layout, args.batch, geo.line_slots, geo.sort).histograms.view(-1, 256)
        for launch in (stats, cutoff):
            constexprs = {name: value for name, value in launch.constexprs.items() if name != "maxnreg"}
            if launch is cutoff:
                counted = counts.clone()
                if planted is not None:
                    counts[0] = planted
            launch.kernel[launch.grid](*launch.args, **constexprs)
        assert int(counts.abs().sum()) == 0  # left for the next call
        tau = _triton_backend.buffers(ws.floats, ws.ints, ws.counters, layout, args.batch, geo.line_slots, geo.sort).tau[:4].clone()
        path = int(ws.ints[_search_state_offset(args, _triton_backend.SELECT_GATHER, **geometry) + 7])
        return counted, tau, path

    counted, tau, path = run()
    scaled = target.reshape(4, 700).float() * _params.inverse_temperature(torch.tensor([0.9]))
    if dtype == torch.float32:
        high_bytes = torch.from_numpy(_order_keys(scaled.numpy())) >> 24
    else:
        high_bytes = torch.from_numpy(_raw_keys(target.reshape(4, 700).view(torch.int16).numpy())) >> 8
    finite = scaled > float("-inf")
    for line in range(4):
        want = torch.bincount(high_bytes[line][finite[line]] + 128, minlength=256).int()
        if line < 2:
            assert torch.equal(counted[line, 1:], want[1:]), line
        else:
            assert int(counted[line].abs().sum()) == 0
    assert torch.equal(tau, _reference_thresholds(args))
    assert torch.equal(_triton_thresholds(args, **geometry, histogram_top_k=2**31)[0], tau)  # the first pass over the line instead
    planted = torch.zeros(256, dtype=torch.int32)
    planted[255] = 1000  # "every value in the top bin": the search then looks for the cut there
    _, planted_tau, planted_path = run(planted)
    if dtype == torch.float32:
        # A float32 line gathers the keys of that bin (the counted pass 7, then a gather 4), finds
        # fewer than k and goes on below them (select.py): a pass of key bins and a gather more,
        # the same cut.
        assert path == 0x74 and planted_path == 0x7474
        assert torch.equal(planted_tau, tau)
    else:
        assert not torch.equal(planted_tau, tau)


def _window_lines(dtype, vocab: int = 700) -> torch.Tensor:
    """Three 700-value lines whose top-k 300 lies in the statistics' top windows (2 + N(0, 0.5):
    every value within two octaves of the max, so a bf16 window of 255 raw keys holds them all),
    or, fp16 (four times finer keys), below the window."""
    return (2 + 0.5 * torch.randn(3, vocab, generator=torch.Generator().manual_seed(11))).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [700, 1500])
def test_statistics_count_each_parts_top_window(dtype, vocab):
    """A 16-bit line under a top-k above HISTOGRAM_TOP_K with the key window: each statistics part
    stores the counts of the 255 single raw keys up to two above its max's logit's (stats.py), then
    that top key, and adds every value to the line's high bytes' counts. Two parts per line, a
    ragged last tile; at 1500 values a part of three tiles, whose last block of counts (two tiles a
    block) ends inside it: its own values alone, none of the next part's."""
    from bench.gpu_model import _raw_keys

    target = _window_lines(dtype, vocab)[:2].reshape(1, 2, vocab)
    args = _params.validate_verify(target, None, torch.zeros(1, 1, dtype=torch.int64), generator=None, check=False, temperature=0.9,
                                   top_k=300, top_p=None, num_draft_tokens=None)
    geometry = _SEARCHED | {"key_window": True}
    stats = _triton_backend.launches_for(args, 0, **geometry)[0]
    constexprs = {name: value for name, value in stats.constexprs.items() if name != "maxnreg"}
    assert constexprs["KEY_WINDOW"]
    geo = _triton_backend.geometry(target.device, **geometry)
    layout = _triton_backend._layout(_triton_backend.prepare(args), geo)
    ws = _triton_backend.workspace(target.device)
    bufs = _triton_backend.buffers(ws.floats, ws.ints, ws.counters, layout, args.batch, geo.line_slots, geo.sort)
    bufs.histograms.zero_()
    stats.kernel[stats.grid](*stats.args, **constexprs)
    part = stats.args[-1] * constexprs["T_LANES"] * constexprs["T_ROWS"]
    windows = bufs.windows.view(-1, layout["tiles"], 256)
    keys = torch.from_numpy(_raw_keys(target.reshape(2, vocab).view(torch.int16).numpy()))
    scaled = target.reshape(2, vocab).float() * _params.inverse_temperature(torch.tensor([0.9]))
    for line in range(2):
        high = torch.zeros(256, dtype=torch.int32)
        for p, start in enumerate(range(0, vocab, part)):
            own, values = keys[line, start : start + part], scaled[line, start : start + part]
            logit = (values.max() / _params.inverse_temperature(torch.tensor([0.9]))).to(dtype)
            nearest = int(_raw_keys(logit.view(torch.int16).reshape(1).numpy())[0]) + 2
            top = int(windows[line, p, 255])
            # (two above the max's logit: max / inv_t may round to it or, a float32 ulp below, to the logit below)
            assert top in (nearest, nearest - 1) and int(own.max()) <= top
            inside = own >= top - 254
            assert torch.equal(windows[line, p, :255], torch.bincount(own[inside] - (top - 254), minlength=255).int()), (line, p)
            high += torch.bincount((own >> 8) + 128, minlength=256).int()
        low = 4 if dtype == torch.float16 else 1  # (-inf's bin, 3 or 0, also counts the ragged tile's padding)
        assert torch.equal(bufs.histograms.view(-1, 256)[line, low:], high[low:])
    bufs.histograms.zero_()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_top_k_in_the_top_window_needs_no_search(dtype):
    """When the statistics' top windows hold k values of a 16-bit line (bf16 here), its top-k is
    settled from their exact counts: the line is never listed for the whole-line search, and top-p
    inside that set starts at its value bins. fp16's finer keys leave the cut below the window: the
    high bytes' counts start the search as without it. Either way the
    tokens and probabilities are the reference's, and bench.gpu_model.select_search (with the
    statistics parts' size) takes the kernel's passes."""
    import numpy as np

    from bench.gpu_model import select_search

    lines = _window_lines(dtype)
    target, draft = lines[:2].reshape(1, 2, 700), lines[2:].reshape(1, 1, 700)
    tokens = torch.tensor([[4]])
    seeds, offsets = _keys(1)
    geometry = _SEARCHED | {"key_window": True}
    stats = _triton_backend.launches_for(_args(target, draft, tokens, top_k=300), 0, **geometry)[0]
    part = stats.args[-1] * stats.constexprs["T_LANES"] * stats.constexprs["T_ROWS"]
    inv_t = np.float32(1.0) / np.float32(0.9)
    for top_p in (None, 0.9):
        args = _args(target, draft, tokens, seeds=seeds, offsets=offsets, top_k=300, top_p=top_p, return_logprobs="processed", return_accept_probs=True)
        assert_same(_triton_backend.verify(args, 3, **geometry), verify_eager(args, 3))
        got, resolved = _triton_thresholds(args, **geometry)
        assert torch.equal(got, _reference_thresholds(args))
        path = int(_triton_backend.workspace(target.device).ints[_search_state_offset(args, 16, key_window=True) + 7])
        line = target[0, 0]
        raw = (line.view(torch.int16).numpy(), "bf16" if dtype == torch.bfloat16 else "fp16", inv_t)
        modelled = select_search((line.float() * torch.tensor(inv_t)).numpy(), 300, top_p or 1.0, raw=raw, window_part=part)
        settled = dtype == torch.bfloat16 and top_p is None
        assert resolved.tolist() == [int(settled)] * 2
        assert (modelled["passes"] == []) == settled
        # A line whose windows hold k values takes its cut from them before any sort: it sorts none
        # (every bf16 line; fp16's, whose cut lies below their windows, sort), as modelled. (More
        # candidate slots, so that every line that sorts has some to store.)
        sorted_lines = _sorted_lines(args, **(geometry | {"line_slots": 256, "sort": 64}))
        assert sorted_lines == [dtype == torch.float16] * 3, top_p
        assert sorted_lines[0] == (not modelled["top_k_window"])
        if not settled:
            assert [int(d, 16) for d in hex(path)[2:]] == modelled["path"][:7]
        if dtype == torch.bfloat16:
            assert modelled["path"][:1] != [7]  # (no pass of the high bytes' counts)


def test_top_k_window_gives_way_where_temperature_merges_or_overflows():
    """The top window's edge cases, token for token (bf16): the raw key below the window scaling to
    the cut's value (1 / temperature = 1e-10 merges every logit into +-0.0: one pass over that
    scaled key finds the kept set), and logits that 1 / temperature = 8 scales to -inf, which the
    statistics count at their own keys (no test per value): with fewer than k others the search
    keeps every value, as the reference; with more, their byte is below the cut's."""
    g = torch.Generator().manual_seed(12)
    # bf16 subnormals, 500 positive and 100 negative: 1e-10 scales them to +0.0 and -0.0, one value
    bits = torch.randint(1, 61, (600,), generator=g).to(torch.int16)
    merged = torch.where(torch.arange(600) < 500, bits, bits | -32768).to(torch.int16).view(torch.bfloat16).float()[torch.randperm(600, generator=g)]
    huge = torch.cat([torch.randn(300, generator=g), torch.full((300,), -6e37)])[torch.randperm(600, generator=g)]
    seeds, offsets = _keys(1)
    geometry = _SEARCHED | {"key_window": True}
    for line, temperature, top_k in ((merged, 1e10, 300), (huge, 0.125, 450), (huge, 0.125, 280)):
        target = torch.stack([line, line.flip(0)]).to(torch.bfloat16).reshape(1, 2, 600)
        draft = line.roll(5).to(torch.bfloat16).reshape(1, 1, 600)
        for top_p in (None, 0.9):
            args = _args(target, draft, torch.tensor([[2]]), seeds=seeds, offsets=offsets, temperature=temperature, top_k=top_k, top_p=top_p,
                         return_logprobs="processed", return_accept_probs=True)
            assert_same(_triton_backend.verify(args, 3, **geometry), verify_eager(args, 3))
            assert torch.equal(_triton_thresholds(args, **geometry)[0], _reference_thresholds(args))


def _call_buffers(args, **geometry):
    """(the call's workspace buffers, its layout), as a call with this geometry finds them."""
    args = _triton_backend.prepare(args)
    geo = _triton_backend.geometry(args.target_logits.device, **geometry)
    layout = _triton_backend._layout(args, geo)
    ws = _triton_backend.workspace(args.target_logits.device)
    return _triton_backend.buffers(ws.floats, ws.ints, ws.counters, layout, args.batch, geo.line_slots, geo.sort), layout


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), 1e30])
def test_candidate_slots_past_their_counts_change_no_cut(poison):
    """A threshold item loads a line's candidate slots whole, with their counts (no slot's address
    waits for a count), and masks the slots past each part's count: slots left holding NaN, +inf or
    a value above every candidate change no cut, settled among the candidates or by the search."""
    g = torch.Generator().manual_seed(11)
    target = 2 * torch.randn(2, 3, 3000, generator=g)
    tokens = torch.zeros(2, 2, dtype=torch.int64)
    for params in ({"temperature": 0.7, "top_k": 50, "top_p": 0.8}, {"top_k": 900}):
        kw = {"temperature": 1.0, "top_k": None, "top_p": None, "num_draft_tokens": None} | params
        args = _params.validate_verify(target, None, tokens, generator=None, check=False, **kw)
        _triton_backend.verify(args, 0, **_PARTS)  # (the workspace sized for the call)
        bufs, _ = _call_buffers(args, **_PARTS)
        bufs.cand.fill_(poison)
        got, resolved = _triton_thresholds(args, **_PARTS)
        assert torch.equal(got, _reference_thresholds(args)), (params, got.tolist())
        assert bool((resolved == (1 if "top_p" in params else 0)).any())  # (settled among the candidates; top-k 900: by the search)
        assert_same(_triton_backend.verify(args, 0, **_PARTS), verify_eager(args, 0))


def _top_p_window_bounds(args, **geometry) -> torch.Tensor:
    """(lines, 3): each line's top-p window bounds as its statistics left them (lo, zero_lo,
    zero_span; lo -2**31: not counted), read from the call's workspace after a call."""
    bufs, layout = _call_buffers(args, **geometry)
    bins = layout["top_p_bins"]
    return bufs.top_p_windows.view(-1, bins + 4)[:, bins : bins + 3].clone()


def _packed_candidates(args, **geometry) -> list[int]:
    """How many candidates the threshold items packed to sort, per line, in a call (a verify):
    each line's sort slots are filled with a mark before it, which only the packing of its
    candidates overwrites (after a first call, which sizes the workspace for it)."""
    _triton_backend.verify(args, 3, **geometry)
    bufs, _ = _call_buffers(args, **geometry)
    bufs.sort.fill_(-7)
    _triton_backend.verify(args, 3, **geometry)
    bufs, _ = _call_buffers(args, **geometry)
    return (bufs.sort.view(_lines(args), -1) != -7).sum(dim=1).tolist()


def _sorted_lines(args, **geometry) -> list[bool]:
    """Which lines' candidates the threshold items sorted in a call (``_packed_candidates``)."""
    return [packed > 0 for packed in _packed_candidates(args, **geometry)]


def _lines(args) -> int:
    batch, k = args.draft_tokens.shape
    return batch * (k + 1) + (batch * k if args.draft_logits is not None else 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)])  # (fp16: no window; CI's slow step)
def test_top_p_window_settles_flat_lines(dtype):
    """A bf16 line cut by top-p alone, which one statistics program reads whole and whose
    candidates do not settle (flat: N(0, 1) logits, few sort slots), has its raw keys counted one a
    bin (stats.py's top-p window); the threshold item finds the cut from those exact counts and the
    line is never listed for the whole-line search. Without the window the search cuts it; fp16
    lines (four times finer keys) have no window. Either way the tokens, probabilities and cuts
    are the reference's, and bench.gpu_model.select_search takes the same way (no pass)."""
    import numpy as np

    from bench.gpu_model import select_search

    g = torch.Generator().manual_seed(21)
    target = torch.randn(1, 3, 3000, generator=g).to(dtype)
    draft = torch.randn(1, 2, 3000, generator=g).to(dtype)
    tokens = torch.tensor([[4, 7]])
    seeds, offsets = _keys(1)
    geometry = {"line_slots": 256, "sort": 64}
    assert _triton_backend.launches_for(_args(target, draft, tokens, top_p=0.9), 0, **geometry)[0].grid[1] == 1  # one part a line
    for temperature, top_p in ((1.0, 0.99), (0.7, 0.9)):
        for window in (True, False):
            args = _args(target, draft, tokens, seeds=seeds, offsets=offsets, temperature=temperature, top_p=top_p, return_logprobs="processed",
                         return_accept_probs=True)
            assert_same(_triton_backend.verify(args, 3, top_p_window=window, **geometry), verify_eager(args, 3))
            got, resolved = _triton_thresholds(args, top_p_window=window, **geometry)
            assert torch.equal(got, _reference_thresholds(args))
            settled = window and dtype == torch.bfloat16
            assert resolved.tolist() == [int(settled)] * 3, (temperature, window)
            if settled:
                assert (_top_p_window_bounds(args, **geometry)[:5, 0] != -(2**31)).all()  # every line counted (drafts too)
            # A line its window settles is cut before its candidates are sorted: it sorts none; so
            # does one a sample starts (where tl.histogram is warp ballots), its candidates short.
            sampled = _triton_backend.sample_runs_default((dtype,)) > 0
            assert _sorted_lines(args, top_p_window=window, **geometry) == [not (settled or sampled)] * 5, (temperature, window)
        inv_t = np.float32(1.0) / np.float32(temperature)
        line = target[0, 1]
        raw = (line.view(torch.int16).numpy(), "bf16" if dtype == torch.bfloat16 else "fp16", inv_t)
        modelled = select_search((line.float() * torch.tensor(inv_t)).numpy(), 0, top_p, raw=raw, top_p_window=dtype == torch.bfloat16)
        assert (modelled["passes"] == []) == (dtype == torch.bfloat16)
        assert modelled["cut"] == _order_key(float(got[1]))


def _order_key(value: float) -> int:
    from bench.gpu_model import _order_key as key

    return key(value)


def test_top_p_window_edge_cases():
    """The top-p window's edge cases, token for token (bf16, top-p alone, one part a line, the
    candidates too few to settle): -inf logits, both zeros and subnormals; logits that 1 /
    temperature = 8 scales to -inf (counted at their own keys, where they weigh 0); a max near 0,
    whose ulp merges no key beyond the zeros; a line all below -10; ties by the hundred. Two
    windows are counted, not used, and the search cuts their lines: ties whose cut is 0.0, in the
    bin of the merged keys near 0 (the least of them present is the cut, which the counts do not
    tell), and a line whose max is 0 with its mass spread 20 below, which no window of 8192 keys
    reaches. A peaked line, which the candidates settle, is not
    counted at all."""
    g = torch.Generator().manual_seed(23)
    n = 2000
    base = torch.randn(n, generator=g)
    special = base.clone()
    special[:100] = float("-inf")
    special[100:140] = torch.tensor([0.0, -0.0] * 20)
    special[140:160] = torch.tensor([1e-40, -1e-40] * 10)  # bf16 subnormals
    huge = torch.where(torch.arange(n) < 600, torch.full((n,), -6e37), base / 8)  # (flat once scaled by 8)
    tiny = 1e-3 * base
    negative = -10 + base
    ties = torch.randint(-3, 3, (n,), generator=g).float()  # (the cut at 0.0: the merged keys' bin, which leaves it to the search)
    halves = ties + 0.5
    zero_max = -20 * torch.rand(n, generator=g)
    zero_max[7] = 0.0
    peaked = base.clone()
    peaked[11] = 40.0
    seeds, offsets = _keys(1)
    geometry = {"stats_tile": 256, "stats_parts": 1, "line_slots": 256, "sort": 64, "top_p_window": True}  # (eight values a lane, one part a line)
    cases = ((special, 1.0, 0.95, True), (huge, 0.125, 0.9, True), (tiny, 1.0, 0.9, True), (negative, 0.8, 0.95, True), (halves, 1.0, 0.9, True),
             (ties, 1.0, 0.9, False), (zero_max, 1.0, 0.95, False), (peaked, 1.0, 0.9, None))
    for line, temperature, top_p, settles in cases:
        order = torch.randperm(n, generator=g)
        target = torch.stack([line[order], line[order].flip(0)]).to(torch.bfloat16).reshape(1, 2, n)
        draft = line[order].roll(5).to(torch.bfloat16).reshape(1, 1, n)
        args = _args(target, draft, torch.tensor([[2]]), seeds=seeds, offsets=offsets, temperature=temperature, top_p=top_p,
                     return_logprobs="processed", return_accept_probs=True)
        assert_same(_triton_backend.verify(args, 3, **geometry), verify_eager(args, 3))
        got, resolved = _triton_thresholds(args, **geometry)
        assert torch.equal(got, _reference_thresholds(args)), (temperature, top_p)
        counted = _top_p_window_bounds(args, **geometry)[:3, 0] != -(2**31)
        assert counted.tolist() == [settles is not None] * 3, (temperature, top_p)
        if settles is not None:
            assert resolved.tolist() == [int(settles)] * 2, (temperature, top_p)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_top_k_search_takes_the_mass_above_its_raw_window_from_the_candidates(dtype):
    """A 16-bit line's top-k search after the statistics' counts: when the candidates hold every
    value above the raw window of single keys (a line whose few large values lie apart), the threshold item sums their fixed-point mass
    (thresholds.py, the state's words 4 and 5) and the window's pass only counts; the kept mass is
    then the same integers, so the tokens and probabilities are the reference's, top-k alone and
    with top-p inside it. With too few sort slots to hold the candidates the mass is not known (-1)
    and the pass sums it, with the same result."""
    import numpy as np

    from bench.gpu_model import _fixed_weights, _raw_keys, candidate_outcome, select_search

    g = torch.Generator().manual_seed(8)
    # 670 values near -5 and 30 well above them (20 near 1, 10 near 8), at most two in any lane:
    # the cut of top-k 300 in the bin of raw keys from -8 to -2, the 30 above its keys candidates.
    lines = -5 + 0.05 * torch.randn(3, 700, generator=g)
    spread = torch.arange(0, 690, 23)
    lines[:, spread[:20]] = 1 + 0.1 * torch.randn(3, 20, generator=g)
    lines[:, spread[20:]] = 8 + torch.randn(3, 10, generator=g)
    target, draft = lines[:2].reshape(1, 2, 700).to(dtype), lines[2:].reshape(1, 1, 700).to(dtype)
    tokens = torch.tensor([[4]])
    seeds, offsets = _keys(1)
    scaled = (target[0, 0].float() * _params.inverse_temperature(torch.tensor([0.9]))).numpy()
    high = _raw_keys(target[0, 0].view(torch.int16).numpy())
    counts = np.bincount((high >> 8) + 128, minlength=256)
    best = max(b for b in range(256) if counts[b:].sum() >= 300)
    above = high > best * 256 - 32768 + 255
    want = int(_fixed_weights(scaled[above], scaled.max()).sum())
    for sort, known in ((256, want), (16, -1)):
        geometry = _SEARCHED | {"line_slots": 256, "sort": sort, "stats_tile": 64, "stats_parts": 1}  # (11 values a lane)
        for top_p in (None, 0.9):
            args = _args(target, draft, tokens, seeds=seeds, offsets=offsets, top_k=300, top_p=top_p, return_logprobs="processed", return_accept_probs=True)
            assert_same(_triton_backend.verify(args, 3, **geometry), verify_eager(args, 3))
            if top_p is None:  # (top-p's search keeps its bracket in those words)
                words = _triton_backend.workspace(target.device).ints[_search_state_offset(args, 16, **geometry) + 4 :][:2].long()
                assert int(words[0] & 0xFFFFFFFF | words[1] << 32) == known, sort
        # The GPU model's search (select_search, with candidate_outcome's floor) takes the pass that only counts alike.
        stats = _triton_backend.launches_for(args, 0, **geometry)[0]
        c = stats.constexprs
        floor_key = candidate_outcome(scaled, stats.grid[1], c["T_LANES"], c["T_ROWS"], stats.args[-1], c["LINE_SLOTS"], sort, 300, 1.0)["floor_key"]
        raw = (target[0, 0].view(torch.int16).numpy(), "bf16" if dtype == torch.bfloat16 else "fp16", np.float32(1.0) / np.float32(0.9))
        modelled = select_search(scaled, 300, 1.0, raw=raw, floor_key=floor_key)["passes"]
        assert [q["statistics"] for q in modelled] == [True, False] and modelled[1]["mass_known"] == (known >= 0), sort


@pytest.mark.parametrize("programs", [1, 2, 7])
def test_whole_line_search_does_not_depend_on_the_number_of_programs(programs):
    """The cut-offs launch's work items go to whichever program draws their ticket, so the cuts do not
    depend on the number of programs (top-k then top-p on the whole line). Under the interpreter the
    programs run one after another: the first takes every item and the others draw only the ticket
    that ends them, which checks the launch's end (the exit count and the reset of its counters).
    The four lines' 20 chunks are searched in items of 4 chunks by one program (16-fold or more),
    of 2 by two (8-fold) and of 1 by seven: runs of chunks, ragged at a line's end (5 chunks)."""
    g = torch.Generator().manual_seed(5)
    target = 0.3 * torch.randn(2, 2, 600, generator=g)
    tokens = torch.zeros(2, 1, dtype=torch.int64)
    args = _params.validate_verify(target, None, tokens, generator=None, check=False, temperature=0.9, top_k=torch.tensor([500, 0]),
                                   top_p=torch.tensor([0.97, 0.99]), num_draft_tokens=None)
    got, resolved = _triton_thresholds(args, **_SEARCHED, select_programs=programs)
    assert torch.equal(got, _reference_thresholds(args)), got.tolist()
    assert resolved.tolist() == [0, 0, 0, 0]  # every line searched
    assert int(_triton_backend.workspace(target.device).counters.abs().sum()) == 0


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)])  # (bf16: CI's slow step)
def test_whole_line_search_gives_the_reference_tokens(dtype):
    """Token for token through the whole call (draft lines too, a ragged row), when the cut of
    every line needs the search over the whole line."""
    target, draft, tokens = _case(2, 2, 520, dtype, seed=21, noise=0.2)
    target, draft = (target.float() * 0.15).to(dtype), (draft.float() * 0.15).to(dtype)
    seeds, offsets = _keys(2)
    for params in ({"top_k": torch.tensor([400, 7])}, {"top_p": 0.99, "temperature": 1.3}):
        args = _args(target, draft, tokens, seeds=seeds, offsets=offsets, num_draft_tokens=torch.tensor([2, 1]), return_logprobs="processed",
                     return_accept_probs=True, **params)
        assert_same(_triton_backend.verify(args, 3, **_PARTS, select_chunk=128), verify_eager(args, 3))


@pytest.mark.parametrize("geometry,settles", [
    ({"line_slots": 64}, True),  # a part's quota of 32 slots: its floor rises to the largest second value, or to its max
    ({"sort": 32}, True),  # more candidates above the line floor than the sort holds: the level-two floor
    ({"line_slots": 16, "sort": 16}, False),  # too few slots for any cut: every line falls back to the whole-line search
])
def test_candidate_limits_keep_the_cut_exact(geometry, settles):
    """When a part's candidates overflow its slots, or a line's overflow the sort, the floors rise
    (fewer candidates, the same guarantee) or the line falls back to the whole-line search: the
    cut stays the reference's."""
    g = torch.Generator().manual_seed(17)
    target = 3 * torch.randn(2, 3, 3000, generator=g)
    tokens = torch.zeros(2, 2, dtype=torch.int64)
    args = _params.validate_verify(target, None, tokens, generator=None, check=False, temperature=0.8, top_k=torch.tensor([8, 0]),
                                   top_p=torch.tensor([0.9, 0.5]), num_draft_tokens=None)
    got, resolved = _triton_thresholds(args, **_PARTS, **geometry)
    assert torch.equal(got, _reference_thresholds(args)), got.tolist()
    assert bool((resolved == 1).any()) == settles, resolved.tolist()


@pytest.mark.parametrize("params", [{"top_k": 40, "top_p": 0.9}, {"top_p": 0.95}])
def test_the_gpu_model_follows_the_candidates_rules(params):
    """bench.gpu_model.candidate_outcome (which measures on LM logits how often the candidates
    settle a cut) agrees with the kernels' own resolved flags, line by line."""
    from bench.gpu_model import candidate_outcome

    g = torch.Generator().manual_seed(23)
    target = torch.randn(2, 3, 3000, generator=g) * torch.tensor([0.5, 2.0, 6.0])[None, :, None]
    tokens = torch.zeros(2, 2, dtype=torch.int64)
    args = _params.validate_verify(target, None, tokens, generator=None, check=False, temperature=1.0, num_draft_tokens=None,
                                   **({"top_k": None, "top_p": None} | params))
    _, resolved = _triton_thresholds(args, **_PARTS)
    tiles = -(-3000 // _PARTS["stats_tile"])
    outcomes = [candidate_outcome(line.numpy(), 2, _PARTS["stats_tile"], 1, -(-tiles // 2), _triton_backend.LINE_SLOTS, _triton_backend.SORT,
                                  params.get("top_k", 0), params.get("top_p", 1.0))["resolved"] for line in target.reshape(-1, 3000)]
    assert resolved.tolist() == [int(o) for o in outcomes]
    assert 0 < sum(outcomes) < len(outcomes) or params.get("top_k")  # both ways are compared where the case allows


def _strided(values: list) -> torch.Tensor:
    """A (B,) view with stride 2 (every other entry of a longer tensor)."""
    return torch.tensor([[v, -7] for v in values]).reshape(-1)[::2]


def test_per_row_tensors_of_any_layout():
    """The kernels read row b's seed, offset and parameters at offset b: strided views and a
    broadcast 0-d tensor give the same tokens as their contiguous copies, on every path (the
    default call, a prepared Verifier and Sampler, a tree) and every backend."""
    target, draft, tokens = _case(3, 2, 300, torch.float32, seed=4)
    seeds, offsets = _strided([11, 12, 13]), _strided([0, 5, 9])
    top_k = _strided([5, 40, 0])
    assert not seeds.is_contiguous() and not top_k.is_contiguous()
    params = {"temperature": torch.tensor(0.8), "top_k": top_k}
    plain = {"temperature": torch.full((3,), 0.8), "top_k": top_k.contiguous()}
    backends = all_cpu_backends()  # triton and eager, and cpp where the extension loads
    assert {"triton", "eager"} <= set(backends)
    for backend in backends:
        got = specdec_ext.verify(target, draft, tokens, seeds=seeds, offsets=offsets, backend=backend, **params)
        want = specdec_ext.verify(target, draft, tokens, seeds=seeds.contiguous(), offsets=offsets.contiguous(), backend="eager", **plain)
        assert torch.equal(got.tokens, want.tokens), backend
        verifier = specdec_ext.Verifier(3, 2, 300, backend=backend, check=False, **params)
        for _ in range(2):  # the first call binds the plan, the second takes the bound path
            assert torch.equal(verifier(target, draft, tokens, seeds=seeds, offsets=offsets)[0], want.tokens), backend
        sampler = specdec_ext.Sampler(3, 300, backend=backend, check=False, **params)
        drawn = specdec_ext.sample(target[:, 0], seeds=seeds.contiguous(), backend="eager", **plain)
        for _ in range(2):
            assert torch.equal(sampler(target[:, 0].contiguous(), seeds=seeds), drawn), backend
    parents = torch.tensor([[-1, -1, 0, 2]] * 3)
    nodes = torch.randint(0, 300, (3, 4), generator=torch.Generator().manual_seed(1))
    tree_target = _case(3, 4, 300, torch.float32, seed=5)[0]
    tree_draft = tree_target + torch.randn(tree_target.shape, generator=torch.Generator().manual_seed(2))
    trees = [specdec_ext.verify_tree(tree_target, tree_draft, nodes, parents, seeds=s, offsets=o, backend=backend, **p)
             for backend, s, o, p in (("triton", seeds, offsets, params), ("eager", seeds.contiguous(), offsets.contiguous(), plain))]
    assert torch.equal(trees[0].tokens, trees[1].tokens) and torch.equal(trees[0].accepted_nodes, trees[1].accepted_nodes)
