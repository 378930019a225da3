"""Exact laws of short continuations under transformers' own processors, by enumeration.

The reference is what transformers' target-only sampling does: at every step, the raw next-token
logits of the prefix go through the given ``LogitsProcessorList`` (processors, then warpers, each
called with that prefix's input_ids) and a token is drawn from the softmax. With a vocabulary of
8-10 ids and 2-3 new tokens every continuation can be enumerated, so sampled counts are checked by
chi-square against the exact law (thresholds a correct sampler exceeds once in 10^6 runs).
"""

from __future__ import annotations

import itertools

import torch
from scipy.stats import chi2


def exact_law(target, prompt: list[int], num_tokens: int, processors, eos: int | None = None) -> torch.Tensor:
    """P(x_1..x_n | prompt) flattened (x_1 most significant). After an EOS every later token is EOS
    (rows are padded with the EOS id), with probability 1."""
    vocab = target.config.vocab_size
    law = torch.ones(1, dtype=torch.float64)
    heads = torch.zeros((1, 0), dtype=torch.long)
    for step in range(num_tokens):
        ids = torch.cat([torch.tensor(prompt).expand(heads.shape[0], -1), heads], 1)
        with torch.no_grad():
            logits = target(ids).logits[:, -1].float()
        scores = processors(ids, logits.clone()) if processors else logits
        probs = scores.double().softmax(-1)
        if eos is not None and step:
            ended = (heads == eos).any(1)
            forced = torch.zeros_like(probs)
            forced[:, eos] = 1.0
            probs = torch.where(ended[:, None], forced, probs)
        law = (law[:, None] * probs).reshape(-1)
        heads = torch.tensor(list(itertools.product(range(vocab), repeat=step + 1)), dtype=torch.long).reshape(-1, step + 1)
    return law


def cells(new_tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """(N, n) token ids -> (N,) cell index in the flattened law."""
    n = new_tokens.shape[1]
    return (new_tokens * vocab ** torch.arange(n - 1, -1, -1)).sum(1)


def chi_square(counts: torch.Tensor, law: torch.Tensor, alpha: float = 1e-6) -> tuple[float, float]:
    """(statistic, threshold) of Pearson's test, cells of expected count < 20 pooled; inf if a p = 0 cell is hit."""
    if counts[law == 0].sum() > 0:
        return float("inf"), 0.0
    expected = counts.sum() * law
    big = expected >= 20
    observed = torch.cat([counts[big].double(), counts[~big].sum()[None].double()])
    expected = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = expected > 0
    statistic = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return statistic, float(chi2.isf(alpha, int(keep.sum()) - 1))


def fits(new_tokens: torch.Tensor, target, prompt, processors, eos=None) -> tuple[bool, float, float]:
    """Whether sampled continuations (N, n) fit the exact law: (fits, statistic, threshold)."""
    vocab = target.config.vocab_size
    law = exact_law(target, prompt, new_tokens.shape[1], processors, eos)
    counts = torch.bincount(cells(new_tokens, vocab), minlength=law.numel())
    statistic, threshold = chi_square(counts, law)
    return statistic < threshold, statistic, threshold
