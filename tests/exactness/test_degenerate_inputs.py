"""Every fused backend draws the reference's tokens on degenerate inputs, where a residual or a kept
set is exactly empty, one id or a tie, and a backend's own arithmetic could take a zero for a
positive or a tie for an order: ties, ids of probability zero, a flat line; a draft equal to the
target, shifted from it (the same law, other roundings), 10⁻³ from it, or unrelated; top-k 1 and
2, a top-p only the max reaches, T = 10⁻³; chains, blocks and trees of every sibling mode."""

from __future__ import annotations

import itertools

import pytest
import torch

import specdec_ext
from specdec_ext import available_backends, verify_tree

FUSED = [b for b in available_backends("cpu", "verify_tree") if b != "eager"]
pytestmark = pytest.mark.skipif(not FUSED, reason="no fused kernel is built")

LINES = ("plain", "ties", "zero_ids", "flat")
DRAFTS = ("same", "shift", "near", "other")
FILTERS = ({"top_k": 1}, {"top_p": 1e-6}, {"temperature": 1e-3}, {"top_k": 2, "temperature": 0.5}, {"top_p": 0.5}, {})
ONE_KEPT = FILTERS[:3]


def _inputs(lines: str, drafts: str, seed: int, batch: int = 6, k: int = 3, vocab: int = 40):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 3
    if lines == "ties":
        target = target.round()
    elif lines == "zero_ids":
        target[:, :, ::3] = float("-inf")
    elif lines == "flat":
        target = torch.zeros_like(target)
    draft = {"same": target.clone(), "shift": target + 0.37, "near": target + 1e-3 * torch.randn(target.shape, generator=g),
             "other": target + torch.randn(target.shape, generator=g)}[drafts]
    return target, draft, g


def _cases(backend: str):
    for lines, drafts in itertools.product(LINES, DRAFTS):
        # The interpreter runs each program in Python: the one-kept-id filters on two pairs, in the slow run.
        slow = backend == "triton"
        if slow and (lines, drafts) not in (("plain", "shift"), ("ties", "near")):
            continue
        yield pytest.param(backend, lines, drafts, id=f"{backend}-{lines}-{drafts}", marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("backend,lines,drafts", [case for backend in FUSED for case in _cases(backend)])
def test_degenerate_inputs_give_the_reference_tokens(backend, lines, drafts):
    target, draft, g = _inputs(lines, drafts, seed=LINES.index(lines) * 4 + DRAFTS.index(drafts))
    batch, k = target.shape[0], target.shape[1] - 1
    seeds = torch.arange(batch) * 5 + 2
    parents = torch.tensor([[-1, -1, 0]] * batch)  # two root children, one under the first
    for filtering in FILTERS if backend != "triton" else ONE_KEPT:
        scaled = draft[:, :k].nan_to_num(neginf=-1e9) / filtering.get("temperature", 1.0)
        tokens = torch.multinomial(scaled.softmax(-1).reshape(-1, target.shape[2]), 1, generator=g).reshape(batch, k)
        for method in ("token", "block"):
            reference = specdec_ext.verify(target, draft[:, :k], tokens, seeds=seeds, method=method, backend="eager", **filtering)
            fused = specdec_ext.verify(target, draft[:, :k], tokens, seeds=seeds, method=method, backend=backend, **filtering)
            assert torch.equal(reference.tokens, fused.tokens), (method, filtering)
        for siblings, tree_draft in (("iid", draft), ("without_replacement", draft), ("iid", None)):
            reference = verify_tree(target, tree_draft, tokens, parents, seeds=seeds, siblings=siblings, backend="eager", **filtering)
            fused = verify_tree(target, tree_draft, tokens, parents, seeds=seeds, siblings=siblings, backend=backend, **filtering)
            assert torch.equal(reference.tokens, fused.tokens), (siblings, tree_draft is None, filtering)
            assert torch.equal(reference.accepted_nodes, fused.accepted_nodes), (siblings, tree_draft is None, filtering)
