"""Tree and block verification on the C++ kernel, and the filter beneath every path: bit-identical
results whatever the thread count, the scheduler, the batch a row sits in and the instruction-set
variant (AVX2 = AVX-512; the portable build may differ in the last bit of exp only, so it is held to
the reference's tokens); lines long enough to span several 8192-entry chunks, filtered lines split
across threads (top-p-only lines through their value-histogram window); and the filter's kept set
{s >= tau} equal to the reference's on lines that take every path of the window (flat, peaked,
tied, deep cuts, huge logits)."""

from __future__ import annotations

import zlib

import pytest
import torch

import specdec_ext
from specdec_ext import _cpp_backend
from specdec_ext.api import verify_tree
from specdec_ext.reference import filter_thresholds, process_lines

needs_cpp = pytest.mark.skipif(not _cpp_backend.is_available(), reason=f"C++ extension unavailable: {_cpp_backend.unavailable_reason()}")
pytestmark = needs_cpp


@pytest.fixture(autouse=True)
def _restore_threads_and_scheduler():
    threads, scheduler = torch.get_num_threads(), _cpp_backend._C.scheduler() if _cpp_backend.is_available() else None
    yield
    torch.set_num_threads(threads)
    if scheduler is not None:
        _cpp_backend._C.set_scheduler(scheduler)
        _cpp_backend._C.set_isa("auto")


PARAMS = {  # per row: plain, temperature, top-p alone (the window), top-k, both, greedy
    "temperature": torch.tensor([1.0, 0.7, 1.0, 1.2, 0.9, 0.0]),
    "top_k": torch.tensor([0, 0, 0, 40, 200, 0]),
    "top_p": torch.tensor([1.0, 1.0, 0.9, 1.0, 0.95, 1.0]),
}


def _tree_case(seed: int, batch: int = 6, nodes: int = 7, vocab: int = 20000):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, nodes + 1, vocab, generator=g) * 2
    draft = target + 0.5 * torch.randn(batch, nodes + 1, vocab, generator=g)
    tokens = torch.multinomial(draft.softmax(-1).reshape(-1, vocab), 1, generator=g).reshape(batch, nodes + 1)[:, :nodes]
    tokens[5, 0] = target[5, 0].argmax()  # the greedy row enters a child
    parents = torch.tensor([[-1, -1, 0, 0, 1, 2, -1]] * batch)
    seeds = torch.randint(0, 2**62, (batch,), generator=g)
    offsets = torch.randint(0, 2**40, (batch,), generator=g)
    return target, draft, tokens, parents, seeds, offsets


def _block_case(seed: int, batch: int = 6, k: int = 4, vocab: int = 20000):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2
    draft = target[:, :k] + 0.5 * torch.randn(batch, k, vocab, generator=g)
    tokens = torch.multinomial(draft.softmax(-1).reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    seeds = torch.randint(0, 2**62, (batch,), generator=g)
    offsets = torch.randint(0, 2**40, (batch,), generator=g)
    return target, draft, tokens, seeds, offsets


def _tree_rows(case, rows, siblings):
    target, draft, tokens, parents, seeds, offsets = case
    index = torch.tensor(rows)
    params = {name: value[index] for name, value in PARAMS.items()}
    out = verify_tree(target[index], None if siblings == "deterministic" else draft[index], tokens[index], parents[index], seeds=seeds[index],
                      offsets=offsets[index], siblings="iid" if siblings == "deterministic" else siblings, backend="cpp", **params)
    return out.tokens, out.num_accepted, out.accepted_nodes


def _block_rows(case, rows, one_hot=False):
    target, draft, tokens, seeds, offsets = case
    index = torch.tensor(rows)
    params = {name: value[index] for name, value in PARAMS.items()}
    out = specdec_ext.verify(target[index], None if one_hot else draft[index], tokens[index], seeds=seeds[index], offsets=offsets[index], method="block",
                             return_logprobs="processed", backend="cpp", **params)
    return out.tokens, out.num_accepted, out.logprobs


def _equal(got, want, what):
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.nan_to_num(7.0), w.nan_to_num(7.0)), what


LAYOUTS = [[5, 4, 3, 2, 1, 0], [2], [3, 3, 3], [1, 4, 0, 2]]


