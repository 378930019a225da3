"""Goodness-of-fit helpers shared by the statistical tests.

Every check uses a threshold that a correct sampler exceeds with probability 1e-6, and each test
also runs a deliberately wrong sampler through the same check to show that the check can fail.
"""

from __future__ import annotations

import torch
from scipy import stats
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

FALSE_ALARM = 1e-6


def chi_square_fails(counts: torch.Tensor, probs: torch.Tensor, alpha: float = FALSE_ALARM) -> tuple[bool, str]:
    """True when ``counts`` do not fit ``probs`` (a token of probability 0 seen also fails)."""
    counts = counts.double()
    probs = probs.double()
    total = counts.sum()
    if total == 0:
        return False, "no samples"
    impossible = counts[probs <= 0].sum()
    if impossible > 0:
        return True, f"{int(impossible)} draws of probability-0 tokens"
    expected = probs * total
    # Pool bins with small expectations so the chi-square approximation holds.
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    df = obs.numel() - 1
    if df < 1:
        return False, "single bin"
    statistic = float(((obs - exp) ** 2 / exp).sum())
    limit = float(stats.chi2.isf(alpha, df))
    return statistic > limit, f"chi2={statistic:.1f} limit={limit:.1f} df={df} n={int(total)}"


def processed_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """(..., V) probabilities after transformers' own warpers: the independent reference law."""
    shape = logits.shape
    scores = logits.reshape(-1, shape[-1]).float()
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None and top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(dim=-1).reshape(shape)


def position_laws_fail(tokens: torch.Tensor, num_accepted: torch.Tensor, target_probs: torch.Tensor, num_draft: torch.Tensor | None = None) -> tuple[bool, list[str]]:
    """Per-position fit: the token emitted at position k, among rows whose first k drafts were
    accepted (and that verify at least k drafts), must follow the target law at k.

    tokens (N, K+1), num_accepted (N,), target_probs (K+1, V).
    """
    k_plus_1, vocab = target_probs.shape
    if num_draft is None:
        num_draft = torch.full_like(num_accepted, k_plus_1 - 1)
    failed, report = False, []
    for k in range(k_plus_1):
        reached = (num_accepted >= k) & (num_draft >= k)
        emitted = tokens[reached, k]
        assert (emitted >= 0).all() and (emitted < vocab).all(), "a reached position holds no valid token"
        counts = torch.bincount(emitted, minlength=vocab)[:vocab]
        bad, line = chi_square_fails(counts, target_probs[k])
        failed |= bad
        report.append(f"position {k}: {line}")
    return failed, report


def naive_verify(target_probs: torch.Tensor, draft_probs: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A deliberately WRONG sampler: after a rejection it redraws from the target p, not from
    max(p - q, 0). (N, K+1, V) / (N, K, V) probabilities; returns (tokens, num_accepted)."""
    n, k_plus_1, vocab = target_probs.shape
    k = k_plus_1 - 1
    p_x = target_probs[:, :k].gather(2, drafts[..., None])[..., 0]
    q_x = draft_probs.gather(2, drafts[..., None])[..., 0]
    u = torch.rand(n, k, generator=generator, dtype=torch.float64)
    accept = u < (p_x / q_x)
    num_accepted = accept.long().cumprod(1).sum(1)
    rows = torch.arange(n)
    redraw = torch.multinomial(target_probs[rows, num_accepted], 1, generator=generator)[:, 0]
    out = torch.full((n, k_plus_1), -1, dtype=torch.int64)
    positions = torch.arange(k_plus_1)
    out[:, :k] = torch.where(positions[None, :k] < num_accepted[:, None], drafts, -1)
    out[rows, num_accepted] = redraw
    return out, num_accepted
