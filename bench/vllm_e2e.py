"""vLLM end to end, with and without the specdec_ext plugin: throughput, acceptance, and top-p exactness.

For a GPU host with vLLM 0.33.0 and this package installed into the same environment (``pip install
--no-build-isolation .``). It has not been run in this repository's environment (no GPU): nothing in
bench/results/ comes from it.

    python -m bench.vllm_e2e --target Qwen/Qwen3-8B --draft Qwen/Qwen3-0.6B --eagle <an EAGLE-3 head for the target> \
        --num-prompts 256 --max-tokens 256 --temperature 0.8 --top-p 0.95 --out vllm-e2e.json

1. **Serving**: for each speculation method (a draft model, EAGLE, n-gram) the same prompts are generated
   twice in fresh processes, with ``SPECDEC_VLLM`` unset and set to 1: output tokens/s (wall clock of the
   timed ``LLM.generate``, after a warm-up batch), and acceptance from vLLM's own counters
   (``vllm:spec_decode_num_accepted_tokens`` / ``num_draft_tokens``, mean accepted length per draft).
   The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the worker can check that the
   plugin really replaced vLLM's verification when it should (and did not otherwise).
2. **Top-p exactness** on peaked rows (one token holding most of the mass, as in chat decoding): the
   total variation between the exact float64 law and (a) the law vLLM's Model Runner V2 samples from
   (softmax of its ``apply_top_k_top_p`` output: no sampling noise), (b) vLLM's draws (its Gumbel sampler
   on those logits), (c) specdec_ext's draws (``specdec_ext.sample``: the kernels the plugin calls), each
   beside the TV an exact sampler shows with the same number of draws (the noise floor).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from .harness import report as results
from .harness.env import load_average
from .harness.timing import timed

METHODS = ("draft_model", "eagle", "ngram")
KIND = "measurement: vLLM serving with and without the specdec_ext plugin (tokens/s, acceptance), and top-p total variation against the exact law"


def speculative_config(method: str, args) -> dict | None:
    if method == "draft_model":
        return None if args.draft is None else {"method": "draft_model", "model": args.draft, "num_speculative_tokens": args.k}
    if method == "eagle":
        return None if args.eagle is None else {"method": "eagle3" if args.eagle3 else "eagle", "model": args.eagle, "num_speculative_tokens": args.k}
    return {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def prompts(count: int) -> list[str]:
    """Varied prompts with some repetition, so n-gram lookup has something to find."""
    topics = ["the history of the printing press", "how a refrigerator works", "the rules of chess", "photosynthesis",
              "the causes of the French Revolution", "how to bake sourdough bread", "the TCP handshake", "black holes"]
    forms = ["Explain {t} to a child.", "Write a detailed essay about {t}.", "List ten facts about {t}, one per line, "
             "each starting with 'Fact:'.", "Summarise {t}, then summarise your summary."]
    return [forms[i % len(forms)].format(t=topics[(i // len(forms)) % len(topics)]) for i in range(count)]


def serve_once(config: dict) -> dict:
    """One engine, one speculation method, plugin on or off (run in a fresh process by :func:`main`)."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=config["target"], speculative_config=config["speculative"], seed=0, max_model_len=config["max_model_len"],
              gpu_memory_utilization=config["gpu_memory_utilization"])
    from specdec_ext.integrations import vllm as integration

    replaced = integration.installed()
    assert bool(replaced) == config["plugin"], f"plugin state {replaced} does not match SPECDEC_VLLM={int(config['plugin'])}"
    texts = prompts(config["num_prompts"])
    params = [SamplingParams(temperature=config["temperature"], top_p=config["top_p"], top_k=config["top_k"], max_tokens=config["max_tokens"],
                             seed=i, ignore_eos=True) for i in range(len(texts))]
    llm.generate(texts[:8], params[:8], use_tqdm=False)  # warm-up: compilation, CUDA graphs
    before = counters(llm)
    outputs, elapsed = timed(lambda: llm.generate(texts, params, use_tqdm=False), "cpu")  # generate returns when every output is done
    after = counters(llm)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    drafted = after["num_draft_tokens"] - before["num_draft_tokens"]
    accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    drafts = after["num_drafts"] - before["num_drafts"]
    return {
        "method": config["method"], "plugin": config["plugin"], "replaced": replaced, "output_tokens": tokens, "seconds": elapsed,
        "tokens_per_s": tokens / elapsed, "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_per_draft": accepted / drafts if drafts else None,
    }


def counters(llm) -> dict:
    found = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    for metric in llm.get_metrics():
        name = metric.name.removeprefix("vllm:spec_decode_")
        if name in found and hasattr(metric, "value"):
            found[name] += metric.value
    return found


