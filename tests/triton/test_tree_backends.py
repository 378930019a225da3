"""Every tree / block backend draws the same tokens as the eager reference under the same keys.

Random trees (ragged, with rejections and acceptances at every depth), every sibling mode, filters,
mixed greedy rows, a smaller draft vocabulary, bf16, bad values with check=False, and block
verification with its logprobs. The backends evaluate the same float32 formulas but sum in different
orders, so a decision within an ulp of its threshold could in principle differ; the inputs here are
far from that (and the test would show it).
"""

from __future__ import annotations

import zlib

import pytest
import torch

import specdec_ext
from specdec_ext import available_backends, verify_tree

FUSED = [b for b in available_backends("cpu", "verify_tree") if b != "eager"]
pytestmark = pytest.mark.skipif(not FUSED, reason="no fused tree / block kernel is built")


def _random_tree(nodes: int, generator: torch.Generator) -> list[int]:
    parents = []
    for i in range(nodes):
        parents.append(int(torch.randint(-1, i, (1,), generator=generator)) if i else -1)
    return parents


def _case(seed: int, batch: int = 24, nodes: int = 9, vocab: int = 300, draft_vocab: int | None = None, dtype=torch.float32, spread: float = 2.0,
          backend: str = "cpp"):
    if backend == "triton":  # the interpreter runs each program in Python: a smaller batch, tree and vocabulary
        batch, nodes, vocab = min(batch, 4), min(nodes, 6), min(vocab, 48)
        draft_vocab = min(draft_vocab, 40) if draft_vocab else None
    g = torch.Generator().manual_seed(seed)
    draft_vocab = draft_vocab or vocab
    target = torch.randn(batch, nodes + 1, vocab, generator=g) * spread
    draft = target[:, :, :draft_vocab] + 0.8 * torch.randn(batch, nodes + 1, draft_vocab, generator=g)
    tokens = torch.multinomial(draft.softmax(-1).reshape(-1, draft_vocab), 1, generator=g).reshape(batch, nodes + 1)[:, :nodes]
    parents = torch.tensor([_random_tree(nodes, g) for _ in range(batch)])
    num_nodes = torch.randint(0, nodes + 1, (batch,), generator=g)
    seeds = torch.randint(0, 2**62, (batch,), generator=g)
    offsets = torch.randint(0, 2**40, (batch,), generator=g)
    return target.to(dtype), draft.to(dtype), tokens, parents, num_nodes, seeds, offsets


def _same(a, b, what):
    assert torch.equal(a.tokens, b.tokens), what
    assert torch.equal(a.num_accepted, b.num_accepted), what
    assert torch.equal(a.accepted_nodes, b.accepted_nodes), what


PARAMS = [{}, {"temperature": 0.7}, {"top_k": 20}, {"top_p": 0.8}, {"temperature": 1.3, "top_k": 50, "top_p": 0.9}]
SINGLE_SETTINGS = PARAMS[1:]  # the filters; under the interpreter the unfiltered case runs by default


def _param_id(params) -> str:
    return ",".join(f"{k}={v if not isinstance(v, torch.Tensor) else 'mixed'}" for k, v in params.items()) or "plain"


def _backend_cases(params_list):
    """(backend, params) pairs; under the (slow) interpreter the single settings run in CI's slow step."""
    return [pytest.param(backend, params, id=f"{_param_id(params)}-{backend}",
                         marks=pytest.mark.slow if backend == "triton" and any(params is single for single in SINGLE_SETTINGS) else ())
            for params in params_list for backend in FUSED]


@pytest.mark.parametrize("siblings", ["iid", "without_replacement", "deterministic"])
@pytest.mark.parametrize("backend,params", _backend_cases(PARAMS))
def test_trees_match_the_reference(backend, siblings, params):
    if backend == "triton" and params and siblings != "iid":
        pytest.skip("the interpreter is slow: filters with every sibling mode run on the compiled kernels (GPU suite)")
    base = zlib.crc32(f"{siblings} {params}".encode()) % 1000  # str hashes vary per process
    # The first case (in a fixed order) whose reference run both accepts and rejects somewhere, so the
    # comparison covers both outcomes (small interpreter batches can reject everywhere).
    for attempt in range(20):
        target, draft, tokens, parents, num_nodes, seeds, offsets = _case(base + 1000 * attempt, backend=backend)
        draft_logits = None if siblings == "deterministic" else draft
        if siblings == "deterministic":  # the draft's top tokens at each parent context, as an EAGLE-style tree has them
            for b in range(tokens.shape[0]):
                for i, parent in enumerate(parents[b].tolist()):
                    rank = sum(1 for j in range(i) if int(parents[b, j]) == parent)
                    tokens[b, i] = draft[b, parent + 1].argsort(descending=True)[rank]
        mode = "iid" if siblings == "deterministic" else siblings
        kwargs = dict(num_nodes=num_nodes, seeds=seeds, offsets=offsets, siblings=mode, **params)
        reference = verify_tree(target, draft_logits, tokens, parents, backend="eager", **kwargs)
        if (reference.num_accepted > 0).any() and (reference.num_accepted < num_nodes).any():
            break
    else:
        pytest.fail("no case with both outcomes")
    fused = verify_tree(target, draft_logits, tokens, parents, backend=backend, **kwargs)
    _same(reference, fused, (siblings, params))


