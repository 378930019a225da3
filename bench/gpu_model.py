"""``python -m bench.gpu_model``: an H200 time ESTIMATE of the Triton verify call, without a GPU.

For each goal shape the model

1. plans the call exactly as the launcher does (``_triton_backend.launches_for`` on ``meta``
   tensors of the real shapes: same kernels, grids, arguments and constexprs);
2. compiles every launch for sm_90 with the JIT's own argument specialisation
   (``_triton_backend.compile_launch``) and disassembles it with the ``cuobjdump`` Triton ships;
3. reads the SASS: registers, spills, the loops (backward branches) and the instructions of each
   loop body by execution pipe, leaving out the out-of-line slow paths of IEEE division (the
   branch around a ``CALL``), which valid inputs do not take;
4. combines that with what each program executes (trip counts from the launch arguments), the
   bytes each launch moves, occupancy and waves, into a time per launch; the call's time adds the
   launch costs of a CUDA-graph replay or of launches from Python.

Every number the model assumes is in :data:`ASSUMPTIONS` and printed. Nothing here is measured
on a GPU: the results are labelled ESTIMATE, and ``bash bench/gpu_suite.sh`` measures the same
shapes when a GPU is at hand. The model is checked against the interpreter in
tests/test_triton_launches.py (same launches per call as a real interpreted call makes).

Writes ``bench/results/gpu-model-<date>.json`` and prints a Markdown table for the README.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"

# Everything the estimate assumes. Rates are per multiprocessor and clock cycle, in thread
# operations; the pipe of each SASS opcode follows NVIDIA's Hopper SM description (per SM: 128
# FP32 lanes, 64 INT32 lanes, 16 special-function units, 32 load/store units, 4 schedulers
# issuing one warp instruction per cycle each).
ASSUMPTIONS = {
    "device": "NVIDIA H200 SXM (sm_90), modelled, not measured",
    "multiprocessors": 132,
    "clock_ghz": 1.98,  # boost clock nvidia-smi read under load on an H200 here (KINDS.md)
    "schedulers_per_sm": 4,
    "pipe_rate_per_sm_clk": {"fma": 128, "fma_half": 64, "alu": 64, "mufu": 16, "lsu": 32, "issue_only": 128},
    "hbm_bytes_per_s": 4.3e12,  # device-to-device copy measured on an H200 here (KINDS.md); datasheet 4.8e12
    "floor_bytes_per_s": 4.3e12,  # the memory floor uses the same rate (as bench/micro.py does, with its measured copy)
    "l2_bytes": 60e6,
    "dram_latency_us": 0.60,  # a dependent global load that misses L2
    "l2_latency_us": 0.30,  # a dependent global load or atomic served by L2
    "barrier_latency_cycles": 40,  # one bar.sync with its shared-memory round trip, on the critical path
    "cycles_per_instruction_alone": 2.0,  # a warp's issue interval when few warps share its scheduler (dependent chains)
    "regs_per_sm": 65536,
    "max_threads_per_sm": 2048,
    "max_ctas_per_sm": 32,
    "shared_bytes_per_sm": 228 * 1024,
    "graph_replay_fixed_us": 2.0,  # cudaGraphLaunch of a small graph until its first kernel runs
    "graph_kernel_gap_us": 0.8,  # between dependent kernel nodes of a graph (drain + launch)
    # specdec_ext.verify's Python up to the launches (validation, key, launch templates, outputs) on a
    # fast host: 85.5 us measured on this 2-core machine with no other jobs (python -m
    # bench.host_overhead, bench/results/host-overhead-2026-12-01.json), where an empty torch.empty
    # takes 2.5 us against about 1 us on a fast host; scaled by that ratio.
    "python_call_overhead_us": 34.0,
    "python_launch_us": 4.0,  # Triton 3.x JIT launcher per kernel from Python (argument specialisation, cache lookup, cuLaunchKernel)
    "threshold_search_bits": 24,
    # Global reductions (RED.ADD) to distinct addresses served by the L2, per second: a conservative
    # figure (no measurement here); values piling into one bin would serialise on its address.
    "l2_atomics_per_s": 5e11,  # order-key bits each top-k / top-p search resolves (candidate floor to line max)
    "rejected_rows": "every row rejects at its last draft position: the race reads a target and a draft line (the heavier loop)",
    "sampled_rows": "every row samples (temperature > 0); greedy rows would skip the race and read no draft line",
}

# Opcode -> execution pipe. Anything unlisted is "alu".
PIPES = {
    "FADD": "fma", "FMUL": "fma", "FFMA": "fma", "HFMA2": "fma", "HADD2": "fma", "HMUL2": "fma", "FSWZADD": "fma",
    "IMAD": "fma_half", "IMUL": "fma_half",
    "MUFU": "mufu", "I2F": "mufu", "F2I": "mufu", "FRND": "mufu", "F2F": "mufu",
    "LDG": "lsu", "STG": "lsu", "LDS": "lsu", "STS": "lsu", "LD": "lsu", "ST": "lsu", "ATOM": "lsu", "ATOMG": "lsu", "RED": "lsu",
    "REDG": "lsu", "ATOMS": "lsu", "SHFL": "lsu", "LDL": "lsu", "STL": "lsu", "LDSM": "lsu",
    "BRA": "issue_only", "BSSY": "issue_only", "BSYNC": "issue_only", "BAR": "issue_only", "EXIT": "issue_only", "WARPSYNC": "issue_only",
    "S2R": "issue_only", "CS2R": "issue_only", "S2UR": "issue_only", "ULDC": "issue_only", "UMOV": "issue_only", "ULEA": "issue_only",
    "UIADD3": "issue_only", "USHF": "issue_only", "ULOP3": "issue_only", "UISETP": "issue_only", "UIMAD": "issue_only", "LDC": "issue_only",
    "VOTEU": "issue_only", "MEMBAR": "issue_only", "ERRBAR": "issue_only", "CGAERRBAR": "issue_only", "CCTL": "issue_only", "FENCE": "issue_only",
    "CALL": "issue_only", "RET": "issue_only", "NOP": "issue_only", "DEPBAR": "issue_only", "PLOP3": "alu", "VOTE": "alu",
}


# ---------------------------------------------------------------------------------------------
# SASS


@dataclass
class Instruction:
    address: int
    opcode: str  # "LDG.E.128"
    text: str  # without the predicate
    predicated: bool = False

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]


def parse_sass(text: str) -> list[Instruction]:
    """Instructions of the (single) kernel in ``cuobjdump -sass`` output."""
    found = []
    for line in text.splitlines():
        match = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if not match:
            continue
        text = match.group(2).strip()
        body = re.sub(r"^@!?U?P[0-9T]+\s+", "", text)
        opcode = body.split()[0] if body else ""
        found.append(Instruction(int(match.group(1), 16), opcode, body, predicated=body != text and not re.match(r"^@U?PT\s", text)))
    return found


def _branch_target(ins: Instruction) -> int | None:
    match = re.search(r"(?:BRA|CALL\.REL\.NOINC|CALL\.REL|CALL\.ABS\.NOINC)\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", ins.text)
    return int(match.group(1), 16) if match else None


def _main_body(instructions: list[Instruction]) -> list[Instruction]:
    """The kernel without the out-of-line subroutines after its final self-branch."""
    for ins in instructions:
        if ins.base == "BRA" and _branch_target(ins) == ins.address:
            return [i for i in instructions if i.address < ins.address]
    return instructions


def _cold_addresses(body: list[Instruction]) -> set[int]:
    """Addresses of slow paths: a forward predicated branch that skips a CALL (IEEE division's
    out-of-range operands), the skipped instructions and the CALL itself."""
    cold: set[int] = set()
    for n, ins in enumerate(body):
        if ins.base == "BRA" and ins.predicated:
            target = _branch_target(ins)
            if target is None or target <= ins.address:
                continue
            skipped = [i for i in body[n + 1 :] if i.address < target]
            if any(i.base == "CALL" for i in skipped) and len(skipped) <= 12:
                cold.update(i.address for i in skipped)
    return cold


@dataclass
class Loop:
    start: int
    end: int
    instructions: int  # executed per iteration (slow paths and NOPs left out)
    by_pipe: dict
    by_opcode: dict

    def has(self, opcode: str) -> int:
        return sum(n for name, n in self.by_opcode.items() if name == opcode or name.startswith(opcode + "."))


def longest_path(body: list[Instruction], cold: set[int]) -> int:
    """Instructions on the longest path from entry to exit through the main body, each loop body
    counted once (the back edges a depth-first search finds are dropped) and slow paths left out:
    what one program executes at most outside its hot loop's extra trips (an if/else counts its
    longer branch, not both)."""
    if not body:
        return 0
    index = {ins.address: n for n, ins in enumerate(body)}
    leaders = {0}
    for n, ins in enumerate(body):
        if ins.base in ("BRA", "EXIT"):
            if n + 1 < len(body):
                leaders.add(n + 1)
            target = _branch_target(ins) if ins.base == "BRA" else None
            if target is not None and target in index:
                leaders.add(index[target])
    starts = sorted(leaders)
    block_of = {start: b for b, start in enumerate(starts)}
    blocks, edges = [], []
    for b, start in enumerate(starts):
        end = starts[b + 1] if b + 1 < len(starts) else len(body)
        blocks.append(sum(1 for i in body[start:end] if i.address not in cold))
        last = body[end - 1]
        predicated = last.predicated
        successors = []
        if last.base == "BRA":
            target = _branch_target(last)
            if target is not None and target in index:
                successors.append(block_of[index[target]])
            if predicated and end < len(body):
                successors.append(b + 1)
        elif last.base == "EXIT":
            if predicated and end < len(body):
                successors.append(b + 1)
        elif end < len(body):
            successors.append(b + 1)
        edges.append(successors)
    # Depth-first search from the entry: an edge to a block on the stack closes a loop.
    state = [0] * len(blocks)  # 0 new, 1 on the stack, 2 done
    forward = [[] for _ in blocks]
    stack = [(0, iter(edges[0]))]
    state[0] = 1
    while stack:
        node, successors = stack[-1]
        nxt = next(successors, None)
        if nxt is None:
            state[node] = 2
            stack.pop()
            continue
        if state[nxt] == 1:
            continue  # back edge
        forward[node].append(nxt)
        if state[nxt] == 0:
            state[nxt] = 1
            stack.append((nxt, iter(edges[nxt])))
    # Longest path over the remaining (acyclic) edges, in reverse postorder.
    order, seen = [], [False] * len(blocks)
    stack = [(0, iter(forward[0]))]
    seen[0] = True
    while stack:
        node, successors = stack[-1]
        nxt = next(successors, None)
        if nxt is None:
            order.append(node)
            stack.pop()
        elif not seen[nxt]:
            seen[nxt] = True
            stack.append((nxt, iter(forward[nxt])))
    best = {}
    for node in order:  # postorder: successors first
        best[node] = blocks[node] + max((best[n] for n in forward[node]), default=0)
    return best[0]


@dataclass
class KernelCode:
    registers: int
    spill_bytes: int
    shared_bytes: int
    instructions: int  # in the main body
    loops: list[Loop]
    path: int  # longest entry-to-exit path, loop bodies once (see longest_path)
    straight: int  # main-body instructions outside every loop
    straight_by_pipe: dict
    barriers_outside_loops: int
    opcode_counts: dict = field(default_factory=dict)
    # Phases of a kernel that first works on its own items, then waits (an acquire: the first
    # L1 invalidation, CCTL.IVALL) and works on items that depend on other programs' (the cut-offs
    # kernel): (path, barriers outside loops) of the code before and from that point.
    phases: dict = field(default_factory=dict)


def _mix(instructions: list[Instruction]) -> tuple[dict, dict]:
    opcodes = Counter(i.opcode for i in instructions)
    pipes: Counter = Counter()
    for ins in instructions:
        pipes[PIPES.get(ins.base, "alu")] += 1
    return dict(pipes), dict(opcodes)


def _rare_race_addresses(body: list[Instruction], ranges: list[tuple[int, int]]) -> set[int]:
    """The race kernel's zero-residual fallback: race loops (MUFU.LG2) after the arrival atomic run
    only when every residual of a rejected row rounds to zero; they are not on the expected path."""
    atomic = next((i.address for i in body if i.base in ("ATOM", "ATOMG", "RED", "REDG")), None)
    if atomic is None:
        return set()
    rare = set()
    for start, end in ranges:
        inside = [i for i in body if start <= i.address <= end]
        if start > atomic and any(i.opcode.startswith("MUFU.LG2") for i in inside):
            rare.update(i.address for i in inside)
    return rare


def analyse(sass: str, resources: str) -> KernelCode:
    body = [i for i in _main_body(parse_sass(sass)) if i.base != "NOP"]
    cold = _cold_addresses(body)
    hot = [i for i in body if i.address not in cold]
    ranges = []
    for ins in body:
        if ins.base == "BRA":
            target = _branch_target(ins)
            if target is not None and target <= ins.address:
                ranges.append((target, ins.address))
    # Innermost loops only: a backward branch whose range holds another one is an outer loop (or
    # a block the assembler placed before its predecessor), not a hot loop body.
    innermost = [r for r in ranges if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in ranges)]
    loops = []
    for start, end in innermost:
        inside = [i for i in hot if start <= i.address <= end]
        by_pipe, by_opcode = _mix(inside)
        loops.append(Loop(start, end, len(inside), by_pipe, by_opcode))
    rare = _rare_race_addresses(body, innermost)
    loops = [loop for loop in loops if loop.start not in rare]
    cold |= rare
    hot = [i for i in hot if i.address not in rare]
    in_loops = {i.address for i in hot for loop in loops if loop.start <= i.address <= loop.end}
    straight = [i for i in hot if i.address not in in_loops]
    straight_pipes, _ = _mix(straight)
    usage = re.search(r"REG:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", resources)
    registers, shared, local = (int(usage.group(k)) for k in (1, 2, 3)) if usage else (0, 0, 0)
    phases = {}
    wait = next((i.address for i in body if i.opcode.startswith("CCTL.IVALL")), None)
    if wait is not None:
        for name, part in (("before_wait", [i for i in body if i.address < wait]), ("from_wait", [i for i in body if i.address >= wait])):
            phases[name] = (longest_path(part, cold), sum(1 for i in straight if i.base == "BAR" and (i.address < wait) == (name == "before_wait")))
    return KernelCode(
        registers, local, shared, len(body), loops, longest_path(body, cold), len(straight), straight_pipes, sum(1 for i in straight if i.base == "BAR"),
        dict(Counter(i.opcode for i in hot)), phases,
    )


def _tools() -> Path:
    import triton

    return Path(triton.__file__).resolve().parent / "backends" / "nvidia" / "bin"


def disassemble(cubin: bytes) -> tuple[str, str]:
    """(SASS, resource usage) of a cubin, through the cuobjdump that Triton bundles."""
    cuobjdump = _tools() / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        sass = subprocess.run([str(cuobjdump), "-sass", handle.name], capture_output=True, text=True, check=True).stdout
        resources = subprocess.run([str(cuobjdump), "-res-usage", handle.name], capture_output=True, text=True, check=True).stdout
    return sass, resources


# ---------------------------------------------------------------------------------------------
# Calls


@dataclass(frozen=True)
class Call:
    """One verify call to model."""

    name: str
    batch: int
    k: int
    vocab: int
    dtype: str = "fp32"
    draft: str = "logits"  # "logits" | "one-hot"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    check: bool = False
    logprobs: int = 0
    accept_probs: bool = False
    seeds: bool = False
    offsets: bool = False
    stream: int = 1
    draft_dtype: str | None = None  # default: the target's
    draft_vocab: int | None = None  # default: the target's
    whole_line: bool = False  # the cut is not among the candidates: every line runs the whole-line search (cutoff_kernel)

    @property
    def filtered(self) -> bool:
        return bool(self.top_k) or self.top_p < 1.0

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "fp32" else 2

    @property
    def floor_bytes(self) -> int:
        """Every logits row read once plus one target and one draft row per request (bench/micro.py's floor)."""
        lines = self.batch * (self.k + 1) + (self.batch * self.k if self.draft == "logits" else 0)
        extra = self.batch * (2 if self.draft == "logits" else 1)
        return (lines + extra) * self.vocab * self.itemsize


def meta_args(call: Call):
    """VerifyArgs of ``call`` on the meta device (shapes, dtypes, flags; no data)."""
    import torch

    from specdec_ext._params import VerifyArgs

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    meta = torch.device("meta")
    b, k, v = call.batch, call.k, call.vocab
    target = torch.empty(b, k + 1, v, dtype=dtypes[call.dtype], device=meta)
    draft = torch.empty(b, k, call.draft_vocab or v, dtype=dtypes[call.draft_dtype or call.dtype], device=meta) if call.draft == "logits" and k else None
    row = lambda dt: torch.empty(b, dtype=dt, device=meta)  # noqa: E731
    return VerifyArgs(
        target, draft, torch.empty(b, k, dtype=torch.int64, device=meta), row(torch.float32), row(torch.int64), row(torch.float32), row(torch.int64),
        None, call.check, call.filtered, row(torch.int64) if call.seeds else None, row(torch.int64) if call.offsets else None, call.stream,
        call.logprobs, call.accept_probs,
    )


def launches(call: Call, multiprocessors: int):
    from specdec_ext import _triton_backend

    return _triton_backend.launches_for(meta_args(call), base_key=(1 << 40) + 3, sm_count=multiprocessors)


_CODE_CACHE: dict = {}


def compiled_code(launch) -> KernelCode:
    """Compile ``launch`` for sm_90 as the launcher would and analyse its SASS (cached per specialisation)."""
    from specdec_ext import _triton_backend

    compiled = _triton_backend.compile_launch(launch, arch=90)
    key = compiled.hash if hasattr(compiled, "hash") else id(compiled)
    if key not in _CODE_CACHE:
        sass, resources = disassemble(compiled.asm["cubin"])
        _CODE_CACHE[key] = analyse(sass, resources)
    return _CODE_CACHE[key]


# ---------------------------------------------------------------------------------------------
# The time model


@dataclass
class LaunchEstimate:
    name: str
    grid: list
    programs: int
    warps_per_program: int
    registers: int
    spill_bytes: int
    shared_bytes: int
    ctas_per_sm: int
    waves: float
    hot_loop: str
    hot_loop_instructions: int
    values_per_iteration: int
    instructions_per_value: float
    warp_instructions: float
    bytes: float
    issue_us: float
    pipe_us: float
    memory_us: float
    latency_us: float
    time_us: float
    bound: str


def _occupancy(code: KernelCode, warps: int) -> int:
    a = ASSUMPTIONS
    threads = 32 * warps
    by_regs = a["regs_per_sm"] // max(1, code.registers * threads)
    by_threads = a["max_threads_per_sm"] // threads
    by_shared = a["shared_bytes_per_sm"] // code.shared_bytes if code.shared_bytes else a["max_ctas_per_sm"]
    return max(1, min(by_regs, by_threads, by_shared, a["max_ctas_per_sm"]))


def _pipe_cycles(by_pipe: dict, warps: float) -> float:
    """Cycles one SM needs for ``warps`` warps each executing ``by_pipe`` (the busiest pipe)."""
    rates = ASSUMPTIONS["pipe_rate_per_sm_clk"]
    return max((count * 32 * warps / rates.get(pipe, 64) for pipe, count in by_pipe.items()), default=0.0)


def _pick_loop(code: KernelCode, name: str, call: Call) -> tuple[Loop | None, str]:
    """The loop each kernel spends its time in, recognised by what it executes."""
    loads = [loop for loop in code.loops if loop.has("LDG")]
    if name == "line_stats":
        sampled = [loop for loop in loads if loop.has("MUFU.EX2")]
        if not sampled:
            return None, ""
        most = max(loop.has("MUFU.EX2") for loop in sampled)
        # Unmasked and masked (ragged last tile) copies: the unmasked one is the shorter.
        return min((loop for loop in sampled if loop.has("MUFU.EX2") == most), key=lambda loop: loop.instructions), "sampled-line tile"
    if name == "race":
        races = [loop for loop in loads if loop.has("MUFU.LG2")]
        if not races:
            return None, ""
        # The residual race reads two lines; of its unmasked and masked (last tile) copies, the
        # unmasked one is the shorter and runs on every tile but the last.
        most_loads = max(loop.has("LDG") for loop in races)
        residual = min((loop for loop in races if loop.has("LDG") == most_loads), key=lambda loop: loop.instructions)
        return residual, "residual race tile"
    if name == "candidates":
        return None, "per-thread selection (no loop)"
    if name == "cutoff":  # the phase of its work items over the candidates (the search steps hold no global load)
        searches = [loop for loop in code.loops if not loop.has("LDG") and not loop.has("ATOMG")]
        return (max(searches, key=lambda loop: loop.instructions) if searches else None), "candidate search step"
    if name == "cutoff:search":
        # The whole-line search's histogram loop (its loads and atomics tell it from the spin waits).
        binning = [loop for loop in loads if loop.has("RED") + loop.has("REDG") + loop.has("ATOM") + loop.has("ATOMG")]
        if not binning:
            return None, ""
        return max(binning, key=lambda loop: loop.instructions), "whole-line histogram tile"
    return None, ""


def _logits_bytes(call: Call) -> int:
    lines = call.batch * (call.k + 1) + (call.batch * call.k if call.draft == "logits" else 0)
    return lines * call.vocab * call.itemsize


def _work(launch, call: Call, phase: str) -> dict:
    """What each program of a launch executes: hot-loop trip count, values per trip, bytes, and
    the dependent memory round trips on its critical path."""
    from specdec_ext import _triton_backend

    args = launch.args
    c = launch.constexprs
    lines_t = call.batch * (call.k + 1)
    lines_d = call.batch * call.k if call.draft == "logits" else 0
    if phase == "line_stats":
        tiles_per_part = args[-1]
        tile = c["T_LANES"] * c["T_ROWS"]
        used_lines = lines_t + lines_d
        programs_used = used_lines * launch.grid[1]
        if call.filtered and not call.whole_line and call.logprobs != 2:
            # The threshold kernel wrote these lines' statistics from the candidates: the programs
            # only gather the draft token's logit.
            return {"trips": 0, "values": tile, "programs_used": programs_used, "bytes": used_lines * 4, "rounds": ["l2", "l2"]}
        return {
            "trips": tiles_per_part, "values": tile, "programs_used": programs_used, "bytes": used_lines * call.vocab * call.itemsize,
            "rounds": ["dram", "l2"],  # the tiles' loads (issued together), then the partials' stores
        }
    if phase == "race":
        tiles_per_chunk, chunks = args[-2], args[-1]
        block = c["BLOCK"]
        raced = 2 if call.draft == "logits" else 1
        return {
            "trips": tiles_per_chunk, "values": block, "programs_used": call.batch * chunks,
            "bytes": call.batch * raced * call.vocab * call.itemsize + call.batch * (2 * lines_t + 2 * lines_d) * 4 * c["PARTS"],
            # row parameters, partials and the drafts' logits (one round: no load waits for
            # another); the chunk's logits (still in L2 when the call's logits fit in half of it);
            # the arrival atomic; the last program's read of the chunk results (and, with
            # logprobs, the winner's logit).
            "rounds": ["l2", "l2" if _logits_bytes(call) < ASSUMPTIONS["l2_bytes"] / 2 else "dram", "l2", "l2"] + (["l2"] if call.logprobs else []),
            "final_trips": math.ceil(chunks / _triton_backend.FINAL_BLOCK),
        }
    if phase == "candidates":
        chunk = c["CHUNK"]
        filtered_lines = lines_t + lines_d
        return {
            "trips": 0, "values": chunk, "programs_used": filtered_lines * c["NUM_CHUNKS"], "bytes": filtered_lines * call.vocab * call.itemsize,
            "rounds": ["dram", "l2"],
        }
    if phase == "cutoff":
        # Work items over the candidates, one per line, drawn by the programs in turn (modelled as
        # one program per line: the waves of the resident programs). Two searches (top-k, top-p)
        # over the candidates, each PROBES keys per step: the range between the candidates' floor
        # and the line max spans about 2**24 order keys (logits within a factor 4 of each other),
        # ceil(24 / log2(PROBES + 1)) steps each. A line the candidates cannot settle stops after
        # the first test and leaves the cut to the whole-line search.
        steps = 2 * math.ceil(ASSUMPTIONS["threshold_search_bits"] / math.log2(c["PROBES"] + 1))
        return {
            "trips": 0 if call.whole_line else steps, "values": c["CANDS_POW2"], "programs_used": lines_t + lines_d,
            "bytes": (lines_t + lines_d) * c["CANDS_POW2"] * 4,
            # the ticket; the candidates; the release of the item; then every program's acquire
            # that sees the last item finished, its read of the (empty) list and its exit atomic.
            "rounds": ["l2", "l2", "l2", "l2", "l2", "l2"],
        }
    if phase == "cutoff:search":
        # One pass of the whole-line search (call.whole_line: every line searches; one search,
        # top-k or top-p, takes half of the launch's PASSES).
        lines = lines_t + lines_d
        programs = launch.grid[0]
        slots = lines * c["NUM_CHUNKS"] * (c["BINS"] + 1)
        items = lines * c["NUM_CHUNKS"]  # (line, chunk) work items, taken in turn by the programs
        return {
            "trips": c["CHUNK"] // c["TILE"] * math.ceil(items / programs), "values": c["TILE"], "programs_used": programs,
            "bytes": lines * call.vocab * call.itemsize + slots * 12 * 2,  # the lines; the histograms zeroed, then read
            # the ticket and the acquire of the previous pass; the state; the zeroing stores before
            # the barrier; the chunk's logits (loads issued together); the arrival atomic; the last
            # item's read of the chunks' histograms and its release of the pass.
            "rounds": ["l2", "l2", "l2", "l2", "dram", "l2", "l2", "l2"],
            "atomics": 2 * lines * call.vocab,  # a count and a mass per value
        }
    raise ValueError(phase)


def estimate_launch(launch, call: Call, phase: str | None = None) -> LaunchEstimate:
    """The time of one launch, or of one phase of it (the cut-offs launch's work items over the
    candidates, then each pass of its whole-line search)."""
    a = ASSUMPTIONS
    phase = phase or launch.name
    code = compiled_code(launch)
    warps = launch.num_warps
    work = _work(launch, call, phase)
    loop, loop_name = _pick_loop(code, phase, call)
    loop_instructions = loop.instructions if loop else 0
    per_thread_values = work["values"] / (32 * warps)
    # Instructions per warp: the longest path through the kernel (loop bodies once), plus the hot
    # loop's further trips.
    # A masked copy of the hot loop (the ragged last tile) is on the path too: it stands for one trip.
    twin = loop is not None and any(other is not loop and other.instructions > loop.instructions and other.has("LDG") == loop.has("LDG")
                                    and other.has("MUFU.EX2") == loop.has("MUFU.EX2") for other in code.loops)
    trips = max(work["trips"] - 1, 0) if twin else work["trips"]
    # The cut-offs kernel's phases run their own part of the code (its items over the candidates
    # before the first wait, the search passes from it).
    path, barriers = code.path, code.barriers_outside_loops
    if phase in ("cutoff", "cutoff:search") and code.phases:
        path, barriers = code.phases["before_wait" if phase == "cutoff" else "from_wait"]
    per_warp = max(path - loop_instructions, 0) + loop_instructions * trips
    # The pipes of what runs outside the hot loop: the straight-line mix, scaled to the path.
    outside = max(0, path - loop_instructions)
    scale = outside / code.straight if code.straight else 0.0
    pipes = Counter({pipe: n * scale for pipe, n in code.straight_by_pipe.items()})
    if loop:
        for pipe, n in loop.by_pipe.items():
            pipes[pipe] += n * work["trips"]
    programs = work["programs_used"]
    ctas = _occupancy(code, warps)
    sms = a["multiprocessors"]
    clock = a["clock_ghz"] * 1e3  # cycles per microsecond
    waves = programs / (sms * ctas)
    total_warps = programs * warps
    issue_us = total_warps * per_warp / (a["schedulers_per_sm"] * sms) / clock
    pipe_us = max(_pipe_cycles({p: n}, total_warps / sms) for p, n in pipes.items()) / clock if pipes else 0.0
    memory_us = work["bytes"] / a["hbm_bytes_per_s"] * 1e6
    if work.get("atomics"):  # the L2 serves the histograms' atomics (spread over many addresses)
        memory_us = max(memory_us, work["atomics"] / a["l2_atomics_per_s"] * 1e6)
    # One program's critical path: its dependent memory round trips, its barriers and its
    # instructions at the issue interval of a warp with few neighbours on its scheduler.
    rounds = sum(a["dram_latency_us"] if r == "dram" else a["l2_latency_us"] for r in work["rounds"])
    program_us = rounds + (per_warp * a["cycles_per_instruction_alone"] + barriers * a["barrier_latency_cycles"]) / clock
    if launch.name == "race":  # the last program of a row also finalises
        program_us += a["l2_latency_us"] * work["final_trips"]
    # Waves: a full one keeps `ctas` programs on every multiprocessor, whose schedulers share
    # their instructions; the last, partial wave takes at least one program's critical path.
    full_waves = programs // (sms * ctas)
    rest = programs - full_waves * sms * ctas
    wave_us = max(ctas * warps * per_warp / a["schedulers_per_sm"] / clock, program_us)
    rest_us = max(math.ceil(rest / sms) * warps * per_warp / a["schedulers_per_sm"] / clock, program_us) if rest else 0.0
    latency_us = full_waves * wave_us + rest_us
    time_us = max(pipe_us, memory_us, latency_us)
    bound = "memory" if time_us == memory_us else "pipe" if time_us == pipe_us else ("issue" if latency_us > program_us * math.ceil(waves) * 1.01 or full_waves else "latency")
    return LaunchEstimate(
        phase, list(launch.grid), programs, warps, code.registers, code.spill_bytes, code.shared_bytes, ctas, round(waves, 2), loop_name,
        loop_instructions, work["values"], round(loop_instructions / per_thread_values, 2) if per_thread_values else 0.0,
        round(total_warps * per_warp), work["bytes"], round(issue_us, 3), round(pipe_us, 3), round(memory_us, 3), round(latency_us, 3), round(time_us, 3), bound,
    )


@dataclass
class CallEstimate:
    call: dict
    num_launches: int
    launches: list  # per launch, or per phase of the cut-offs launch (its search passes one by one)
    kernels_us: float
    replayed_us: float
    launched_us: float
    floor_us: float
    x_floor_replayed: float
    goals: dict


def estimate_call(call: Call, goals: dict | None = None) -> CallEstimate:
    a = ASSUMPTIONS
    planned = launches(call, a["multiprocessors"])
    estimates = []
    for launch in planned:
        if launch.name == "cutoff":
            estimates.append(estimate_launch(launch, call, "cutoff"))
            if call.whole_line:  # the passes of one search (half of PASSES), one after another in the same launch
                estimates += [estimate_launch(launch, call, "cutoff:search")] * (launch.constexprs["PASSES"] // 2)
        else:
            estimates.append(estimate_launch(launch, call))
    kernels = sum(e.time_us for e in estimates)
    n = len(planned)
    replayed = a["graph_replay_fixed_us"] + kernels + a["graph_kernel_gap_us"] * (n - 1)
    host = a["python_call_overhead_us"] + a["python_launch_us"] * n
    # From Python, launches queue behind the host: the call takes whichever is longer.
    launched = max(host + kernels / n, kernels + a["graph_kernel_gap_us"] * (n - 1) + a["python_launch_us"])
    floor = call.floor_bytes / a["floor_bytes_per_s"] * 1e6
    judged = {}
    for goal, limit in (goals or {}).items():
        value = {"replayed_us": replayed, "launched_us": launched, "x_floor_replayed": replayed / floor, "launches": n}[goal]
        judged[goal] = {"limit": limit, "estimate": round(value, 2), "met": value <= limit}
    return CallEstimate(asdict(call), n, [asdict(e) for e in estimates], round(kernels, 2), round(replayed, 2), round(launched, 2), round(floor, 2),
                        round(replayed / floor, 3), judged)


GOAL_CALLS = [
    (Call("B=1 K=4 V=128256 fp32", 1, 4, 128256, "fp32"), {"replayed_us": 8.0, "launched_us": 15.0, "launches": 2}),
    (Call("B=64 K=8 V=128256 bf16", 64, 8, 128256, "bf16"), {"x_floor_replayed": 1.3, "launches": 2}),
    (Call("B=1 K=4 V=128256 fp32 T=0.7 top-k 50 top-p 0.9", 1, 4, 128256, "fp32", temperature=0.7, top_k=50, top_p=0.9), {"replayed_us": 25.0, "launches": 4}),
]


def sweep_calls() -> list[Call]:
    """Filtered calls across top-k and top-p: the cut among the candidates, and the whole-line
    fallback the threshold kernel makes when it is not (a large k, a flat distribution)."""
    calls = []
    base = {"batch": 1, "k": 4, "vocab": 128256, "dtype": "fp32", "temperature": 0.7}
    for top_k, whole in ((1, False), (50, False), (1000, True), (128256, False)):
        calls.append(Call(f"B=1 K=4 top-k {top_k}" + (" (whole-line search)" if whole else ""), top_k=top_k, whole_line=whole, **base))
    for top_p, whole in ((0.5, False), (0.9, False), (0.99, True)):
        calls.append(Call(f"B=1 K=4 top-p {top_p}" + (" (flat: whole-line search)" if whole else ""), top_p=top_p, whole_line=whole, **base))
    calls.append(Call("B=64 K=8 bf16 T=0.7 top-k 50 top-p 0.9", 64, 8, 128256, "bf16", temperature=0.7, top_k=50, top_p=0.9))
    calls.append(Call("B=64 K=8 bf16 logprobs raw + accept_probs + seeds/offsets", 64, 8, 128256, "bf16", logprobs=2, accept_probs=True, seeds=True, offsets=True))
    calls.append(Call("B=8 K=4 V=32000 bf16", 8, 4, 32000, "bf16"))
    calls.append(Call("sample B=1 V=128256 fp32", 1, 0, 128256, "fp32", draft="one-hot", stream=2))
    return calls


def _versions() -> dict:
    import torch
    import triton

    commit = subprocess.run(["git", "-C", str(RESULTS_DIR.parent.parent), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(RESULTS_DIR.parent.parent), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
    return {"python": sys.version.split()[0], "torch": torch.__version__, "triton": triton.__version__, "commit": commit + ("+dirty" if dirty else "")}


def markdown_table(results: list[CallEstimate]) -> str:
    rows = ["| call | launches | kernels µs | replayed µs (graph) | launched µs (Python) | floor µs | replayed / floor | hot loops (instr / value) | goals |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        loops = ", ".join(dict.fromkeys(f"{e['name']} {e['instructions_per_value']}" for e in r.launches if e["instructions_per_value"]))
        goals = "; ".join(f"{g} ≤ {v['limit']}: {'met' if v['met'] else 'MISSED'} ({v['estimate']})" for g, v in r.goals.items()) or "–"
        rows.append(f"| {r.call['name']} | {r.num_launches} | {r.kernels_us} | {r.replayed_us} | {r.launched_us} | {r.floor_us} | {r.x_floor_replayed} | {loops} | {goals} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_model", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for gpu-model-<date>.json (default bench/results)")
    parser.add_argument("--no-sweep", action="store_true", help="only the goal shapes")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--tag", default=None, help="suffix of the file name: gpu-model-<date>-<tag>.json")
    options = parser.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU, never interpret
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    started = time.time()

    print("H200 performance model (ESTIMATE: compiled sm_90 SASS and stated assumptions, no GPU measurement)")
    for name, value in ASSUMPTIONS.items():
        print(f"  assume {name} = {value}")
    results = []
    calls = [(c, g) for c, g in GOAL_CALLS] + ([] if options.no_sweep else [(c, {}) for c in sweep_calls()])
    for call, goals in calls:
        result = estimate_call(call, goals)
        results.append(result)
        print(f"\n{call.name}: {result.num_launches} launches, kernels {result.kernels_us} µs, replayed {result.replayed_us} µs, "
              f"launched {result.launched_us} µs, floor {result.floor_us} µs ({result.x_floor_replayed}x)")
        for e in result.launches:
            print(f"  {e['name']:<11} grid {e['grid']} ({e['programs']} programs x {e['warps_per_program']} warps, {e['registers']} regs, "
                  f"{e['spill_bytes']} B spilled, {e['ctas_per_sm']} CTAs/SM, {e['waves']} waves): {e['hot_loop'] or '-'} "
                  f"{e['hot_loop_instructions']} instr / {e['values_per_iteration']} values = {e['instructions_per_value']} per value; "
                  f"issue {e['issue_us']} pipe {e['pipe_us']} memory {e['memory_us']} latency {e['latency_us']} -> {e['time_us']} µs ({e['bound']})")
        for goal, verdict in result.goals.items():
            print(f"  goal {goal} <= {verdict['limit']}: {'met' if verdict['met'] else 'MISSED'} (estimate {verdict['estimate']})")
    table = markdown_table(results)
    print("\n" + table)
    report = {
        "kind": "ESTIMATE (performance model from compiled sm_90 SASS; not a measurement)",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "versions": _versions(),
        "assumptions": ASSUMPTIONS,
        "results": [asdict(r) for r in results],
        "elapsed_s": round(time.time() - started, 1),
    }
    if not options.no_write:
        options.out.mkdir(parents=True, exist_ok=True)
        path = options.out / f"gpu-model-{report['date']}{'-' + options.tag if options.tag else ''}.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
