"""The whole-line top-k / top-p search, split across programs: a radix select over order keys.

``threshold_line`` (thresholds.py) settles a line's cut from its candidates when it can. When it
cannot (a large top-k, a flat distribution under top-p) it leaves the line a search state instead:
a stage (1: top-k, 2: top-p), an interval [lo, hi] of order keys holding the cut, the line max, and
the mass of the keys >= lo (top-k) or the top-p budget. Each search pass narrows the interval
BINS-fold; the work items of a pass are the line's chunks (``search_item``), taken by any program
of ``cutoff_kernel`` (cutoffs.py) once the line's previous pass has finished:

1. every item bins its chunk's values with key >= lo into BINS bins of 2**shift keys (and one bin
   for the keys above hi): counts and fixed-point masses exp(s - line max), added by integer
   atomics into its own workspace slice [line, chunk, bin];
2. the last item of the line's pass to arrive (an atomic counter, reset afterwards) sums the
   chunks' histograms (integers: deterministic, whatever the order; no float atomics), finds the
   bin holding the cut and makes it the new interval, then publishes the pass (``progress``). A
   finished top-k search hands the line to top-p (budget = top_p times the mass of the top-k set)
   or writes the cut, with the line's statistics over the kept values: its max and the kept mass,
   which the last histograms hold exactly (the mass of the keys >= the cut, in fixed point), so
   no launch reads the line again for them.

With 256 bins four passes resolve all 32 bits of a key (one search), so eight passes end any
line, top-k then top-p included; items of a line whose search has ended exit at once.
The cut is the key the search over the candidates defines, so the tokens are the eager reference's.
"""

import triton
import triton.language as tl

from .random import exp, key_to_float, order_key
from .stats import line_of

# Masses are summed in fixed point: exp(s - line max) <= 1 times 2**40, as int64 (exact for every
# weight above 2**-17; a line of 2**23 values cannot overflow). Integer sums do not depend on the
# order of the additions: the histograms' atomics and the sums over chunks are deterministic. As
# the kept set's normaliser (>= 1: the max's own weight), the truncation of each weight to 2**-40
# costs at most V * 2**-40 relative (1.2e-7 at V = 131072): a float32 sum's own rounding.
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
def _select_pass(
    base, line, chunk, width, parts, inv_t, top_k, top_p, use_p, stage, tau_ptr, part_m_ptr, part_z_ptr, state_ptr, state_f_ptr, part_count_ptr,
    part_mass_ptr, counter_ptr, progress_ptr, ended_ptr, search_pass, NUM_CHUNKS: tl.constexpr, CHUNK: tl.constexpr, TILE: tl.constexpr,
    BINS: tl.constexpr, PASSES: tl.constexpr, PARTS: tl.constexpr, PP: tl.constexpr,
):
    """Both searches look for the largest key x in [lo, hi] with F(x) >= target, lo qualifying:
    top-k with F = count(key >= x) and target k; top-p with F = mass(key >= x) and target the
    budget (the smallest cut whose strictly-greater mass is below the budget is that x)."""
    line64 = line.to(tl.int64)
    # The state was written in this launch by another program: read from L2 (".cg"), past L1.
    lo = tl.load(state_ptr + line64 * 4 + 1, cache_modifier=".cg").to(tl.int64)
    hi = tl.load(state_ptr + line64 * 4 + 2, cache_modifier=".cg").to(tl.int64)
    row_max = tl.load(state_f_ptr + line64 * 2, cache_modifier=".cg")
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
        carried = tl.load(state_f_ptr + line64 * 2 + 1, cache_modifier=".cg")  # top-k: mass of key >= lo; top-p: the budget
        top_k_stage = stage == 1
        bins_used = ((hi - lo) >> shift) + 1
        ok = tl.where(top_k_stage, count_from >= top_k, mass_from_f >= carried.to(tl.float64)) & (slots < bins_used)
        best = tl.max(tl.where(ok, slots, 0), axis=0)  # bin 0 (lo) qualifies by assumption
        found_mass = tl.max(tl.where(ok & (slots == best), mass_from_f, -1.0), axis=0)
        new_lo = lo + (best.to(tl.int64) << shift)
        hi = tl.minimum(hi, new_lo + (tl.full((), 1, tl.int64) << shift) - 1)
        lo = new_lo
        k_key = tl.load(state_ptr + line64 * 4 + 3, cache_modifier=".cg").to(tl.int64)
        done = lo >= hi
        # The mass of the keys >= lo (whether or not the bin qualified): the kept set's once the
        # search has ended.
        kept_mass = tl.max(tl.where(slots == best, mass_from_f, 0.0), axis=0).to(tl.float32)
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
        tl.store(state_ptr + line64 * 4, stage)
        tl.store(state_ptr + line64 * 4 + 1, lo.to(tl.int32))
        tl.store(state_ptr + line64 * 4 + 2, hi.to(tl.int32))
        tl.store(state_ptr + line64 * 4 + 3, k_key.to(tl.int32))
        tl.store(state_f_ptr + line64 * 2 + 1, carried)
        if stage == 0:
            # Keys at or below -inf's keep every value: the cut is -inf.
            tl.store(tau_ptr + line, tl.where(lo <= -2139095041, float("-inf"), key_to_float(lo.to(tl.int32))))
            # The statistics over the kept values, in the first partial slot (as the candidates
            # leave a line they settle).
            part = tl.arange(0, PP)
            tl.store(part_m_ptr + line64 * PARTS + part, tl.where(part == 0, row_max, float("-inf")), mask=part < parts)
            tl.store(part_z_ptr + line64 * PARTS + part, tl.where(part == 0, kept_mass, 0.0), mask=part < parts)
        tl.store(counter_ptr + line, 0)  # ready for the next pass, launch and graph replay
        tl.debug_barrier()  # every store above precedes the release
        # The line's next pass may start; a finished line lets every later item of it through.
        tl.atomic_xchg(progress_ptr + line, tl.where(stage == 0, PASSES, search_pass + 1), sem="release", scope="gpu")
        if stage == 0:
            tl.atomic_add(ended_ptr, 1, sem="release", scope="gpu")  # what a walk item waits for (cutoffs.py)


