"""``python -m bench.e2e_runs``: ``python -m bench.e2e`` several times in a row, each in its own process
(its own rounds), and the median of every goal ratio over the runs.

One run's ratios move by ±5 % with the machine (each method's tokens/s is the median of its rounds,
and the assisted loops' step counts vary with the sampled text), so the goals are judged on the
median of several consecutive runs. Writes bench/results/e2e-<device>-<date>-runs.json: each run's
goals and load average, and the medians; prints the medians as a table.

    python -m bench.e2e_runs --runs 5 -- --threads 1 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .harness import report as results
from .harness.env import load_average
from .harness.report import markdown_table

RESULTS = results.RESULTS_DIR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("e2e_args", nargs="*", help="arguments for bench.e2e (after --)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        raise ValueError(f"--runs must be >= 1, got {args.runs}")
    runs, report = [], None
    load_start = load_average()
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(args.runs):
            out = Path(scratch) / str(index)
            subprocess.run([sys.executable, "-m", "bench.e2e", *args.e2e_args, "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
            report = json.loads(next(out.glob("e2e-*.json")).read_text())
            if not report.get("goals"):
                raise ValueError("bench.e2e wrote no goals (--quick, or a GPU run): nothing to take the median of")
            runs.append({"run": index + 1, "load_average": report["load_average"], "goals": report["goals"]})
            print(f"run {index + 1}/{args.runs}: " + "; ".join(
                f"{setting}: default call {goal['hook B=1 vs transformers assisted, default call (goal >= 1.3)']:.2f}x" for setting, goal in report["goals"].items()),
                flush=True)
    medians = {setting: {name: statistics.median(run["goals"][setting][name] for run in runs) for name in goal}
               for setting, goal in runs[0]["goals"].items()}
    kind = f"measurement: {args.runs} consecutive runs of `python -m bench.e2e {' '.join(args.e2e_args)}`, each in its own process"
    summary = {
        **results.header(kind, report["device_type"], load_start),
        "num_draft_tokens": report["num_draft_tokens"], "max_new_tokens": report["max_new_tokens"], "median_over_runs": medians, "runs": runs,
    }
    path = results.write_json(summary, results.result_path(args.out, "e2e", summary["date"], report["device_type"], tag="runs"))
    table = [[setting, name, *(f"{run['goals'][setting][name]:.2f}" for run in runs), f"{value:.2f}"] for setting, goal in medians.items() for name, value in goal.items()]
    print(markdown_table(["setting", "goal", *(f"run {run['run']}" for run in runs), "median"], table))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
