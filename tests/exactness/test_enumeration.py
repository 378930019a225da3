"""Exact enumeration for tiny V and K: the law of one verification round, in float64.

The draft proposes x_1..x_K from q(. | prefix), the target scores every prefix, and verification
emits the accepted prefix plus one corrected or bonus token. We enumerate every draft sequence and
check, for every reachable prefix y and token t, that
    P(round emits y then t) = P(round reaches y) * p(t | y),
i.e. each emitted token follows the target's processed law. p and q are the processed
distributions of the eager reference (temperature, top-k, top-p); the acceptance probability
min(1, p/q) and the residual max(p - q, 0) are the formulas the backends implement.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from specdec_ext.reference import process_lines

VOCAB, K = 3, 2


def _tables(seed: int, temperature: float, top_k: int, top_p: float):
    """Processed p(. | prefix) and q(. | prefix) for every prefix of length <= K (float64)."""
    g = torch.Generator().manual_seed(seed)
    prefixes = [()] + [tuple(x) for n in range(1, K + 1) for x in itertools.product(range(VOCAB), repeat=n)]
    target_logits = torch.randn(len(prefixes), VOCAB, generator=g) * 1.5
    draft_logits = target_logits + torch.randn(len(prefixes), VOCAB, generator=g)

    def law(logits):
        n = logits.shape[0]
        lines = process_lines(logits, torch.full((n,), temperature), torch.full((n,), top_k), torch.full((n,), top_p))
        probs = lines.probs().double()
        probs = probs / probs.sum(dim=1, keepdim=True)  # renormalise the float32 law in float64
        return {prefix: probs[i] for i, prefix in enumerate(prefixes)}

    return law(target_logits), law(draft_logits)


def _round_law(p, q, residual_rule):
    """{emitted tuple: probability} of one verification round, by enumeration."""
    emitted = {}
    for drafts in itertools.product(range(VOCAB), repeat=K):
        weight = 1.0
        for i, x in enumerate(drafts):
            weight *= float(q[drafts[:i]][x])
        if weight == 0:
            continue
        reach = weight  # probability of proposing these drafts and accepting the first i
        for i, x in enumerate(drafts):
            prefix = drafts[:i]
            px, qx = float(p[prefix][x]), float(q[prefix][x])
            accept = min(1.0, px / qx)
            corrected = residual_rule(p[prefix], q[prefix])
            for t in range(VOCAB):
                key = prefix + (t,)
                emitted[key] = emitted.get(key, 0.0) + reach * (1 - accept) * float(corrected[t])
            reach *= accept
        for t in range(VOCAB):
            key = drafts + (t,)
            emitted[key] = emitted.get(key, 0.0) + reach * float(p[drafts][t])
    return emitted


def _max_violation(p, emitted):
    worst = 0.0
    for k in range(K + 1):
        for prefix in itertools.product(range(VOCAB), repeat=k):
            reached = sum(prob for seq, prob in emitted.items() if len(seq) > k and seq[:k] == prefix)
            for t in range(VOCAB):
                got = sum(prob for seq, prob in emitted.items() if len(seq) > k and seq[: k + 1] == prefix + (t,))
                worst = max(worst, abs(got - reached * float(p[prefix][t])))
    return worst


def modified_rejection(p, q):
    residual = (p - q).clamp(min=0)
    return residual / residual.sum() if residual.sum() > 0 else p


def naive_redraw(p, q):
    return p


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 2, 1.0), (1.3, 0, 0.8)])
def test_round_law_is_exact(temperature, top_k, top_p):
    for seed in range(3):
        p, q = _tables(seed, temperature, top_k, top_p)
        assert abs(sum(_round_law(p, q, modified_rejection).values()) - 1) < 1e-12
        assert _max_violation(p, _round_law(p, q, modified_rejection)) < 1e-12
        # The same check rejects a redraw from the target after a rejection.
        assert _max_violation(p, _round_law(p, q, naive_redraw)) > 1e-3


def test_seed_example_exactly():
    p = {(): torch.tensor([0.6, 0.4], dtype=torch.float64)}
    q = {(): torch.tensor([0.8, 0.2], dtype=torch.float64)}
    accept_mass = sum(float(q[()][x]) * min(1.0, float(p[()][x] / q[()][x])) for x in range(2))
    assert accept_mass == pytest.approx(0.8, abs=1e-15)
    assert modified_rejection(p[()], q[()]).tolist() == [0.0, 1.0]
    final = [0.8 * min(1, 0.6 / 0.8) + 0.2 * 0.0, 0.2 * 1.0 + 0.2 * 1.0]
    assert final == pytest.approx([0.6, 0.4], abs=1e-15)
    naive = [0.6 + 0.2 * 0.6, 0.2 + 0.2 * 0.4]
    assert naive == pytest.approx([0.72, 0.28], abs=1e-15)