def total_variation_top_p(vocab: int, rows: int, draws: int, top_p: float, temperature: float, seed: int = 0) -> dict:
    """Peaked rows' top-p TV against the exact float64 law (see the module docstring, part 2). CUDA only."""
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample

    import specdec_ext
    from specdec_ext.reference import filter_thresholds

    device = torch.device("cuda")
    g = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(rows, vocab, device=device, generator=g) * 2.0
    logits[:, 0] += 14.0 + 2.0 * torch.rand(rows, device=device, generator=g)  # a peak of ~0.8-0.98 of the mass

    def tv(a, b):
        return 0.5 * (a - b).abs().sum(dim=-1)

    scaled = logits.double() / temperature
    tau = filter_thresholds(scaled, torch.zeros(rows, dtype=torch.int64, device=device), torch.full((rows,), top_p, dtype=torch.float64, device=device))
    exact = torch.softmax(scaled.masked_fill(scaled < tau[:, None], float("-inf")), dim=-1)
    vllm_processed = apply_top_k_top_p((logits / temperature).float(), None, torch.full((rows,), top_p, device=device), has_topp_only_rows=True)
    vllm_law = torch.softmax(vllm_processed.double(), dim=-1)
    result = {"vocab": vocab, "rows": rows, "draws_per_row": draws, "top_p": top_p, "temperature": temperature,
              "vllm_law_tv": tv(vllm_law, exact).tolist()}

    def empirical(tokens):
        return torch.zeros(vocab, dtype=torch.float64, device=device).index_add_(0, tokens, torch.ones_like(tokens, dtype=torch.float64)) / draws

    vllm_tv, ours_tv, floor_tv = [], [], []
    for r in range(rows):
        many = logits[r].expand(draws, vocab)
        states = torch.arange(draws, device=device)
        seeds = torch.randint(0, 2**62, (draws,), device=device, generator=g)
        positions = torch.zeros(draws, dtype=torch.int64, device=device)
        drawn = gumbel_sample(vllm_processed[r].expand(draws, vocab).contiguous(), states, torch.full((draws,), temperature, device=device), seeds,
                              positions, apply_temperature=False, is_drafting=False)
        vllm_tv.append(float(tv(empirical(drawn.long()), exact[r])))
        ours = specdec_ext.sample(many, temperature=temperature, top_p=top_p, seeds=seeds, offsets=positions, check=False)
        ours_tv.append(float(tv(empirical(ours), exact[r])))
        floor_tv.append(float(tv(empirical(torch.multinomial(exact[r].float(), draws, replacement=True, generator=g)), exact[r])))
    result.update(vllm_sampled_tv=vllm_tv, specdec_sampled_tv=ours_tv, exact_sampler_tv=floor_tv)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", help="draft model for method draft_model (skipped without one)")
    parser.add_argument("--eagle", help="EAGLE head for the target (skipped without one)")
    parser.add_argument("--eagle3", action="store_true", help="the EAGLE head is an EAGLE-3 head")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--runner", choices=("v2", "v1"), default="v2", help="Model Runner V2 (vLLM's default) or V1")
    parser.add_argument("--tv-vocab", type=int, default=151936)
    parser.add_argument("--tv-rows", type=int, default=16)
    parser.add_argument("--tv-draws", type=int, default=200_000)
    parser.add_argument("--out", default="vllm-e2e.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print("RESULT" + json.dumps(serve_once(json.loads(args.worker))), flush=True)
        return

    load_start = load_average()
    runs = []
    for method in args.methods:
        speculative = speculative_config(method, args)
        if speculative is None:
            print(f"skipping {method}: no model given")
            continue
        for plugin in (False, True):
            config = {"target": args.target, "speculative": speculative, "method": method, "plugin": plugin, "num_prompts": args.num_prompts,
                      "max_tokens": args.max_tokens, "max_model_len": args.max_model_len, "temperature": args.temperature, "top_p": args.top_p,
                      "top_k": args.top_k, "gpu_memory_utilization": args.gpu_memory_utilization}
            env = {k: v for k, v in os.environ.items() if k != "SPECDEC_VLLM"}
            env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_USE_V2_MODEL_RUNNER="1" if args.runner == "v2" else "0")
            if plugin:
                env["SPECDEC_VLLM"] = "1"
            done = subprocess.run([sys.executable, "-m", "bench.vllm_e2e", "--target", args.target, "--worker", json.dumps(config)],
                                  env=env, capture_output=True, text=True)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
            if done.returncode != 0 or not lines:
                raise SystemExit(f"{method} (plugin={plugin}) failed:\n{done.stderr[-4000:]}")
            runs.append(json.loads(lines[-1][len("RESULT"):]))
            print(json.dumps(runs[-1]))
    top_p_tv = total_variation_top_p(args.tv_vocab, args.tv_rows, args.tv_draws, args.top_p, args.temperature)
    report = {**results.header(KIND, "cuda", load_start), "runner": args.runner, "serving": runs, "top_p_tv": top_p_tv}
    print(f"wrote {results.write_json(report, args.out)}")


if __name__ == "__main__":
    main()
