"""Eager PyTorch reference: the specification of record for every backend.

Vectorised over rows and positions (no Python loop over the batch). It materialises (B, K+1, V)
float32 tensors, which the fused backends never do; it is here to be read, to be tested against,
and to run where no faster backend exists.

Processing of one logits line (a row at one position), identical on every backend:

1. ``s = logits.float() * inv_t`` with ``inv_t = 1 / temperature`` rounded once to float32 (greedy
   rows, temperature 0, use the raw argmax instead);
2. top-k keeps every ``s >= t_k``, ``t_k`` = the k-th largest value of ``s`` (ties all kept);
3. top-p keeps every token whose *strictly more probable* mass, inside the top-k set, is below
   ``top_p`` (transformers' TopPLogitsWarper, with tied logits kept or dropped together);
4. the kept set is always ``{s >= tau}`` for one threshold ``tau``; with ``m = max(s)`` and
   ``z = sum_{s >= tau} exp(s - m)``, the probability of token x is ``exp(s_x - m) / z`` if kept, else 0.

Verification (modified rejection sampling) then, for each row, with draft token x_k at position k:

* accept x_k iff ``u_k * q(x_k) < p(x_k)`` where ``u_k`` is the row's acceptance coin in (0, 1)
  at its absolute position ``offset + k`` (so q(x) = 0 accepts iff p(x) > 0); greedy rows accept
  iff x_k equals the target's argmax;
* at the first rejected position j (or j = n_b when every draft is accepted) emit
  ``argmax_y r(y) / E_y`` with ``E_y = -log(u_y)`` one exponential per vocabulary entry (an
  exponential race: a draw from r normalised) where ``r = max(p - q, 0)`` after a rejection and
  ``r = p`` for the bonus token. If the residual is zero everywhere (p equals q up to rounding)
  the race runs on p instead. Greedy rows emit the target's argmax (lowest index on ties).

Random numbers come from :mod:`specdec_ext._philox` (per-row keys, per-row offsets, stream v2).

Optional outputs: ``logprobs`` (B, K+1), the log-probability of each emitted token under the
processed target line, ``(s_x - m) - log(z)``, or the raw one, ``(raw_x - raw_max) - log(z_raw)``
(greedy rows report the raw one in both modes); ``accept_probs`` (B, K), ``min(1, p(x_k) / q(x_k))``
at every position the walk examined. Both are NaN where no token is emitted or examined.

Invalid rows (NaN / +inf logits, an empty line, a temperature so small that the scaled logits are
not finite, out-of-range draft ids, bad parameters, negative seeds or offsets) get num_accepted 0
and tokens -1. With ``check=True`` every line up to
n_b is validated (and :func:`specdec_ext.verify` raises); with ``check=False`` only the lines the
verification reads count: target and draft lines at positions up to the first rejection (a greedy
row reads no draft line), so the fused backends never read the lines after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._params import LOGPROBS_NONE, LOGPROBS_RAW, VerifyArgs, invalid_rows, inverse_temperature
from ._philox import coin_uniforms, key_per_row, race_uniforms


@dataclass
class ProcessedLines:
    """Per-line statistics of processed logits: everything needed to evaluate p(x) anywhere."""

    scaled: torch.Tensor  # (N, V) float32, logits * (1 / temperature)
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
    scaled = raw * inverse_temperature(temperature)[:, None]
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


def raw_log_softmax_at(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(N,) ``(raw_x - raw_max) - log(sum exp(raw - raw_max))`` of one token per (N, V) line."""
    raw = logits.float()
    raw_max = raw.amax(dim=1)
    log_z = torch.log(torch.exp(raw - raw_max[:, None]).sum(dim=1))
    return (raw.gather(1, index[:, None])[:, 0] - raw_max) - log_z


