"""The whole-line top-k / top-p search, split across programs: a radix select over order keys.

``threshold_kernel`` settles a line's cut from its candidates when it can. When it cannot (a large
top-k, a flat distribution under top-p) it leaves the line a search state instead: a stage (1:
top-k, 2: top-p), an interval [lo, hi] of order keys holding the cut, the line max, and the mass
of the keys >= lo (top-k) or the top-p budget. Each ``select_kernel`` launch, grid (lines,
the searching lines' chunks, taken in turn by a fixed number of programs), narrows every such
interval BINS-fold:

1. every program of a searching line bins its chunk's values with key >= lo into BINS bins of
   2**shift keys (and one bin for the keys above hi): counts and fixed-point masses
   exp(s - line max), added by integer atomics into its own workspace slice [line, chunk, bin];
2. the last program of the line to arrive (an atomic counter, reset afterwards) sums the chunks'
   histograms (integers: deterministic, whatever the order; no float atomics), finds the bin
   holding the cut and makes it the new interval. A finished top-k search hands the line to
   top-p (budget = top_p times the mass of the top-k set) or writes the cut.

Lines that settled among the candidates are not in the list: a call whose lines all settled
costs each launch one load per program. With 256 bins four launches resolve all 32
bits of a key: one search. A line needing both searches on the whole line finishes its top-p search
in the last launch's arriving program, by the same radix select over the whole line in that one
program (the one input shape left slower).
The cut is the key the search over the candidates defines, so the tokens are the eager reference's.
"""

import triton
import triton.language as tl

from .random import exp
from .stats import line_of
from .thresholds import key_to_float, order_key

# Masses are summed in fixed point: exp(s - line max) <= 1 times 2**40, as int64 (exact for every
# weight above 2**-17; a line of 2**23 values cannot overflow). Integer sums do not depend on the
# order of the additions: the histograms' atomics and the sums over chunks are deterministic.
# 2**40 and its inverse are written as literals (see thresholds.py on module constants).


@triton.jit
def _fixed_mass(s, row_max):
    """exp(s - row_max) in units of 2**-40, 0 for -inf and NaN."""
    return tl.where(s > float("-inf"), exp(s - row_max) * 1099511627776.0, 0.0).to(tl.int64)


@triton.jit
def _histogram(base, chunk, width, inv_t, row_max, lo, hi, shift, count_ptr, mass_ptr, CHUNK: tl.constexpr, TILE: tl.constexpr, BINS: tl.constexpr):
    """Bin the chunk's finite values with key >= lo: bin (key - lo) >> shift for keys up to hi,
    bin BINS for the keys above hi; counts and fixed-point masses, added by atomics into the
    program's own (zeroed) slice."""
    offsets = tl.arange(0, TILE)
    for start in range(0, CHUNK, TILE):
        idx = chunk * CHUNK + start + offsets
        s = tl.load(base + idx, mask=idx < width, other=float("-inf")).to(tl.float32) * inv_t
        key = order_key(s).to(tl.int64)
        inside = (s > float("-inf")) & (key >= lo)
        bins = tl.where(key > hi, BINS, (key - lo) >> shift)
        tl.atomic_add(count_ptr + bins, 1, mask=inside, sem="relaxed")
        tl.atomic_add(mass_ptr + bins, _fixed_mass(s, row_max), mask=inside, sem="relaxed")


@triton.jit
def _shift(lo, hi):
    """BINS = 256 bins of 2**shift keys cover [lo, hi]: shift = max(bit length of hi - lo, 8) - 8."""
    bits = tl.arange(0, 32).to(tl.int64)
    return tl.sum((((hi - lo) >> (bits + 8)) > 0).to(tl.int64), axis=0)


