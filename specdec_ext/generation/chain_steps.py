"""The step functions of a chain: K drafts per row, one target forward over the pending token and the
drafts, token-wise or block verification, and a cache commit that keeps an accepted prefix.

Drafts come from the draft model (one forward per draft, each draft drawn from the processed law of
its position with that position's prefix) or, without one, from n-gram lookup in each row's own tokens
(:mod:`specdec_ext.drafting`; one-hot q). Block verification (Sun et al.) verifies the same chain
jointly; it takes the same steps, so its per-step cost is the chain's.
"""

from __future__ import annotations

import torch

from ..api import verify
from ..drafting import prompt_lookup_drafts
from . import draws
from .steps import Proposal, Verdict


def to_verify_device(tensor: torch.Tensor, run) -> torch.Tensor:
    """The step's one transfer of the draft's block (its K proposals, its (b, K, V) lines) to where the
    target's logits are and verification runs: a draft on another device than the target's last layer
    (e.g. a target split by accelerate's device_map) costs one copy per step, not one per token."""
    return tensor.to(run.verify_device, non_blocking=True)


class ChainSteps:
    """Draft, score, verify and commit for a chain; ``method``: "token" or "block" verification."""

    tree_masks = False

    def __init__(self, method: str = "token"):
        self.method = method

    def draft(self, run, draft, rows, shape, depth_budget: torch.Tensor) -> Proposal:
        k = shape.max_depth
        if draft is None:
            committed = run.prompt_width + rows.generated
            drafts, found = prompt_lookup_drafts(run.sequences, rows.index, run.first_token[rows.index], committed, k, run.ngram,
                                                 width=run.prompt_width + max(rows.generated_host))
            if run.context is not None:
                run.context.drafts = drafts
            return Proposal(drafts, None, torch.minimum(depth_budget, found))
        drafts, lines = self._draft_model(run, draft, rows, k)
        return Proposal(drafts, lines, depth_budget)

    @staticmethod
    def _draft_model(run, draft, rows, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K proposals per row, (b, K) on the verification device, and the (b, K, V) processed lines they were drawn from."""
        context, pipeline = run.context, run.pipeline
        # The tokens the draft has not seen (the pending one; before it the last draft of a row that
        # accepted its whole draft, a dead slot for the other rows), then one draft per forward.
        unfed = rows.unfed
        width = unfed.shape[1]
        tokens, live, all_live = unfed, unfed >= 0, rows.unfed_all_live
        positions = (rows.length[:, None] - width + torch.arange(width, device=unfed.device)[None, :]).clamp(min=0)
        ones = torch.ones_like(rows.length)[:, None]
        if context is not None:
            context.drafts = torch.zeros((rows.pending.shape[0], k), dtype=torch.long, device=draft.device)
        if run.seeds is not None:
            row_seeds, row_offsets = run.seeds[rows.index].to(draft.device), rows.generated.to(draft.device)
        proposals, lines = [], []
        for i in range(k):
            # Draft i of a row sits at its absolute position generated + i: with seeds the same number
            # decides it in any batch (sample() races on its own stream, so it never shares noise with verify()).
            keys = {"seeds": row_seeds, "offsets": row_offsets + i} if run.seeds is not None else {}
            raw = draft.forward(tokens, positions, live, all_live=all_live)[:, -1]
            line = raw
            if not pipeline.empty:
                # q at draft position i is processed with that position's prefix, exactly as p will be.
                line = pipeline.apply(draws.pad_vocab(raw, run.vocab)[:, None], context, i)[:, 0]
            token = draws.draw_draft(raw, line, run, keys)
            if context is not None:
                context.drafts[:, i] = token
            proposals.append(token)
            lines.append(line)
            tokens, positions, live, all_live = token[:, None], positions[:, -1:] + 1, ones, True
        drafts = to_verify_device(torch.stack(proposals, 1), run)
        if context is not None:
            context.drafts = drafts
        return drafts, to_verify_device(torch.stack(lines, 1), run)

    @staticmethod
    def score(run, target, rows, shape, proposal: Proposal) -> torch.Tensor:
        """(b, K+1, V) target logits: every row feeds its pending token and its K drafts (all live while
        scored; the commit marks the rejected ones dead)."""
        block = torch.cat([rows.pending[:, None], proposal.tokens.to(rows.pending.device)], 1)
        positions = rows.length[:, None] - 1 + torch.arange(block.shape[1], device=block.device)
        return target.forward(block, positions, torch.ones_like(block))

    def verify(self, run, rows, shape, proposal: Proposal, target_logits: torch.Tensor) -> Verdict:
        processed = target_logits if run.pipeline.empty else run.pipeline.apply(target_logits, run.context, 0)
        run.processed = processed
        extra = {}
        if run.seeds is not None:
            extra = {"seeds": run.seeds[rows.index].to(processed.device), "offsets": rows.generated.to(processed.device)}
        greedy = run.sampling["temperature"] == 0  # greedy verification never reads the draft's lines
        lines = None if greedy else proposal.lines
        estimate = self.method == "token" and run.chooser.auto and lines is not None
        if estimate:
            extra["return_accept_probs"] = True
        result = verify(processed, lines, proposal.tokens, num_draft_tokens=proposal.depth_budget.to(processed.device), generator=run.generator,
                        check=False, backend=run.backend, method=self.method, **extra, **run.sampling)
        device = rows.index.device
        tokens, accepted = result.tokens.to(device), result.num_accepted.to(device)
        sums = None
        if estimate:
            # Mean min(1, p/q) over the judged drafts: what adaptive K estimates the acceptance rate from.
            probs = result.accept_probs.to(device, torch.float64)
            seen = ~torch.isnan(probs)
            sums = [torch.where(seen, probs, 0.0).sum()[None], seen.sum()[None].double()]
        positions = torch.arange(tokens.shape[1], device=device)[None, :].expand(tokens.shape[0], -1)
        return Verdict(tokens, accepted, positions, proposal.tokens[:, -1].to(device), estimate=sums)

    @staticmethod
    def commit(target, draft, rows, shape, proposal: Proposal, verdict: Verdict, accepted_host: list[int], keep: list[int]) -> None:
        """Target: the old pending token and drafts 1..a stay live, draft a+1 onwards are holes; the
        draft: drafts 1..a of those it was fed (all but the last); both cropped after the longest kept row."""
        k = shape.max_depth
        accepted = verdict.accepted
        most = max(accepted_host[b] for b in keep)
        uniform = all(accepted_host[b] == most for b in keep)  # then the crops leave no hole in kept rows
        target.keep_prefix(torch.arange(k + 1, device=accepted.device)[None, :] <= accepted[:, None], k - most, all_live=uniform)
        if draft is not None:
            draft.keep_prefix(torch.arange(1, k, device=accepted.device)[None, :] <= accepted[:, None], k - 1 - min(most, k - 1),
                              all_live=len({min(accepted_host[b], k - 1) for b in keep}) == 1)
