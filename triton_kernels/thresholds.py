"""Top-k / top-p cut-offs of each logits line, without a sort, in two steps.

The kept set of top-k then top-p is always ``{s >= tau}`` for one value ``tau`` present in the line.
``tau`` is searched over the 32-bit order keys of float32 (an int32 whose order is the float
order): top-k's is the k-th largest value (ties counted), top-p's the smallest value whose
strictly-greater mass inside the top-k set is below ``top_p`` times that set's mass.

1. ``candidates_kernel``, grid (lines, vocabulary chunks): each program holds one chunk in
   registers, finds the chunk's CAND-th largest key ``t_c`` by bisection there, and stores the
   chunk's values with key > t_c, then as many with key == t_c as fit, in CAND slots; also the
   chunk's max and sum-exp, for the line's normaliser.
2. ``threshold_kernel``, grid (lines,): with ``T = max_c t_c``, the candidates hold *every* value
   of the line with key > T, so any count or mass above a key > T is exact over the candidates
   alone (about 1/64 of the line). When the cut provably lies above T (top-k: more than k
   candidates above T; top-p alone: their mass reaches the budget) the bisection runs over the
   candidates; otherwise (a large k, a flat distribution under top-p) over the whole line, as
   before. Either way the result is the same exact key.
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
def _chunk_candidates(base, chunk, width, inv_t, out, cand_ptr, cand_count_ptr, cand_floor_ptr, chunk_max_ptr, chunk_sum_ptr, CHUNK: tl.constexpr, CAND: tl.constexpr):
    idx = chunk * CHUNK + tl.arange(0, CHUNK)
    valid = idx < width
    s = tl.load(base + idx, mask=valid, other=float("-inf")).to(tl.float32) * inv_t
    key = tl.where(valid, order_key(s), -2147483648)  # padding never counts: below every real key
    chunk_max = tl.max(s, axis=0)
    chunk_sum = tl.sum(tl.where(s > float("-inf"), exp(s - chunk_max), 0.0), axis=0)

    # t_c: the largest key t with at least CAND valid keys >= t (-2**31 keeps every value).
    lo = tl.full((), -2147483648, tl.int64)
    hi = tl.max(key, axis=0).to(tl.int64)
    if tl.sum(valid.to(tl.int32), axis=0) > CAND:
        for _ in range(32):
            mid = lo + (hi - lo + 1) // 2
            ok = tl.sum(((key >= mid) & valid).to(tl.int32), axis=0) >= CAND
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid - 1)
    floor = lo.to(tl.int32)

    # Slots: every value above t_c first (fewer than CAND of them), then ties at t_c while room lasts.
    above = valid & (key > floor)
    tied = valid & (key == floor)
    above_count = tl.sum(above.to(tl.int32), axis=0)
    slot = tl.where(above, tl.cumsum(above.to(tl.int32), axis=0) - 1, above_count + tl.cumsum(tied.to(tl.int32), axis=0) - 1)
    keep = (above | tied) & (slot < CAND)
    tl.store(cand_ptr + out * CAND + slot, s, mask=keep)
    tl.store(cand_count_ptr + out, tl.minimum(above_count + tl.sum(tied.to(tl.int32), axis=0), CAND))
    tl.store(cand_floor_ptr + out, floor)
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
    cand_ptr,  # (lines, NUM_CHUNKS, CAND) float32 out: scaled values, slots [0, count) used
    cand_count_ptr,  # (lines, NUM_CHUNKS) int32 out: used slots
    cand_floor_ptr,  # (lines, NUM_CHUNKS) int32 out: t_c, the chunk's CAND-th largest key
    chunk_max_ptr,  # (lines, NUM_CHUNKS) float32 out: max of the scaled chunk
    chunk_sum_ptr,  # (lines, NUM_CHUNKS) float32 out: sum of exp(s - chunk max)
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
):
    line = tl.program_id(0)
    chunk = tl.program_id(1)
    row, pos, is_draft, width, inv_t, top_k, top_p, use_k, use_p, active = _filter_line(
        line, batch * (K + 1), K, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, V, Vd
    )
    out = line.to(tl.int64) * NUM_CHUNKS + chunk
    if active & (chunk * CHUNK < width):
        if is_draft:
            if HAS_DRAFT:
                d_base = draft_ptr + row.to(tl.int64) * d_stride_b + pos.to(tl.int64) * d_stride_k
                _chunk_candidates(d_base, chunk, Vd, inv_t, out, cand_ptr, cand_count_ptr, cand_floor_ptr, chunk_max_ptr, chunk_sum_ptr, CHUNK, CAND)
        else:
            t_base = target_ptr + row.to(tl.int64) * t_stride_b + pos.to(tl.int64) * t_stride_k
            _chunk_candidates(t_base, chunk, V, inv_t, out, cand_ptr, cand_count_ptr, cand_floor_ptr, chunk_max_ptr, chunk_sum_ptr, CHUNK, CAND)


@triton.jit
def _line_values(base, start, Vl, inv_t, offsets):
    """One tile of the line's scaled values (-inf past the end)."""
    idx = start + offsets
    return tl.load(base + idx, mask=idx < Vl, other=float("-inf")).to(tl.float32) * inv_t


