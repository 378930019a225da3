"""Trees and block verification end to end: tokens per target forward and tokens/s, side by side.

For each setting (a draft and a temperature) and each number N of draft tokens scored per target
forward, one process runs on the same prompts: target-only decoding, the chain with token-wise
verification (``generate``, K = N), the chain with block verification (``method="block"``, K = N)
and every tree of N nodes wider than a chain (children per node at each depth, e.g. (2, 1, 1) = 6
nodes, (4,) = 4 siblings) with siblings drawn without replacement; the best tree per N is marked.
Drafts: ``trained`` (the distilled draft shipped with the pair) and ``early-exit`` (the target's
first decoder layer with its norm and head, never trained to draft: the harder setting, where a
node's siblings have a real chance to succeed where the first child failed).

    python -m bench.e2e_tree                          # CPU: trained@1, trained@2, early-exit@1, early-exit@1.5
    python -m bench.e2e_tree --settings trained@1.5 early-exit@2 --nodes 4 6 8 --batch 16 --max-new-tokens 96
    python -m bench.e2e_tree --quick                  # a smoke run

Writes bench/results/e2e-tree-<device>-<date>.json and .png and prints a table. Timings taken on a
shared machine are noisy: the JSON records the load average at the start and the end of the run.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import torch

from specdec_ext.generate import generate
from specdec_ext.generation.shapes import candidate_trees
from specdec_ext.measure import count_new_tokens

from .harness import report as results
from .harness.env import load_average
from .harness.timing import timed

RESULTS = results.RESULTS_DIR
KIND = "measurement: chains (token-wise, block) and trees end to end, tokens per target forward and tokens/s, with exact expected acceptance on the same blocks"
#: DRAFT@TEMPERATURE: the distilled draft at 1 and 2, and a weak draft (harder setting) at 1 and 1.5
DEFAULT_SETTINGS = ("trained@1", "trained@2", "early-exit@1", "early-exit@1.5")


def trees_with(nodes: int) -> list[tuple[int, ...]]:
    """Branchings of exactly ``nodes`` nodes that are wider than a chain somewhere (stars included)."""
    found = []
    for tree in candidate_trees(max_nodes=nodes):
        if tree.num_nodes == nodes and any(w > 1 for w in tree.branching):
            found.append(tree.branching)
    return found


def _load(device: torch.device):
    from specdec_ext.demo.assets import early_exit_draft, load_pair
    from specdec_ext.demo.corpus import DEMO_PROMPTS

    target, draft, tokenizer = load_pair(device=device)
    drafts = {"trained": draft, "early-exit": early_exit_draft(target, 1)}
    return target, drafts, tokenizer, DEMO_PROMPTS


DRAFTS = {
    "trained": "the distilled one-layer draft shipped with the pair",
    "early-exit": "the target's first decoder layer with its norm and head (no training: a weak draft)",
}


def parse_setting(text: str) -> tuple[str, float]:
    """"trained@1.5" -> ("trained", 1.5)."""
    name, _, temperature = text.partition("@")
    if name not in DRAFTS or not temperature:
        raise argparse.ArgumentTypeError(f"a setting is DRAFT@TEMPERATURE with DRAFT one of {list(DRAFTS)}, got {text!r}")
    return name, float(temperature)


def run(target, draft, ids, mask, eos, pad, *, temperature: float, nodes: list[int], max_new_tokens: int, seed: int, device,
        draft_name: str = "trained") -> list[dict]:
    common = {"max_new_tokens": max_new_tokens, "temperature": temperature, "eos_token_id": eos, "pad_token_id": pad}
    rows = []

    def record(method: str, n: int, tree, fn):
        out, seconds = timed(fn, device)
        new = count_new_tokens(out.sequences, ids.shape[1], eos)
        stats = getattr(out, "stats", None)
        row = {"draft": draft_name, "temperature": temperature, "nodes": n, "method": method, "tree": list(tree) if tree else None, "new_tokens": new,
               "seconds": seconds, "tokens_per_second": new / seconds}
        if stats is not None:
            row.update(tokens_per_target_forward=stats.tokens_per_target_forward, tokens_per_target_forward_stderr=stats.tokens_per_target_forward_stderr,
                       acceptance=stats.mean_acceptance,
                       acceptance_per_depth=stats.acceptance_per_position, target_forwards=stats.target_forwards,
                       draft_forwards=stats.draft_forwards, draft_seconds=stats.draft_seconds, target_seconds=stats.target_seconds,
                       verify_seconds=stats.verify_seconds)
            if method == "tree-auto":  # the shapes it chose
                row["trees_chosen"] = [[list(t), c] for t, c in collections.Counter(tuple(t) for t in stats.trees).most_common()]
                row["mean_nodes"] = sum(stats.draft_lengths) / len(stats.draft_lengths)
        rows.append(row)
        shown = f"{row.get('tokens_per_target_forward', float('nan')):6.3f}"
        print(f"{draft_name:<10} T={temperature:<4} N={n:<2} {method:<12} {str(tuple(tree) if tree else ''):<14} tok/fwd {shown}  tok/s {row['tokens_per_second']:8.1f}", flush=True)

    def generator():
        return torch.Generator().manual_seed(seed)

    def target_only():
        from transformers import GenerationConfig

        config = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                                  eos_token_id=eos, pad_token_id=pad)
        torch.manual_seed(seed)
        return target.generate(ids, attention_mask=mask, generation_config=config)

    class _Plain:  # target-only output in the same shape as ours
        def __init__(self, sequences):
            self.sequences = sequences

    record("target only", 0, None, lambda: _Plain(target_only()))
    for n in nodes:
        record("chain-token", n, (1,) * n, lambda n=n: generate(target, draft, ids, mask, num_draft_tokens=n, generator=generator(), **common))
        record("chain-block", n, (1,) * n, lambda n=n: generate(target, draft, ids, mask, num_draft_tokens=n, method="block", generator=generator(), **common))
        for tree in trees_with(n):
            record("tree", n, tree, lambda tree=tree: generate(target, draft, ids, mask, tree=tree, generator=generator(), **common))
        best = max((r for r in rows if r["method"] == "tree" and r["nodes"] == n),
                   key=lambda r: r["tokens_per_target_forward"], default=None)
        if best is not None:
            best["best_tree"] = True
    # tree="auto": a shape per step from the running acceptance and the measured costs (up to
    # specdec_ext.generation.shapes.AUTO_MAX_NODES nodes), chains included.
    record("tree-auto", 0, None, lambda: generate(target, draft, ids, mask, tree="auto", generator=generator(), **common))
    return rows


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(1) - 1).clamp(min=0)


def sibling_acceptance(target, draft, ids, mask, temperature: float, *, new_tokens: int = 24, seed: int = 0) -> dict:
    """Exact one-context acceptance figures on contexts the target itself samples at ``temperature``:
    the chance to enter a child with 1, 2 and 3 i.i.d. sampled children and 2 drawn without
    replacement (recursive rejection sampling, computed from p and q, no sampling noise), and the
    target mass on the draft's top 1 / 2 / 4 tokens (deterministic siblings enter with that chance)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        out = target.generate(ids, attention_mask=mask, do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                              pad_token_id=0, eos_token_id=None)
        full_mask = torch.cat([mask, torch.ones_like(out[:, ids.shape[1]:])], 1)
        start = ids.shape[1] - 1
        p = (target(out, attention_mask=full_mask, position_ids=_positions(full_mask)).logits[:, start:-1].float() / temperature).softmax(-1).reshape(-1, target.config.vocab_size).double()
        q_logits = draft(out, attention_mask=full_mask, position_ids=_positions(full_mask)).logits[:, start:-1].float() / temperature
        q = torch.zeros_like(p)
        q[:, : q_logits.shape[-1]] = q_logits.softmax(-1).reshape(p.shape[0], -1).double()

    def next_residual(r, proposal):
        res = (r - proposal).clamp(min=0)
        return res / res.sum(-1, keepdim=True).clamp(min=1e-300)

    one = torch.minimum(p, q).sum(-1)
    r1 = next_residual(p, q)
    two = one + (1 - one) * torch.minimum(q, r1).sum(-1)
    three = two + (1 - two) * torch.minimum(q, next_residual(r1, q)).sum(-1)
    # Two children without replacement: average over the rejected first child x1 (its weight q(x1)(1 - min(1, p/q)) / (1 - one)).
    rejected = q * (1 - torch.clamp(p / q.clamp(min=1e-300), max=1.0))
    wor = []
    for i in range(p.shape[0]):
        x1 = rejected[i].nonzero()[:, 0]
        if x1.numel() == 0:
            wor.append(one[i])
            continue
        q_without = q[i].expand(x1.numel(), -1).clone()
        q_without[torch.arange(x1.numel()), x1] = 0
        q_without /= q_without.sum(-1, keepdim=True).clamp(min=1e-300)
        second = torch.minimum(q_without, r1[i]).sum(-1)
        wor.append(one[i] + (rejected[i, x1] * second).sum())
    wor = torch.stack(wor)
    top = q.topk(4, dim=-1).indices
    return {
        "temperature": temperature, "contexts": p.shape[0],
        "enter_one_child": one.mean().item(), "enter_two_iid": two.mean().item(), "enter_three_iid": three.mean().item(),
        "enter_two_without_replacement": wor.mean().item(),
        "target_mass_on_draft_top": {str(w): p.gather(1, top[:, :w]).sum(-1).mean().item() for w in (1, 2, 4)},
    }


