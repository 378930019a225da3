"""What a generation call returns, and the per-token score lines it collects on request."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .stats import SpeculativeStats


@dataclass
class SpeculativeOutput:
    """What :func:`specdec_ext.generate` returns, for chains, trees and block verification alike.

    sequences: (B, L_in + max_new_tokens) int64: the prompt as given, the new tokens, then padding
        after a row's end (EOS, a stop criterion, ``max_time``).
    stats: :class:`SpeculativeStats`.
    new_tokens: tokens each row emitted (its EOS or stop token included).
    scores / logits: with ``output_scores`` / ``output_logits``, one (B, V) float32 tensor per new
        token as transformers defines them: the processed scores the token was drawn from (every
        processor and warper applied) and the raw target logits. A row that has ended gets a line
        putting all mass on the pad token (0 there, -inf elsewhere). Otherwise None.
    """

    sequences: torch.Tensor
    stats: SpeculativeStats
    new_tokens: list[int] = field(default_factory=list)
    scores: tuple[torch.Tensor, ...] | None = None
    logits: tuple[torch.Tensor, ...] | None = None


class Recorder:
    """Collects ``scores`` / ``logits`` lines of the emitted tokens, row by row (host lists of device tensors)."""

    def __init__(self, batch: int, scores: bool, logits: bool):
        self.scores = [[] for _ in range(batch)] if scores else None
        self.logits = [[] for _ in range(batch)] if logits else None

    def add(self, pipeline, index: list[int], emitted: list[int], contexts: torch.Tensor, processed, raw) -> None:
        """``contexts`` (b, J): the line of ``processed`` / ``raw`` (b, P, V) each emitted token was drawn at."""
        rows = [b for b, e in enumerate(emitted) for _ in range(e)]
        if not rows:
            return
        rows_t = torch.tensor(rows, device=raw.device)
        positions_t = contexts.to(raw.device)[rows_t, torch.tensor([j for e in emitted for j in range(e)], device=raw.device)]
        for store, lines in ((self.scores, lambda: pipeline.reported_scores(processed[rows_t, positions_t].float())),
                             (self.logits, lambda: raw[rows_t, positions_t].float())):
            if store is None:
                continue
            values = lines()
            at = 0
            for b, e in enumerate(emitted):
                store[index[b]].extend(values[at: at + e].unbind(0))
                at += e

    def assemble(self, store, pad: int, vocab: int, device) -> tuple[torch.Tensor, ...] | None:
        if store is None:
            return None
        steps = max((len(lines) for lines in store), default=0)
        ended = torch.full((vocab,), float("-inf"), device=device)
        ended[min(max(pad, 0), vocab - 1)] = 0.0
        return tuple(torch.stack([lines[t] if t < len(lines) else ended for lines in store]) for t in range(steps))
