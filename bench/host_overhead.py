"""``python -m bench.host_overhead``: what ``specdec_ext.verify(..., backend="triton")`` costs the
host in Python, without a GPU.

The Triton launcher path runs as on a GPU up to the kernel launches (validation, the key, the cached
launch templates, the outputs), on CPU tensors with every kernel replaced by a launcher that does
nothing, so only specdec_ext's own Python is timed. An empty ``torch.empty(1)`` is timed beside it:
the ratio of the two is how the GPU model (``bench/gpu_model.py``, ``python_call_overhead_us``)
scales this host to a fast one. Writes ``bench/results/host-overhead-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


class _NoLaunch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _median_us(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def measure(batch: int = 1, k: int = 4, vocab: int = 128256, reps: int = 3000) -> dict:
    os.environ["TRITON_INTERPRET"] = "1"  # the Triton path on CPU tensors (its kernels are replaced below)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import torch

    import specdec_ext
    from specdec_ext import _triton_backend

    torch.set_num_threads(1)
    kernels = _triton_backend.kernels()
    for name in kernels.__all__:
        setattr(kernels, name, _NoLaunch())
    _triton_backend._SETUPS.clear()
    g = torch.Generator().manual_seed(0)
    target = torch.randn(batch, k + 1, vocab, generator=g)
    draft = torch.randn(batch, k, vocab, generator=g)
    tokens = torch.randint(0, vocab, (batch, k), generator=g)
    found = {}
    # (check=True adds a read of the token column, which the no-op kernels leave unwritten.)
    for name, kwargs in (("verify, check=False", {}), ("verify, T=0.7 top-k 50 top-p 0.9, check=False", {"top_k": 50, "top_p": 0.9, "temperature": 0.7})):
        def call(kwargs=kwargs):
            return specdec_ext.verify(target, draft, tokens, backend="triton", check=False, **kwargs)

        for _ in range(50):  # templates, workspace
            call()
        found[name] = round(_median_us(call, reps), 1)
    empty_us = round(_median_us(lambda: torch.empty(1), reps), 2)
    return {"batch": batch, "k": k, "vocab": vocab, "python_us": found, "torch_empty_us": empty_us}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.host_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true")
    options = parser.parse_args(argv)
    result = measure()
    import torch
    import triton

    report = {
        "kind": "measurement: Python host time per call, kernels replaced by no-op launchers (CPU tensors)",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "machine": platform.processor() or platform.machine(),
        "load_average": os.getloadavg(),
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__, "triton": triton.__version__},
        **result,
    }
    print(json.dumps(report, indent=1))
    if not options.no_write:
        path = RESULTS_DIR / f"host-overhead-{report['date']}.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