def test_trees_and_blocks_do_not_depend_on_threads_scheduler_or_batch():
    """A seeded row's outputs are bit-identical whatever its neighbours, its place in the batch, the
    batch size, the thread count and the way work is spread over threads."""
    tree_case, block_case = _tree_case(3), _block_case(4)
    everyone = list(range(6))
    calls = {f"tree-{s}": (lambda rows, s=s: _tree_rows(tree_case, rows, s)) for s in ("iid", "without_replacement", "deterministic")}
    calls.update({"block": lambda rows: _block_rows(block_case, rows), "block-one-hot": lambda rows: _block_rows(block_case, rows, one_hot=True)})
    reference = {name: call(everyone) for name, call in calls.items()}
    assert int(reference["tree-iid"][1].sum()) > 0 and int(reference["block"][1].sum()) > 0  # acceptances happen
    for scheduler in ("auto", "openmp", "pool"):
        assert _cpp_backend._C.set_scheduler(scheduler)
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for rows in LAYOUTS:
                for name, call in calls.items():
                    want = tuple(t[torch.tensor(rows)] for t in reference[name])
                    _equal(call(rows), want, (name, scheduler, threads, rows))


def test_instruction_set_variants_agree_on_trees_and_blocks():
    """AVX2 and AVX-512 give the same bits (tokens, logprobs); every variant gives the reference's tokens."""
    tree_case, block_case = _tree_case(5, vocab=9000), _block_case(6, vocab=9000)
    target, draft, tokens, parents, seeds, offsets = tree_case
    eager_tree = verify_tree(target, draft, tokens, parents, seeds=seeds, offsets=offsets, siblings="without_replacement", backend="eager", **PARAMS)
    b_target, b_draft, b_tokens, b_seeds, b_offsets = block_case
    eager_block = specdec_ext.verify(b_target, b_draft, b_tokens, seeds=b_seeds, offsets=b_offsets, method="block", backend="eager", **PARAMS)
    results, ran = {}, []
    for isa in ("avx512", "avx2", "neon", "base"):
        if not _cpp_backend._C.set_isa(isa):
            continue
        ran.append(isa)
        tree = _tree_rows(tree_case, list(range(6)), "without_replacement")
        block = _block_rows(block_case, list(range(6)))
        assert torch.equal(tree[0], eager_tree.tokens) and torch.equal(block[0], eager_block.tokens), isa
        results[isa] = (tree, block)
    if "avx512" in results and "avx2" in results:
        for a, b in zip(results["avx512"], results["avx2"], strict=True):
            _equal(a, b, "avx2 vs avx512")
    assert "base" in ran or "neon" in ran


# --------------------------------------------------------------------------------------------
# The filter: the kept set of every path