def verify_eager(args: VerifyArgs, base_key: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Eager verification; returns (tokens (B, K+1) int64, num_accepted (B,) int64, logprobs
    (B, K+1) float32 or None, accept_probs (B, K) float32 or None)."""
    batch, num_positions, vocab = args.batch, args.num_positions, args.vocab
    device = args.target_logits.device
    rows = torch.arange(batch, device=device)
    positions = torch.arange(num_positions, device=device)
    greedy = args.temperature == 0
    keys = key_per_row(args.seeds, base_key, batch, device)
    offsets = args.offsets if args.offsets is not None else torch.zeros(batch, dtype=torch.int64, device=device)
    target = _lines(args, args.target_logits)  # line b * (K+1) + k
    draft = _lines(args, args.draft_logits) if args.draft_logits is not None and num_positions else None  # line b * K + k
    tokens = args.draft_tokens.long().clamp(0, args.draft_vocab - 1)  # out-of-range ids blank the row below

    # Acceptance: the longest prefix of accepted drafts among each row's first n_b.
    num_accepted = torch.zeros(batch, dtype=torch.int64, device=device)
    accept_probs = None
    if num_positions:
        target_line = rows[:, None] * (num_positions + 1) + positions[None, :]  # (B, K)
        s_x = target.scaled[target_line, tokens]
        p_x = torch.exp(s_x - target.row_max[target_line]) / target.normaliser[target_line]
        p_x = torch.where(s_x >= target.threshold[target_line], p_x, torch.zeros_like(p_x))
        q_x = draft.probs_at(tokens.reshape(-1)).reshape(batch, num_positions) if draft is not None else torch.ones_like(p_x)
        coin = coin_uniforms(keys, offsets[:, None] + positions[None, :])
        matches_argmax = tokens == target.argmax[target_line]
        accept = torch.where(greedy[:, None], matches_argmax, coin * q_x < p_x)
        accept &= positions[None, :] < args.num_draft_tokens[:, None]
        num_accepted = accept.long().cumprod(dim=1).sum(dim=1)
        if args.accept_probs:
            ratio = torch.where(q_x > 0, torch.clamp(p_x / q_x, max=1.0), (p_x > 0).float())
            ratio = torch.where(greedy[:, None], matches_argmax.float(), ratio)
            examined = (positions[None, :] < args.num_draft_tokens[:, None]) & (positions[None, :] <= num_accepted[:, None])
            accept_probs = torch.where(examined, ratio, float("nan"))
    elif args.accept_probs:
        accept_probs = torch.empty((batch, 0), dtype=torch.float32, device=device)

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
    exponentials = -torch.log(race_uniforms(keys, offsets + j, vocab, args.stream))
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
    logprobs = _emitted_logprobs(args, target, out) if args.logprobs != LOGPROBS_NONE else None
    if accept_probs is not None:
        accept_probs = torch.where(bad[:, None], float("nan"), accept_probs)
    return out, num_accepted, logprobs, accept_probs


def _emitted_logprobs(args: VerifyArgs, target: ProcessedLines, out: torch.Tensor) -> torch.Tensor:
    """(B, K+1) float32 log-probability of every emitted token (NaN where out is -1)."""
    batch, length = out.shape
    emitted = out >= 0
    index = out.clamp(min=0).reshape(-1)
    raw = raw_log_softmax_at(args.target_logits.reshape(batch * length, -1), index)
    if args.logprobs == LOGPROBS_RAW:
        values = raw
    else:
        s_x = target.scaled.gather(1, index[:, None])[:, 0]
        processed = torch.where(s_x >= target.threshold, (s_x - target.row_max) - torch.log(target.normaliser), float("-inf"))
        greedy = (args.temperature == 0).repeat_interleave(length)
        values = torch.where(greedy, raw, processed)
    return torch.where(emitted, values.reshape(batch, length), float("nan"))


def _subset(lines: ProcessedLines, index: torch.Tensor) -> ProcessedLines:
    """The lines at ``index``."""
    return ProcessedLines(lines.scaled[index], lines.row_max[index], lines.threshold[index], lines.normaliser[index], lines.argmax[index])
