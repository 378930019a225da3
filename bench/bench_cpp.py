"""``python -m bench.bench_cpp``: the C++ CPU kernel against transformers, the eager backend and the
memory-traffic floor, plus the cost of going through the registered op.

Cases (fp32, temperature 1, no top-k / top-p: transformers' ``_speculative_sampling`` takes
already-processed logits, so every backend gets the same logits and does the same work):

* B=1, K=5, V=128256: one ``_speculative_sampling`` call;
* B=16, K=4, V=32000: ``_speculative_sampling`` once per row (it takes batch 1);
* B=1, K=4, V=1024: a microsecond-sized call, where dispatch overhead shows.

Inputs: target logits ``3 * randn``, draft logits = target + ``randn`` (a draft close to the
target, so acceptance and rejection both occur), drafts sampled from the draft's softmax.

Timing: the methods of a case take turns, round after round, in a new random order each round, so
a busy machine slows them alike and no method always runs after the same one. In its turn a
method runs once untimed and then twice timed (``time.perf_counter``), so each timed call finds
the logits in cache as a microbenchmark does (and as they are right after the LM head wrote them),
whatever the previous method touched. The statistic is the median (p10 shown too). The floor is
the time to read the same logits once (``torch.amax`` over target and draft), measured the same
way in the same rounds. Python's cyclic GC is off while timing (as in ``timeit``) and runs every
tenth round, untimed.

Rows: ``cpp`` is the default call, ``specdec_ext.verify(..., backend="cpp")`` with ``check=True``
(every line up to n_b validated: the lines the walk does not read get a NaN / +inf / empty scan,
and one look at the result for blanked rows); ``cpp-nocheck`` is the same call with ``check=False``
(lines after the first rejection are never read); ``cpp-op`` does the same argument handling and
then goes through ``torch.ops.specdec.verify`` (the path compiled graphs use); ``kernel`` /
``kernel-nocheck`` / ``kernel-op`` call the extension / the op on prepared arguments, without the
Python argument handling (with a fresh key each call, like verify, since the work follows the
accepted prefix); ``kernel-openmp`` / ``kernel-pool`` are ``kernel`` with that fixed way of spreading
work over threads instead of the default ``auto`` (``--scheduler`` changes the default).
``mean accepted`` is over 20 keys. Goals: the default call >= 10x transformers, and ``check=True``
within 1.25x of ``check=False``.

Beyond token-wise chains, in the same rounds as the rows above: ``block`` / ``block-nocheck`` are
``verify(..., method="block")`` (default call and ``check=False``) on the same inputs, reported as a
ratio to the token-wise call (block verification reads every line up to n_b, token-wise ones stop at
the first rejection). ``trees`` times ``verify_tree`` on the demo's tree (2, 1, 1), 6 nodes, B=16,
V=32000 (i.i.d. and without-replacement siblings), beside the token-wise chain K=4 on the same lines.
``sample_top_p`` times ``sample`` on (64, 128256) fp32 ``randn`` rows, unfiltered against top-p alone
(0.9, 0.95; goal: within 3x of unfiltered).

The race (``race_costs``): microseconds per bonus race over one 128256-entry line on one thread,
per instruction set, as verify runs it (the bound seeded with the argmax) and unseeded, on the B=1
case's line, an LLM-like peaked line and a flat line (nothing can be pruned: every id pays its
share of a Philox evaluation, a log and a divide); beside the same figures measured before stream
v2 (``bench/results/cpu-cpp-2026-12-01-stream-v1.json``, one Philox evaluation per id, another run:
load differs) and the latest same-process A/B of the race_ab study (bench/race_ab.py at commit d7752c8; v1 and v2 kernels
alternating in one process, so the ratio holds on a busy machine).

Writes a table to stdout and JSON to ``bench/results/cpu-cpp-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

import specdec_ext
from specdec_ext import _cpp_backend, _params, ops
from specdec_ext._philox import draw_base_key

from .harness import baselines, report
from .harness.env import load_average
from .harness.timing import quantile, take_turns

RESULTS_DIR = report.RESULTS_DIR
KIND = "measurement: the C++ kernel's verify calls against transformers, the eager reference and the read floor; trees, top-p sampling, the race per instruction set"
CASES = [(1, 5, 128256), (16, 4, 32000), (1, 4, 1024)]
GOALS = {
    (1, 5, 128256): {"transformers": 10.0, "eager": 3.0},
    (16, 4, 32000): {"transformers": 10.0},
}
CHECK_GOAL = 1.25  # the default check=True call within this factor of check=False
TOP_P_GOAL = 3.0  # sample with top-p alone within this factor of the unfiltered sample
TREE_CASE = (16, 32000, (-1, -1, 0, 1, 2, 3))  # B, V, parents: the demo's (2, 1, 1) tree
SAMPLE_CASE = (64, 128256)
BEFORE_STREAM_V2 = RESULTS_DIR / "cpu-cpp-2026-12-01-stream-v1.json"


def make_inputs(batch: int, k: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    target = 3 * torch.randn(batch, k + 1, vocab, generator=g)
    draft = target[:, :k] + torch.randn(batch, k, vocab, generator=g)
    drafts = torch.multinomial(draft.softmax(-1).reshape(batch * k, vocab), 1, generator=g).reshape(batch, k)
    return target, draft, drafts


def methods(target, draft, drafts) -> dict[str, Callable[[], object]]:
    args = _params.validate_verify(target, draft, drafts, temperature=1.0, top_k=None, top_p=None, num_draft_tokens=None, generator=None, check=True)
    # A fresh key per call, as verify draws one: the work follows the accepted prefix, so a fixed
    # key would time one particular outcome.
    kernel_args = (args.target_logits, args.draft_logits, args.draft_tokens, args.temperature, args.top_k, args.top_p, args.num_draft_tokens, None, None)
    found = {
        "transformers": baselines.transformers_verify(target, draft, drafts),
        "eager": baselines.verify_call("eager", target, draft, drafts),
        "floor": lambda: (target.amax(), draft.amax()),
    }
    if _cpp_backend.is_available():
        op = torch.ops.specdec.verify.default
        found.update(
            {
                "cpp": lambda: specdec_ext.verify(target, draft, drafts, backend="cpp"),
                "cpp-nocheck": lambda: specdec_ext.verify(target, draft, drafts, backend="cpp", check=False),
                "cpp-op": lambda: ops.verify(
                    _params.validate_verify(target, draft, drafts, temperature=1.0, top_k=None, top_p=None, num_draft_tokens=None, generator=None, check=True),
                    draw_base_key(None),
                ),
                "kernel": lambda: _cpp_backend._C.verify(*kernel_args, draw_base_key(None), 1, True),
                "kernel-nocheck": lambda: _cpp_backend._C.verify(*kernel_args, draw_base_key(None), 1, False),
                "kernel-op": lambda: op(*kernel_args, draw_base_key(None), 1, True),
                "block": lambda: specdec_ext.verify(target, draft, drafts, method="block", backend="cpp"),
                "block-nocheck": lambda: specdec_ext.verify(target, draft, drafts, method="block", backend="cpp", check=False),
            }
        )
        # The same kernel call with each fixed way of spreading work over threads (csrc/scheduler.cpp).
        used = _cpp_backend._C.scheduler()

        def with_scheduler(name):
            def call():
                _cpp_backend._C.set_scheduler(name)
                try:
                    return _cpp_backend._C.verify(*kernel_args, draw_base_key(None), 1, True)
                finally:
                    _cpp_backend._C.set_scheduler(used)

            return call

        for name in ("openmp", "pool"):
            if name != used:
                found[f"kernel-{name}"] = with_scheduler(name)
    return found


def measure(calls: dict[str, Callable[[], object]], budget_s: float, min_rounds: int, max_rounds: int, timed_per_round: int = 2) -> dict[str, list[float]]:
    """Per-call seconds for every method. Methods take turns, round after round, so a busy machine
    slows them alike; within its turn a method first runs once untimed, so every timed call starts
    from its own warm caches rather than from whatever the previous method left (the eager
    reference alone touches hundreds of MB). GC off while timing, collected every tenth round."""
    return take_turns(calls, budget_s=budget_s, min_rounds=min_rounds, max_rounds=max_rounds, warmup=1, untimed=1, samples=timed_per_round, gc_every=10)


def summarise(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_us": statistics.median(ordered) * 1e6,
        "p10_us": quantile(ordered, 0.1, inclusive=True) * 1e6,
        "min_us": ordered[0] * 1e6,
        "reps": len(ordered),
    }


def _peaked_line(vocab: int) -> torch.Tensor:
    """An LLM-like next-token line: a long normal tail and a few dominant ids."""
    g = torch.Generator().manual_seed(1)
    line = 2 * torch.randn(vocab, generator=g)
    line[torch.randint(0, vocab, (3,), generator=g)] = torch.tensor([14.0, 16.0, 18.0])
    return line


def race_costs(vocab: int = 128256, rounds: int = 15, reps: int = 5) -> dict | None:
    """Microseconds per bonus race over one line on one thread (the kernel's race_ns hook), for every
    instruction-set variant this CPU runs, seeded as verify seeds it and unseeded; lines, variants
    and modes alternate, round after round; median over rounds."""
    if not _cpp_backend.is_available() or not hasattr(_cpp_backend._C, "race_ns"):
        return None
    lines = {"bench_line": make_inputs(1, 0, vocab)[0][0, 0].contiguous(), "peaked_line": _peaked_line(vocab), "flat_line": torch.zeros(vocab)}
    used = _cpp_backend.isa()
    variants = [isa for isa in ("avx512", "avx2", "neon", "base") if _cpp_backend._C.set_isa(isa)]
    modes = {"seeded": True, "unseeded": False}
    samples: dict[tuple[str, str, str], list[float]] = {(isa, mode, name): [] for isa in variants for mode in modes for name in lines}
    try:
        for _ in range(rounds):
            for isa in variants:
                _cpp_backend._C.set_isa(isa)
                for mode, seeded in modes.items():
                    for name, line in lines.items():
                        samples[isa, mode, name].append(_cpp_backend._C.race_ns(line, reps, seeded) / 1e3)
    finally:
        _cpp_backend._C.set_isa(used)
    costs = {
        "vocab": vocab,
        "default_isa": used,
        "us": {isa: {mode: {name: round(statistics.median(samples[isa, mode, name]), 1) for name in lines} for mode in modes} for isa in variants},
        "min_us": {isa: {mode: {name: round(min(samples[isa, mode, name]), 1) for name in lines} for mode in modes} for isa in variants},
    }
    if BEFORE_STREAM_V2.exists():
        before = json.loads(BEFORE_STREAM_V2.read_text())
        costs["before_stream_v2"] = {"file": BEFORE_STREAM_V2.name, "us": before["race"]["us"], "host": before["host"], "date": before["date"]}
    same_process = sorted(RESULTS_DIR.glob("cpu-race-v1-v2-*.json"))
    if same_process:  # the race_ab study (git history): v1 and v2 alternating in one process
        ab = json.loads(same_process[-1].read_text())
        costs["stream_v1_v2_same_process"] = {"file": same_process[-1].name, "date": ab["date"], "us": ab["us"]}
    return costs


def tree_costs(budget_s: float) -> dict:
    """verify_tree on the demo's tree beside the token-wise chain K=4 on the same lines, in shared rounds."""
    from specdec_ext.api import verify_tree

    batch, vocab, parents = TREE_CASE
    nodes = len(parents)
    g = torch.Generator().manual_seed(2)
    target = 3 * torch.randn(batch, nodes + 1, vocab, generator=g)
    draft = target + torch.randn(batch, nodes + 1, vocab, generator=g)
    tokens = torch.multinomial(draft.softmax(-1).reshape(-1, vocab), 1, generator=g).reshape(batch, nodes + 1)[:, :nodes]
    parent_rows = torch.tensor([parents] * batch)
    chain_k = 4
    calls = {
        "tree-iid": lambda: verify_tree(target, draft, tokens, parent_rows, backend="cpp"),
        "tree-without-replacement": lambda: verify_tree(target, draft, tokens, parent_rows, siblings="without_replacement", backend="cpp"),
        "chain-token": lambda: specdec_ext.verify(target[:, : chain_k + 1], draft[:, :chain_k], tokens[:, :chain_k], backend="cpp"),
    }
    samples = measure(calls, budget_s=budget_s, min_rounds=10, max_rounds=500)
    stats = {name: summarise(values) for name, values in samples.items()}
    return {"batch": batch, "nodes": nodes, "parents": list(parents), "vocab": vocab, "dtype": "fp32", "chain_k": chain_k, "methods": stats}


def sample_top_p_costs(budget_s: float) -> dict:
    """sample on flat rows, unfiltered against top-p alone, in shared rounds (the top-p window's cost on flat lines)."""
    batch, vocab = SAMPLE_CASE
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(3))
    calls = {"unfiltered": lambda: specdec_ext.sample(logits, backend="cpp")}
    for top_p in (0.9, 0.95):
        calls[f"top_p={top_p}"] = lambda top_p=top_p: specdec_ext.sample(logits, top_p=top_p, backend="cpp")
    samples = measure(calls, budget_s=budget_s, min_rounds=10, max_rounds=500)
    stats = {name: summarise(values) for name, values in samples.items()}
    plain = stats["unfiltered"]["median_us"]
    ratios = {name: stats[name]["median_us"] / plain for name in calls if name != "unfiltered"}
    return {
        "batch": batch, "vocab": vocab, "dtype": "fp32", "methods": stats, "per_row_us": {name: m["median_us"] / batch for name, m in stats.items()},
        "ratio_to_unfiltered": ratios,
        "goals": {f"{name} <= {TOP_P_GOAL:g}x unfiltered": {"measured": round(r, 2), "pass": r <= TOP_P_GOAL} for name, r in ratios.items()},
    }


