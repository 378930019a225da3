"""``python -m bench.experiments.sampled_start``: would a sample of a line place the whole-line search's first gather?

Triton 3.6 and 3.7 lower ``tl.histogram`` to warp ballots (``histogram_lowering``), so each pass of
the whole-line search that bins a line is bound by its instructions, not by the read: a top-k 1000
or flat top-p 0.99 call at B=64 takes 15-17x the unfiltered one there (GPU model, ESTIMATE). A
gather pass (select.py's stages 4 and 5: compare each key with a bracket, write the few inside to
slots) costs a few instructions a value. This asks, on LM logits, whether a fixed sample of the
line, read by the threshold item, places a first gather that holds the cut, so that such a line
needs one gather pass instead of its binned passes.

The rules (what a kernel would do; order keys as select.py's, their high 16 bits a "prefix"):

- **Sample**: RUNS runs of 256 consecutive ids, evenly spaced over the line (the whole line when it
  is no longer than the sample). Runs, not single ids: a 32-byte sector holds 16 bf16 values.
- **Top-k** (2k <= GATHER): the sample's r-th largest key, r = ceil(isqrt(k * GATHER) * S / V) (the
  geometric middle of [k, GATHER], scaled to the sample; r = k when the sample is the line), floored
  to its prefix, is the gather's lo (``bench.gpu_model.sampled_top_k_lo``, thresholds.py's rule,
  which the Triton kernels take on Triton 3.6 and 3.7). It holds the cut when
  k <= count(key >= lo) <= GATHER.
- **Top-p** (a line cut by top-p alone): the sample's fixed-point weights, scaled by V / S, place
  the cut's estimate t (the largest prefix whose scaled mass from there up reaches the budget); the
  window spans Z standard deviations of the cut's sample rank either side (d = ceil(Z sqrt(n)) + 2
  ranks, n the sample's values on the smaller side of t), floored and topped to prefixes, inside
  [the floor no cut lies under, the line max]. Taken when its expected values (2d V / S) fit 3/4 of
  GATHER. It holds the cut when the exact mass above it is short of the budget, the mass from its
  first key up reaches it, and at most GATHER values lie inside.

Whatever the sample says, the gather's exact counts and masses decide, so a kernel using these rules
keeps the same cut; a gather that misses costs one pass and narrows the interval the search goes on
with. "Passes now" are select.py's on Triton 3.6 (``bench.gpu_model.select_search`` with no
statistics windows), the first top-k one counted by the statistics launch included; "sampled" is 1
for a line whose gather holds the cut, else 1 plus the passes now (an upper bound). Lines are those
the candidates do not settle (``candidate_outcome``, B=64 K=8 bf16 geometry). Writes
``bench/results/sampled-start-DATE.json``.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import numpy as np

from specdec_ext._triton_backend import SAMPLE_RUN as RUN
from specdec_ext._triton_backend import SELECT_GATHER as GATHER


def top_k_start(keys: np.ndarray, scaled: np.ndarray, top_k: int, runs: int, gather: int = GATHER, sample: np.ndarray | None = None) -> dict:
    """The sampled top-k gather of one line (``keys``: its order keys in id order, -2**31 where
    not finite; ``scaled``: its values), placed as thresholds.py places it
    (``bench.gpu_model.sampled_top_k_lo``), and what the exact counts make of it."""
    from bench.gpu_model import sampled_top_k_lo

    if 2 * top_k > gather:
        return {"taken": False}
    lo = sampled_top_k_lo(scaled, top_k, gather, runs, RUN, sample)
    if lo is None:
        return {"taken": False}
    count = int((keys >= lo).sum())
    outcome = "settles" if top_k <= count <= gather else "short" if count < top_k else "overflow"
    return {"taken": True, "lo": lo, "count": count, "outcome": outcome}


def top_p_start(keys: np.ndarray, weights: np.ndarray, sample: np.ndarray, budget: float, floor: int, top: int, z: float, floor_key: int,
                gather: int = GATHER) -> dict:
    """The sampled top-p window of one line (``weights``: fixed-point, 0 where not finite; ``budget``
    in units of the max's weight; ``floor_key``: the candidates' floor T, every value above which
    the threshold item holds): its bounds, and what the exact masses make of it. The mass above T
    is exact (the candidates'); below T the sample's, scaled by V / S, with its standard deviation
    scale * sqrt(sum of the squared weights) from the cut's estimate to T."""
    vocab = keys.size
    scale = vocab / sample.size
    known = float(weights[keys > floor_key].sum()) * 2.0**-40  # the candidates' exact mass
    if known >= budget:
        return {"taken": False}
    s_keys, s_weights = keys[sample], weights[sample].astype(np.float64) * 2.0**-40
    inside = (s_keys >= floor) & (s_keys <= floor_key)
    s_keys, s_weights = s_keys[inside], s_weights[inside]
    order = np.argsort(-s_keys, kind="stable")
    s_keys, s_weights = s_keys[order], s_weights[order]
    prefixes = s_keys >> 16
    estimate = known + np.cumsum(s_weights) * scale  # the mass from each sampled key up, estimated
    spread = np.sqrt(np.cumsum(s_weights**2)) * scale
    reaching = np.nonzero(estimate >= budget)[0]
    if reaching.size == 0:
        return {"taken": False}
    sigma = max(float(spread[reaching[0]]), float(s_weights.max()) * scale)
    high = np.nonzero(estimate >= budget - z * sigma)[0]
    low = np.nonzero(estimate >= budget + z * sigma)[0]
    w_hi = top if budget - z * sigma <= known or high.size == 0 else min((int(prefixes[high[0]]) << 16) | 0xFFFF, top)
    w_lo = floor if low.size == 0 else max(int(prefixes[low[0]]) << 16, floor)
    expected = float(((s_keys >= w_lo) & (s_keys <= w_hi)).sum()) * scale + float(((keys > floor_key) & (keys >= w_lo) & (keys <= w_hi)).sum())
    if expected > 0.75 * gather:
        return {"taken": False, "expected": expected}
    count, outcome = judge_window(keys, weights, w_lo, w_hi, budget, gather)
    return {"taken": True, "lo": w_lo, "hi": w_hi, "count": count, "expected": expected, "outcome": outcome}


def judge_window(keys: np.ndarray, weights: np.ndarray, lo: int, hi: int, budget: float, gather: int = GATHER) -> tuple[int, str]:
    """What a top-p window gather of [lo, hi] finds, from the exact fixed-point masses (select.py's
    stage 5): (the values inside, "settles" when it holds the cut, else how it misses)."""
    line_above = int(weights[keys > hi].sum())
    line_from = int(weights[keys >= lo].sum())
    count = int(((keys >= lo) & (keys <= hi)).sum())
    reaches = lambda mass: float(mass) * 2.0**-40 >= budget  # noqa: E731
    if count > gather:
        return count, "overflow"
    if reaches(line_above):
        return count, "missed (cut above)"
    if not reaches(line_from):
        return count, "missed (cut below)"
    return count, "settles"


def _line_keys(line: np.ndarray):
    from bench.gpu_model import _fixed_weights, _order_keys

    finite = line > -np.inf
    keys = np.where(finite, _order_keys(line), -(2**31))
    row_max = float(line[finite].max())
    return keys, _fixed_weights(line, row_max), row_max


def study_line(line: np.ndarray, top_k: int, top_p: float, runs: int, z: float, floor_key: int, sample: np.ndarray | None = None) -> dict:
    """Both rules on one float32 line (scaled): the outcome of the one that applies."""
    from bench.gpu_model import _order_key, _top_p_floor, sample_ids

    keys, weights, row_max = _line_keys(line)
    if 0 < top_k < line.size:
        return top_k_start(keys, line, top_k, runs, sample=sample)
    sample = sample_ids(line.size, runs, RUN) if sample is None else sample
    mass = float(np.exp(line[line > -np.inf].astype(np.float64) - row_max).sum())
    budget = float(np.float32(top_p) * np.float32(mass))
    floor = _top_p_floor(row_max, mass, budget, line.size)
    top = _order_key(row_max)
    # (no candidates' floor when they overflow the sort, a flat line: the sample alone)
    return top_p_start(keys, weights, sample, budget, floor, top, z, top if floor_key is None else floor_key)


SETTINGS = [(1.0, 1000, 1.0), (1.0, 0, 0.99), (1.0, 0, 0.95)]
VARIANTS = [("32 runs (S=8192), Z=3", 32, 3.0, False), ("16 runs (S=4096), Z=3", 16, 3.0, False), ("32 runs, Z=4", 32, 4.0, False),
            ("8192 random ids, Z=3", 32, 3.0, True)]


def _sources():
    import torch

    from bench import gpu_model

    found = [gpu_model._demo_lines(torch.float32), gpu_model._demo_lines(torch.bfloat16)] + gpu_model._tiny_lines(128256)
    g = torch.Generator().manual_seed(5)
    synthetic = (3 * torch.randn(64, 128256, generator=g)).to(torch.bfloat16).float()
    flat = (0.2 * torch.randn(64, 128256, generator=g)).to(torch.bfloat16).float()
    found.append(("the GPU model's rows: 3 * randn (V=128256), bf16", synthetic))
    found.append(("the GPU model's flat rows: 0.2 * randn (V=128256), bf16", flat))
    return found


def run() -> dict:
    import torch

    from bench import gpu_model
    from specdec_ext import _triton_backend

    call = gpu_model.Call("B=64 K=8 bf16", **gpu_model._B64, top_k=50)
    parts, lanes, rows, tiles_per_part, line_slots = gpu_model.candidate_geometry(call)
    results = []
    for source, logits in _sources():
        raw16 = torch.equal(logits.to(torch.bfloat16).float(), logits)
        bits = logits.to(torch.bfloat16).view(torch.int16).numpy() if raw16 else None
        for temperature, top_k, top_p in SETTINGS:
            scaled = (logits / temperature).numpy()
            searched = []
            for n, line in enumerate(scaled):
                outcome = gpu_model.candidate_outcome(line, parts, lanes, rows, tiles_per_part, line_slots, _triton_backend.SORT, top_k, top_p)
                if not outcome["resolved"]:
                    searched.append((n, line, outcome["floor_key"]))
            if not searched:
                results.append({"source": source, "top_k": top_k, "top_p": top_p, "lines": len(scaled), "searched": 0})
                continue
            passes_now = []
            for n, line, floor_key in searched:
                raw = (bits[n], "bf16", np.float32(1.0) / np.float32(temperature)) if raw16 else None
                passes_now.append(len(gpu_model.select_search(line, top_k, top_p, raw=raw, floor_key=floor_key)["passes"]))
            row = {"source": source, "temperature": temperature, "top_k": top_k, "top_p": top_p, "lines": len(scaled), "searched": len(searched),
                   "passes_now_mean": round(float(np.mean(passes_now)), 3), "variants": {}}
            for label, runs, z, random_ids in VARIANTS:
                outcomes, sampled_passes, counts, expected = {}, [], [], []
                for (n, line, floor_key), now in zip(searched, passes_now, strict=True):
                    sample = None
                    if random_ids:
                        sample = np.sort(np.random.default_rng(n).choice(line.size, size=min(runs * RUN, line.size), replace=False))
                    found = study_line(line, top_k, top_p, runs, z, floor_key, sample)
                    kind = found["outcome"] if found["taken"] else "not taken"
                    outcomes[kind] = outcomes.get(kind, 0) + 1
                    sampled_passes.append(1 if kind == "settles" else now if kind == "not taken" else 1 + now)
                    if found["taken"]:
                        counts.append(found["count"])
                    if "expected" in found:
                        expected.append(found["expected"])
                row["variants"][label] = {
                    "outcomes": {kind: round(count / len(searched), 4) for kind, count in sorted(outcomes.items())},
                    "passes_mean": round(float(np.mean(sampled_passes)), 3),
                    "gathered_median": float(np.median(counts)) if counts else None,
                    # (top-p: the values its window was expected to hold, taken or not)
                    "window_expected_median": round(float(np.median(expected)), 1) if expected else None,
                }
            results.append(row)
            first = row["variants"][VARIANTS[0][0]]
            print(f"{source} | T={temperature} top-k {top_k} top-p {top_p}: {len(searched)}/{len(scaled)} searched, passes now "
                  f"{row['passes_now_mean']}, sampled {first['passes_mean']} {first['outcomes']} window {first['window_expected_median']}", flush=True)
    return {"kind": "sampled-start study", "date": datetime.date.today().isoformat(), "gather": GATHER, "run": RUN,
            "geometry": f"B=64 K=8 bf16 candidates ({parts} parts, {lanes} lanes x {rows} rows x {tiles_per_part} tiles, {line_slots} slots)",
            "method": __doc__.split("\n\n")[1].replace("\n", " "), "results": results}


def main(argv: list[str]) -> int:
    found = run()
    out = Path(__file__).resolve().parent.parent / "results" / f"sampled-start-{found['date']}.json"
    if "--no-write" not in argv:
        out.write_text(json.dumps(found, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
