"""What the step functions of each kind (chain, tree) hand to the next phase of a step."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Proposal:
    """The draft phase's result for the rows of a step."""

    tokens: torch.Tensor  # (b, N) draft tokens (chain: K in order; tree: nodes level by level)
    lines: torch.Tensor | None  # draft lines verification reads (processed; None: one-hot proposals)
    depth_budget: torch.Tensor  # (b,) how deep each row's verification may go (rows near their end: less)


@dataclass
class Verdict:
    """The verify phase's result."""

    tokens: torch.Tensor  # (b, D+1) accepted tokens, then the corrected or bonus one, then -1
    accepted: torch.Tensor  # (b,) accepted drafts (nodes entered)
    contexts: torch.Tensor  # (b, D+1) the target line each emitted token was drawn at
    last_draft: torch.Tensor  # (b,) the deepest accepted draft (what the draft model has not seen after a whole draft)
    path: torch.Tensor | None = None  # (b, D) node entered at each depth (trees), -1 beyond
    estimate: list[torch.Tensor] | None = None  # [sum of min(1, p/q), count] over judged drafts (adaptive K)