# The search helpers read either the candidates, held in registers (FROM_CANDIDATES: one reduction
# per probe), or the whole line (a loop over its tiles per probe: the fallback).


@triton.jit
def _count_at_least(base, Vl, inv_t, cand_key, cand_finite, mid, FROM_CANDIDATES: tl.constexpr, BLOCK: tl.constexpr):
    """Number of finite values with key >= mid."""
    if FROM_CANDIDATES:
        return tl.sum(((cand_key >= mid) & cand_finite).to(tl.int64), axis=0)
    else:
        offsets = tl.arange(0, BLOCK)
        count = tl.zeros((), tl.int64)
        for start in range(0, Vl, BLOCK):
            s = _line_values(base, start, Vl, inv_t, offsets)
            count += tl.sum(((order_key(s) >= mid) & (s > float("-inf"))).to(tl.int64), axis=0)
        return count


@triton.jit
def _mass_above(base, Vl, inv_t, cand_key, cand_weight, above_key, floor_key, row_max, FROM_CANDIDATES: tl.constexpr, BLOCK: tl.constexpr):
    """Sum of exp(s - row_max) over the values with key > above_key and key >= floor_key."""
    if FROM_CANDIDATES:
        return tl.sum(tl.where((cand_key > above_key) & (cand_key >= floor_key), cand_weight, 0.0), axis=0)
    else:
        offsets = tl.arange(0, BLOCK)
        mass = 0.0
        for start in range(0, Vl, BLOCK):
            s = _line_values(base, start, Vl, inv_t, offsets)
            key = order_key(s)
            mass += tl.sum(tl.where((key > above_key) & (key >= floor_key) & (s > float("-inf")), exp(s - row_max), 0.0), axis=0)
        return mass


@triton.jit
def _top_k_key(base, Vl, inv_t, cand_key, cand_finite, top_k, lo, hi, FROM_CANDIDATES: tl.constexpr, BLOCK: tl.constexpr):
    """The largest key t in [lo, hi] with count(key >= t) >= top_k, given that lo qualifies."""
    for _ in range(32):
        mid = lo + (hi - lo + 1) // 2
        ok = _count_at_least(base, Vl, inv_t, cand_key, cand_finite, mid, FROM_CANDIDATES, BLOCK) >= top_k
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo


@triton.jit
def _top_p_key(base, Vl, inv_t, cand_key, cand_weight, budget, k_key, row_max, lo, hi, FROM_CANDIDATES: tl.constexpr, BLOCK: tl.constexpr):
    """The smallest key t in (lo, hi] whose mass above (inside key >= k_key) is below budget, given
    that lo's is not and hi's is."""
    for _ in range(33):
        mid = lo + (hi - lo) // 2
        above = _mass_above(base, Vl, inv_t, cand_key, cand_weight, mid, k_key, row_max, FROM_CANDIDATES, BLOCK)
        searching = hi - lo > 1
        ok = above < budget
        hi = tl.where(searching & ok, mid, hi)
        lo = tl.where(searching & ~ok, mid, lo)
    return hi


