"""``python -m bench.gpu_rows``: the GPU model's calls measured on a CUDA device, launch by launch.

Each call of :mod:`bench.gpu_model` (its goal rows and its block and tree rows) runs on inputs of
the modelled shape, is captured once in a CUDA graph and replayed, and is timed three ways:

* ``replay_us``: CUDA events around one replay on an idle device, median of 50. This includes
  the time the host takes to submit the graph (about 16 µs on the virtualised H200 here, measured
  by :func:`graph_replay_us` on a graph of one-element kernels).
* ``back_to_back_us``: 20 replays queued between two events, per replay, median of 10 such
  batches: the device time a serving loop pays when the graph is queued behind the model.
* ``kernels_us``: each kernel's device time (torch.profiler over five eager calls).

The inputs, stated in the file: target logits ``3 * randn``, draft logits the target's plus
``randn``; lines whose cut the candidates settle (``search_fraction`` 0 in the model) have four
tokens raised by 20, which then hold about 99 % of the mass; the whole-line rows' lines are flat
(``0.2 * randn``) so that neither top-k 1000 nor top-p 0.99 stops among the candidates.

:data:`VARIANTS` then times a few calls again with other launch geometries (same inputs, same
result), for choices the model cannot make.

``--compare MEASURED.json [--model MODEL.json]`` sets a measurement beside the model's estimate
of the same calls (its newest ``gpu-model-*.json`` for the measured Triton version by default),
and each geometry variant beside its call's default.
``--dry-run`` times the rows eagerly on CPU at small shapes with Triton interpreted (a rehearsal).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

from specdec_ext._triton_backend import SAMPLE_RUNS, key_window_default

from .call_inputs import INPUTS, inputs
from .gpu_model import GOAL_CALLS, Call, sweep_calls
from .harness import report

# Launch geometries measured beside the default on the same inputs (the launcher's geometry
# overrides, which never change a result): the rows per statistics tile of a filtered call and the
# parts a line is read in (stats_tile, stats_parts: 65536 bf16 or 32768 fp32 values is the 32-row
# tile that spilled at 255 registers, the default until 8-row tiles), and the race's ids per step at
# B=1 (more programs for one row); and a top-k 1000 search's first pass over the line instead of
# from the statistics launch's key counts (histogram_top_k), and with the top windows and the top-p
# windows switched (key_window, top_p_window), and the sampled first gather of a top-k (sample_runs). The model cannot rank these: it
# under-estimated the spilling tile 3x. A lent GPU does.
VARIANTS = [
    ("B=64 K=8 bf16 T=0.7 top-k 50 top-p 0.9", {"stats_tile": 65536, "stats_parts": 1}),
    ("B=64 K=8 bf16 T=0.7 top-k 50 top-p 0.9", {"stats_tile": 32768, "stats_parts": 1}),
    ("B=64 K=8 bf16 T=0.7 top-k 50 top-p 0.9", {"stats_tile": 16384, "stats_parts": 2}),
    ("B=1 K=4 fp32 T=0.7 top-k 50 top-p 0.9", {"stats_tile": 32768, "stats_parts": 4}),
    ("B=1 K=4 fp32 T=0.7 top-k 50 top-p 0.9", {"stats_tile": 8192, "stats_parts": 8}),
    ("B=1 K=4 V=128256 fp32", {"race_block": 128}),
    ("B=1 K=4 V=128256 fp32", {"race_block": 64}),
    # the search's first top-k pass over the line, not from the statistics launch's key counts
    ("B=64 K=8 bf16 top-k 1000 (whole-line search)", {"histogram_top_k": 2**31}),
    ("B=1 K=4 fp32 top-k 1000 (whole-line search)", {"histogram_top_k": 2**31}),
    # the statistics' top windows switched the other way from this Triton's default (key_window_default:
    # on where tl.histogram takes shared-memory atomics, 3.8 and later; off on 3.6 and 3.7, whose ballots a 512-bin histogram doubles)
    ("B=64 K=8 bf16 top-k 1000 (whole-line search)", {"key_window": not key_window_default()}),
    # a flat bf16 top-p's top-p window switched the other way likewise (on 3.8 and later: the search's two
    # passes instead; on 3.6: 8192 bins of ballots, to see what they cost)
    ("B=64 K=8 bf16 flat top-p 0.99 (whole-line search)", {"top_p_window": not key_window_default()}),
    # a top-k's first gather placed from a sample of the line switched the other way (a bf16 line's on 3.6 and
    # 3.7 by default: the statistics' key counts and a pass of key bins instead; on 3.8 and later: to see it
    # there; a float32 call's on every Triton by default: sample_runs_default)
    ("B=64 K=8 bf16 top-k 1000 (whole-line search)", {"sample_runs": SAMPLE_RUNS if key_window_default() else 0}),
    ("B=1 K=4 fp32 top-k 1000 (whole-line search)", {"sample_runs": 0}),
    ("vLLM B=64 K=8 fp32 top-k 1000 (whole-line search)", {"sample_runs": 0}),
]


def calls() -> list[Call]:
    """The model's goal calls, then vLLM's float32 calls, then its block and tree calls."""
    return [call for call, _, _ in GOAL_CALLS] + [call for call in sweep_calls() if call.method != "token" or call.name.startswith("vLLM ")]


def dry_shape(call: Call) -> Call:
    """A small version of ``call`` for a rehearsal on CPU (B <= 2, V = 3000)."""
    return replace(call, name=f"{call.name} (dry run: B<=2 V=3000)", batch=min(call.batch, 2), vocab=3000)


def runner(call: Call, device: str, geometry: dict | None = None):
    """A no-argument function making ``call`` on its inputs (a chain call with ``geometry``: the
    Triton launcher's own entry with those overrides)."""
    import specdec_ext

    made = inputs(call, device)
    a, kw = made["args"], made["kwargs"]
    if geometry:
        from specdec_ext import _triton_backend
        from specdec_ext._params import validate_verify

        args = validate_verify(a["target"], a["draft"], a["tokens"], temperature=kw.get("temperature", 1.0), top_k=kw.get("top_k"),
                               top_p=kw.get("top_p"), num_draft_tokens=None, generator=None, check=False, seeds=kw["seeds"])
        return lambda: _triton_backend.verify(args, 0, **geometry)
    if call.method == "tree":
        return lambda: specdec_ext.verify_tree(a["target"], a["draft"], a["tokens"], a["parents"], **kw)
    return lambda: specdec_ext.verify(a["target"], a["draft"], a["tokens"], **kw)


def _event_us(run, repeats: int) -> float:
    """Device µs between two events around ``run()``."""
    import torch

    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(repeats):
        run()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) * 1e3 / repeats