def run(threads: int | None, budget_s: float, scheduler: str | None, cases: list[tuple[int, int, int]] | None = None, race: bool = True) -> dict:
    if threads:
        torch.set_num_threads(threads)
    if scheduler and _cpp_backend.is_available():
        _cpp_backend._C.set_scheduler(scheduler)
    load_start = load_average()
    rows = []
    for batch, k, vocab in cases or CASES:
        target, draft, drafts = make_inputs(batch, k, vocab)
        calls = methods(target, draft, drafts)
        slow = batch * vocab >= 500_000
        samples = measure(calls, budget_s=budget_s if slow else budget_s / 4, min_rounds=15, max_rounds=2000)
        stats = {name: summarise(values) for name, values in samples.items()}
        accepted = statistics.mean(float(specdec_ext.verify(target, draft, drafts, check=False, backend="eager").num_accepted.float().mean()) for _ in range(20))
        logits_bytes = (target.numel() + draft.numel()) * target.element_size()
        case = {"batch": batch, "k": k, "vocab": vocab, "dtype": "fp32", "logits_bytes": logits_bytes, "mean_accepted": accepted, "methods": stats}
        if "cpp" in stats:
            cpp, nocheck = stats["cpp"]["median_us"], stats["cpp-nocheck"]["median_us"]
            case["speedup_vs_transformers"] = stats["transformers"]["median_us"] / cpp
            case["speedup_vs_transformers_nocheck"] = stats["transformers"]["median_us"] / nocheck
            case["speedup_vs_eager"] = stats["eager"]["median_us"] / cpp
            case["check_ratio"] = cpp / nocheck
            case["x_floor"] = cpp / stats["floor"]["median_us"]
            case["floor_gbs"] = logits_bytes / (stats["floor"]["median_us"] * 1e-6) / 1e9
            case["op_overhead_us"] = stats["kernel-op"]["median_us"] - stats["kernel"]["median_us"]
            case["api_op_overhead_us"] = stats["cpp-op"]["median_us"] - cpp
            case["check_overhead_us"] = cpp - nocheck
            goals = GOALS.get((batch, k, vocab), {})
            case["goals"] = {
                f"default call >= {factor:g}x {base}": {"measured": round(case[f"speedup_vs_{base}"], 2), "pass": case[f"speedup_vs_{base}"] >= factor}
                for base, factor in goals.items()
            }
            if goals:
                case["goals"][f"check=True <= {CHECK_GOAL:g}x check=False"] = {"measured": round(case["check_ratio"], 3), "pass": case["check_ratio"] <= CHECK_GOAL}
            case["block_ratio"] = stats["block"]["median_us"] / cpp
            case["block_ratio_nocheck"] = stats["block-nocheck"]["median_us"] / nocheck
        rows.append(case)
    trees = tree_costs(budget_s / 2) if _cpp_backend.is_available() else None
    sample_top_p = sample_top_p_costs(budget_s / 2) if _cpp_backend.is_available() else None
    race_figures = race_costs() if race else None
    return {
        **report.header(KIND, "cpu", load_start),
        "schema": 1,
        "kernel": {
            "available": _cpp_backend.is_available(),
            "isa": _cpp_backend.isa(),
            "compiler": _cpp_backend._C.compiler() if _cpp_backend.is_available() and hasattr(_cpp_backend._C, "compiler") else None,
            "openmp_linked": _cpp_backend._C.openmp_linked() if _cpp_backend.is_available() and hasattr(_cpp_backend._C, "openmp_linked") else None,
            "scheduler": _cpp_backend._C.scheduler() if _cpp_backend.is_available() else None,
            "unavailable_reason": _cpp_backend.unavailable_reason(),
        },
        "note": "measured with other jobs running on this machine unless load_average says otherwise; figures for publication are re-measured on a quiet machine",
        "timing": "methods take turns in a shuffled order each round; per turn one untimed call then two timed (time.perf_counter), warm caches, GC off; median (p10, min also kept)",
        "cases": rows,
        "trees": trees,
        "sample_top_p": sample_top_p,
        "race": race_figures,
    }


