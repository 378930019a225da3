"""Reference sequences for the generation tests: exact laws of short continuations by enumeration,
greedy target-only decoding, and the small model pairs the tests share.

The reference is what transformers' target-only sampling does: at every step, the raw next-token
logits of the prefix go through the given ``LogitsProcessorList`` (processors, then warpers, each
called with that prefix's input_ids) and a token is drawn from the softmax. With a vocabulary of
8-10 ids and 2-3 new tokens every continuation can be enumerated, so sampled counts are checked by
chi-square against the exact law (thresholds a correct sampler exceeds once in 10^6 runs).
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from scipy.stats import chi2
from transformers.generation.streamers import BaseStreamer


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


def kernel_law(target, prompt: list[int], num_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """P(x_1..x_n | prompt) under the target processed as the kernels process it (temperature, top-k,
    top-p: :func:`specdec_ext.reference.process_lines`), flattened (x_1 most significant), by enumeration."""
    from specdec_ext.reference import process_lines

    vocab = target.config.vocab_size
    heads = torch.tensor(list(itertools.product(range(vocab), repeat=num_tokens - 1)), dtype=torch.long).reshape(-1, num_tokens - 1)
    ids = torch.cat([torch.tensor(prompt).expand(heads.shape[0], -1), heads], 1)
    with torch.no_grad():
        logits = target(ids).logits[:, len(prompt) - 1:]  # (V^(n-1), n, V)
    lines = logits.reshape(-1, vocab)
    count = lines.shape[0]
    probs = process_lines(lines, torch.full((count,), float(temperature)), torch.full((count,), top_k or 0),
                          torch.full((count,), float(top_p or 1.0))).probs().reshape(heads.shape[0], num_tokens, vocab)
    law = torch.ones(heads.shape[0], dtype=torch.float64)
    for i in range(num_tokens - 1):
        law = law * probs[torch.arange(heads.shape[0]), i, heads[:, i]].double()
    return (law[:, None] * probs[:, -1].double()).reshape(-1)


def per_prompt_chi_square(new_tokens: torch.Tensor, vocab: int, laws: list[torch.Tensor]) -> list[tuple[float, float]]:
    """(statistic, threshold) per prompt for (len(laws) * rows, n) continuations, rows of one prompt
    consecutive; the 1e-6 level is split over the prompts."""
    rows = new_tokens.shape[0] // len(laws)
    index = cells(new_tokens, vocab)
    return [chi_square(torch.bincount(index[i * rows: (i + 1) * rows], minlength=law.numel()), law, alpha=1e-6 / len(laws))
            for i, law in enumerate(laws)]


# ------------------------------------------------------------------------------------------------
# Greedy references and the small models the generation tests share.

#: Prompts of different lengths (left-padded together), one of a single token.
PROMPTS = [[5, 6, 7, 8, 9], [1, 2], [4, 11, 4, 12, 4, 13, 4], [7], [3, 9, 10]]


def model_pair(name: str, vocab: int = 16, attention: str = "sdpa"):
    """(target, draft): "llama-gpt2" / "llama3-gpt2" an unrelated draft (mostly rejections; learned
    positions, so wrong position ids would show), "gpt2-close" / "llama-close" a perturbed copy (long
    accepted runs)."""
    from support.tiny_models import perturbed_copy, tiny_gpt2, tiny_llama

    if name in ("llama-gpt2", "llama3-gpt2"):
        seed = 3 if name == "llama3-gpt2" else 0
        return tiny_llama(vocab, seed=seed, attn_implementation=attention), tiny_gpt2(vocab, seed=3, attn_implementation=attention)
    if name == "gpt2-close":
        target = tiny_gpt2(vocab, seed=5, layers=2, attn_implementation=attention)
        return target, perturbed_copy(target, noise=0.04)
    if name == "llama-close":
        target = tiny_llama(vocab, seed=7, attn_implementation=attention)
        return target, perturbed_copy(target, noise=0.02)
    raise KeyError(name)


def target_only(target, input_ids, attention_mask, max_new_tokens: int, eos, pad: int, **keywords) -> torch.Tensor:
    """transformers' greedy decoding of the target alone, padded to (B, L_in + max_new_tokens)."""
    out = target.generate(input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos,
                          pad_token_id=pad, **keywords)
    return torch.nn.functional.pad(out, (0, input_ids.shape[1] + max_new_tokens - out.shape[1]), value=pad)


def eos_ending_some_rows(target, input_ids, attention_mask, max_new_tokens: int) -> int:
    """An id that greedy decoding emits early in some rows and never in others (so EOS handling is exercised)."""
    free = target_only(target, input_ids, attention_mask, max_new_tokens, None, 0)[:, input_ids.shape[1]:]
    for token in range(target.config.vocab_size):
        hits = (free == token).any(1)
        early = (free[:, : max_new_tokens // 2] == token).any(1)
        if early.any() and not hits.all():
            return token
    raise AssertionError("no token ends some rows but not all; change the model seeds")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models on a shared machine: one intra-op thread is many times faster. (Import it into a test module.)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*eager backend.*")
        yield
    torch.set_num_threads(threads)


def keeping_every_node(keep_segment):
    """Wrong: a tree cache commit that keeps every node of the step, not only the accepted path
    (``ModelCache.keep_segment`` replaced; the fresh-score and law checks must catch it)."""
    return lambda self, keep, width: keep_segment(self, torch.ones_like(keep), keep.shape[1])


class RecordingStreamer(BaseStreamer):
    """A transformers streamer that records what it is given."""

    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1
