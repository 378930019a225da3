"""End-to-end decoding benchmark, side by side in one process: transformers' target-only decoding,
its assisted generation (batch 1), ``generate(assistant_model=...)`` with the specdec_ext hook (the
batched loop) and ``specdec_ext.generate`` called directly, at each batch size, with plain sampling
and with repetition_penalty 1.1 + min_p 0.05 (every method applies the same processors).

    python -m bench.e2e                 # CPU: the embedded trained pair, batch 1 and 8
    python -m bench.e2e --device cuda   # GPU: random-initialised Llama-3-8B-shaped bf16 target with a
                                        # 1B-shaped draft (acceptance is then whatever two random models
                                        # give, and is reported as measured), plus the embedded pair

Methods take turns inside each of ``--rounds`` rounds (after one warm-up call each) and the median
round is kept, so a machine that gets busier slows every method alike. Writes
bench/results/e2e-<device>-<date>.json and a PNG plot; prints a table. JSON fields: ``rows`` (one per
setting, batch and method: tokens/s, speed-up over target-only at that batch, tokens per target
forward, acceptance (accepted / judged drafts; transformers' assisted generation counted through its
verification function), the Leviathan et al. prediction from the measured acceptance and draft/target
cost for the loop's rows), ``goals`` (the target ratios), ``step_breakdown`` (CPU: where a
step of the loop goes, ms per step, against the forwards the prediction assumes) and the 1-minute
load average at its start and end (the result header, bench/results/README.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specdec_ext import measure

from .harness import report as results
from .harness.env import load_average
from .harness.report import fmt, markdown_table

RESULTS = results.RESULTS_DIR
KIND = "measurement: end-to-end decoding throughput, target-only, transformers assisted, the hook and specdec_ext.generate, side by side"


def _embedded(device: torch.device):
    from specdec_ext.demo.assets import load_pair
    from specdec_ext.demo.corpus import DEMO_PROMPTS

    target, draft, tokenizer = load_pair(device=device)
    return "embedded pair", target, draft, tokenizer, DEMO_PROMPTS


def _llama_shaped(device: torch.device):
    """Random-initialised Llama-3-8B-shaped target and 1B-shaped draft, bf16, built on the GPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def build(hidden, layers, heads, kv_heads, intermediate):
        config = LlamaConfig(vocab_size=128256, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=kv_heads, intermediate_size=intermediate, max_position_embeddings=4096,
                             rope_theta=500000.0, bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False)
        torch.manual_seed(0)
        with torch.device(device):
            torch.set_default_dtype(torch.bfloat16)
            try:
                model = LlamaForCausalLM(config)
            finally:
                torch.set_default_dtype(torch.float32)
        return model.eval()

    target = build(4096, 32, 32, 8, 14336)
    draft = build(2048, 16, 32, 8, 8192)
    return "Llama-3-8B-shaped (random init)", target, draft, None, None


def _prompts(tokenizer, prompts, batch, device, length=32):
    if tokenizer is None:  # random models: random prompt ids, no EOS stops
        ids = torch.randint(1000, 120000, (batch, length), generator=torch.Generator().manual_seed(batch)).to(device)
        return ids, torch.ones_like(ids), [], 0
    tokenizer.padding_side = "left"
    enc = tokenizer([prompts[i % len(prompts)] for i in range(batch)], return_tensors="pt", padding=True)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return enc["input_ids"].to(device), enc["attention_mask"].to(device), eos, tokenizer.pad_token_id


SETTINGS = {
    # name: generate() keywords every method gets (transformers' processors; the loop applies them exactly)
    "plain sampling": {},
    "repetition_penalty 1.1 + min_p 0.05": {"repetition_penalty": 1.1, "min_p": 0.05},
}


DEFAULT_ASSISTED = "assisted (transformers), default arguments"
DEFAULT_HOOK = "generate(assistant_model) + hook, default arguments"


