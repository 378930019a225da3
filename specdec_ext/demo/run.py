"""``specdec demo``: the embedded pair generating financial text, and every decoding method measured
side by side in the same process."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from .. import measure
from .assets import load_pair
from .corpus import DEMO_PROMPTS


def _encode(tokenizer, prompts):
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    return batch["input_ids"], batch["attention_mask"]


def _sum_runs(runs: list[measure.Run], method: str) -> measure.Run:
    return measure.Run(method, runs[0].batch, sum(r.new_tokens for r in runs), sum(r.seconds for r in runs))


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows, strict=True)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "-" * len(line)]
    out += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(out)


def run_demo(*, quick: bool = False, max_new_tokens: int | None = None, temperature: float = 0.7, num_draft_tokens: int = 4, seed: int = 0,
             repetition_penalty: float | None = None, min_p: float | None = None, stop: list[str] | None = None,
             prompt_lookup: int | None = None) -> dict:
    """Generate, measure and print; returns the measurements as a JSON-ready dict.

    ``repetition_penalty``, ``min_p`` and ``stop`` (stop strings) are applied by every method;
    ``prompt_lookup`` = N also measures prompt-lookup drafting (n-grams up to N) through the hook.
    """
    torch.manual_seed(seed)
    prompts = DEMO_PROMPTS[:1] if quick else DEMO_PROMPTS[:4]
    max_new_tokens = max_new_tokens or (16 if quick else 96)
    sampling = {"temperature": temperature}
    stages = ["load the embedded pair", "sample text", "warm up", "target only", "assisted (transformers)", "generate(assistant_model) + hook",
              "specdec_ext.generate B=1", "batched", "verification latency", "draft/target cost"]
    bar = tqdm(total=len(stages), desc="specdec demo", unit="stage", leave=False)

    def stage(name: str) -> None:
        bar.set_postfix_str(name)

    stage(stages[0])
    target, draft, tokenizer = load_pair()
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    extra = {}
    if repetition_penalty is not None:
        extra["repetition_penalty"] = repetition_penalty
    if min_p is not None:
        extra["min_p"] = min_p
    if stop:
        extra.update(stop_strings=stop, tokenizer=tokenizer)
    common = {"max_new_tokens": max_new_tokens, "sampling": sampling, "eos_ids": eos, "pad_id": pad, "extra": extra}
    speculate = {**common, "num_draft_tokens": num_draft_tokens}
    bar.update()

    stage(stages[1])
    ids, mask = _encode(tokenizer, prompts)
    sample_run = measure.speculative(target, draft, ids, mask, seed=seed, **speculate)
    texts = tokenizer.batch_decode(sample_run.details["sequences"], skip_special_tokens=True)
    bar.update()

    stage(stages[2])
    warm_ids, warm_mask = _encode(tokenizer, prompts[:1])
    warm = {**speculate, "max_new_tokens": 4}
    measure.target_only(target, warm_ids, warm_mask, **{k: v for k, v in warm.items() if k != "num_draft_tokens"})
    measure.assisted(target, draft, warm_ids, warm_mask, mode="loop", **warm)
    measure.speculative(target, draft, warm_ids, warm_mask, **warm)
    bar.update()

    # Methods take turns on each prompt, and the whole round repeats: a busy machine then slows every
    # method alike, and the median round per method is reported.
    rounds = {name: [] for name in ("target", "assisted", "hooked", "specdec") + (("lookup",) if prompt_lookup else ())}
    for round_index in range(1 if quick else 3):
        stage(f"batch-1 methods, round {round_index + 1}")
        single = {name: [] for name in rounds}
        for i, prompt in enumerate(prompts):
            p_ids, p_mask = _encode(tokenizer, [prompt])
            single["target"].append(measure.target_only(target, p_ids, p_mask, seed=seed + i, **common))
            single["assisted"].append(measure.assisted(target, draft, p_ids, p_mask, hooked=False, seed=seed + i, **speculate))
            single["hooked"].append(measure.assisted(target, draft, p_ids, p_mask, mode="loop", seed=seed + i, **speculate))
            single["specdec"].append(measure.speculative(target, draft, p_ids, p_mask, seed=seed + i, **speculate))
            if prompt_lookup:
                single["lookup"].append(measure.assisted(target, None, p_ids, p_mask, mode="loop", seed=seed + i, lookup_ngram=prompt_lookup,
                                                         **speculate))
        for name, runs in single.items():
            rounds[name].append(_sum_runs(runs, name))
    median = {name: sorted(runs, key=lambda r: r.tokens_per_second)[len(runs) // 2] for name, runs in rounds.items()}
    bar.update(4)

    stage(stages[7])
    batch_prompts = prompts * (2 if quick else 4)
    b_ids, b_mask = _encode(tokenizer, batch_prompts)
    batched_target = measure.target_only(target, b_ids, b_mask, seed=seed, **common)
    batched_target.method = f"target only (B={len(batch_prompts)})"
    batched = measure.speculative(target, draft, b_ids, b_mask, seed=seed, **speculate)
    batched_hook = measure.assisted(target, draft, b_ids, b_mask, mode="loop", seed=seed, **speculate)
    batched_hook.method = f"generate(assistant_model) + hook (B={len(batch_prompts)})"
    bar.update()

    stage(stages[8])
    latency = measure.verification_latency(target.config.vocab_size, num_draft_tokens, repeats=10 if quick else 50)
    bar.update()
    stage(stages[9])
    cost = measure.forward_cost_ratio(target, draft, ids[:1], repeats=5 if quick else 20)
    bar.update()
    bar.close()

    labels = {"target": "target only", "assisted": "assisted (transformers)", "hooked": "generate(assistant_model) + hook",
              "specdec": "specdec_ext.generate", "lookup": "prompt lookup + hook"}
    runs = []
    for name, label in labels.items():
        if name in median:
            median[name].method = f"{label} (B=1)"
            runs.append(median[name])
    runs += [batched_target, batched_hook, batched]
    stats = batched.details["stats"]
    baseline = runs[0].tokens_per_second
    predicted = measure.predicted_speedup(stats.mean_acceptance, cost, num_draft_tokens)
    measured = median["hooked"].tokens_per_second / baseline

    print(f"\nGenerated with specdec_ext.generate (embedded pair, temperature {temperature:.2f}, K={num_draft_tokens}):\n")
    for text in texts:
        print("  " + text.replace("\n", "\n  "))
        print()
    rows = [[r.method, r.batch, r.new_tokens, f"{r.seconds:.2f}", f"{r.tokens_per_second:.1f}", f"{r.tokens_per_second / baseline:.2f}x"] for r in runs]
    print(_table(rows, ["method", "batch", "new tokens", "seconds", "tokens/s", "vs target B=1"]))
    print()
    per_position = ", ".join(f"{a:.2f}" for a in stats.acceptance_per_position)
    print(f"acceptance per draft position: {per_position}   mean acceptance a = {stats.mean_acceptance:.3f}")
    print(f"tokens per target forward: {stats.tokens_per_target_forward:.2f}   target forwards {stats.target_forwards}, draft forwards {stats.draft_forwards}")
    print(f"verification of one block (B=1, K={num_draft_tokens}, V={target.config.vocab_size}): transformers {latency['transformers'] * 1e6:.0f} us, "
          f"fused {latency['fused'] * 1e6:.0f} us ({latency['transformers'] / latency['fused']:.1f}x)")
    print(f"draft/target forward cost c = {cost:.3f}; Leviathan et al. predicted speedup (1-a^(K+1))/((1-a)(Kc+1)) = {predicted:.2f}x; "
          f"measured (generate(assistant_model) + hook, B=1 vs target only B=1) = {measured:.2f}x")
    from .tree_rows import print_rows, tree_and_block_rows

    beyond = tree_and_block_rows(target, draft, b_ids, b_mask, max_new_tokens=max_new_tokens, temperature=temperature,
                                 num_draft_tokens=num_draft_tokens, eos_ids=eos, pad_id=pad, seed=seed, rounds=1 if quick else 3)
    print_rows(beyond)
    return {
        "temperature": temperature, "num_draft_tokens": num_draft_tokens, "max_new_tokens": max_new_tokens, "tree_and_block": beyond,
        "runs": [{"method": r.method, "batch": r.batch, "new_tokens": r.new_tokens, "seconds": r.seconds, "tokens_per_second": r.tokens_per_second} for r in runs],
        "acceptance_per_position": stats.acceptance_per_position, "mean_acceptance": stats.mean_acceptance,
        "tokens_per_target_forward": stats.tokens_per_target_forward,
        "verify_seconds": latency, "cost_ratio": cost, "predicted_speedup": predicted, "measured_speedup": measured,
        "texts": texts,
    }
