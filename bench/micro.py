"""Microbenchmarks of :func:`specdec_ext.verify` and :func:`specdec_ext.sample` against the memory floor.

Every (case, backend) pair is timed on several copies of its inputs, used in rotation, so a small
case cannot run from a cache that a real decoding step would not have warmed. On CUDA each call is
bracketed by CUDA events and the calls run back to back (no sync in between), so the time includes
whatever launch overhead the GPU cannot hide; on CPU each call is timed with ``time.perf_counter``.
The reported latency is the median.

The memory-traffic floor of a case is the bytes any exact verifier must read: every logits row once,
plus one target row and one draft row per request for the resample (``sample``: the logits once plus
one row per request). Dividing by the copy bandwidth measured in the same run (``dst.copy_(src)``,
read + write) gives the floor time; ``x_floor`` is latency / floor time. Peak extra memory is what one
call allocates on top of its inputs: ``torch.cuda.max_memory_allocated`` on CUDA, the peak resident
set (VmHWM after a reset, Linux only) on CPU, "n/a" where neither works.
"""

from __future__ import annotations

import ctypes
import datetime
import inspect
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import specdec_ext

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# "With filters" means all three at once: the slowest path of every backend (threshold search).
FILTERS = {"temperature": 0.8, "top_k": 50, "top_p": 0.9}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FUSED = ("triton", "cpp")
BASELINE = {"verify": "transformers", "sample": "multinomial"}
# CUDA: verify(check=False) captured once in a CUDA graph and replayed, as a serving loop that
# captures its decode step runs it: what is left when no launch is issued from Python.
GRAPHED = "triton-graph"
GRAPHED_MAX_BATCH = 8  # launch overhead matters at small batches only
GRAPHED_MAX_SETS = 64  # one graph per rotated input set: cases needing more copies are left out

# The grid of the issue; the CPU default is a reduced grid that finishes in minutes on 2 cores and
# still holds the two reference points (B=1, K=5, V=128256 and B=16, K=4, V=32000).
GRIDS = {
    "full": {"batch": (1, 8, 64, 256), "k": (1, 4, 8), "vocab": (32000, 128256, 151936)},
    "cpu-default": {"batch": (1, 16), "k": (4, 5), "vocab": (32000, 128256)},
    "quick": {"batch": (1, 8), "k": (4,), "vocab": (32000,)},
    "smoke": {"batch": (1, 2), "k": (2,), "vocab": (1000,)},
}


@dataclass(frozen=True)
class Case:
    op: str  # "verify": (B, K+1, V) target + (B, K, V) draft logits; "sample": (B, V) logits
    batch: int
    k: int  # draft tokens per row (0 for sample)
    vocab: int
    dtype: str  # key of DTYPES
    filters: bool  # FILTERS on (temperature, top-k and top-p) or off (temperature 1, nothing cut)
    check: bool = False  # check=True validates values: one more pass over the logits and a host sync

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize

    @property
    def logits_elements(self) -> int:
        if self.op == "sample":
            return self.batch * self.vocab
        return self.batch * (2 * self.k + 1) * self.vocab

    @property
    def floor_bytes(self) -> int:
        """Bytes an exact verifier must read: each logits row once, then the rows it resamples from."""
        rows_resampled = 1 if self.op == "sample" or self.k == 0 else 2  # target row (+ draft row)
        return (self.logits_elements + rows_resampled * self.batch * self.vocab) * self.itemsize

    def label(self) -> str:
        k = f" K={self.k}" if self.op == "verify" else ""
        extra = (" filters" if self.filters else "") + (" check" if self.check else "")
        return f"{self.op} B={self.batch}{k} V={self.vocab} {self.dtype}{extra}"


def make_grid(device: str, size: str = "default", ops: tuple[str, ...] = ("verify", "sample")) -> list[Case]:
    """The cases of one run, the issue's reference points first (so a time budget never drops them)."""
    if size == "default":
        size = "full" if device == "cuda" else "cpu-default"
    grid = GRIDS[size]
    cases: list[Case] = []
    if size != "smoke":
        cases += goal_cases(device)
    for batch in grid["batch"]:
        for k in grid["k"]:
            for vocab in grid["vocab"]:
                for dtype in DTYPES:
                    for filters in (False, True):
                        cases.append(Case("verify", batch, k, vocab, dtype, filters))
    for batch in grid["batch"]:
        for vocab in grid["vocab"]:
            for dtype in DTYPES:
                for filters in (False, True):
                    cases.append(Case("sample", batch, 0, vocab, dtype, filters))
    unique = list(dict.fromkeys(cases))
    return [c for c in unique if c.op in ops]