@pytest.mark.parametrize("siblings", ["iid", "without_replacement", "deterministic"])
@pytest.mark.parametrize("backend", FUSED)
def test_later_siblings_are_tested_against_the_residual_masses(backend, siblings):
    """Four siblings at the root of each of 40 rows and a weak draft: many rows reject a child and
    then accept a later one, whose test u q(x) Z < w(x) M reads the masses of the residual left by
    the rejections (c, S: the pass over the line after each rejection but the last), some after two
    rejections or three (c != 1, M below 1 without replacement)."""
    g = torch.Generator().manual_seed(22)
    batch, nodes, vocab = 40, 4, 48
    target = torch.randn(batch, 2, vocab, generator=g) * 2
    draft = target + 1.5 * torch.randn(batch, 2, vocab, generator=g)
    probs = draft[:, 0].softmax(-1)
    if siblings == "deterministic":  # the draft's top four, as an EAGLE-style tree has them
        tokens = probs.argsort(-1, descending=True)[:, :nodes]
    else:
        tokens = torch.multinomial(probs, nodes, replacement=siblings == "iid", generator=g)
    parents = torch.full((batch, nodes), -1)
    target = torch.cat([target, target[:, 1:].expand(batch, nodes - 1, vocab)], 1)
    draft = torch.cat([draft, draft[:, 1:].expand(batch, nodes - 1, vocab)], 1)
    kwargs = dict(seeds=torch.arange(batch) * 3 + 1, siblings="iid" if siblings == "deterministic" else siblings)
    draft_logits = None if siblings == "deterministic" else draft
    reference = verify_tree(target, draft_logits, tokens, parents, backend="eager", **kwargs)
    entered = reference.accepted_nodes[:, 0].masked_fill(reference.num_accepted == 0, -1)
    assert int((entered >= 1).sum()) >= 8 and int((entered >= 2).sum()) >= 5, entered
    _same(reference, verify_tree(target, draft_logits, tokens, parents, backend=backend, **kwargs), siblings)


@pytest.mark.parametrize("siblings", ["iid", "without_replacement"])
@pytest.mark.parametrize("backend", FUSED)
def test_a_walk_ending_on_a_zero_residual_keeps_the_one_before(backend, siblings):
    """The draft equals the target, and some children are tokens neither gives any probability: such
    a child is always rejected, and its residual max(p - c q, 0) is zero everywhere. The walk keeps
    the residual before it (the reference's rule); a row's last rejection leaves that test to the race
    (tree.py's undo), which must then race the residual before, not the zero one: a single child, two
    such siblings, and one a level down after an accepted child."""
    g = torch.Generator().manual_seed(3)
    batch, nodes, vocab = 4, 3, 48
    target = torch.randn(batch, nodes + 1, vocab, generator=g) * 2
    target[:, :, :4] = float("-inf")  # ids 0-3: probability 0 under both
    draft = target.clone()
    parents = torch.tensor([[-1, -1, -1], [-1, -1, -1], [-1, 0, -1], [-1, 0, 0]])
    num_nodes = torch.tensor([1, 2, 2, 3])
    liked = target[:, 0, 4:].argmax(-1) + 4  # accepted with probability 1 (p = q)
    tokens = torch.tensor([[0, 0, 0], [1, 2, 0], [0, 3, 0], [0, 1, 2]])
    tokens[2, 0] = liked[2]
    tokens[3, 0] = liked[3]
    kwargs = dict(num_nodes=num_nodes, seeds=torch.arange(batch) * 11 + 5, siblings=siblings)
    reference = verify_tree(target, draft, tokens, parents, backend="eager", **kwargs)
    assert reference.num_accepted.tolist() == [0, 0, 1, 1]
    emitted = reference.tokens.gather(1, reference.num_accepted[:, None]).squeeze(1)
    assert (emitted >= 4).all() and (emitted < vocab).all(), reference.tokens  # drawn from p: never a zero-probability id
    _same(reference, verify_tree(target, draft, tokens, parents, backend=backend, **kwargs), siblings)


