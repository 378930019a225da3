"""``python -m bench.experiments.identity_rate``: how often two backends give different tokens for the same keys.

The backends evaluate the same float32 formulas but sum normalisers (and top-p masses) in different
orders, so p(x) can differ in the last bit, and a decision whose two sides are that close can go
either way. This counts the rows where that happened, over many random calls:

* rows: random target / draft logits (V = 1000, K = 4; target ``2 * randn``, draft = target +
  ``randn``; float32 and bfloat16 in turn), drafts sampled from the draft, per-row temperature in
  {0, 0.5, 1, 1.3}, top-k in {0, 50} and top-p in {1, 0.9}, per-row seeds and offsets;
* a row differs when its tokens or num_accepted differ between the two backends.

Reports the count and a 95% upper confidence bound on the per-row rate (Clopper-Pearson; 3/n when
nothing differs) and writes ``bench/results/identity-<date>.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from scipy import stats
from tqdm import tqdm

import specdec_ext

from ..harness import report as results
from ..harness.env import load_average

RESULTS_DIR = results.RESULTS_DIR
KIND = "measurement: rows where two backends gave different tokens under the same keys, with a 95% upper bound on the per-row rate"


def random_calls(chunk: int, vocab: int, k: int, seed: int):
    """One batch of random verify arguments (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    dtype = torch.float32 if seed % 2 == 0 else torch.bfloat16
    target = (2 * torch.randn(chunk, k + 1, vocab, generator=g)).to(dtype)
    draft = (target[:, :k].float() + torch.randn(chunk, k, vocab, generator=g)).to(dtype)
    drafts = torch.multinomial(draft.float().softmax(-1).reshape(-1, vocab), 1, generator=g).reshape(chunk, k)
    pick = lambda values: torch.tensor(values)[torch.randint(0, len(values), (chunk,), generator=g)]  # noqa: E731
    params = {"temperature": pick([0.0, 0.5, 1.0, 1.3]), "top_k": pick([0, 50]), "top_p": pick([1.0, 0.9])}
    keys = {"seeds": torch.randint(0, 2**62, (chunk,), generator=g), "offsets": torch.randint(0, 2**40, (chunk,), generator=g)}
    return target, draft, drafts, params, keys


def upper_bound(differing: int, rows: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound on the per-row rate."""
    if differing >= rows:
        return 1.0
    return float(stats.beta.ppf(confidence, differing + 1, rows - differing))


def compare(first: str, second: str, rows: int, chunk: int, vocab: int, k: int) -> dict:
    differing = 0
    examples = []
    done = 0
    calls = range(-(-rows // chunk))
    for call in tqdm(calls, desc=f"{first} vs {second}", unit="call"):
        target, draft, drafts, params, keys = random_calls(chunk, vocab, k, seed=call)
        a = specdec_ext.verify(target, draft, drafts, backend=first, **params, **keys)
        b = specdec_ext.verify(target, draft, drafts, backend=second, **params, **keys)
        differs = (a.tokens != b.tokens).any(dim=1) | (a.num_accepted != b.num_accepted)
        differing += int(differs.sum())
        for row in differs.nonzero()[:, 0].tolist()[: max(0, 5 - len(examples))]:
            examples.append({"call": call, "row": row, first: a.tokens[row].tolist(), second: b.tokens[row].tolist()})
        done += chunk
    return {
        "backends": [first, second], "rows": done, "differing_rows": differing, "rate": differing / done,
        "upper_bound_95": upper_bound(differing, done), "examples": examples,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows compared per backend pair (cpp vs eager)")
    parser.add_argument("--triton-rows", type=int, default=0, help="rows compared for triton (interpreter) vs eager; slow")
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    load_start = load_average()
    found = []
    backends = specdec_ext.available_backends("cpu")
    if "cpp" in backends:
        found.append(compare("cpp", "eager", args.rows, args.chunk, args.vocab, args.k))
    if args.triton_rows and "triton" in backends:
        found.append(compare("triton", "eager", args.triton_rows, min(args.chunk, 256), args.vocab, args.k))
    for r in found:
        print(f"{r['backends'][0]} vs {r['backends'][1]}: {r['differing_rows']} of {r['rows']} rows differ; per-row rate <= {r['upper_bound_95']:.2e} (95%)")
    doc = {**results.header(KIND, "cpu", load_start), "vocab": args.vocab, "k": args.k, "results": found}
    out = results.write_json(doc, args.out or results.result_path(RESULTS_DIR, "identity", doc["date"]))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