@triton.jit
def _finish_top_p(base, width, inv_t, row_max, budget, lo, hi, mass_ptr, BLOCK: tl.constexpr, BINS: tl.constexpr):
    """The largest key x in [lo, hi] whose mass at or above reaches budget (lo's does), by the same
    radix select in one program over the whole line (a pass per 8 bits), in the program's own
    histogram slice."""
    offsets = tl.arange(0, BLOCK)
    slots = tl.arange(0, 2 * BINS)
    used = slots <= BINS
    while lo < hi:
        shift = _shift(lo, hi)
        tl.debug_barrier()  # the previous step's reads precede the zeros
        tl.store(mass_ptr + slots, tl.zeros((2 * BINS,), tl.int64), mask=used)
        tl.debug_barrier()  # the zeros precede every thread's atomics
        for start in range(0, width, BLOCK):
            idx = start + offsets
            s = tl.load(base + idx, mask=idx < width, other=float("-inf")).to(tl.float32) * inv_t
            key = order_key(s).to(tl.int64)
            bins = tl.where(key > hi, BINS, (key - lo) >> shift)
            tl.atomic_add(mass_ptr + bins, _fixed_mass(s, row_max), mask=(s > float("-inf")) & (key >= lo), sem="relaxed")
        tl.debug_barrier()  # every thread's atomics precede the reads
        masses = tl.load(mass_ptr + slots, mask=used, other=0, cache_modifier=".cg")
        mass_from = (tl.sum(masses, axis=0) - tl.cumsum(masses, axis=0) + masses).to(tl.float64) * 9.094947017729282e-13
        ok = (mass_from >= budget) & (slots < ((hi - lo) >> shift) + 1)
        lo = lo + (tl.max(tl.where(ok, slots, 0), axis=0).to(tl.int64) << shift)
        hi = tl.minimum(hi, lo + (tl.full((), 1, tl.int64) << shift) - 1)
    return lo