ONE_KEPT_ID = [pytest.param(backend, filtering, id=f"{name}-{backend}", marks=[pytest.mark.slow] if backend == "triton" and name != "top_k=1" else [])
               for backend in FUSED for name, filtering in (("top_k=1", {"top_k": 1}), ("top_p=1e-6", {"top_p": 1e-6, "temperature": 0.7}))]


@pytest.mark.parametrize("backend,filtering", ONE_KEPT_ID)
def test_one_kept_id_on_both_sides(backend, filtering):
    """Top-k 1, or a top-p the max alone reaches, with a draft whose argmax is the target's but whose
    logits differ: p and q are both one-hot at the same id, so after a rejected child the residual
    max(p - c q, 0) (c = 1) is exactly zero everywhere and the walk keeps p, as the reference does;
    the argmax sibling that follows is accepted. A residual mass whose terms at that id are 1 +- an
    ulp (exp2 of x log2 e - m log2 e, not of the race's s - m) sums to a tiny positive mass half the
    time: the walk then rejects the argmax and races a zero residual (a tree emitted id 0), and a
    block stops elsewhere. Every emitted token must be its position's argmax."""
    g = torch.Generator().manual_seed(8)
    batch, vocab = 8 if backend != "triton" else 4, 48  # (the interpreter: 4 rows, each part still failing before)
    target = torch.randn(batch, 5, vocab, generator=g) * 3
    draft = target + 0.01 * torch.randn(batch, 5, vocab, generator=g)
    argmax = target.argmax(-1)
    assert torch.equal(draft.argmax(-1), argmax)
    seeds = torch.arange(batch) * 7 + 1
    tokens = torch.stack([(argmax[:, 0] + 1) % vocab, argmax[:, 0], (argmax[:, 0] + 2) % vocab], 1)  # three children of the root
    parents = torch.full((batch, 3), -1)
    for siblings in ("iid", "without_replacement"):
        kwargs = dict(seeds=seeds, siblings=siblings, **filtering)
        reference = verify_tree(target[:, :4], draft[:, :4], tokens, parents, backend="eager", **kwargs)
        assert torch.equal(reference.tokens[:, 0], argmax[:, 0]) and (reference.num_accepted == 1).all()
        _same(reference, verify_tree(target[:, :4], draft[:, :4], tokens, parents, backend=backend, **kwargs), siblings)
    drafts = torch.where(torch.rand(batch, 4, generator=g) < 0.6, argmax[:, :4], (argmax[:, :4] + 1) % vocab)
    kwargs = dict(seeds=seeds, method="block", **filtering)
    reference = specdec_ext.verify(target, draft[:, :4], drafts, backend="eager", **kwargs)
    emitted = torch.arange(5) <= reference.num_accepted[:, None]
    assert torch.equal(reference.tokens[emitted], argmax[emitted])
    fused = specdec_ext.verify(target, draft[:, :4], drafts, backend=backend, **kwargs)
    assert torch.equal(reference.tokens, fused.tokens) and torch.equal(reference.num_accepted, fused.num_accepted)


