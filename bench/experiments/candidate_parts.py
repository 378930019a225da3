"""``python -m bench.experiments.candidate_parts``: would more statistics parts a line keep its candidates?

At B=1 every phase of a filtered call is one line's chain on one program, so the statistics launch
takes as long as one part's read: 4 parts a line (B=1 K=4 V=128256 float32: parts of 32 rows of
1024 lanes) cost 3.9 µs in the GPU model, 8 parts 3.3 and 16 parts 3.0 (ESTIMATES). But the
candidates come from the parts: each lane keeps its top three values, a part's floor is its largest
third value (its second, or its max, when more entries than its quota of LINE_SLOTS / parts would
lie above), and the line floor is the largest part floor; the threshold item sorts the values above
it (at most SORT; past that it takes the level-two floor). More parts means more lanes, smaller
quotas and a line floor that moves, so the cut may settle among them less often.

This runs the statistics' rule (``bench.gpu_model.candidate_outcome``, the kernels' rule) on the
lines of ``bench.experiments.sampled_start``'s sources (the embedded target's logits on the demo
corpus, the tiny architectures' bf16 logits at V=128256, and the GPU model's normal rows) at 4, 8
and 16 parts a line, under the filters a B=1 user sets, and counts the lines the candidates settle
(no whole-line search), the values above the line floor, and the lines past the sort. Writes
``bench/results/candidate-parts-DATE.json``.
"""

from __future__ import annotations

import sys

import numpy as np

from ..harness import report

PARTS = (4, 8, 16)
SETTINGS = [(0.7, 50, 0.9), (1.0, 0, 0.9), (1.0, 0, 0.95), (0.7, 1000, 1.0)]


def run() -> dict:
    from bench import gpu_model
    from bench.experiments.sampled_start import _sources
    from specdec_ext import _triton_backend

    call = gpu_model.Call("B=1 K=4 fp32", **gpu_model._B1, top_k=50)
    parts, lanes, rows, tiles_per_part, line_slots = gpu_model.candidate_geometry(call)
    tiles = parts * tiles_per_part
    results = []
    for source, logits in _sources():
        for temperature, top_k, top_p in SETTINGS:
            scaled = (logits / temperature).numpy()
            row = {"source": source, "temperature": temperature, "top_k": top_k, "top_p": top_p, "lines": len(scaled), "by_parts": {}}
            for p in PARTS:
                per_part = -(-tiles // p)
                outcomes = [gpu_model.candidate_outcome(line, -(-tiles // per_part), lanes, rows, per_part, line_slots, _triton_backend.SORT, top_k, top_p)
                            for line in scaled]
                above = [o["above_floor"] for o in outcomes if o["above_floor"] >= 0]
                row["by_parts"][p] = {
                    "settled": round(float(np.mean([o["resolved"] for o in outcomes])), 4),
                    "above_floor_mean": round(float(np.mean(above)), 1) if above else None,
                    "past_the_sort": round(float(np.mean([o["above_floor"] < 0 for o in outcomes])), 4),
                }
            results.append(row)
            print(f"{source} | T={temperature} top-k {top_k} top-p {top_p}: "
                  + "; ".join(f"{p} parts settle {v['settled']}, above {v['above_floor_mean']}, past the sort {v['past_the_sort']}"
                              for p, v in row["by_parts"].items()), flush=True)
    return report.header("study: the share of lines whose candidates settle the cut at 4, 8 and 16 statistics parts a line (no kernel changed)") | {
        "geometry": f"B=1 K=4 fp32: {parts} parts by default, {lanes} lanes x {rows} rows, {tiles} tiles a line, {line_slots} slots, "
                    f"sort {_triton_backend.SORT}", "method": __doc__.split("\n\n")[2].replace("\n", " "), "results": results}


def main(argv: list[str]) -> int:
    found = run()
    if "--no-write" not in argv:
        print(f"wrote {report.write_json(found, report.result_path(report.RESULTS_DIR, 'candidate-parts', found['date']))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
