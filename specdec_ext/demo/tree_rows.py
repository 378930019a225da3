"""The demo's "beyond one chain" rows: block verification of the chain and a draft tree, measured in
the same run as the rest of ``specdec demo`` (same prompts, batch and sampling).

The methods take turns, round after round (a busy machine then slows every method alike), and each
row reports its median round; with it, where a step's time goes (the loop's own phase clocks).
"""

from __future__ import annotations

import statistics
import time

import torch

from ..generate import generate
from ..measure import count_new_tokens

#: The tree the demo shows: two children at the root, then two chains (6 nodes per target forward).
DEMO_TREE = (2, 1, 1)
#: Per-step phases reported for each row (SpeculativeStats fields, prefills left out, in milliseconds per step).
PHASES = ("draft", "target", "verify", "commit")


def tree_and_block_rows(target, draft, input_ids, attention_mask, *, max_new_tokens: int, temperature: float, num_draft_tokens: int,
                        eos_ids: list[int], pad_id: int, seed: int = 0, rounds: int = 1) -> list[dict]:
    """Run the chain (token-wise and block verification) and :data:`DEMO_TREE` in ``rounds`` alternating
    rounds; one dict per method (its median round by tokens/s, with the per-step phase times)."""
    methods = (
        (f"chain K={num_draft_tokens}, token-wise", {"num_draft_tokens": num_draft_tokens}),
        (f"chain K={num_draft_tokens}, block verification", {"num_draft_tokens": num_draft_tokens, "method": "block"}),
        (f"tree {DEMO_TREE}, {sum_nodes(DEMO_TREE)} nodes", {"tree": DEMO_TREE}),
    )
    runs: dict[str, list[dict]] = {label: [] for label, _ in methods}
    for round_index in range(rounds):
        order = methods if round_index % 2 == 0 else methods[::-1]
        for label, options in order:
            start = time.perf_counter()
            out = generate(target, draft, input_ids, attention_mask, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                           temperature=temperature if temperature > 0 else 1.0, generator=torch.Generator().manual_seed(seed + round_index),
                           eos_token_id=eos_ids or None, pad_token_id=pad_id, **options)
            seconds = time.perf_counter() - start
            new = count_new_tokens(out.sequences, input_ids.shape[1], eos_ids)
            stats = out.stats
            steps = max(len(stats.draft_lengths), 1)
            phases = {name: 1000 * getattr(stats, f"{name}_seconds") / steps for name in PHASES}
            phases["draft"] -= 1000 * stats.draft_prefill_seconds / steps
            phases["target"] -= 1000 * stats.target_prefill_seconds / steps
            phases["step"] = 1000 * stats.step_seconds / steps
            runs[label].append({"method": label, "batch": input_ids.shape[0], "new_tokens": new, "seconds": seconds,
                                "tokens_per_second": new / seconds, "tokens_per_target_forward": stats.tokens_per_target_forward,
                                "ms_per_step": phases})
    rows = []
    for label, _ in methods:
        ranked = sorted(runs[label], key=lambda run: run["tokens_per_second"])
        row = dict(ranked[len(ranked) // 2])
        row["rounds"] = [run["tokens_per_second"] for run in runs[label]]
        row["ms_per_step"] = {name: statistics.median(run["ms_per_step"][name] for run in runs[label]) for name in (*PHASES, "step")}
        rows.append(row)
    return rows


def sum_nodes(branching) -> int:
    total, width = 0, 1
    for w in branching:
        width *= w
        total += width
    return total


def print_rows(rows: list[dict]) -> None:
    print("\nBeyond one chain (same prompts and batch): block verification and a draft tree")
    header = f"  {'method':<40} {'batch':>5} {'tokens/s':>9} {'tokens per target forward':>26}   ms per step: " + " ".join(f"{n:>7}" for n in (*PHASES, "step"))
    print(header)
    for r in rows:
        phases = " ".join(f"{r['ms_per_step'][n]:>7.1f}" for n in (*PHASES, "step"))
        print(f"  {r['method']:<40} {r['batch']:>5} {r['tokens_per_second']:>9.1f} {r['tokens_per_target_forward']:>26.2f}                {phases}")
