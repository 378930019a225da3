"""Statistical proof that verify_tree's output follows the target's law, on every backend.

Trees are drafted from a tiny language (tests/support/tree_laws.py) whose target law depends on the whole
prefix, so the check is conditional: at each depth, the token emitted after prefix y must follow
p(. | y) (per-depth chi-square, the statistics of all prefixes at one depth summed; a correct sampler
fails with probability 1e-6). The whole emitted sequence is also tested against the exact enumerated
law of one round. A deliberately wrong sampler (drawing from the exact law of a wrong variant) runs
through the same per-depth check and must fail it.
"""

from __future__ import annotations

import pytest
import torch
from support.tree_laws import depth_laws_fail, draft_tree_batch, language, sample_law, sequence_law_fails, tree_law

from specdec_ext import available_backends, verify_tree

ROWS = 60_000


def _run(lang, parents, mode, backend, seed, params=None, rows=ROWS, num_nodes=None, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    tokens, target_logits, draft_logits = draft_tree_batch(lang, parents, mode, rows, generator)
    parent_rows = torch.tensor(parents).expand(rows, -1)
    out = verify_tree(target_logits.to(dtype), None if mode == "deterministic" else draft_logits.to(dtype), tokens, parent_rows,
                      siblings="without_replacement" if mode == "without_replacement" else "iid", num_nodes=num_nodes,
                      generator=generator, backend=backend, **(params or {}))
    return out


def _assert_exact_and_wrong_fails(lang, parents, mode, wrong_variant, params=None, seed=0):
    depth = max(_depths(parents))
    law = tree_law(lang, parents, mode)
    for backend in available_backends("cpu", "verify_tree", interpreted=False):
        out = _run(lang, parents, mode, backend, seed, params)
        fails, report = depth_laws_fail(lang, out.tokens, out.num_accepted, depth)
        assert not fails, f"{backend}: {report}"
        fails, line = sequence_law_fails(law, out.tokens, out.num_accepted, lang.vocab)
        assert not fails, f"{backend}: whole sequences: {line}"
    wrong = tree_law(lang, parents, mode, wrong_variant)
    tokens, accepted = sample_law(wrong, ROWS, torch.Generator().manual_seed(seed + 1), depth + 1)
    fails, report = depth_laws_fail(lang, tokens, accepted, depth)
    assert fails, f"the check could not tell the {wrong_variant} variant apart: {report}"


def _depths(parents):
    depth = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return depth


WIDE = [-1, -1, -1, 0, 1, 3]  # three children at the root, one under each of the first two, a grandchild


# The wide trees and the single-filter settings repeat what the binary trees and the combined
# filters check on another shape: they run in CI's slow step (make test-slow).
WIDE_SLOW = pytest.param(WIDE, id="wide", marks=pytest.mark.slow)


@pytest.mark.parametrize("parents", [pytest.param([-1, -1, 0, 0, 1], id="binary"), WIDE_SLOW])
def test_iid_siblings(parents):
    _assert_exact_and_wrong_fails(language(1, vocab=4, depth=3), parents, "iid", "reuse_r")


@pytest.mark.parametrize("parents", [pytest.param([-1, -1, 0, 0, 1], id="binary"), WIDE_SLOW])
def test_siblings_without_replacement(parents):
    _assert_exact_and_wrong_fails(language(4, vocab=4, depth=3), parents, "without_replacement", "reuse_r")


def test_deterministic_siblings():
    _assert_exact_and_wrong_fails(language(3, vocab=4, depth=3), WIDE, "deterministic", "reuse_r")


def test_adversarial_negated_draft():
    """Draft logits ~ negated target logits: nearly every child is rejected, the residual does the work."""
    _assert_exact_and_wrong_fails(language(4, vocab=4, depth=3, negate=True, draft_noise=0.3), WIDE, "iid", "reuse_r")


@pytest.mark.parametrize(
    "params",
    [*(pytest.param(p, marks=pytest.mark.slow) for p in ({"temperature": 0.6}, {"temperature": 1.7}, {"top_k": 3}, {"top_p": 0.75})),
     {"temperature": 0.8, "top_k": 3, "top_p": 0.9}],
    ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()),
)
def test_temperature_and_filters(params):
    lang = language(5, vocab=5, depth=2, **params)
    _assert_exact_and_wrong_fails(lang, [-1, -1, 0, 1, 1], "iid", "reuse_r", params=params)


