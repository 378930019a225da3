"""``python -m bench.experiments.race_ab``: the race before and after stream v2, in one process.

Takes the stream-v1 kernels (csrc/ at ``--before``, default: the commit before contract v2) out of
git history, compiles them with their namespace renamed beside the current kernels, and times the
bonus race over 128256-entry lines alternately on one thread (bench/experiments/race_ab/race_ab.cpp): the
B=1 case's line, an LLM-like peaked line and a flat line. Same process, same machine state, so
the ratio holds even on a busy machine. Writes ``bench/results/cpu-race-v1-v2-<date>.json``.

The kernels' race arguments have changed since (csrc/kernel.h: ``RaceArgs`` lost ``one_hot``), so
race_ab.cpp builds only against the csrc/ of its time: check out d7752c8, which wrote the kept
result, to rerun it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from ..harness import report
from ..harness.env import ROOT, load_average

RESULTS_DIR = report.RESULTS_DIR
KIND = "measurement: the bonus race of the stream-v1 and the current kernels, alternating in one process"
BEFORE = "f4b2734"  # main before contract v2 (stream v1)
KERNEL_FILES = ["kernel.h", "kernel_impl.h", "kernel_avx2.cpp", "kernel_avx512.cpp", "kernel_base.cpp", "fastmath.h", "philox.h"]
FLAGS = ["-std=c++17", "-O3", "-ffp-contract=off", "-fno-trapping-math", "-fno-math-errno", "-Wno-psabi"]


def baseline_flags() -> list[str]:
    return ["-march=x86-64", "-mtune=generic"] if platform.machine().lower() in ("x86_64", "amd64") else []


def build(before: str, work: Path, cxx: str) -> Path:
    old = work / "v1"
    old.mkdir(parents=True, exist_ok=True)
    for name in KERNEL_FILES:
        source = subprocess.run(["git", "show", f"{before}:csrc/{name}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        (old / name).write_text(source)
    csrc = ROOT / "csrc"
    jobs = []
    for name in ("kernel_avx2", "kernel_avx512", "kernel_base"):
        extra = baseline_flags() if name == "kernel_base" else []
        jobs.append([cxx, *FLAGS, *extra, "-Dspecdec=specdec_v1", f"-I{old}", "-c", str(old / f"{name}.cpp"), "-o", str(work / f"v1_{name}.o")])
        jobs.append([cxx, *FLAGS, *extra, f"-I{csrc}", "-c", str(csrc / f"{name}.cpp"), "-o", str(work / f"v2_{name}.o")])
    jobs.append([cxx, *FLAGS, f"-I{csrc}", "-c", str(Path(__file__).resolve().parent / "race_ab" / "race_ab.cpp"), "-o", str(work / "race_ab.o")])
    running = [subprocess.Popen(job) for job in jobs]
    if any(process.wait() != 0 for process in running):
        raise SystemExit("compiling the race A/B failed")
    binary = work / "race_ab"
    subprocess.run([cxx, "-o", str(binary), *sorted(str(p) for p in work.glob("*.o"))], check=True)
    return binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.race_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help=f"git revision of the stream-v1 kernels (default {BEFORE})")
    parser.add_argument("--reps", type=int, default=31, help="alternating repetitions per line and instruction set")
    parser.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    binary = build(args.before, ROOT / "build" / "race-ab", args.cxx)
    load_start = load_average()
    measured = json.loads(subprocess.run([str(binary), str(args.reps)], capture_output=True, text=True, check=True).stdout)
    for lines in measured["us"].values():
        for values in lines.values():
            values["speedup"] = round(values["stream_v1_us"] / values["stream_v2_us"], 2)
    version = subprocess.run([args.cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    doc = {
        **report.header(KIND, "cpu", load_start),
        "schema": 1,
        "compiler": version,
        "before": args.before,
        "what": "median us per bonus race over one 128256-entry line, one thread, 8192-id chunks; v1: one Philox evaluation per id; "
        "v2: one per four ids, logit-space and per-id exponential pruning, bound seeded with the argmax",
        "note": "v1 and v2 alternate in one process, so the ratio holds under load; absolute figures measured with other jobs running unless the load averages say otherwise",
        **measured,
    }
    path = report.write_json(doc, report.result_path(args.out, "cpu-race-v1-v2", doc["date"]))
    for isa, lines in doc["us"].items():
        for name, values in lines.items():
            print(f"{isa:<7} {name:<12} stream v1 {values['stream_v1_us']:8.1f} us   stream v2 {values['stream_v2_us']:8.1f} us   {values['speedup']:.2f}x")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