def graph_replay_us(kernels: int = 1) -> float:
    """Median µs between events around one replay of a graph of ``kernels`` one-element adds: what
    submitting a replay costs on an idle device, whatever its kernels do."""
    import torch

    from .harness.timing import capture_cuda_graph

    x = torch.zeros(1, device="cuda")
    graph, _ = capture_cuda_graph(lambda: [x.add_(1) for _ in range(kernels)], warmup=1)
    return statistics.median(_event_us(graph.replay, 1) for _ in range(200))


def kernel_times(run) -> dict[str, float]:
    """Each kernel's device µs per call (torch.profiler over five eager calls)."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(5):
            run()
        torch.cuda.synchronize()
    return {e.key: round(e.device_time_total / 5, 2) for e in profile.key_averages() if e.device_time_total > 0}


def measure(call: Call, device: str, geometry: dict | None = None) -> dict:
    """One row: the call (and its geometry), and its times (only ``eager_us`` in a dry run)."""
    import time

    import torch

    run = runner(call, device, geometry)
    row = {"call": asdict(call)} | ({"geometry": geometry} if geometry else {})
    if device != "cuda":
        run()  # interpreted: the first call is as slow as the next
        start = time.perf_counter()
        run()
        row["eager_us"] = round((time.perf_counter() - start) * 1e6, 1)
        return row
    from .harness.timing import capture_cuda_graph

    for _ in range(3):  # the first calls compile the kernels' variants
        run()
    torch.cuda.synchronize()
    graph, _ = capture_cuda_graph(run, warmup=1)
    row["replay_us"] = round(statistics.median(_event_us(graph.replay, 1) for _ in range(50)), 2)
    row["back_to_back_us"] = round(statistics.median(_event_us(graph.replay, 20) for _ in range(10)), 2)
    row["kernels_us"] = kernel_times(run)
    return row


def run_rows(device: str, only: list[str] | None = None, out_dir: Path | None = None) -> dict:
    """Every row (those whose names hold one of ``only``'s words), printed as they come; with
    ``out_dir``, the file rewritten after each row (a run stopped at a time limit keeps its rows)."""
    from .harness import env

    load = env.load_average()
    rows: list[dict] = []
    chosen = [c for c in calls() if not only or any(word in c.name for word in only)]
    if device != "cuda":
        chosen = [dry_shape(c) for c in chosen[:2] + chosen[-1:]]
    doc = report.header("measurement: the GPU model's calls (bench/gpu_model.py), CUDA-graph replays and kernel times", device, load)
    doc["inputs"] = INPUTS
    doc["rows"] = rows
    path = out_dir and report.result_path(out_dir, "gpu-rows", doc["date"], env.device_slug(device), None if device == "cuda" else "dry-run")
    if device == "cuda":
        doc["graph_replay_us"] = {str(n): round(graph_replay_us(n), 2) for n in (1, 4)}
        print(f"graph replay of 1 / 4 one-element kernels: {doc['graph_replay_us']['1']} / {doc['graph_replay_us']['4']} us between events")
    by_name = {c.name: c for c in calls()}
    variants = [(by_name[name], geometry) for name, geometry in VARIANTS if not only or any(word in name for word in only)]
    if device != "cuda":
        variants = [(dry_shape(call), geometry) for call, geometry in variants[-1:]]
    for call, geometry in [(c, None) for c in chosen] + variants:
        try:
            row = measure(call, device, geometry)
        except Exception as error:  # one failing row must not cost the others
            row = {"call": asdict(call), "geometry": geometry, "error": f"{type(error).__name__}: {error}"}
        rows.append(row)
        print(row_line(row), flush=True)
        if path:
            report.write_json(doc, path)
    if path:
        print(f"wrote {path}")
    return doc


def row_line(row: dict) -> str:
    name = row["call"]["name"] + (f" [{', '.join(f'{k}={v}' for k, v in row['geometry'].items())}]" if row.get("geometry") else "")
    if "error" in row:
        return f"row | {name}: FAILED {row['error']}"
    if "eager_us" in row:
        return f"row | {name}: eager (interpreted) {row['eager_us']:.0f} us"
    kernels = ", ".join(f"{k} {v:.1f}" for k, v in row["kernels_us"].items())
    return f"row | {name}: replay {row['replay_us']:.1f} us, back to back {row['back_to_back_us']:.1f} us | kernels: {kernels}"


# ---------------------------------------------------------------------------------------------
# Measured beside the model


def _kernel_name(launch: str) -> str:
    """The compiled kernel's name for a model launch (``cutoff:search`` is a phase of ``cutoff``)."""
    return launch.split(":")[0] + "_kernel"


def compare(measured: dict, model: dict) -> str:
    """A Markdown table: each measured call beside the model's estimate of it, whole and per kernel."""
    estimates = {r["call"]["name"]: r for r in model["results"]}
    head = ["call", "model replayed µs", "measured µs", "measured / model", "per kernel: model → measured µs"]
    lines = []
    for row in measured["rows"]:
        estimate = estimates.get(row["call"]["name"])
        if estimate is None or "kernels_us" not in row or row.get("geometry"):
            continue
        # Back to back where measured (the device time a queued replay takes), else one replay.
        time_us, how = (row["back_to_back_us"], "back to back") if row.get("back_to_back_us") else (row["replay_us"], "one replay")
        modelled: dict[str, float] = {}
        for launch in estimate["launches"]:
            name = _kernel_name(launch["name"])
            modelled[name] = modelled.get(name, 0.0) + launch["time_us"]
        kernels = "; ".join(f"{name.removesuffix('_kernel')} {modelled.get(name, 0):.1f} → {us:.1f}" for name, us in row["kernels_us"].items())
        ratio = time_us / estimate["replayed_us"]
        lines.append([row["call"]["name"], f"{estimate['replayed_us']:.1f}", f"{time_us:.1f} ({how})", f"{ratio:.2f}", kernels])
    return report.markdown_table(head, lines)


def variants_table(measured: dict) -> str:
    """A Markdown table: each geometry variant beside the default geometry's row of the same call."""
    default = {r["call"]["name"]: r for r in measured["rows"] if not r.get("geometry") and "kernels_us" in r}
    lines = []
    for row in measured["rows"]:
        base = default.get(row["call"]["name"])
        if not row.get("geometry") or base is None or "kernels_us" not in row:
            continue
        key = "back_to_back_us" if row.get("back_to_back_us") and base.get("back_to_back_us") else "replay_us"
        kernels = "; ".join(f"{name.removesuffix('_kernel')} {base['kernels_us'].get(name, 0):.1f} → {us:.1f}" for name, us in row["kernels_us"].items())
        geometry = ", ".join(f"{k}={v}" for k, v in row["geometry"].items())
        lines.append([row["call"]["name"], geometry, f"{base[key]:.1f}", f"{row[key]:.1f}", f"{row[key] / base[key]:.2f}", kernels])
    head = ["call", "geometry", "default µs", "variant µs", "variant / default", "per kernel: default → variant µs"]
    return report.markdown_table(head, lines) if lines else ""


def newest_model(triton_version: str | None) -> Path:
    """The newest ``gpu-model-*.json`` estimated for ``triton_version`` (any version if None)."""
    import json

    found = []
    for path in report.RESULTS_DIR.glob("gpu-model-*.json"):
        doc = json.loads(path.read_text())
        if triton_version is None or str(doc.get("versions", {}).get("triton")) == triton_version:
            found.append((doc.get("date", ""), path.name, path))
    if not found:
        raise SystemExit(f"no gpu-model-*.json for triton {triton_version} in {report.RESULTS_DIR}")
    return max(found)[2]


def main(argv: list[str] | None = None) -> int:
    import json

    parser = argparse.ArgumentParser(prog="python -m bench.gpu_rows", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, small shapes, Triton interpreted")
    parser.add_argument("--only", nargs="*", default=None, help="only the calls whose names contain one of these words")
    parser.add_argument("--out", type=Path, default=report.RESULTS_DIR, help="folder for gpu-rows-<device>-<date>.json")
    parser.add_argument("--compare", type=Path, default=None, help="a gpu-rows JSON to set beside the model (runs nothing)")
    parser.add_argument("--model", type=Path, default=None, help="the gpu-model JSON to compare with (default: newest for its Triton)")
    args = parser.parse_args(argv)
    if args.compare:
        measured = json.loads(args.compare.read_text())
        model_path = args.model or newest_model(measured["versions"].get("triton"))
        print(f"{args.compare.name} (measured) beside {model_path.name} (ESTIMATE)\n")
        print(compare(measured, json.loads(model_path.read_text())))
        if variants := variants_table(measured):
            print(f"\nLaunch geometries beside the default (measured):\n\n{variants}")
        return 0
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    device = "cpu" if args.dry_run else "cuda"
    run_rows(device, args.only, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
