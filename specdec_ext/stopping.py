"""Stopping rules inside an accepted block: a row stops at the first token that ends it, and nothing
after that token is emitted (what target-only decoding, which checks after every token, would do).

* EOS ids and the length budget are checked on the device, for every row and position at once
  (see ``generation.loop._write``);
* ``max_time`` (``MaxTimeCriteria``) is checked on the host once per step: every row stops after the
  step that crossed the deadline, as transformers stops after the token that crossed it;
* any other ``StoppingCriteria`` (``StopStringCriteria`` from ``stop_strings``, user criteria) is
  called as transformers calls it -- ``criteria(input_ids, None)`` with the row's exact tokens up to
  each newly emitted token -- and the row ends at the first position where it fires.
"""

from __future__ import annotations

import time

import torch


class Stopping:
    """The criteria of one generate() call, split by how they are evaluated."""

    def __init__(self, criteria=None, *, max_time: float | None = None):
        self.per_token = []
        self.deadline = None if max_time is None else time.time() + float(max_time)
        for criterion in criteria or []:
            name = type(criterion).__name__
            if name in ("MaxLengthCriteria", "EosTokenCriteria"):
                continue  # the loop's own length budget and EOS ids (the caller passes both)
            if name == "MaxTimeCriteria":
                deadline = criterion.initial_timestamp + criterion.max_time
                self.deadline = deadline if self.deadline is None else min(self.deadline, deadline)
                continue
            self.per_token.append(criterion)

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.time() > self.deadline

    def first_stops(self, sequences: torch.Tensor, index: list[int], start: list[int], emitted: list[int]) -> list[int | None]:
        """For each row, the offset (0-based, among its ``emitted`` new tokens written at ``start``) of the
        first token after which a per-token criterion fires, or None.

        ``sequences[index[b], :start[b] + j + 1]`` is row b's input_ids after its j-th new token.
        """
        stops: list[int | None] = [None] * len(index)
        if not self.per_token:
            return stops
        pending = list(range(len(index)))
        for offset in range(max(emitted, default=0)):
            groups: dict[int, list[int]] = {}
            for b in pending:
                if offset < emitted[b]:
                    groups.setdefault(start[b] + offset + 1, []).append(b)
            for length, members in groups.items():
                rows = torch.tensor([index[b] for b in members], device=sequences.device)
                ids = sequences[rows, :length]
                done = torch.zeros(len(members), dtype=torch.bool, device=sequences.device)
                for criterion in self.per_token:
                    done = done | torch.as_tensor(criterion(ids, None), device=sequences.device).reshape(-1).bool()
                for b, hit in zip(members, done.tolist(), strict=True):
                    if hit:
                        stops[b] = offset
            pending = [b for b in pending if stops[b] is None]
            if not pending:
                break
        return stops
