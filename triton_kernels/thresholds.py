"""Top-k / top-p cut-offs of each logits line, without a sort, in two steps.

The kept set of top-k then top-p is always ``{s >= tau}`` for one value ``tau`` present in the line.
``tau`` is searched over the 32-bit order keys of float32 (an int32 whose order is the float
order): top-k's is the k-th largest value (ties counted), top-p's the smallest value whose
strictly-greater mass inside the top-k set is below ``top_p`` times that set's mass.

1. ``candidates_kernel``, grid (lines, vocabulary chunks): each program holds one chunk in
   registers; every thread keeps its four largest distinct values with multiplicities (selection
   rounds inside the thread), the chunk floor ``t_c`` is the largest fourth value, and the
   (value, multiplicity) pairs above it go to CAND slots; also the chunk's max and sum-exp.
2. ``threshold_line`` (the first work items of ``cutoff_kernel``, cutoffs.py), per line: with ``T = max_c t_c``, the candidates hold *every* value
   of the line with key > T (with its multiplicity), so any count or mass above a key > T is exact
   over the candidates alone. When the cut provably lies above T (top-k: at least k values above
   T; top-p alone: their mass reaches the budget) the bisection runs over the candidates, and the
   line's normaliser is summed over them too: the statistics launch then skips the line (no
   second read). Otherwise (a large k, a flat distribution under top-p) the kernel leaves the
   line a search state, and the whole-line search (select.py) runs over it, split across programs,
   in the same launch; the statistics launch then reads the line with the cut. Either
   way the result is the same exact key.
"""

import triton
import triton.language as tl

from .random import exp
from .stats import line_of

# -2**31, the smallest order key, and the candidate slots per chunk are written as literals or
# constexpr arguments: a module-level constant is a plain int to the interpreter but must be a
# tl.constexpr object to the compiler, and no one spelling suits both.


@triton.jit
def order_key(s):
    """int32 key with the order of float32 ``s`` (-0.0 folded onto +0.0)."""
    bits = (s + 0.0).to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def key_to_float(key):
    bits = tl.where(key >= 0, key, key ^ 0x7FFFFFFF).to(tl.int32)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _filter_line(line, lines_t, K, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, V, Vd):
    """(row, position, is_draft, width, inv_t, top_k, top_p, use_k, use_p, active) of one line:
    active when the line is used, its row samples and a filter cuts it."""
    row, pos, is_draft = line_of(line, lines_t, K)
    temperature = tl.load(temperature_ptr + row)
    inv_t = tl.math.div_rn(1.0, tl.where(temperature > 0, temperature, 1.0))
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    width = tl.where(is_draft, Vd, V)
    use_k = (top_k > 0) & (top_k < width)
    use_p = top_p < 1.0
    num_draft = tl.minimum(tl.maximum(tl.load(num_draft_ptr + row), 0), K)
    used = tl.where(is_draft, pos < num_draft, pos <= num_draft)
    active = (temperature > 0) & used & (use_k | use_p)
    return row, pos, is_draft, width, inv_t, top_k, top_p, use_k, use_p, active


@triton.jit
def _round(rest, NEG: tl.constexpr):
    """One selection round per thread: the largest remaining distinct value, its multiplicity, and
    the values left once it is removed (reductions over axes 0 and 2 stay inside the thread)."""
    top = tl.max(tl.max(rest, axis=2), axis=0)
    hit = rest == top[None, :, None]
    count = tl.sum(tl.sum(hit.to(tl.int32), axis=2), axis=0)
    count = tl.where(top > NEG, count, 0)
    return top, count, tl.where(hit, NEG, rest)


