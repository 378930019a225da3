"""Record the golden outputs: ``python -m tests.golden.record`` (from the repository root).

Run once on the code whose outputs are the reference; tests/exactness/test_golden.py compares every later
build with them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from tests.golden.cases import all_cases, backends_for, key  # noqa: E402

OUTPUTS = Path(__file__).with_name("outputs.json")


def main() -> int:
    import specdec_ext

    torch.set_num_threads(2)
    records = {}
    start = time.time()
    for kind, name, run in all_cases():
        for backend in backends_for(kind):
            if backend not in specdec_ext.available_backends("cpu"):
                print(f"skip {kind}/{name}/{backend}: not available", file=sys.stderr)
                continue
            records[key(kind, name, backend)] = run(backend)
        print(f"{kind}/{name} done ({time.time() - start:.0f} s)", file=sys.stderr)
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    OUTPUTS.write_text(json.dumps({"recorded_from": commit, "torch": torch.__version__, "records": records}, indent=None, sort_keys=True) + "\n")
    print(f"{len(records)} records -> {OUTPUTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