def format_table(doc: dict) -> str:
    order = ["cpp", "cpp-nocheck", "block", "block-nocheck", "kernel", "kernel-nocheck", "cpp-op", "kernel-op", "kernel-openmp", "kernel-pool", "eager",
             "transformers", "floor"]
    host, load, kernel = doc["machine"], doc["load_average"], doc["kernel"]
    lines = [
        f"specdec_ext C++ kernel: {kernel['isa'] or 'unavailable'} / {kernel['scheduler']} scheduler, {kernel.get('compiler')}, "
        f"{host['torch_threads']} threads, {host['cpu']} ({host['cpu_count']} CPUs), load {load['start']} -> {load['end']}",
        "",
        f"{'case':<24} {'method':<14} {'median us':>11} {'p10 us':>10} {'reps':>6}   notes",
    ]
    for case in doc["cases"]:
        label = f"B={case['batch']} K={case['k']} V={case['vocab']}"
        for name in order:
            if name not in case["methods"]:
                continue
            m = case["methods"][name]
            note = ""
            if name == "cpp" and "speedup_vs_transformers" in case:
                note = (
                    f"default call (check=True): {case['speedup_vs_transformers']:.1f}x transformers, {case['speedup_vs_eager']:.1f}x eager, "
                    f"{case['x_floor']:.2f}x floor, mean accepted {case['mean_accepted']:.2f}"
                )
            elif name == "cpp-nocheck" and "check_ratio" in case:
                note = f"check=False: {case['speedup_vs_transformers_nocheck']:.1f}x transformers; check=True costs {case['check_ratio']:.2f}x ({case['check_overhead_us']:+.1f} us)"
            elif name == "floor":
                note = f"read {case['logits_bytes'] / 2**20:.1f} MiB of logits once ({case.get('floor_gbs', 0):.1f} GB/s)"
            elif name == "block" and "block_ratio" in case:
                note = f"verify(method='block'): {case['block_ratio']:.2f}x the token-wise default call"
            elif name == "block-nocheck" and "block_ratio_nocheck" in case:
                note = f"block, check=False: {case['block_ratio_nocheck']:.2f}x token-wise check=False"
            elif name == "kernel-op" and "op_overhead_us" in case:
                note = f"{case['op_overhead_us']:+.1f} us vs the direct call"
            elif name in ("kernel-openmp", "kernel-pool"):
                note = f"kernel with the {name.split('-')[1]} scheduler (default: {kernel['scheduler']})"
            elif name == "cpp-op" and "api_op_overhead_us" in case:
                note = f"{case['api_op_overhead_us']:+.1f} us vs the default path"
            lines.append(f"{label:<24} {name:<14} {m['median_us']:>11.1f} {m['p10_us']:>10.1f} {m['reps']:>6}   {note}")
            label = ""
        for goal, result in case.get("goals", {}).items():
            lines.append(f"{'':<24} goal {goal}: {result['measured']} -> {'PASS' if result['pass'] else 'FAIL'}")
    trees = doc.get("trees")
    if trees:
        lines += ["", f"verify_tree, parents {trees['parents']} (B={trees['batch']}, V={trees['vocab']}, fp32), beside token-wise K={trees['chain_k']} "
                      "on the same lines, median us:"]
        for name, m in trees["methods"].items():
            lines.append(f"  {name:<26} {m['median_us']:>10.1f} {m['p10_us']:>10.1f} {m['reps']:>6}")
    top_p = doc.get("sample_top_p")
    if top_p:
        lines += ["", f"sample ({top_p['batch']}, {top_p['vocab']}) fp32 randn rows, us per row (median):"]
        for name, per_row in top_p["per_row_us"].items():
            ratio = top_p["ratio_to_unfiltered"].get(name)
            lines.append(f"  {name:<14} {per_row:>10.1f}" + (f"   {ratio:.2f}x unfiltered" if ratio else ""))
        for goal, result in top_p["goals"].items():
            lines.append(f"  goal {goal}: {result['measured']} -> {'PASS' if result['pass'] else 'FAIL'}")
    race = doc.get("race")
    if race:
        before = race.get("before_stream_v2", {}).get("us", {})
        lines += ["", f"race over V={race['vocab']} on one thread, median us (stream v2 now; stream v1 before, {race.get('before_stream_v2', {}).get('file', 'not found')}):"]
        lines.append(f"  {'isa':<8} {'line':<12} {'v1 before':>10} {'v2 unseeded':>12} {'v2 seeded':>10}   v1 -> v2 (as verify runs it)")
        for isa, modes in race["us"].items():
            for name in modes["seeded"]:
                old = before.get(isa, {}).get(name)
                ratio = f"{old / modes['seeded'][name]:.1f}x faster" if old else ""
                old_text = f"{old:.1f}" if old else "-"
                lines.append(f"  {isa:<8} {name:<12} {old_text:>10} {modes['unseeded'][name]:>12.1f} {modes['seeded'][name]:>10.1f}   {ratio}")
        ab = race.get("stream_v1_v2_same_process")
        if ab:
            lines.append(f"  same process, alternating ({ab['file']}, the race_ab study):")
            for isa, named in ab["us"].items():
                for name, values in named.items():
                    lines.append(f"  {isa:<8} {name:<12} v1 {values['stream_v1_us']:>8.1f}  v2 {values['stream_v2_us']:>8.1f}   {values['speedup']:.2f}x faster")
    return "\n".join(lines)