def test_draft_vocabulary_smaller_than_target():
    lang = language(6, vocab=5, depth=3, draft_vocab=3)
    _assert_exact_and_wrong_fails(lang, WIDE, "without_replacement", "reuse_r")


def test_bfloat16_logits():
    """bf16 logits: the law is that of the bf16-rounded logits (the language is built from them)."""
    lang = language(7, vocab=4, depth=3, round_to=torch.bfloat16)
    for backend in available_backends("cpu", "verify_tree", interpreted=False):
        out = _run(lang, [-1, -1, 0, 0, 1], "iid", backend, seed=8, dtype=torch.bfloat16)
        fails, report = depth_laws_fail(lang, out.tokens, out.num_accepted, 3)
        assert not fails, f"{backend}: {report}"


def test_ragged_trees():
    """Rows verify the first n_b nodes only (a prefix of a node list is a tree): the per-depth law holds
    whatever mixture of trees the rows use."""
    lang = language(9, vocab=4, depth=3)
    generator = torch.Generator().manual_seed(10)
    num_nodes = torch.randint(0, len(WIDE) + 1, (ROWS,), generator=generator)
    for backend in available_backends("cpu", "verify_tree", interpreted=False):
        out = _run(lang, WIDE, "iid", backend, seed=11, num_nodes=num_nodes)
        depth_of = torch.tensor([0] + _depths(WIDE))
        deepest = torch.stack([depth_of[: n + 1].max() for n in num_nodes.tolist()[:200]])
        assert bool((out.num_accepted[:200] <= deepest).all()), "a row entered a node beyond its num_nodes"
        fails, report = depth_laws_fail(lang, out.tokens, out.num_accepted, 3)
        assert not fails, f"{backend}: {report}"


def test_mixed_greedy_and_sampled_rows():
    """Greedy rows enter the child equal to the target's argmax and emit argmaxes; sampled rows in the
    same call keep the target's law."""
    lang = language(12, vocab=4, depth=3)
    generator = torch.Generator().manual_seed(13)
    tokens, target_logits, draft_logits = draft_tree_batch(lang, WIDE, "iid", ROWS, generator)
    greedy = torch.rand(ROWS, generator=generator) < 0.3
    temperature = torch.where(greedy, 0.0, 1.0)
    parents = torch.tensor(WIDE).expand(ROWS, -1)
    for backend in available_backends("cpu", "verify_tree", interpreted=False):
        out = verify_tree(target_logits, draft_logits, tokens, parents, temperature=temperature, generator=generator, backend=backend)
        fails, report = depth_laws_fail(lang, out.tokens[~greedy], out.num_accepted[~greedy], 3)
        assert not fails, f"{backend}: {report}"
        # Greedy rows: each emitted token is the argmax of the target at its prefix.
        for row in greedy.nonzero()[:500, 0].tolist():
            emitted = out.tokens[row, : int(out.num_accepted[row]) + 1].tolist()
            for k, token in enumerate(emitted):
                assert token == int(lang.target_logits[lang.index(tuple(emitted[:k]))].argmax())
            # ...and the walk stops only where no child holds that argmax.
            nodes = out.accepted_nodes[row, : int(out.num_accepted[row])].tolist()
            context = nodes[-1] if nodes else -1
            children = [i for i, parent in enumerate(WIDE) if parent == context]
            assert emitted[-1] not in tokens[row, children].tolist()
