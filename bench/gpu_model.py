"""``python -m bench.gpu_model``: an H200 time ESTIMATE of the Triton verify calls (chains, blocks and trees), without a GPU.

For each goal shape the model

1. plans the call exactly as the launcher does (``_triton_backend.launches_for``, or
   ``_triton_tree.launches_for`` for blocks and trees, on ``meta`` tensors of the real shapes:
   same kernels, grids, arguments and constexprs);
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
tests/triton/test_triton_launches.py (same launches per call as a real interpreted call makes).

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
from dataclasses import asdict, dataclass, field, replace
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
    # specdec_ext.verify's Python up to the launches (validation, key, launch templates, outputs, the
    # calls into Triton's run) on a fast host: 5.6 us measured at B=1 K=4 V=128256 on this 2-core
    # machine (python -m bench.host_overhead, bench/results/host-overhead-2026-12-03.json: 4.34x an
    # empty torch.empty there, best of rounds), against about 1 us for torch.empty on a fast host;
    # scaled by that ratio.
    "python_call_overhead_us": 4.3,
    "python_launch_us": 4.0,  # Triton 3.x JIT launcher per kernel from Python (argument specialisation, cache lookup, cuLaunchKernel)
    # Global reductions (RED.ADD) to distinct addresses served by the L2, per second: a conservative
    # figure (no measurement here); values piling into one bin would serialise on its address.
    "l2_atomics_per_s": 5e11,
    "rejected_rows": "every row rejects at its last draft position: the race reads a target and a draft line (the heavier loop)",
    "sampled_rows": "every row samples (temperature > 0); greedy rows would skip the race and read no draft line",
    "tree_rows": "a tree row walks tree_depth contexts and rejects one child at each before entering the next (one residual-mass pass over its line "
                 "per context, for the next sibling's test; a rejection that ends the walk sums nothing: the race tests its residual); a block row's walk items sum every chunk of S_i (the most; the embedded pair's share, MEASURED, in its own rows); "
                 "both race a residual with a draft line",
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
    # (a branch may also test a predicate operand, "@P5 BRA P6, 0x95b0": taken when both hold)
    match = re.search(r"(?:BRA|CALL\.REL\.NOINC|CALL\.REL|CALL\.ABS\.NOINC)\s+(?:!?U?P[0-9T],\s*)?(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", ins.text)
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
    """One loop of the compiled code: a backward branch and the range it closes."""

    start: int
    end: int
    instructions: int  # its own body per trip (slow paths, NOPs and the bodies of nested loops left out)
    by_pipe: dict
    by_opcode: dict
    parent: int | None = None  # start of the innermost loop around it
    after_wait: bool = False  # after the kernel's first acquire (CCTL.IVALL): the cut-offs kernel's search phase
    after_atomic: bool = False  # after the kernel's first global atomic (the race kernel's finalisation)
    # Of its own body, the instructions after its last nested tile loop (one that loads and
    # exponentiates): what only the last work item of a line runs (the search's finalisers), on its
    # longest path, and on the longest that leaves out the gather's sort (sorted_blocks): what the
    # last item of a pass that gathered nothing runs at most.
    tail: int = 0
    tail_without_sort: int = 0
    # ... and through its byte histograms around the sort (DIGIT_SELECT: a top-k gather's cut, under
    # top-k alone; 0 where the code has none), which the other passes' longest path leaves out.
    tail_top_k: int = 0
    # Of the threshold items' loop: its longest path around the sort (a line its statistics' top
    # windows settle before its candidates are sorted), and the longest around it through its tile
    # loops (a line its top-p window settles: that window's steps); 0 where it has no sort.
    around_sort: int = 0
    through_tiles: int = 0
    # Of the threshold items' loop where a top-k line's sample may place its first gather
    # (SAMPLE_RUNS): its longest path around the sample (a line that does not sample), and through
    # it around the sort (a line that samples: its candidates, which cannot settle it, stay unsorted).
    around_sample: int = 0
    around_sample_top_k: int = 0  # the same for a top-k line: around the test of a top-p line's candidates' mass
    through_sample: int = 0
    # ... and where a 16-bit top-p line's sample may place its first raw window: the longest path
    # through that sample (such a line's candidates are sorted first).
    through_p_sample: int = 0
    # Of a threshold items' or search items' loop: the barriers on its path that meets the most
    # (-1: every barrier of its body, each trip), as a program takes one branch of each if.
    path_barriers: int = -1
    # ... and on each route above, by its name ("head": a search item's body before its tail): a
    # trip meets the barriers of the route it takes, not a share of the longest path's.
    route_barriers: dict = field(default_factory=dict)

    def has(self, opcode: str) -> int:
        return sum(n for name, n in self.by_opcode.items() if name == opcode or name.startswith(opcode + "."))


def basic_blocks(body: list[Instruction]) -> tuple[list[list[Instruction]], list[list[int]]]:
    """The basic blocks of ``body`` in address order (a block starts at a branch target or after a
    branch or exit) and each block's successors (indices)."""
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
        blocks.append(body[start:end])
        last = body[end - 1]
        predicated = last.predicated
        successors = []
        if last.base == "BRA":
            target = _branch_target(last)
            if target is not None and target in index:
                successors.append(block_of[index[target]])
            # (BRA.DIV leaves a diverged warp for the out-of-line code that converges it: the
            # warp it finds converged, the path counted, goes on)
            # (a predicate operand makes a branch conditional too)
            if (predicated or last.opcode.startswith("BRA.DIV") or re.match(r"BRA\S*\s+!?U?P[0-9T],", last.text)) and end < len(body):
                successors.append(b + 1)
        elif last.base == "EXIT":
            if predicated and end < len(body):
                successors.append(b + 1)
        elif end < len(body):
            successors.append(b + 1)
        edges.append(successors)
    return blocks, edges


def longest_path(body: list[Instruction], cold: set[int], counted=lambda instruction: True, avoid: frozenset = frozenset(),
                 through: frozenset = frozenset()) -> int:
    """Instructions on the longest path from entry to exit through the main body, the addresses in
    ``cold`` (slow paths, loop bodies) weighing nothing and the back edges a depth-first search finds
    dropped: what one program executes at most outside its loops (an if/else counts its longer
    branch, not both). ``counted``: the instructions that count (all; the barriers for the most a
    program meets). ``avoid``: addresses no path may pass (a program that takes the other way
    around them); ``through``: addresses one of which every path passes (a program that runs that
    code); -1 when no path is left."""
    if not body:
        return 0
    found, edges = basic_blocks(body)
    blocks = [sum(1 for i in block if i.address not in cold and counted(i)) for block in found]
    dead = {b for b, block in enumerate(found) if any(i.address in avoid for i in block)}
    forward = _forward_edges(edges)
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
        after = [best[n] for n in forward[node] if best[n] >= 0]
        best[node] = -1 if node in dead or (forward[node] and not after) else blocks[node] + max(after, default=0)
    if not through:
        return best[0]
    # The longest way from the entry to each block (reverse postorder: predecessors first), then
    # the longest path through a block that holds a ``through`` address.
    upto = {node: -1 for node in order}
    upto[0] = -1 if 0 in dead else blocks[0]
    for node in reversed(order):
        if upto[node] >= 0:
            for n in forward[node]:
                if n not in dead:
                    upto[n] = max(upto[n], upto[node] + blocks[n])
    passing = [upto[b] + best[b] - blocks[b] for b, block in enumerate(found) if b in upto and upto[b] >= 0 and best[b] >= 0
               and any(i.address in through for i in block)]
    return max(passing, default=-1)


def _forward_edges(edges: list[list[int]]) -> list[list[int]]:
    """The blocks' edges less the back edges a depth-first search from the entry finds (an edge to
    a block on its stack closes a loop): an acyclic graph of the same paths."""
    state = [0] * len(edges)  # 0 new, 1 on the stack, 2 done
    forward = [[] for _ in edges]
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
    return forward


def _reach(body: list[Instruction], start: frozenset, backward: bool) -> set[int]:
    """Addresses of ``body`` on a path from an address in ``start`` (``backward``: to one), without
    going back round a loop (over the forward edges from its entry), ``start``'s blocks included."""
    if not body or not start:
        return set()
    found, edges = basic_blocks(body)
    forward = _forward_edges(edges)
    graph = forward
    if backward:
        graph = [[] for _ in found]
        for node, successors in enumerate(forward):
            for n in successors:
                graph[n].append(node)
    todo = [b for b, block in enumerate(found) if any(i.address in start for i in block)]
    seen = set(todo)
    while todo:
        for n in graph[todo.pop()]:
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return {i.address for b in seen for i in found[b]}


def reached_from(body: list[Instruction], start: frozenset) -> set[int]:
    """Addresses of ``body`` a path from an address in ``start`` reaches without going back round a
    loop (over the forward edges from its entry)."""
    return _reach(body, start, backward=False)


def reaching(body: list[Instruction], targets: frozenset) -> set[int]:
    """Addresses of ``body`` from which a path reaches an address in ``targets`` without going back
    round a loop, the targets' own blocks included."""
    return _reach(body, targets, backward=True)


def histogram_blocks(body: list[Instruction], cold: set[int]) -> frozenset:
    """Addresses of the basic blocks of ``body`` (less ``cold``: loop bodies) that count by
    shared-memory atomics (ATOMS: ``tl.histogram`` where it lowers so, Triton 3.8 on): in a
    threshold item, a sample's byte digits; in a search item's tail, a top-k gather's
    (DIGIT_SELECT)."""
    blocks, _ = basic_blocks(body)
    return frozenset(i.address for block in blocks if any(i.base == "ATOMS" and i.address not in cold for i in block) for i in block)


@dataclass
class KernelCode:
    registers: int
    spill_bytes: int
    shared_bytes: int
    instructions: int  # in the main body
    loops: list[Loop]  # every loop, outer ones included, in address order
    path: int  # longest entry-to-exit path outside the loops (see longest_path)
    straight: int  # main-body instructions outside every loop
    straight_by_pipe: dict
    barriers_outside_loops: int  # on the path with the most of them (one copy of an if / else)
    opcode_counts: dict = field(default_factory=dict)
    # Phases of a kernel that first works on its own items, then waits (an acquire: the first
    # L1 invalidation, CCTL.IVALL) and works on items that depend on other programs' (the cut-offs
    # kernel): (path outside loops, barriers outside loops) of the code before and from that point.
    phases: dict = field(default_factory=dict)
    body: list = field(default_factory=list, repr=False)  # the main body's instructions (path_skipping)
    outside: set = field(default_factory=set, repr=False)  # the addresses longest_path weighs nothing: slow paths, loop bodies


def path_skipping(code: KernelCode, loops: list[Loop]) -> tuple[int, int]:
    """(longest path, barriers) outside the loops of a program whose uniform branches around
    ``loops`` skip them (a statistics program of a line that does not count its keys): around each,
    the outermost predicated forward branch before it whose target lies past it and whose skipped
    code holds no other loop, what it skips weighing nothing; (code.path, its barriers) when none."""
    skipped: set[int] = set()
    others = [loop for loop in code.loops if loop not in loops]
    for loop in loops:
        around = [i for i in code.body if i.base == "BRA" and i.predicated and i.address < loop.start and (_branch_target(i) or 0) > loop.end
                  and not any(i.address < other.start < _branch_target(i) for other in others)]
        if around:
            branch = min(around, key=lambda i: i.address)  # (the outermost)
            skipped |= {i.address for i in code.body if branch.address < i.address < _branch_target(branch)}
    return longest_path(code.body, code.outside | skipped), longest_path(code.body, code.outside | skipped, _barrier)


def _mix(instructions: list[Instruction]) -> tuple[dict, dict]:
    opcodes = Counter(i.opcode for i in instructions)
    pipes: Counter = Counter()
    for ins in instructions:
        pipes[PIPES.get(ins.base, "alu")] += 1
    return dict(pipes), dict(opcodes)


def loop_ranges(body: list[Instruction]) -> list[tuple[int, int]]:
    """(first, last) address of every loop: a backward branch before the kernel's last EXIT (the
    branches back from the out-of-line warp-divergence paths placed after it are no loops)."""
    exits = [i.address for i in body if i.base == "EXIT"]
    last_exit = max(exits) if exits else body[-1].address if body else 0
    ranges = set()
    for ins in body:
        if ins.base == "BRA" and ins.address < last_exit:
            target = _branch_target(ins)
            if target is not None and target <= ins.address:
                ranges.add((target, ins.address))
    return sorted(ranges)


def sorted_blocks(body: list[Instruction]) -> set[int]:
    """Addresses of the basic blocks of ``body`` that sort (``tl.sort``'s bitonic network, unrolled:
    its compare-exchanges test a comparison XOR the direction, ISETP.*.XOR, which nothing else in
    a search item's tail compiles to)."""
    blocks, _ = basic_blocks(body)
    return {i.address for block in blocks if any(i.base == "ISETP" and ".XOR" in i.opcode for i in block) for i in block}


def _barrier(instruction: Instruction) -> bool:
    return instruction.base == "BAR"


def _route_lengths(body: list[Instruction], cold: set[int], avoid: frozenset = frozenset(), through: frozenset = frozenset()) -> tuple[int, int]:
    """(instructions, barriers) on a route's longest path (longest_path's arguments), 0 where no
    path is left."""
    return (max(longest_path(body, cold, avoid=avoid, through=through), 0),
            max(longest_path(body, cold, _barrier, avoid=avoid, through=through), 0))


def sample_loop(loop: Loop) -> str | None:
    """The sample a threshold item's inner loop bisects, read from its code: none when it loads
    (a tile loop); a top-p sample's ("top-p") when it exponentiates (a 16-bit raw window's: the
    weight at each key) or compares float64 estimates of the line (its mass, or its count); else
    a top-k sample's ("top-k": counts against a rank, in integers)."""
    if loop.has("LDG"):
        return None
    return "top-p" if loop.has("MUFU") or loop.has("DSETP") else "top-k"


