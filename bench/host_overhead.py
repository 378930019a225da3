"""``python -m bench.host_overhead``: what a call costs the host, beside a bare ``torch.empty`` of its output.

Rows, all timed side by side in one run (the cases take turns, block after block, and each figure is
the median over the blocks), each beside ``torch.empty`` of the call's output shape:

* **cpp**: ``verify`` / ``sample`` on the C++ backend at the tiny input (B=1, K=4, V=64, where the
  kernel's own work is negligible), the default calls and the prepared ones (:class:`specdec_ext.Verifier`
  / :class:`specdec_ext.Sampler`, keyed by the default generator or by seeds);
* **triton**: the Triton launcher path as it runs for a GPU up to the kernel launches (validation,
  keys, launch templates, outputs), on CPU tensors with every kernel replaced by a launcher that does
  nothing, so only specdec_ext's own Python is timed; unfiltered and filtered (T=0.7, top-k 50,
  top-p 0.9), ``check=False`` (the no-op kernels write no tokens to check), at the tiny input and at
  the GPU model's B=1, K=4, V=128256; and the prepared verifier with its checks and outputs in Python,
  as it runs without the C++ extension (with it they take one trip to C++).

The ratio to ``torch.empty`` is how the GPU model (``bench/gpu_model.py``, ``python_call_overhead_us``)
scales this host to a fast one. Writes ``bench/results/host-overhead-<date>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics

from .harness import report
from .harness.env import load_average
from .harness.timing import take_turns

RESULTS_DIR = report.RESULTS_DIR
KIND = "measurement: host time per call beside torch.empty of its output (C++ kernel; Triton launcher path with no-op kernels, CPU tensors)"
TINY = (1, 4, 64)  # B, K, V
MODEL = (1, 4, 128256)
FILTERED = {"temperature": 0.7, "top_k": 50, "top_p": 0.9}


def _no_launch(kernel):
    """Stands in for a ``@triton.jit`` kernel: Triton's own launch interface (``KernelInterface``:
    ``kernel[grid](*args)`` is its lambda calling ``kernel.run(*args, grid=grid, warmup=False)``)
    around a ``run`` of the same signature that does nothing, so a launch costs what it costs up to
    Triton's launcher, whichever way the launcher is called, and nothing of the launcher's work. It
    keeps the kernel's parameter names (``arg_names``), from which the launcher passes constexprs
    by position, so the launches it times are the ones a GPU gets."""
    from triton.runtime.jit import KernelInterface

    class NoLaunch(KernelInterface):
        def __init__(self, arg_names):
            self.arg_names = arg_names

        def run(self, *args, grid, warmup, **kwargs):
            return None

    return NoLaunch(kernel.arg_names)


@contextlib.contextmanager
def _without_cpp_outputs():
    from specdec_ext import _cpp_backend

    original = _cpp_backend.launch_outputs
    _cpp_backend.launch_outputs = lambda *args: None
    try:
        yield
    finally:
        _cpp_backend.launch_outputs = original


def side_by_side(cases: dict, rounds: int, calls: int) -> dict[str, tuple[float, float]]:
    """(median, best) µs per call of every case over the rounds, the cases taking turns in a shuffled
    order (one block of ``calls`` each per round, after 50 warm-up calls: caches, plans, templates,
    workspace). The best block is the one least disturbed by other jobs."""
    samples = take_turns(cases, min_rounds=rounds, max_rounds=rounds, warmup=50, block=calls)
    return {name: (statistics.median(values) * 1e6, min(values) * 1e6) for name, values in samples.items()}


def _inputs(torch, batch: int, k: int, vocab: int):
    g = torch.Generator().manual_seed(0)
    target = torch.randn(batch, k + 1, vocab, generator=g)
    draft = torch.randn(batch, k, vocab, generator=g)
    tokens = torch.randint(0, vocab, (batch, k), generator=g)
    return target, draft, tokens, target[:, 0].contiguous()


def cases() -> tuple[dict, dict]:
    """(name -> call, name -> the torch.empty it is compared with)."""
    os.environ["TRITON_INTERPRET"] = "1"  # the Triton path on CPU tensors (its kernels are replaced below)
    import torch

    import specdec_ext
    from specdec_ext import _dispatch, _triton_backend

    torch.set_num_threads(1)
    kernels = _triton_backend.kernels()
    for name in kernels.__all__:
        setattr(kernels, name, _no_launch(getattr(kernels, name)))
    _triton_backend._SETUPS.clear()
    _dispatch.forget()  # no plan or runner holds the real kernels

    found, references = {}, {}

    def add(name, fn, output_shape):
        found[name] = fn
        references[name] = f"torch.empty{output_shape}"
        references.setdefault(f"torch.empty{output_shape}", None)
        found.setdefault(f"torch.empty{output_shape}", lambda shape=output_shape: torch.empty(shape, dtype=torch.int64))

    batch, k, vocab = TINY
    target, draft, tokens, logits = _inputs(torch, batch, k, vocab)
    seeds = torch.arange(batch, dtype=torch.int64)
    verifier = specdec_ext.Verifier(batch, k, vocab, backend="cpp")
    sampler = specdec_ext.Sampler(batch, vocab, backend="cpp")
    add("cpp verify", lambda: specdec_ext.verify(target, draft, tokens), (batch, k + 1))
    add("cpp sample", lambda: specdec_ext.sample(logits), (batch,))
    add("cpp Verifier, generator", lambda: verifier(target, draft, tokens), (batch, k + 1))
    add("cpp Verifier, seeds", lambda: verifier(target, draft, tokens, seeds=seeds), (batch, k + 1))
    add("cpp Sampler, generator", lambda: sampler(logits), (batch,))
    add("cpp Sampler, seeds", lambda: sampler(logits, seeds=seeds), (batch,))
    for label, params in (("", {}), (" filtered", FILTERED)):
        prepared = specdec_ext.Verifier(batch, k, vocab, backend="triton", check=False, **params)
        prepared_sampler = specdec_ext.Sampler(batch, vocab, backend="triton", check=False, **params)
        add(f"triton verify{label}", lambda p=params: specdec_ext.verify(target, draft, tokens, backend="triton", check=False, **p), (batch, k + 1))
        add(f"triton sample{label}", lambda p=params: specdec_ext.sample(logits, backend="triton", check=False, **p), (batch,))
        add(f"triton Verifier{label}, generator", lambda v=prepared: v(target, draft, tokens), (batch, k + 1))
        add(f"triton Verifier{label}, seeds", lambda v=prepared: v(target, draft, tokens, seeds=seeds), (batch, k + 1))
        add(f"triton Sampler{label}, generator", lambda s=prepared_sampler: s(logits), (batch,))
        add(f"triton Sampler{label}, seeds", lambda s=prepared_sampler: s(logits, seeds=seeds), (batch,))
        # The same prepared call with its checks and outputs in Python, as without the C++ extension
        # (its run is written at the first call, here, while the extension's trip is hidden).
        python_host = specdec_ext.Verifier(batch, k, vocab, backend="triton", check=False, **params)
        with _without_cpp_outputs():
            python_host(target, draft, tokens)
        add(f"triton Verifier{label}, generator, Python checks", lambda v=python_host: v(target, draft, tokens), (batch, k + 1))
    batch, k, vocab = MODEL
    big_target, big_draft, big_tokens, _ = _inputs(torch, batch, k, vocab)
    for label, params in (("", {}), (" filtered", FILTERED)):
        add(f"triton verify{label}, V={vocab}", lambda p=params: specdec_ext.verify(big_target, big_draft, big_tokens, backend="triton", check=False, **p),
            (batch, k + 1))
    return found, {name: ref for name, ref in references.items() if ref is not None}


def measure(rounds: int = 300, calls: int = 50) -> dict:
    calls_by_name, references = cases()
    us = side_by_side(calls_by_name, rounds, calls)
    rows = [{"call": name, "reference": ref, "median_us": round(us[name][0], 2), "reference_median_us": round(us[ref][0], 2),
             "ratio": round(us[name][0] / us[ref][0], 2), "best_us": round(us[name][1], 2), "reference_best_us": round(us[ref][1], 2),
             "best_ratio": round(us[name][1] / us[ref][1], 2)}
            for name, ref in references.items()]
    return {"tiny": dict(zip(("batch", "k", "vocab"), TINY, strict=True)), "model": dict(zip(("batch", "k", "vocab"), MODEL, strict=True)), "rows": rows,
            "method": f"{rounds} rounds, every case {calls} calls per round, in a shuffled order; per case the median and the best of the rounds' means; one thread"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.host_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--out", default=RESULTS_DIR, help="folder for the JSON (default: bench/results)")
    options = parser.parse_args(argv)
    load_start = load_average()
    result = measure(options.rounds, options.calls)
    doc = {**report.header(KIND, "cpu", load_start), **result}
    width = max(len(row["call"]) for row in result["rows"])
    print(f"{'call':<{width}}  {'median':>9}  {'ratio':>6}  {'best':>9}  {'ratio':>6}  reference (median / best)")
    for row in result["rows"]:
        print(f"{row['call']:<{width}}  {row['median_us']:6.2f} us  {row['ratio']:5.2f}x  {row['best_us']:6.2f} us  {row['best_ratio']:5.2f}x  "
              f"{row['reference']} ({row['reference_median_us']:.2f} / {row['reference_best_us']:.2f} us)")
    print(f"load average before {doc['load_average']['start']}, after {doc['load_average']['end']}")
    if not options.no_write:
        path = report.write_json(doc, report.result_path(options.out, "host-overhead", doc["date"]))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