def run_order(cases: list[Case], device: str) -> list[Case]:
    """Reference points first, then cheapest first: a run cut short by its time budget still
    covers every backend and shape family, and drops only the largest cases."""
    goals = [c for c in cases if c in set(goal_cases(device))]
    rest = sorted((c for c in cases if c not in set(goals)), key=lambda c: c.logits_elements * c.itemsize * (4 if c.filters else 1))
    return goals + rest


def goal_cases(device: str) -> list[Case]:
    if device == "cuda":
        return [
            Case("verify", 1, 4, 128256, "fp32", False),
            Case("verify", 1, 4, 128256, "bf16", False),
            Case("verify", 1, 4, 128256, "fp32", False, check=True),  # what check=True costs at batch 1
            Case("verify", 1, 4, 128256, "fp32", True),
            Case("verify", 64, 8, 128256, "bf16", False),
            Case("verify", 64, 8, 128256, "bf16", True),
        ]
    return [
        Case("verify", 1, 5, 128256, "fp32", False),
        Case("verify", 1, 5, 128256, "bf16", False),
        Case("verify", 16, 4, 32000, "fp32", False),
    ]


def backends_for(op: str, device: str, case: Case | None = None) -> list[str]:
    """Available specdec_ext backends plus the baseline. The Triton interpreter is for tests only."""
    found = [b for b in specdec_ext.available_backends(device) if not (device == "cpu" and b == "triton")]
    if "triton" in found and device == "cuda" and op == "verify" and (case is None or _graphed(case, device)):
        found.insert(1, GRAPHED)
    return found + [BASELINE[op]]


# ----------------------------------------------------------------------------------------- inputs


def _graphed(case: Case, device: str) -> bool:
    return not case.check and case.batch <= GRAPHED_MAX_BATCH and num_input_sets(case, device) <= GRAPHED_MAX_SETS


def make_inputs(case: Case, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    dtype = DTYPES[case.dtype]
    # Scale 3: peaked enough that top-p keeps a small set, as real logits do.
    if case.op == "sample":
        return {"logits": (3 * torch.randn(case.batch, case.vocab, generator=g, device=device)).to(dtype)}
    target = 3 * torch.randn(case.batch, case.k + 1, case.vocab, generator=g, device=device)
    # A draft close to the target gives a realistic mix of acceptances and rejections.
    draft = target[:, : case.k] + torch.randn(case.batch, case.k, case.vocab, generator=g, device=device)
    # Each draft token is the draft's mode, which survives any top-k / top-p cut of the draft.
    drafts = draft.argmax(dim=-1)
    return {"target": target.to(dtype), "draft": draft.to(dtype), "drafts": drafts}


def cache_bytes(device: str) -> int:
    """Size of the last-level cache the rotation must defeat (a guess when the platform hides it)."""
    if device == "cuda":
        return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 64 << 20)
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
        return int(text.rstrip("KMG")) * scale
    except (OSError, ValueError):
        return 32 << 20


