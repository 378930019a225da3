"""``python -m bench.experiments.compare_compilers``: the C++ kernel built with GCC and with clang, same benchmark.

Builds the extension twice (``setup.py build_ext`` into ``build/compilers/<compiler>/``; clang with
``CC=clang CXX=clang++ LDSHARED="clang++ -shared"``), then runs ``python -m bench.bench_cpp`` on the
two large cases with each build in turn, alternating for ``--rounds`` rounds so a busy machine slows
both alike (each run in its own process: two builds of one extension cannot share a process). The
in-place build in ``specdec_ext/`` is restored at the end. Writes
``bench/results/cpu-cpp-compilers-<date>.json``: per compiler, the median over rounds of every
method's median, and clang / GCC ratios (the goal: clang within 1.2x of GCC).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from ..harness import report
from ..harness.env import ROOT, load_average

RESULTS_DIR = report.RESULTS_DIR
KIND = "measurement: bench_cpp on GCC and clang builds of the C++ kernel, alternating runs, with clang / GCC ratios"
COMPILERS = {
    "gcc": {"CC": "gcc", "CXX": "g++", "LDSHARED": "g++ -shared"},
    "clang": {"CC": "clang", "CXX": "clang++", "LDSHARED": "clang++ -shared"},
}
CASES = ["1,5,128256", "16,4,32000"]
GOAL = 1.2


def build(name: str, work: Path) -> Path:
    """Builds the extension with one compiler; returns the path of the library."""
    out = work / name
    env = dict(os.environ, **COMPILERS[name])
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "-b", str(out), "-t", str(out / "tmp")], cwd=ROOT, env=env, check=True)
    found = sorted(out.glob("specdec_ext/_C.*.so"))
    if not found:
        raise SystemExit(f"the {name} build produced no library (see the output above)")
    return found[0]


def run_bench(library: Path, target: Path, budget: float, tag: str, out: Path) -> dict:
    shutil.copyfile(library, target)
    command = [sys.executable, "-m", "bench.bench_cpp", "--budget", str(budget), "--tag", tag, "--out", str(out)]
    for case in CASES:
        command += ["--case", case]
    subprocess.run(command, cwd=ROOT, check=True)
    return json.loads(sorted(out.glob(f"cpu-cpp-*-{tag}.json"))[-1].read_text())


def summarise(runs: dict[str, list[dict]]) -> dict:
    summary: dict = {"compilers": {}, "ratios_clang_over_gcc": {}}
    for name, docs in runs.items():
        cases = {}
        for index, case in enumerate(docs[0]["cases"]):
            label = f"B={case['batch']} K={case['k']} V={case['vocab']}"
            cases[label] = {method: round(statistics.median(doc["cases"][index]["methods"][method]["median_us"] for doc in docs), 1) for method in case["methods"]}
        race = {}
        if docs[0].get("race"):
            for isa, modes in docs[0]["race"]["us"].items():
                race[isa] = {line: round(statistics.median(doc["race"]["us"][isa]["seeded"][line] for doc in docs), 1) for line in modes["seeded"]}
        summary["compilers"][name] = {"compiler": docs[0]["kernel"].get("compiler"), "isa": docs[0]["kernel"]["isa"], "cases_median_us": cases, "race_seeded_us": race}
    gcc, clang = summary["compilers"]["gcc"], summary["compilers"]["clang"]
    for label, methods in gcc["cases_median_us"].items():
        summary["ratios_clang_over_gcc"][label] = {m: round(clang["cases_median_us"][label][m] / methods[m], 3) for m in ("cpp", "cpp-nocheck", "kernel") if m in methods}
    for isa, lines in gcc["race_seeded_us"].items():
        summary["ratios_clang_over_gcc"][f"race {isa}"] = {line: round(clang["race_seeded_us"][isa][line] / value, 3) for line, value in lines.items()}
    # On a busy machine whole runs speed up and slow down together: each run's kernel times over the
    # same run's transformers time (Python and torch code, the same for both builds) cancel that out.
    normalised: dict = {}
    for index, case in enumerate(runs["gcc"][0]["cases"]):
        label = f"B={case['batch']} K={case['k']} V={case['vocab']}"

        def relative(name: str, method: str, index: int = index) -> float:
            return statistics.median(doc["cases"][index]["methods"][method]["median_us"] / doc["cases"][index]["methods"]["transformers"]["median_us"] for doc in runs[name])

        normalised[label] = {m: round(relative("clang", m) / relative("gcc", m), 3) for m in ("cpp", "cpp-nocheck", "kernel")}
    summary["ratios_clang_over_gcc_normalised_by_transformers"] = normalised
    worst_raw = max(ratio for case in summary["ratios_clang_over_gcc"].values() for ratio in case.values())
    in_use = runs["gcc"][0]["kernel"]["isa"]
    worst = max([ratio for case in normalised.values() for ratio in case.values()] + list(summary["ratios_clang_over_gcc"].get(f"race {in_use}", {}).values()))
    summary["goal"] = {
        f"clang within {GOAL}x of gcc": {
            "worst_ratio": worst, "pass": worst <= GOAL,
            "basis": f"calls normalised by the same run's transformers time, and the race of the variant this CPU runs ({in_use}); "
            "the other variants' races are listed, not judged (a fallback here, and timed in separate runs)",
        },
        "worst_raw_ratio": worst_raw,
    }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.compare_compilers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs per compiler (default 3)")
    parser.add_argument("--budget", type=float, default=8.0, help="bench_cpp's timing budget per case, seconds (default 8)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--summarise-only", action="store_true", help="summarise the runs already in build/compilers/runs (no build, no timing)")
    args = parser.parse_args(argv)
    args.load_start = load_average()
    work = ROOT / "build" / "compilers"
    if args.summarise_only:
        runs = {name: [json.loads(p.read_text()) for p in sorted((work / "runs").glob(f"cpu-cpp-*-{name}-r*.json"))] for name in COMPILERS}
        args.rounds = len(runs["gcc"])
        return write(runs, args)
    libraries = {name: build(name, work) for name in COMPILERS}
    installed = sorted((ROOT / "specdec_ext").glob("_C.*.so"))
    target = installed[0] if installed else ROOT / "specdec_ext" / libraries["gcc"].name
    saved = work / "installed.so"
    if installed:
        shutil.copyfile(installed[0], saved)
    runs: dict[str, list[dict]] = {name: [] for name in COMPILERS}
    try:
        for round_index in range(args.rounds):
            order = list(COMPILERS) if round_index % 2 == 0 else list(reversed(COMPILERS))
            for name in order:
                runs[name].append(run_bench(libraries[name], target, args.budget, f"{name}-r{round_index}", work / "runs"))
    finally:
        if installed:
            shutil.copyfile(saved, target)
    return write(runs, args)


def write(runs: dict[str, list[dict]], args) -> int:
    doc = {
        **report.header(KIND, "cpu", args.load_start),
        "schema": 1,
        "rounds": args.rounds,
        "note": "bench_cpp on the two large cases, GCC and clang builds alternating; measured with other jobs running on this machine unless the load averages say otherwise",
        **summarise(runs),
    }
    path = report.write_json(doc, report.result_path(args.out, "cpu-cpp-compilers", doc["date"]))
    print(json.dumps({k: doc[k] for k in ("ratios_clang_over_gcc", "ratios_clang_over_gcc_normalised_by_transformers", "goal")}, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