@pytest.mark.skipif("triton" not in FUSED, reason="the Triton kernels run under TRITON_INTERPRET=1")
def test_a_race_whose_fallback_is_zero_too_races_p():
    """The tree race's last resort, planted in the row state between the walk and the race: a walk's
    masses are exp2 terms, not the race's weights, so the residual it kept (undo) could be zero in the
    race's arithmetic as well. The race must then draw from p with its own keys (as it does for a
    walk that kept p), never return an id of weight zero (ids 0-3 here)."""
    from specdec_ext import _params, _triton_tree

    g = torch.Generator().manual_seed(12)
    batch, vocab = 4, 48
    target = torch.randn(batch, 2, vocab, generator=g) * 2
    target[:, :, :4] = float("-inf")
    draft = target.clone()  # p = q: every residual with c >= 1 is zero everywhere
    tokens = target[:, 0].argmax(-1, keepdim=True)  # accepted: the race runs at node 1's context
    args = _params.validate_tree(target, draft, tokens, torch.full((batch, 1), -1), temperature=1.0, top_k=None, top_p=None, num_nodes=None,
                                 siblings="iid", generator=None, seeds=torch.arange(batch) + 3, offsets=None, check=False)

    def race(c: float, undo: int) -> torch.Tensor:
        launches = _triton_tree.launches_for(args, 0)
        for launch in launches:
            names = launch.kernel.arg_names
            if launch.name == "tree_race":
                state_f = launch.args[names.index("state_f_ptr")].view(-1, 8)  # (B, 8) row state (tree.py)
                state_i = launch.args[names.index("state_i_ptr")].view(-1, 8)
                state_f[:, 1] = c
                state_i[:, 1] = state_i[:, 0]  # the draft line of the race's context is read (c > 0)
                state_i[:, 7] = undo
                out_tokens = launch.args[names.index("out_tokens_ptr")]
            constexprs = {name: value for name, value in launch.constexprs.items() if name != "maxnreg"}
            launch.kernel[launch.grid](*launch.args, **constexprs, num_warps=launch.num_warps)
        return out_tokens[:, 1].clone()

    on_p = race(0.0, -1)
    two = int(torch.tensor(2.0).view(torch.int32))
    assert (on_p >= 4).all()
    assert torch.equal(race(2.0, two), on_p)  # the residual (c = 2) and the one before (undo: c = 2) are zero: p
    assert torch.equal(race(2.0, -1), on_p)  # no undo: p


@pytest.mark.parametrize("backend", FUSED)
def test_mixed_greedy_rows_small_draft_vocabulary_and_bf16(backend):
    target, draft, tokens, parents, num_nodes, seeds, offsets = _case(5, draft_vocab=200, dtype=torch.bfloat16, backend=backend)
    temperature = torch.tensor([0.0, 1.0, 0.5, 2.0] * 6)[: target.shape[0]]
    # Greedy rows: put the target's argmax among the children of the root sometimes.
    tokens[::4, 0] = target[::4, 0].float().argmax(-1).clamp(max=draft.shape[2] - 1)
    for siblings in ("iid", "without_replacement") if backend != "triton" else ("without_replacement",):
        kwargs = dict(num_nodes=num_nodes, seeds=seeds, offsets=offsets, siblings=siblings, temperature=temperature, top_p=0.95)
        _same(verify_tree(target, draft, tokens, parents, backend="eager", **kwargs), verify_tree(target, draft, tokens, parents, backend=backend, **kwargs), siblings)


@pytest.mark.parametrize("backend", FUSED)
def test_bad_rows_are_blanked_alike(backend):
    target, draft, tokens, parents, num_nodes, seeds, offsets = _case(6, batch=12, backend="cpp")
    target[1, 0, 5] = float("nan")  # the root: every walk reads it
    target[2, 3] = float("-inf")  # some walks read it
    draft[3, 0, 7] = float("inf")
    parents[4, 5] = 7  # a bad tree (if node 5 is used)
    tokens[5, 0] = -2
    temperature = torch.ones(12)
    temperature[6] = -1.0
    seeds[7] = -3
    num_nodes[4] = 9
    for check_values in (target, target * 1e30):
        kwargs = dict(num_nodes=num_nodes, seeds=seeds, offsets=offsets, temperature=temperature if check_values is target else 1e-37, check=False)
        reference = verify_tree(check_values, draft, tokens, parents, backend="eager", **kwargs)
        fused = verify_tree(check_values, draft, tokens, parents, backend=backend, **kwargs)
        _same(reference, fused, "check=False")
        assert (reference.tokens[:, 0] < 0).sum() >= 4