def num_input_sets(case: Case, device: str) -> int:
    """Enough copies to span twice the last-level cache, within a memory cap (at least 2)."""
    set_bytes = case.logits_elements * case.itemsize
    # CPU: copies cost host memory and time on a small machine; a virtual CPU may also report the
    # whole host's cache. 256 MiB is far beyond any per-core cache.
    cap_bytes, max_sets = (8 << 30, 256) if device == "cuda" else (256 << 20, 16)
    wanted = math.ceil(2 * cache_bytes(device) / max(set_bytes, 1))
    return max(2, min(wanted, max_sets, cap_bytes // max(set_bytes, 1)))


def rotated_inputs(case: Case, device: str) -> list[dict[str, torch.Tensor]]:
    first = make_inputs(case, device)
    # Copies at other addresses are all the rotation needs; equal values keep every call's work equal.
    return [first] + [{k: v.clone() for k, v in first.items()} for _ in range(num_input_sets(case, device) - 1)]


# ------------------------------------------------------------------------------------ the calls


def _warpers(params: dict):
    """transformers' own warpers, in the order its generation config applies them."""
    from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    return LogitsProcessorList([TemperatureLogitsWarper(params["temperature"]), TopKLogitsWarper(params["top_k"]), TopPLogitsWarper(params["top_p"])])


def make_call(case: Case, backend: str, inputs: dict[str, torch.Tensor]) -> Callable[[], object]:
    params = FILTERS if case.filters else {}
    device = next(iter(inputs.values())).device
    if backend == GRAPHED:
        return _graphed_verify(inputs, params)
    if backend in ("triton", "cpp", "eager"):
        generator = torch.Generator(device=device).manual_seed(1)
        if case.op == "verify":
            target, draft, drafts = inputs["target"], inputs["draft"], inputs["drafts"]
            return lambda: specdec_ext.verify(target, draft, drafts, generator=generator, backend=backend, check=case.check, **params)
        logits = inputs["logits"]
        return lambda: specdec_ext.sample(logits, generator=generator, backend=backend, check=case.check, **params)
    if backend == "transformers":
        return _transformers_verify(inputs, params)
    if backend == "multinomial":
        return _multinomial_sample(inputs, params)
    raise ValueError(f"unknown backend {backend!r}")


def capture_cuda_graph(run: Callable[[], object], warmup: int = 3) -> tuple[torch.cuda.CUDAGraph, object]:
    """Capture ``run()`` in a CUDA graph; returns the graph and the outputs each replay rewrites.

    Warm-up runs on a side stream first (Triton compiles, cached tensors and allocator pools
    settle), as PyTorch's CUDA-graph notes advise. The default CUDA generator is graph-safe: every
    replay of a verify call draws a fresh Philox key.
    """
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


def _graphed_verify(inputs: dict[str, torch.Tensor], params: dict) -> Callable[[], object]:
    """``verify(check=False)`` on these inputs captured in a CUDA graph; the call replays it."""
    target, draft, drafts = inputs["target"], inputs["draft"], inputs["drafts"]
    graph, outputs = capture_cuda_graph(lambda: specdec_ext.verify(target, draft, drafts, backend="triton", check=False, **params))

    def replay():
        graph.replay()
        return outputs

    return replay


def _transformers_verify(inputs: dict[str, torch.Tensor], params: dict) -> Callable[[], object]:
    """What transformers' assisted decoding does per verification, one row at a time.

    ``_speculative_sampling`` takes batch 1, so B > 1 loops over rows. As in ``_assisted_decoding``,
    the target logits are cast to float32 and each position runs through the logits processors; the
    draft logits get the same processing (the assistant applies it while drafting, and our backends
    do it inside ``verify``), so both sides start from the same raw logits.
    """
    from transformers.generation.utils import _speculative_sampling

    # Older transformers releases take a required is_done_candidate (False = plain verification).
    done = {"is_done_candidate": False} if "is_done_candidate" in inspect.signature(_speculative_sampling).parameters else {}
    target, draft, drafts = inputs["target"], inputs["draft"], inputs["drafts"]
    batch, k_plus_1, _ = target.shape
    k = k_plus_1 - 1
    # A one-token prompt, then the K drafts: only the last K ids are read.
    ids = torch.cat([torch.zeros_like(drafts[:, :1]), drafts], dim=1)
    warp = _warpers(params) if params else None

    def process(logits: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(logits)
        for i in range(logits.shape[1]):
            out[:, i, :] = warp(row_ids[:, : 1 + i], logits[:, i, :])
        return out

    def call():
        results = []
        for b in range(batch):
            row_ids = ids[b : b + 1]
            new_logits = target[b : b + 1].to(torch.float32)
            candidate_logits = draft[b : b + 1].to(torch.float32)
            if warp is not None:
                new_logits = process(new_logits, row_ids)
                candidate_logits = process(candidate_logits, row_ids)
            results.append(_speculative_sampling(row_ids, candidate_logits, k, new_logits, **done))
        return results

    return call


def _multinomial_sample(inputs: dict[str, torch.Tensor], params: dict) -> Callable[[], object]:
    """transformers' sampling step: processors, softmax, ``torch.multinomial``."""
    logits = inputs["logits"]
    warp = _warpers(params) if params else None
    no_ids = torch.zeros((logits.shape[0], 1), dtype=torch.long, device=logits.device)

    def call():
        scores = logits.to(torch.float32)
        if warp is not None:
            scores = warp(no_ids, scores)
        return torch.multinomial(scores.softmax(dim=-1), num_samples=1)

    return call


# ------------------------------------------------------------------------------------ timing


@dataclass
class Timing:
    median_s: float
    p20_s: float
    p80_s: float
    reps: int
    wall_s: float | None = None  # CUDA: host time per call over the back-to-back loop


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(times: list[float], wall: float | None = None) -> Timing:
    return Timing(statistics.median(times), _quantile(times, 0.2), _quantile(times, 0.8), len(times), wall)


def time_calls(calls: list[Callable[[], object]], device: str, budget_s: float, min_reps: int = 3, max_reps: int = 200, memory: bool = False) -> tuple[Timing, int | None]:
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
    return _summary(times), peak


def _time_cuda(calls, budget_s, min_reps, max_reps, memory) -> tuple[Timing, int | None]:
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
    return _summary([begin.elapsed_time(end) / 1e3 for begin, end in events], wall), meter.bytes


def copy_bandwidth(device: str, nbytes: int, reps: int = 10) -> float:
    """Bytes per second of ``dst.copy_(src)`` over ``nbytes`` (read + write counted)."""
    elements = max(nbytes // 4, 1)
    pairs = []
    sets = 2 if device == "cuda" or nbytes >= 64 << 20 else 8
    for _ in range(sets):
        src = torch.ones(elements, dtype=torch.float32, device=device)  # touched: no first-use page faults
        pairs.append((src, torch.zeros_like(src)))
    calls = [(lambda s=s, d=d: d.copy_(s)) for s, d in pairs]
    timing, _ = time_calls(calls, device, budget_s=0.2 if device == "cuda" else 0.5, min_reps=reps, max_reps=4 * reps)
    return 2 * elements * 4 / timing.median_s


def copy_time(case: Case, device: str, budget_s: float) -> float:
    """Seconds to copy half the case's floor bytes (so a plain copy moves exactly the floor)."""
    nbytes = case.floor_bytes // 2
    sets = max(2, min(16, math.ceil(2 * cache_bytes(device) / max(nbytes, 1)), (512 << 20) // max(nbytes, 1)))
    pairs = [(torch.ones(max(nbytes // 4, 1), device=device), torch.zeros(max(nbytes // 4, 1), device=device)) for _ in range(sets)]
    calls = [(lambda s=s, d=d: d.copy_(s)) for s, d in pairs]
    return time_calls(calls, device, budget_s=budget_s, min_reps=5)[0].median_s


# ------------------------------------------------------------------------------ peak memory


class PeakMemory:
    """Peak bytes allocated inside the ``with`` block beyond what was live when it began.

    CUDA: the caching allocator's peak counter. CPU: the process's peak resident set (VmHWM, reset
    through /proc/self/clear_refs) after ``malloc_trim`` returned free heap pages, so memory the
    call reuses from earlier calls counts as well. It sees every allocation, the C++ backend's own
    buffers included. ``bytes`` stays None where neither mechanism exists.
    """

    _libc = None

    def __init__(self, device: str | None):
        self.device = device  # None: measure nothing (lets callers keep one code path)
        self.bytes: int | None = None

    @classmethod
    def supported(cls, device: str) -> bool:
        if device == "cuda":
            return True
        if not sys.platform.startswith("linux"):
            return False
        try:
            cls._libc = cls._libc or ctypes.CDLL("libc.so.6")
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            return "VmHWM" in Path("/proc/self/status").read_text()
        except OSError:
            return False

    @staticmethod
    def _status(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise OSError(field)

    def __enter__(self):
        if self.device is None:
            self._base = None
        elif self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        elif self.supported("cpu"):
            self._libc.malloc_trim(0)
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # reset VmHWM to the current resident set
            self._base = self._status("VmRSS")
        else:
            self._base = None
        return self

    def __exit__(self, *exc):
        if self._base is None or exc[0] is not None:
            return False
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.bytes = torch.cuda.max_memory_allocated() - self._base
        else:
            self.bytes = max(0, self._status("VmHWM") - self._base)
        return False


# ---------------------------------------------------------------------------------- the run


class _Stop(Exception):
    """SIGTERM (e.g. from ``timeout``): stop measuring and write what there is."""


def _on_sigterm(signum, frame):
    raise _Stop()


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_slug(device: str) -> str:
    name = re.sub(r"\(r\)|\(tm\)|@.*$|\bcpu\b|\bprocessor\b", " ", device_name(device).lower())
    slug = re.sub(r"[^a-z0-9]+", "-", name).strip("-") or device
    return slug if device == "cuda" else f"cpu-{slug}"


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__, "specdec_ext": getattr(specdec_ext, "__version__", None)}
    for name in ("triton", "transformers"):
        try:
            found[name] = __import__(name).__version__
        except Exception:
            found[name] = None
    found["cuda"] = torch.version.cuda
    try:
        root = Path(__file__).resolve().parent.parent
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=5).stdout.strip()
        found["git"] = (commit + ("+dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        found["git"] = None
    return found


def run(
    device: str = "cpu",
    size: str = "default",
    backends: list[str] | None = None,
    ops: tuple[str, ...] = ("verify", "sample"),
    time_budget_s: float | None = None,
    measure_budget_s: float | None = None,
    match: str | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Run the grid; returns the result document (see bench/results/README.md)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda, but torch sees no CUDA device")
    if device == "cuda" and os.environ.get("TRITON_INTERPRET") == "1":
        # The interpreter would run the CUDA tensors' kernels on the host: nothing worth timing.
        raise RuntimeError("TRITON_INTERPRET=1 is set: unset it (or set 0) to benchmark compiled Triton on CUDA")
    grid_name = size if size != "default" else ("full" if device == "cuda" else "cpu-default")
    grid_cases = [c for c in make_grid(device, size, ops) if match is None or match in c.label()]
    position = {case: i for i, case in enumerate(grid_cases)}
    cases = run_order(grid_cases, device)
    per_measure = measure_budget_s or (0.1 if device == "cuda" else 0.3)
    started = time.time()
    load_start = _load_average()
    deadline = started + time_budget_s if time_budget_s else math.inf
    previous_handler = signal.signal(signal.SIGTERM, _on_sigterm) if hasattr(signal, "SIGTERM") else None
    rows: list[dict] = []
    copy_cache: dict[tuple, float] = {}
    skipped: list[str] = []
    complete = True
    copy_bw = {}
    index = 0
    try:
        copy_bytes = (2 << 30) if device == "cuda" else (256 << 20)
        copy_bw = {"bytes": copy_bytes, "start_gbs": copy_bandwidth(device, copy_bytes) / 1e9}
        log(f"copy bandwidth: {copy_bw['start_gbs']:.1f} GB/s ({device_name(device)}, {copy_bytes >> 20} MiB copy)")
        for index, case in enumerate(cases):
            names = [b for b in backends_for(case.op, device, case) if backends is None or b in backends]
            left = deadline - time.time()
            if left <= 0:
                skipped = [c.label() for c in cases[index:]]
                complete = False
                log(f"time budget spent: {len(skipped)} cases skipped")
                break
            remaining = sum(len(backends_for(c.op, device, c)) + 1 for c in cases[index:])
            budget = min(per_measure, max(0.01, left / max(remaining, 1) / 3)) if math.isfinite(left) else per_measure
            rows += _run_case(case, names, device, budget, copy_cache, log)
        index = len(cases)
        copy_bw["end_gbs"] = copy_bandwidth(device, copy_bw["bytes"]) / 1e9
    except _Stop:
        complete = False
        skipped = [c.label() for c in cases[index:]]  # the interrupted case too
        log("stopped by SIGTERM: writing partial results")
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)
    bandwidth = max(copy_bw.get("start_gbs", 0.0), copy_bw.get("end_gbs", 0.0)) or None
    copy_bw["used_gbs"] = bandwidth
    _derive(rows, bandwidth)
    backend_rank = {name: i for i, name in enumerate(("triton", GRAPHED, "cpp", "eager", "transformers", "multinomial"))}
    rows.sort(key=lambda r: (position[Case(**{k: r[k] for k in Case.__dataclass_fields__})], backend_rank.get(r["backend"], 99)))
    doc = {
        "schema": 1,
        "device": device_name(device),
        "device_type": device,
        "device_slug": device_slug(device),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "host": {
            "cpu": device_name("cpu"), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
            # CPU timings on a shared machine are only as good as its load: keep it with them.
            "load_average_start": load_start, "load_average_end": _load_average(),
        },
        "settings": {
            "grid": grid_name,
            "grid_axes": GRIDS[grid_name],
            "filters": FILTERS,
            "timer": "CUDA events, calls back to back" if device == "cuda" else "time.perf_counter per call",
            "statistic": "median",
            "rotation_cache_bytes": cache_bytes(device),
            "measure_budget_s": per_measure,
            "time_budget_s": time_budget_s,
            "memory": "torch.cuda.max_memory_allocated delta" if device == "cuda" else ("peak RSS delta (VmHWM)" if PeakMemory.supported("cpu") else "n/a"),
        },
        "copy_bandwidth": copy_bw,
        "elapsed_s": round(time.time() - started, 1),
        "complete": complete,
        "skipped_cases": len(skipped),
        "skipped": skipped,
        "results": rows,
    }
    doc["goals"] = evaluate_goals(doc)
    return doc


def _run_case(case: Case, names: list[str], device: str, budget: float, copy_cache: dict, log) -> list[dict]:
    rows = []
    try:
        sets = rotated_inputs(case, device)
    except RuntimeError as error:  # out of memory: recorded, the run goes on
        log(f"{case.label()}: inputs do not fit ({type(error).__name__})")
        return [_row(case, name, error="inputs out of memory") for name in names]
    copy_key = (case.op, case.batch, case.k, case.vocab, case.dtype)
    if copy_key not in copy_cache:
        try:
            copy_cache[copy_key] = copy_time(case, device, budget / 2)
        except RuntimeError:  # no room for the copy buffers next to the inputs: the backends still run
            copy_cache[copy_key] = None
            if device == "cuda":
                torch.cuda.empty_cache()
    for name in names:
        row = _row(case, name, n_sets=len(sets), copy_s=copy_cache[copy_key])
        try:
            calls = [make_call(case, name, s) for s in sets]
            timing, peak = time_calls(calls, device, budget, memory=True)
            row.update(median_us=timing.median_s * 1e6, p20_us=timing.p20_s * 1e6, p80_us=timing.p80_s * 1e6, reps=timing.reps, peak_extra_bytes=peak)
            if timing.wall_s is not None:
                row["wall_us"] = timing.wall_s * 1e6
        except _Stop:
            raise
        except Exception as error:  # an OOM or a backend failure is a result too; the grid goes on
            row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
            if device == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
        shown = f"{row['median_us']:10.1f} us" if row.get("median_us") is not None else f"  {row.get('error')}"
        log(f"{case.label():44s} {name:13s}{shown}")
    del sets
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def _row(case: Case, backend: str, **extra) -> dict:
    row = asdict(case)
    row.update(backend=backend, floor_bytes=case.floor_bytes, logits_bytes=case.logits_elements * case.itemsize, median_us=None, peak_extra_bytes=None)
    row.update(extra)
    return row


def _case_key(row: dict) -> tuple:
    return (row["op"], row["batch"], row["k"], row["vocab"], row["dtype"], row["filters"], row["check"])


def _derive(rows: list[dict], bandwidth_gbs: float | None) -> None:
    """Floor time, GB/s, fraction of copy bandwidth and speedups, filled into each row."""
    medians: dict[tuple, dict[str, float]] = {}
    for row in rows:
        if row.get("median_us"):
            medians.setdefault(_case_key(row), {})[row["backend"]] = row["median_us"]
    for row in rows:
        median = row.get("median_us")
        floor_us = row["floor_bytes"] / (bandwidth_gbs * 1e3) if bandwidth_gbs else None
        row["floor_us"] = floor_us
        copy_s = row.pop("copy_s", None)
        row["copy_us"] = copy_s * 1e6 if copy_s else None
        if not median:
            continue
        row["x_copy"] = median / row["copy_us"] if row["copy_us"] else None
        row["achieved_gbs"] = row["floor_bytes"] / (median * 1e3)
        row["fraction_of_copy_bw"] = row["achieved_gbs"] / bandwidth_gbs if bandwidth_gbs else None
        row["x_floor"] = median / floor_us if floor_us else None
        lines = row["batch"] * (row["k"] + 1)
        extra = row.get("peak_extra_bytes")
        row["extra_bytes_per_line"] = extra / lines if extra is not None else None
        others = medians.get(_case_key(row), {})
        base = others.get(BASELINE[row["op"]])
        row["speedup_vs_baseline"] = base / median if base else None
        row["speedup_vs_eager"] = others["eager"] / median if others.get("eager") else None


def evaluate_goals(doc: dict) -> list[dict]:
    """The issue's goals, judged from the rows (reported, never asserted)."""
    rows = [r for r in doc["results"] if r.get("median_us")]
    on_cuda = doc["device_type"] == "cuda"
    is_h200 = "H200" in doc["device"]

    def find(backend, op="verify", **case):
        for r in rows:
            if r["backend"] == backend and r["op"] == op and not r["check"] and all(r[k] == v for k, v in case.items()):
                return r
        return None

    goals = []
    # Issue 11's targets: B=1 replayed from a CUDA graph <= 8 us and launched from Python <= 15 us;
    # with filters (T, top-k, top-p) replayed <= 25 us; B=64 K=8 bf16 within 1.3x of the floor.
    for dtype, filters, replay_limit, launch_limit in (("fp32", False, 8.0, 15.0), ("bf16", False, 8.0, 15.0), ("fp32", True, 25.0, None)):
        label = "with filters" if filters else "no filters"
        limits = f"<= {replay_limit:g} us replayed" + (f", <= {launch_limit:g} us launched" if launch_limit else "")
        goal = {"goal": f"fused verify B=1 K=4 V=128256 {dtype} {label}: {limits}", "target": "H200"}
        launched = find("triton", batch=1, k=4, vocab=128256, dtype=dtype, filters=filters)
        replayed = find(GRAPHED, batch=1, k=4, vocab=128256, dtype=dtype, filters=filters)
        if not on_cuda:
            goal.update(status="n/a", measured="needs CUDA")
        elif launched is None and replayed is None:
            goal.update(status="n/a", measured="not measured")
        else:
            measured, ok = [], True
            if replayed is not None:
                ok = ok and replayed["median_us"] <= replay_limit
                measured.append(f"graph replay {replayed['median_us']:.1f} us")
            else:
                ok = False
            if launched is not None:
                if launch_limit:
                    ok = ok and launched["median_us"] <= launch_limit
                host = f" (host {launched['wall_us']:.1f} us)" if launched.get("wall_us") is not None else ""
                speedup = launched.get("speedup_vs_baseline")
                measured.append(f"launched {launched['median_us']:.1f} us{host}, {speedup or float('nan'):.1f}x transformers")
            goal.update(status="pass" if ok else "fail", measured="; ".join(measured))
        goals.append(goal)
    r = find("triton", batch=64, k=8, vocab=128256, dtype="bf16", filters=False)
    goal = {"goal": "fused verify B=64 K=8 V=128256 bf16: within 1.3x of the memory-traffic floor", "target": "H200"}
    if not on_cuda or r is None:
        goal.update(status="n/a", measured="needs CUDA" if not on_cuda else "not measured")
    else:
        goal.update(status="pass" if r["x_floor"] <= 1.3 else "fail", measured=f"{r['median_us']:.1f} us = {r['x_floor']:.2f}x floor ({r['achieved_gbs']:.0f} GB/s)")
    goals.append(goal)

    goal = {"goal": "cpp verify B=1 K=5 V=128256 fp32: >= 10x transformers", "target": "this CPU"}
    if on_cuda:
        goal.update(status="n/a", measured="CPU goal")
    elif r is None:
        goal.update(status="n/a", measured="cpp backend unavailable" if "cpp" not in specdec_ext.available_backends("cpu") else "not measured")
    else:
        speedup = r.get("speedup_vs_baseline")
        goal.update(status="pass" if speedup and speedup >= 10 else "fail", measured=f"{r['median_us']:.0f} us, {speedup or float('nan'):.1f}x transformers")
    goals.append(goal)
    # Page-granular CPU numbers and fixed launch buffers say nothing on small cases: judge the
    # cases whose logits take 16 MiB or more, where O(B*K*V) scratch would show at once.
    fused = [r for r in rows if r["backend"] in FUSED and r.get("peak_extra_bytes") is not None and r["logits_bytes"] >= 16 << 20]
    goal = {"goal": "fused peak extra memory O(B*K), not O(B*K*V)", "target": "every device"}
    if not fused:
        goal.update(status="n/a", measured="no fused backend measured on logits >= 16 MiB")
    else:
        worst = max(fused, key=lambda r: r["peak_extra_bytes"] / r["logits_bytes"])
        ratio = worst["peak_extra_bytes"] / worst["logits_bytes"]
        goal.update(status="pass" if ratio < 0.05 else "fail", measured=f"worst {worst['peak_extra_bytes'] / 2**20:.2f} MiB = {100 * ratio:.2f}% of the logits ({Case(**{k: worst[k] for k in Case.__dataclass_fields__}).label()}, {worst['backend']})")
    goals.append(goal)
    if not is_h200:
        for goal in goals:
            if goal["target"] == "H200" and goal["status"] in ("pass", "fail"):
                goal["status"] += f" (on {doc['device']}, not H200)"
    return goals


# ------------------------------------------------------------------------------- reporting


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def format_table(doc: dict) -> str:
    head = f"{'op':6s} {'B':>4s} {'K':>2s} {'V':>6s} {'dtype':5s} {'filt':4s} {'backend':12s} {'median_us':>10s} {'floor_us':>9s} {'x_floor':>8s} {'GB/s':>7s} {'%copy':>6s} {'extraMiB':>9s} {'vs_base':>8s} {'vs_eager':>8s}"
    lines = [head, "-" * len(head)]
    for r in doc["results"]:
        filt = ("on" if r["filters"] else "off") + ("+c" if r["check"] else "")
        extra = None if r.get("peak_extra_bytes") is None else r["peak_extra_bytes"] / 2**20
        if r.get("median_us") is None:
            lines.append(f"{r['op']:6s} {r['batch']:4d} {r['k']:2d} {r['vocab']:6d} {r['dtype']:5s} {filt:4s} {r['backend']:12s} {r.get('error', 'not run')}")
            continue
        pct = None if r.get("fraction_of_copy_bw") is None else 100 * r["fraction_of_copy_bw"]
        lines.append(
            f"{r['op']:6s} {r['batch']:4d} {r['k']:2d} {r['vocab']:6d} {r['dtype']:5s} {filt:4s} {r['backend']:12s} "
            f"{r['median_us']:10.1f} {_fmt(r.get('floor_us'), '9.1f')} {_fmt(r.get('x_floor'), '8.1f')} {_fmt(r.get('achieved_gbs'), '7.1f')} "
            f"{_fmt(pct, '5.1f')}% {_fmt(extra, '9.2f', 'n/a')} {_fmt(r.get('speedup_vs_baseline'), '7.1f')}x {_fmt(r.get('speedup_vs_eager'), '7.1f')}x"
        )
    return "\n".join(lines)


def format_goals(doc: dict) -> str:
    width = max((len(g["goal"]) for g in doc["goals"]), default=0)
    return "\n".join(f"{g['goal']:{width}s}  {g['status']:6s}  {g['measured']}" for g in doc["goals"])


def format_header(doc: dict) -> str:
    v = doc["versions"]
    bw = doc["copy_bandwidth"].get("used_gbs")
    state = "complete" if doc["complete"] else f"INCOMPLETE ({doc['skipped_cases']} cases skipped)"
    return (
        f"{doc['device']} | torch {v['torch']} triton {v['triton']} transformers {v['transformers']} | {doc['date']} | "
        f"copy bandwidth {_fmt(bw, '.1f')} GB/s | {doc['settings']['grid']} grid, {doc['elapsed_s']} s, {state}"
    )


def output_paths(doc: dict, out_dir: Path, tag: str | None = None) -> tuple[Path, Path]:
    stem = f"{doc['device_slug']}-{doc['date'][:10]}" + (f"-{tag}" if tag else "")
    return out_dir / f"{stem}.json", out_dir / f"{stem}.png"


def write_json(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")


def write_plot(doc: dict, path: Path) -> bool:
    """Latency against V, one panel per (op, dtype) and batch, one line per backend; the floor dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = [r for r in doc["results"] if r.get("median_us") and not r["check"]]
    if not rows:
        return False
    axes_of_grid = doc["settings"].get("grid_axes") or {}
    # The grid's batches only: a lone reference point would get a panel of its own.
    batches = sorted({r["batch"] for r in rows} & set(axes_of_grid.get("batch", ()))) or sorted({r["batch"] for r in rows})
    panels = [(op, dtype) for op in ("verify", "sample") for dtype in DTYPES if any(r["op"] == op and r["dtype"] == dtype for r in rows)]
    verify_ks = sorted({r["k"] for r in rows if r["op"] == "verify"})
    # One K per plot keeps the lines readable; the reference K (4) when the grid has it.
    k_shown = 4 if 4 in verify_ks else (verify_ks[-1] if verify_ks else 0)
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    colors = {b: f"C{i}" for i, b in enumerate(backends)}
    fig, axes = plt.subplots(len(panels), len(batches), figsize=(3.6 * len(batches), 2.9 * len(panels)), squeeze=False)
    for i, (op, dtype) in enumerate(panels):
        for j, batch in enumerate(batches):
            ax = axes[i][j]
            chosen = [r for r in rows if r["op"] == op and r["dtype"] == dtype and r["batch"] == batch and (op == "sample" or r["k"] == k_shown)]
            for backend in backends:
                for filters, style, marker in ((False, "-", "o"), (True, ":", "^")):
                    pts = sorted((r["vocab"], r["median_us"]) for r in chosen if r["backend"] == backend and r["filters"] == filters)
                    if pts:
                        ax.plot([v for v, _ in pts], [t for _, t in pts], style, marker=marker, ms=4, color=colors[backend])
            floor = sorted({(r["vocab"], r["floor_us"]) for r in chosen if r.get("floor_us")})
            if floor:
                ax.plot([v for v, _ in floor], [t for _, t in floor], "--", marker="_", ms=12, color="black", lw=1)
            ax.set_xscale("log")
            ax.set_yscale("log")
            vocabs = sorted({r["vocab"] for r in chosen})
            if vocabs:
                ax.set_xticks(vocabs, [f"{round(v / 1000)}k" for v in vocabs])
                ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.set_title(f"{op} B={batch}" + (f" K={k_shown}" if op == "verify" else "") + f" {dtype}", fontsize=9)
            ax.tick_params(labelsize=7)
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("median latency (us)", fontsize=8)
            if i == len(panels) - 1:
                ax.set_xlabel("vocabulary V", fontsize=8)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colors[b], marker="o", ms=3, label=b) for b in backends]
    handles += [
        Line2D([], [], color="gray", ls="-", marker="o", ms=4, label="filters off"),
        Line2D([], [], color="gray", ls=":", marker="^", ms=4, label=f"filters on (T={FILTERS['temperature']}, k={FILTERS['top_k']}, p={FILTERS['top_p']})"),
        Line2D([], [], color="black", ls="--", label="memory-traffic floor at copy bandwidth"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False)
    fig.suptitle(f"{doc['device']} ({doc['date'][:10]})", fontsize=10)
    fig.tight_layout(rect=(0, 0.04 + 0.02 * math.ceil(len(handles) / 4), 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