@triton.jit
def _line_threshold(
    base, line, Vl, inv_t, top_k, top_p, use_k, use_p, cand_ptr, cand_count_ptr, cand_floor_ptr, chunk_max_ptr, chunk_sum_ptr,
    NUM_CHUNKS: tl.constexpr, CHUNK: tl.constexpr, CHUNKS_POW2: tl.constexpr, CAND: tl.constexpr, CANDS_POW2: tl.constexpr, BLOCK: tl.constexpr,
):
    """tau of one active line (see the module docstring)."""
    num_chunks = tl.cdiv(Vl, CHUNK)
    chunks = tl.arange(0, CHUNKS_POW2)
    cmask = chunks < num_chunks
    part = line.to(tl.int64) * NUM_CHUNKS + chunks
    part_max = tl.load(chunk_max_ptr + part, mask=cmask, other=float("-inf"))
    row_max = tl.max(part_max, axis=0)
    max_key = order_key(row_max).to(tl.int64)
    # T: every value with key > T is among the candidates.
    floor = tl.max(tl.load(cand_floor_ptr + part, mask=cmask, other=-2147483648), axis=0).to(tl.int64)
    # The candidates, once, into registers: slot j of chunk c is used when j < its count.
    slots = tl.arange(0, CANDS_POW2)
    slot_chunk = slots // CAND
    used = tl.load(cand_count_ptr + line.to(tl.int64) * NUM_CHUNKS + slot_chunk, mask=slot_chunk < num_chunks, other=0)
    cand_s = tl.load(cand_ptr + line.to(tl.int64) * NUM_CHUNKS * CAND + slots, mask=(slot_chunk < num_chunks) & (slots % CAND < used), other=float("-inf"))
    cand_key = order_key(cand_s)
    cand_finite = cand_s > float("-inf")
    cand_weight = tl.where(cand_finite, exp(cand_s - row_max), 0.0)

    # top-k: the largest key t with count(key >= t) >= k is the k-th largest value.
    k_key = tl.full((), -2147483648, tl.int64)
    k_from_candidates = top_k < 0  # False, as a runtime value like the one assigned below
    if use_k:
        k_from_candidates = _count_at_least(base, Vl, inv_t, cand_key, cand_finite, floor + 1, True, BLOCK) >= top_k
        if k_from_candidates:
            k_key = _top_k_key(base, Vl, inv_t, cand_key, cand_finite, top_k, floor + 1, max_key, True, BLOCK)
        else:
            k_key = _top_k_key(base, Vl, inv_t, cand_key, cand_finite, top_k, k_key, max_key, False, BLOCK)

    # top-p: the smallest key t whose strictly-greater mass (inside top-k) is below top_p * mass.
    tau_key = k_key
    if use_p:
        if use_k:
            from_candidates = k_from_candidates  # the whole top-k set is among them
            if from_candidates:
                kept_mass = _mass_above(base, Vl, inv_t, cand_key, cand_weight, k_key - 1, k_key, row_max, True, BLOCK)
            else:
                kept_mass = _mass_above(base, Vl, inv_t, cand_key, cand_weight, k_key - 1, k_key, row_max, False, BLOCK)
            lo = k_key - 1  # mass above lo is the whole top-k mass: not below budget
        else:
            part_sum = tl.load(chunk_sum_ptr + part, mask=cmask, other=0.0)
            kept_mass = tl.sum(tl.where(part_max > float("-inf"), part_sum * exp(part_max - row_max), 0.0), axis=0)
            # The cut lies above T when the candidates above T alone reach the budget.
            above_floor = _mass_above(base, Vl, inv_t, cand_key, cand_weight, floor, floor, row_max, True, BLOCK)
            from_candidates = above_floor >= top_p * kept_mass
            lo = tl.where(from_candidates, floor, k_key - 1)
        budget = top_p * kept_mass
        if from_candidates:
            tau_key = _top_p_key(base, Vl, inv_t, cand_key, cand_weight, budget, k_key, row_max, lo, max_key, True, BLOCK)
        else:
            tau_key = _top_p_key(base, Vl, inv_t, cand_key, cand_weight, budget, k_key, row_max, lo, max_key, False, BLOCK)
    return tl.where(tau_key == -2147483648, float("-inf"), key_to_float(tau_key))


@triton.jit(do_not_specialize=["batch"])
def threshold_kernel(
    target_ptr,  # (B, K+1, V) raw target logits, last dim contiguous
    draft_ptr,  # (B, K, Vd) raw draft logits (unused without HAS_DRAFT)
    tau_ptr,  # (lines,) float32 out: keep s >= tau (-inf = keep all)
    temperature_ptr,  # (B,) float32, 0 = greedy
    top_k_ptr,  # (B,) int64, 0 = off
    top_p_ptr,  # (B,) float32, 1 = off
    num_draft_ptr,  # (B,) int64
    cand_ptr,  # candidates_kernel's outputs
    cand_count_ptr,
    cand_floor_ptr,
    chunk_max_ptr,
    chunk_sum_ptr,
    batch,
    K,
    V,
    Vd,
    t_stride_b,
    t_stride_k,
    d_stride_b,
    d_stride_k,
    NUM_CHUNKS: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    CHUNK: tl.constexpr,
    CHUNKS_POW2: tl.constexpr,
    CAND: tl.constexpr,
    CANDS_POW2: tl.constexpr,  # next power of two of NUM_CHUNKS * CAND: the candidates held in registers
    BLOCK: tl.constexpr,
):
    line = tl.program_id(0)
    row, pos, is_draft, width, inv_t, top_k, top_p, use_k, use_p, active = _filter_line(
        line, batch * (K + 1), K, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, V, Vd
    )
    tau = float("-inf")
    if active:
        if is_draft:
            if HAS_DRAFT:
                d_base = draft_ptr + row.to(tl.int64) * d_stride_b + pos.to(tl.int64) * d_stride_k
                tau = _line_threshold(d_base, line, Vd, inv_t, top_k, top_p, use_k, use_p, cand_ptr, cand_count_ptr, cand_floor_ptr, chunk_max_ptr, chunk_sum_ptr,
                                      NUM_CHUNKS, CHUNK, CHUNKS_POW2, CAND, CANDS_POW2, BLOCK)
        else:
            t_base = target_ptr + row.to(tl.int64) * t_stride_b + pos.to(tl.int64) * t_stride_k
            tau = _line_threshold(t_base, line, V, inv_t, top_k, top_p, use_k, use_p, cand_ptr, cand_count_ptr, cand_floor_ptr, chunk_max_ptr, chunk_sum_ptr,
                                  NUM_CHUNKS, CHUNK, CHUNKS_POW2, CAND, CANDS_POW2, BLOCK)
    tl.store(tau_ptr + line, tau)