@pytest.mark.parametrize("backend,params", _backend_cases(PARAMS + [{"temperature": torch.tensor([0.0, 1.0, 0.8, 1.5] * 2)}]))
def test_block_verification_matches_the_reference(backend, params):
    g = torch.Generator().manual_seed(7)
    batch, k, vocab = (32, 5, 400) if backend != "triton" else (8, 3, 48)
    params = {name: value.repeat(batch // value.shape[0]) if isinstance(value, torch.Tensor) else value for name, value in params.items()}
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2
    draft = target[:, :k] + 0.6 * torch.randn(batch, k, vocab, generator=g)
    tokens = torch.multinomial(draft.softmax(-1).reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    num_draft = torch.randint(0, k + 1, (batch,), generator=g)
    seeds = torch.randint(0, 2**62, (batch,), generator=g)
    offsets = torch.randint(0, 2**40, (batch,), generator=g)
    combos = [(d, mode) for d in (draft, None) for mode in (False, "processed", "raw")]
    if backend == "triton":  # the interpreter is slow: one draft kind and logprobs mode per case, all of them on the plain case
        combos = combos if not params else [(draft, "processed")]
    for draft_logits, mode in combos:
        kwargs = dict(num_draft_tokens=num_draft, seeds=seeds, offsets=offsets, method="block", return_logprobs=mode, **params)
        reference = specdec_ext.verify(target, draft_logits, tokens, backend="eager", **kwargs)
        fused = specdec_ext.verify(target, draft_logits, tokens, backend=backend, **kwargs)
        assert torch.equal(reference.tokens, fused.tokens) and torch.equal(reference.num_accepted, fused.num_accepted), (draft_logits is None, mode)
        if mode:
            torch.testing.assert_close(fused.logprobs, reference.logprobs, atol=1e-5, rtol=0, equal_nan=True)
        else:
            assert fused.logprobs is None


@pytest.mark.parametrize("backend", FUSED)
def test_block_bad_rows_and_generator_keys(backend):
    g = torch.Generator().manual_seed(8)
    batch, k, vocab = 8, 3, 100
    target = torch.randn(batch, k + 1, vocab, generator=g)
    draft = target[:, :k] + torch.randn(batch, k, vocab, generator=g)
    tokens = torch.randint(0, vocab, (batch, k), generator=g)
    target[1, 3, 0] = float("nan")  # read by sampled rows (every line up to n)
    draft[2, 2, 0] = float("nan")
    tokens[3, 1] = vocab
    temperature = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    target[4, 3, 0] = float("nan")  # a greedy row reads it only if it gets there
    for check in (False,):
        a = specdec_ext.verify(target, draft, tokens, temperature=temperature, method="block", check=check, generator=torch.Generator().manual_seed(1), backend="eager")
        b = specdec_ext.verify(target, draft, tokens, temperature=temperature, method="block", check=check, generator=torch.Generator().manual_seed(1), backend=backend)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted)
        assert (a.tokens[1:4, 0] == -1).all()
    with pytest.raises(ValueError, match="target_logits: row 1 contains NaN"):
        specdec_ext.verify(target, draft, tokens, temperature=temperature, method="block", backend=backend)


@pytest.mark.skipif("triton" not in FUSED, reason="the Triton kernels are not available here")
@pytest.mark.parametrize("filtered,with_draft", [(False, True), (True, False)])
def test_block_walk_items_split_the_vocabulary(filtered, with_draft):
    """A block walk sums each position's residual mass in work items over chunks of the vocabulary
    (three here, several steps each, the last ragged): the reference's tokens, with rows that stop
    below n (their masses read) among them. (It fails when the last item sums one chunk of each
    mass, when items skip where the coin may stop the walk, when a row stopping at n is summed
    instead of one walking below it, or without the one-hot term.)"""
    from specdec_ext import _params, _triton_tree
    from specdec_ext.reference_tree import verify_block_eager

    g = torch.Generator().manual_seed(22)
    batch, k, vocab = 16, 4, 100
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2
    draft = target[:, :k] + 0.5 * torch.randn(batch, k, vocab, generator=g)
    tokens = torch.multinomial(draft.softmax(-1).reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    if not with_draft:  # deterministic drafts the target likes: p_i stays high, and S_i's one-hot term decides
        tokens = target[:, :k].argmax(-1)
    temperature = torch.tensor([1.0, 0.8, 0.0, 1.2] * (batch // 4))
    num_draft = torch.tensor([4, 3, 4, 2] * (batch // 4))
    args = _params.validate_verify(target, draft if with_draft else None, tokens, temperature=temperature, top_k=40 if filtered else None,
                                   top_p=0.95 if filtered else None, num_draft_tokens=num_draft, generator=None, check=False,
                                   seeds=torch.arange(batch) * 7 + 1, offsets=None)
    assert _triton_tree.walk_chunks(args, _triton_backend_geometry(race_block=16, walk_chunks=3)) == 3
    reference = verify_block_eager(args, 5)
    fused = _triton_tree.verify_block(args, 5, race_block=16, walk_chunks=3)
    assert torch.equal(reference[0], fused[0]) and torch.equal(reference[1], fused[1])
    stopped_below = (reference[1] >= 1) & (reference[1] < num_draft) & (temperature > 0)
    assert int(stopped_below.sum()) >= 3, reference[1]


def _triton_backend_geometry(**overrides):
    from specdec_ext import _triton_backend

    return _triton_backend.geometry(torch.device("cpu"), **overrides)
