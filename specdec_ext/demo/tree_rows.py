"""The demo's "beyond one chain" rows: block verification of the chain and a draft tree, measured in
the same run as the rest of ``specdec demo`` (same prompts, batch and sampling)."""

from __future__ import annotations

import time

import torch

from ..generate import generate
from ..measure import count_new_tokens

#: The tree the demo shows: two children at the root, then two chains (6 nodes per target forward).
DEMO_TREE = (2, 1, 1)


def tree_and_block_rows(target, draft, input_ids, attention_mask, *, max_new_tokens: int, temperature: float, num_draft_tokens: int,
                        eos_ids: list[int], pad_id: int, seed: int = 0) -> list[dict]:
    """Run the chain (token-wise and block verification) and :data:`DEMO_TREE`; one dict per method."""
    rows = []
    methods = (
        (f"chain K={num_draft_tokens}, token-wise", {"num_draft_tokens": num_draft_tokens}),
        (f"chain K={num_draft_tokens}, block verification", {"num_draft_tokens": num_draft_tokens, "method": "block"}),
        (f"tree {DEMO_TREE}, {sum_nodes(DEMO_TREE)} nodes", {"tree": DEMO_TREE}),
    )
    for label, options in methods:
        start = time.perf_counter()
        out = generate(target, draft, input_ids, attention_mask, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                       temperature=temperature if temperature > 0 else 1.0, generator=torch.Generator().manual_seed(seed),
                       eos_token_id=eos_ids or None, pad_token_id=pad_id, **options)
        seconds = time.perf_counter() - start
        new = count_new_tokens(out.sequences, input_ids.shape[1], eos_ids)
        rows.append({"method": label, "batch": input_ids.shape[0], "new_tokens": new, "seconds": seconds, "tokens_per_second": new / seconds,
                     "tokens_per_target_forward": out.stats.tokens_per_target_forward})
    return rows


def sum_nodes(branching) -> int:
    total, width = 0, 1
    for w in branching:
        width *= w
        total += width
    return total


def print_rows(rows: list[dict]) -> None:
    print("\nBeyond one chain (same prompts and batch): block verification and a draft tree")
    header = f"  {'method':<40} {'batch':>5} {'tokens/s':>9} {'tokens per target forward':>26}"
    print(header)
    for r in rows:
        print(f"  {r['method']:<40} {r['batch']:>5} {r['tokens_per_second']:>9.1f} {r['tokens_per_target_forward']:>26.2f}")
