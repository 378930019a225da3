"""The first H200 measurements (2026-12-04) as a ``gpu-rows`` JSON, read from the suite's bench.log.

That run's goal-row stage printed lines (``goal row | <shape> | <row>: graph replay median X us``,
``kernel | <label> | <kernel>: X us x 1 per call``, ``model row | <name>: ...``) before
``bench/gpu_rows.py`` wrote JSON itself; its inputs were ``3 * randn`` target logits (flat
``0.2 * randn`` for the flat top-p row), the draft the target's plus ``randn``, and only one replay
on an idle device was timed (no back-to-back batches). This maps its labels to the model's calls so
``python -m bench.gpu_rows --compare`` can set them beside the estimate.

    python -m bench.experiments.import_suite_log BENCH_LOG ENV_TXT OUT_JSON
"""

from __future__ import annotations

import re
import sys
from dataclasses import asdict, replace
from pathlib import Path

from bench.gpu_model import Call
from bench.gpu_rows import calls
from bench.harness import report

# The suite's labels -> the model's call names. Its top-p 0.95 lines (3 * randn, T = 1) took the
# whole-line search, as the model's tiny_llama top-p 0.95 row (searched 1.0) does; B=1 top-p 0.95
# has no model row.
LABELS = {
    "B=64 K=8 V=128256 bf16 | unfiltered": "B=64 K=8 V=128256 bf16",
    "B=64 K=8 V=128256 bf16 | T=0.7 top-k 50 top-p 0.9": "B=64 K=8 bf16 T=0.7 top-k 50 top-p 0.9",
    "B=64 K=8 V=128256 bf16 | top-p 0.95": "B=64 K=8 bf16 T=1.0 top-k 0 top-p 0.95, as measured on tiny_llama logits (searched 1.0)",
    "B=64 K=8 V=128256 bf16 | top-k 1000 (whole-line search)": "B=64 K=8 bf16 top-k 1000 (whole-line search)",
    "B=64 K=8 V=128256 bf16 | flat top-p 0.99 (whole-line search)": "B=64 K=8 bf16 flat top-p 0.99 (whole-line search)",
    "B=1 K=4 V=128256 fp32 | unfiltered": "B=1 K=4 V=128256 fp32",
    "B=1 K=4 V=128256 fp32 | T=0.7 top-k 50 top-p 0.9": "B=1 K=4 fp32 T=0.7 top-k 50 top-p 0.9",
    "B=1 K=4 V=128256 fp32 | top-p 0.95": "B=1 K=4 fp32 top-p 0.95 (whole-line search; no model row)",
    "B=1 K=4 V=128256 fp32 | top-k 1000 (whole-line search)": "B=1 K=4 fp32 top-k 1000 (whole-line search)",
    "B=1 K=4 V=128256 fp32 | flat top-p 0.99 (whole-line search)": "B=1 K=4 fp32 flat top-p 0.99 (whole-line search)",
}


def _unlisted(name: str, known: dict[str, Call]) -> Call:
    """The two rows the goal, block and tree calls lack: top-p 0.95 lines searched whole."""
    if name.startswith("B=64"):
        return replace(known["B=64 K=8 bf16 top-p 0.95"], name=name, search_fraction=1.0)
    return replace(known["B=1 K=4 V=128256 fp32"], name=name, top_p=0.95, search_fraction=1.0)


def parse(log: str) -> list[dict]:
    """Rows in the order the log has them, each with its replay median and kernel times."""
    known = {call.name: call for call in calls()}
    rows: dict[str, dict] = {}
    for line in log.splitlines():
        if m := re.match(r"goal row \| (.+? \| .+?): graph replay median ([\d.]+) us", line):
            label, us = m.group(1), float(m.group(2))
        elif m := re.match(r"model row \| (.+?): graph replay median ([\d.]+) us", line):
            label, us = m.group(1), float(m.group(2))
        elif m := re.match(r"kernel \| (.+) \| (\w+): ([\d.]+) us x", line):
            rows[m.group(1)]["kernels_us"][m.group(2)] = float(m.group(3))
            continue
        else:
            continue
        name = LABELS.get(label, label)
        call = known.get(name) or _unlisted(name, known)
        rows[label] = {"call": asdict(call) | {"name": name}, "suite_label": label, "replay_us": us, "back_to_back_us": None, "kernels_us": {}}
    return list(rows.values())


def main(argv: list[str]) -> int:
    log, env_text, out = Path(argv[0]).read_text(), Path(argv[1]).read_text(), Path(argv[2])
    versions = dict(re.findall(r"^(triton|transformers) (\S+)$", env_text, re.M))
    torch_version = re.search(r"\| torch (\S+) \| cuda (\S+)", env_text)
    doc = {
        "kind": "measurement: the GPU model's calls, one CUDA-graph replay on an idle device (median of 50) and kernel times (torch.profiler), "
                "read from the GPU suite's bench.log",
        "date": re.search(r"\| (2026-\d\d-\d\dT[\d:]+\+00:00) \|", log).group(1),
        "device": "NVIDIA H200",
        "device_type": "cuda",
        "machine": {"gpu": re.search(r"^NVIDIA H200, .*$", env_text, re.M).group(0), "runtime": "gVisor sandbox (graph submission costs ~16 us)"},
        "versions": {"python": re.search(r"^python (\S+)", env_text, re.M).group(1), "torch": torch_version.group(1), "cuda": torch_version.group(2),
                     **versions, "git_commit": "d6c4e4c"},
        "inputs": "target 3*randn (flat rows: 0.2*randn), draft = target + randn",
        "rows": parse(log),
    }
    report.write_json(doc, out)
    print(f"wrote {out} ({len(doc['rows'])} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
