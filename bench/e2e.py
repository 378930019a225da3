"""End-to-end decoding benchmark: target-only, transformers' assisted generation (eager and with the
fused hook) and ``specdec_ext.generate``, side by side in one process.

    python -m bench.e2e                 # CPU: the embedded trained pair, batch 1 and 8
    python -m bench.e2e --device cuda   # GPU: random-initialised Llama-3-8B-shaped bf16 target with a
                                        # 1B-shaped draft (acceptance is then whatever two random models
                                        # give, and is reported as measured), plus the embedded pair

Writes bench/results/e2e-<device>-<date>.json and a PNG plot; prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
from pathlib import Path

import torch

from specdec_ext import measure

RESULTS = Path(__file__).resolve().parent / "results"


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


def run_pair(name, target, draft, tokenizer, prompts, device, *, batches, max_new_tokens, k, temperature) -> list[dict]:
    sampling = {"temperature": temperature}
    cost = None
    rows = []
    for batch in batches:
        ids, mask, eos, pad = _prompts(tokenizer, prompts, batch, device)
        common = {"max_new_tokens": max_new_tokens, "sampling": sampling, "eos_ids": eos, "pad_id": pad}
        spec = {**common, "num_draft_tokens": k}
        if cost is None:
            measure.speculative(target, draft, ids[:1], mask[:1], **{**spec, "max_new_tokens": 4})  # warm-up
            cost = measure.forward_cost_ratio(target, draft, ids[:1])
        runs = [measure.target_only(target, ids, mask, **common)]
        if batch == 1:
            runs.append(measure.assisted(target, draft, ids, mask, hooked=False, **spec))
            runs.append(measure.assisted(target, draft, ids, mask, hooked=True, **spec))
        runs.append(measure.speculative(target, draft, ids, mask, **spec))
        stats = runs[-1].details["stats"]
        step_seconds = stats.draft_seconds + stats.target_seconds + stats.verify_seconds
        baseline = runs[0].tokens_per_second
        for run in runs:
            rows.append({
                "pair": name, "batch": batch, "method": run.method.split(" (")[0], "new_tokens": run.new_tokens, "seconds": run.seconds,
                "tokens_per_second": run.tokens_per_second, "speedup_vs_target": run.tokens_per_second / baseline,
            })
        rows[-1].update({
            "acceptance": stats.mean_acceptance, "acceptance_per_position": stats.acceptance_per_position,
            "tokens_per_target_forward": stats.tokens_per_target_forward,
            "verify_share": stats.verify_seconds / step_seconds if step_seconds else float("nan"),
            "cost_ratio": cost, "predicted_speedup": measure.predicted_speedup(stats.mean_acceptance, cost, k),
        })
    return rows


def _plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["pair"], r["batch"]) for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(groups)), 4))
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        values = [next((r["tokens_per_second"] for r in rows if (r["pair"], r["batch"]) == g and r["method"] == method), 0) for g in groups]
        ax.bar([x + i * width for x in range(len(groups))], values, width, label=method)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))], [f"{p}\nB={b}" for p, b in groups], fontsize=8)
    ax.set_ylabel("new tokens / s")
    ax.set_title("End-to-end decoding throughput")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="few tokens, batch 1 and 4 only")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--num-draft-tokens", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    max_new_tokens = args.max_new_tokens or (16 if args.quick else 64)
    batches = [1, 4] if args.quick else [1, 8] if device.type == "cpu" else [1, 8, 32]
    pairs = [_embedded(device)]
    if device.type == "cuda" and not args.quick:
        pairs.append(_llama_shaped(device))
    rows = []
    for name, target, draft, tokenizer, prompts in pairs:
        rows += run_pair(name, target, draft, tokenizer, prompts, device, batches=batches, max_new_tokens=max_new_tokens,
                         k=args.num_draft_tokens, temperature=args.temperature)
        del target, draft
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu-{platform.machine()}-{torch.get_num_threads()}threads"
    import transformers

    report = {
        "device": device_name, "date": dt.date.today().isoformat(), "torch": torch.__version__, "transformers": transformers.__version__,
        "num_draft_tokens": args.num_draft_tokens, "temperature": args.temperature, "max_new_tokens": max_new_tokens, "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"e2e-{device.type}-{report['date']}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    _plot(rows, out / f"{stem}.png")
    print(f"{'pair':<34} {'B':>3} {'method':<24} {'tok/s':>9} {'vs target':>9} {'accept':>7} {'tok/fwd':>7} {'verify%':>7} {'pred':>6}")
    for r in rows:
        extra = (f"{r['acceptance']:>7.3f} {r['tokens_per_target_forward']:>7.2f} {100 * r['verify_share']:>6.1f}% {r['predicted_speedup']:>5.2f}x"
                 if "acceptance" in r else "")
        print(f"{r['pair']:<34} {r['batch']:>3} {r['method']:<24} {r['tokens_per_second']:>9.1f} {r['speedup_vs_target']:>8.2f}x {extra}")
    print(f"wrote {out / stem}.json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