def _parse_case(text: str) -> tuple[int, int, int]:
    batch, k, vocab = (int(part) for part in text.split(","))
    return batch, k, vocab


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_cpp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--budget", type=float, default=20.0, help="seconds of timing per large case (default 20)")
    parser.add_argument(
        "--scheduler", choices=("auto", "openmp", "pool"), default=None, help="how the kernel spreads work over threads (default: auto)"
    )
    parser.add_argument("--case", type=_parse_case, action="append", default=None, metavar="B,K,V", help="only these cases (repeatable; default: all)")
    parser.add_argument("--no-race", action="store_true", help="skip the race timing")
    parser.add_argument("--no-write", action="store_true", help="print the table only (no JSON file)")
    parser.add_argument("--tag", default="", help="suffix of the JSON file name")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for the JSON (default: bench/results)")
    args = parser.parse_args(argv)
    doc = run(args.threads, args.budget, args.scheduler, args.case, race=not args.no_race)
    print(format_table(doc))
    if args.no_write:
        return 0
    tags = [args.scheduler if args.scheduler not in (None, "auto") else "", f"t{args.threads}" if args.threads else "", args.tag]
    path = report.write_json(doc, report.result_path(args.out, "cpu-cpp", doc["date"], tag="-".join(t for t in tags if t)))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
