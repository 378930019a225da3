"""What a generation call did: phase clocks, host-side tallies and the one statistics type."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


class Clock:
    """Phase timings. On CUDA, events read after the step's one sync; on CPU, the wall clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def spans(self, marks) -> list[float]:
        """Seconds between consecutive marks (called after a sync that covers them, so no wait)."""
        if self.cuda:
            marks[-1].synchronize()
            return [start.elapsed_time(end) / 1000.0 for start, end in zip(marks, marks[1:], strict=False)]
        return [end - start for start, end in zip(marks, marks[1:], strict=False)]


def stderr_of_mean(total: float, squares: float, count: int) -> float:
    """Standard error of a mean from the sum and the sum of squares of ``count`` values."""
    if count < 2:
        return float("nan")
    mean = total / count
    variance = max(squares / count - mean * mean, 0.0) * count / (count - 1)
    return (variance / count) ** 0.5


@dataclass
class SpeculativeStats:
    """What a :func:`specdec_ext.generate` call did, for chains, trees and block verification alike (a
    chain of K drafts is the tree (1, ..., 1)). Counts cover every row; times cover the whole call.

    acceptance_per_position: entry d-1 is the rate at which a row that reached depth d-1 with children
        there entered one: for a chain, the rate at which draft d was accepted when it was verified
        (drafts before it all accepted and the row's budget covering it).
    mean_acceptance: children entered / contexts with children the verification reached (for a chain,
        accepted drafts / drafts judged: the per-token acceptance rate ``a`` of Leviathan et al.).
    mean_accepted_per_step: accepted drafts (nodes entered) per row per step.
    tokens_per_target_forward: new tokens per row per verification forward (accepted drafts plus the
        corrected or bonus token, after cutting at EOS, stop criteria and ``max_new_tokens``).
    target_forwards / draft_forwards: model calls: the prefill of every prompt token but the last (none
        for one-token prompts), then per step one target forward and one draft forward per depth.
    draft_seconds / target_seconds / verify_seconds: time drafting (draft forwards and sampling), in the
        target's forwards, and verifying (processors on the target's logits, the kernel, cutting at EOS,
        writing the tokens out). Each prefill counts to its model. Measured with CUDA events on GPU (no
        extra syncs) and the wall clock on CPU.
    draft_lengths: draft tokens (tree nodes) scored at each step.
    tokens_per_target_forward_stderr: standard error of ``tokens_per_target_forward`` (from the spread
        of the tokens each row emitted per step), to tell a difference between runs from noise.
    trees: the branching of each step's draft ((1,) * K for a chain of K).
    draft_prefill_seconds / target_prefill_seconds: the prefills' part of draft_seconds / target_seconds.
    commit_seconds: wall time of the cache bookkeeping after each step's sync (keeping the accepted
        entries, dropping finished rows, squeezing holes).
    step_seconds: wall time of the steps, prefills excluded; what the phases (less the prefills) leave
        of it is the loop's own host work (the sync, stop criteria, tallies).
    """

    acceptance_per_position: list[float]
    mean_acceptance: float
    mean_accepted_per_step: float
    tokens_per_target_forward: float
    target_forwards: int
    draft_forwards: int
    draft_seconds: float
    target_seconds: float
    verify_seconds: float
    draft_lengths: list[int]
    tokens_per_target_forward_stderr: float = float("nan")
    trees: list[tuple[int, ...]] = field(default_factory=list)
    draft_prefill_seconds: float = 0.0
    target_prefill_seconds: float = 0.0
    commit_seconds: float = 0.0
    step_seconds: float = 0.0


@dataclass
class Tally:
    """Host-side counts behind :class:`SpeculativeStats`."""

    reached: list[int] = field(default_factory=list)  # per depth: rows at a context with children there
    entered: list[int] = field(default_factory=list)  # per depth: rows that entered a child there
    accepted: int = 0
    emitted: int = 0
    emitted_squares: int = 0
    row_steps: int = 0
    draft_lengths: list[int] = field(default_factory=list)
    trees: list[tuple[int, ...]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # draft, target, verify
    prefill_seconds: list[float] = field(default_factory=lambda: [0.0, 0.0])  # draft, target
    commit_seconds: float = 0.0
    step_seconds: float = 0.0

    def add(self, shape, accepted: list[int], emitted: list[int], reached: list[int], entered: list[int], spans: list[float]) -> None:
        while len(self.reached) < len(reached):
            self.reached.append(0)
            self.entered.append(0)
        for depth, (r, e) in enumerate(zip(reached, entered, strict=True)):
            self.reached[depth] += r
            self.entered[depth] += e
        self.accepted += sum(accepted)
        self.emitted += sum(emitted)
        self.emitted_squares += sum(e * e for e in emitted)
        self.row_steps += len(accepted)
        self.draft_lengths.append(shape.num_nodes)
        self.trees.append(shape.branching)
        self.seconds = [total + span for total, span in zip(self.seconds, spans, strict=True)]

    def stats(self, target, draft) -> SpeculativeStats:
        steps = max(self.row_steps, 1)
        judged = sum(self.reached)
        return SpeculativeStats(
            acceptance_per_position=[e / r if r else float("nan") for e, r in zip(self.entered, self.reached, strict=True)],
            mean_acceptance=sum(self.entered) / judged if judged else float("nan"),
            mean_accepted_per_step=self.accepted / steps,
            tokens_per_target_forward=self.emitted / steps,
            target_forwards=target.forwards, draft_forwards=draft.forwards if draft is not None else 0,
            draft_seconds=self.seconds[0] + self.prefill_seconds[0], target_seconds=self.seconds[1] + self.prefill_seconds[1],
            verify_seconds=self.seconds[2], draft_lengths=self.draft_lengths,
            tokens_per_target_forward_stderr=stderr_of_mean(self.emitted, self.emitted_squares, self.row_steps), trees=self.trees,
            draft_prefill_seconds=self.prefill_seconds[0], target_prefill_seconds=self.prefill_seconds[1], commit_seconds=self.commit_seconds,
            step_seconds=self.step_seconds,
        )
