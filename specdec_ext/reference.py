"""Eager PyTorch reference: the specification of record for every backend.

Vectorised over rows and positions (no Python loop over the batch). It materialises (B, K+1, V)
float32 tensors, which the fused backends never do; it is here to be read, to be tested against,
and to run where no faster backend exists.

Processing of one logits line (a row at one position), identical on every backend:

1. ``s = logits.float() / temperature`` (greedy rows, temperature 0, use the raw argmax instead);
2. top-k keeps every ``s >= t_k``, ``t_k`` = the k-th largest value of ``s`` (ties all kept);
3. top-p keeps every token whose *strictly more probable* mass, inside the top-k set, is below
   ``top_p`` (transformers' TopPLogitsWarper, with tied logits kept or dropped together);
4. the kept set is always ``{s >= tau}`` for one threshold ``tau``; with ``m = max(s)`` and
   ``z = sum_{s >= tau} exp(s - m)``, the probability of token x is ``exp(s_x - m) / z`` if kept, else 0.

Verification (modified rejection sampling) then, for each row, with draft token x_k at position k:

* accept x_k iff ``u_k * q(x_k) < p(x_k)`` where ``u_k`` is the row's acceptance uniform in (0, 1)
  (so q(x) = 0 accepts iff p(x) > 0); greedy rows accept iff x_k equals the target's argmax;
* at the first rejected position j (or j = n_b when every draft is accepted) emit
  ``argmax_y r(y) / E_y`` with ``E_y = -log(u_y)`` one exponential per vocabulary entry (an
  exponential race: a draw from r normalised) where ``r = max(p - q, 0)`` after a rejection and
  ``r = p`` for the bonus token. If the residual is zero everywhere (p equals q up to rounding)
  the race runs on p instead. Greedy rows emit the target's argmax (lowest index on ties).

Invalid rows (NaN / +inf logits, an empty line, overflow of logits / temperature, out-of-range
draft ids, bad parameters) get num_accepted 0 and tokens -1. With ``check=True`` every line up to
n_b is validated (and :func:`specdec_ext.verify` raises); with ``check=False`` only the lines the
verification reads count: target and draft lines at positions up to the first rejection (a greedy
row reads no draft line), so the fused backends never read the lines after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._params import VerifyArgs, invalid_rows
from ._philox import ACCEPT_STREAM, SAMPLE_STREAM, uniforms


@dataclass
class ProcessedLines:
    """Per-line statistics of processed logits: everything needed to evaluate p(x) anywhere."""

    scaled: torch.Tensor  # (N, V) float32, logits / temperature
    row_max: torch.Tensor  # (N,) float32, m
    threshold: torch.Tensor  # (N,) float32, tau (-inf when nothing is filtered)
    normaliser: torch.Tensor  # (N,) float32, z
    argmax: torch.Tensor  # (N,) int64, argmax of the raw logits (greedy rows)

    def probs(self) -> torch.Tensor:
        """(N, V) float32 processed probabilities."""
        keep = self.scaled >= self.threshold[:, None]
        weights = torch.exp(self.scaled - self.row_max[:, None])
        return torch.where(keep, weights / self.normaliser[:, None], torch.zeros_like(weights))

    def probs_at(self, index: torch.Tensor) -> torch.Tensor:
        """(N,) float32 processed probability of one token per line."""
        s = self.scaled.gather(1, index[:, None])[:, 0]
        p = torch.exp(s - self.row_max) / self.normaliser
        return torch.where(s >= self.threshold, p, torch.zeros_like(p))


def filter_thresholds(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """(N,) threshold tau of top-k then top-p on (N, V) float32 scaled logits (-inf = keep all)."""
    num_lines, vocab = scaled.shape
    neg_inf = torch.full((num_lines,), float("-inf"), device=scaled.device)
    use_k = (top_k > 0) & (top_k < vocab)
    use_p = top_p < 1
    if not bool((use_k | use_p).any()):
        return neg_inf
    ordered = scaled.sort(dim=1, descending=True).values
    k_index = torch.where(use_k, top_k, torch.ones_like(top_k)) - 1
    tau_k = torch.where(use_k, ordered.gather(1, k_index[:, None])[:, 0], neg_inf)
    weights = torch.exp(ordered - ordered[:, :1]) * (ordered >= tau_k[:, None])
    # Mass strictly before each sorted entry; for the first entry of a run of ties that is the mass
    # strictly more probable than the tied value, which is what decides the cut.
    mass_before = torch.cumsum(weights, dim=1) - weights
    mass_before[:, 0] = 0
    budget = top_p * weights.sum(dim=1)
    keep_count = (mass_before < budget[:, None]).sum(dim=1).clamp(min=1)
    tau_p = torch.where(use_p, ordered.gather(1, (keep_count - 1)[:, None])[:, 0], neg_inf)
    return torch.maximum(tau_k, tau_p)


def process_lines(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> ProcessedLines:
    """Apply temperature, top-k and top-p to (N, V) logits with per-line parameters."""
    raw = logits.float()
    greedy = temperature == 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = raw / scale[:, None]
    threshold = filter_thresholds(scaled, torch.where(greedy, 0, top_k), torch.where(greedy, 1.0, top_p))
    row_max = scaled.amax(dim=1)
    weights = torch.exp(scaled - row_max[:, None])
    normaliser = torch.where(scaled >= threshold[:, None], weights, torch.zeros_like(weights)).sum(dim=1)
    return ProcessedLines(scaled, row_max, threshold, normaliser, raw.argmax(dim=1))


def _lines(args: VerifyArgs, logits: torch.Tensor) -> ProcessedLines:
    """Process every (row, position) line of a (B, L, V) logits tensor with its row's parameters."""
    batch, length, vocab = logits.shape

    def per_line(x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(length)

    return process_lines(logits.reshape(batch * length, vocab), per_line(args.temperature), per_line(args.top_k), per_line(args.top_p))


def verify_eager(args: VerifyArgs, seed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager verification; returns (tokens (B, K+1) int64, num_accepted (B,) int64)."""
    batch, num_positions, vocab = args.batch, args.num_positions, args.vocab
    device = args.target_logits.device
    rows = torch.arange(batch, device=device)
    positions = torch.arange(num_positions, device=device)
    greedy = args.temperature == 0
    target = _lines(args, args.target_logits)  # line b * (K+1) + k
    draft = _lines(args, args.draft_logits) if args.draft_logits is not None and num_positions else None  # line b * K + k
    tokens = args.draft_tokens.long().clamp(0, args.draft_vocab - 1)  # out-of-range ids blank the row below

    # Acceptance: the longest prefix of accepted drafts among each row's first n_b.
    num_accepted = torch.zeros(batch, dtype=torch.int64, device=device)
    if num_positions:
        target_line = rows[:, None] * (num_positions + 1) + positions[None, :]  # (B, K)
        s_x = target.scaled[target_line, tokens]
        p_x = torch.exp(s_x - target.row_max[target_line]) / target.normaliser[target_line]
        p_x = torch.where(s_x >= target.threshold[target_line], p_x, torch.zeros_like(p_x))
        q_x = draft.probs_at(tokens.reshape(-1)).reshape(batch, num_positions) if draft is not None else torch.ones_like(p_x)
        coin = uniforms(seed, 0, positions[None, :], rows[:, None], ACCEPT_STREAM)
        accept = torch.where(greedy[:, None], tokens == target.argmax[target_line], coin * q_x < p_x)
        accept &= positions[None, :] < args.num_draft_tokens[:, None]
        num_accepted = accept.long().cumprod(dim=1).sum(dim=1)

    # The corrected token (after a rejection at j) or the bonus token (j = n_b), by an exponential race.
    j = num_accepted
    line = rows * (num_positions + 1) + j
    p = _subset(target, line).probs()
    residual = p
    if num_positions:
        j_draft = j.clamp(max=num_positions - 1)
        q = torch.zeros_like(p)
        if draft is not None:
            q[:, : args.draft_vocab] = _subset(draft, rows * num_positions + j_draft).probs()
        else:
            q.scatter_(1, tokens.gather(1, j_draft[:, None]), 1.0)
        rejected = j < args.num_draft_tokens
        residual = torch.where(rejected[:, None], (p - q).clamp(min=0), p)
    vocab_index = torch.arange(vocab, device=device)
    exponentials = -torch.log(uniforms(seed, vocab_index[None, :], j[:, None], rows[:, None], SAMPLE_STREAM))
    race = residual / exponentials
    winner = torch.where(race.amax(dim=1) > 0, race.argmax(dim=1), (p / exponentials).argmax(dim=1))
    winner = torch.where(greedy, target.argmax[line], winner)

    out = torch.full((batch, num_positions + 1), -1, dtype=torch.int64, device=device)
    out[:, :num_positions] = torch.where(positions[None, :] < num_accepted[:, None], tokens, -1)
    out.scatter_(1, j[:, None], winner[:, None])
    # check=False reads only the lines up to each row's first rejection: bad values further on
    # cannot change its tokens and do not blank it (check=True validates every line up to n_b).
    bad = invalid_rows(args, reached=None if args.check else j)
    out = torch.where(bad[:, None], -1, out)
    num_accepted = torch.where(bad, 0, num_accepted)
    return out, num_accepted


def _subset(lines: ProcessedLines, index: torch.Tensor) -> ProcessedLines:
    """The lines at ``index``."""
    return ProcessedLines(lines.scaled[index], lines.row_max[index], lines.threshold[index], lines.normaliser[index], lines.argmax[index])
