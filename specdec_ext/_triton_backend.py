"""Launchers for the fused Triton verification kernels (triton_kernels/, installed as specdec_ext.kernels).

A call is a short list of launch templates (:func:`templates`), a pure function of the call's
shapes, dtypes, flags and the device's geometry; :func:`launches_for` fills them in as
:class:`Launch` records without running them, so ``tests/support/triton_compile_check.py`` and
``bench/gpu_model.py`` compile exactly what a launch compiles (with tensors that only carry shapes).

What a call costs on the device: two launches without top-k / top-p (line statistics, then the
race with its own finalisation). With top-k / top-p: the line statistics also leave each line's
candidates, the cut-offs launch settles each cut from them (and runs, in the same launch, the
whole-line search of the lines they do not settle) and leaves every cut line's statistics over its
kept values, then the race: three launches, and a line is read for its statistics once. No allocation besides the outputs (the partial results live in a workspace cached per
device and CUDA stream, whose arrival counters reset themselves, so a captured CUDA graph replays
the launches as they are); no host synchronisation; the row keys come in as a scalar (``base_key``) or a tensor
(``seeds``), never from a launch.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import torch

from . import _cpp_backend, _philox
from ._params import LOGPROBS_NONE, TOKEN_DTYPES, VerifyArgs
from ._philox import SAMPLE_STREAM, draw_base_key, draw_keys_eager
from ._results import VerifyResult

# Line statistics: values per tile (one block reduction each) and warps per program. A thread
# holds TILE / (32 * warps) values; 16-byte loads give each row of the tile 4 (fp32) or 8 (16-bit)
# consecutive values per thread. A filtered call's parts are sized in blocks of FILTERED_PART_ROWS
# rows: the lanes of a line over its parts (each lane keeps its top three values for the
# candidates, stats.py) are then about 2048 to 4096 whatever the batch size, which keeps the values
# above the line's floor to a few hundred. Its tiles, one loop step each, have FILTERED_STATS_ROWS
# rows: 32-row steps of 16-bit values compiled to 255 registers with a 600-byte stack (spilled in
# the loop, one CTA per SM), and that launch measured 2.8x the unfiltered one on an H200
# (bench/results/gpu-rows-nvidia-h200-2026-12-04.json); 8-row steps take 128 registers, no stack.
STATS_TILE = 8192
STATS_WARPS = 8
STATS_PROGRAMS_PER_SM = 16
FILTERED_STATS_ROWS = 8
FILTERED_PART_ROWS = 32
# A filtered bf16 call with the top-p windows (Triton 3.8 and later) reads each line in one
# statistics program from this many lines up (B=8 at K=4): only a line read whole has its top-p
# window counted, which settles a flat top-p line with no search pass (about half the call's time
# at B=8 to 62, K=8; ESTIMATES, docs/performance.md). Below it, one program a line is too few
# programs: the peaked lines would pay more than the flat ones gain.
WHOLE_LINE_STATS_LINES = 64
# The race: ids per loop step and warps per program on a GPU (one warp: the walk's reductions over
# positions stay in the warp, no block barriers); programs per multiprocessor wanted at any batch
# size (chunks per row = that many programs over B, at most one per tile).
RACE_BLOCK = 256
RACE_WARPS = 1
RACE_PROGRAMS_PER_SM = 16
FINAL_BLOCK = 1024  # chunk results the finalising program reads per step
# Top-k / top-p: candidate slots per line (shared by its statistics parts) and the candidates a
# threshold item sorts at most (thresholds.py).
LINE_SLOTS = 2048
SORT = 1024
# The cut-offs launch (cutoff_kernel): warps and programs per multiprocessor (each program draws
# work items in turn: a line's search over its candidates, then whole-line search chunks).
CUTOFF_WARPS = 8
CUTOFF_PROGRAMS_PER_SM = 4
# Its counters: tickets drawn, threshold items finished, programs exited, searches ended.
CUTOFF_CONTROL = 4
# The whole-line search (select.py): histogram bins per pass, passes (top-k ends within four, 8
# bits each or a gather; top-p within seven: value bins, once more value bins, a gather, then at
# most four of 8 bits, and one more before them for a window a sample placed; top-k then top-p
# within eleven), values per work item, values per loop step.
SELECT_BINS = 256
SELECT_TOP_K_PASSES = 4
SELECT_TOP_P_PASSES = 7
SELECT_PASSES = SELECT_TOP_K_PASSES + SELECT_TOP_P_PASSES
# A line's search state (select.py), and the most key slots a top-k gather takes (in the line's
# histogram counts, which a gather pass does not use; a power of two). A top-p window's gather
# takes twice as many where ranks are by byte histograms (digit_select) and those counts hold
# them: its cut is found by halvings, with no sort, and the wider window holds the cut of more
# flat lines in one pass (on tiny_llama's logits upcast to float32, top-p 0.95: 1.71 passes a
# line, 2.80 with 2048 slots). Triton 3.6 and 3.7 sort the window's keys, as many as a gather's.
SEARCH_STATE = 8
SELECT_GATHER = 2048
# A 16-bit line under a top-k above this, which its candidates are unlikely to settle, has its raw
# keys counted by the statistics launch (256 bins of their high byte, zeroed by the threshold item
# that reads them): its whole-line search starts at its second pass, and the line is read once less.
HISTOGRAM_TOP_K = 256
# Where tl.histogram is warp ballots (Triton 3.6, 3.7: key_window_default() is False), a top-k line
# its candidates leave starts its search with a gather whose lo a sample of the line places
# (thresholds.py's _sampled_top_k_lo): SAMPLE_RUNS runs of SAMPLE_RUN consecutive ids, evenly spaced.
# One pass when the gather holds the cut, with no ballot histogram, so the statistics launch counts
# the high bytes only of lines whose k the gather cannot hold (SAMPLED_HISTOGRAM_TOP_K, half its
# slots). On the tiny architectures' bf16 logits and 3 * randn (V = 128256), every top-k 1000 line
# took one pass (bench/results/sampled-start-2026-12-06.json). A call whose lines are all 32-bit
# (vLLM's: its sampler hands over float32 logits) samples on every Triton: no key window counts
# such a line, and its counted high bytes leave a second pass (sample_runs_default). A 16-bit line
# cut by top-p alone likewise starts with a raw window of single keys placed from half those runs
# (thresholds.py's _sampled_top_p_window), whose values a call of 16-bit lines counts by global
# atomics (select.py): one pass when it holds the cut, where value bins and a window take two. In a
# call of 32-bit lines, such a line starts with a gather placed the same way (_sampled_top_p_gather):
# one pass when it holds the cut, where value bins, value bins again and a gather take three.
SAMPLE_RUNS = 32
SAMPLE_RUN = 256
SAMPLED_HISTOGRAM_TOP_K = SELECT_GATHER // 2
# A bf16 line cut by top-p alone, which one statistics program reads whole (from WHOLE_LINE_STATS_LINES up) and
# its candidates do not settle (a flat distribution), has its raw keys counted by that program, one
# key a bin from two above its max down (the keys near 0 that weigh the same in one bin): the
# threshold item settles the cut from those exact counts, with no search pass (stats.py,
# thresholds.py). The window reaches 28 below the max, where the fixed-point weights end, unless
# the max lies in [0, 2**-8) (an fp16 line's 1024 keys a binade would not fit: fp16 lines are left
# out). Values a step of that count, and bins a threshold item sums a step.
TOP_P_WINDOW_BINS = 8192
TOP_P_WINDOW_BLOCK = 32768
TOP_P_WINDOW_STEP = 1024


def sample_runs_default(line_dtypes: tuple[torch.dtype, ...] = ()) -> int:
    """The default ``sample_runs`` of a call whose target and draft logits have ``line_dtypes``
    (empty: not known): SAMPLE_RUNS where tl.histogram is warp ballots, and on any Triton when no
    line is 16-bit (the key windows, which settle a 16-bit top-k line with no pass, count only
    16-bit lines); else 0."""
    sixteen_bit = not line_dtypes or any(dtype.itemsize == 2 for dtype in line_dtypes)
    return 0 if key_window_default() and sixteen_bit else SAMPLE_RUNS


@cache
def key_window_default() -> bool:
    """Whether such a line's statistics also count the single raw keys of each part's top window
    (a histogram of 512 bins, not 256: stats.py), so that a top-k whose cut lies there needs no
    search pass. Only where tl.histogram takes one shared-memory atomic a value: Triton 3.8's
    lowering and later (3.8 is the one torch 2.14, hence vLLM 0.33, installs). Triton 3.6 and 3.7
    take a warp ballot per bit of the bin and a popcount per bin a lane owns, about 88
    instructions a value at 256 bins and twice that at 512: they keep the 256 bins, the same cuts
    either way (tests/support/triton_compile_check.py --lowering reads each version's SASS). The
    same lowering decides how a line's sample is ranked and a top-k gather's cut found
    (``digit_select``): by byte histograms where they are shared-memory atomics, else by halvings
    and by the gathered keys sorted (the same results)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = tuple(int(part) for part in version("triton").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return False
    return found >= (3, 8)


def gather_slots(select_chunks: int, most: int = SELECT_GATHER) -> int:
    """GATHER: the largest power of two within ``most`` and a line's histogram counts."""
    room = min(most, select_chunks * (SELECT_BINS + 1))
    return 1 << (room.bit_length() - 1) if room else 1
SELECT_CHUNK = 8192
SELECT_TILE = 2048
assert SELECT_BINS ** SELECT_TOP_K_PASSES >= 2**32
assert SELECT_BINS == 256  # select.py's _shift resolves 8 bits per pass
# The interpreter runs programs one after another, paying per program and per loop step, not per
# lane: one race chunk per row and large tiles there.
_INTERPRETER_RACE_BLOCK = 8192
_INTERPRETER_SELECT_CHUNK = 2048


@cache
def kernels():
    """The kernel module: the installed ``specdec_ext.kernels``, or triton_kernels/ of a source checkout."""
    try:
        from . import kernels as module  # installed (pip install .) or editable install
    except ImportError:
        folder = Path(__file__).resolve().parent.parent / "triton_kernels"
        spec = importlib.util.spec_from_file_location("specdec_ext.kernels", folder / "__init__.py", submodule_search_locations=[str(folder)])
        if spec is None or spec.loader is None:
            raise ImportError(f"the Triton kernels were not found (looked for specdec_ext.kernels and {folder})") from None
        module = importlib.util.module_from_spec(spec)
        sys.modules["specdec_ext.kernels"] = module
        spec.loader.exec_module(module)
    _direct_interpreted_helpers(module)
    return module


class _DirectCall:
    """An interpreted ``@triton.jit`` helper called straight through its rewritten Python function."""

    def __init__(self, interpreted):
        self.interpreted = interpreted

    def __call__(self, *args, **kwargs):
        return self.interpreted.rewrite()(*args, **kwargs)


def _numpy_xor_reductions() -> None:
    """Triton's interpreter reduces ``xor_sum`` element by element in Python (it has numpy paths
    for sum, max and min only), and ``tl.sort`` exchanges its partners with one xor_sum per
    compare-and-swap step: a 1024-value sort took seconds per program. Give the interpreter
    numpy's xor reduction for that combine function (the same integers; nothing changes when
    compiling for a GPU)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    ops = getattr(interpreter, "ReduceOps", None)
    xor = getattr(tl.standard, "_xor_combine", None)
    if ops is None or xor is None or getattr(ops, "numpy_xor", False):
        return
    generic = ops.apply_impl

    def apply_impl(self, input):
        if self.combine_fn is xor and len(input) == 1 and self.axis is not None:
            data = input[0].handle.data
            return self.to_tensor(np.bitwise_xor.reduce(data, axis=self.axis, keepdims=self.keep_dims), input[0].dtype)
        return generic(self, input)

    ops.apply_impl = apply_impl
    ops.numpy_xor = True


def _scalar_index() -> None:
    """Triton 3.6's interpreter turns a scalar into a Python int (``range(first, last)`` of a
    program's tiles) by ``int()`` of its 1-element array, which NumPy 2.4 refuses ("only
    0-dimensional arrays can be converted to Python scalars"); later interpreters squeeze the
    array first. Give every version the later one's rule (the same integer)."""
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "squeezes", False):
        return

    def patch_lang_tensor(tensor, *args, **kwargs):
        patch(tensor, *args, **kwargs)
        # Set after the interpreter's own patch, which restores the class's attribute afterwards.
        tensor.__index__ = lambda self: int(self.handle.data.squeeze())

    patch_lang_tensor.squeezes = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def _direct_interpreted_helpers(package) -> None:
    """Under TRITON_INTERPRET, Triton's interpreter re-patches triton.language on every call of a
    nested ``@triton.jit`` helper (milliseconds each), although the launching kernel has patched
    it for the whole grid already; the kernels make dozens of such calls per program. Call the
    helpers' rewritten functions directly instead: the same Python code runs, several times
    faster. Launched kernels (the package's ``__all__`` and every ``*_kernel`` of its modules, e.g.
    the tree kernels) are left alone; nothing changes when compiling for a GPU."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return
    _numpy_xor_reductions()
    _scalar_index()
    launched = {getattr(package, name) for name in getattr(package, "__all__", ())}
    modules = [m for name, m in sys.modules.items() if name.startswith(package.__name__ + ".") and m is not None]
    for module in modules:
        for name, value in list(vars(module).items()):
            if not isinstance(value, InterpretedFunction) or name.endswith("_kernel") or value in launched:
                continue
            if callable(getattr(value, "rewrite", None)):
                setattr(module, name, _DirectCall(value))


@cache
def is_available() -> bool:
    try:
        import triton  # noqa: F401

        kernels()
    except Exception:  # triton missing or broken: the other backends still work
        return False
    return True


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@cache
def multiprocessors(device: torch.device) -> int:
    """Multiprocessors of a CUDA device, read once per device (never per call)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


class Geometry(NamedTuple):
    """Launch geometry of one call: what the device and the overrides decide."""

    interpret: bool
    multiprocessors: int
    stats_tile: int | None  # None: STATS_TILE, or FILTERED_STATS_ROWS rows for a filtered call
    stats_parts: int | None  # None: from the multiprocessors and the line count
    race_block: int
    race_chunks: int | None  # None: from the multiprocessors and B
    line_slots: int
    sort: int
    select_chunk: int
    select_tile: int
    select_programs: int
    select_gather: int  # at most SELECT_GATHER key slots per gather (gather_slots)
    histogram_top_k: int  # HISTOGRAM_TOP_K (2**31: no line's raw keys are counted by the statistics launch)
    key_window: bool  # key_window_default(): histogrammed 16-bit lines' statistics also count their parts' top windows
    top_p_window: bool  # key_window_default(): bf16 top-p lines read whole by one program have their top-p windows counted
    sample_runs: int  # sample_runs_default(): SAMPLE_RUNS or 0; a top-k line's sample places its first gather
    digit_select: bool  # key_window_default(): ranks by byte histograms (a sample's; a top-k gather's cut), else by halvings and sorts
    walk_chunks: int | None  # None: a block walk's items per position from the multiprocessors (_triton_tree.walk_chunks)


def geometry(
    device: torch.device, *, race_chunks: int | None = None, race_block: int | None = None, stats_tile: int | None = None, stats_parts: int | None = None,
    line_slots: int | None = None, sort: int | None = None, select_chunk: int | None = None, select_programs: int | None = None,
    select_gather: int | None = None, histogram_top_k: int | None = None, key_window: bool | None = None, top_p_window: bool | None = None,
    sample_runs: int | None = None, digit_select: bool | None = None, walk_chunks: int | None = None, sm_count: int | None = None,
    line_dtypes: tuple[torch.dtype, ...] = (),
) -> Geometry:
    """The geometry a call on ``device`` whose target and draft logits have ``line_dtypes`` uses
    (arguments override it: tests cover several chunks per row, ragged tiles and each way of the
    candidates on small vocabularies; the model sets sm_count). ``sample_runs`` (default
    ``sample_runs_default(line_dtypes)``) also sets the default ``histogram_top_k``
    (SAMPLED_HISTOGRAM_TOP_K with a sample, else HISTOGRAM_TOP_K)."""
    interpret = device.type != "cuda" and sm_count is None
    for name, value in (("race_block", race_block), ("stats_tile", stats_tile), ("line_slots", line_slots), ("sort", sort), ("select_chunk", select_chunk),
                        ("select_gather", select_gather)):
        if value is not None and (value < 16 or value & (value - 1)):
            raise ValueError(f"{name} must be a power of two >= 16, got {value}")
    if sm_count is None:
        sm_count = multiprocessors(device) if device.type == "cuda" else 1
    select_chunk = select_chunk or (_INTERPRETER_SELECT_CHUNK if interpret else SELECT_CHUNK)
    if sample_runs is None:
        sample_runs = sample_runs_default(line_dtypes)
    if sample_runs and (sample_runs < 2 or sample_runs & (sample_runs - 1)):
        raise ValueError(f"sample_runs must be 0 or a power of two >= 2, got {sample_runs}")
    if histogram_top_k is None:
        histogram_top_k = SAMPLED_HISTOGRAM_TOP_K if sample_runs else HISTOGRAM_TOP_K
    return Geometry(
        interpret=interpret,
        multiprocessors=sm_count,
        stats_tile=stats_tile,
        stats_parts=stats_parts,
        race_block=race_block or (_INTERPRETER_RACE_BLOCK if interpret else RACE_BLOCK),
        race_chunks=race_chunks,
        line_slots=line_slots or LINE_SLOTS,
        sort=sort or SORT,
        select_chunk=select_chunk,
        select_tile=select_chunk if interpret else min(SELECT_TILE, select_chunk),  # the interpreter pays per loop step: one per chunk
        # The interpreter runs programs one after another: the first takes every work item.
        select_programs=select_programs or (3 if interpret else CUTOFF_PROGRAMS_PER_SM * sm_count),
        select_gather=select_gather or SELECT_GATHER,
        histogram_top_k=histogram_top_k,
        key_window=key_window_default() if key_window is None else key_window,
        top_p_window=key_window_default() if top_p_window is None else top_p_window,
        sample_runs=sample_runs,
        digit_select=key_window_default() if digit_select is None else digit_select,  # (the same lowering decides)
        walk_chunks=walk_chunks,
    )


def line_dtypes(args) -> tuple[torch.dtype, ...]:
    """The dtypes of a call's lines: its target logits' and, where it has them, its draft logits'."""
    draft = args.draft_logits
    return (args.target_logits.dtype,) if draft is None else (args.target_logits.dtype, draft.dtype)


class Launch(NamedTuple):
    """One kernel launch as :func:`verify` makes it: ``kernel[grid](*args, **constexprs, num_warps=...,
    num_stages=1, enable_fp_fusion=False)``, which the runners call as ``kernel.run(*args, grid=grid,
    warmup=False, ...)`` (compiled, not run, by the compile check and the model)."""

    name: str
    kernel: Any
    grid: tuple[int, ...]
    args: tuple
    constexprs: dict
    num_warps: int


_ALIGN = 64  # workspace buffers start on multiples of 64 elements (256 bytes)


class Sizes(NamedTuple):
    """Workspace elements one call needs."""

    floats: int
    ints: int
    counters: int


def _layout(args: VerifyArgs, geo: Geometry, whole_lines: bool = True) -> dict:
    """Sizes and launch constants of a call (everything but the tensors). ``whole_lines``: a filtered
    bf16 call from WHOLE_LINE_STATS_LINES lines up reads each line in one statistics program (the
    chains'; trees and blocks keep the plan by the device's fill)."""
    batch, k, vocab = args.batch, args.num_positions, args.vocab
    has_draft = args.draft_logits is not None and k > 0
    lines = batch * (k + 1) + (batch * k if has_draft else 0)
    if args.filtered and geo.stats_tile is None:
        stats_tile = FILTERED_STATS_ROWS * _lanes(args.target_logits.dtype, 1 << 30)[0]
        step = FILTERED_PART_ROWS // FILTERED_STATS_ROWS  # tiles per block of FILTERED_PART_ROWS rows
    else:
        stats_tile, step = geo.stats_tile or STATS_TILE, 1
    tiles = _cdiv(vocab, stats_tile)  # statistics tiles per line, and partial slots per line
    blocks = _cdiv(tiles, step)
    bf16 = args.target_logits.dtype == torch.bfloat16 or (has_draft and args.draft_logits.dtype == torch.bfloat16)
    if geo.interpret:
        tiles_per_part = step
    elif whole_lines and args.filtered and bf16 and geo.top_p_window and lines >= WHOLE_LINE_STATS_LINES:
        tiles_per_part = step * blocks  # one program a line: its top-p window is counted
    else:  # enough programs to fill the device several times over, then longer ones
        tiles_per_part = step * max(1, min(blocks, _cdiv(lines * blocks, STATS_PROGRAMS_PER_SM * geo.multiprocessors)))
    if geo.stats_parts is not None:
        tiles_per_part = _cdiv(tiles, geo.stats_parts)
    race_tiles = _cdiv(vocab, geo.race_block)
    if geo.race_chunks is not None:
        wanted = geo.race_chunks
    elif geo.interpret:
        wanted = 1
    else:
        wanted = _cdiv(RACE_PROGRAMS_PER_SM * geo.multiprocessors, max(batch, 1))
    tiles_per_chunk = _cdiv(race_tiles, max(1, min(wanted, race_tiles)))
    chunks = _cdiv(race_tiles, tiles_per_chunk)
    select_chunks = _cdiv(vocab, geo.select_chunk) if args.filtered else 0
    stats = lines * tiles

    def padded(*sizes: int) -> int:
        return sum(_ALIGN * _cdiv(n, _ALIGN) for n in sizes)

    searched = lines if args.filtered else 0
    stats += _next_power_of_2(tiles)  # the race reads whole power-of-two rows of partials
    histograms = searched * select_chunks * (SELECT_BINS + 1)
    top_p_bins = TOP_P_WINDOW_BINS if args.filtered and bf16 and geo.top_p_window else 0
    floats = padded(stats, stats, stats, stats, lines, lines, batch * chunks, searched * geo.line_slots, searched * 2)
    ints = padded(stats, batch * chunks, searched * tiles, 2 * searched * tiles, searched * geo.sort, searched * SEARCH_STATE, histograms, 2 * histograms,
                  searched, 1 if searched else 0, searched, searched * tiles * 256, searched * (top_p_bins + 4) if top_p_bins else 0)
    return {
        "has_draft": has_draft, "lines": lines, "stats_tile": stats_tile, "tiles": tiles, "tiles_per_part": tiles_per_part, "chunks": chunks,
        "tiles_per_chunk": tiles_per_chunk, "filtered": args.filtered, "select_chunks": select_chunks, "top_p_bins": top_p_bins,
        "sizes": Sizes(floats, ints, padded(batch) + (padded(searched) + padded(CUTOFF_CONTROL) + searched * 256 if searched else 0)),
    }


class Workspace:
    """Device buffers reused by every call on one device and CUDA stream. They only grow (by
    powers of two); a buffer once handed to a launch is kept alive, since a captured CUDA graph may
    still point at it. ``counters`` is zeroed once: each call leaves it at zero again. ``floats``
    is zeroed when it grows: a threshold item loads a line's candidate slots whole, past their
    counts (thresholds.py's _line_candidates), so no slot it reads was never written."""

    def __init__(self, device: torch.device):
        self.device = device
        self.floats = torch.empty(0, dtype=torch.float32, device=device)
        self.ints = torch.empty(0, dtype=torch.int32, device=device)
        self.counters = torch.empty(0, dtype=torch.int32, device=device)
        self.retired: list[torch.Tensor] = []

    def reserve(self, sizes: Sizes) -> None:
        with torch.inference_mode(False):
            if self.floats.numel() < sizes.floats:
                self.retired.append(self.floats)
                self.floats = torch.zeros(_next_power_of_2(sizes.floats), dtype=torch.float32, device=self.device)
            if self.ints.numel() < sizes.ints:
                self.retired.append(self.ints)
                self.ints = torch.empty(_next_power_of_2(sizes.ints), dtype=torch.int32, device=self.device)
            if self.counters.numel() < sizes.counters:
                self.retired.append(self.counters)
                self.counters = torch.zeros(_next_power_of_2(sizes.counters), dtype=torch.int32, device=self.device)


_WORKSPACES: dict[tuple, Workspace] = {}


def workspace(device: torch.device) -> Workspace:
    key = (device, _stream_id(device))
    found = _WORKSPACES.get(key)
    if found is None:
        found = _WORKSPACES[key] = Workspace(device)
    return found


class Buffers(NamedTuple):
    """Views of a workspace for one call."""

    part_m: torch.Tensor
    part_z: torch.Tensor
    part_rm: torch.Tensor
    part_rz: torch.Tensor
    part_i: torch.Tensor
    gathered: torch.Tensor
    tau: torch.Tensor
    race_val: torch.Tensor
    race_idx: torch.Tensor
    counters: torch.Tensor
    cand: torch.Tensor  # (lines, line slots) float32: each statistics part's candidates
    cand_count: torch.Tensor  # (lines, tiles) int32
    cand_floor: torch.Tensor  # (lines, tiles, 2) int32
    sort: torch.Tensor  # (lines, sort) int32: a threshold item's packed candidates
    search: torch.Tensor  # (lines, SEARCH_STATE) int32: the whole-line search's state
    search_f: torch.Tensor  # (lines, 2) float32
    search_progress: torch.Tensor  # (lines,) int32: search passes published per line
    search_count: torch.Tensor  # (lines, select chunks, SELECT_BINS + 1) int32 histograms
    search_mass: torch.Tensor  # (lines, select chunks, SELECT_BINS + 1) int64 histograms (fixed-point masses)
    search_counters: torch.Tensor  # (lines,) int32 arrival counters, 0 between launches
    search_list: torch.Tensor  # (lines,) int32: the lines handed to the whole-line search
    histograms: torch.Tensor  # (lines, 256) int32 first-pass key counts, 0 between launches (stats.py, thresholds.py)
    windows: torch.Tensor  # (lines, tiles, 256) int32: histogrammed 16-bit lines' parts' top-window counts (stats.py, thresholds.py)
    top_p_windows: torch.Tensor  # (lines, TOP_P_WINDOW_BINS + 4) int32: bf16 top-p lines' window counts and bounds (stats.py, thresholds.py)
    searching: torch.Tensor  # (1,) int32: how many
    cutoff_control: torch.Tensor  # (CUTOFF_CONTROL,) int32 counters of the cut-offs launch, 0 between launches


_BUFFERS: dict[tuple, Buffers] = {}


def buffers(ws_floats: torch.Tensor, ws_ints: torch.Tensor, counters: torch.Tensor, layout: dict, batch: int, line_slots: int, sort: int) -> Buffers:
    """Carve a call's buffers out of the workspace (views, cached per workspace and layout)."""
    key = (ws_floats.device, ws_floats.data_ptr(), ws_floats.numel(), ws_ints.data_ptr(), ws_ints.numel(), counters.data_ptr(), layout["lines"],
           layout["tiles"], layout["chunks"], layout["filtered"], layout["select_chunks"], layout["top_p_bins"], line_slots, sort, batch)
    found = _BUFFERS.get(key) if ws_floats.device.type != "meta" else None
    if found is not None:
        return found
    lines, tiles, chunks, sc = layout["lines"], layout["tiles"], layout["chunks"], layout["select_chunks"]
    searched = lines if layout["filtered"] else 0
    position = {"f": 0, "i": 0}

    def take(kind: str, n: int) -> torch.Tensor:
        # Every buffer starts on a 256-byte boundary: its pointer's divisibility (which the
        # compiler specialises on) never depends on the sizes carved before it.
        start = position[kind]
        position[kind] = start + _ALIGN * _cdiv(n, _ALIGN)
        return (ws_floats if kind == "f" else ws_ints)[start : start + n]

    stats = lines * tiles + _next_power_of_2(tiles)  # padded: see _layout
    race_counters = _ALIGN * _cdiv(batch, _ALIGN)
    found = Buffers(
        part_m=take("f", stats), part_z=take("f", stats), part_rm=take("f", stats), part_rz=take("f", stats), part_i=take("i", stats),
        gathered=take("f", lines), tau=take("f", lines), race_val=take("f", batch * chunks), race_idx=take("i", batch * chunks), counters=counters,
        cand=take("f", searched * line_slots), cand_count=take("i", searched * tiles), cand_floor=take("i", 2 * searched * tiles),
        sort=take("i", searched * sort),
        search_f=take("f", searched * 2), search=take("i", searched * SEARCH_STATE), search_count=take("i", searched * sc * (SELECT_BINS + 1)),
        search_mass=take("i", 2 * searched * sc * (SELECT_BINS + 1)).view(torch.int64), search_list=take("i", searched),
        searching=take("i", 1 if searched else 0), search_progress=take("i", searched), windows=take("i", searched * tiles * 256),
        top_p_windows=take("i", searched * (layout["top_p_bins"] + 4) if layout["top_p_bins"] else 0),
        # The race's counters come first (one per row), the search's after them, then the cut-offs launch's.
        search_counters=counters[race_counters : race_counters + searched],
        cutoff_control=counters[race_counters + _ALIGN * _cdiv(searched, _ALIGN) :][: CUTOFF_CONTROL if searched else 0],
        histograms=counters[race_counters + _ALIGN * _cdiv(searched, _ALIGN) + _ALIGN * _cdiv(CUTOFF_CONTROL, _ALIGN) :][: searched * 256],
    )
    if len(_BUFFERS) > 64:
        _BUFFERS.clear()
    _BUFFERS[key] = found
    return found


def _lanes(dtype: torch.dtype, tile: int) -> tuple[int, int]:
    """(lanes, rows) of a statistics tile: 16 bytes per thread and row."""
    lanes = min(tile, 32 * STATS_WARPS * (16 // dtype.itemsize))
    return lanes, tile // lanes


def vector_lines(args: VerifyArgs) -> bool:
    """Whether every line of the call, the target's and the draft's, holds a multiple of 16 values
    and starts a multiple of 16 values from its tensor's first (its batch and position strides):
    then a line's tiles load 16 bytes a lane (Triton specialises such arguments, and a tensor's
    storage starts on 16 bytes), which a search item's gather keeps in the lane that loaded them
    (select.py's _gather, where tl.histogram is warp ballots). A view that starts elsewhere gives
    the same results, its gathers' vectors moved through shared memory."""
    lines = [args.target_logits] + ([args.draft_logits] if args.draft_logits is not None else [])
    return all(x.shape[-1] % 16 == 0 and all(stride % 16 == 0 for stride in x.stride()[:-1]) for x in lines)


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


class Outputs(NamedTuple):
    tokens: torch.Tensor  # (B, K+1) int64
    num_accepted: torch.Tensor  # (B,) int64
    logprobs: torch.Tensor | None  # (B, K+1) float32
    accept_probs: torch.Tensor | None  # (B, K) float32


def allocate_outputs(args: VerifyArgs, device: torch.device) -> Outputs:
    batch, k = args.batch, args.num_positions
    return Outputs(
        torch.empty((batch, k + 1), dtype=torch.int64, device=device),
        torch.empty((batch,), dtype=torch.int64, device=device),
        torch.empty((batch, k + 1), dtype=torch.float32, device=device) if args.logprobs != LOGPROBS_NONE else None,
        torch.empty((batch, k), dtype=torch.float32, device=device) if args.accept_probs else None,
    )


class Template(NamedTuple):
    """A launch without its per-call tensors: ``arguments(args, base_key, out)`` fills them in."""

    name: str
    kernel: Any
    grid: tuple[int, ...]
    arguments: Any
    constexprs: dict
    num_warps: int


class _Shape(NamedTuple):
    """What every launch template of a call reads of its shapes."""

    has_draft: bool
    t_strides: tuple
    d_strides: tuple
    tok_stride: int
    shape_args: tuple  # (B, K, V, Vd, target strides, draft strides): the kernels' common arguments
    t_parts: int  # statistics parts of a target (draft) line
    d_parts: int


def _logits(a: VerifyArgs, has_draft: bool) -> tuple:
    """The (target, draft) logits a launch takes: without draft logits the target stands in for the
    draft (a placeholder, never read). The chain's own argument builders inline it (hot path)."""
    return (a.target_logits, a.draft_logits if has_draft else a.target_logits)


def _shape(args: VerifyArgs, layout: dict) -> _Shape:
    target, draft = args.target_logits, args.draft_logits
    has_draft = layout["has_draft"]
    t_strides = (target.stride(0), target.stride(1))
    d_strides = (draft.stride(0), draft.stride(1)) if has_draft else (0, 0)
    return _Shape(has_draft, t_strides, d_strides, args.draft_tokens.stride(0) if args.num_positions else 0,
                  (args.batch, args.num_positions, args.vocab, args.draft_vocab, *t_strides, *d_strides), _cdiv(layout["tiles"], layout["tiles_per_part"]),
                  _cdiv(_cdiv(args.draft_vocab, layout["stats_tile"]), layout["tiles_per_part"]))


def line_templates(args: VerifyArgs, geo: Geometry, bufs: Buffers, layout: dict) -> list[Template]:
    """The launches that process a call's lines (the shared entry point of every Triton path that
    needs them): unfiltered, ``line_stats``; with top-k / top-p, ``line_stats`` (statistics and
    candidates) and ``cutoff`` (each line's cut: from its candidates, or by the whole-line search),
    which also leaves each cut line's statistics over its kept values. Run in order, they leave in
    ``bufs``: ``tau`` (lines,) the cut of each line (keep s >= tau), the statistics partials
    ``part_m`` / ``part_z`` (and ``part_i``, ``part_rm``, ``part_rz``) of each line over
    ``layout["tiles"]`` slots, and ``gathered``, each draft position's logit at its draft token.
    Lines are numbered as stats.py's ``line_of`` reads them (the target's B(K+1), then the draft's BK)."""
    k = kernels()
    sh = _shape(args, layout)
    lines, tiles, tiles_per_part = layout["lines"], layout["tiles"], layout["tiles_per_part"]
    b = bufs
    t_lanes, t_rows = _lanes(args.target_logits.dtype, layout["stats_tile"])
    d_lanes, d_rows = _lanes((args.draft_logits if sh.has_draft else args.target_logits).dtype, layout["stats_tile"])

    # The per-call arguments are read from the call; everything else is bound here, once (a
    # decoding loop builds these tuples every step).
    has_draft = sh.has_draft
    stats_fixed = (b.part_m, b.part_z, b.part_i, b.part_rm, b.part_rz, b.cand, b.cand_count, b.cand_floor, b.searching, b.histograms, b.windows,
                   b.top_p_windows)
    stats_tail = (b.gathered, *sh.shape_args, sh.tok_stride, tiles_per_part)

    def stats_arguments(a: VerifyArgs, key: int, o: Outputs) -> tuple:
        target = a.target_logits  # (also the draft's placeholder without one: never read)
        return (target, a.draft_logits if has_draft else target, a.temperature, a.top_k, a.top_p, a.num_draft_tokens, *stats_fixed, a.draft_tokens,
                *stats_tail)

    def line_stats(phase: int) -> Template:
        """The statistics launch: phase 0 of an unfiltered call, phase 1 of a filtered one (with
        the candidates). A filtered one of 16-bit lines without log-probabilities is capped at 128
        registers (two programs per multiprocessor): ptxas gives its candidate loop up to 177
        uncapped, from a build that also holds the first-pass key counts, and needs no more (no spill at
        128 with Triton 3.6, 3.8 or 3.9: tests/support/triton_compile_check.py)."""
        sixteen = args.target_logits.dtype.itemsize == 2 or (has_draft and args.draft_logits.dtype.itemsize == 2)
        cap = {"maxnreg": 128} if phase == 1 and sixteen and args.logprobs == LOGPROBS_NONE else {}
        return Template(
            "line_stats", k.line_stats_kernel, (lines, sh.t_parts), stats_arguments,
            {"PARTS": tiles, "HAS_DRAFT": sh.has_draft, "CHECK": args.check, "PHASE": phase, "LOGPROBS": args.logprobs, "LINE_SLOTS": geo.line_slots,
             "T_LANES": t_lanes, "T_ROWS": t_rows, "D_LANES": d_lanes, "D_ROWS": d_rows, "HISTOGRAM_TOP_K": geo.histogram_top_k,
             "KEY_WINDOW": geo.key_window, "SORT": geo.sort, "TOP_P_BINS": layout["top_p_bins"], "TOP_P_BLOCK": TOP_P_WINDOW_BLOCK, **cap},
            STATS_WARPS,
        )

    if not args.filtered:
        return [line_stats(0)]
    sc = layout["select_chunks"]
    # A fixed number of programs drawing work items (not one per line or chunk): enough for the
    # whole-line search of every line, and each exits after one more draw when none is listed.
    # ptxas's register cap ("maxnreg", a compile option passed with the constexprs) keeps two
    # programs per multiprocessor: Triton 3.6 gives the sort's straight-line code 199 registers
    # uncapped (no spill at 128 with 3.6, 3.8 or 3.9: tests/support/triton_compile_check.py).
    programs = max(1, min(lines * sc, geo.select_programs))
    cutoff_fixed = (b.tau, b.part_m, b.part_z, b.search, b.search_f, b.search_progress, b.search_count, b.search_mass, b.search_counters,
                    b.cutoff_control, b.searching, b.search_list)
    cutoff_tail = (b.cand, b.cand_count, b.cand_floor, b.sort, b.histograms, b.windows, b.top_p_windows, *sh.shape_args, sh.t_parts, sh.d_parts)

    def cutoff_arguments(a: VerifyArgs, key: int, o: Outputs) -> tuple:
        target = a.target_logits
        return (target, a.draft_logits if has_draft else target, *cutoff_fixed, a.temperature, a.top_k, a.top_p, a.num_draft_tokens, *cutoff_tail)

    cutoff = Template(
        "cutoff", k.cutoff_kernel, (programs,), cutoff_arguments,
        {"HAS_DRAFT": sh.has_draft, "PARTS": tiles, "PP": _next_power_of_2(tiles), "LINE_SLOTS": geo.line_slots, "SORT": geo.sort,
         "NUM_CHUNKS": sc, "CHUNK": geo.select_chunk, "TILE": geo.select_tile, "BINS": SELECT_BINS, "PASSES": SELECT_PASSES,
         "GATHER": gather_slots(sc, geo.select_gather), "WINDOW_GATHER": gather_slots(sc, (2 if geo.digit_select else 1) * geo.select_gather), "HISTOGRAM_TOP_K": geo.histogram_top_k, "KEY_WINDOW": geo.key_window,
         "TOP_P_BINS": layout["top_p_bins"], "TOP_P_STEP": TOP_P_WINDOW_STEP, "SAMPLE_RUNS": geo.sample_runs, "SAMPLE_RUN": SAMPLE_RUN,
         "DIGIT_SELECT": geo.digit_select, "VECTOR_LINES": vector_lines(args), "maxnreg": 128},
        CUTOFF_WARPS,
    )
    return [line_stats(1), cutoff]


def templates(args: VerifyArgs, geo: Geometry, bufs: Buffers, layout: dict) -> list[Template]:
    """The launches of a call as templates (see the module docstring): everything that depends on
    shapes, strides, flags and the workspace, computed once per call signature. The lines'
    launches (:func:`line_templates`), then the race."""
    k = kernels()
    batch, num_positions, vocab, draft_vocab = args.batch, args.num_positions, args.vocab, args.draft_vocab
    sh = _shape(args, layout)
    has_draft, t_strides, d_strides, tok_stride, t_parts, d_parts = sh.has_draft, sh.t_strides, sh.d_strides, sh.tok_stride, sh.t_parts, sh.d_parts
    tiles = layout["tiles"]
    b = bufs
    found = line_templates(args, geo, bufs, layout)
    race_tail = (batch, num_positions, vocab, draft_vocab, *t_strides, *d_strides, tok_stride, t_parts, d_parts, layout["tiles_per_chunk"], layout["chunks"])
    stats_buffers = (b.tau, b.part_m, b.part_z, b.part_i, b.part_rm, b.part_rz, b.gathered, b.race_val, b.race_idx, b.counters)

    tau = b.tau

    def race_arguments(a: VerifyArgs, key: int, o: Outputs) -> tuple:
        target, num_draft, seeds, offsets = a.target_logits, a.num_draft_tokens, a.seeds, a.offsets
        tokens, num_accepted, logprobs, accept_probs = o
        return (
            target, a.draft_logits if has_draft else target, a.draft_tokens, a.temperature, a.top_k, a.top_p, num_draft,
            num_draft if seeds is None else seeds, num_draft if offsets is None else offsets, *stats_buffers,  # (a placeholder when absent: never read)
            tokens, num_accepted, tau if logprobs is None else logprobs, tau if accept_probs is None else accept_probs, key, *race_tail,
        )

    found.append(Template(
        "race", k.race_kernel, (batch, layout["chunks"]), race_arguments,
        {"PARTS": tiles, "PP": _next_power_of_2(tiles), "KP": _next_power_of_2(num_positions + 1),
         "STREAM": args.stream, "HAS_DRAFT": has_draft, "HAS_SEEDS": args.seeds is not None, "HAS_OFFSETS": args.offsets is not None,
         "CHECK": args.check, "FILTERED": args.filtered, "LOGPROBS": args.logprobs, "ACCEPT_PROBS": args.accept_probs,
         "INTERPRET": geo.interpret, "BLOCK": geo.race_block, "FINAL_BLOCK": FINAL_BLOCK},
        RACE_WARPS if not geo.interpret else 4,
    ))
    return found


def _rows_contiguous(args: VerifyArgs) -> bool:
    """Whether the per-row keys are as the kernels read them (row b's entry at offset b). The
    validator hands them over contiguous; a prepared call's own may not be."""
    return (args.seeds is None or args.seeds.is_contiguous()) and (args.offsets is None or args.offsets.is_contiguous())


def prepare(args: VerifyArgs) -> VerifyArgs:
    """Inputs as the kernels read them: last dimensions contiguous, per-row keys contiguous."""
    draft = args.draft_logits
    if (args.target_logits.stride(-1) == 1 and (draft is None or draft.stride(-1) == 1) and (args.draft_tokens.stride(-1) == 1 or args.num_positions <= 1)
            and _rows_contiguous(args)):
        return args
    return args._replace(
        target_logits=_last_dim_contiguous(args.target_logits),
        draft_logits=_last_dim_contiguous(draft) if draft is not None else None,
        draft_tokens=_last_dim_contiguous(args.draft_tokens),
        seeds=None if args.seeds is None else args.seeds.contiguous(),
        offsets=None if args.offsets is None else args.offsets.contiguous(),
    )


_CPU = torch.device("cpu")
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # (CUDA builds of torch)


def _stream_id(device: torch.device) -> int:
    """The current CUDA stream of ``device`` (0 elsewhere), without building a Stream object."""
    if device.type != "cuda":
        return 0
    return _RAW_STREAM(device.index) if _RAW_STREAM is not None else torch.cuda.current_stream(device).cuda_stream


def _strides(args: VerifyArgs) -> tuple:
    draft = args.draft_logits
    return args.target_logits.stride(), None if draft is None else draft.stride(), args.draft_tokens.stride()


_new = tuple.__new__  # builds a NamedTuple without its Python-level __new__


def _by_position(kernel, constexprs: dict, runtime: int) -> tuple[tuple, dict]:
    """A launch's constexprs as (those passed by position, the rest by keyword): the ones that follow
    its ``runtime`` arguments in the kernel's parameter order (``arg_names``) go by position. Every
    keyword costs each launch twice (the launcher copies the dictionary, Triton's binder takes it
    apart again); a kernel without parameter names keeps them all keywords."""
    names = getattr(kernel, "arg_names", None) or ()
    positional = []
    for name in names[runtime:]:
        if name not in constexprs:
            break
        positional.append(name)
    return tuple(constexprs[name] for name in positional), {name: value for name, value in constexprs.items() if name not in positional}


def _run_options(grid: tuple, keywords: dict, num_warps: int) -> dict:
    """The keywords of a launch as a call hands them to the kernel's ``run`` (Triton's launcher,
    ``run(*args, grid, warmup, **kwargs)`` in 3.6 to 3.9 and in the interpreter), which is what
    ``kernel[grid](...)`` calls, one lambda frame and one repack of the arguments later. ``run`` is
    looked up on the kernel at every launch (no bound method kept), so what replaces a kernel's
    ``run`` (tests, a profiler) sees every launch."""
    return {"grid": grid, "warmup": False, **keywords, "num_warps": num_warps, "num_stages": 1, "enable_fp_fusion": False}


class _Input:
    """Marks where a per-call value goes in a launch's arguments (see :meth:`Runner.spliced`)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


# The per-call values of a spliced call (Runner.spliced), in the order its function takes them.
CALL_INPUTS = ("target", "draft", "draft_tokens", "seeds", "offsets", "tokens", "num_accepted", "logprobs", "accept_probs", "key")
_MARKS = {name: _Input(name) for name in CALL_INPUTS}
_NO_OUTPUTS = Outputs(None, None, None, None)


class Runner:
    """The launches of one call signature (shapes, strides, dtypes, flags, device, CUDA stream),
    bound once: a call allocates the outputs and launches, nothing else (no lookup, no planning).

    :meth:`launch` runs a call of exactly that signature; calling the runner checks the strides
    and the stream first and takes the general path (:func:`verify`) when they differ.
    :meth:`spliced` binds the launches further, to a prepared call's own tensors.
    """

    def __init__(self, args: VerifyArgs, overrides: dict, found: list[Template]):
        device = args.target_logits.device
        self.device = device
        self.on_cuda = device.type == "cuda"
        self.stream = _stream_id(device)  # (0 is also the default CUDA stream's id)
        self.strides = _strides(args)
        self.overrides = overrides
        self.batch, self.length = args.batch, args.num_positions + 1
        self.logprobs, self.accept_probs = args.logprobs != LOGPROBS_NONE, args.accept_probs
        # (kernel, arguments, constexprs by position, keywords of its run). No FMA contraction: p(x)
        # is the same float expression on every backend (an explicit tl.fma where a kernel wants one).
        self.launches = []
        for t in found:
            positional, keywords = _by_position(t.kernel, t.constexprs, len(t.arguments(args, 0, _NO_OUTPUTS)))
            self.launches.append((t.kernel, t.arguments, positional, _run_options(t.grid, keywords, t.num_warps)))

    def launch(self, args: VerifyArgs, base_key: int) -> Outputs:
        device, batch = self.device, self.batch
        out = _new(Outputs, (
            torch.empty(batch, self.length, dtype=torch.int64, device=device),
            torch.empty(batch, dtype=torch.int64, device=device),
            torch.empty(batch, self.length, dtype=torch.float32, device=device) if self.logprobs else None,
            torch.empty(batch, self.length - 1, dtype=torch.float32, device=device) if self.accept_probs else None,
        ))
        if batch:
            for kernel, arguments, constexprs, options in self.launches:
                kernel.run(*arguments(args, base_key, out), *constexprs, **options)
        return out

    def __call__(self, args: VerifyArgs, base_key: int) -> Outputs:
        if _strides(args) != self.strides or not _rows_contiguous(args) or (self.on_cuda and _stream_id(self.device) != self.stream):
            return verify(args, base_key, **self.overrides)
        return self.launch(args, base_key)

    def spliced(self, marked: VerifyArgs, outputs: Outputs, scope: dict[str, Any] | None = None, prefix: str = "") -> list[str]:
        """Every launch of this runner as lines of code (one statement each) in a function whose
        local names are :data:`CALL_INPUTS`, the call's values.

        ``marked`` and ``outputs`` are a call of this signature in which each value that changes
        from call to call is its mark (``_MARKS[name]``) and every other value is the one all calls
        share (a plan's per-row tensors, a placeholder, a scratch output): each template fills in
        its arguments from them once, and a line passes the call's values at the marks, the rest
        as they are, from names (``prefix``: what sets them apart) it puts in ``scope``, the
        function's globals. Written out as code, the way ``collections.namedtuple`` and Triton's
        own argument binder make theirs: a launch then costs one call with its fixed arguments
        unpacked around the call's values, no argument tuple built beforehand (see plan_runner).
        """
        scope = {} if scope is None else scope
        lines = []
        for i, (kernel, arguments, constexprs, options) in enumerate(self.launches if self.batch else ()):
            parts: list[str] = []
            fixed: list = []
            name = f"{prefix}launch{i}"
            for value in (*arguments(marked, _MARKS["key"], outputs), *constexprs):
                if type(value) is _Input:
                    if fixed:
                        scope[f"{name}_fixed{len(parts)}"] = tuple(fixed)
                        parts.append(f"*{name}_fixed{len(parts)}")
                        fixed = []
                    parts.append(value.name)
                else:
                    fixed.append(value)
            if fixed:
                scope[f"{name}_fixed{len(parts)}"] = tuple(fixed)
                parts.append(f"*{name}_fixed{len(parts)}")
            scope[name], scope[f"{name}_options"] = kernel, options
            lines.append(f"{name}.run({', '.join(parts)}, **{name}_options)")  # (our names only: no value becomes code)
        return lines


_SETUPS: dict[tuple, tuple] = {}


def _setup(args: VerifyArgs, device: torch.device, overrides: dict) -> Runner:
    """The runner of a call, cached per shapes, strides, dtypes, flags, device and CUDA stream: a
    repeated call (a decoding loop) pays one dictionary lookup here."""
    stream = _stream_id(device)
    target, draft, tokens = args.target_logits, args.draft_logits, args.draft_tokens
    key = (
        device, stream, target.shape, target.stride(), target.dtype, None if draft is None else (draft.shape, draft.stride(), draft.dtype),
        tokens.shape, tokens.stride(), args.filtered, args.check, args.logprobs, args.accept_probs, args.stream, args.seeds is None,
        args.offsets is None, tuple(sorted(overrides.items())) if overrides else (),
    )
    found = _SETUPS.get(key)
    ws = workspace(device)
    if found is not None and found[0] is ws.counters and found[1] is ws.floats and found[2] is ws.ints:
        return found[3]  # (a workspace that grew since: planned again on the new one)
    geo = geometry(device, **overrides, line_dtypes=line_dtypes(args))
    layout = _layout(args, geo)
    ws.reserve(layout["sizes"])
    run = Runner(args, overrides, templates(args, geo, buffers(ws.floats, ws.ints, ws.counters, layout, args.batch, geo.line_slots, geo.sort), layout))
    if len(_SETUPS) > 256:
        _SETUPS.clear()
    _SETUPS[key] = (ws.counters, ws.floats, ws.ints, run)
    return run


def runner(args: VerifyArgs) -> Runner:
    """:func:`verify` bound to the call signature of ``args`` (the backend table's prepare hook):
    a prepared call skips the signature lookup of every call."""
    args = prepare(args)
    return _setup(args, args.target_logits.device, {})


def _strides_to_match(x: torch.Tensor) -> tuple | None:
    """The strides a later call's tensor must have where ``x`` had them: None for a contiguous ``x``
    (any contiguous tensor of its shape will do, see plan_runner)."""
    return None if x.is_contiguous() else x.stride()


def _on_device(device: torch.device) -> str:
    """The code of a test that a tensor ``{}`` is on ``device`` (the name ``device`` of the scope):
    a boolean attribute where it says as much (cheaper than building the tensor's device to
    compare): ``is_cpu`` for the CPU, ``is_cuda`` for the only CUDA device."""
    if device == _CPU:
        return "{}.is_cpu"
    if device.type == "cuda" and torch.cuda.device_count() == 1:
        return "{}.is_cuda"
    return "{}.device == device"


def _tensor_test(name: str, strides: tuple | None, device: torch.device) -> str:
    """The code of a plan runner's test that its tensor ``name`` is not the one it takes: dtype,
    shape, device, then strides (None: contiguity, see _strides_to_match), against the names
    ``{name}_dtype``, ``{name}_shape``, ``device`` and ``{name}_strides`` of its scope."""
    layout = f"not {name}.is_contiguous()" if strides is None else f"{name}.stride() != {name}_strides"
    return f"{name}.dtype is not {name}_dtype or {name}.shape != {name}_shape or not {_on_device(device).format(name)} or {layout}"


def _key_test(name: str, device: torch.device, batch: int) -> str:
    """The code of a plan runner's test that ``seeds`` / ``offsets`` is not a contiguous (B,) int64
    tensor on the device (:func:`specdec_ext._params.is_row_vector`, inlined; a tensor of shape
    (1,) or (0,) is contiguous whatever its stride)."""
    layout = f" and {name}.is_contiguous()" if batch > 1 else ""
    return f"{name} is not None and not (type({name}) is Tensor and {name}.dtype is int64 and {name}.shape == rows and {_on_device(device).format(name)}{layout})"


def plan_runner(plan, vocab: int, dtype: torch.dtype, draft_vocab: int | None, draft_dtype: torch.dtype | None) -> Callable | None:
    """A plan's calls with the least host work each (the backend table's runner hook, as
    :func:`specdec_ext._cpp_backend.runner` is the C++ kernel's): ``run(target_logits, draft_logits,
    draft_tokens, seeds, offsets, generator)`` (sample: ``run(logits, None, None, seeds, offsets,
    generator)``) returns verify's :class:`~specdec_ext._results.VerifyResult` (sample: the (B,)
    tokens), or None, having drawn nothing, for a call it does not take, which the general path then
    runs: tensors of other shapes, dtypes or devices than the plan's (vocab, dtype, draft vocab
    (None: one-hot drafts), draft dtype), or of other strides than its first call's; seeds or
    offsets that are not (B,) int64 tensors on the device; a generator that is no torch.Generator;
    another CUDA stream than the first call's.

    The first call it takes fixes what the plan leaves open (strides, the draft tokens' dtype, the
    CUDA stream) and makes the plan's run: one function, written out as code for this plan and
    that call (see :meth:`Runner.spliced`), which compares a call's tensors with them and
    allocates its outputs (both in one trip to the C++ extension where it is loaded,
    :func:`specdec_ext._cpp_backend.launch_outputs`; else in Python, ``torch.empty_like`` of
    prototypes kept here), draws its key and makes the launches of its way of keying (seeds or
    not, offsets or not; each bound once, to the plan's per-row tensors), in one Python frame. It then stands in ``plan.fast`` for the
    function returned here (which hands it every later call). A sample allocates only its (B,)
    tokens, the same memory as the (B, 1) tokens of the K = 0 verification the race writes; its
    num_accepted goes to a scratch row kept here (a stream's calls run in order, and nothing reads
    it). None for a plan with ``check``: its calls read their tokens back after the kernels (a host
    sync) and take the general path.
    ``plan``: a :class:`specdec_ext.prepared.ChainPlan` of token-wise verification or sample.
    """
    if plan.check:
        return None
    batch, positions, device = plan.batch, plan.num_positions, plan.device
    sample = plan.stream == SAMPLE_STREAM and positions == 0
    on_cuda = device.type == "cuda"
    logprobs, accept_probs = plan.logprobs != LOGPROBS_NONE, plan.accept_probs
    target_shape = torch.Size((batch, vocab) if sample else (batch, positions + 1, vocab))
    tokens_shape = torch.Size((batch, positions))
    draft_shape = None if draft_vocab is None else torch.Size((batch, positions, draft_vocab))

    def call_of(target, draft, draft_tokens, seeds, offsets) -> VerifyArgs:
        """The call as the general path makes it (a sample: the K = 0 verification of the (B, 1, V) view)."""
        return VerifyArgs(target.unsqueeze(1) if sample else target, draft, plan.no_drafts if sample else draft_tokens, plan.temperature, plan.top_k,
                          plan.top_p, plan.num_draft, None, False, plan.filtered, seeds, offsets, plan.stream, plan.logprobs, plan.accept_probs)

    def takes(target, draft, draft_tokens) -> bool:
        """Whether a first call brings what the plan takes, as the kernels read it (see prepare)."""
        if (target.shape, target.dtype, target.device) != (target_shape, dtype, device) or (draft is None) != (draft_shape is None):
            return False
        if not sample and ((draft_tokens.shape, draft_tokens.device) != (tokens_shape, device) or draft_tokens.dtype not in TOKEN_DTYPES):
            return False
        if draft is not None and (draft.shape, draft.dtype, draft.device) != (draft_shape, draft_dtype, device):
            return False
        call = call_of(target, draft, draft_tokens, None, None)
        return prepare(call) is call

    def generate(target, draft, draft_tokens) -> Callable:
        """The plan's run, bound to the strides of this first call (every call's, then; None:
        contiguous, which a later call shows with one query: the strides contiguity leaves free,
        those of size-1 dimensions, only ever multiply index 0), its draft tokens' dtype and the
        CUDA stream it runs on (the workspace's)."""
        with torch.inference_mode(False):  # prototypes of any call's outputs, in or out of inference mode
            like = [torch.empty((batch,) if sample else (batch, positions + 1), dtype=torch.int64, device=device),
                    torch.empty(batch, dtype=torch.int64, device=device),
                    torch.empty(batch, positions + 1, dtype=torch.float32, device=device), torch.empty(batch, positions, dtype=torch.float32, device=device)]
        scope: dict[str, Any] = {
            "Tensor": torch.Tensor, "Generator": torch.Generator, "int64": torch.int64, "rows": torch.Size((batch,)), "device": device,
            "batch": batch, "stream": _stream_id(device), "stream_id": _stream_id, "empty_like": torch.empty_like, "draw_keys_eager": draw_keys_eager,
            "draw_base_key": draw_base_key, "fast_draw": _philox.FAST_DRAW, "new": tuple.__new__, "VerifyResult": VerifyResult,
            "target_shape": target_shape, "target_dtype": dtype, "target_strides": _strides_to_match(target),
            "like_tokens": like[0], "like_num_accepted": like[1], "like_logprobs": like[2], "like_accept_probs": like[3],
        }
        # The checks and the outputs in one trip to C++ where the extension is loaded (about half
        # of what the same work costs in Python), else in Python.
        host = _cpp_backend.launch_outputs(target, draft, None if sample else draft_tokens, sample, logprobs, accept_probs)
        code = [f"def run({', '.join(CALL_INPUTS[:5])}, generator):"]
        if host is None:
            tests = [_tensor_test("target", scope["target_strides"], device)]
            if not sample:
                scope.update(draft_tokens_shape=tokens_shape, draft_tokens_dtype=draft_tokens.dtype, draft_tokens_strides=_strides_to_match(draft_tokens))
                tests.append(_tensor_test("draft_tokens", scope["draft_tokens_strides"], device))
            if draft_shape is None:
                tests.append("draft is not None")
            else:
                scope.update(draft_shape=draft_shape, draft_dtype=draft_dtype, draft_strides=_strides_to_match(draft))
                tests.append(_tensor_test("draft", scope["draft_strides"], device))
            code += [
                "    try:",
                f"        if {' or '.join(tests)}:",
                "            return None",
                "    except (AttributeError, TypeError):  # not a tensor",
                "        return None",
                f"    if {_key_test('seeds', device, batch)} or {_key_test('offsets', device, batch)}:",
                "        return None",
            ]
        code += ["    if generator is not None and type(generator) is not Generator:", "        return None"]
        if on_cuda:
            code += ["    if stream_id(device) != stream:", "        return None"]
        if host is not None:
            scope["host_outputs"] = host
            code += ["    out = host_outputs(target, draft, draft_tokens, seeds, offsets)", "    if out is None:", "        return None",
                     "    tokens = out" if sample else "    tokens, num_accepted, logprobs, accept_probs = out"]
        code += ["    if seeds is not None:", "        key = 0"]
        if not on_cuda:  # (on CUDA the keys of a call in a graph capture are drawn on the device, as seeds)
            code += ["    elif generator is None:"]
            code += ["        key = fast_draw(None)", "        if key is None:", "            key = draw_base_key(None)"] if scope["fast_draw"] is not None \
                else ["        key = draw_base_key(None)"]
        code += ["    else:", "        seeds, key = draw_keys_eager(None, generator, batch, device)"]
        if host is None:
            code.append("    tokens = empty_like(like_tokens)")
            if not sample:
                code.append("    num_accepted = empty_like(like_num_accepted)")
                code.append("    logprobs = empty_like(like_logprobs)" if logprobs else "    logprobs = None")
                code.append("    accept_probs = empty_like(like_accept_probs)" if accept_probs else "    accept_probs = None")
        # The launches of each way of keying, bound once (any (B,) int64 tensor stands for given seeds or offsets).
        outputs = Outputs(_MARKS["tokens"], like[1] if sample else _MARKS["num_accepted"], _MARKS["logprobs"] if logprobs else None,
                          _MARKS["accept_probs"] if accept_probs else None)
        for test, seeded, offset in (("if seeds is None and offsets is None", False, False), ("elif seeds is None", False, True),
                                     ("elif offsets is None", True, False), ("else", True, True)):
            call = call_of(target, draft, draft_tokens, like[1] if seeded else None, like[1] if offset else None)
            marked = call._replace(target_logits=_MARKS["target"], draft_logits=None if draft is None else _MARKS["draft"],
                                   draft_tokens=call.draft_tokens if sample else _MARKS["draft_tokens"], seeds=_MARKS["seeds"] if seeded else None,
                                   offsets=_MARKS["offsets"] if offset else None)
            launches = _setup(call, device, {}).spliced(marked, outputs, scope, f"s{int(seeded)}o{int(offset)}_")
            code += [f"    {test}:", *(f"        {line}" for line in launches or ["pass"])]
        code.append("    return tokens" if sample else "    return new(VerifyResult, (tokens, num_accepted, logprobs, accept_probs))")
        exec("\n".join(code), scope)  # (our names only: no value becomes code)
        return scope["run"]

    generated: Callable | None = None

    def run(target, draft, draft_tokens, seeds, offsets, generator):
        """Before the first call the plan takes: that call makes the plan's run (generate), which
        then takes every call (it replaces this function in ``plan.fast``)."""
        nonlocal generated
        if generated is None:
            try:
                if not takes(target, draft, draft_tokens):
                    return None
            except (AttributeError, TypeError):  # not a tensor
                return None
            generated = plan.fast = generate(target, draft, draft_tokens)
        return generated(target, draft, draft_tokens, seeds, offsets, generator)

    return run


def verify(args: VerifyArgs, base_key: int, **overrides) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Run the fused kernels; returns (tokens (B, K+1) int64, num_accepted (B,) int64, logprobs
    (B, K+1) float32 or None, accept_probs (B, K) float32 or None). No host sync.

    ``overrides`` (race_chunks, race_block, stats_tile, stats_parts, line_slots, sort, select_chunk,
    select_programs) change the launch geometry, never the result: tests use them to cover several
    chunks per row, ragged last tiles and each way of the candidates on small vocabularies.
    """
    args = prepare(args)
    return _setup(args, args.target_logits.device, overrides).launch(args, base_key)


def launches_for(args: VerifyArgs, base_key: int = 0, **geometry_overrides) -> list[Launch]:
    """The launches a call would make, without running them (any device, ``meta`` included: the
    workspace is then made of meta tensors). The compile check and the GPU model start here."""
    args = prepare(args)
    device = args.target_logits.device
    geo = geometry(device, **geometry_overrides, line_dtypes=line_dtypes(args))
    layout = _layout(args, geo)
    if device.type == "meta":
        floats = torch.empty(layout["sizes"].floats, dtype=torch.float32, device=device)
        ints = torch.empty(layout["sizes"].ints, dtype=torch.int32, device=device)
        counters = torch.empty(max(layout["sizes"].counters, 1), dtype=torch.int32, device=device)
    else:
        ws = workspace(device)
        ws.reserve(layout["sizes"])
        floats, ints, counters = ws.floats, ws.ints, ws.counters
    bufs = buffers(floats, ints, counters, layout, args.batch, geo.line_slots, geo.sort)
    out = allocate_outputs(args, device)
    return [Launch(t.name, t.kernel, t.grid, t.arguments(args, base_key, out), t.constexprs, t.num_warps) for t in templates(args, geo, bufs, layout)]


def compile_launch(launch: Launch, arch: int = 90):
    """Compile ``launch`` for an NVIDIA GPU of compute capability ``arch`` (no GPU needed: Triton
    ships ptxas) with exactly the specialisation a launch with these arguments gets: the JIT's own
    argument binder decides which integers are 16-divisible or 1 and which pointers are aligned."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    kernel = launch.kernel
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*launch.args, **launch.constexprs, num_warps=launch.num_warps, num_stages=1, enable_fp_fusion=False)
    options, signature, constexprs, attrs = kernel._pack_args(backend, options, bound, specialization, options)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


__all__ = ["Geometry", "Launch", "Runner", "allocate_outputs", "compile_launch", "geometry", "is_available", "kernels", "launches_for", "line_templates", "plan_runner", "runner",
           "verify"]
