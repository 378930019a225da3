"""Clocks and statistics shared by the benchmarks.

* :func:`time_rotated`: one call at a time on rotated input copies, after a warm-up call; CPU:
  ``time.perf_counter`` per call; CUDA: CUDA events around each call, the calls issued back to back
  (launch overhead the GPU cannot hide is included) and the host's time per call over the same loop.
* :func:`take_turns`: several methods timed side by side, round after round in a new random order,
  so a machine that gets busier slows them alike and no method always runs after the same one.
* :func:`timed`: one call, bracketed by device synchronisations (end-to-end runs).
* :func:`capture_cuda_graph`: a call captured once, replayed by the timers as a serving loop would.

Nothing here imports torch at module level: a benchmark may set environment variables (e.g.
``TRITON_INTERPRET``) before torch and specdec_ext are first imported.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .memory import PeakMemory


@dataclass
class Timing:
    median_s: float
    p20_s: float
    p80_s: float
    reps: int
    wall_s: float | None = None  # CUDA: host time per call over the back-to-back loop


def quantile(values: list[float], q: float, *, inclusive: bool = False) -> float:
    """The sorted values at rank ``int(q * n)`` (capped at the last), or with ``inclusive`` at rank
    ``int(q * (n - 1))``. No interpolation: a quantile is a time some call really took. Both ranks
    stay in use so figures compare with the results already saved by each benchmark."""
    ordered = sorted(values)
    if inclusive:
        return ordered[int(q * (len(ordered) - 1))]
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise(times: list[float], wall: float | None = None) -> Timing:
    """Median, 20th and 80th percentiles of per-call seconds."""
    return Timing(statistics.median(times), quantile(times, 0.2), quantile(times, 0.8), len(times), wall)


def time_rotated(calls: list[Callable[[], object]], device: str, budget_s: float, min_reps: int = 3, max_reps: int = 200,
                 memory: bool = False) -> tuple[Timing, int | None]:
    """Median time of calls taken in rotation, after a warm-up call (JIT compiles, lazy imports).

    With ``memory``, one call after the warm-up also gives the peak extra memory (CUDA: the call
    that sizes the loop; CPU: the first timed call, its clock read inside the measurement), so
    slow baselines do not pay an extra call for it.
    """
    if device == "cuda":
        return _time_cuda(calls, budget_s, min_reps, max_reps, memory)
    start = time.perf_counter()
    calls[0]()
    if time.perf_counter() - start > 2.0:  # multi-second calls: two timed ones keep the CPU grid short
        min_reps = 2
    times: list[float] = []
    peak = None
    spent = 0.0
    while len(times) < max_reps and (len(times) < min_reps or spent < budget_s):
        call = calls[(len(times) + 1) % len(calls)]
        with PeakMemory(device if memory and not times else None) as meter:
            start = time.perf_counter()
            call()
            elapsed = time.perf_counter() - start
        if memory and not times:
            peak = meter.bytes
        times.append(elapsed)
        spent += elapsed
    return summarise(times), peak


def _time_cuda(calls, budget_s, min_reps, max_reps, memory) -> tuple[Timing, int | None]:
    import torch

    calls[0]()  # compiles on first use
    with PeakMemory("cuda" if memory else None) as meter:
        start = time.perf_counter()
        calls[1 % len(calls)]()
        torch.cuda.synchronize()
        estimate = max(time.perf_counter() - start, 1e-6)
    if estimate > 0.2:
        min_reps = 2
    reps = max(min_reps, min(max_reps, int(budget_s / estimate)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    torch.cuda.synchronize()
    loop_start = time.perf_counter()
    for i, (begin, end) in enumerate(events):
        begin.record()
        calls[i % len(calls)]()
        end.record()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - loop_start) / reps
    return summarise([begin.elapsed_time(end) / 1e3 for begin, end in events], wall), meter.bytes


def take_turns(calls: Mapping[str, Callable[[], object]], *, min_rounds: int, max_rounds: int, budget_s: float = 0.0, warmup: int = 1,
               untimed: int = 0, samples: int = 1, block: int = 1, gc_every: int | None = None) -> dict[str, list[float]]:
    """Per-call seconds of every method, timed side by side on the CPU clock.

    Every method first runs ``warmup`` times (lazy imports, first-touch allocations, caches). Then,
    round after round in a new random order, each method takes a turn: ``untimed`` calls (so the
    timed ones start from the method's own warm caches, not from whatever the previous one left),
    then ``samples`` samples, each the mean over a block of ``block`` calls. Rounds go on until
    ``min_rounds`` are done and ``budget_s`` is spent, ``max_rounds`` at most. With ``gc_every``,
    Python's cyclic GC is off while timing (as in ``timeit``: a collection triggered by one method is
    not charged to the next) and runs, untimed, every ``gc_every`` rounds.
    """
    for call in calls.values():
        for _ in range(warmup):
            call()
    found: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls.items())
    shuffle = random.Random(0).shuffle
    if gc_every:
        gc.collect()
        gc.disable()
    try:
        start = time.perf_counter()
        rounds = 0
        while rounds < max_rounds and (rounds < min_rounds or time.perf_counter() - start < budget_s):
            shuffle(order)
            for name, call in order:
                for _ in range(untimed):
                    call()
                for _ in range(samples):
                    found[name].append(_time_block(call, block))
            rounds += 1
            if gc_every and rounds % gc_every == 0:
                gc.collect()
    finally:
        if gc_every:
            gc.enable()
    return found


def _time_block(call: Callable[[], object], block: int) -> float:
    if block == 1:  # no loop inside the clock reads: microsecond calls are timed alone
        t0 = time.perf_counter()
        call()
        return time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(block):
        call()
    return (time.perf_counter() - t0) / block


def timed(fn: Callable[[], object], device) -> tuple[object, float]:
    """``fn()`` and the seconds it took, the device synchronised before and after."""
    import torch

    on_cuda = getattr(device, "type", device) == "cuda"
    if on_cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if on_cuda:
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start


def capture_cuda_graph(run: Callable[[], object], warmup: int = 3):
    """Capture ``run()`` in a CUDA graph; returns the graph and the outputs each replay rewrites.

    Warm-up runs on a side stream first (Triton compiles, cached tensors and allocator pools
    settle), as PyTorch's CUDA-graph notes advise. The default CUDA generator is graph-safe: every
    replay of a verify call draws a fresh Philox key.
    """
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = run()
    return graph, outputs