def block_gain(target, draft, ids, mask, temperature: float, lengths: list[int], *, new_tokens: int = 24, seed: int = 0) -> list[dict]:
    """Expected accepted drafts per block of token-wise and block verification on the SAME drafted
    blocks, exactly given each block (no coin noise): contexts sampled by the target at
    ``temperature``, a chain of K drafts sampled by the draft after each, and from the two models'
    laws along it, E[accepted | drafts] = sum_k prod_{i<=k} min(1, p_i / q_i) (token-wise) and
    sum_i i h_i prod_{j>i} (1 - h_j) (block; h_i the stop probabilities of Sun et al.)."""
    torch.manual_seed(seed)
    longest = max(lengths)
    with torch.no_grad():
        out = target.generate(ids, attention_mask=mask, do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                              pad_token_id=0, eos_token_id=None)
        generator = torch.Generator().manual_seed(seed)
        xs, ps, qs = [], [], []
        for j in range(new_tokens):  # contexts of one length at a time: the prompt plus j sampled tokens
            current = out[:, : ids.shape[1] + j]
            current_mask = torch.cat([mask, torch.ones_like(out[:, ids.shape[1] : ids.shape[1] + j])], 1)
            drafts, q_rows = [], []
            for _ in range(longest):
                q = (draft(current, attention_mask=current_mask, position_ids=_positions(current_mask)).logits[:, -1].float() / temperature).softmax(-1).double()
                token = torch.multinomial(q, 1, generator=generator)
                drafts.append(token[:, 0])
                q_rows.append(q)
                current = torch.cat([current, token], 1)
                current_mask = torch.cat([current_mask, torch.ones_like(token)], 1)
            ps.append((target(current, attention_mask=current_mask, position_ids=_positions(current_mask)).logits[:, -longest - 1 :].float() / temperature).softmax(-1).double())
            xs.append(torch.stack(drafts, 1))
            qs.append(torch.stack(q_rows, 1))
    x, p_all, q_all = torch.cat(xs), torch.cat(ps), torch.cat(qs)  # (R, K), (R, K+1, V), (R, K, Vd)
    vocab = p_all.shape[-1]
    if q_all.shape[-1] < vocab:
        q_all = torch.nn.functional.pad(q_all, (0, vocab - q_all.shape[-1]))
    p_x = p_all[:, :-1].gather(2, x[..., None])[..., 0]
    q_x = q_all.gather(2, x[..., None])[..., 0]
    results = []
    for k in lengths:
        ratio = torch.clamp(p_x[:, :k] / q_x[:, :k], max=1.0)
        token_expected = torch.cumprod(ratio, 1).sum(1)
        carried = torch.ones(x.shape[0], k + 1, dtype=torch.float64)
        for i in range(1, k + 1):
            carried[:, i] = torch.clamp(carried[:, i - 1] * p_x[:, i - 1] / q_x[:, i - 1], max=1.0)
        stop = torch.zeros(x.shape[0], k + 1, dtype=torch.float64)
        for i in range(1, k):
            mass = (carried[:, i, None] * p_all[:, i] - q_all[:, i]).clamp(min=0).sum(-1)
            stop[:, i] = torch.where(mass > 0, mass / (mass + 1 - carried[:, i]), torch.zeros_like(mass))
        stop[:, k] = carried[:, k]
        block_expected = torch.zeros(x.shape[0], dtype=torch.float64)
        for i in range(1, k + 1):
            block_expected += i * stop[:, i] * torch.prod(1 - stop[:, i + 1 :], dim=1)
        difference = block_expected - token_expected
        results.append({
            "temperature": temperature, "num_draft_tokens": k, "blocks": x.shape[0],
            "token_expected_accepted": token_expected.mean().item(), "block_expected_accepted": block_expected.mean().item(),
            "difference": difference.mean().item(), "difference_standard_error": (difference.std() / difference.numel() ** 0.5).item(),
        })
    return results


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    settings = list(dict.fromkeys((r.get("draft", "trained"), r["temperature"]) for r in rows))
    fig, axes = plt.subplots(2, len(settings), figsize=(4.5 * len(settings), 6.5), squeeze=False)
    methods = [("chain-token", "chain, token-wise"), ("chain-block", "chain, block"), ("tree", "best tree")]
    for column, (draft, temperature) in enumerate(settings):
        here = [r for r in rows if (r.get("draft", "trained"), r["temperature"]) == (draft, temperature)]
        nodes = sorted({r["nodes"] for r in here if r["nodes"]})
        baseline = next((r["tokens_per_second"] for r in here if r["method"] == "target only"), None)
        for line, (metric, label) in enumerate((("tokens_per_target_forward", "tokens / target forward"), ("tokens_per_second", "new tokens / s"))):
            ax = axes[line][column]
            width = 0.8 / len(methods)
            for i, (method, name) in enumerate(methods):
                values = []
                for n in nodes:
                    pick = [r for r in here if r["nodes"] == n and r["method"] == method and (method != "tree" or r.get("best_tree"))]
                    values.append(pick[0][metric] if pick else 0)
                ax.bar([x + i * width for x in range(len(nodes))], values, width, label=name)
            if metric == "tokens_per_second" and baseline:
                ax.axhline(baseline, color="gray", linestyle="--", linewidth=1, label="target only")
            ax.set_xticks([x + 0.4 - width / 2 for x in range(len(nodes))], [f"N={n}" for n in nodes])
            ax.set_ylabel(label)
            ax.set_title(f"{draft} draft, temperature {temperature}", fontsize=9)
            if line == 0 and column == 0:
                ax.legend(fontsize=7)
            if line == 1 and column == 0:
                ax.legend(fontsize=7)
    fig.suptitle(f"Embedded pair, batch {report['batch']}, {report['max_new_tokens']} new tokens ({report['device']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--settings", type=parse_setting, nargs="+", default=[parse_setting(x) for x in DEFAULT_SETTINGS],
                        help="DRAFT@TEMPERATURE pairs; DRAFT: " + ", ".join(f"{k} ({v})" for k, v in DRAFTS.items()))
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 6, 8])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    parser.add_argument("--no-cpp", action="store_true", help="verify chains on the eager backend, as on a machine without the C++ kernel")
    parser.add_argument("--quick", action="store_true", help="batch 2, 12 tokens, N = 4 only")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.max_new_tokens, args.nodes, args.settings = 2, 12, [4], args.settings[:1]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.no_cpp:
        from specdec_ext import _cpp_backend

        _cpp_backend._C = None  # (trees and blocks too: one extension)
    device = torch.device(args.device)
    target, drafts, tokenizer, prompts = _load(device)
    tokenizer.padding_side = "left"
    enc = tokenizer([prompts[i % len(prompts)] for i in range(args.batch)], return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    load_start = load_average()
    with torch.no_grad():
        generate(target, drafts["trained"], ids[:1], mask[:1], max_new_tokens=4, tree=(2, 1), eos_token_id=eos)  # warm-up
        rows, siblings, gains = [], [], []
        for name, t in args.settings:
            rows += run(target, drafts[name], ids, mask, eos, tokenizer.pad_token_id, temperature=t, nodes=args.nodes,
                        max_new_tokens=args.max_new_tokens, seed=args.seed, device=device, draft_name=name)
        for name, t in args.settings:
            siblings.append({"draft": name, **sibling_acceptance(target, drafts[name], ids[:8], mask[:8], t, seed=args.seed)})
            gains += [{"draft": name, **g} for g in block_gain(target, drafts[name], ids[:8], mask[:8], t, args.nodes, seed=args.seed)]
    report = {
        **results.header(KIND, device.type, load_start),
        "batch": args.batch, "max_new_tokens": args.max_new_tokens, "seed": args.seed, "no_cpp": args.no_cpp, "drafts": DRAFTS, "rows": rows,
        "summary": summarise(rows), "sibling_acceptance": siblings, "block_vs_token_same_drafts": gains,
    }
    path = results.write_json(report, results.result_path(args.out, "e2e-tree", report["date"], device.type))
    _plot(report, path.with_suffix(".png"))
    for line in report["summary"]:
        print(line)
    for g in gains:
        print(f"{g['draft']} T={g['temperature']} K={g['num_draft_tokens']}: expected accepted drafts on the same {g['blocks']} blocks: token-wise "
              f"{g['token_expected_accepted']:.4f}, block {g['block_expected_accepted']:.4f} (+{g['difference']:.4f} +- {g['difference_standard_error']:.4f})")
    for row in siblings:
        print(f"{row['draft']} T={row['temperature']}: enter a child with 1 / 2 / 3 i.i.d. children {row['enter_one_child']:.3f} / {row['enter_two_iid']:.3f} / "
              f"{row['enter_three_iid']:.3f}, 2 without replacement {row['enter_two_without_replacement']:.3f}; target mass on the draft's top "
              + " / ".join(f"{w}: {m:.3f}" for w, m in row["target_mass_on_draft_top"].items()))
    print(f"wrote {path} and .png")
    return 0


def _ratio(row: dict, baseline: dict) -> str:
    """tokens per forward of ``row`` over ``baseline``, with its standard error (independent runs)."""
    a, b = row["tokens_per_target_forward"], baseline["tokens_per_target_forward"]
    sa, sb = row.get("tokens_per_target_forward_stderr", float("nan")), baseline.get("tokens_per_target_forward_stderr", float("nan"))
    ratio = a / b
    return f"{ratio:.3f}x +- {ratio * ((sa / a) ** 2 + (sb / b) ** 2) ** 0.5:.3f}"


def summarise(rows: list[dict]) -> list[str]:
    """One line per (temperature, N): block / token and best tree / chain in tokens per forward and tokens/s."""
    lines = []
    for draft, temperature in dict.fromkeys((r.get("draft", "trained"), r["temperature"]) for r in rows):
        here = [r for r in rows if (r.get("draft", "trained"), r["temperature"]) == (draft, temperature)]
        for n in sorted({r["nodes"] for r in here if r["nodes"]}):
            pick = {r["method"]: r for r in here if r["nodes"] == n and (r["method"] != "tree" or r.get("best_tree"))}
            token, block, tree = pick.get("chain-token"), pick.get("chain-block"), pick.get("tree")
            if not token:
                continue
            parts = [f"{draft} draft T={temperature} N={n}: chain {token['tokens_per_target_forward']:.2f} tok/fwd"]
            if block:
                parts.append(f"block/token {_ratio(block, token)} tok/fwd, "
                             f"{block['tokens_per_second'] / token['tokens_per_second']:.2f}x tok/s")
            if tree:
                parts.append(f"best tree {tuple(tree['tree'])} / chain {_ratio(tree, token)} tok/fwd, "
                             f"{tree['tokens_per_second'] / token['tokens_per_second']:.2f}x tok/s")
            lines.append("; ".join(parts))
        auto = next((r for r in here if r["method"] == "tree-auto"), None)
        if auto is not None:
            shapes = ", ".join(f"{tuple(t)} x{c}" for t, c in auto.get("trees_chosen", [])[:3])
            lines.append(f"{draft} draft T={temperature} tree='auto': {auto['tokens_per_target_forward']:.2f} tok/fwd, {auto['tokens_per_second']:.0f} tok/s, "
                         f"{auto.get('mean_nodes', float('nan')):.1f} nodes per step; chose {shapes}")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