def sample_steps_per_trip(loop: Loop, kind: str) -> int:
    """Bisection steps one trip of a sample's loop takes (the compiler may unroll a few): each
    step compares one float64 estimate, two for a top-p gather's window (its two bounds)."""
    per_step = 2 if kind == "top-p gather window step" else 1
    return max(1, loop.has("DSETP") // per_step) if kind in ("top-p gather estimate step", "top-p gather window step") else 1


def analyse(sass: str, resources: str) -> KernelCode:
    body = [i for i in _main_body(parse_sass(sass)) if i.base != "NOP"]
    cold = _cold_addresses(body)
    hot = [i for i in body if i.address not in cold]
    ranges = loop_ranges(body)
    wait = next((i.address for i in body if i.opcode.startswith("CCTL.IVALL")), None)
    atomic = next((i.address for i in body if i.base in ("ATOM", "ATOMG", "RED", "REDG")), None)
    loops = []
    for start, end in ranges:
        inner = [r for r in ranges if r != (start, end) and start <= r[0] and r[1] <= end]
        outer = [r for r in ranges if r != (start, end) and r[0] <= start and end <= r[1]]
        own = [i for i in hot if start <= i.address <= end and not any(a <= i.address <= b for a, b in inner)]
        by_pipe, by_opcode = _mix(own)
        parent = min(outer, key=lambda r: r[1] - r[0])[0] if outer else None
        loops.append(Loop(start, end, len(own), by_pipe, by_opcode, parent, wait is not None and start > wait, atomic is not None and start > atomic))
    for loop in loops:
        if not loop.instructions:
            continue
        inner = {i.address for i in body for a, b in ranges if (a, b) != (loop.start, loop.end) and loop.start <= a and b <= loop.end and a <= i.address <= b}
        skip = cold | inner
        own = [i for i in body if loop.start <= i.address <= loop.end]
        tile_loops = [c for c in loops if c.parent == loop.start and c.has("LDG") and (c.has("MUFU") or c.has("ATOMS"))]
        sort = frozenset(sorted_blocks(own)) if loop.parent is None else frozenset()
        if wait is not None and loop.end < wait and sort:
            # The threshold items (work items before the acquire, which sort): each line takes one
            # branch per kind (its statistics' top-p window, its top windows, or its candidates
            # alone), which may rejoin after its tile loops: the longest path whole, as for the code
            # outside loops, and the longest around the sort, through the tile loops or any way.
            tiles = frozenset(i.address for i in own for c in loops if c.parent == loop.start and c.has("LDG") and c.has("MUFU")
                              and c.start <= i.address <= c.end)
            whole = longest_path(own, skip)
            # (a sample's bisections: loops inside the item with no load, a top-p sample's with float64 estimates)
            sampling = frozenset(i.address for i in own for c in loops if c.parent == loop.start and sample_loop(c) == "top-k"
                                 and c.start <= i.address <= c.end)
            p_sampling = frozenset(i.address for i in own for c in loops if c.parent == loop.start and sample_loop(c) == "top-p"
                                   and c.start <= i.address <= c.end)
            # (a sample's byte digits, DIGIT_SELECT: straight code, a top-p sample's after its
            # estimate's loop, a top-k sample's where no such loop leads)
            digits = histogram_blocks(own, skip)
            p_digits = digits & reached_from(own, p_sampling)
            sampling, p_sampling = sampling | (digits - p_digits), p_sampling | p_digits
            # (a top-p line's candidates' mass tested against its budget before they would be sorted:
            # float64 tests on the way to the sort, which no top-k line takes)
            before_sort = reaching(own, sort) - sort - sampling - p_sampling
            p_mass = frozenset(i.address for block in basic_blocks(own)[0] if any(i.base == "DSETP" and i.address in before_sort for i in block)
                               for i in block)
            routes = {  # (avoid, through, whether the code has the route) of each route a line may take
                "around_sample": (sampling | p_sampling, frozenset(), sampling | p_sampling),
                "around_sample_top_k": (sampling | p_sampling | p_mass, frozenset(), sampling | p_sampling),
                # (a top-k line that samples leaves its candidates unsorted: around the sort, through its sample)
                "through_sample": (sort | p_sampling | p_mass, sampling, sampling),
                # (a top-p line that samples has candidates short of its budget: around the sort, through its sample)
                "through_p_sample": (sampling | sort, p_sampling, p_sampling),
                "around_sort": (sort, frozenset(), True),
                "through_tiles": (sort, tiles, tiles),
            }
            for name, (avoid, through, present) in routes.items():
                length, loop.route_barriers[name] = _route_lengths(own, skip, avoid, through) if present else (0, 0)
                setattr(loop, name, length)
            loop.path_barriers = longest_path(own, skip, _barrier)
        elif tile_loops:
            # A search item: each trip takes one branch of its body to its tile loops (one stage's),
            # and a line's last item one branch of the tail: the longest of each. The tail is the
            # code after a tile loop that leads to none (the compiler may place one copy's tail
            # before another copy's tiles: addresses do not tell them apart).
            tiles = frozenset(i.address for i in own for c in tile_loops if c.start <= i.address <= c.end)
            tail_addresses = (reached_from(own, tiles) - reaching(own, tiles)) - skip
            head_addresses = {i.address for i in own} - tail_addresses
            tail = [i for i in own if i.address in tail_addresses]
            head, head_barriers = _route_lengths(own, skip | tail_addresses)
            loop.tail, tail_barriers = _route_lengths(own, skip | head_addresses)
            sort, digits = sorted_blocks(tail), histogram_blocks(tail, skip)
            loop.tail_without_sort, without_sort_barriers = _route_lengths(own, skip | head_addresses | sort | digits)
            loop.tail_top_k, top_k_barriers = _route_lengths(own, skip | head_addresses | sort, through=digits) if digits else (0, 0)
            loop.path_barriers = head_barriers + tail_barriers
            loop.route_barriers = {"head": head_barriers, "tail": tail_barriers, "tail_without_sort": without_sort_barriers, "tail_top_k": top_k_barriers}
            whole = head + loop.tail
        else:
            continue
        # (the pipe mix scaled to match)
        scale = whole / loop.instructions
        loop.by_pipe = {pipe: n * scale for pipe, n in loop.by_pipe.items()}
        loop.instructions = whole
    in_loops = {i.address for i in hot if any(a <= i.address <= b for a, b in ranges)}
    straight = [i for i in hot if i.address not in in_loops]
    straight_pipes, _ = _mix(straight)
    usage = re.search(r"REG:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", resources)
    registers, shared, local = (int(usage.group(k)) for k in (1, 2, 3)) if usage else (0, 0, 0)
    # Registers spilled by ptxas go to the stack frame (LOCAL counts local arrays only): a 255-register
    # build with a 600-byte frame spilled in its loop and measured 3x its estimate on an H200. A
    # frame also holds values kept across the out-of-line division's CALL, a few in a work item's
    # loop, a long sort (one access in ~2000 instructions) or a spin-wait (strong loads only), so
    # it counts only where a tile loop (innermost, reading values with plain loads) accesses it at
    # least once per 64 instructions (the spilling statistics loop: once per 19).
    stack = re.search(r"STACK:(\d+)", resources)
    parents = {loop.parent for loop in loops}

    def tile_loop(loop: Loop) -> bool:
        return loop.start not in parents and any(op.startswith("LDG") and "STRONG" not in op for op in loop.by_opcode)

    if stack and any(tile_loop(loop) and 64 * (loop.has("STL") + loop.has("LDL")) >= loop.instructions for loop in loops):
        local += int(stack.group(1))
    outside = cold | in_loops
    phases = {}
    if wait is not None:
        for name, part in (("before_wait", [i for i in body if i.address < wait]), ("from_wait", [i for i in body if i.address >= wait])):
            phases[name] = (longest_path(part, outside), longest_path(part, outside, _barrier))
    return KernelCode(
        registers, local, shared, len(body), loops, longest_path(body, outside), len(straight), straight_pipes, longest_path(body, outside, _barrier),
        dict(Counter(i.opcode for i in hot)), phases, body, outside,
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
    # Lines whose cut the candidates do not settle (the whole-line search in the cut-offs launch),
    # and what their searches take, data-dependent counts: the measured distribution (MEASURED),
    # or 1.0 for the whole-line fallback rows, whose searches select_search follows on synthetic
    # lines (``synthetic_search``). Per searched line: passes; of those, the share that binned
    # masses by atomics (stage 3); per pass, the fraction of a line's values added by atomics.
    search_fraction: float = 0.0
    search_passes: float | None = None  # None: synthetic_search's
    search_exact_share: float = 0.0
    search_value_share: float = 0.0  # stages 2 and 6
    search_value_count_share: float = 0.0  # stage 2 (counts only)
    search_gather_share: float = 0.0
    search_count_share: float = 0.0
    search_window_share: float = 0.0
    search_raw_count_share: float = 0.0
    search_raw_share: float = 0.0
    search_raw_window_share: float = 0.0
    search_atomics: float = 0.0
    # Of the lines, the share whose statistics count their top-p window (16-bit, top-p alone, one
    # statistics part a line, the candidates do not settle it: stats.py), and the threshold
    # item's scan steps over it per such line (thresholds.py), MEASURED like the search's.
    top_p_window_share: float = 0.0
    top_p_window_steps: float = 0.0
    top_p_settled_share: float = 0.0  # lines a top-p window settles (their threshold items sort no candidates)
    top_k_window_share: float = 0.0  # lines whose top windows hold k values (likewise)
    sampled_share: float = 0.0  # lines whose threshold item places their first gather from a sample (SAMPLE_RUNS: Triton 3.6, 3.7; float32 calls on any)
    top_p_sampled_share: float = 0.0  # 16-bit top-p lines whose threshold item places their first raw window from a sample (SAMPLE_RUNS)
    search_window_atomics: float = 0.0  # per pass, the fraction of a line's values a raw window counts by global atomics (SAMPLE_RUNS)
    search_halvings: float = 0.0  # per pass, the trips of a gather's top-p cut halvings (select.py's _top_p_cut; 0 for any other pass), MEASURED
    # "token" (verify), "block" (verify(method="block")) or "tree" (verify_tree: k is then the
    # number of nodes N, the target and draft logits have N+1 contexts).
    method: str = "token"
    siblings: str = "iid"  # a tree's sibling mode
    tree_depth: int | None = None  # how deep a tree's walks go (default: k, a chain-shaped tree); the outputs are k + 1 wide whatever it is
    # A launcher geometry override (a chain call's): the statistics programs a line, for a study of
    # the plan (None: the launcher's own).
    stats_parts: int | None = None
    # A block walk's work items that sum their chunk of a residual mass S_i (a sampled row's position
    # below n whose coin may stop the walk there: tree.py's _may_stop), of all (K-1) a row:
    # MEASURED on the embedded pair (measure_block_walks), or None for every item (the most).
    block_summed: float | None = None
    # The residual-mass passes over a line of the tree row that walks most (its program lasts
    # longest; every row is charged as many): None for one at each of tree_depth contexts (the most
    # a walk that enters tree_depth contexts makes), or counted on the rows' inputs (tree_walk_passes).
    tree_passes: float | None = None

    @property
    def whole_line(self) -> bool:
        return self.search_fraction > 0

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
    """VerifyArgs (TreeArgs for a tree) of ``call`` on the meta device (shapes, dtypes, flags; no data)."""
    import torch

    from specdec_ext._params import TreeArgs, VerifyArgs

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    meta = torch.device("meta")
    b, k, v = call.batch, call.k, call.vocab
    target = torch.empty(b, k + 1, v, dtype=dtypes[call.dtype], device=meta)
    row = lambda dt: torch.empty(b, dtype=dt, device=meta)  # noqa: E731
    if call.method == "tree":
        draft = torch.empty(b, k + 1, call.draft_vocab or v, dtype=dtypes[call.draft_dtype or call.dtype], device=meta) if call.draft == "logits" else None
        return TreeArgs(
            target, draft, torch.empty(b, k, dtype=torch.int64, device=meta), torch.empty(b, k, dtype=torch.int64, device=meta), row(torch.float32),
            row(torch.int64), row(torch.float32), row(torch.int64), call.siblings, None, call.check, row(torch.int64) if call.seeds else None,
            row(torch.int64) if call.offsets else None, call.filtered,
        )
    draft = torch.empty(b, k, call.draft_vocab or v, dtype=dtypes[call.draft_dtype or call.dtype], device=meta) if call.draft == "logits" and k else None
    return VerifyArgs(
        target, draft, torch.empty(b, k, dtype=torch.int64, device=meta), row(torch.float32), row(torch.int64), row(torch.float32), row(torch.int64),
        None, call.check, call.filtered, row(torch.int64) if call.seeds else None, row(torch.int64) if call.offsets else None, call.stream,
        call.logprobs, call.accept_probs,
    )


def launches(call: Call, multiprocessors: int):
    """The launches of ``call`` as its launcher plans them (the chain's, or the tree and block one's)."""
    from specdec_ext import _triton_backend, _triton_tree

    if call.method == "token":
        overrides = {"stats_parts": call.stats_parts} if call.stats_parts else {}
        return _triton_backend.launches_for(meta_args(call), base_key=(1 << 40) + 3, sm_count=multiprocessors, **overrides)
    return _triton_tree.launches_for(meta_args(call), base_key=(1 << 40) + 3, sm_count=multiprocessors)


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
    loops: list  # every loop of the compiled code: [kind, own instructions per trip, trips per program]
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


# ---------------------------------------------------------------------------------------------
# Every loop of every kernel, by kind. The kinds are told apart by what their bodies execute; a
# kind the code has twice (the target's and the draft's inlined copies, or an unmasked and a
# masked copy) is numbered in address order. tests/support/triton_compile_check.py fails on a loop of any
# compiled variant that gets no kind, and _work gives every kind its trip count.


# Every loop kind the kernels have, and where its trip count comes from (_work).
LOOP_KINDS = {
    "greedy tile": "statistics tiles of a greedy line: 0 (the modelled rows sample)",
    "sampled tile": "statistics tiles of a sampled line: the line's tiles over its parts (phase 0; phase 2 for the searched lines only)",
    "candidate tile": "statistics tiles of a filtered line with its top three per lane: the line's tiles over its parts (phase 1)",
    "key count block": "a line under a top-k above HISTOGRAM_TOP_K: its part read again (from L2) and counted in the 256 bins of the search's first pass "
                       "(a 16-bit line's raw keys' high byte, a float32 line's order keys'; with KEY_WINDOW a 16-bit part's top window's 255 single "
                       "raw keys in 256 more), 2 * T_LANES values a step",
    "top-p window count block": "a bf16 line cut by top-p alone, read whole by one part, that its candidates do not settle: the line read again "
                                "(from L2) and counted in TOP_P_BINS bins of single raw keys, TOP_P_BLOCK values a step (top_p_window_share, MEASURED)",
    "top-p window sum step": "a threshold item sums such a line's top-p window from the top, TOP_P_STEP bins a step, until the cut's step "
                             "(top_p_window_steps, MEASURED)",
    "top-p window scan": "then scans that step (a running sum): one per such line",
    "sample bisection step": "SAMPLE_RUNS (Triton 3.6, 3.7; float32 calls on any): a threshold item places a top-k line's first gather from a sample of the line held in "
                             "registers, 16 halvings of the keys' high half: 16 per sampled line (sampled_share, MEASURED); with DIGIT_SELECT (Triton 3.8 on) "
                             "two byte histograms instead, straight code on the item's path through its sample",
    "top-p sample bisection step": "SAMPLE_RUNS, 16-bit lines: a threshold item places a top-p line's first raw window from a sample of the line (its weights held "
                                   "in registers), 16 halvings of the raw keys: 16 per sampled line (top_p_sampled_share, MEASURED)",
    "top-p gather estimate step": "SAMPLE_RUNS, a call of 32-bit lines: a threshold item places a top-p line's first gather from a sample of the line, "
                                  "16 halvings of the keys' high half by the sampled mass: 16 per sampled line, over the steps a trip takes "
                                  "(the float64 tests a trip compiles; top_p_sampled_share, MEASURED)",
    "top-p gather window step": "then the gather's two bounds, 16 halvings by the sampled counts: 16 per sampled line, over the steps a trip takes "
                                "(DIGIT_SELECT: byte histograms, straight code on the item's path through its sample)",
    "residual race tile": "race tiles of a rejected row: the vocabulary over the row's chunks (every row rejects, ASSUMPTIONS)",
    "bonus race tile": "race tiles of an accepted row: 0 (every row rejects)",
    "zero-residual race (rare)": "the finalising program's race when every residual weight is zero (on p; a tree's on the residual before its last rejection, then p), with its removed-id tests: 0 (rounding corner)",
    "finalising block": "the last program of a row reads the chunk results: ceil(chunks / FINAL_BLOCK), once per row",
    "threshold ticket loop": "one work item per line over the candidates (the sort unrolled: no inner loop; a line cut from its statistics' "
                             "windows goes around it: unsorted_share, MEASURED): lines / programs each for the pipes and schedulers, "
                             "ceil of it on the slowest program's critical path (as every drawn item kind)",
    "spin wait": "waits for other programs' items: no instructions of its own beyond the wait (latency of what it waits for)",
    "search ticket loop": "whole-line search items: searched lines x runs of 1, 2 or 4 chunks (cutoffs.py) per pass over the programs (search_fraction, search_passes: MEASURED)",
    "mass histogram tile": "CHUNK / TILE steps per search item of a pass that bins masses (stage 3: search_exact_share of the passes, MEASURED)",
    "value count histogram tile": "CHUNK / TILE steps per search item of top-p's first pass over value bins, which only counts (stage 2: "
                                  "search_value_count_share, MEASURED)",
    "value histogram tile": "CHUNK / TILE steps per search item of a second pass over value bins, which sums the mass above them (stage 6: "
                            "search_value_share less search_value_count_share, MEASURED)",
    "gather tile": "CHUNK / TILE steps per search item of a top-k gather (stage 4: search_gather_share less search_window_share, MEASURED)",
    "window gather tile": "CHUNK / TILE steps per search item of a top-p window's gather, which sums the mass above it (stage 5: search_window_share, MEASURED)",
    "walk ticket loop": "a filtered tree or block call's walk items, in the cut-offs launch: a tree's one a row, a block's B * (K-1) * chunks",
    "histogram tile": "CHUNK / TILE steps per search item of a top-k pass over key bins that can end the search (it sums the mass above)",
    "count histogram tile": "CHUNK / TILE steps per search item of a top-k pass over key bins that only counts (search_count_share, MEASURED)",
    "raw count histogram tile": "CHUNK / TILE steps per search item of a 16-bit line's first top-k pass, over its raw keys (stage 7: search_raw_count_share, MEASURED)",
    "raw histogram tile": "CHUNK / TILE steps per search item of a 16-bit line's top-k pass over single raw keys (stage 7: search_raw_share, MEASURED)",
    "raw window tile": "CHUNK / TILE steps per search item of a 16-bit line's top-p window of single raw keys, which sums the mass above it and reads no "
                       "count (stage 8: search_raw_window_share, MEASURED)",
    "raw window atomic tile": "the same where its counts are global atomics (SAMPLE_RUNS: tl.histogram is warp ballots), one a value inside the window "
                              "(search_window_atomics, MEASURED, at the L2's atomic rate)",
    "histogram sum": "the last item of a line's pass sums the chunks' histograms, four chunks per step",
    "top-p cut halving step": "a gather's top-p cut by halvings over its keys, by a line's last item of the pass (stage 5, and stage 4 under top-p): "
                              "the bit length of the gathered keys' span (search_halvings per pass, MEASURED)",
    "raw floor step": "each item of a 16-bit line's top-k gather (stage 4) first finds the lowest raw key of its set: 17 halvings (search_gather_share "
                      "less search_window_share of the items, MEASURED)",
    "context step": "a tree walk's contexts: tree_depth + 1 per row",
    "line check step": "check=True: every context a tree row could use, N + 1 per row",
    "sibling test": "a tree walk's test of each node at each context (is it a child?): N per context",
    "residual-mass tile": "a pass over a line after a rejection (tree), or a block walk item's chunk of S_i where the coin may stop the walk (block_summed "
                          "of the items, MEASURED): walk blocks of ids",
    "removed-id test": "one removed sibling per step of a residual tile (a tree without replacement or with deterministic siblings): 1 per tile",
    "block position step": "block verification's p_i, one per draft position: K per row",
    "stop search step": "block verification's search for the last passing coin from n down, by a row's last walk item: K per row (the most)",
    "walk sum step": "that search's read of a position's summed chunks of S_i: chunks per position, K positions per row (the most)",
}


def unknown_loops(kernel: str, code: KernelCode) -> list[Loop]:
    """Loops of the compiled code that the model has no kind (and so no trip count) for."""
    return [loop for loop, kind in zip(code.loops, loop_kinds(kernel, code), strict=True)
            if kind is None or kind.replace(" (masked)", "") not in LOOP_KINDS]


def _paired(loops: list[Loop], kind: str) -> list[str]:
    """Kinds of loops that come as (unmasked, masked) pairs in address order (whole tiles, then the
    ragged last tile)."""
    return [kind + (" (masked)" if n % 2 else "") for n in range(len(loops))]


def _atomics(loop: Loop) -> int:
    return sum(loop.has(op) for op in ("RED", "REDG", "ATOM", "ATOMG"))


def loop_kinds(kernel: str, code: KernelCode) -> list[str | None]:
    """The kind of each of ``code.loops`` (None: a loop the model does not know)."""
    kinds: list[str | None] = [None] * len(code.loops)
    index = {id(loop): n for n, loop in enumerate(code.loops)}

    def name(loops: list[Loop], labels: list[str]) -> None:
        for loop, label in zip(loops, labels, strict=True):
            kinds[index[id(loop)]] = label

    if kernel == "line_stats":
        groups: dict = {"greedy tile": [], "sampled tile": [], "candidate tile": [], "key count block": [], "top-p window count block": []}
        for loop in code.loops:
            if not loop.has("LDG") or loop.parent is not None:
                continue
            ex2 = loop.has("MUFU.EX2")
            if not ex2 and loop.has("ATOMS") and loop.has("LDS") >= 16:
                groups["top-p window count block"].append(loop)  # a histogram of thousands of bins: its read-back is many shared loads a step
            elif not ex2 and (loop.has("ATOMS") or loop.has("VOTE")):
                groups["key count block"].append(loop)  # a histogram's shared atomics (Triton 3.8, 3.9) or ballots (3.6, 3.7)
            elif not ex2 or loop.has("IMNMX") or loop.has("VIMNMX"):
                groups["greedy tile"].append(loop)  # the argmax keeps an index (integer min); raw sums only with logprobs
            elif loop.has("FMNMX") >= 3 * ex2:
                groups["candidate tile"].append(loop)  # five min / max per value for the top three
            else:
                groups["sampled tile"].append(loop)
        for kind, loops in groups.items():
            name(loops, _paired(loops, kind))
    elif kernel == "race":
        tiles = [loop for loop in code.loops if loop.has("MUFU") and not loop.after_atomic]
        name(tiles[:2], _paired(tiles[:2], "residual race tile"))  # the rejected rows' race comes first in the code,
        name(tiles[2:4], _paired(tiles[2:4], "bonus race tile"))  # then the accepted rows' (p only)
        rare = [loop for loop in code.loops if loop.has("MUFU") and loop.after_atomic]
        name(rare, ["zero-residual race (rare)"] * len(rare))
        final = [loop for loop in code.loops if loop.has("LDG") and not loop.has("MUFU") and loop.after_atomic]
        name(final, ["finalising block"] * len(final))
    elif kernel in ("tree_walk", "block_walk"):
        _walk_kinds(kernel, code.loops, None, kinds)
    elif kernel in ("tree_race", "block_race"):
        rare = set()  # (parents come before their children in address order)
        for n, loop in enumerate(code.loops):
            if loop.parent is not None:
                kinds[n] = "zero-residual race (rare)" if loop.parent in rare else "removed-id test"  # a rare race's own: none
            elif loop.has("MUFU"):
                kinds[n] = "zero-residual race (rare)" if loop.after_atomic else "residual race tile"
                if loop.after_atomic:
                    rare.add(loop.start)
            elif loop.after_atomic and loop.has("LDG"):
                kinds[n] = "finalising block"
    elif kernel == "cutoff":
        _cutoff_kinds(code.loops, kinds)
    elif kernel in ("tree_cut_walk", "block_cut_walk"):
        # The cut-offs launch's loops, then (last in the code) the walk items' ticket loop around
        # the walk's own loops.
        parents = {loop.parent for loop in code.loops if loop.parent is not None}
        ticket = max((loop for loop in code.loops if loop.parent is None and loop.start in parents and loop.after_wait), key=lambda loop: loop.start)
        inside = {ticket.start}
        for loop in code.loops:  # parents come before their children in address order
            if loop.parent in inside:
                inside.add(loop.start)
        walk = [n for n, loop in enumerate(code.loops) if loop.start in inside and loop is not ticket]
        _walk_kinds(kernel.replace("_cut", ""), [code.loops[n] for n in walk], ticket.start, kinds, walk)
        kinds[code.loops.index(ticket)] = "walk ticket loop"
        rest = [n for n, loop in enumerate(code.loops) if loop.start not in inside]
        _cutoff_kinds([code.loops[n] for n in rest], kinds, rest)
    return kinds


def _walk_kinds(kernel: str, loops: list[Loop], top: int | None, kinds: list, at: list[int] | None = None) -> None:
    """Kinds of a tree or block walk's loops into ``kinds`` (at the indices ``at``; ``top``: the
    parent its outermost loops have)."""
    has_children = {loop.parent for loop in loops if loop.parent is not None}
    kind_of = {}
    for n, loop in zip(at if at is not None else range(len(loops)), loops, strict=True):
        parent = kind_of.get(loop.parent)
        if loop.parent == top:
            if kernel == "block_walk":
                kind = ("residual-mass tile" if loop.has("LDG") and loop.has("MUFU") else "stop search step" if loop.start in has_children
                        else "block position step")
            else:
                kind = "context step" if loop.start in has_children else "line check step" if loop.has("LDG") else None
        elif parent in ("context step",):
            kind = "sibling test"
        elif parent == "sibling test":
            kind = "residual-mass tile"
        elif parent == "stop search step":
            kind = "walk sum step"  # (a row's last item: its positions' summed chunks)
        elif parent == "residual-mass tile":
            kind = "removed-id test"
        else:
            kind = None
        kind_of[loop.start] = kinds[n] = kind


def _cutoff_kinds(loops: list[Loop], kinds: list, at: list[int] | None = None) -> None:
    """Kinds of the cut-offs launch's loops (its threshold items, then its search items) into
    ``kinds`` (at the indices ``at``)."""
    parents = {loop.parent for loop in loops if loop.parent is not None}
    for n, loop in zip(at if at is not None else range(len(loops)), loops, strict=True):
        if loop.start in parents:
            kinds[n] = "search ticket loop" if loop.after_wait else "threshold ticket loop"
        elif not loop.after_wait and loop.parent is not None and sample_loop(loop) == "top-k":
            kinds[n] = "sample bisection step"  # (inside a threshold item: a sampled top-k's lo, on keys held in registers)
        elif not loop.after_wait and loop.parent is not None and sample_loop(loop) == "top-p" and loop.has("MUFU"):
            kinds[n] = "top-p sample bisection step"  # (a sampled top-p window's: each key's weight, on weights held in registers)
        elif not loop.after_wait and loop.parent is not None and sample_loop(loop) == "top-p":
            # (a 32-bit line's sampled top-p gather: the cut's bucket by the sampled mass, then its
            # window's bounds by the sampled counts, popcounts of the buckets' tests)
            kinds[n] = "top-p gather window step" if loop.has("POPC") else "top-p gather estimate step"
        elif not loop.after_wait and loop.parent is not None and loop.has("LDG") and loop.has("MUFU"):
            # (inside a threshold item: the steps summed from the top, then the one scanned, a running sum)
            kinds[n] = "top-p window scan" if loop.has("SHFL.UP") else "top-p window sum step"
        elif loop.has("CCTL") and loop.instructions < 64 and not loop.has("MUFU"):
            kinds[n] = "spin wait"
        elif loop.after_wait and loop.has("LDG") and (loop.has("MUFU") or loop.has("STG") or loop.has("ATOMS")):
            # A search item's tiles (each variant: with the masses above hi, or none above)
            if loop.has("STG"):
                kinds[n] = "window gather tile" if loop.has("MUFU") else "gather tile"
            elif _atomics(loop) and not loop.has("VOTE") and not loop.has("ATOMS"):
                kinds[n] = "raw window atomic tile"  # (no histogram: each inside value's count a global atomic)
            elif _atomics(loop):
                kinds[n] = "mass histogram tile"
            else:
                # Key bins: of raw keys (no order key of a scaled value, whose +0.0 is an FADD a
                # value: only the exp's FADD, one a MUFU) or of scaled keys; summing the mass
                # above (MUFU) or only counting.
                raw = "raw " if loop.has("FADD") <= loop.has("MUFU") else ""
                count = "" if loop.has("MUFU") else "count "
                kinds[n] = f"value {count}histogram tile" if loop.has("VIMNMX") else f"{raw}{count}histogram tile"
                if kinds[n] == "raw histogram tile" and not loop.has("FSETP"):
                    kinds[n] = "raw window tile"  # (a top-p window tests no value for -inf: stage 8)
        elif loop.after_wait and loop.has("LDG") and not loop.has("MUFU") and not _atomics(loop):
            kinds[n] = "histogram sum"
        elif loop.after_wait and loop.parent is not None and not loop.has("LDG") and not loop.has("MUFU") and loop.has("BAR"):
            kinds[n] = "top-p cut halving step"  # (a gather's last item: block sums of the gathered keys' weights, a barrier each)
        elif loop.after_wait and loop.parent is not None and not loop.has("LDG") and not loop.has("MUFU"):
            kinds[n] = "raw floor step"  # (a 16-bit line's top-k gather item: its lowest raw key, by halvings)
        elif not loop.after_wait and loop.parent is None:
            kinds[n] = "threshold ticket loop"


def _logits_bytes(call: Call) -> int:
    lines = call.batch * (call.k + 1) + (call.batch * call.k if call.draft == "logits" else 0)
    return lines * call.vocab * call.itemsize


def _tree_work(launch, call: Call, phase: str) -> dict:
    """What each program of a tree or block walk or race executes (ASSUMPTIONS["tree_rows"])."""
    import torch

    from specdec_ext import _triton_backend, _triton_tree

    c = launch.constexprs
    has_draft = call.draft == "logits"
    itemsize = call.itemsize
    if phase.endswith("_race"):
        chunks = launch.args[-1]
        block = c["BLOCK"]
        tiles = math.ceil(call.vocab / block) / chunks
        removes = phase == "tree_race" and (call.siblings == "without_replacement" or not has_draft)
        return {
            "loops": {"residual race tile": (tiles, block), "removed-id test": (tiles if removes else 0.0, block),
                      "finalising block": (math.ceil(chunks / _triton_backend.FINAL_BLOCK) / chunks, c["FINAL_BLOCK"])},
            "programs_used": call.batch * chunks,
            "bytes": call.batch * (2 if has_draft else 1) * call.vocab * itemsize + call.batch * 64,
            # the row state; the chunk's logits; the arrival atomic; the last program's read of the chunk results
            "rounds": ["l2", "l2" if _logits_bytes(call) < ASSUMPTIONS["l2_bytes"] / 2 else "dram", "l2", "l2"],
            "final_trips": math.ceil(chunks / _triton_backend.FINAL_BLOCK),
        }
    block = c["BLOCK"]
    tiles = math.ceil(call.vocab / block)
    if phase == "tree_walk":
        depth = call.tree_depth if call.tree_depth is not None else call.k
        passes = depth if call.tree_passes is None else call.tree_passes
        removes = call.siblings == "without_replacement" or not has_draft
        return {
            "loops": {"context step": (depth + 1, 1), "line check step": (call.k + 1 if call.check else 0, 1),
                      "sibling test": ((depth + 1) * call.k, 1), "residual-mass tile": (passes * tiles, block),
                      "removed-id test": (passes * tiles if removes else 0.0, block)},
            "programs_used": call.batch,
            "bytes": call.batch * passes * (2 if has_draft else 1) * call.vocab * itemsize + call.batch * (depth + 1) * c["PARTS"] * 16,
            # per context: its line statistics, then the rejected child's logits; per pass, the line
            "rounds": ["l2", "l2"] * (depth + 1) + ["dram"] * math.ceil(passes),
        }
    # block_walk: work items of a chunk of the vocabulary at a position i < K, B * (K-1) * chunks
    # in all; each reads the row's partials and weights p_i, sums its chunk of S_i where the coin
    # may stop the walk there (block_summed of them), and arrives; a row's last item searches the
    # stop from n down (as the row that searches furthest: K steps), reading the summed chunks.
    view = meta_args(call)
    chunks = _triton_tree.walk_chunks(view, _triton_backend.geometry(torch.device("meta"), sm_count=ASSUMPTIONS["multiprocessors"]))
    items = call.batch * _triton_tree._walk_items(view, chunks)
    summed = 1.0 if call.block_summed is None else call.block_summed
    steps = math.ceil(tiles / chunks) * summed if call.k > 1 else 0.0
    return {
        "loops": {"block position step": (call.k, 1), "residual-mass tile": (steps, block), "stop search step": (call.k * call.batch / items, 1),
                  "walk sum step": (call.k * chunks * call.batch / items, 1)},
        "programs_used": items,
        "bytes": call.batch * max(call.k - 1, 0) * summed * (2 if has_draft else 1) * call.vocab * itemsize + items * (2 * call.k + 1) * c["PARTS"] * 8,
        # the partials of every line, the item's chunk of its lines, its arrival, the last item's read of the sums
        "rounds": ["l2", "dram", "l2", "l2"],
    }


def candidate_geometry(call: Call) -> tuple[int, int, int, int, int]:
    """(parts, lanes, rows, tiles per part, line slots) of the statistics launch of ``call``'s filtered
    form (candidate_outcome's arguments, with SORT)."""
    filtered = call if call.filtered else replace(call, top_k=50)
    stats = next(launch for launch in launches(filtered, ASSUMPTIONS["multiprocessors"]) if launch.name == "line_stats")
    c = stats.constexprs
    return stats.grid[1], c["T_LANES"], c["T_ROWS"], stats.args[-1], c["LINE_SLOTS"]


def window_part(call: Call) -> int | None:
    """Values per statistics part of ``call``'s filtered form where its statistics count their top
    windows (KEY_WINDOW: the Triton that compiles it lowers tl.histogram to shared-memory atomics),
    else None (select_search's ``window_part``)."""
    filtered = call if call.filtered else replace(call, top_k=50)
    stats = next(launch for launch in launches(filtered, ASSUMPTIONS["multiprocessors"]) if launch.name == "line_stats")
    c = stats.constexprs
    return stats.args[-1] * c["T_LANES"] * c["T_ROWS"] if c["KEY_WINDOW"] else None


def sampling(call: Call) -> dict:
    """select_search's ``sample_runs``, ``histogram_top_k`` and the gathers' slots (``gather``, and
    ``window_gather``: twice as many where ranks are by byte histograms) for ``call``'s filtered
    form, as its cut-offs launch has them (SAMPLE_RUNS: where tl.histogram is warp ballots)."""
    filtered = call if call.filtered else replace(call, top_k=50)
    c = next(launch for launch in launches(filtered, ASSUMPTIONS["multiprocessors"]) if launch.name.endswith("cutoff") or launch.name.endswith("cut_walk"))
    return {"sample_runs": c.constexprs["SAMPLE_RUNS"], "histogram_top_k": c.constexprs["HISTOGRAM_TOP_K"], "gather": c.constexprs["GATHER"],
            "window_gather": c.constexprs["WINDOW_GATHER"]}


def top_p_window_on(call: Call) -> bool:
    """Whether the statistics of ``call``'s lines count their top-p windows where the candidates
    do not settle them: its filtered form's statistics launch has TOP_P_BINS and one part a line,
    and the call cuts by top-p alone."""
    filtered = call if call.filtered else replace(call, top_p=0.9)
    stats = next(launch for launch in launches(filtered, ASSUMPTIONS["multiprocessors"]) if launch.name == "line_stats")
    return bool(stats.constexprs["TOP_P_BINS"]) and stats.grid[1] == 1 and call.top_p < 1 and not 0 < call.top_k < call.vocab


def unsorted_kind(search: dict) -> dict:
    """The Call fields of a line select_search followed, cut before its candidates are sorted
    (thresholds.py tries its statistics' windows first): its top-p window settles it, or its top
    windows hold k values."""
    return {"top_p_settled_share": bool(search["top_p_window"] and search["top_p_window"]["settles"]), "top_k_window_share": bool(search["top_k_window"])}


def all_32_bit(call: Call) -> bool:
    """Whether every line of ``call`` is 32-bit (vLLM's): its top-p lines' first gather comes from a sample."""
    return call.dtype == "fp32" and (call.draft != "logits" or (call.draft_dtype or call.dtype) == "fp32")


def synthetic_search(call: Call, lines: int = 4) -> dict:
    """What select.py's search takes (select_search, pass by pass) on ``lines`` synthetic flat
    lines: standard normal logits at the call's vocabulary (rounded to its 16-bit dtype), scaled by
    1 / temperature, under its top-k / top-p, with the candidates' floor of its statistics launch.
    The Call fields of the whole-line fallback rows."""
    import numpy as np
    import torch

    from specdec_ext._triton_backend import SORT

    rng = np.random.default_rng(0)
    geometry = candidate_geometry(call)
    part = window_part(call)
    top_p_window = top_p_window_on(call)
    sample = sampling(call)
    passes, steps, unsorted, sampled, sampled_window = [], [], Counter(), 0, 0
    for _ in range(lines):
        values = rng.standard_normal(call.vocab).astype(np.float32)
        if call.dtype in ("bf16", "fp16"):
            inv_t = np.float32(1.0) / np.float32(call.temperature)
            line = torch.from_numpy(values).to(torch.bfloat16 if call.dtype == "bf16" else torch.float16)
            scaled = line.float().numpy() * inv_t
            floor_key = candidate_outcome(scaled, *geometry, SORT, call.top_k, call.top_p)["floor_key"]
            search = select_search(scaled, call.top_k, call.top_p, raw=(line.view(torch.int16).numpy(), call.dtype, inv_t), floor_key=floor_key,
                                   window_part=part, top_p_window=top_p_window, **sample)
            passes.append(search["passes"])
            if search["top_p_window"]:
                steps.append(search["top_p_window"]["steps"])
            unsorted.update(unsorted_kind(search))
        else:
            # (a call of 32-bit lines starts a top-p line with a gather a sample places)
            scaled = values * (np.float32(1.0) / np.float32(call.temperature))
            floor_key = candidate_outcome(scaled, *geometry, SORT, call.top_k, call.top_p)["floor_key"]
            search = select_search(scaled, call.top_k, call.top_p, floor_key=floor_key, top_p_gather=all_32_bit(call), **sample)
            passes.append(search["passes"])
        sampled += search["sampled"]
        sampled_window += search["sampled_window"]
    # (a line its statistics' top window, or top-p window, settles is never listed for the search)
    listed = [line for line in passes if line]
    window = {"top_p_window_share": len(steps) / lines, "top_p_window_steps": sum(steps) / len(steps) if steps else 0.0, "sampled_share": sampled / lines,
              "top_p_sampled_share": sampled_window / lines, **{name: unsorted[name] / lines for name in ("top_p_settled_share", "top_k_window_share")}}
    return window | ({"search_fraction": len(listed) / lines, **_search_trips(listed)} if listed else {"search_fraction": 0.0, "search_passes": 0.0})


# The Call fields of a search's passes (_search_trips), as measure_trips records them.
SEARCH_FIELDS = ("search_exact_share", "search_value_share", "search_value_count_share", "search_gather_share", "search_count_share", "search_window_share",
                 "search_raw_count_share", "search_raw_share", "search_raw_window_share", "search_atomics", "search_window_atomics", "search_halvings")


def _search_trips(passes: list[list[dict]]) -> dict:
    """Call fields from select_search's passes of each searched line."""
    every = [q for line in passes for q in line if not q["statistics"]]  # (a pass the statistics launch counted reads no line)
    if not every:
        return {"search_passes": 0.0}
    share = lambda stages: round(sum(q["stage"] in stages for q in every) / len(every), 4)  # noqa: E731
    return {"search_passes": round(len(every) / len(passes), 3), "search_exact_share": share((3,)), "search_value_share": share((2, 6)),
            "search_value_count_share": share((2,)), "search_gather_share": share((4, 5)), "search_window_share": share((5,)),
            "search_count_share": round(sum(q["counts_only"] and q["stage"] == 1 for q in every) / len(every), 4),
            "search_raw_count_share": round(sum((q["counts_only"] or q["mass_known"]) and q["stage"] == 7 for q in every) / len(every), 4),
            "search_raw_share": round(sum(not q["counts_only"] and not q["mass_known"] and q["stage"] == 7 for q in every) / len(every), 4),
            "search_raw_window_share": share((8,)),
            "search_atomics": round(sum(q["binned"] for q in every if q["stage"] in (3, 4, 5)) / len(every), 4),
            "search_window_atomics": round(sum(q["binned"] for q in every if q["stage"] == 8) / len(every), 4),
            "search_halvings": round(sum(q.get("halvings", 0) for q in every) / len(every), 3)}


def _work(launch, call: Call, phase: str, first_pass: bool = False) -> dict:
    """What each program of a launch (or phase) executes: the trips of each loop kind per program
    (averaged over the programs) with the values one trip handles, bytes, and the dependent memory
    round trips on its critical path (``first_pass``: of the whole-line search's first pass)."""
    from specdec_ext import _triton_backend

    if phase in ("tree_walk", "tree_race", "block_walk", "block_race"):
        return _tree_work(launch, call, phase)
    if phase.endswith(":walk"):  # the walk items of a filtered tree (one a row) or block call, over the launch's programs
        work = _tree_work(launch, call, phase.split(":")[0].replace("_cut", ""))
        items = work["programs_used"]
        programs = min(items, launch.grid[0])
        loops = {kind: (trips * items / programs, values) for kind, (trips, values) in work["loops"].items()}
        return work | {"loops": loops | {"walk ticket loop": (items / programs, 1)}, "programs_used": programs}
    phase = phase.removeprefix(launch.name + ":") if launch.name.endswith("_cut_walk") else phase  # its cut-offs phases
    args = launch.args
    c = launch.constexprs
    lines_t = call.batch * (call.k + 1)
    lines_d = call.batch * call.k if call.draft == "logits" else 0
    lines = lines_t + lines_d
    if phase == "line_stats":
        tile = c["T_LANES"] * c["T_ROWS"]
        parts = launch.grid[1]
        programs_used = lines * parts
        # Per line: its whole tiles unmasked, its ragged last tile masked, spread over its parts.
        whole, ragged = call.vocab // tile / parts, (1 if call.vocab % tile else 0) / parts
        kind = "candidate tile" if c["PHASE"] == 1 else "sampled tile"
        # A line under a large top-k also counts its keys in the bins of the whole-line search's first pass.
        loops = {kind: (whole, tile), kind + " (masked)": (ragged, tile)}
        if c["PHASE"] == 1 and c["HISTOGRAM_TOP_K"] < call.top_k < call.vocab:  # (histogrammed: a top-k that cuts, above HISTOGRAM_TOP_K)
            block = 2 * c["T_LANES"]
            loops |= {"key count block": (call.vocab // block / parts, block), "key count block (masked)": ((1 if call.vocab % block else 0) / parts, block)}
        if c["PHASE"] == 1 and c.get("TOP_P_BINS"):  # (a bf16 top-p line the candidates do not settle: its top-p window)
            block = c["TOP_P_BLOCK"]
            share = call.top_p_window_share
            loops |= {"top-p window count block": (share * (call.vocab // block), block),
                      "top-p window count block (masked)": (share * (1 if call.vocab % block else 0), block)}
        return {
            "loops": loops, "programs_used": programs_used,
            "bytes": lines * call.vocab * call.itemsize + lines * 4,
            # the tiles' loads (issued together), then the partials' and candidates' stores
            "rounds": ["dram", "l2", "l2"],
        }
    if phase == "race":
        chunks = args[-1]
        block = c["BLOCK"]
        raced = 2 if call.draft == "logits" else 1
        ragged = 1 if call.vocab % block else 0
        return {
            # every row rejects at its last draft position (ASSUMPTIONS): the residual race
            "loops": {"residual race tile": (call.vocab // block / chunks, block), "residual race tile (masked)": (ragged / chunks, block),
                      "finalising block": (math.ceil(chunks / _triton_backend.FINAL_BLOCK) / chunks, c["FINAL_BLOCK"])},
            "programs_used": call.batch * chunks,
            "bytes": call.batch * raced * call.vocab * call.itemsize + call.batch * (2 * lines_t + 2 * lines_d) * 4 * c["PARTS"],
            # row parameters, partials and the drafts' logits (one round: no load waits for
            # another); the chunk's logits (still in L2 when the call's logits fit in half of it);
            # the arrival atomic; the last program's read of the chunk results (and, with
            # logprobs, the winner's logit).
            "rounds": ["l2", "l2" if _logits_bytes(call) < ASSUMPTIONS["l2_bytes"] / 2 else "dram", "l2", "l2"] + (["l2"] if call.logprobs else []),
            "final_trips": math.ceil(chunks / _triton_backend.FINAL_BLOCK),
        }
    # The cut-offs launch's work items are drawn by ticket (cutoffs.py) by the programs resident at
    # once; its other programs start as those exit, after the last item, and find none.
    resident = min(launch.grid[0], ASSUMPTIONS["multiprocessors"] * _occupancy(compiled_code(launch), launch.num_warps))
    if phase == "cutoff":
        # One work item per line: its candidates, sorted (tl.sort: no loop in the compiled code),
        # the cut and the normaliser. The programs share the lines' items (lines / resident each,
        # what the pipes and schedulers serve); the slowest takes ceil(lines / resident) ("most").
        programs = min(lines, resident)
        items = lines / programs
        sample = c.get("SAMPLE_RUNS", 0) * c.get("SAMPLE_RUN", 0)
        return {
            "loops": {"threshold ticket loop": (items, c["SORT"]), "spin wait": (0.0, 0),
                      "top-p window sum step": (items * call.top_p_window_share * call.top_p_window_steps, c.get("TOP_P_STEP", 0)),
                      "top-p window scan": (items * call.top_p_window_share, c.get("TOP_P_STEP", 0)),
                      "sample bisection step": (items * call.sampled_share * 16, sample),
                      "top-p sample bisection step": (items * call.top_p_sampled_share * 16, sample),
                      "top-p gather estimate step": (items * call.top_p_sampled_share * 16, sample),
                      "top-p gather window step": (items * call.top_p_sampled_share * 16, sample)},
            "programs_used": programs, "most": math.ceil(items) / items,
            "bytes": lines * (c["LINE_SLOTS"] * 4 + 2 * c["SORT"] * 4 + c["PARTS"] * 16
                              + call.top_p_window_share * call.top_p_window_steps * c.get("TOP_P_STEP", 0) * 4 + (call.sampled_share + call.top_p_sampled_share) * sample * call.itemsize),
            # the ticket; the row's parameters (whether a filter cuts the line); the partials, the
            # candidates' counts and floors and their slots, loaded together (thresholds.py's
            # _line_candidates: no slot's address waits for a count); the packed candidates through
            # the workspace (or a sampled line's sample); the release of the item; then every
            # program's acquire that sees the last item finished, its read of the list and its exit.
            "rounds": ["l2"] * 8,
        }
    if phase == "cutoff:search":
        # One pass of the whole-line search over the searched lines, in the same launch.
        searched = lines * call.search_fraction
        programs = launch.grid[0]
        # (line, run of merge chunks) work items, taken in turn by the resident programs (cutoffs.py:
        # a run of 2, 4 or 8 chunks once the chunks outnumber the launch's programs 8-, 16- or 32-fold)
        merge = (1 + (searched * c["NUM_CHUNKS"] >= 8 * programs) + 2 * (searched * c["NUM_CHUNKS"] >= 16 * programs)
                 + 4 * (searched * c["NUM_CHUNKS"] >= 32 * programs))
        runs = math.ceil(c["NUM_CHUNKS"] / merge)
        slots = searched * runs * (c["BINS"] + 1)
        items = searched * runs
        programs = resident
        per_program = items / programs  # (the slowest program takes ceil of it: "most")
        tiles = c["CHUNK"] * merge // c["TILE"] * per_program
        # shares of the passes by stage (and top-k's that only count)
        exact, value, gather, count = call.search_exact_share, call.search_value_share, call.search_gather_share, call.search_count_share
        value_count = call.search_value_count_share
        window, raw_count, raw = call.search_window_share, call.search_raw_count_share, call.search_raw_share
        raw_window = call.search_raw_window_share
        # (where tl.histogram is warp ballots, a raw window counts by global atomics: SAMPLE_RUNS, 16-bit lines, not a walk's launch)
        atomic_window = raw_window if c.get("SAMPLE_RUNS", 0) and call.itemsize == 2 and launch.name == "cutoff" else 0.0
        return {
            "loops": {"search ticket loop": (per_program, c["CHUNK"]),
                      "histogram tile": (tiles * (1 - exact - value - gather - count - raw_count - raw - raw_window), c["TILE"]),
                      "count histogram tile": (tiles * count, c["TILE"]), "raw count histogram tile": (tiles * raw_count, c["TILE"]),
                      "raw histogram tile": (tiles * raw, c["TILE"]), "raw window tile": (tiles * (raw_window - atomic_window), c["TILE"]),
                      "raw window atomic tile": (tiles * atomic_window, c["TILE"]),
                      "mass histogram tile": (tiles * exact, c["TILE"]), "value histogram tile": (tiles * (value - value_count), c["TILE"]),
                      "value count histogram tile": (tiles * value_count, c["TILE"]),
                      "gather tile": (tiles * (gather - window), c["TILE"]), "window gather tile": (tiles * window, c["TILE"]),
                      "histogram sum": (searched * math.ceil(runs / 4) / programs, 4 * (c["BINS"] + 1)), "spin wait": (0.0, 0),
                      "raw floor step": (per_program * (gather - window) * 17 if call.itemsize == 2 else 0.0, 1),
                      "top-p cut halving step": (searched / programs * call.search_halvings, 1)},
            "programs_used": programs, "most": math.ceil(per_program) / per_program,
            # the lines; the counts stored, then read; stage 3's masses zeroed, then read
            "bytes": searched * call.vocab * call.itemsize + slots * 4 * 2 + exact * slots * 8 * 2,
            # the ticket and the acquire of the previous pass (neither in the first pass: a program's
            # first search ticket is drawn before the threshold items' acquire, cutoffs.py, and pass 0
            # waits for no pass); the state; the zeroing stores before the barrier (stage 3's, where
            # a pass takes it); the chunk's logits (loads issued together: from L2 where the call's
            # logits fit in half of it, as the statistics launch left them, the race's rule); the
            # histogram's stores and the arrival atomic; the last item's read of the chunks'
            # histograms and its release of the pass.
            "rounds": ([] if first_pass else ["l2", "l2"]) + ["l2"] + (["l2"] if exact else [])
                      + ["l2" if _logits_bytes(call) < ASSUMPTIONS["l2_bytes"] / 2 else "dram", "l2", "l2", "l2"],
            # stage 3: a mass per binned value; a gather: a slot per gathered value (an upper bound: a
            # lane takes its values' slots with one atomic); an atomic raw window: a count per value inside
            "atomics": searched * call.vocab * (call.search_atomics + (call.search_window_atomics if atomic_window else 0.0)),
            "finalisers": searched / programs,  # a line's last item of the pass: its next pass (a gather's: a sort of GATHER keys)
        }
    raise ValueError(phase)


def _route(loop: Loop, name: str, barriers: bool) -> int:
    """A route's instructions (the loop's attribute ``name``), or the barriers on it."""
    return loop.route_barriers.get(name, loop.path_barriers) if barriers else getattr(loop, name)


def search_tail(loop: Loop, call: Call, barriers: bool = False) -> float:
    """The instructions of a search pass's last item after its tiles, per pass (without the
    halvings of a top-p cut, a loop of its own): a top-k gather's (stage 4) through its byte
    histograms where the code has them (DIGIT_SELECT), else through its sort; any other pass's
    (a top-p window's gather, stage 5, included: no sort) on the longest path without either.
    ``barriers``: the barriers on those routes instead."""
    top_k_gathers = call.search_gather_share - call.search_window_share
    by_digits = top_k_gathers if loop.tail_top_k else 0.0
    return ((top_k_gathers - by_digits) * _route(loop, "tail", barriers) + by_digits * _route(loop, "tail_top_k", barriers)
            + (1 - top_k_gathers) * _route(loop, "tail_without_sort" if loop.tail_without_sort else "tail", barriers))


def search_item_trips(loop: Loop, call: Call, items: float, finalisers: float) -> float:
    """A search items' loop's trips, weighted as its longest path: every item runs the body's
    head, only a line's last item of a pass its tail (search_tail)."""
    return (items * (loop.instructions - loop.tail) + finalisers * search_tail(loop, call)) / loop.instructions


def threshold_item_trips(loop: Loop, call: Call, trips: float) -> float:
    """The threshold items' trips, weighted as their loop's longest path: a line cut before its
    candidates are sorted goes around the sort, through the top-p window's steps where that
    window settles it (``through_tiles``), or the longest way (``around_sort``) where its top
    windows hold k values; a line that samples (``sampled_share``) takes the longest path through
    the sample around the sort (``through_sample``), any other the longest around the sample
    (``around_sample``, ``around_sample_top_k`` in a top-k call) where the loop has one. A top-p line that samples (``top_p_sampled_share``)
    goes around the sort too (``through_p_sample``): its candidates' mass is short of the budget;
    only a line whose mass lies within 2**-12 below it would sort them (the model takes none)."""
    if not (loop.around_sort and loop.instructions):
        return trips
    return trips * sum(share * loop.instructions if route is None else share * getattr(loop, route)
                       for share, route in threshold_routes(loop, call)) / loop.instructions


def threshold_routes(loop: Loop, call: Call) -> list[tuple[float, str | None]]:
    """(share of the lines, route: a Loop attribute, None for the longest path) of a threshold
    items' loop with a sort (threshold_item_trips)."""
    p_share, k_share = call.top_p_settled_share, call.top_k_window_share
    # (where a sample may place a top-k line's first gather, the lines that do not sample go around it)
    rest = 1 - p_share - k_share
    # (a top-p line that samples its first pass: through that sample, its candidates unsorted)
    p_sampled = min(call.top_p_sampled_share, rest) if loop.through_p_sample else 0.0
    sampled = min(call.sampled_share, rest - p_sampled) if loop.around_sample else rest - p_sampled
    # (a top-k line, which never tests its candidates' mass against a top-p budget before the sort)
    around = "around_sample_top_k" if 0 < call.top_k < call.vocab and loop.around_sample_top_k else ("around_sample" if loop.around_sample else None)
    return [(sampled, "through_sample" if loop.through_sample else None), (rest - p_sampled - sampled, around), (p_share, "through_tiles"),
            (k_share, "around_sort"), (p_sampled, "through_p_sample")]


def loop_barriers(loop: Loop, kind: str, trips: float, call: Call, work: dict) -> float:
    """The barriers a program meets in a loop over ``trips`` (loop_trips'): each trip all of its
    body's (-1), or those of the one path a trip takes; a threshold item or a search item, those of
    the route it takes (threshold_routes, search_tail), not the longest path's share."""
    if loop.path_barriers < 0:
        return loop.has("BAR") * trips
    if not loop.route_barriers or not trips:
        return loop.path_barriers * trips
    if kind == "threshold ticket loop" and loop.around_sort and loop.instructions:
        items = trips / threshold_item_trips(loop, call, 1.0)  # (the trips before their weighting by route)
        return items * sum(share * (loop.path_barriers if route is None else loop.route_barriers.get(route, loop.path_barriers))
                           for share, route in threshold_routes(loop, call))
    if kind == "search ticket loop" and loop.tail and loop.instructions:
        items, finalisers = work["loops"][kind][0], work.get("finalisers", 0.0)
        shared = search_item_trips(loop, call, items, finalisers) / trips  # (the copies of the loop that share its trips)
        return (items * loop.route_barriers["head"] + finalisers * search_tail(loop, call, barriers=True)) / shared
    return loop.path_barriers * trips


def loop_trips(launch, call: Call, phase: str, code: KernelCode) -> list[tuple[Loop, str, float, int]]:
    """(loop, kind, trips per program, values per trip) of every loop of the launch's code in this
    phase: a kind the phase does not run takes 0 trips; copies of one kind share its trips."""
    work = _work(launch, call, phase)
    kinds = loop_kinds(launch.name.split(":")[0], code)
    base = lambda kind: kind.replace(" (masked)", "") if kind else kind  # noqa: E731
    copies = Counter(kinds)
    found = []
    for loop, kind in zip(code.loops, kinds, strict=True):
        if kind is None:
            raise ValueError(f"{launch.name}: a loop the model does not know at {loop.start:#x}-{loop.end:#x} ({loop.instructions} instructions)")
        trips, values = work["loops"].get(kind, (0.0, 0))
        if kind == "search ticket loop" and loop.tail and loop.instructions:
            trips = search_item_trips(loop, call, trips, work.get("finalisers", 0.0))
        if kind == "threshold ticket loop":
            trips = threshold_item_trips(loop, call, trips)
        trips /= sample_steps_per_trip(loop, kind)
        shared = copies[kind]
        if kind == "top-p cut halving step":
            # (a top-k gather's halvings, over half the slots, are rarer than a window's: every one is
            # charged as the widest halving loop's, shared by its copies)
            widest = max(other.instructions for other, k in zip(code.loops, kinds, strict=True) if k == kind)
            shared = sum(other.instructions == widest for other, k in zip(code.loops, kinds, strict=True) if k == kind)
            trips = trips if loop.instructions == widest else 0.0
        found.append((loop, kind, trips / shared, values or work["loops"].get(base(kind), (0, 0))[1]))
    return found


def estimate_launch(launch, call: Call, phase: str | None = None, first_pass: bool = False) -> LaunchEstimate:
    """The time of one launch, or of one phase of it (the cut-offs launch's work items over the
    candidates, then each pass of its whole-line search; ``first_pass``: the search's first)."""
    a = ASSUMPTIONS
    phase = phase or launch.name
    code = compiled_code(launch)
    warps = launch.num_warps
    work = _work(launch, call, phase, first_pass)
    loops = loop_trips(launch, call, phase, code)
    # Instructions per warp: the longest path outside the loops, plus every loop's trips.
    path, barriers = code.path, code.barriers_outside_loops
    if phase.endswith(("cutoff", "cutoff:search")) and code.phases:
        path, barriers = code.phases["before_wait" if phase.endswith("cutoff") else "from_wait"]
    # (lines that count no keys, or no top-p window: the branch around each count skips it all)
    idle = []
    for kind in ("key count block", "top-p window count block"):
        counting = [entry for entry in loops if entry[1] and entry[1].startswith(kind)]
        if counting and not any(trips for _, _, trips, _ in counting):
            idle += [loop for loop, _, _, _ in counting]
    if idle:
        path, barriers = path_skipping(code, idle)
    per_warp = path + sum(loop.instructions * trips for loop, _, trips, _ in loops)
    # The pipes of what runs outside the loops: the straight-line mix, scaled to the path.
    scale = path / code.straight if code.straight else 0.0
    pipes = Counter({pipe: n * scale for pipe, n in code.straight_by_pipe.items()})
    for loop, kind, trips, _ in loops:
        for pipe, n in loop.by_pipe.items():
            pipes[pipe] += n * trips
        barriers += loop_barriers(loop, kind, trips, call, work)
    hot = max(loops, key=lambda entry: entry[0].instructions * entry[2], default=None)
    if hot is not None and hot[2] == 0:
        hot = None
    programs = work["programs_used"]
    ctas = _occupancy(code, warps)
    sms = a["multiprocessors"]
    clock = a["clock_ghz"] * 1e3  # cycles per microsecond
    waves = programs / (sms * ctas)
    total_warps = programs * warps
    issue_us = total_warps * per_warp / (a["schedulers_per_sm"] * sms) / clock
    pipe_us = max(_pipe_cycles({p: n}, total_warps / sms) for p, n in pipes.items()) / clock if pipes else 0.0
    memory_us = work["bytes"] / a["hbm_bytes_per_s"] * 1e6
    if work.get("atomics"):  # the L2 serves the search's global atomics (a gather's slots, stage 3's masses)
        memory_us = max(memory_us, work["atomics"] / a["l2_atomics_per_s"] * 1e6)
    # One program's critical path: its dependent memory round trips, its barriers and its
    # instructions at the issue interval of a warp with few neighbours on its scheduler.
    rounds = sum(a["dram_latency_us"] if r == "dram" else a["l2_latency_us"] for r in work["rounds"])
    # (work items drawn by ticket: the pipes and schedulers serve the programs' average share, the
    # critical path is the slowest program's, which takes the most items)
    critical = path + (per_warp - path) * work.get("most", 1.0)
    ticket = next((loop for loop, kind, _, _ in loops if kind == "search ticket loop" and loop.tail), None)
    if ticket is not None and phase.endswith("cutoff:search"):
        # A pass ends with its last item's tail, after that item: the program that runs it runs a
        # whole tail, though the programs share fewer than one each (per_warp's average).
        critical += max(0.0, 1.0 - work.get("finalisers", 0.0)) * search_tail(ticket, call)
        if ticket.route_barriers:
            barriers += max(0.0, 1.0 - work.get("finalisers", 0.0)) * search_tail(ticket, call, barriers=True)
    program_us = rounds + (critical * a["cycles_per_instruction_alone"] + barriers * a["barrier_latency_cycles"]) / clock
    if launch.name.endswith("race"):  # the last program of a row also finalises
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
    hot_values = hot[3] if hot else 0
    per_thread_values = hot_values / (32 * warps) if hot_values else 0
    return LaunchEstimate(
        phase, list(launch.grid), programs, warps, code.registers, code.spill_bytes, code.shared_bytes, ctas, round(waves, 2), hot[1] if hot else "",
        hot[0].instructions if hot else 0, hot_values, round(hot[0].instructions / per_thread_values, 2) if per_thread_values else 0.0,
        [[kind, loop.instructions, round(trips, 4)] for loop, kind, trips, _ in loops],
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


def estimate_call(call: Call, goals: dict | None = None, baseline: CallEstimate | None = None) -> CallEstimate:
    """The call's estimate; ``baseline`` (the unfiltered call of the same shape) for the goals on
    ``x_unfiltered``."""
    a = ASSUMPTIONS
    if call.whole_line and call.search_passes is None:
        call = replace(call, **synthetic_search(call))
    planned = launches(call, a["multiprocessors"])
    estimates = []
    for launch in planned:
        if launch.name in ("cutoff", "tree_cut_walk", "block_cut_walk"):
            # Its work items one kind after another: the cuts from the candidates, the passes of
            # the whole-line searches, then (a filtered walk) the rows' walks.
            prefix = "" if launch.name == "cutoff" else launch.name + ":"
            estimates.append(estimate_launch(launch, call, prefix + "cutoff"))
            if call.whole_line:
                # (the first pass, whose items wait for no earlier pass, then the others)
                first = estimate_launch(launch, call, prefix + "cutoff:search", first_pass=True)
                later = estimate_launch(launch, call, prefix + "cutoff:search")
                for search, passes in ((first, min(call.search_passes, 1.0)), (later, max(call.search_passes - 1.0, 0.0))):
                    estimates += [search] * math.floor(passes)
                    if passes % 1:
                        estimates.append(LaunchEstimate(**(asdict(search) | {"time_us": round(search.time_us * (passes % 1), 3)})))
            if prefix:
                estimates.append(estimate_launch(launch, call, prefix + "walk"))
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
        value = {"replayed_us": replayed, "launched_us": launched, "x_floor_replayed": replayed / floor, "launches": n,
                 "x_unfiltered": replayed / baseline.replayed_us if baseline else float("nan")}[goal]
        judged[goal] = {"limit": limit, "estimate": round(value, 2), "met": value <= limit}
    return CallEstimate(asdict(call), n, [asdict(e) for e in estimates], round(kernels, 2), round(replayed, 2), round(launched, 2), round(floor, 2),
                        round(replayed / floor, 3), judged)


_B64 = {"batch": 64, "k": 8, "vocab": 128256, "dtype": "bf16"}
_B1 = {"batch": 1, "k": 4, "vocab": 128256, "dtype": "fp32"}

# (call, goals, the unfiltered call its x_unfiltered goal compares with)
GOAL_CALLS = [
    (Call("B=1 K=4 V=128256 fp32", **_B1), {"replayed_us": 8.0, "launched_us": 15.0, "launches": 2}, None),
    (Call("B=64 K=8 V=128256 bf16", **_B64), {"x_floor_replayed": 1.3, "launches": 2}, None),
    (Call("B=1 K=4 fp32 T=0.7 top-k 50 top-p 0.9", **_B1, temperature=0.7, top_k=50, top_p=0.9), {"replayed_us": 20.0, "launches": 4}, None),
    (Call("B=64 K=8 bf16 T=0.7 top-k 50 top-p 0.9", **_B64, temperature=0.7, top_k=50, top_p=0.9), {"x_unfiltered": 2.0}, "B=64 K=8 V=128256 bf16"),
    (Call("B=64 K=8 bf16 top-p 0.95", **_B64, top_p=0.95), {"x_unfiltered": 2.0}, "B=64 K=8 V=128256 bf16"),
    (Call("B=64 K=8 bf16 top-k 1000 (whole-line search)", **_B64, top_k=1000, search_fraction=1.0), {"x_unfiltered": 2.5}, "B=64 K=8 V=128256 bf16"),
    (Call("B=64 K=8 bf16 flat top-p 0.99 (whole-line search)", **_B64, top_p=0.99, search_fraction=1.0), {"x_unfiltered": 2.5}, "B=64 K=8 V=128256 bf16"),
    (Call("B=1 K=4 fp32 top-k 1000 (whole-line search)", **_B1, temperature=0.7, top_k=1000, search_fraction=1.0), {"x_unfiltered": 2.5},
     "B=1 K=4 V=128256 fp32"),
    (Call("B=1 K=4 fp32 flat top-p 0.99 (whole-line search)", **_B1, temperature=0.7, top_p=0.99, search_fraction=1.0), {"x_unfiltered": 2.5},
     "B=1 K=4 V=128256 fp32"),
]


def sweep_calls() -> list[Call]:
    """Other calls: filters whose cut the candidates settle, and the other flags."""
    calls = []
    base = dict(_B1, temperature=0.7)
    for top_k in (1, 50, 128256):
        calls.append(Call(f"B=1 K=4 top-k {top_k}", top_k=top_k, **base))
    for top_p in (0.5, 0.9):
        calls.append(Call(f"B=1 K=4 top-p {top_p}", top_p=top_p, **base))
    calls.append(Call("B=64 K=8 bf16 logprobs raw + accept_probs + seeds/offsets", **_B64, logprobs=2, accept_probs=True, seeds=True, offsets=True))
    calls.append(Call("B=8 K=4 V=32000 bf16", 8, 4, 32000, "bf16"))
    # Below B=64 K=8: a filtered bf16 line is one statistics program from 64 lines up (its top-p
    # window counted), beside the two programs a line planned there before 2026-12-05.
    for batch, k in ((8, 4), (32, 4), (8, 8), (32, 8)):
        shape = {"batch": batch, "k": k, "vocab": 128256, "dtype": "bf16"}
        calls.append(Call(f"B={batch} K={k} V=128256 bf16", **shape))
        calls.append(Call(f"B={batch} K={k} bf16 T=0.7 top-k 50 top-p 0.9", **shape, temperature=0.7, top_k=50, top_p=0.9))
        calls.append(Call(f"B={batch} K={k} bf16 flat top-p 0.99 (whole-line)", **shape, top_p=0.99, search_fraction=1.0))
        calls.append(Call(f"B={batch} K={k} bf16 flat top-p 0.99, two statistics programs a line", **shape, top_p=0.99, search_fraction=1.0,
                          stats_parts=2))
    # vLLM's lines: its sampler hands the plugin float32 logits (integrations/vllm), which no key or top-p window counts.
    vllm = dict(_B64, dtype="fp32")
    calls.append(Call("vLLM B=64 K=8 V=128256 fp32", **vllm))
    calls.append(Call("vLLM B=64 K=8 fp32 T=0.7 top-k 50 top-p 0.9", **vllm, temperature=0.7, top_k=50, top_p=0.9))
    calls.append(Call("vLLM B=64 K=8 fp32 top-k 1000 (whole-line search)", **vllm, top_k=1000, search_fraction=1.0))
    calls.append(Call("vLLM B=64 K=8 fp32 flat top-p 0.99 (whole-line search)", **vllm, top_p=0.99, search_fraction=1.0))
    calls.append(Call("sample B=1 V=128256 fp32", 1, 0, 128256, "fp32", draft="one-hot", stream=2))
    # Blocks and trees (the tree: 8 nodes, 4 deep)
    calls.append(Call("block B=1 K=4 V=128256 fp32", **_B1, method="block"))
    calls.append(Call("block B=64 K=8 V=128256 bf16", **_B64, method="block"))
    calls.append(Call("block B=64 K=8 bf16 T=0.7 top-k 50 top-p 0.9", **_B64, temperature=0.7, top_k=50, top_p=0.9, method="block"))
    calls.append(Call("tree B=1 N=8 D=4 V=128256 fp32 iid", 1, 8, 128256, "fp32", method="tree", tree_depth=4))
    calls.append(Call("tree B=64 N=8 D=4 V=128256 bf16 without replacement", 64, 8, 128256, "bf16", method="tree", siblings="without_replacement",
                      tree_depth=4))
    calls.append(Call("tree B=64 N=8 D=4 bf16 deterministic siblings top-k 50", 64, 8, 128256, "bf16", draft="one-hot", temperature=0.7, top_k=50,
                      method="tree", tree_depth=4))
    return calls


# ---------------------------------------------------------------------------------------------
# Data-dependent trips, measured on LM logits
#
# What the data decides in a filtered call: whether a line's cut settles among its candidates
# (stats.py, thresholds.py) or needs the whole-line search, and how many search passes that takes.
# ``candidate_outcome`` follows the kernels' rules on one line (the lanes of each statistics part,
# their top three, the part floors with their quota, the line floor and the sort's limit);
# tests/triton/test_triton_identity.py checks it against the kernels' own ``resolved`` flags.


def candidate_outcome(scaled, parts: int, lanes: int, rows: int, tiles_per_part: int, line_slots: int, sort: int, top_k: int, top_p: float) -> dict:
    """What the candidates of one float32 line ``scaled`` (a numpy vector) settle: ``resolved``,
    the values above the line floor, and the levels the part floors took (3, 2 or 1)."""
    import numpy as np

    vocab = scaled.shape[0]
    tile = rows * lanes
    padded = np.full(parts * tiles_per_part * tile, -np.inf, dtype=np.float32)
    padded[:vocab] = scaled
    # (part, value of the lane, lane): value i lies in lane i % lanes of part i // (tile * tiles_per_part)
    units = -np.sort(-padded.reshape(parts, tiles_per_part * rows, lanes), axis=1)[:, :3, :]
    quota = line_slots // parts
    floors, floors2, entries, levels = [], [], [], []
    for t1, t2, t3 in units:
        f3, f2 = t3.max(), t2.max()
        if (t1 > f3).sum() + (t2 > f3).sum() <= quota:
            floor, level = f3, 3
        elif (t1 > f2).sum() <= quota:
            floor, level = f2, 2
        else:
            floor, level = t1.max(), 1
        entries.append(np.concatenate([t1[t1 > floor], t2[t2 > floor]]))
        floors.append(floor)
        floors2.append(max(f2, floor))
        levels.append(level)
    entries = np.concatenate(entries)
    floor = max(floors)
    above = np.sort(entries[entries > floor])[::-1]
    if above.size > sort:
        floor = max(floors2)
        above = np.sort(entries[entries > floor])[::-1]
    fits = above.size <= sort
    finite = scaled[np.isfinite(scaled)]
    use_k = 0 < top_k < vocab
    resolved = fits and (not use_k or above.size >= top_k)
    if resolved and top_p < 1 and not use_k:
        weights = np.exp(above.astype(np.float64) - finite.max())
        resolved = weights.sum() >= top_p * np.exp(finite.astype(np.float64) - finite.max()).sum()
    # (floor_key: the order key of the floor every value above which is a candidate, None when they do not fit the sort)
    return {"resolved": bool(resolved), "above_floor": int(above.size) if fits else -1, "levels": levels, "floor_key": _order_key(floor) if fits else None}


def _fixed_weights(values, row_max):
    """select.py's fixed_mass: exp(s - max) in units of 2**-40 (float32 steps, as the interpreter)."""
    import numpy as np

    with np.errstate(invalid="ignore", over="ignore"):
        w = np.exp2((values.astype(np.float32) - np.float32(row_max)) * np.float32(1.4426950408889634)) * np.float32(2.0**40)
        return np.where(values > -np.inf, w, 0).astype(np.int64)


def _order_keys(values):
    import numpy as np

    bits = (values.astype(np.float32) + np.float32(0.0)).view(np.int32).astype(np.int64)
    return np.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


def _key_floats(keys):
    import numpy as np

    bits = np.where(keys >= 0, keys, keys ^ 0x7FFFFFFF).astype(np.int64) & 0xFFFFFFFF
    return bits.astype(np.uint32).view(np.int32).view(np.float32)


def _top_p_floor(row_max: float, mass: float, budget: float, n: int) -> int:
    """select.py's top_p_floor."""
    import numpy as np

    f = np.float32
    spare = f(mass) - f(budget) - f(1e-4) * f(mass)
    if not spare > 0:
        return -(2**31)
    t = f(row_max) + np.log(max(spare, f(1e-30)) / f(n)).astype(f) - f(0.01) - abs(f(row_max)) * f(9.5367431640625e-07)
    return int(_order_keys(np.array([t]))[0]) if t > -np.inf else -(2**31)


def _top_p_stage(lo: int, hi: int) -> int:
    """select.py's top_p_stage."""
    return 0 if lo >= hi else (2 if lo > -2139095041 and hi - lo >= 65536 else 3)


def _value_window(first_bin: int, last_bin: int, lo: int, hi: int, t0: float, scale) -> tuple[int, int]:
    """select.py's _window: the keys of value bins [first_bin, last_bin] within [lo, hi]."""
    import numpy as np

    key_at = lambda j: int(_order_keys(np.array([np.float32(t0) + np.float32(j) / scale]))[0])  # noqa: E731
    w_lo = min(max(key_at(first_bin) if first_bin > 0 else lo, lo), hi)
    return w_lo, max(min(key_at(last_bin + 1) if last_bin < 255 else hi, hi), w_lo)


def fixed_point_cut(scaled, top_k: int, top_p: float) -> int:
    """The cut (an order key) of top-k then top-p on one float32 line with select.py's arithmetic:
    weights in fixed point, a mass reaching the budget as float64(mass) * 2**-40 >= budget. (The
    eager reference sums float32 weights: on a flat line a budget within 1e-7 of a step of the
    cumulative mass can fall on the other side there.)"""
    import numpy as np

    values = np.asarray(scaled, dtype=np.float32)
    values = values[values > -np.inf]
    keys = _order_keys(values)
    order = np.argsort(-keys, kind="stable")
    keys = keys[order]
    weights = _fixed_weights(values[order], float(values.max()))
    cut = -(2**31)
    if 0 < top_k < len(scaled):
        cut = int(keys[min(top_k, keys.size) - 1])
        weights = np.where(keys >= cut, weights, 0)
    if top_p < 1:
        # As the kernels: top-p alone against the line's mass as the statistics sum it (here in
        # float64), inside a top-k set against the set's fixed-point mass.
        mass = float(weights.sum()) * 2.0**-40 if cut > -(2**31) else float(np.exp(values.astype(np.float64) - values.max()).sum())
        budget = np.float32(top_p) * np.float32(mass)
        before = np.cumsum(weights) - weights
        keep = int(np.sum(before.astype(np.float64) * 2.0**-40 < float(budget)))
        cut = max(cut, int(keys[max(keep, 1) - 1]))
    return cut


def _raw_keys(bits):
    """select.py's raw_key: the order keys of 16-bit floats from their bits (int16)."""
    import numpy as np

    b = np.asarray(bits, dtype=np.int16).astype(np.int64)
    return np.where(b >= 0, b, b ^ 0x7FFF)


def _raw_scaled(key: int, dtype: str, inv_t) -> float:
    """select.py's raw_scaled: the scaled value of the 16-bit float (``dtype`` "bf16" or "fp16") of raw key ``key``."""
    import numpy as np

    bits = np.array([key if key >= 0 else key ^ 0x7FFF], dtype=np.int64).astype(np.int16)
    value = (bits.astype(np.int32) << 16).view(np.float32) if dtype == "bf16" else bits.view(np.float16).astype(np.float32)
    return float(value[0] * np.float32(inv_t))


def _cut_bins(counts, above_mass: int, t0: float, scale, row_max: float, budget: float) -> tuple[int, int]:
    """select.py's _cut_bins: the lowest and the highest value bin that can hold the cut, from
    bounds on each bin's mass (its count times the weights at its edges)."""
    import numpy as np

    f32 = np.float32
    j = np.arange(256)
    low = counts[:256].astype(np.int64) * _fixed_weights(f32(t0) + j.astype(f32) / f32(scale), row_max)
    high = counts[:256].astype(np.int64) * _fixed_weights(f32(t0) + (j + 1).astype(f32) / f32(scale), row_max)
    reach = lambda masses: masses[::-1].cumsum()[::-1] + above_mass  # noqa: E731
    first = max((int(b) for b in j[reach(low).astype(np.float64) * 2.0**-40 >= budget]), default=0)
    last = max((int(b) for b in j[reach(high).astype(np.float64) * 2.0**-40 >= budget]), default=0)
    return first, last


def _logit_key(s, inv_t, dtype: str) -> int:
    """select.py's _logit_key: the raw key of the 16-bit logit nearest scaled value ``s`` (a bf16's rounded down)."""
    import numpy as np

    logit = np.float32(s) / np.float32(inv_t)
    if dtype == "bf16":
        bits = int(np.array([logit], dtype=np.float32).view(np.int32)[0])
        return (bits if bits >= 0 else bits ^ 0x7FFFFFFF) >> 16
    with np.errstate(over="ignore"):  # (to inf, as the kernel's conversion)
        bits = int(np.array([logit], dtype=np.float32).astype(np.float16).view(np.int16)[0])
    return bits if bits >= 0 else bits ^ 0x7FFF


def _raw_window(first_bin: int, last_bin: int, t0: float, scale, inv_t, row_max: float, k_key: int, dtype: str) -> tuple[int, bool]:
    """select.py's _raw_window: the first of 256 single raw keys over value bins [first_bin,
    last_bin] and one more either side, and whether they cover them (up to the line max), none
    below the top-k key, and no key below the window scales to its first key's value."""
    import numpy as np

    f32 = np.float32
    inf_key = 32640 if dtype == "bf16" else 31744
    low_edge = f32(t0) + f32(first_bin - 1) / f32(scale) if first_bin >= 1 else f32(t0)
    high_edge = f32(t0) + f32(last_bin + 2) / f32(scale) if last_bin + 2 < 256 else f32(row_max)
    key_low = _logit_key(low_edge, inv_t, dtype) - 1
    key_high = _logit_key(min(high_edge, f32(row_max)), inv_t, dtype) + 1
    first = min(max(((key_low + key_high) >> 1) - 127, -32768), 32767 - 255)
    low = _raw_scaled(max(first, -inf_key - 1), dtype, inv_t)
    if _order_key(low) < k_key:
        first = min(max(key_low, -32768), 32767 - 255)
        low = _raw_scaled(max(first, -inf_key - 1), dtype, inv_t)
    high = _raw_scaled(min(first + 255, inf_key), dtype, inv_t)
    apart = first <= -inf_key - 1 or _raw_scaled(max(first - 1, -inf_key - 1), dtype, inv_t) < low
    return first, bool(low <= low_edge and high >= min(high_edge, f32(row_max)) and _order_key(low) >= k_key and apart)


def window_outcome(values, keys, part: int, dtype: str, inv_t, top_k: int) -> dict:
    """What the statistics' top windows (stats.py, thresholds.py) tell of one 16-bit line's top-k:
    ``values`` its scaled values, ``keys`` their raw keys, ``part`` values per statistics part.
    Each part counts the single raw keys from two above its scaled max's logit's down 255 keys;
    the line's window is the 255 keys below the highest of those tops. ``usable``: no part had a
    value above its window; ``settles``: the window holds at least k values (the cut is then the
    scaled value of its key ``cut_key``; ``strict`` unless the key below the window scales to that
    value too, when one pass over that scaled key finds the kept set)."""
    import numpy as np
    import torch

    f32 = np.float32
    finite = values > -np.inf
    tops = []
    for start in range(0, values.size, part):
        seen = values[start : start + part][finite[start : start + part]]
        top = f32(seen.max()) if seen.size else f32(-np.inf)
        logit = torch.tensor([float(top / f32(inv_t))], dtype=torch.float32).to(torch.bfloat16 if dtype == "bf16" else torch.float16)
        tops.append(min(int(_raw_keys(logit.view(torch.int16).numpy())[0]) + 2, 32767))
        if (keys[start : start + part][finite[start : start + part]] > tops[-1]).any():
            return {"usable": False, "settles": False}
    first = max(tops) - 254
    inside = finite & (keys >= first)
    if int(inside.sum()) < top_k:
        return {"usable": True, "settles": False}
    cut_key = int(np.sort(keys[inside])[::-1][top_k - 1])
    cut_value = _raw_scaled(cut_key, dtype, inv_t)
    strict = first <= -32768 or _raw_scaled(max(first - 1, -32768), dtype, inv_t) < cut_value
    return {"usable": True, "settles": True, "cut_key": cut_key, "cut_value": cut_value, "strict": strict}


def _raw_scaled_all(keys, dtype: str, inv_t):
    """_raw_scaled of every raw key of an int64 array (float32)."""
    import numpy as np

    bits = np.where(keys >= 0, keys, keys ^ 0x7FFF).astype(np.int16)
    values = (bits.astype(np.int32) << 16).view(np.float32) if dtype == "bf16" else bits.view(np.float16).astype(np.float32)
    return values * np.float32(inv_t)


def top_p_window_outcome(keys, dtype: str, inv_t, row_max: float, budget: float) -> dict:
    """What a 16-bit line's top-p window (stats.py's top_p_window, thresholds.py's _top_p_window_cut)
    tells of its top-p cut: ``keys`` the raw keys of all its values, ``row_max`` its scaled max,
    ``budget`` top_p times its mass. The window: one bin per raw key from two above the max's
    logit down, the keys within a quarter of the max's ulp from 0 in one bin. ``settles``: it holds
    the cut (then ``cut_value``), ``steps``: the threshold item's scan steps (from the top)."""
    import numpy as np
    import torch

    from specdec_ext._triton_backend import TOP_P_WINDOW_BINS as bins
    from specdec_ext._triton_backend import TOP_P_WINDOW_STEP as step

    f32 = np.float32
    logit = torch.tensor([float(f32(row_max) / f32(inv_t))], dtype=torch.float32).to(torch.bfloat16 if dtype == "bf16" else torch.float16)
    top = min(int(_raw_keys(logit.view(torch.int16).numpy())[0]) + 2, 32767)
    exponent = (int(np.array([row_max], dtype=f32).view(np.int32)[0]) >> 23) & 0xFF
    quarter = float(np.array([max(exponent - 25, 0) << 23], dtype=np.int32).view(f32)[0])
    with np.errstate(over="ignore"):
        q_logit = torch.tensor([float(f32(quarter) / f32(inv_t))], dtype=torch.float32).to(torch.bfloat16 if dtype == "bf16" else torch.float16)
    zero_hi = int(_raw_keys(q_logit.view(torch.int16).numpy())[0])
    for _ in range(2):
        zero_hi = zero_hi - 1 if _raw_scaled(zero_hi, dtype, inv_t) >= quarter else zero_hi
    zero_hi = min(max(zero_hi, 0) if quarter > 0 else -1, top)
    zero_lo = -max(zero_hi, 0) - 1
    lo = max(top - (bins - 2) - max(zero_hi - zero_lo, 0), -32768)
    zero_lo = max(zero_lo, lo)
    span = max(zero_hi - zero_lo, 0)
    inside = np.maximum(keys - span, np.minimum(keys, zero_lo)) - lo
    counts = np.bincount(np.where((inside >= 0) & (inside < bins - 1), inside, bins - 1), minlength=bins)
    slots = np.arange(bins)
    bin_keys = lo + slots + np.where(slots > zero_lo - lo, span, 0)
    values = _raw_scaled_all(np.minimum(bin_keys, 32767), dtype, inv_t)
    mass = np.where(slots < bins - 1, counts, 0).astype(np.int64) * _fixed_weights(values, row_max)  # (NaN past +inf's key: 0)
    mass_from = np.cumsum(mass[::-1])[::-1]
    ok = mass_from.astype(np.float64) * 2.0**-40 >= budget
    best = int(slots[ok].max()) if ok.any() else -1
    if best < 0:
        return {"settles": False, "steps": bins // step}
    steps = bins // step - best // step
    cut_value = f32(values[best])
    lowest = int(bin_keys[best // step * step])
    apart = lowest <= -32768 or _raw_scaled(max(lowest - 1, -32768), dtype, inv_t) < cut_value
    same = f32(_raw_scaled(zero_lo, dtype, inv_t)) - f32(row_max) == f32(_raw_scaled(zero_lo + span, dtype, inv_t)) - f32(row_max)
    top_key = lo + (bins - 2) + span
    none_above = top_key >= 32767 or _raw_scaled(min(top_key + 1, 32767), dtype, inv_t) > row_max
    single = best != zero_lo - lo or span == 0  # (a cut in the merged keys' bin: not settled)
    return {"settles": bool(apart and same and none_above and single), "cut_value": float(cut_value), "steps": steps}


def _histogram_top_k() -> int:
    from specdec_ext._triton_backend import HISTOGRAM_TOP_K

    return HISTOGRAM_TOP_K


def sample_ids(vocab: int, runs: int, run: int | None = None):
    """thresholds.py's sample of a line: ``runs`` runs of ``run`` consecutive ids, evenly spaced,
    (vocab - run) // (runs - 1) apart (the whole line when it is no longer)."""
    import numpy as np

    from specdec_ext._triton_backend import SAMPLE_RUN

    run = run or SAMPLE_RUN
    if vocab <= runs * run:
        return np.arange(vocab)
    starts = np.arange(runs, dtype=np.int64) * ((vocab - run) // (runs - 1))
    return (starts[:, None] + np.arange(run)[None, :]).reshape(-1)


def sampled_top_k_lo(scaled, top_k: int, gather: int, runs: int, run: int | None = None, sample=None) -> int | None:
    """thresholds.py's _sampled_top_k_lo on one float32 line (a numpy vector in id order, -inf
    where not finite): the gather's lo, or None when the sample has fewer finite values than its
    rank. ``sample``: other ids instead of the runs (studies only)."""
    import numpy as np

    values = np.asarray(scaled, dtype=np.float32)
    ids = sample_ids(values.size, runs, run) if sample is None else sample
    drawn = values[ids]
    drawn = drawn[drawn > -np.inf]
    spread = ids.size < values.size
    rank = (math.isqrt(top_k * gather) * ids.size + values.size - 1) // values.size if spread else top_k
    if drawn.size < rank:
        return None
    return (int(np.sort(_order_keys(drawn))[::-1][rank - 1]) >> 16) << 16


def _sample_weights(scaled, row_max: float, line_mass: float, budget: float, floor_key: int | None, runs: int, run: int | None) -> dict:
    """thresholds.py's _sample_weights on one line's sample (sample_ids): the sampled values' order
    keys, which lie at or below the candidates' floor, their int32 weights (int64 here) in units
    of 2**-17 of the floor value's, the reference value, the total, and the float64 rest and need
    of the estimate's test; with the floor and the line's size."""
    import numpy as np

    f32, f64 = np.float32, np.float64
    values = np.asarray(scaled, dtype=f32)
    keys = np.where(values > -np.inf, _order_keys(values), -(2**31))
    floor = 2**31 - 1 if floor_key is None else floor_key
    known = int(_fixed_weights(values, row_max)[keys > floor].sum()) if floor_key is not None else 0
    ids = sample_ids(values.size, runs, run)
    ref = f32(min(float(_key_floats(np.array([floor]))[0]), row_max)) if -2139095041 < floor < 2139095040 else f32(row_max)
    drawn, drawn_keys = values[ids], keys[ids]
    below = (drawn_keys <= floor) & (drawn > -np.inf)
    with np.errstate(invalid="ignore"):
        weight = np.where(below, (np.exp2((np.minimum(drawn, ref) - ref) * f32(1.4426950408889634)) * f32(131072.0)).astype(np.int64), 0)
    total = int(weight.sum())
    rest = f64(f32(line_mass)) * f64(2.0**40) - f64(known)
    need = (f64(f32(budget)) * f64(2.0**40) - f64(known)) * f64(total)
    return {"keys": drawn_keys, "below": below, "weight": weight, "ref": ref, "total": total, "rest": rest, "need": need, "floor": floor,
            "size": values.size}


def sampled_top_p_window(scaled, dtype: str, inv_t, row_max: float, line_mass: float, budget: float, floor_key: int | None, runs: int,
                         run: int | None = None) -> tuple[int, bool]:
    """thresholds.py's _sampled_top_p_window on one 16-bit line (``scaled``: its values times
    ``inv_t``, -inf where not finite; ``dtype`` "bf16" or "fp16"; ``line_mass`` its mass in units
    of the max's weight; ``floor_key``: the candidates' floor, None when they do not fit the
    sort): (the raw window's first key, usable). The same integer sums and float64 steps as the
    kernel's."""
    import numpy as np

    inf_key = 32640 if dtype == "bf16" else 31744
    f32 = np.float32
    sample = _sample_weights(scaled, row_max, line_mass, budget, floor_key, runs, run)
    drawn, ref, total, rest, need = (sample[name] for name in ("weight", "ref", "total", "rest", "need"))

    def at_key(key: int) -> int:
        value = f32(_raw_scaled(key, dtype, inv_t))
        if value > f32(row_max):  # (above the line max: no value, no mass)
            return 2**31 - 1
        return int((np.exp2((min(value, ref) - ref) * f32(1.4426950408889634)) * f32(131072.0)).astype(np.int64))

    low, top = -inf_key - 1, inf_key
    with np.errstate(over="ignore"):  # (a key whose value overflows once scaled: +inf, then the max's weight)
        for _ in range(16):
            middle = (low + top + 1) >> 1
            reached = np.float64(int(drawn[drawn >= at_key(middle)].sum())) * rest >= need
            low, top = (middle, top) if reached else (low, middle - 1)
    first = min(max(low - 127, -inf_key - 1), inf_key - 255)
    apart = first <= -inf_key - 1 or _raw_scaled(max(first - 1, -inf_key - 1), dtype, inv_t) < _raw_scaled(first, dtype, inv_t)
    return first, bool(total > 0 and apart)


def sampled_top_p_gather(scaled, row_max: float, line_mass: float, budget: float, floor_key: int | None, runs: int, gather: int, bracket_lo: int,
                         max_key: int, run: int | None = None) -> tuple[int, int, bool]:
    """thresholds.py's _sampled_top_p_gather on one 32-bit line (``scaled``: its values times 1 /
    temperature, -inf where not finite; the rest as ``sampled_top_p_window``): (the gather's lo and
    hi order keys, usable). The same integer sums and float64 steps as the kernel's."""
    import numpy as np

    f64 = np.float64
    sample = _sample_weights(scaled, row_max, line_mass, budget, floor_key, runs, run)
    weight, total, rest, need = (sample[name] for name in ("weight", "total", "rest", "need"))
    high = np.where(sample["below"], sample["keys"] >> 16, -32769)
    floor, size, drawn = sample["floor"], sample["size"], sample["keys"].size
    low, top = -32768, 32767
    for _ in range(16):
        middle = (low + top + 1) >> 1
        low, top = (middle, top) if f64(int(weight[high >= middle].sum())) * rest >= need else (low, middle - 1)
    cut = low
    per_sampled = f64(size) / f64(drawn)  # (the kernel's width / min(width, runs * run))
    count = lambda bucket: int((high >= bucket).sum())  # noqa: E731
    at_cut, past_cut = count(cut), count(cut + 1)
    in_bucket = f64(at_cut - past_cut) * per_sampled
    quota = (gather * 0.75 - in_bucket) * 0.5
    first, first_top, past, past_top = -32768, cut, cut + 1, 32768
    for _ in range(16):
        middle = (first + first_top) >> 1
        first, first_top = (first, middle) if f64(count(middle) - at_cut) * per_sampled <= quota else (middle + 1, first_top)
        middle = (past + past_top + 1) >> 1
        past, past_top = (middle, past_top) if f64(past_cut - count(middle)) * per_sampled <= quota else (past, middle - 1)
    lo = max(first_top << 16, bracket_lo)
    hi = min((past << 16) - 1, max_key, floor)
    return lo, hi, bool(total > 0 and lo <= hi and in_bucket <= gather * 0.375)


def _top_p_halvings(keys, weights, above_mass: int, budget: float) -> tuple[int, int]:
    """select.py's _top_p_cut on gathered keys (any order) with their fixed-point weights: (its
    halvings' trips, the cut)."""
    if not keys.size:
        return 0, -(2**31)
    reaches = lambda mass: float(mass) * 2.0**-40 >= float(budget)  # noqa: E731
    lo, hi, trips = int(keys.min()), int(keys.max()) + 1, 0
    while lo < hi:
        middle = (lo + hi) >> 1
        short = not reaches(above_mass + int(weights[keys > middle].sum()))
        lo, hi, trips = (lo, middle, trips + 1) if short else (middle + 1, hi, trips + 1)
    at_or_above = keys[keys >= lo]
    return trips, int(at_or_above.min()) if at_or_above.size else int(keys.max())


def select_search(scaled, top_k: int, top_p: float, line_mass: float | None = None, gather: int = 2048, raw=None, floor_key: int | None = None,
                  window_part: int | None = None, top_p_window: bool = False, sample_runs: int = 0, histogram_top_k: int | None = None,
                  top_p_gather: bool = False, window_gather: int | None = None) -> dict:
    """select.py's whole-line search on one float32 line (a numpy vector), pass by pass: the cut
    (an order key), the kept mass (fixed point) and, per pass, its stage and the fraction of the
    line's values it bins or gathers (stage 3 adds each binned one's mass by a global atomic).
    ``line_mass``: the statistics' mass of the line (default: its float64 sum). ``raw``: a 16-bit
    line's (bits as int16, "bf16" or "fp16", float32 1 / temperature), ``scaled`` being its values
    times that: its top-k runs over the bits' keys (stage 7), its top-p through a raw window (stage 8).
    ``floor_key``: the candidates' floor (candidate_outcome's: every value above it is one; None
    when they do not fit the sort), which tells whether the threshold item sums the mass above a
    raw window from them (thresholds.py): that window's pass then only counts. ``window_part``:
    values per statistics part where they count their top windows (a 16-bit line under a top-k
    above HISTOGRAM_TOP_K with KEY_WINDOW; ``window_outcome``): a window that holds the cut
    settles top-k with no pass. ``top_p_window``: a 16-bit line cut by top-p alone has its top-p
    window counted by its statistics (one part reads it whole, TOP_P_BINS; ``top_p_window_outcome``,
    returned as "top_p_window"): a window that holds the cut settles it with no pass. ``sample_runs``:
    a top-k whose k no statistics counted (``histogram_top_k``, default HISTOGRAM_TOP_K) and that fits
    half the gather starts with a gather placed from a sample of the line (``sampled_top_k_lo``;
    Triton 3.6 and 3.7), and so does a 32-bit line cut by top-p alone with ``top_p_gather`` (in a
    call of 32-bit lines: ``sampled_top_p_gather``). ``window_gather``: a top-p window gather's slots (stage 5;
    default twice ``gather``, WINDOW_GATHER where a line's histogram counts hold them). Each pass
    records ``halvings``: the trips of its top-p cut's halvings (``_top_p_cut``) when it gathered."""
    import numpy as np

    f32, bins_n = np.float32, 256
    window_gather = 2 * gather if window_gather is None else window_gather
    values = np.asarray(scaled, dtype=f32)
    finite = values > -np.inf
    s_all = values[finite]
    skipped = values.size - s_all.size
    keys = _order_keys(s_all)
    raw_keys = _raw_keys(raw[0])[finite] if raw is not None else None
    row_max = float(s_all.max())
    weights = _fixed_weights(s_all, row_max)
    if line_mass is None:
        line_mass = float(np.exp(s_all.astype(np.float64) - row_max).sum())
    reaches = lambda mass, budget: float(mass) * 2.0**-40 >= float(budget)  # noqa: E731
    use_p = top_p < 1
    top = int(_order_keys(np.array([row_max]))[0])
    lo, hi, budget, k_key, bracket = -(2**31), top, 0.0, -(2**31), (0, 0)
    if 0 < top_k < values.size:
        stage = 1
    else:
        budget = float(f32(top_p) * f32(line_mass))
        lo = _top_p_floor(row_max, line_mass, budget, values.size)
        stage = _top_p_stage(lo, hi) or 3
    p_window = None
    if top_p_window and raw is not None and stage in (2, 3):
        p_window = top_p_window_outcome(_raw_keys(raw[0]), raw[1], raw[2], row_max, budget)
        if p_window["settles"]:
            cut = _order_key(p_window["cut_value"])
            kept = int(weights[s_all >= f32(p_window["cut_value"])].sum())
            return {"cut": cut, "kept_mass": kept, "passes": [], "stages": [], "path": [], "top_p_window": p_window, "top_k_window": False, "sampled": False,
                    "sampled_window": False}
    slots = np.arange(2 * bins_n)
    passes, kept = [], 0
    histogram_top_k = _histogram_top_k() if histogram_top_k is None else histogram_top_k
    counted = True  # (the statistics counted the first top-k pass's bins, under a top-k above HISTOGRAM_TOP_K)
    k_window = False  # (its top windows hold k values: the threshold item sorts no candidates)
    if stage == 1 and raw is not None and window_part and top_k > histogram_top_k:
        window = window_outcome(values, _raw_keys(raw[0]), window_part, raw[1], raw[2], top_k)
        counted = window["usable"]
        k_window = bool(window["settles"])
        if window["settles"]:
            cut = _order_key(window["cut_value"])
            lo = hi = cut
            if window["strict"]:
                kept_values = s_all >= f32(window["cut_value"])
                kept = int(weights[kept_values].sum())
                k_key, stage = cut, 0
                if use_p:
                    top_k_mass = float(f32(kept * 2.0**-40))
                    budget = float(f32(top_p) * f32(top_k_mass))
                    lo, hi = max(cut, _top_p_floor(row_max, top_k_mass, budget, int(kept_values.sum()))), top
                    stage = _top_p_stage(lo, hi)
    sampled = False
    if sample_runs and stage == 1 and top_k <= histogram_top_k and 2 * top_k <= gather:
        sample_lo = sampled_top_k_lo(values, top_k, gather, sample_runs)
        if sample_lo is not None:
            sampled, stage, lo, hi = True, 4, sample_lo, top
    sampled_window = False
    if sample_runs and raw is not None and stage in (2, 3) and not 0 < top_k < values.size:
        # (a 16-bit line cut by top-p alone: a raw window placed from a sample, the bracket kept for a miss)
        runs = 16 if sample_runs >= 32 else sample_runs // 2 if sample_runs >= 4 else sample_runs  # (thresholds.py's TOP_P_RUNS)
        first, usable = sampled_top_p_window(values, raw[1], raw[2], row_max, line_mass, budget, floor_key, runs)
        if usable:
            sampled_window, stage, bracket, lo, hi = True, 8, (lo, top), first, first + 255
    elif sample_runs and top_p_gather and raw is None and stage in (2, 3) and not 0 < top_k < values.size:
        # (a 32-bit line of a call of 32-bit lines cut by top-p alone: a gather placed from a sample, the bracket kept for a miss)
        runs = 16 if sample_runs >= 32 else sample_runs // 2 if sample_runs >= 4 else sample_runs  # (thresholds.py's TOP_P_RUNS)
        first, last, usable = sampled_top_p_gather(values, row_max, line_mass, budget, floor_key, runs, window_gather, lo, top)
        if usable:
            sampled_window, stage, bracket, lo, hi = True, 5, (lo, top), first, last
    while stage:
        if raw is not None and stage == 1 and lo == -(2**31):  # a 16-bit line's top-k: over raw keys
            stage, lo, hi = 7, -32768, 32767
        line_keys = raw_keys if stage in (7, 8) else keys
        shift = max((hi - lo).bit_length(), 8) - 8
        inside = (line_keys >= lo) & (line_keys <= hi)
        above_mass = int(weights[line_keys > hi].sum())
        # (the first top-k pass under a top-k above HISTOGRAM_TOP_K: the statistics launch's counts, a 16-bit
        # line's of its raw keys' high byte, a float32 line's in bins of 2**24 keys from -2**31; no mass)
        statistics = not passes and counted and top_k > histogram_top_k and (stage == 7 and lo == -32768 and hi == 32767 or stage == 1 and lo == -(2**31))
        if statistics and stage == 1:
            shift = 24
        # (a top-k pass whose top bin spans several keys cannot end the search: it counts, no mass)
        counts_only = statistics or stage in (1, 7) and (hi - lo) & ((1 << shift) - 1) != 0
        # (the pass over single raw keys after the statistics' counts only counts when the candidates hold every
        # value above its keys: the threshold item sums their mass; it ends the search all the same)
        mass_known = False
        if stage == 7 and passes and passes[-1]["statistics"]:
            at_hi, low_above = (_raw_scaled(min(key, 32767), raw[1], raw[2]) for key in (hi, hi + 1))
            mass_known = hi >= 32767 or floor_key is not None and at_hi < low_above and _order_key(low_above) > floor_key
        passes.append({"stage": stage, "binned": float(inside.sum()) / values.size, "counts_only": counts_only, "statistics": statistics,
                       "mass_known": mass_known, "halvings": 0})
        next_stage = 0
        if stage == 4 and (inside.sum() > gather or inside.sum() < top_k and lo > _order_key(-np.inf)):
            # (a gather placed from the sample that does not hold the cut: key bins below it, or over it;
            # one from -inf's key down that holds fewer than k values holds the line's finite values: the top-k set)
            lo, hi = (lo, hi) if inside.sum() > gather else (-(2**31), lo - 1)
            next_stage = 1
        elif stage in (4, 5):
            gathered = np.sort(keys[inside])[::-1]
            n = gathered.size
            slots_n = gather if stage == 4 else window_gather
            w = _fixed_weights(_key_floats(gathered), row_max)
            if stage == 4:
                k_key = int(gathered[top_k - 1]) if n >= top_k else -(2**31)
                w = np.where(gathered >= k_key, w, 0)
                budget = float(f32(top_p) * f32(float(w.sum()) * 2.0**-40))
            before = above_mass + np.cumsum(w) - w
            keep = int(sum(not reaches(b, budget) for b in before))
            cut = int(gathered[max(keep, 1) - 1]) if n else -(2**31)
            found = keep > 0 and reaches(above_mass + int(w.sum()), budget)
            if stage == 5 or use_p:  # (the kernel's halvings over [the lowest key, the highest + 1]: their trips, and the same cut)
                passes[-1]["halvings"], halved = _top_p_halvings(gathered[:slots_n], w[:slots_n], above_mass, budget)
                if n <= slots_n and n and halved != cut:
                    raise AssertionError(f"the halvings' cut {halved} is not the sorted keys' {cut}")
            if stage == 4:
                cut, found = (max(cut, k_key) if use_p else k_key), True
            kept = above_mass + int(w[gathered >= cut].sum())
            window_keys = (lo, hi)
            lo = cut
            if n > slots_n or not found:
                above = reaches(above_mass, budget) and n <= slots_n
                lo = window_keys[1] + 1 if above else bracket[0]
                hi = bracket[1] if above or n > slots_n else window_keys[0] - 1
                next_stage = 3
                if len(passes) == 1:  # (a sampled gather, the line's first pass: value bins over the side that holds the cut)
                    next_stage = (2 if above or n > slots_n else 6) if _top_p_stage(lo, hi) == 2 else 3
        elif stage in (2, 6):
            t0, t1 = (float(_key_floats(np.array([k]))[0]) for k in (lo, hi))
            scale = f32(bins_n) / (f32(t1) - f32(t0))
            b = np.clip(((s_all[inside] - f32(t0)) * scale).astype(np.int64), 0, bins_n - 1)
            counts = np.bincount(b, minlength=bins_n)
            middle = f32(t0) + (np.arange(bins_n).astype(f32) + f32(0.5)) / scale
            estimate = counts * _fixed_weights(middle, row_max).astype(np.float64)
            from_here = estimate[::-1].cumsum()[::-1] + above_mass
            ok = from_here * 2.0**-40 >= budget
            cut_bin = int(np.arange(bins_n)[ok].max()) if ok.any() else 0
            within = [int(counts[max(cut_bin - r, 0) : cut_bin + r + 1].sum()) for r in range(bins_n)]
            radius = max((r for r in range(bins_n) if within[r] <= window_gather // 2), default=-1)
            if stage == 2:
                bracket = (lo, hi)
            around = _value_window(max(cut_bin - 4, 0), min(cut_bin + 4, bins_n - 1), lo, hi, t0, scale)
            first, covers = 0, False
            if raw is not None:  # over the bins that can hold the cut, else (no wider gather) around the estimated bin
                first, covers = _raw_window(*_cut_bins(counts, above_mass, t0, scale, row_max, budget), t0, scale, raw[2], row_max, k_key, raw[1])
                if not covers and radius < 2:
                    first, covers = _raw_window(cut_bin - 1, cut_bin + 1, t0, scale, raw[2], row_max, k_key, raw[1])
            if covers:
                (lo, hi), next_stage = (first, first + 255), 8
            elif radius < 1 and stage == 2 and around[1] - around[0] >= 65536:
                (lo, hi), next_stage = around, 6
            elif radius >= 0:
                (lo, hi), next_stage = _value_window(max(cut_bin - radius, 0), min(cut_bin + radius, bins_n - 1), lo, hi, t0, scale), 5
            else:
                (lo, hi), next_stage = bracket, 3
        elif stage == 8:  # a raw window: each key's mass exact (its count times its weight)
            masses = np.zeros(2 * bins_n, np.int64)
            np.add.at(masses, line_keys[inside] - lo, weights[inside])
            masses[bins_n] = above_mass
            mass_from = masses[::-1].cumsum()[::-1]
            ok = (mass_from.astype(np.float64) * 2.0**-40 >= budget) & (slots < bins_n)
            best = int(slots[ok].max()) if ok.any() else 0
            above, whole = reaches(above_mass, budget), reaches(mass_from[0], budget)
            scaled_of = lambda key: _raw_scaled(key, raw[1], raw[2])  # noqa: E731
            cut_value = scaled_of(lo + best)
            values = np.array([scaled_of(min(lo + j, 32767)) for j in range(bins_n)], dtype=f32)
            kept = int(max((mass_from[j] for j in range(bins_n) if values[j] >= cut_value), default=0))
            window_lo = lo
            lo = hi = _order_key(cut_value)
            if above or not whole:
                lo = _order_key(scaled_of(min(window_lo + 256, 32767))) if above else bracket[0]
                hi = bracket[1] if above else max(_order_key(scaled_of(window_lo)), bracket[0])
                next_stage = 3
                if len(passes) == 1:  # (a sampled window, the line's first pass: value bins over the side that holds the cut)
                    next_stage = (2 if above else 6) if _top_p_stage(lo, hi) == 2 else 3
        else:
            counts = np.zeros(2 * bins_n, np.int64)
            masses = np.zeros(2 * bins_n, np.int64)
            b = (line_keys[inside] - lo) >> shift
            np.add.at(counts, b, 1)
            counts[bins_n] = (line_keys > hi).sum()
            if statistics:  # (the statistics count the values the search skips, -inf once scaled, in bin 0)
                counts[0] += skipped
            if stage in (3, 7):  # (stage 7's bins of one key: the kernel's count times the key's weight, the same sum)
                np.add.at(masses, b, weights[inside])
            masses[bins_n] = above_mass
            first = lo + (slots << shift)
            w_first = _fixed_weights(_key_floats(first), row_max)
            bin_mass = np.where((stage in (3, 7)) | (slots == bins_n), masses, counts * w_first)
            count_from = counts[::-1].cumsum()[::-1]
            mass_from = bin_mass[::-1].cumsum()[::-1]
            in_window = slots < ((hi - lo) >> shift) + 1
            ok = ((count_from >= top_k) if stage in (1, 7) else (mass_from.astype(np.float64) * 2.0**-40 >= budget)) & in_window
            best = int(slots[ok].max()) if ok.any() else 0
            lo, hi = lo + (best << shift), min(hi, lo + (best << shift) + (1 << shift) - 1)
            kept = int(mass_from[best])
            done = lo >= hi and not statistics  # (counts alone cannot end it: a pass over the one key then sums its mass)
            next_stage = 0 if done else stage
            if stage in (1, 7):
                strict = True
                if done and stage == 7:  # the cut as a scaled key; one pass over it when its raw key below scales the same
                    cut_value = _raw_scaled(lo, raw[1], raw[2])
                    strict = lo == -32768 or _raw_scaled(max(lo - 1, -32768), raw[1], raw[2]) < cut_value
                    lo = hi = _order_key(cut_value)
                    next_stage = 0 if strict else 1
                if done:
                    k_key = lo
                    if use_p and strict:
                        top_k_mass = float(f32(kept * 2.0**-40))
                        budget = float(f32(top_p) * f32(top_k_mass))
                        lo, hi = max(lo, _top_p_floor(row_max, top_k_mass, budget, int(count_from[best]))), top
                        next_stage = _top_p_stage(lo, hi)
                elif stage == 1 and count_from[best] <= gather:
                    hi, next_stage = top, 4
        stage = next_stage
    # path: the passes as the kernel records them (a top-k pass that only counts as 7)
    return {"cut": lo, "kept_mass": kept, "passes": passes, "stages": [q["stage"] for q in passes],
            "path": [7 if q["counts_only"] else 1 if q["stage"] == 7 else q["stage"] for q in passes], "top_p_window": p_window,
            "top_k_window": k_window, "sampled": sampled, "sampled_window": sampled_window}


def _order_key(value: float) -> int:
    import numpy as np

    return int(_order_keys(np.array([value]))[0])


def _demo_lines(dtype) -> tuple[str, object]:
    """The embedded target's logits over documents of the demo corpus (specdec_ext/demo)."""
    import torch

    from specdec_ext.demo import assets, corpus

    target, _, tokenizer = assets.load_pair()
    documents = corpus.generate_corpus(24, seed=11)
    lines = []
    with torch.no_grad():
        for text in documents:
            ids = tokenizer(text, return_tensors="pt").input_ids[:, :96]
            lines.append(target(ids).logits[0].to(dtype).float())
    return f"embedded target (V={lines[0].shape[-1]}) on 24 demo-corpus documents, {str(dtype).split('.')[-1]}", torch.cat(lines)


def _tiny_lines(vocab: int) -> list[tuple[str, object]]:
    """bf16 logits of the tiny architectures the tests build (tests/support/tiny_models.py), at ``vocab``."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("tiny_models", Path(__file__).resolve().parent.parent / "tests" / "support" / "tiny_models.py")
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    found = []
    ids = torch.randint(0, vocab, (4, 24), generator=torch.Generator().manual_seed(3))
    for name, build in (("tiny_llama", tiny.tiny_llama), ("tiny_gpt2", tiny.tiny_gpt2)):
        model = build(vocab_size=vocab)
        with torch.no_grad():
            found.append((f"{name} (V={vocab}, logit_scale 2, random inputs), bf16", model(ids).logits.reshape(-1, vocab).to(torch.bfloat16).float()))
    return found


MEASURE_SETTINGS = [(0.7, 50, 0.9), (1.0, 0, 0.95), (1.0, 1000, 1.0), (1.0, 0, 0.99)]


def measure_trips() -> dict:
    """The data-dependent trips of filtered calls on LM logits, for the goal geometries."""
    import numpy as np
    import torch

    from specdec_ext import _triton_backend
    from specdec_ext.reference import filter_thresholds

    sources = [_demo_lines(torch.float32), _demo_lines(torch.bfloat16)] + _tiny_lines(128256)
    found = []
    for source, logits in sources:
        vocab = logits.shape[-1]
        for label, shape in (("B=64 K=8 bf16", _B64), ("B=1 K=4 fp32", _B1)):
            call = Call(label, **(shape | {"vocab": vocab}), top_k=50)
            parts, lanes, rows, tiles_per_part, line_slots = candidate_geometry(call)
            part = window_part(call)
            top_p_window = top_p_window_on(replace(call, top_k=0, top_p=0.9))
            # A bf16 call's lines of bf16 logits: their top-k over raw keys (select_search's raw)
            raw16 = shape["dtype"] == "bf16" and torch.equal(logits.to(torch.bfloat16).float(), logits)
            for temperature, top_k, top_p in MEASURE_SETTINGS:
                inv_t = np.float32(1.0) / np.float32(temperature)
                scaled = logits * torch.tensor(inv_t) if raw16 else logits / temperature
                bits = logits.to(torch.bfloat16).view(torch.int16).numpy() if raw16 else None
                outcomes = [candidate_outcome(line.numpy(), parts, lanes, rows, tiles_per_part, line_slots, _triton_backend.SORT, top_k, top_p)
                            for line in scaled]
                resolved = np.array([o["resolved"] for o in outcomes])
                tau = filter_thresholds(scaled, torch.full((len(scaled),), top_k), torch.full((len(scaled),), top_p))
                passes, differs, windowed, steps, plain, unsorted = [], 0, 0, [], [], Counter()
                # (where tl.histogram is warp ballots, Triton 3.6 and 3.7: no statistics windows, sampled starts)
                sampled_passes, sampled_lines, sampled_windows = [], 0, 0
                for n, (line, cut, outcome) in enumerate(zip(scaled, tau.tolist(), outcomes, strict=True)):
                    if outcome["resolved"]:
                        continue
                    search = select_search(line.numpy(), top_k, top_p, raw=(bits[n], "bf16", inv_t) if raw16 else None, floor_key=outcome["floor_key"],
                                           window_part=part if raw16 else None, top_p_window=top_p_window and top_k == 0)
                    unsorted.update(unsorted_kind(search))
                    if search["top_p_window"]:
                        steps.append(search["top_p_window"]["steps"])
                        # (the same line where no top-p window is counted: Triton before 3.8)
                        plain.append(select_search(line.numpy(), top_k, top_p, raw=(bits[n], "bf16", inv_t), floor_key=outcome["floor_key"],
                                                   window_gather=_triton_backend.SELECT_GATHER)["passes"])
                    elif search["passes"]:
                        plain.append(search["passes"])
                    if raw16:
                        ballots = select_search(line.numpy(), top_k, top_p, raw=(bits[n], "bf16", inv_t), floor_key=outcome["floor_key"],
                                                sample_runs=_triton_backend.SAMPLE_RUNS, histogram_top_k=_triton_backend.SAMPLED_HISTOGRAM_TOP_K,
                                                window_gather=_triton_backend.SELECT_GATHER)
                        sampled_passes.append(ballots["passes"])
                        sampled_lines += ballots["sampled"]
                        sampled_windows += ballots["sampled_window"]
                    if search["cut"] != fixed_point_cut(line.numpy(), top_k, top_p):
                        raise AssertionError(f"select_search's cut {search['cut']} is not the fixed-point masses' {fixed_point_cut(line.numpy(), top_k, top_p)}")
                    differs += search["cut"] != _order_key(cut)
                    if not search["passes"]:  # (settled by the statistics' top window or top-p window: never listed)
                        windowed += 1
                        resolved[n] = True
                        continue
                    passes.append(search["passes"])
                trips = _search_trips(passes)
                plain_trips = _search_trips(plain)
                ballot_trips = _search_trips(sampled_passes) if sampled_passes else {"search_passes": 0.0}
                above = np.array([o["above_floor"] for o in outcomes])
                found.append({
                    "source": source, "geometry": f"{label} ({parts} statistics parts of {tiles_per_part} tiles x {rows} rows x {lanes} lanes)",
                    "temperature": temperature, "top_k": top_k, "top_p": top_p, "lines": len(outcomes),
                    "resolved_fraction": round(float(resolved.mean()), 4), "search_fraction": round(1 - float(resolved.mean()), 4),
                    "window_settled_fraction": round(windowed / len(outcomes), 4),
                    "top_p_window_share": round(len(steps) / len(outcomes), 4), "top_p_window_steps": round(sum(steps) / len(steps), 3) if steps else 0.0,
                    **{name: round(unsorted[name] / len(outcomes), 4) for name in ("top_p_settled_share", "top_k_window_share")},
                    "search_passes_mean": trips["search_passes"], "searched_cuts_unlike_the_float_reference": differs,
                    **{name: trips.get(name, 0.0) for name in SEARCH_FIELDS},
                    # Where no top-p window is counted (TOP_P_BINS 0: Triton before 3.8), the lines it settled are searched.
                    "without_top_p_window": {"search_fraction": round(len(plain) / len(outcomes), 4), "search_passes_mean": plain_trips["search_passes"],
                                             **{name: plain_trips.get(name, 0.0) for name in SEARCH_FIELDS}},
                    # Where tl.histogram is warp ballots (SAMPLE_RUNS: Triton 3.6, 3.7): no window, sampled starts (16-bit lines).
                    **({"with_sample": {"search_fraction": round(len(sampled_passes) / len(outcomes), 4), "search_passes_mean": ballot_trips["search_passes"],
                                        "sampled_share": round(sampled_lines / len(outcomes), 4),
                                        "top_p_sampled_share": round(sampled_windows / len(outcomes), 4),
                                        **{name: ballot_trips.get(name, 0.0) for name in SEARCH_FIELDS}}} if raw16 else {}),
                    "values_above_floor": {"median": float(np.median(above)), "p1": float(np.percentile(above, 1)), "overflow_fraction": float(np.mean(above < 0))},
                    "part_levels": dict(Counter(level for o in outcomes for level in o["levels"])),
                })
                print(f"  {source} | {label}: T={temperature} top-k {top_k} top-p {top_p}: resolved {found[-1]['resolved_fraction']}, "
                      f"search passes {found[-1]['search_passes_mean']}, above floor {found[-1]['values_above_floor']}")
    found += _measure_vllm_trips([source for source in sources if source[0].startswith("tiny_llama")])
    return {"method": "bench.gpu_model.candidate_outcome on every line (the kernels' rules; tests/triton/test_triton_identity.py checks them against the "
                      "kernels), select_search (select.py's search, pass by pass; its cuts checked against the reference's) for the search passes",
            "results": found, "block_walks": measure_block_walks()}


VLLM_MEASURE_SETTINGS = [(0.7, 50, 0.9), (1.0, 0, 0.95)]


def _measure_vllm_trips(sources: list) -> list[dict]:
    """The trips of vLLM's call (float32 lines, B=64 K=8) on LM logits upcast to float32, as its
    sampler hands them over: its lines start with sampled gathers (``sampling``: this Triton's
    slots, twice a gather's for a top-p window where ranks are by byte histograms)."""
    import numpy as np

    from specdec_ext._triton_backend import SORT

    found = []
    call = Call("vLLM", **dict(_B64, dtype="fp32"), top_k=50)
    geometry, sample = candidate_geometry(call), sampling(call)
    for source, logits in sources:
        for temperature, top_k, top_p in VLLM_MEASURE_SETTINGS:
            scaled = (logits / temperature).numpy().astype(np.float32)
            passes, sampled, sampled_window = [], 0, 0
            for line in scaled:
                outcome = candidate_outcome(line, *geometry, SORT, top_k, top_p)
                if outcome["resolved"]:
                    continue
                search = select_search(line, top_k, top_p, floor_key=outcome["floor_key"], top_p_gather=True, **sample)
                if search["cut"] != fixed_point_cut(line, top_k, top_p):
                    raise AssertionError("select_search's cut is not the fixed-point masses'")
                passes.append(search["passes"])
                sampled += search["sampled"]
                sampled_window += search["sampled_window"]
            trips = _search_trips(passes)
            found.append({"source": source.replace("bf16", "bf16 upcast to float32"), "geometry": "vLLM B=64 K=8 fp32", "temperature": temperature,
                          "top_k": top_k, "top_p": top_p, "lines": len(scaled), "search_fraction": round(len(passes) / len(scaled), 4),
                          "search_passes_mean": trips["search_passes"], "sampled_share": round(sampled / len(scaled), 4),
                          "top_p_sampled_share": round(sampled_window / len(scaled), 4), "window_gather": sample["window_gather"],
                          **{name: trips.get(name, 0.0) for name in SEARCH_FIELDS}})
            print(f"  {found[-1]['source']} | vLLM B=64 K=8 fp32: T={temperature} top-k {top_k} top-p {top_p}: searched {found[-1]['search_fraction']}, "
                  f"search passes {trips['search_passes']}")
    return found


BLOCK_MEASURE_SETTINGS = [(1.0, 0, 1.0), (0.7, 50, 0.9)]
BLOCK_BATCH = 64


def _expected_max(values, batch: int) -> float:
    """E[max of ``batch`` independent draws] from the empirical distribution of integer ``values``."""
    import numpy as np

    values = np.asarray(values)
    return float(sum(1.0 - np.mean(values < m) ** batch for m in range(1, int(values.max()) + 1)))


def measure_block_walks(k: int = 8, coins: int = 16) -> dict:
    """Block walks on the embedded pair (specdec_ext/demo): drafts of k tokens sampled from the
    draft's processed distribution after contexts cut from the demo corpus, the target's logits
    after them, then verify(method="block", backend="eager") with ``coins`` seeds per row. Per row
    and position i < k: whether the row walks below n (eta_n >= p_n) and the coin may stop it at i
    (tree.py's _may_stop: p_i > 0.99 eta_i), the work items that sum their chunks of S_i
    ("summed_share"); and the positions a walk that sums S_i from n down until a coin stops it
    would read one after another (a row
    stopping at tau < k: k - max(tau, 1); one accepting every draft: none), with the expected most
    of any row of BLOCK_BATCH."""
    import numpy as np
    import torch

    import specdec_ext
    from specdec_ext._philox import coin_uniforms
    from specdec_ext.demo import assets, corpus
    from specdec_ext.reference import process_lines
    from specdec_ext.reference_tree import block_weights

    target, distilled, tokenizer = assets.load_pair()
    contexts: dict[int, list] = {}
    for text in corpus.generate_corpus(24, seed=11):
        ids = tokenizer(text, return_tensors="pt").input_ids[0]
        for length in (24, 48, 72):
            if len(ids) >= length:
                contexts.setdefault(length, []).append(ids[:length])
    generator = torch.Generator().manual_seed(7)

    def probs(logits, temperature, top_k, top_p):
        lines = logits.reshape(-1, logits.shape[-1])
        n = len(lines)
        return process_lines(lines, torch.full((n,), temperature), torch.full((n,), top_k), torch.full((n,), top_p)).probs().reshape(logits.shape)

    found = []
    for draft_name, draft in (("distilled draft", distilled), ("early-exit draft (the target's first layer)", assets.early_exit_draft(target, 1))):
        for temperature, top_k, top_p in BLOCK_MEASURE_SETTINGS:
            passes, accepted, summed = [], [], []
            for length, rows in contexts.items():
                sequences = torch.stack(rows)
                batch = len(rows)
                draft_lines, tokens = [], []
                with torch.no_grad():
                    for _ in range(k):
                        logits = draft(sequences).logits[:, -1].float()
                        token = torch.multinomial(probs(logits, temperature, top_k, top_p), 1, generator=generator)
                        draft_lines.append(logits)
                        tokens.append(token)
                        sequences = torch.cat([sequences, token], dim=1)
                    target_logits = target(sequences).logits[:, length - 1 :].float()
                draft_logits, tokens = torch.stack(draft_lines, 1), torch.cat(tokens, 1)
                p_x = probs(target_logits, temperature, top_k, top_p)[:, :k].gather(2, tokens[:, :, None])[..., 0]
                q_x = probs(draft_logits, temperature, top_k, top_p).gather(2, tokens[:, :, None])[..., 0]
                weights = block_weights(p_x, q_x)  # (batch, k): p_1 .. p_k
                for coin in range(coins):
                    seeds = torch.arange(batch) + 1000 * coin
                    result = specdec_ext.verify(target_logits, draft_logits, tokens, temperature=temperature, top_k=top_k or None,
                                                top_p=top_p if top_p < 1 else None, seeds=seeds, method="block", backend="eager")
                    tau = result.num_accepted
                    passes += torch.where(tau < k, k - tau.clamp(min=1), 0).tolist()
                    accepted += tau.tolist()
                    eta = coin_uniforms(seeds, torch.arange(k)[None, :].expand(batch, k))  # eta_i at column i - 1
                    walks_down = eta[:, k - 1 :] >= weights[:, k - 1 :]  # (the row does not stop at n = k)
                    summed += ((weights[:, : k - 1] > 0.99 * eta[:, : k - 1]) & walks_down).flatten().tolist()
            counts = np.bincount(passes, minlength=k)
            found.append({"draft": draft_name, "temperature": temperature, "top_k": top_k, "top_p": top_p, "rows": len(passes),
                          "accepted_mean": round(float(np.mean(accepted)), 3), "summed_share": round(float(np.mean(summed)), 4),
                          "sequential_passes_mean": round(float(np.mean(passes)), 3), "sequential_passes_histogram": counts.tolist(),
                          f"sequential_passes_most_of_{BLOCK_BATCH}": round(_expected_max(passes, BLOCK_BATCH), 3)})
            print(f"  block walks, {draft_name}, T={temperature} top-k {top_k} top-p {top_p}: accepted {found[-1]['accepted_mean']} of {k}, "
                  f"items summed {found[-1]['summed_share']}; one after another: {found[-1]['sequential_passes_mean']} a row, "
                  f"{found[-1][f'sequential_passes_most_of_{BLOCK_BATCH}']} in the row of {BLOCK_BATCH} that reads most")
    return {"method": f"verify(method='block', backend='eager') on drafts of k={k} sampled from the embedded pair's draft after contexts of 24, 48 "
                      f"and 72 tokens of 24 demo-corpus documents, {coins} coin seeds a row",
            "results": found}


def measured_windows(stored: dict, versions: dict) -> bool:
    """Whether a stored measurement of trips was made where the statistics count windows
    (key_window_default(): Triton 3.8 and later). Its lines' outcomes depend on it: a top-p line
    measured without the statistics' top-p windows has no outcome for them, so a model of Triton
    3.8+ must not take it. Measurements record it; older ones, by their file's Triton."""
    if "statistics_windows" in stored:
        return bool(stored["statistics_windows"])
    found = tuple(int(part) for part in str(versions.get("triton", "0.0")).split(".")[:2])
    return found >= (3, 8)


def _measured(options, results_dir: Path = RESULTS_DIR) -> dict:
    """The data-dependent trips: measured now (--measure, in this process's CPU time), or the
    newest stored measurement of bench/results/gpu-model-*.json made where the statistics count
    windows as they do here (``measured_windows``)."""
    from specdec_ext._triton_backend import key_window_default

    if options.measure:
        print("measuring the data-dependent trips on LM logits (candidate_outcome, every line)")
        # (the time of day too: of two measurements the same day, the later is the newer)
        return measure_trips() | {"measured": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
                                  "statistics_windows": key_window_default()}
    # The newest measurement (by its date) of the files that made theirs (a copy names its source).
    found = []
    for path in results_dir.glob("gpu-model-*.json"):
        data = json.loads(path.read_text())
        stored = data.get("measured_trips")
        if stored and stored.get("from", path.name) == path.name and measured_windows(stored, data.get("versions", {})) == key_window_default():
            found.append(((stored.get("measured", ""), path.name), stored | {"from": path.name}))
    return max(found, key=lambda item: item[0])[1] if found else {}


def _measured_calls(measured: dict) -> list:
    """The B=64 filtered goal calls again, with the search fraction and passes measured on the
    tiny architectures' bf16 logits at V=128256 (the only LM logits of that vocabulary here)."""
    found = []
    rows = [r for r in measured.get("results", []) if r["source"].startswith("tiny_llama") and r["geometry"].startswith("B=64")]
    for row in [r for r in measured.get("results", []) if r["source"].startswith("tiny_llama") and r["geometry"].startswith("vLLM")]:
        call = Call(f"vLLM B=64 K=8 fp32 T={row['temperature']} top-k {row['top_k']} top-p {row['top_p']}, as measured on tiny_llama logits upcast "
                    f"(searched {row['search_fraction']})", **dict(_B64, dtype="fp32"), temperature=row["temperature"], top_k=row["top_k"],
                    top_p=row["top_p"], search_fraction=row["search_fraction"], search_passes=row["search_passes_mean"],
                    sampled_share=row["sampled_share"], top_p_sampled_share=row["top_p_sampled_share"], **{name: row.get(name, 0.0) for name in SEARCH_FIELDS})
        found.append((call, {}, "vLLM B=64 K=8 V=128256 fp32"))
    for row in rows:
        if row["top_k"] == 1000 or row["top_p"] == 0.99:
            continue
        goal = Call("", **_B64, top_k=row["top_k"], top_p=row["top_p"])
        if "without_top_p_window" in row and not top_p_window_on(goal):
            row = row | row["without_top_p_window"] | {"top_p_window_share": 0.0, "top_p_window_steps": 0.0, "top_p_settled_share": 0.0,
                                                       "top_k_window_share": 0.0}
        if "with_sample" in row and sampling(goal)["sample_runs"]:  # (Triton 3.6, 3.7: sampled starts, no windows)
            row = row | row["with_sample"]
        call = Call(f"B=64 K=8 bf16 T={row['temperature']} top-k {row['top_k']} top-p {row['top_p']}, as measured on tiny_llama logits "
                    f"(searched {row['search_fraction']})", **_B64, temperature=row["temperature"], top_k=row["top_k"], top_p=row["top_p"],
                    search_fraction=row["search_fraction"], search_passes=row["search_passes_mean"],
                    top_p_window_share=row.get("top_p_window_share", 0.0), top_p_window_steps=row.get("top_p_window_steps", 0.0),
                    top_p_settled_share=row.get("top_p_settled_share", 0.0), top_k_window_share=row.get("top_k_window_share", 0.0),
                    sampled_share=row.get("sampled_share", 0.0), top_p_sampled_share=row.get("top_p_sampled_share", 0.0),
                    **{name: row.get(name, 0.0) for name in SEARCH_FIELDS})
        found.append((call, {"x_unfiltered": 2.0}, "B=64 K=8 V=128256 bf16"))
    # Block calls whose walks sum the share of their items measured on the embedded pair's drafts.
    for row in measured.get("block_walks", {}).get("results", []):
        if not row["draft"].startswith("distilled"):
            continue
        filters = {"temperature": row["temperature"], "top_k": row["top_k"], "top_p": row["top_p"]}
        label = "" if row["top_k"] == 0 and row["top_p"] == 1.0 else f" T={row['temperature']} top-k {row['top_k']} top-p {row['top_p']}"
        call = Call(f"block B=64 K=8 bf16{label}, walks as measured on the embedded pair (items summed {row['summed_share']})", **_B64, method="block",
                    block_summed=row["summed_share"], **filters)
        found.append((call, {}, None))
    return found


def tree_walk_passes(call: Call) -> dict:
    """The residual-mass passes over a line that each row's walk makes on ``call``'s inputs
    (bench.call_inputs: the ones bench.gpu_rows measures), COUNTED from the C++ kernel's outputs
    (every backend draws the same tokens): at each context a row enters, one per child rejected
    before the one entered; at its last context, one per child but the last (the rejection that
    ends a walk leaves its residual to the race: tree.py), where a walk that summed every
    rejection's residual made one per child ("every_*")."""
    import specdec_ext

    from .call_inputs import inputs

    made = inputs(call, "cpu")
    a = made["args"]
    out = specdec_ext.verify_tree(a["target"], a["draft"], a["tokens"], a["parents"], **(made["kwargs"] | {"backend": "cpp"}))
    now, every = [], []
    for row in range(call.batch):
        parents = a["parents"][row].tolist()
        context, rejected = -1, 0
        for node in out.accepted_nodes[row, : int(out.num_accepted[row])].tolist():
            rejected += [i for i, parent in enumerate(parents) if parent == context].index(node)
            context = node
        last = parents.count(context)
        now.append(rejected + max(last - 1, 0))
        every.append(rejected + last)
    return {"most": max(now), "mean": round(sum(now) / len(now), 3), "every_most": max(every), "every_mean": round(sum(every) / len(every), 3)}


def _counted_tree_calls() -> list:
    """The B=64 tree call again, its walk's passes counted on the inputs the suite measures it on
    (tree_walk_passes), and as many as a walk summing every rejection's residual made."""
    base = next(call for call in sweep_calls() if call.name == "tree B=64 N=8 D=4 V=128256 bf16 without replacement")
    counted = tree_walk_passes(base)
    return [(replace(base, name=f"{base.name}, walks as on the suite's inputs (passes: {counted['mean']} a row, the most {counted['most']})",
                     tree_passes=counted["most"]), {}, None),
            (replace(base, name=f"{base.name}, the same walks summing every rejection's residual (passes: {counted['every_mean']} a row, "
                               f"the most {counted['every_most']})", tree_passes=counted["every_most"]), {}, None)]


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
    parser.add_argument("--measure", action="store_true", help="measure the data-dependent trips on LM logits first (minutes; stored in the JSON)")
    parser.add_argument("--only", nargs="*", default=None, help="only the calls whose names contain one of these words (and their baselines)")
    options = parser.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU, never interpret
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    started = time.time()

    print("H200 performance model (ESTIMATE: compiled sm_90 SASS and stated assumptions, no GPU measurement)")
    for name, value in ASSUMPTIONS.items():
        print(f"  assume {name} = {value}")
    measured = _measured(options)
    results = []
    by_name: dict = {}
    calls = [(c, g, base) for c, g, base in GOAL_CALLS] + _measured_calls(measured) + ([] if options.no_sweep else [(c, {}, None) for c in sweep_calls()])
    if not options.no_sweep and (not options.only or any("tree" in word for word in options.only)):
        calls += _counted_tree_calls()
    if options.only:
        calls = [entry for entry in calls if any(word in entry[0].name for word in options.only) or entry[0].name in {e[2] for e in calls}]
    for call, goals, base in calls:
        result = estimate_call(call, goals, by_name.get(base))
        by_name[call.name] = result
        results.append(result)
        print(f"\n{call.name}: {result.num_launches} launches, kernels {result.kernels_us} µs, replayed {result.replayed_us} µs, "
              f"launched {result.launched_us} µs, floor {result.floor_us} µs ({result.x_floor_replayed}x)")
        for e in result.launches:
            print(f"  {e['name']:<14} grid {e['grid']} ({e['programs']} programs x {e['warps_per_program']} warps, {e['registers']} regs, "
                  f"{e['spill_bytes']} B spilled, {e['ctas_per_sm']} CTAs/SM, {e['waves']} waves): {e['hot_loop'] or '-'} "
                  f"{e['hot_loop_instructions']} instr / {e['values_per_iteration']} values = {e['instructions_per_value']} per value; "
                  f"issue {e['issue_us']} pipe {e['pipe_us']} memory {e['memory_us']} latency {e['latency_us']} -> {e['time_us']} µs ({e['bound']})")
            print("      loops: " + "; ".join(f"{kind} {n} instr x {trips}" for kind, n, trips in e["loops"]))
        for goal, verdict in result.goals.items():
            print(f"  goal {goal} <= {verdict['limit']}: {'met' if verdict['met'] else 'MISSED'} (estimate {verdict['estimate']})")
    table = markdown_table(results)
    print("\n" + table)
    report = {
        "kind": "ESTIMATE (performance model from compiled sm_90 SASS; not a measurement)",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "versions": _versions(),
        "assumptions": ASSUMPTIONS,
        "loop_kinds": LOOP_KINDS,
        "measured_trips": measured,
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
