"""``python -m bench``: the verification / sampling microbenchmark grid.

Prints a table and the goals, and writes ``<out>/<device>-<date>[-tag].json`` and ``.png``
(see bench/results/README.md). ``--summary FILE`` prints the table of an existing result file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description="Microbenchmarks of specdec_ext.verify / sample against transformers, the eager reference and the memory-traffic floor.")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available, else cpu")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_const", dest="size", const="quick", help="a few small cases (seconds): checks that everything runs")
    size.add_argument("--full", action="store_const", dest="size", const="full", help="the whole grid (the CUDA default; long on CPU)")
    size.add_argument("--smoke", action="store_const", dest="size", const="smoke", help="tiny shapes only (for dry runs of the GPU suite)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON and PNG (default: bench/results)")
    parser.add_argument("--tag", default=None, help="suffix of the file names (default: the grid size, or 'partial' for a filtered default grid)")
    parser.add_argument("--backends", default=None, help="comma-separated subset, e.g. triton,transformers")
    parser.add_argument("--match", default=None, metavar="TEXT", help="only cases whose label contains TEXT, e.g. 'verify B=1 K=5 V=128256'")
    parser.add_argument("--ops", default="verify,sample", help="verify, sample or both (default)")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS", help="stop starting new cases after this long; the rest are recorded as skipped")
    parser.add_argument("--measure-budget", type=float, default=None, metavar="SECONDS", help="timing budget per (case, backend) (default 0.1 on CUDA, 0.3 on CPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice; 1 on a loaded machine, see bench/results/README.md)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--summary", type=Path, default=None, metavar="JSON", help="print the table and goals of a result file and exit")
    parser.add_argument("--goals-only", action="store_true", help="with --summary: print only the header and the goals")
    parser.add_argument("--plot", action="store_true", help="with --summary: redraw the PNG next to the JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from . import micro, micro_report
    from .harness.report import write_json

    if args.summary is not None:
        doc = json.loads(args.summary.read_text())
        print(micro_report.format_header(doc))
        if not args.goals_only:
            print(micro_report.format_table(doc))
        print(micro_report.format_goals(doc))
        if args.plot:
            micro_report.write_plot(doc, args.summary.with_suffix(".png"))
        return 0

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    size = args.size or "default"
    backends = args.backends.split(",") if args.backends else None
    ops = tuple(op for op in args.ops.split(",") if op)
    started = time.time()
    doc = micro.run(device, size, backends=backends, ops=ops, time_budget_s=args.time_budget, measure_budget_s=args.measure_budget, match=args.match, log=lambda line: print(line, flush=True))
    out_dir = args.out or micro.RESULTS_DIR
    # Only a whole default grid takes the plain <device>-<date> name, so a partial run never
    # overwrites the day's full result.
    partial = args.match or backends or set(ops) != {"verify", "sample"}
    tag = args.tag if args.tag is not None else (size if size != "default" else ("partial" if partial else None))
    json_path, png_path = micro_report.output_paths(doc, out_dir, tag)
    write_json(doc, json_path)
    plotted = False
    if not args.no_plot:
        try:
            plotted = micro_report.write_plot(doc, png_path)
        except Exception as error:  # a plotting problem must not cost the measurements
            print(f"plot failed: {type(error).__name__}: {error}", file=sys.stderr)
    print()
    print(micro_report.format_header(doc))
    print(micro_report.format_table(doc))
    print()
    print(micro_report.format_goals(doc))
    print(f"\nwrote {json_path}" + (f" and {png_path}" if plotted else "") + f" in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