@triton.jit
def _select_pass(
    base, line, chunk, width, inv_t, top_k, top_p, use_p, stage, tau_ptr, state_ptr, state_f_ptr, part_count_ptr, part_mass_ptr, counter_ptr,
    NUM_CHUNKS: tl.constexpr, CHUNK: tl.constexpr, TILE: tl.constexpr, BINS: tl.constexpr, LAST_PASS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Both searches look for the largest key x in [lo, hi] with F(x) >= target, lo qualifying:
    top-k with F = count(key >= x) and target k; top-p with F = mass(key >= x) and target the
    budget (the smallest cut whose strictly-greater mass is below the budget is that x)."""
    line64 = line.to(tl.int64)
    lo = tl.load(state_ptr + line64 * 4 + 1).to(tl.int64)
    hi = tl.load(state_ptr + line64 * 4 + 2).to(tl.int64)
    row_max = tl.load(state_f_ptr + line64 * 2)
    shift = _shift(lo, hi)
    slots = tl.arange(0, 2 * BINS)
    used = slots <= BINS  # BINS bins and one for the keys above hi
    own = (line64 * NUM_CHUNKS + chunk) * (BINS + 1)
    tl.store(part_count_ptr + own + slots, tl.zeros((2 * BINS,), tl.int32), mask=used)
    tl.store(part_mass_ptr + own + slots, tl.zeros((2 * BINS,), tl.int64), mask=used)
    tl.debug_barrier()  # the zeros precede every thread's atomics
    _histogram(base, chunk, width, inv_t, row_max, lo, hi, shift, part_count_ptr + own, part_mass_ptr + own, CHUNK, TILE, BINS)
    tl.debug_barrier()  # every thread's atomics precede the release below
    ticket = tl.atomic_add(counter_ptr + line, 1, sem="acq_rel", scope="gpu")
    arrivals = tl.cdiv(width, CHUNK)
    if ticket == arrivals - 1:
        # The last program of the line: the chunks' histograms (integer sums: any order is exact).
        # Four chunks per step keep the registers low (the counts and masses of 2 * BINS slots).
        counts = tl.zeros((2 * BINS,), tl.int32)
        masses = tl.zeros((2 * BINS,), tl.int64)
        for first in range(0, arrivals, 4):
            chunks = first + tl.arange(0, 4)
            every = (line64 * NUM_CHUNKS + chunks[:, None]) * (BINS + 1) + slots[None, :]
            present = (chunks[:, None] < arrivals) & used[None, :]
            counts += tl.sum(tl.load(part_count_ptr + every, mask=present, other=0, cache_modifier=".cg"), axis=0)
            masses += tl.sum(tl.load(part_mass_ptr + every, mask=present, other=0, cache_modifier=".cg"), axis=0)
        # F at each bin's first key: everything in that bin and above (the slot past BINS holds
        # the keys above hi).
        count_from = tl.sum(counts, axis=0) - tl.cumsum(counts, axis=0) + counts
        mass_from = tl.sum(masses, axis=0) - tl.cumsum(masses, axis=0) + masses
        mass_from_f = mass_from.to(tl.float64) * 9.094947017729282e-13  # 2**-40
        carried = tl.load(state_f_ptr + line64 * 2 + 1)  # top-k: mass of key >= lo; top-p: the budget
        top_k_stage = stage == 1
        bins_used = ((hi - lo) >> shift) + 1
        ok = tl.where(top_k_stage, count_from >= top_k, mass_from_f >= carried.to(tl.float64)) & (slots < bins_used)
        best = tl.max(tl.where(ok, slots, 0), axis=0)  # bin 0 (lo) qualifies by assumption
        found_mass = tl.max(tl.where(ok & (slots == best), mass_from_f, -1.0), axis=0)
        new_lo = lo + (best.to(tl.int64) << shift)
        hi = tl.minimum(hi, new_lo + (tl.full((), 1, tl.int64) << shift) - 1)
        lo = new_lo
        k_key = tl.load(state_ptr + line64 * 4 + 3).to(tl.int64)
        done = lo >= hi
        if top_k_stage:
            carried = tl.where(found_mass >= 0.0, found_mass.to(tl.float32), carried)  # the mass of key >= lo
            k_key = tl.where(done, lo, k_key)
            # Top-p inside the top-k set: its budget is top_p times the set's mass (key >= k_key),
            # searched over [k_key, line max].
            to_p = done & use_p
            carried = tl.where(to_p, top_p * carried, carried)
            hi = tl.where(to_p, order_key(row_max).to(tl.int64), hi)
            stage = tl.where(done, tl.where(to_p & (lo < hi), 2, 0), 1)
        else:
            stage = tl.where(done, 0, 2)
        if LAST_PASS:
            if stage == 2:
                lo = _finish_top_p(base, width, inv_t, row_max, carried.to(tl.float64), lo, hi, part_mass_ptr + own, BLOCK, BINS)
                stage = stage * 0
        tl.store(state_ptr + line64 * 4, stage)
        tl.store(state_ptr + line64 * 4 + 1, lo.to(tl.int32))
        tl.store(state_ptr + line64 * 4 + 2, hi.to(tl.int32))
        tl.store(state_ptr + line64 * 4 + 3, k_key.to(tl.int32))
        tl.store(state_f_ptr + line64 * 2 + 1, carried)
        if stage == 0:
            # Keys at or below -inf's keep every value: the cut is -inf.
            tl.store(tau_ptr + line, tl.where(lo <= -2139095041, float("-inf"), key_to_float(lo.to(tl.int32))))
        tl.store(counter_ptr + line, 0)  # ready for the next launch (and the next graph replay)


@triton.jit
def _select_item(
    target_ptr, draft_ptr, tau_ptr, temperature_ptr, top_k_ptr, top_p_ptr, state_ptr, state_f_ptr, part_count_ptr, part_mass_ptr, counter_ptr,
    line, chunk, stage, batch, K, V, Vd, t_stride_b, t_stride_k, d_stride_b, d_stride_k,
    NUM_CHUNKS: tl.constexpr, HAS_DRAFT: tl.constexpr, CHUNK: tl.constexpr, TILE: tl.constexpr, BINS: tl.constexpr,
    LAST_PASS: tl.constexpr, BLOCK: tl.constexpr,
):
    """One chunk of one listed line."""
    if stage != 0:
        row, pos, is_draft = line_of(line, batch * (K + 1), K)
        temperature = tl.load(temperature_ptr + row)
        inv_t = tl.math.div_rn(1.0, tl.where(temperature > 0, temperature, 1.0))
        top_k = tl.load(top_k_ptr + row)
        top_p = tl.load(top_p_ptr + row)
        use_p = top_p < 1.0
        if is_draft:
            if HAS_DRAFT:
                if chunk * CHUNK < Vd:
                    d_base = draft_ptr + row.to(tl.int64) * d_stride_b + pos.to(tl.int64) * d_stride_k
                    _select_pass(d_base, line, chunk, Vd, inv_t, top_k, top_p, use_p, stage, tau_ptr, state_ptr, state_f_ptr, part_count_ptr, part_mass_ptr,
                                 counter_ptr, NUM_CHUNKS, CHUNK, TILE, BINS, LAST_PASS, BLOCK)
        else:
            if chunk * CHUNK < V:
                t_base = target_ptr + row.to(tl.int64) * t_stride_b + pos.to(tl.int64) * t_stride_k
                _select_pass(t_base, line, chunk, V, inv_t, top_k, top_p, use_p, stage, tau_ptr, state_ptr, state_f_ptr, part_count_ptr, part_mass_ptr,
                             counter_ptr, NUM_CHUNKS, CHUNK, TILE, BINS, LAST_PASS, BLOCK)


@triton.jit(do_not_specialize=["batch"])
def select_kernel(
    target_ptr,  # (B, K+1, V) raw target logits, last dim contiguous
    draft_ptr,  # (B, K, Vd) raw draft logits (unused without HAS_DRAFT)
    tau_ptr,  # (lines,) float32 out: the cut of a line whose search ends in this launch
    temperature_ptr,  # (B,) float32, 0 = greedy
    top_k_ptr,  # (B,) int64, 0 = off
    top_p_ptr,  # (B,) float32, 1 = off
    state_ptr,  # (lines, 4) int32 in/out: stage (0 done, 1 top-k, 2 top-p), lo, hi, top-k key
    state_f_ptr,  # (lines, 2) float32 in/out: line max, then mass of key >= lo (top-k) or the budget (top-p)
    part_count_ptr,  # (lines, NUM_CHUNKS, BINS + 1) int32 workspace: per-chunk histograms of counts
    part_mass_ptr,  # (lines, NUM_CHUNKS, BINS + 1) int64 workspace: per-chunk histograms of fixed-point masses
    counter_ptr,  # (lines,) int32 workspace, 0 between launches: the line's arrived programs
    searching_ptr,  # (1,) int32: how many lines threshold_kernel listed
    search_list_ptr,  # (lines,) int32: the listed lines
    batch,
    K,
    V,
    Vd,
    t_stride_b,
    t_stride_k,
    d_stride_b,
    d_stride_k,
    NUM_CHUNKS: tl.constexpr,  # cdiv(V, CHUNK)
    HAS_DRAFT: tl.constexpr,
    CHUNK: tl.constexpr,  # values per program
     # next power of two of NUM_CHUNKS
    TILE: tl.constexpr,  # values per loop step
    BINS: tl.constexpr,  # histogram bins per launch: the interval narrows BINS-fold
    LAST_PASS: tl.constexpr,  # finish any search still open
    BLOCK: tl.constexpr,  # tile of that finishing bisection
):
    # Work items (listed line, chunk), taken in turn by the programs (grid (programs,)).
    items = tl.load(searching_ptr) * NUM_CHUNKS
    for item in range(tl.program_id(0), items, tl.num_programs(0)):
        line = tl.load(search_list_ptr + item // NUM_CHUNKS)
        chunk = item % NUM_CHUNKS
        stage = tl.load(state_ptr + line.to(tl.int64) * 4)  # 0 once the line's search ended in an earlier launch
        _select_item(target_ptr, draft_ptr, tau_ptr, temperature_ptr, top_k_ptr, top_p_ptr, state_ptr, state_f_ptr, part_count_ptr, part_mass_ptr,
                     counter_ptr, line, chunk, stage, batch, K, V, Vd, t_stride_b, t_stride_k, d_stride_b, d_stride_k,
                     NUM_CHUNKS, HAS_DRAFT, CHUNK, TILE, BINS, LAST_PASS, BLOCK)
