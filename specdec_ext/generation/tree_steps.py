"""The step functions of a draft tree.

1. the draft expands a tree level by level: at depth d every node of depth d - 1 gets ``branching[d-1]``
   children, drawn from the draft's processed law at that node (i.i.d. or without replacement) or
   its top tokens for greedy decoding; each level is one draft forward over all its nodes, with a 4-D
   tree attention mask (a node sees the committed sequence and its own ancestors) and per-node
   position ids (committed length + depth);
2. the target scores the pending token and every node in ONE forward with the same kind of mask;
3. :func:`specdec_ext.verify_tree` picks a path and emits one more token;
4. in both KV caches only the accepted path's entries stay (:meth:`ModelCache.keep_segment`).

Exactness holds as for chains: the children of a context are drawn from exactly the law q that
verification is given (the same lines, processed alike), so the emitted tokens follow the target's
processed law whatever the tree. The logits processors a tree takes are those that read only the
line itself (a node's prefix is its own path, which per-prefix processors are not given).
"""

from __future__ import annotations

import torch

from ..api import verify_tree
from . import draws
from .steps import Proposal, Verdict


class TreeSteps:
    """Expand, score, verify and commit for a draft tree."""

    tree_masks = True
    method = "token"

    def draft(self, run, draft, rows, shape, depth_budget: torch.Tensor) -> Proposal:
        """Draft a tree per row: tokens (b, N) and the draft lines (b, N+1, V) at every context (zeros at leaves)."""
        batch = rows.pending.shape[0]
        device = rows.pending.device
        draft.begin_segment()
        unfed = rows.unfed  # (b, U) committed tokens the draft has not seen, -1 = none (left padding)
        width = unfed.shape[1]
        live = unfed >= 0
        positions = rows.length[:, None] - width + torch.arange(width, device=device)[None, :]
        causal = torch.tril(torch.ones(width, width, dtype=torch.bool, device=device))[None].expand(batch, -1, -1)
        first = draft.forward(unfed, positions.clamp(min=0), live, within=causal, logits_to_keep=1)[:, -1].to(device)
        context_lines = [self._processed(run, first[:, None])[:, 0]]
        tokens = torch.zeros(batch, shape.num_nodes, dtype=torch.long, device=device)
        ancestors = shape.ancestors().to(device)
        for depth, (start, end) in enumerate(shape.levels, start=1):
            above = (0, 1) if depth == 1 else (1 + shape.levels[depth - 2][0], 1 + shape.levels[depth - 2][1])  # contexts of the parents
            parents_lines = torch.stack(context_lines[above[0]: above[1]], 1)
            children = draws.draw_children(parents_lines.reshape(-1, parents_lines.shape[-1]), shape.branching[depth - 1], run)
            tokens[:, start:end] = children.reshape(batch, end - start)
            if depth < shape.max_depth:  # the deepest level's own laws are never needed
                seen = torch.cat([live[:, None, :].expand(-1, end - start, -1), ancestors[None, start:end, :end].expand(batch, -1, -1)], 2)
                node_positions = rows.length[:, None] - 1 + depth
                logits = draft.forward(tokens[:, start:end], node_positions.expand(-1, end - start),
                                       torch.ones(batch, end - start, dtype=torch.bool), within=seen)
                context_lines.extend(self._processed(run, logits.to(device)).unbind(1))
        vocab = context_lines[0].shape[-1]
        missing = shape.num_nodes + 1 - len(context_lines)
        leaves = [torch.zeros(batch, vocab, dtype=context_lines[0].dtype, device=device)] * missing
        return Proposal(tokens, torch.stack(context_lines + leaves, 1), depth_budget)

    @staticmethod
    def _processed(run, lines: torch.Tensor) -> torch.Tensor:
        """(b, P, Vd) draft lines -> the lines children are drawn from (the per-line logits processors applied)."""
        if run.pipeline.empty:
            return lines
        return run.pipeline.apply(draws.pad_vocab(lines, run.vocab), None, 0)

    @staticmethod
    def score(run, target, rows, shape, proposal: Proposal) -> torch.Tensor:
        """One target forward over the pending token and every node: (b, N+1, V) logits at each context."""
        tokens = proposal.tokens
        batch = tokens.shape[0]
        device = tokens.device
        target.begin_segment()
        nodes = shape.num_nodes
        seen = torch.zeros(batch, nodes + 1, nodes + 1, dtype=torch.bool, device=device)
        seen[:, :, 0] = True  # everyone sees the pending token
        seen[:, 1:, 1:] = shape.ancestors().to(device)[None]
        depth = torch.tensor((0,) + shape.depths, device=device)
        positions = rows.length[:, None] - 1 + depth[None, :]
        block = torch.cat([rows.pending[:, None], tokens], 1)
        return target.forward(block, positions, torch.ones(batch, nodes + 1, dtype=torch.bool), within=seen).to(device)

    @staticmethod
    def verify(run, rows, shape, proposal: Proposal, target_logits: torch.Tensor) -> Verdict:
        processed = target_logits if run.pipeline.empty else run.pipeline.apply(target_logits, None, 0)
        run.processed = processed
        tokens = proposal.tokens
        device = tokens.device
        batch = tokens.shape[0]
        parents = torch.tensor(shape.parents, device=device).expand(batch, -1)
        nodes_within = torch.tensor([shape.nodes_within(d) for d in range(shape.max_depth + 1)], device=device)
        greedy = run.sampling["temperature"] == 0  # greedy verification never reads the draft's lines
        result = verify_tree(processed, None if greedy else proposal.lines, tokens, parents, num_nodes=nodes_within[proposal.depth_budget],
                             siblings=run.siblings, generator=run.generator, check=False, backend=run.backend, **run.sampling)
        # The outputs are N + 1 and N wide; no path through this tree is deeper than its levels.
        depth = shape.max_depth
        accepted, path = result.num_accepted.to(device), result.accepted_nodes[:, :depth].to(device)
        emitted = result.tokens[:, : depth + 1].to(device)
        contexts = torch.cat([torch.zeros_like(path[:, :1]), (path + 1).clamp(min=0)], 1)
        last_draft = tokens.gather(1, path.gather(1, (accepted - 1).clamp(min=0)[:, None]).clamp(min=0))[:, 0]
        return Verdict(emitted, accepted, contexts, last_draft, path=path)

    @staticmethod
    def commit(target, draft, rows, shape, proposal: Proposal, verdict: Verdict, accepted_host: list[int], keep: list[int]) -> None:
        """Keep only the accepted path in both caches. Widths come from the host counts of every row."""
        device = verdict.accepted.device
        batch = verdict.path.shape[0]
        on_path = (verdict.path[:, :, None] == torch.arange(shape.num_nodes, device=device)[None, None, :]).any(1)  # (b, N)
        # Target segment: the pending token, then every node.
        target.keep_segment(torch.cat([torch.ones(batch, 1, dtype=torch.bool, device=device), on_path], 1), 1 + max(accepted_host))
        # Draft segment: the unfed tokens, then the nodes it was fed (all levels but the deepest).
        fed = shape.levels[-2][1] if shape.max_depth > 1 else 0
        width = max(u + min(a, shape.max_depth - 1) for u, a in zip(rows.unfed_host, accepted_host, strict=True))
        draft.keep_segment(torch.cat([rows.unfed >= 0, on_path[:, :fed]], 1), width)