@triton.jit
def _chunk_candidates(
    base, chunk, width, inv_t, out, cand_ptr, cand_mult_ptr, cand_count_ptr, cand_floor_ptr, chunk_max_ptr, chunk_sum_ptr,
    CHUNK: tl.constexpr, CAND: tl.constexpr, THREADS: tl.constexpr, VEC: tl.constexpr,
):
    """One chunk's candidates. Each thread holds CHUNK / THREADS values (16-byte vectors) and keeps
    its four largest distinct values with their multiplicities (selection rounds inside the thread,
    no block reduction); a thread's fourth value bounds everything it dropped (a thread that
    dropped nothing bounds nothing). The chunk floor t_c is the largest such bound: every value of
    the chunk above t_c is among the kept ones, and the (value, multiplicity) pairs above t_c go
    to at most CAND slots (when more would, the floor rises to the smallest key leaving CAND)."""
    ROWS: tl.constexpr = CHUNK // (THREADS * VEC)
    rows = tl.arange(0, ROWS)
    threads = tl.arange(0, THREADS)
    vec = tl.arange(0, VEC)
    idx = chunk * CHUNK + rows[:, None, None] * (THREADS * VEC) + threads[None, :, None] * VEC + vec[None, None, :]
    s = tl.load(base + idx, mask=idx < width, other=float("-inf")).to(tl.float32) * inv_t
    # The chunk's max and sum-exp (the line's mass for top-p); NaN or +inf make the sum NaN.
    chunk_max = tl.max(tl.max(tl.max(s, axis=2), axis=0), axis=0)
    ref = tl.where(chunk_max == float("-inf"), 0.0, chunk_max)
    chunk_sum = tl.sum(tl.sum(tl.sum(exp(s - ref), axis=2), axis=0), axis=0)
    a1, c1, rest = _round(s, float("-inf"))
    a2, c2, rest = _round(rest, float("-inf"))
    a3, c3, rest = _round(rest, float("-inf"))
    a4, c4, rest = _round(rest, float("-inf"))
    # A thread whose four pairs hold all its values bounds nothing (short lines keep every value).
    left = tl.max(tl.max(rest, axis=2), axis=0) > float("-inf")
    floor = tl.max(tl.where(left, a4, float("-inf")), axis=0)
    kept = (a1 > floor).to(tl.int32) + (a2 > floor).to(tl.int32) + (a3 > floor).to(tl.int32) + (a4 > floor).to(tl.int32)
    total = tl.sum(kept, axis=0)
    if total > CAND:
        # Too many pairs: raise the floor to the smallest key that leaves at most CAND pairs above
        # it (a bisection over the kept pairs' keys; a value above it is still always kept).
        k1, k2, k3, k4 = order_key(a1), order_key(a2), order_key(a3), order_key(a4)
        lo = order_key(floor).to(tl.int64)  # too many pairs above lo
        hi = tl.max(k1, axis=0).to(tl.int64)  # none above hi
        steps = tl.arange(1, 9).to(tl.int64)  # eight keys per step (one block reduction)
        while hi - lo > 1:
            probes = tl.maximum(lo + ((hi - lo) * steps) // 9, lo + 1)  # in (lo, hi)
            t = probes.to(tl.int32)[:, None]
            above = tl.sum((k1[None, :] > t).to(tl.int32) + (k2[None, :] > t).to(tl.int32) + (k3[None, :] > t).to(tl.int32)
                           + (k4[None, :] > t).to(tl.int32), axis=1)
            fits = above <= CAND  # true for the higher probes
            new_hi = tl.min(tl.where(fits, probes, hi), axis=0)
            lo = tl.max(tl.where(fits, lo, probes), axis=0)
            hi = new_hi
        floor = key_to_float(hi)
        kept = (a1 > floor).to(tl.int32) + (a2 > floor).to(tl.int32) + (a3 > floor).to(tl.int32) + (a4 > floor).to(tl.int32)
        total = tl.sum(kept, axis=0)
    slot = tl.cumsum(kept, axis=0) - kept  # first slot of each thread's pairs (a1 > a2 > a3 > a4)
    first = out * CAND + slot
    tl.store(cand_ptr + first, a1, mask=a1 > floor)
    tl.store(cand_mult_ptr + first, c1, mask=a1 > floor)
    tl.store(cand_ptr + first + 1, a2, mask=a2 > floor)
    tl.store(cand_mult_ptr + first + 1, c2, mask=a2 > floor)
    tl.store(cand_ptr + first + 2, a3, mask=a3 > floor)
    tl.store(cand_mult_ptr + first + 2, c3, mask=a3 > floor)
    tl.store(cand_ptr + first + 3, a4, mask=a4 > floor)
    tl.store(cand_mult_ptr + first + 3, c4, mask=a4 > floor)
    tl.store(cand_count_ptr + out, total)
    tl.store(cand_floor_ptr + out, order_key(floor))
    tl.store(chunk_max_ptr + out, chunk_max)
    tl.store(chunk_sum_ptr + out, chunk_sum)


@triton.jit(do_not_specialize=["batch"])
def candidates_kernel(
    target_ptr,  # (B, K+1, V) raw target logits, last dim contiguous
    draft_ptr,  # (B, K, Vd) raw draft logits (unused without HAS_DRAFT)
    temperature_ptr,  # (B,) float32, 0 = greedy
    top_k_ptr,  # (B,) int64, 0 = off
    top_p_ptr,  # (B,) float32, 1 = off
    num_draft_ptr,  # (B,) int64
    cand_ptr,  # (lines, NUM_CHUNKS, CAND) float32 out: distinct scaled values above the chunk floor, slots [0, count) used
    cand_mult_ptr,  # (lines, NUM_CHUNKS, CAND) int32 out: their multiplicities
    cand_count_ptr,  # (lines, NUM_CHUNKS) int32 out: used slots
    cand_floor_ptr,  # (lines, NUM_CHUNKS) int32 out: order key of t_c, the chunk floor
    chunk_max_ptr,  # (lines, NUM_CHUNKS) float32 out: max of the scaled chunk
    chunk_sum_ptr,  # (lines, NUM_CHUNKS) float32 out: sum of exp(s - chunk max)
    searching_ptr,  # (1,) int32 out: 0, the count of lines cutoff_kernel hands to the whole-line search
    batch,
    K,
    V,
    Vd,
    t_stride_b,
    t_stride_k,
    d_stride_b,
    d_stride_k,
    NUM_CHUNKS: tl.constexpr,  # cdiv(V, CHUNK): chunks per line
    HAS_DRAFT: tl.constexpr,
    CHUNK: tl.constexpr,  # values per program, held in registers
    CAND: tl.constexpr,  # candidate slots per chunk
    T_VEC: tl.constexpr,  # values per 16-byte vector of the target (draft) logits
    D_VEC: tl.constexpr,
    THREADS: tl.constexpr,  # 32 * num_warps
):
    line = tl.program_id(0)
    chunk = tl.program_id(1)
    if (line == 0) & (chunk == 0):
        tl.store(searching_ptr, 0)  # cutoff_kernel, launched next, counts from here
    row, pos, is_draft, width, inv_t, top_k, top_p, use_k, use_p, active = _filter_line(
        line, batch * (K + 1), K, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, V, Vd
    )
    out = line.to(tl.int64) * NUM_CHUNKS + chunk
    if active & (chunk * CHUNK < width):
        if is_draft:
            if HAS_DRAFT:
                d_base = draft_ptr + row.to(tl.int64) * d_stride_b + pos.to(tl.int64) * d_stride_k
                _chunk_candidates(d_base, chunk, Vd, inv_t, out, cand_ptr, cand_mult_ptr, cand_count_ptr, cand_floor_ptr, chunk_max_ptr, chunk_sum_ptr,
                                  CHUNK, CAND, THREADS, D_VEC)
        else:
            t_base = target_ptr + row.to(tl.int64) * t_stride_b + pos.to(tl.int64) * t_stride_k
            _chunk_candidates(t_base, chunk, V, inv_t, out, cand_ptr, cand_mult_ptr, cand_count_ptr, cand_floor_ptr, chunk_max_ptr, chunk_sum_ptr,
                              CHUNK, CAND, THREADS, T_VEC)


# The searches over the candidates, held in registers: one block reduction per probe (or per
# PROBES probes). Unused slots hold key -2**31 with multiplicity and weight 0.


@triton.jit
def _count_at_least(cand_key, cand_mult, mid):
    """Number of candidate values with key >= mid (multiplicities)."""
    return tl.sum(tl.where(cand_key >= mid, cand_mult, 0).to(tl.int64), axis=0)


@triton.jit
def _mass_above(cand_key, cand_weight, above_key, floor_key):
    """Sum of exp(s - row_max) over the candidates with key > above_key and key >= floor_key."""
    return tl.sum(tl.where((cand_key > above_key) & (cand_key >= floor_key), cand_weight, 0.0), axis=0)


@triton.jit
def _top_k_key_probes(cand_key, cand_mult, top_k, lo, hi, PROBES: tl.constexpr):
    """The largest key t in [lo, hi] with count(key >= t) >= top_k over the candidates, given that lo
    qualifies: PROBES keys tested per step (one block reduction), so the range shrinks PROBES-fold."""
    steps = tl.arange(1, PROBES + 1).to(tl.int64)
    while lo < hi:
        probes = lo + ((hi - lo) * steps + PROBES - 1) // PROBES  # in (lo, hi], the last one hi
        # 32-bit compares and sums: keys are int32 order keys, a line has fewer than 2**31 values.
        counts = tl.sum(tl.where(cand_key[None, :] >= probes.to(tl.int32)[:, None], cand_mult[None, :], 0), axis=1)
        ok = counts >= top_k  # true for the lower probes
        new_lo = tl.max(tl.where(ok, probes, lo), axis=0)
        hi = tl.min(tl.where(ok, hi, probes - 1), axis=0)
        lo = new_lo
    return lo


@triton.jit
def _top_p_key_probes(cand_key, cand_weight, budget, k_key, lo, hi, PROBES: tl.constexpr):
    """The smallest key t in (lo, hi] whose candidate mass above (inside key >= k_key) is below
    budget, given that lo's is not and hi's is: PROBES keys per step."""
    steps = tl.arange(1, PROBES + 1).to(tl.int64)
    inside = cand_key >= k_key
    while hi - lo > 1:
        probes = lo + ((hi - lo) * steps) // (PROBES + 1)  # in [lo, hi)
        probes = tl.maximum(probes, lo + 1)
        mass = tl.sum(tl.where((cand_key[None, :] > probes.to(tl.int32)[:, None]) & inside[None, :], cand_weight[None, :], 0.0), axis=1)
        ok = mass < budget  # true for the higher probes
        new_hi = tl.min(tl.where(ok, probes, hi), axis=0)
        lo = tl.max(tl.where(ok, lo, probes), axis=0)
        hi = new_hi
    return hi


@triton.jit
def _line_threshold(
    line, Vl, top_k, top_p, use_k, use_p, cand_ptr, cand_mult_ptr, cand_count_ptr, cand_floor_ptr, chunk_max_ptr, chunk_sum_ptr,
    NUM_CHUNKS: tl.constexpr, CHUNK: tl.constexpr, CHUNKS_POW2: tl.constexpr, CAND: tl.constexpr, CANDS_POW2: tl.constexpr, PROBES: tl.constexpr,
):
    """(tau, resolved, m, z, stage, max_key, carried) of one active line (see the module
    docstring). When the cut lies above the candidates' floor (resolved) every kept value is a
    candidate, so z = sum over the kept set of exp(s - m) comes from the candidates as well; z is
    NaN for a line with NaN / +inf values or an empty one (the race blanks such a row). Otherwise
    stage (1: top-k, 2: top-p) and carried (the whole line's mass, or the top-p budget) start the
    whole-line search (select.py)."""
    num_chunks = tl.cdiv(Vl, CHUNK)
    chunks = tl.arange(0, CHUNKS_POW2)
    cmask = chunks < num_chunks
    part = line.to(tl.int64) * NUM_CHUNKS + chunks
    part_max = tl.load(chunk_max_ptr + part, mask=cmask, other=float("-inf"))
    part_sum = tl.load(chunk_sum_ptr + part, mask=cmask, other=0.0)
    row_max = tl.max(part_max, axis=0)
    bad = (tl.max(((part_sum != part_sum) | (part_max == float("inf"))).to(tl.int32), axis=0) != 0) | (row_max == float("-inf"))
    max_key = order_key(row_max).to(tl.int64)
    # T: every value with key > T is among the candidates.
    floor = tl.max(tl.load(cand_floor_ptr + part, mask=cmask, other=-2147483648), axis=0).to(tl.int64)
    # The candidates, once, into registers: slot j of chunk c is used when j < its count.
    slots = tl.arange(0, CANDS_POW2)
    slot_chunk = slots // CAND
    used = tl.load(cand_count_ptr + line.to(tl.int64) * NUM_CHUNKS + slot_chunk, mask=slot_chunk < num_chunks, other=0)
    in_use = (slot_chunk < num_chunks) & (slots % CAND < used)
    cand_s = tl.load(cand_ptr + line.to(tl.int64) * NUM_CHUNKS * CAND + slots, mask=in_use, other=float("-inf"))
    cand_mult = tl.load(cand_mult_ptr + line.to(tl.int64) * NUM_CHUNKS * CAND + slots, mask=in_use, other=0)
    cand_key = order_key(cand_s)
    cand_weight = tl.where(cand_mult > 0, cand_mult.to(tl.float32) * exp(cand_s - row_max), 0.0)

    # The mass of the whole line (relative to its max), from the chunks' partials.
    line_mass = tl.sum(tl.where(part_max > float("-inf"), part_sum * exp(part_max - row_max), 0.0), axis=0)

    # top-k: the largest key t with count(key >= t) >= k is the k-th largest value. When fewer
    # than k values lie above T the search is left to the whole line (stage 1 over the whole line).
    k_key = tl.full((), -2147483648, tl.int64)
    stage = (top_k < 0).to(tl.int32)  # 0, as a runtime value like the ones assigned below
    k_from_candidates = top_k < 0  # False, likewise
    if use_k:
        k_from_candidates = _count_at_least(cand_key, cand_mult, floor + 1) >= top_k
        if k_from_candidates:
            k_key = _top_k_key_probes(cand_key, cand_mult, top_k, floor + 1, max_key, PROBES)
        else:
            stage = stage * 0 + 1
    resolved = k_from_candidates
    carried = line_mass  # stage 1: the mass of keys >= lo (lo = -2**31: the whole line)

    # top-p: the smallest key t whose strictly-greater mass (inside top-k) is below top_p * mass.
    tau_key = k_key
    if use_p & (stage == 0):
        if use_k:  # top-k settled among the candidates: so is the whole top-k set
            kept_mass = _mass_above(cand_key, cand_weight, k_key - 1, k_key)
            from_candidates = k_from_candidates
            lo = k_key - 1  # mass above lo is the whole top-k mass: not below budget
        else:
            kept_mass = line_mass
            # The cut lies above T when the candidates above T alone reach the budget.
            from_candidates = _mass_above(cand_key, cand_weight, floor, floor) >= top_p * kept_mass
            lo = floor
        budget = top_p * kept_mass
        if from_candidates:
            tau_key = _top_p_key_probes(cand_key, cand_weight, budget, k_key, lo, max_key, PROBES)
        else:
            stage = stage * 0 + 2  # over the whole line, from lo = -2**31 (every value's key is above)
            carried = budget
        resolved = from_candidates
    stage = tl.where(bad, 0, stage)  # a line with NaN / +inf values or none finite: no search (the race blanks its row)
    tau = tl.where(tau_key == -2147483648, float("-inf"), key_to_float(tau_key))
    normaliser = tl.sum(tl.where(cand_key >= tau_key, cand_weight, 0.0), axis=0)
    return tau, resolved, row_max, tl.where(bad, float("nan"), normaliser), stage, max_key, carried


@triton.jit
def threshold_line(
    line, tau_ptr, resolved_ptr, part_m_ptr, part_z_ptr, state_ptr, state_f_ptr, progress_ptr, searching_ptr, search_list_ptr,
    temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, cand_ptr, cand_mult_ptr, cand_count_ptr, cand_floor_ptr, chunk_max_ptr, chunk_sum_ptr,
    batch, K, V, Vd, t_parts, d_parts,
    NUM_CHUNKS: tl.constexpr, CHUNK: tl.constexpr, CHUNKS_POW2: tl.constexpr, CAND: tl.constexpr, CANDS_POW2: tl.constexpr,
    PARTS: tl.constexpr, PP: tl.constexpr, RESOLVE: tl.constexpr, PROBES: tl.constexpr,
):
    """The cut-off of one line from its candidates (cutoffs.py's first work items): tau and, when
    the candidates settle it, the line's statistics; otherwise a search state, the line appended
    to the whole-line search list. The outputs are described at cutoff_kernel's arguments."""
    row, pos, is_draft, width, inv_t, top_k, top_p, use_k, use_p, active = _filter_line(
        line, batch * (K + 1), K, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, V, Vd
    )
    tau = float("-inf")
    resolved = active & (tau > 0.0)  # False, as a runtime value
    row_max = float("-inf")
    normaliser = 0.0
    stage = resolved.to(tl.int32)  # 0: no whole-line search
    max_key = tl.full((), -2147483648, tl.int64)
    carried = 0.0
    if active:
        tau, resolved, row_max, normaliser, stage, max_key, carried = _line_threshold(
            line, width, top_k, top_p, use_k, use_p, cand_ptr, cand_mult_ptr, cand_count_ptr, cand_floor_ptr, chunk_max_ptr, chunk_sum_ptr,
            NUM_CHUNKS, CHUNK, CHUNKS_POW2, CAND, CANDS_POW2, PROBES,
        )
    tl.store(tau_ptr + line, tau)
    state = state_ptr + line.to(tl.int64) * 4
    tl.store(state, stage)
    if stage != 0:
        # The order of the list does not matter: each line's search is the same whichever
        # programs take its chunks.
        tl.store(search_list_ptr + tl.atomic_add(searching_ptr, 1, sem="relaxed"), line)
        tl.store(state + 1, -2147483648)  # lo: every key is at or above it
        tl.store(state + 2, max_key.to(tl.int32))  # hi: the line max
        tl.store(state + 3, -2147483648)  # the top-k key (none yet)
        tl.store(state_f_ptr + line.to(tl.int64) * 2, row_max)
        tl.store(state_f_ptr + line.to(tl.int64) * 2 + 1, carried)
        tl.store(progress_ptr + line, 0)  # no search pass finished yet
    if RESOLVE:
        tl.store(resolved_ptr + line, resolved.to(tl.int32))
        if resolved:
            parts = tl.arange(0, PP)
            count = tl.where(is_draft, d_parts, t_parts)
            slot = line.to(tl.int64) * PARTS + parts
            tl.store(part_m_ptr + slot, tl.where(parts == 0, row_max, float("-inf")), mask=parts < count)
            tl.store(part_z_ptr + slot, tl.where(parts == 0, normaliser, 0.0), mask=parts < count)
    else:
        tl.store(resolved_ptr + line, 0)