def _median_run(runs: list[measure.Run]) -> measure.Run:
    return sorted(runs, key=lambda r: r.tokens_per_second)[len(runs) // 2]


def run_pair(name, target, draft, tokenizer, prompts, device, *, batches, max_new_tokens, k, temperature, rounds=3) -> list[dict]:
    """Every method on the same prompts; methods take turns inside each round, the median round is kept."""
    sampling = {"temperature": temperature}
    rows = []
    ids1, mask1, eos, pad = _prompts(tokenizer, prompts, 1, device)
    measure.speculative(target, draft, ids1, mask1, max_new_tokens=4, sampling=sampling, num_draft_tokens=k, eos_ids=eos, pad_id=pad)  # warm-up
    cost = measure.forward_cost_ratio(target, draft, ids1, repeats=20)
    for setting, extra in SETTINGS.items():
        for batch in batches:
            ids, mask, eos, pad = _prompts(tokenizer, prompts, batch, device)

            def methods(tokens, ids=ids, mask=mask, eos=eos, pad=pad, extra=extra, batch=batch):
                common = {"max_new_tokens": tokens, "sampling": sampling, "eos_ids": eos, "pad_id": pad, "extra": extra}
                spec = {**common, "num_draft_tokens": k}
                found = {"target only": lambda s: measure.target_only(target, ids, mask, seed=s, **common)}
                if batch == 1:
                    found["assisted (transformers)"] = lambda s: measure.assisted(target, draft, ids, mask, seed=s, mode="transformers", **spec)
                    # The call as users write it: no assistant settings (transformers: 20 drafts cut by its
                    # confidence threshold; the hook: adaptive K).
                    defaults = {**common, "num_draft_tokens": None}
                    found[DEFAULT_ASSISTED] = lambda s: measure.assisted(target, draft, ids, mask, seed=s, mode="transformers", **defaults)
                    found[DEFAULT_HOOK] = lambda s: measure.assisted(target, draft, ids, mask, seed=s, mode="loop", **defaults)
                found["generate(assistant_model) + hook"] = lambda s: measure.assisted(target, draft, ids, mask, seed=s, mode="loop", **spec)
                found["specdec_ext.generate"] = lambda s: measure.speculative(target, draft, ids, mask, seed=s, **spec)
                return found

            for fn in methods(4).values():  # warm-up: one-off costs (first calls, allocator, kernels) stay out of the rounds
                fn(rounds)
            timed = methods(max_new_tokens)
            runs = {method: [] for method in timed}
            for round_index in range(rounds):
                for method, fn in timed.items():
                    runs[method].append(fn(round_index))
            chosen = {method: _median_run(each) for method, each in runs.items()}
            baseline = chosen["target only"].tokens_per_second
            for method, run in chosen.items():
                row = {
                    "pair": name, "setting": setting, "batch": batch, "method": method, "new_tokens": run.new_tokens, "seconds": run.seconds,
                    "tokens_per_second": run.tokens_per_second, "speedup_vs_target": run.tokens_per_second / baseline,
                    "tokens_per_target_forward": run.details.get("tokens_per_target_forward"), "acceptance": run.details.get("acceptance"),
                    "all_tokens_per_second": [r.tokens_per_second for r in runs[method]],
                }
                stats = run.details.get("stats")
                if stats is not None:
                    step_seconds = stats.draft_seconds + stats.target_seconds + stats.verify_seconds
                    # Adaptive K (the default call): predict with the mean K the loop chose.
                    k_used = k if method != DEFAULT_HOOK or not stats.draft_lengths else max(1, round(sum(stats.draft_lengths) / len(stats.draft_lengths)))
                    row.update({
                        "mean_draft_length": sum(stats.draft_lengths) / len(stats.draft_lengths) if stats.draft_lengths else float(k),
                        "acceptance_per_position": stats.acceptance_per_position,
                        "verify_share": stats.verify_seconds / step_seconds if step_seconds else float("nan"),
                        "cost_ratio": cost, "predicted_speedup": measure.predicted_speedup(stats.mean_acceptance, cost, k_used),
                    })
                rows.append(row)
    return rows


def goals(rows: list[dict]) -> dict:
    """The targets, from the embedded pair's rows."""
    def tps(setting, batch, method):
        return next((r["tokens_per_second"] for r in rows if (r["setting"], r["batch"], r["method"]) == (setting, batch, method)), float("nan"))

    out = {}
    for setting in SETTINGS:
        hook1, hook8 = tps(setting, 1, "generate(assistant_model) + hook"), tps(setting, 8, "generate(assistant_model) + hook")
        row = next((r for r in rows if (r["setting"], r["batch"], r["method"]) == (setting, 1, "generate(assistant_model) + hook")), {})
        measured = hook1 / tps(setting, 1, "target only")
        out[setting] = {
            "hook B=1 vs transformers assisted, default call (goal >= 1.3)": tps(setting, 1, DEFAULT_HOOK) / tps(setting, 1, DEFAULT_ASSISTED),
            "hook B=1 vs transformers assisted, both K fixed (goal >= 1.3)": hook1 / tps(setting, 1, "assisted (transformers)"),
            "hook B=8 vs target-only B=8 (goal >= 1.5)": hook8 / tps(setting, 8, "target only"),
            "hook B=1 speed-up vs target-only": measured,
            "predicted (Leviathan, measured a and c)": row.get("predicted_speedup"),
            "measured / predicted (goal >= 0.85)": measured / row["predicted_speedup"] if row.get("predicted_speedup") else float("nan"),
        }
    return out


def add_block_cost_prediction(goal_rows: dict, rows: list[dict], breakdown: dict) -> None:
    """Beside the Leviathan prediction (which prices the target's (K+1)-token forward like a one-token
    forward), the same formula with the measured plain forwards of this machine: expected tokens per
    step x one-token forward / (K draft forwards + one (K+1)-token target forward)."""
    k = breakdown["num_draft_tokens"]
    plain = breakdown["plain_forwards_ms"]
    step_ms = k * plain["draft, 1 token"] + plain[f"target, {k + 1} tokens"]
    for setting, goal in goal_rows.items():
        row = next((r for r in rows if (r["setting"], r["batch"], r["method"]) == (setting, 1, "generate(assistant_model) + hook")), None)
        if row is None or row.get("acceptance") is None:
            continue
        a = min(row["acceptance"], 1 - 1e-9)
        predicted = (1 - a ** (k + 1)) / (1 - a) * plain["target, 1 token"] / step_ms
        goal["predicted with the measured (K+1)-token target forward"] = predicted
        goal["measured / predicted with the measured (K+1)-token target forward"] = goal["hook B=1 speed-up vs target-only"] / predicted


def _plot(rows, path: Path, note: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["pair"], r["setting"], r["batch"]) for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(7, 2.6 * len(groups)), 4.5))
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        values = [next((r["tokens_per_second"] for r in rows if (r["pair"], r["setting"], r["batch"]) == g and r["method"] == method), 0)
                  for g in groups]
        ax.bar([x + i * width for x in range(len(groups))], values, width, label=method)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))], [f"{s}\nB={b}" for _, s, b in groups], fontsize=7)
    ax.set_ylabel("new tokens / s")
    ax.set_title("End-to-end decoding throughput" + (f"\n{note}" if note else ""), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown_tables(report: dict) -> str:
    """The README's tables for a CPU report: throughput per setting and batch, goals, step breakdown."""
    rows = report["rows"]
    methods = ["target only", DEFAULT_ASSISTED, DEFAULT_HOOK, "assisted (transformers)", "generate(assistant_model) + hook", "specdec_ext.generate"]
    k = report.get("num_draft_tokens", 4)
    labels = ["target only", "assisted, defaults", "hook, defaults", f"assisted, K={k}", f"hook, K={k}", f"specdec_ext.generate, K={k}"]
    head = ["setting", "B", *labels, f"hook K={k}: tokens / target forward", "acceptance", "predicted"]
    table = []
    for setting in dict.fromkeys(r["setting"] for r in rows):
        for batch in sorted({r["batch"] for r in rows if r["setting"] == setting}):
            cells, hook = [], None
            for method in methods:
                r = next((r for r in rows if (r["setting"], r["batch"], r["method"]) == (setting, batch, method)), None)
                cells.append("–" if r is None else f"{r['tokens_per_second']:.0f} tok/s ({r['speedup_vs_target']:.2f}×)")
                if method == "generate(assistant_model) + hook":
                    hook = r
            table.append([setting, str(batch), *cells, f"{hook['tokens_per_target_forward']:.2f}", f"{hook['acceptance']:.3f}", f"{hook['predicted_speedup']:.2f}×"])
    out = [markdown_table(head, table), ""]
    if report.get("goals"):
        head = ["setting", "hook B=1 / assisted B=1, default call (goal ≥ 1.3)", "the same, both K = 4", "hook B=8 / target-only B=8 (goal ≥ 1.5)",
                "measured / predicted, K = 4 (goal ≥ 0.85)", "the same, predicted with the measured 5-token target forward"]
        table = []
        for setting, goal in report["goals"].items():
            def get(prefix, goal=goal):
                return next((v for k, v in goal.items() if k.startswith(prefix)), float("nan"))

            table.append([setting, f"{get('hook B=1 vs transformers assisted, default'):.2f}×", f"{get('hook B=1 vs transformers assisted, both'):.2f}×",
                          f"{get('hook B=8'):.2f}×", f"{get('hook B=1 speed-up'):.2f}× / {get('predicted (Leviathan'):.2f}× = {get('measured / predicted (goal'):.2f}",
                          f"{get('hook B=1 speed-up'):.2f}× / {get('predicted with the measured'):.2f}× = {get('measured / predicted with'):.2f}"])
        out += [markdown_table(head, table), ""]
    breakdown = report.get("step_breakdown")
    if breakdown:
        plain = breakdown["plain_forwards_ms"]
        k = breakdown["num_draft_tokens"]
        step = breakdown["ms_per_step"]
        table = [
            [f"draft forwards ({k})", f"{step['draft forwards']:.2f}", f"{k * plain['draft, 1 token']:.2f} ({k} plain single-token forwards)"],
            [f"target forward ({k + 1} tokens)", f"{step['target forward']:.2f}",
             f"{plain['target, 1 token']:.2f} (one single-token forward; a plain {k + 1}-token forward takes {plain[f'target, {k + 1} tokens']:.2f})"],
        ]
        for name in ("draft sampling", "verify (+ processors, EOS, write)", "cache bookkeeping (settle, crop, rows)", "loop Python (sync, tallies, stops)"):
            table.append([name, f"{step.get(name, 0.0):.2f}", "0"])
        table.append(["**step**", f"**{step['step total']:.2f}**", f"**{breakdown['predicted_step_ms']:.2f}**"])
        head = [f"ms per step (B=1, K={breakdown['num_draft_tokens']}, plain sampling)", "as run", "what the prediction assumes"]
        out += [markdown_table(head, table), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="few tokens, batch 1 and 4 only, one round")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--num-draft-tokens", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every method (the median is kept); default 3")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    # CUDA: one round of 64 tokens keeps the GPU suite's end-to-end stage inside its time limit.
    max_new_tokens = args.max_new_tokens or (16 if args.quick else 128 if device.type == "cpu" else 64)
    batches = [1, 4] if args.quick else [1, 8] if device.type == "cpu" else [1, 8, 32]
    rounds = args.rounds or (3 if device.type == "cpu" and not args.quick else 1)
    load_start = load_average()
    pairs = [_embedded(device)]
    if device.type == "cuda" and not args.quick:
        pairs.append(_llama_shaped(device))
    rows, breakdown = [], None
    for name, target, draft, tokenizer, prompts in tqdm(pairs, desc="pairs", leave=False):
        rows += run_pair(name, target, draft, tokenizer, prompts, device, batches=batches, max_new_tokens=max_new_tokens,
                         k=args.num_draft_tokens, temperature=args.temperature, rounds=rounds)
        if breakdown is None and device.type == "cpu":
            ids, mask, _, _ = _prompts(tokenizer, prompts, 1, device)
            breakdown = measure.step_breakdown(target, draft, ids, mask, max_new_tokens=max_new_tokens, num_draft_tokens=args.num_draft_tokens,
                                               sampling={"temperature": args.temperature})
        del target, draft
    if breakdown is not None:
        def ms_per_token(method):
            row = next(r for r in rows if (r["setting"], r["batch"], r["method"]) == ("plain sampling", 1, method))
            return 1000 * row["seconds"] / row["new_tokens"]

        # The baseline's own per-token overhead (transformers' decoding loop around each forward) beside the
        # plain forward the prediction assumes it costs.
        breakdown["target_only_ms_per_token"] = ms_per_token("target only")
        breakdown["hook_ms_per_token"] = ms_per_token("generate(assistant_model) + hook")
    goal_rows = goals(rows) if not args.quick else None
    if breakdown is not None and goal_rows:
        add_block_cost_prediction(goal_rows, rows, breakdown)
    report = {
        **results.header(KIND, device.type, load_start),
        "num_draft_tokens": args.num_draft_tokens, "temperature": args.temperature, "max_new_tokens": max_new_tokens, "rounds": rounds,
        "rows": rows, "goals": goal_rows, "step_breakdown": breakdown,
    }
    path = results.write_json(report, results.result_path(args.out, "e2e", report["date"], device.type))
    load = {moment: (value or [None])[0] for moment, value in report["load_average"].items()}
    threads = f", {report['machine']['torch_threads']} threads" if device.type == "cpu" else ""
    _plot(rows, path.with_suffix(".png"), f"{report['device']}{threads}, K={args.num_draft_tokens}, {max_new_tokens} new tokens, "
                                         f"1-min load average {fmt(load['start'], '.1f')} → {fmt(load['end'], '.1f')}")
    print(f"{'setting':<36} {'B':>2} {'method':<33} {'tok/s':>8} {'vs target':>9} {'tok/fwd':>7} {'accept':>6} {'pred':>6}")
    for r in rows:
        print(f"{r['setting']:<36} {r['batch']:>2} {r['method']:<33} {r['tokens_per_second']:>8.1f} {r['speedup_vs_target']:>8.2f}x "
              f"{fmt(r['tokens_per_target_forward'], '7.2f')} {fmt(r['acceptance'], '6.3f')} {fmt(r.get('predicted_speedup'), '5.2f')}")
    if report["goals"]:
        print(json.dumps(report["goals"], indent=2))
    if breakdown:
        print("ms per step:", json.dumps(breakdown["ms_per_step"], indent=1))
        print("gaps:", json.dumps(breakdown["gaps_ms_per_step"], indent=1))
    if device.type == "cpu" and not args.quick:
        print(markdown_tables(report))
    print(f"load average: {report['load_average']}; wrote {path} and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