def _lines(kind: str, count: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(count, vocab, generator=g)
    if kind == "peaked":  # an LLM-like line: a few dominant ids over a long tail
        x = 2 * x
        x[:, :3] = torch.tensor([14.0, 16.0, 18.0])
        x = x[:, torch.randperm(vocab, generator=g)]
    elif kind == "tied":  # runs of equal values across the cut
        x = torch.round(4 * x) / 4
    elif kind == "huge":  # logits beyond the histogram's grid: the window falls back to the whole line
        x = x + 3.0e5
    elif kind == "wide":
        x = 30 * x
    return x.contiguous()


def _rounding_ties(scaled: torch.Tensor, count_a: int, count_b: int, top_k: int, top_p: float) -> bool:
    """Whether every sorted position between two kept counts is a top-p decision at a rounding-level
    tie: its mass before, in float64, within 2e-6 of the budget. (The reference's own float32 sums
    over a 128k line differ between tensor shapes by more than that.)"""
    ordered = scaled.double().sort(descending=True).values
    tau_k = ordered[top_k - 1] if 0 < top_k < ordered.numel() else -float("inf")
    weights = torch.exp(ordered - ordered[0]) * (ordered >= tau_k)
    before = torch.cumsum(weights, 0) - weights
    budget = top_p * float(weights.sum())
    lo, hi = sorted((count_a, count_b))
    if lo < 1:  # nothing kept is never a tie
        return False
    return bool(((before[lo - 1 : hi] - budget).abs() <= 2e-6 * budget).all())


@pytest.mark.parametrize("kind", ["flat", "peaked", "tied", "huge", "wide"])
def test_filter_kept_set_equals_the_reference(kind):
    """The kept set {s >= tau} is the reference's (reference.filter_thresholds), up to top-p
    decisions tied within rounding, and z its normaliser to float accuracy, for top-p alone (the
    histogram window, its widening and its fallbacks: deep cuts at top_p near 1, a cut at the
    maximum at top_p near 0, logits beyond the grid), top-k, and both, over temperatures, on
    128k-entry lines that span 16 chunks. The same check rejects a cut one bucket of the window's
    grid off (a deliberately wrong variant)."""
    g = torch.Generator().manual_seed(zlib.crc32(kind.encode()))
    vocab = 128256
    top_p = torch.tensor([0.9, 0.95, 0.5, 0.999999, 1e-6, 0.8, 0.9, 1.0])
    top_k = torch.tensor([0, 0, 0, 0, 0, 50, 1000, 20])
    temperature = torch.tensor([1.0, 0.7, 1.3, 1.0, 1.0, 1.0, 0.9, 1.0])
    logits = _lines(kind, top_p.shape[0], vocab, g)
    m, tau, z = _cpp_backend._C.line_filter(logits, temperature, top_k, top_p)
    lines = process_lines(logits, temperature, top_k, top_p)
    assert torch.equal(m, lines.row_max)
    reference = filter_thresholds(lines.scaled, top_k, top_p)
    for i in range(logits.shape[0]):
        scaled = lines.scaled[i]
        kept, want = int((scaled >= tau[i]).sum()), int((scaled >= reference[i]).sum())
        assert kept == want or _rounding_ties(scaled, kept, want, int(top_k[i]), float(top_p[i])), (i, kept, want)
        if kind == "flat" and i == 0:  # a cut moved by one grid bucket (1/32 nat) is no rounding tie
            shifted = int((scaled >= tau[i] + 1 / 32).sum())
            assert not _rounding_ties(scaled, shifted, want, int(top_k[i]), float(top_p[i]))
        if kept == want:
            torch.testing.assert_close(z[i], lines.normaliser[i], rtol=2e-6, atol=0)


def test_filter_kept_set_is_thread_and_isa_independent():
    """(m, tau, z) bit for bit the same on every thread count and on AVX2 and AVX-512 (the default
    variant here is one of them wherever either runs)."""
    g = torch.Generator().manual_seed(9)
    logits = torch.cat([_lines("flat", 3, 50000, g), _lines("peaked", 3, 50000, g)])
    top_p = torch.tensor([0.9, 0.95, 0.6] * 2)
    args = (torch.ones(6), torch.zeros(6, dtype=torch.int64), top_p)
    if _cpp_backend.isa() not in ("avx512", "avx2"):
        pytest.skip("this CPU runs neither AVX2 nor AVX-512")
    torch.set_num_threads(1)
    want = _cpp_backend._C.line_filter(logits, *args)
    for isa in ("avx512", "avx2"):
        if not _cpp_backend._C.set_isa(isa):
            continue
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            got = _cpp_backend._C.line_filter(logits, *args)
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a, b), (isa, threads)


def test_sample_top_p_alone_matches_the_reference_on_flat_lines():
    """sample with top-p alone on flat 128k lines (the window path) draws the reference's tokens."""
    g = torch.Generator().manual_seed(13)
    logits = torch.randn(6, 128256, generator=g)
    seeds = torch.randint(0, 2**62, (6,), generator=g)
    for top_p in (0.9, 0.95):
        a = specdec_ext.sample(logits, top_p=top_p, seeds=seeds, backend="cpp")
        b = specdec_ext.sample(logits, top_p=top_p, seeds=seeds, backend="eager")
        assert torch.equal(a, b), top_p


@pytest.mark.parametrize("one_hot", [False, True])
def test_block_walk_matches_the_reference_over_many_coins(one_hot):
    """Many rows and short lines: the walk back from n_b meets coins that bounds on S_i settle (fail,
    pass) and coins that need S_i's mass, at every weight p_i; every row draws the reference's tokens."""
    g = torch.Generator().manual_seed(31 + one_hot)
    batch, k, vocab = 768, 4, 64
    scale = torch.rand(batch, 1, 1, generator=g) * 4  # from flat to peaked lines
    target = torch.randn(batch, k + 1, vocab, generator=g) * scale
    draft = target[:, :k] + torch.randn(batch, k, vocab, generator=g) * torch.rand(batch, 1, 1, generator=g) * 2
    tokens = torch.multinomial(draft.softmax(-1).reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    seeds = torch.randint(0, 2**62, (batch,), generator=g)
    num_draft = torch.randint(0, k + 1, (batch,), generator=g)
    kw = dict(seeds=seeds, num_draft_tokens=num_draft, method="block", temperature=torch.rand(batch, generator=g) + 0.5)
    d = None if one_hot else draft
    want = specdec_ext.verify(target, d, tokens, backend="eager", **kw)
    got = specdec_ext.verify(target, d, tokens, backend="cpp", **kw)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.num_accepted, want.num_accepted)
    accepted = want.num_accepted
    assert (accepted == 0).any() and (accepted == num_draft).any() and ((accepted > 0) & (accepted < num_draft)).any()