@triton.jit
def search_item(
    target_ptr, draft_ptr, tau_ptr, part_m_ptr, part_z_ptr, temperature_ptr, top_k_ptr, top_p_ptr, state_ptr, state_f_ptr, part_count_ptr,
    part_mass_ptr, counter_ptr, progress_ptr, ended_ptr, line, chunk, search_pass, batch, K, V, Vd, t_stride_b, t_stride_k, d_stride_b, d_stride_k,
    t_parts, d_parts, NUM_CHUNKS: tl.constexpr, HAS_DRAFT: tl.constexpr, CHUNK: tl.constexpr, TILE: tl.constexpr, BINS: tl.constexpr,
    PASSES: tl.constexpr, PARTS: tl.constexpr, PP: tl.constexpr,
):
    """Pass ``search_pass`` over one chunk of one listed line, once the line's previous pass is
    published (every earlier pass's items hold earlier tickets: the wait always ends)."""
    if search_pass > 0:
        finished = tl.atomic_add(progress_ptr + line, 0, sem="acquire", scope="gpu")
        while finished < search_pass:
            finished = tl.atomic_add(progress_ptr + line, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()  # every thread reads the state after the acquire
    stage = tl.load(state_ptr + line.to(tl.int64) * 4, cache_modifier=".cg")  # 0 once the line's search has ended
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
                    _select_pass(d_base, line, chunk, Vd, d_parts, inv_t, top_k, top_p, use_p, stage, tau_ptr, part_m_ptr, part_z_ptr, state_ptr,
                                 state_f_ptr, part_count_ptr, part_mass_ptr, counter_ptr, progress_ptr, ended_ptr, search_pass, NUM_CHUNKS, CHUNK, TILE,
                                 BINS, PASSES, PARTS, PP)
        else:
            if chunk * CHUNK < V:
                t_base = target_ptr + row.to(tl.int64) * t_stride_b + pos.to(tl.int64) * t_stride_k
                _select_pass(t_base, line, chunk, V, t_parts, inv_t, top_k, top_p, use_p, stage, tau_ptr, part_m_ptr, part_z_ptr, state_ptr,
                             state_f_ptr, part_count_ptr, part_mass_ptr, counter_ptr, progress_ptr, ended_ptr, search_pass, NUM_CHUNKS, CHUNK, TILE, BINS,
                             PASSES, PARTS, PP)
