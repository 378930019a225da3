"""The rows still generating: where each one is, on the device and (for the loop's decisions) on the host."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Rows:
    """Device tensors, and host mirrors of what the loop decides on without a sync."""

    index: torch.Tensor  # (b,) row of the output
    pending: torch.Tensor  # (b,) last committed token: in neither cache yet, fed to the target next step
    length: torch.Tensor  # (b,) committed tokens without padding, pending included
    generated: torch.Tensor  # (b,) new tokens so far
    # (b, U) committed tokens the draft has not been fed yet, the pending one last, -1 padded on the
    # left: U = 2 after a step where some row accepted its whole draft (the draft never saw the last one).
    unfed: torch.Tensor
    index_host: list[int] = field(default_factory=list)
    length_host: list[int] = field(default_factory=list)
    generated_host: list[int] = field(default_factory=list)
    unfed_host: list[int] = field(default_factory=list)  # live entries of each row's `unfed`

    @classmethod
    def start(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Rows:
        batch = input_ids.shape[0]
        length = attention_mask.sum(1)
        return cls(torch.arange(batch, device=input_ids.device), input_ids[:, -1], length, torch.zeros_like(length), input_ids[:, -1:],
                   list(range(batch)), length.tolist(), [0] * batch, [1] * batch)

    @property
    def unfed_all_live(self) -> bool:
        """Every row has ``unfed.shape[1]`` unfed tokens (the draft's feed then has no dead slot)."""
        return all(count == self.unfed.shape[1] for count in self.unfed_host)

    def advance(self, final: torch.Tensor, emitted: torch.Tensor, emitted_host: list[int], last_draft: torch.Tensor, whole: torch.Tensor,
                whole_host: list[bool]) -> None:
        """Commit a step: ``final`` (b,) becomes the pending token; ``whole[b]`` (and its host copy): row b
        accepted its whole draft, so the draft model has not seen ``last_draft[b]`` either."""
        self.pending = final
        self.length = self.length + emitted
        self.generated = self.generated + emitted
        self.length_host = [n + e for n, e in zip(self.length_host, emitted_host, strict=True)]
        self.generated_host = [n + e for n, e in zip(self.generated_host, emitted_host, strict=True)]
        if any(whole_host):
            self.unfed = torch.stack([torch.where(whole.to(final.device), last_draft.to(final.device), -1), final], 1)
        else:
            self.unfed = final[:, None]
        self.unfed_host = [2 if w else 1 for w in whole_host]

    def select(self, keep: list[int]) -> torch.Tensor:
        """Keep rows ``keep`` (host indices, in order); returns their device index."""
        index = torch.tensor(keep, dtype=torch.long, device=self.index.device)
        for name in ("index", "pending", "length", "generated", "unfed"):
            setattr(self, name, getattr(self, name)[index])
        for name in ("index_host", "length_host", "generated_host", "unfed_host"):
            setattr(self, name, [getattr(self, name)[b] for b in keep])
        return index
