"""Where drafts come from: prompt lookup (n-gram matching in each row's own tokens, one-hot q).

A draft model's proposals are drawn in ``generation.chain_steps`` (they need its KV cache). Prompt lookup
needs no model: each row proposes the tokens that followed the first earlier occurrence of its
last n tokens (n from ``ngram`` down to 1), as transformers'
``PromptLookupCandidateGenerator`` does. Drafts are a deterministic function of the committed
tokens, so verifying them as one-hot proposals (``draft_logits=None``) keeps the target's law.
"""

from __future__ import annotations

import torch


def prompt_lookup_drafts(sequences: torch.Tensor, index: torch.Tensor, first_token: torch.Tensor, committed: torch.Tensor,
                         num_draft_tokens: int, ngram: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts by n-gram lookup for every row at once.

    Args:
        sequences: (B, L) token buffer; row ``index[b]`` holds its tokens in [first_token[b], committed[b]).
        index, first_token, committed: (b,) int64 tensors on the buffer's device.
        num_draft_tokens: K, the most drafts per row.
        ngram: the longest suffix matched (then shorter ones, down to 1).
        width: ``committed.max()`` when the caller knows it on the host (saves a device sync).

    Returns:
        drafts (b, K) int64 (0 past a row's count) and counts (b,) int64: drafts found per row.
    """
    b = index.shape[0]
    device = sequences.device
    if width is None:
        width = int(committed.max()) if b else 0
    drafts = torch.zeros((b, num_draft_tokens), dtype=torch.long, device=device)
    counts = torch.zeros(b, dtype=torch.long, device=device)
    if b == 0 or num_draft_tokens == 0 or width < 2:
        return drafts, counts
    tokens = sequences[index, :width]
    found = torch.zeros(b, dtype=torch.bool, device=device)
    start_of_continuation = torch.zeros(b, dtype=torch.long, device=device)
    for n in range(min(ngram, width - 1), 0, -1):
        offsets = torch.arange(n, device=device)
        suffix_at = (committed[:, None] - n + offsets[None, :]).clamp(min=0)
        suffix = tokens.gather(1, suffix_at)  # (b, n)
        windows = tokens.unfold(1, n, 1)  # (b, width - n + 1, n): window s covers [s, s + n)
        start = torch.arange(windows.shape[1], device=device)[None, :]
        # Inside the row's tokens, and followed by at least one token before the row's end.
        usable = (start >= first_token[:, None]) & (start + n < committed[:, None]) & (committed - first_token >= n + 1)[:, None]
        matches = (windows == suffix[:, None, :]).all(-1) & usable
        has = matches.any(1) & ~found
        first_match = matches.long().argmax(1)  # the earliest occurrence
        start_of_continuation = torch.where(has, first_match + n, start_of_continuation)
        found = found | has
    available = (committed - start_of_continuation).clamp(min=0)
    counts = torch.where(found, available.clamp(max=num_draft_tokens), 0)
    columns = (start_of_continuation[:, None] + torch.arange(num_draft_tokens, device=device)[None, :]).clamp(max=width - 1)
    drafts = torch.where(torch.arange(num_draft_tokens, device=device)[None, :] < counts[:, None], tokens.gather(1, columns), 0)
    return drafts, counts
