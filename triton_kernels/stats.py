"""Line statistics: one launch reads every used target and draft line once.

A "line" is one (row, position) of the target (B, K+1, V) or draft (B, K, Vd) logits; lines
0 .. B(K+1)-1 are the target's, the rest the draft's. Grid (lines, parts): a program reads
``tiles_per_part`` consecutive TILE-value tiles of one line, each as a (ROWS, LANES) block with
LANES consecutive values per row, so every thread holds a few 16-byte vectors of each row and the
reduction over ROWS stays inside the thread. Per-lane accumulators carry the line across tiles
(one rescale per lane and tile); one block reduction at the end combines the lanes, and the part's
partials go to the workspace, where the race kernel combines a line's parts.

Per line kind, each its own loop:
* sampled line: m = max of s = raw * inv_t, z = sum of exp(s - m);
  NaN or +inf anywhere makes z NaN (and m +inf), so "bad" needs no per-value test;
* a sampled line a filter cuts (PHASE 1): the same statistics of the whole line, and the part's
  candidates for the cut-off (below);
* greedy line: the raw max and its lowest index, m = NaN when a NaN was seen; with logprobs also z
  of the raw line (greedy rows report the model's log-softmax);
* RAW_STATS (logprobs "raw"): the max and sum-exp of the raw line next to the processed ones.
Lines a call never reads (beyond n_b, draft lines of greedy rows unless CHECK) are skipped.

A filtered call launches this kernel once, PHASE 1: it reads every used line, the only read of
the statistics. The cut-offs launch (cutoffs.py) then replaces a cut line's partials with its
statistics over the kept values: from the sorted candidates, or from the whole-line search's
histograms (select.py), so no line is read again for them.

Candidates (PHASE 1): every lane keeps the three largest values it read (a multiset: ties are
separate entries), five min / max per value. A lane's third value bounds every value it dropped,
so with the part floor F = the largest third value, every value of the part above F is the first
or second entry of its lane: those entries (at most the part's quota of slots) go to the
workspace with F. When more would, F rises to the largest second value (then only first entries
are above it), and past that to the part max (no entry). cutoffs.py's threshold items take the
line floor T = max F over the parts: the entries above T are then *every* value of the line above T.

Key counts (PHASE 1, a line under a top-k above HISTOGRAM_TOP_K, which the candidates are
unlikely to settle): the part, read again from L2 after its candidates, counted in the 256 bins of
the whole-line search's first top-k pass (select.py) and added into the line's counts (global
atomics, one per non-empty bin): a 16-bit line's raw keys' high byte (stage 7), a float32 line's
scaled values' order keys' high byte (stage 1 in bins of 2**24 keys). The threshold item then
takes that pass's decision from them instead of reading the line (thresholds.py).

Top windows (KEY_WINDOW, such a 16-bit line): the part also counts the 255 single raw keys below
two above its max's logit (bins 256 .. 510 of one histogram of 512; past them, bin 511), stores
those counts and that top key as its own (the top -2**31 when bin 511 counted a value), and adds
them to the high bytes' counts by their keys' high byte. Every value of a raw key has the same
scaled value, hence the same mass: when the windows hold k values, the threshold item finds the
top-k cut and the kept set's mass exactly from them, and the line is read no more.

Top-p windows (TOP_P_BINS, a bf16 line cut by top-p alone that one program reads whole: the
launcher plans that from 64 lines up): when the part's candidates may not settle the cut (their mass short of the budget, or
more than the sort takes: a flat distribution), the part, read again from L2, counts its raw keys
in TOP_P_BINS bins, one key a bin from two above its max's logit down, but the keys whose scaled
values lie within a quarter of the max's ulp from 0, which share one bin (each of their s - max
rounds to -max: they weigh the same, and would otherwise fill most bins with the binades near 0).
The counts and the window's bounds go to the workspace; every value of a bin weighs the same, so
the threshold item has each key's mass exactly and finds the cut from them when the window holds
it (thresholds.py's _top_p_window_cut), and the line is read no more. A bf16 window reaches 28
below the max, where the fixed-point weights end (a cut lies above), unless the max lies in
[0, 2**-8): 128 keys a binade, 26 binades from the merged keys up to a positive max.
"""

import triton
import triton.language as tl

from .random import exp, order_key, raw_key, raw_scaled
from .scan import before_here


@triton.jit
def line_of(line, lines_t, K):
    """(row, position, is_draft) of a line index."""
    is_draft = line >= lines_t
    local = tl.where(is_draft, line - lines_t, line)
    length = tl.where(is_draft, K, K + 1)
    return local // length, local % length, is_draft


@triton.jit
def filter_of(line, lines_t, K, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, V, Vd):
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
def histogrammed(use_k, top_k, HISTOGRAM_TOP_K: tl.constexpr):
    """Whether a filtered line's statistics also count its keys in the search's first top-k pass's
    bins: a top-k the candidates are unlikely to settle, whose whole-line search would start with
    that count."""
    return use_k & (top_k > HISTOGRAM_TOP_K)


@triton.jit
def _fold(lane_max, lane_sum, s):
    """Fold a (ROWS, LANES) block of processed values into per-lane (max, sum of exp(s - max))."""
    new_max = tl.maximum(lane_max, tl.max(s, axis=0))  # the reduction over ROWS stays in the thread
    ref = tl.where(new_max == float("-inf"), 0.0, new_max)  # an all -inf lane sums to 0, not NaN
    return new_max, lane_sum * exp(lane_max - ref) + tl.sum(exp(s - ref[None, :]), axis=0)


@triton.jit
def _combine(lane_max, lane_sum):
    """The block's (max, sum) from per-lane ones: one block reduction each."""
    block_max = tl.max(lane_max, axis=0)
    ref = tl.where(block_max == float("-inf"), 0.0, block_max)
    return block_max, tl.sum(lane_sum * exp(lane_max - ref), axis=0)


@triton.jit
def _load_values(base, start, offsets, width, MASKED: tl.constexpr):
    """Values ``start + offsets`` of a line in its own dtype (with MASKED, -inf past ``width``)."""
    if MASKED:
        idx = start + offsets
        return tl.load(base + idx, mask=idx < width, other=float("-inf"))
    else:
        return tl.load(base + start + offsets)


@triton.jit
def _load_tile(base, start, width, block, MASKED: tl.constexpr):
    """Values ``start + block`` of a line as float32 (a tile's (ROWS, LANES) block, or one row's lanes)."""
    return _load_values(base, start, block, width, MASKED).to(tl.float32)


@triton.jit
def _greedy_tiles(base, first, last, width, rows, lanes, block, lane_best, lane_index, lane_nan, lane_max, lane_sum,
                  GREEDY_SUMS: tl.constexpr, MASKED: tl.constexpr, LANES: tl.constexpr, ROWS: tl.constexpr):
    for tile in range(first, last):
        start = tile * (ROWS * LANES)
        raw = _load_tile(base, start, width, block, MASKED)
        tile_best = tl.max(raw, axis=0)
        tile_row = tl.min(tl.where(raw == tile_best[None, :], rows[:, None], ROWS), axis=0)
        better = tile_best > lane_best  # strict: an earlier tile keeps a tie (lower index)
        lane_index = tl.where(better, start + tile_row * LANES + lanes, lane_index)
        lane_best = tl.where(better, tile_best, lane_best)
        lane_nan = lane_nan | tl.max((raw != raw).to(tl.int32), axis=0)
        if GREEDY_SUMS:
            lane_max, lane_sum = _fold(lane_max, lane_sum, raw)
    return lane_best, lane_index, lane_nan, lane_max, lane_sum


@triton.jit
def _sampled_tiles(base, first, last, width, block, inv_t, lane_max, lane_sum, raw_max, raw_sum, RAW_STATS: tl.constexpr, MASKED: tl.constexpr, LANES: tl.constexpr, ROWS: tl.constexpr):
    for tile in range(first, last):
        raw = _load_tile(base, tile * (ROWS * LANES), width, block, MASKED)
        lane_max, lane_sum = _fold(lane_max, lane_sum, raw * inv_t)
        if RAW_STATS:
            raw_max, raw_sum = _fold(raw_max, raw_sum, raw)
    return lane_max, lane_sum, raw_max, raw_sum


@triton.jit
def _sampled_part(base, first, whole, last, width, block, inv_t, lane_max, lane_sum, raw_max, raw_sum, RAW_STATS: tl.constexpr, LANES: tl.constexpr, ROWS: tl.constexpr):
    """Whole tiles [first, whole) unmasked, then [whole, last) masked."""
    lane_max, lane_sum, raw_max, raw_sum = _sampled_tiles(
        base, first, whole, width, block, inv_t, lane_max, lane_sum, raw_max, raw_sum, RAW_STATS, False, LANES, ROWS)
    return _sampled_tiles(base, whole, last, width, block, inv_t, lane_max, lane_sum, raw_max, raw_sum, RAW_STATS, True, LANES, ROWS)


@triton.jit
def _insert(t1, t2, t3, x):
    """Insert x into the per-lane multiset top three t1 >= t2 >= t3."""
    below1 = tl.minimum(t1, x)
    below2 = tl.minimum(t2, below1)
    return tl.maximum(t1, x), tl.maximum(t2, below1), tl.maximum(t3, below2)


@triton.jit
def _candidate_tiles(base, first, last, width, lanes, inv_t, lane_max, lane_sum, raw_max, raw_sum, t1, t2, t3,
                     RAW_STATS: tl.constexpr, MASKED: tl.constexpr, LANES: tl.constexpr, ROWS: tl.constexpr):
    """The sampled-line statistics of tiles [first, last) row by row, each value also inserted into
    its lane's top three. The tile's rows are read twice (the second time from L1): first for the
    top three, then for the sums at the new maxima (one rescale per lane and tile). The top three
    are of the raw logits (``_part`` scales them): scaling by inv_t > 0 keeps their order, so t1 is
    the lane's raw max and t1 * inv_t its scaled one, and the sums' exponent is one fused
    multiply-add, exp(raw * inv_t - ref) = exp2(raw * (inv_t * log2 e) - ref * log2 e) (a sum,
    not a kept weight: an ulp of its terms is as the order of its additions)."""
    scale = inv_t * 1.4426950408889634
    for tile in range(first, last):
        start = tile * (ROWS * LANES)
        for r in tl.static_range(ROWS):
            t1, t2, t3 = _insert(t1, t2, t3, _load_tile(base, start + r * LANES, width, lanes, MASKED))
        tile_max = t1 * inv_t
        ref = tl.where(tile_max == float("-inf"), 0.0, tile_max)
        raw_ref = tl.where(t1 == float("-inf"), 0.0, t1)
        lane_sum = lane_sum * exp(lane_max - ref)
        if RAW_STATS:
            raw_sum = raw_sum * exp(raw_max - raw_ref)
        shift = ref * 1.4426950408889634
        raw_shift = raw_ref * 1.4426950408889634
        for r in tl.static_range(ROWS):
            raw = _load_tile(base, start + r * LANES, width, lanes, MASKED)
            lane_sum += tl.exp2(tl.fma(raw, scale, -shift))
            if RAW_STATS:
                raw_sum += tl.exp2(tl.fma(raw, 1.4426950408889634, -raw_shift))
        lane_max = tile_max
        raw_max = t1
    return lane_max, lane_sum, raw_max, raw_sum, t1, t2, t3


@triton.jit
def first_pass_bin(x, inv_t, window_lo, WINDOW: tl.constexpr):
    """The bin of the whole-line search's first top-k pass holding each logit of ``x`` (its line's
    dtype): a 16-bit logit's raw key's high byte, else its scaled value's order key's (bins of
    2**24 keys from -2**31); the values the search skips (-inf once scaled, NaN) in bin 0, whose
    count no decision reads (thresholds.py: bin 0 qualifies whatever it holds). With WINDOW (a
    16-bit line's part under its top window): the raw keys from ``window_lo`` on in bins
    256 + (key - window_lo) instead, the keys past window_lo + 254 all in bin 511, and no test per
    value: -inf (an fp16's in byte 3) and logits 1 / temperature scales to -inf are counted at
    their own keys, which the threshold item allows for (thresholds.py's _raw_top_k_start)."""
    s = x.to(tl.float32) * inv_t
    if x.dtype.primitive_bitwidth == 16:
        key = raw_key(x, x.dtype == tl.bfloat16)
        bins = (key >> 8) + 128
    else:
        bins = (order_key(s) >> 24) + 128
    if WINDOW:
        past = key - window_lo
        # (& 511: bounds the compiler can see, or tl.histogram tests each bin and branches around it)
        return tl.where(past >= 0, 256 + tl.minimum(past, 255), bins) & 511
    else:
        return tl.where(s > float("-inf"), bins, 0)


@triton.jit
def _key_count_blocks(base, start, end, width, inv_t, window_lo, counts, WINDOW: tl.constexpr, MASKED: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    for block in range(start, end, BLOCK):
        x = _load_values(base, block, offsets, width, MASKED)
        # No mask on the histogram (a masked one branches per value): skipped values go to bin 0.
        counts += tl.histogram(first_pass_bin(x, inv_t, window_lo, WINDOW), 512 if WINDOW else 256)
    return counts


@triton.jit
def _key_counts(base, start, end, width, inv_t, window_lo, WINDOW: tl.constexpr, BLOCK: tl.constexpr):
    """A line's values [start, end) counted in the bins of its search's first top-k pass
    (``first_pass_bin``; with WINDOW 512 of them, the window's after the 256), BLOCK values a step,
    whole blocks unmasked (its own loop after the candidates', which it would crowd: the part is
    read again, from L2)."""
    end = tl.minimum(end, width)
    whole = start + (end - start) // BLOCK * BLOCK
    counts = _key_count_blocks(base, start, whole, width, inv_t, window_lo, tl.zeros((512 if WINDOW else 256,), tl.int32), WINDOW, False, BLOCK)
    # (the ragged block masked at the part's end, not the line's: the next part counts its values)
    return _key_count_blocks(base, whole, end, end, inv_t, window_lo, counts, WINDOW, True, BLOCK)


@triton.jit
def window_top(part_max, inv_t, DTYPE: tl.constexpr):
    """The raw key a part's top window ends at: two keys above that of the 16-bit logit nearest its
    scaled max (``part_max / inv_t`` rounded to DTYPE is the max's own logit: the scaling and its
    inverse are far finer than DTYPE's steps, save where they underflow; bin 511 counts what
    lies above the window all the same)."""
    logit = (part_max / inv_t).to(DTYPE)
    return tl.minimum(raw_key(logit, DTYPE == tl.bfloat16) + 2, 32767)


@triton.jit
def top_p_window(part_max, inv_t, DTYPE: tl.constexpr, BINS: tl.constexpr):
    """(lo, zero_lo, zero_span) of a 16-bit line's top-p window: BINS - 1 bins of its raw keys from
    ``lo`` up to two above its max's logit (``window_top``), one key a bin, but for the keys
    zero_lo .. zero_lo + zero_span, whose scaled values lie within a quarter of the max's ulp
    from 0: s - max rounds to -max for each of them, so they weigh the same and share one bin
    (without it, the binades near 0 would take most of the bins). The threshold item checks that
    they do, and that the window holds the cut, before it uses the counts (thresholds.py)."""
    top = window_top(part_max, inv_t, DTYPE)
    exponent = (part_max.to(tl.int32, bitcast=True) >> 23) & 0xFF
    quarter = (tl.maximum(exponent - 25, 0) << 23).to(tl.float32, bitcast=True)  # 0.0: no key merges
    zero_hi = raw_key((quarter / inv_t).to(DTYPE), DTYPE == tl.bfloat16)
    zero_hi = tl.where(raw_scaled(zero_hi, inv_t, DTYPE) >= quarter, zero_hi - 1, zero_hi)
    zero_hi = tl.where(raw_scaled(zero_hi, inv_t, DTYPE) >= quarter, zero_hi - 1, zero_hi)
    zero_hi = tl.minimum(tl.where(quarter > 0.0, tl.maximum(zero_hi, 0), -1), top)
    zero_lo = -tl.maximum(zero_hi, 0) - 1  # (a raw key's negation is -key - 1)
    lo = tl.maximum(top - (BINS - 2) - tl.maximum(zero_hi - zero_lo, 0), -32768)
    zero_lo = tl.maximum(zero_lo, lo)
    return lo, zero_lo, tl.maximum(zero_hi - zero_lo, 0)


@triton.jit
def top_p_window_bin(key, lo, zero_lo, zero_span, BINS: tl.constexpr):
    """The bin of raw key ``key`` in a top-p window (``top_p_window``): key - lo less the merged
    keys below it, and BINS - 1 for a key outside the window (below lo: a wrapped unsigned offset).
    (A key below the merged ones is its own min with zero_lo; one inside, zero_lo; one above,
    key - zero_span, the larger: three integer instructions.)"""
    inside = tl.maximum(key - zero_span, tl.minimum(key, zero_lo)) - lo
    return tl.minimum(inside.to(tl.uint32, bitcast=True), BINS - 1).to(tl.int32)


@triton.jit
def _top_p_window_blocks(base, start, end, width, lo, zero_lo, zero_span, counts, BINS: tl.constexpr, MASKED: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    for block in range(start, end, BLOCK):
        x = _load_values(base, block, offsets, width, MASKED)
        # No test per value: -inf (a padded value's too) and a logit 1 / temperature scales to -inf
        # weigh 0 in whichever bin holds them.
        counts += tl.histogram(top_p_window_bin(raw_key(x, x.dtype == tl.bfloat16, True), lo, zero_lo, zero_span, BINS), BINS)
    return counts


@triton.jit
def _top_p_window_counts(base, end, width, lo, zero_lo, zero_span, BINS: tl.constexpr, BLOCK: tl.constexpr):
    """A whole 16-bit line's values counted in its top-p window's bins, BLOCK values a step, whole
    blocks unmasked (read again, from L2, after the candidates)."""
    end = tl.minimum(end, width)
    whole = end // BLOCK * BLOCK
    counts = _top_p_window_blocks(base, 0, whole, width, lo, zero_lo, zero_span, tl.zeros((BINS,), tl.int32), BINS, False, BLOCK)
    return _top_p_window_blocks(base, whole, end, width, lo, zero_lo, zero_span, counts, BINS, True, BLOCK)


@triton.jit
def _store_candidates(t1, t2, t3, line, part, quota, cand_ptr, cand_count_ptr, cand_floor_ptr, PARTS: tl.constexpr, LINE_SLOTS: tl.constexpr):
    """The part's candidates (see the module docstring): the entries above its floor in slots
    [part * quota, part * quota + count) of the line's LINE_SLOTS, the count, the floor's order key
    and that of the level-two floor (the largest second entry, or the floor if higher)."""
    floor3 = tl.max(t3, axis=0)
    count3 = tl.sum((t1 > floor3).to(tl.int32) + (t2 > floor3).to(tl.int32), axis=0)
    floor2 = tl.max(t2, axis=0)
    count2 = tl.sum((t1 > floor2).to(tl.int32), axis=0)
    floor = tl.where(count3 <= quota, floor3, tl.where(count2 <= quota, floor2, tl.max(t1, axis=0)))
    keep1 = t1 > floor
    keep2 = t2 > floor  # never above the floor once it is the largest second entry or more
    kept = keep1.to(tl.int32) + keep2.to(tl.int32)
    slot = line.to(tl.int64) * LINE_SLOTS + part * quota + before_here(kept)
    tl.store(cand_ptr + slot, t1, mask=keep1)
    tl.store(cand_ptr + slot + keep1.to(tl.int32), t2, mask=keep2)
    out = line.to(tl.int64) * PARTS + part
    tl.store(cand_count_ptr + out, tl.sum(kept, axis=0))
    tl.store(cand_floor_ptr + out * 2, order_key(floor))
    tl.store(cand_floor_ptr + out * 2 + 1, order_key(tl.maximum(floor2, floor)))
    return floor, tl.sum(kept, axis=0)


@triton.jit
def _candidates_may_settle(t1, t2, floor, kept, part_max, part_sum, top_p, SORT: tl.constexpr):
    """Whether a line read whole by one part may have its top-p cut settled by its candidates (the
    threshold item's test, thresholds.py, with a margin for its other order of summation): they
    fit its sort and their mass reaches top_p times the line's."""
    mass = tl.sum(tl.where(t1 > floor, exp(t1 - part_max), 0.0) + tl.where(t2 > floor, exp(t2 - part_max), 0.0), axis=0)
    return (kept <= SORT) & (mass >= top_p * part_sum * 1.001)


@triton.jit
def _part(
    base, first, last, width, inv_t, greedy, candidates, histogram, line, part, quota, out, part_m_ptr, part_z_ptr, part_i_ptr, part_rm_ptr, part_rz_ptr,
    cand_ptr, cand_count_ptr, cand_floor_ptr, hist_ptr, window_ptr, window_p, top_p, top_p_window_ptr,
    CANDIDATES: tl.constexpr, GREEDY_SUMS: tl.constexpr, RAW_STATS: tl.constexpr, LANES: tl.constexpr, ROWS: tl.constexpr,
    PARTS: tl.constexpr, LINE_SLOTS: tl.constexpr, KEY_WINDOW: tl.constexpr, SORT: tl.constexpr, TOP_P_BINS: tl.constexpr,
    TOP_P_BLOCK: tl.constexpr,
):
    """Statistics of tiles [first, last) of one line into partial slot ``out``: whole tiles
    unmasked, the line's ragged last tile masked; with ``candidates`` (a runtime flag, only
    compiled in with CANDIDATES) also the part's candidates, and with ``histogram`` the part's
    first-pass key counts added into the line's (with KEY_WINDOW, a 16-bit line's top window's
    counts stored as the part's own); with ``window_p`` (a bf16 line cut by top-p alone, which
    this part reads whole: TOP_P_BINS > 0) its top-p window's counts and bounds, unless its
    candidates may settle it."""
    rows = tl.arange(0, ROWS)
    lanes = tl.arange(0, LANES)
    block = rows[:, None] * LANES + lanes[None, :]
    whole = tl.maximum(tl.minimum(last, width // (ROWS * LANES)), first)
    may_settle = window_p & (first < 0)  # False, as a runtime value (set from the candidates)
    lane_max = tl.full((LANES,), float("-inf"), tl.float32)
    lane_sum = tl.zeros((LANES,), tl.float32)
    raw_max = tl.full((LANES,), float("-inf"), tl.float32)
    raw_sum = tl.zeros((LANES,), tl.float32)
    if greedy:
        lane_best = tl.full((LANES,), float("-inf"), tl.float32)
        lane_index = tl.zeros((LANES,), tl.int32)
        lane_nan = tl.zeros((LANES,), tl.int32)
        lane_best, lane_index, lane_nan, lane_max, lane_sum = _greedy_tiles(
            base, first, whole, width, rows, lanes, block, lane_best, lane_index, lane_nan, lane_max, lane_sum, GREEDY_SUMS, False, LANES, ROWS)
        lane_best, lane_index, lane_nan, lane_max, lane_sum = _greedy_tiles(
            base, whole, last, width, rows, lanes, block, lane_best, lane_index, lane_nan, lane_max, lane_sum, GREEDY_SUMS, True, LANES, ROWS)
        best = tl.max(lane_best, axis=0)
        tl.store(part_i_ptr + out, tl.min(tl.where(lane_best == best, lane_index, 2147483647), axis=0))
        seen_nan = tl.max(lane_nan, axis=0) != 0
        if GREEDY_SUMS:
            part_max, part_sum = _combine(lane_max, lane_sum)
        else:
            part_max = best
            part_sum = 1.0
        tl.store(part_m_ptr + out, tl.where(seen_nan, float("nan"), part_max))
        tl.store(part_z_ptr + out, part_sum)
    else:
        if CANDIDATES:
            if candidates:
                t1 = tl.full((LANES,), float("-inf"), tl.float32)
                t2 = tl.full((LANES,), float("-inf"), tl.float32)
                t3 = tl.full((LANES,), float("-inf"), tl.float32)
                lane_max, lane_sum, raw_max, raw_sum, t1, t2, t3 = _candidate_tiles(
                    base, first, whole, width, lanes, inv_t, lane_max, lane_sum, raw_max, raw_sum, t1, t2, t3, RAW_STATS, False, LANES, ROWS)
                lane_max, lane_sum, raw_max, raw_sum, t1, t2, t3 = _candidate_tiles(
                    base, whole, last, width, lanes, inv_t, lane_max, lane_sum, raw_max, raw_sum, t1, t2, t3, RAW_STATS, True, LANES, ROWS)
                t1, t2, t3 = t1 * inv_t, t2 * inv_t, t3 * inv_t  # (the raw top three, scaled)
                floor, kept = _store_candidates(t1, t2, t3, line, part, quota, cand_ptr, cand_count_ptr, cand_floor_ptr, PARTS, LINE_SLOTS)
                if TOP_P_BINS > 0:
                    if window_p:
                        whole_max, whole_sum = _combine(lane_max, lane_sum)
                        may_settle = _candidates_may_settle(t1, t2, floor, kept, whole_max, whole_sum, top_p, SORT)
            else:
                lane_max, lane_sum, raw_max, raw_sum = _sampled_part(
                    base, first, whole, last, width, block, inv_t, lane_max, lane_sum, raw_max, raw_sum, RAW_STATS, LANES, ROWS)
        else:
            lane_max, lane_sum, raw_max, raw_sum = _sampled_part(
                base, first, whole, last, width, block, inv_t, lane_max, lane_sum, raw_max, raw_sum, RAW_STATS, LANES, ROWS)
        part_max, part_sum = _combine(lane_max, lane_sum)
        tl.store(part_m_ptr + out, part_max)
        tl.store(part_z_ptr + out, part_sum)
        if RAW_STATS:
            part_max, part_sum = _combine(raw_max, raw_sum)
            tl.store(part_rm_ptr + out, part_max)
            tl.store(part_rz_ptr + out, part_sum)
        if CANDIDATES:
            if TOP_P_BINS > 0:
                if window_p:  # (last, likewise)
                    DTYPE_P: tl.constexpr = base.dtype.element_ty
                    if DTYPE_P == tl.bfloat16:
                        # The candidates settle most lines (peaked ones): those are not counted.
                        lo = tl.full((), -2147483648, tl.int32)
                        zero_lo = lo * 0
                        zero_span = lo * 0
                        if may_settle == 0:
                            lo, zero_lo, zero_span = top_p_window(part_max, inv_t, DTYPE_P, TOP_P_BINS)
                            counts = _top_p_window_counts(base, last * (ROWS * LANES), width, lo, zero_lo, zero_span, TOP_P_BINS, TOP_P_BLOCK)
                            tl.store(top_p_window_ptr + line.to(tl.int64) * (TOP_P_BINS + 4) + tl.arange(0, TOP_P_BINS), counts)
                        # The window's bounds after its counts (lo -2**31: not counted).
                        bounds = top_p_window_ptr + line.to(tl.int64) * (TOP_P_BINS + 4) + TOP_P_BINS
                        tl.store(bounds, lo)
                        tl.store(bounds + 1, zero_lo)
                        tl.store(bounds + 2, zero_span)
            if histogram:  # (last: nothing of the statistics is live across its loop)
                DTYPE: tl.constexpr = base.dtype.element_ty
                WINDOW: tl.constexpr = KEY_WINDOW and DTYPE.primitive_bitwidth == 16
                top = part * 0  # (no window)
                if WINDOW:
                    top = window_top(part_max, inv_t, DTYPE)
                counts = _key_counts(base, first * (ROWS * LANES), last * (ROWS * LANES), width, inv_t, top - 254, WINDOW, 2 * LANES)
                bins = tl.arange(0, 512 if WINDOW else 256)
                # Into the line's high bytes' counts: every value the part counted (a window's key
                # by its high byte), but those above its window, whose high bytes it did not keep.
                high = tl.where(bins < 256, bins, ((top - 510 + bins) >> 8) + 128)
                tl.atomic_add(hist_ptr + line.to(tl.int64) * 256 + high, counts, mask=(counts > 0) & (bins < 511), sem="relaxed")
                if WINDOW:
                    # The window's counts in the part's own slots, its top key after them: -2**31
                    # when a value lies above it (then no count of the line's window is known).
                    above = tl.sum(tl.where(bins == 511, counts, 0), axis=0)
                    stored = tl.where(bins == 511, tl.where(above == 0, top, -2147483648), counts)
                    tl.store(window_ptr + out * 256 + bins - 256, stored, mask=bins >= 256)


@triton.jit(do_not_specialize=["batch", "tiles_per_part"])
def line_stats_kernel(
    target_ptr,  # (B, K+1, V) raw target logits, last dim contiguous
    draft_ptr,  # (B, K, Vd) raw draft logits (unused without HAS_DRAFT)
    temperature_ptr,  # (B,) float32, 0 = greedy
    top_k_ptr,  # (B,) int64, 0 = off (read in PHASE 1)
    top_p_ptr,  # (B,) float32, 1 = off (read in PHASE 1)
    num_draft_ptr,  # (B,) int64 drafts to verify per row
    part_m_ptr,  # (lines, PARTS) float32 out: max of the processed part (raw for greedy lines; NaN = NaN seen)
    part_z_ptr,  # (lines, PARTS) float32 out: sum of exp(s - max) over the part
    part_i_ptr,  # (lines, PARTS) int32 out: greedy lines, lowest index of the raw max
    part_rm_ptr,  # (lines, PARTS) float32 out: RAW_STATS, max of the raw part
    part_rz_ptr,  # (lines, PARTS) float32 out: RAW_STATS, sum of exp(raw - raw max)
    cand_ptr,  # (lines, LINE_SLOTS) float32 out (PHASE 1): each part's candidate values, from slot part * quota
    cand_count_ptr,  # (lines, PARTS) int32 out (PHASE 1): candidates of each part
    cand_floor_ptr,  # (lines, PARTS, 2) int32 out (PHASE 1): order keys of the part's floor and level-two floor
    searching_ptr,  # (1,) int32 out (PHASE 1): 0, the count of lines cutoff_kernel hands to the whole-line search
    hist_ptr,  # (lines, 256) int32, 0 on entry (PHASE 1): a line's first-pass key counts where top-k > HISTOGRAM_TOP_K (added)
    window_ptr,  # (lines, PARTS, 256) int32 out (PHASE 1, KEY_WINDOW): a histogrammed 16-bit line's parts' top-window counts, then top key
    top_p_window_ptr,  # (lines, TOP_P_BINS + 4) int32 out (PHASE 1, TOP_P_BINS): a bf16 top-p line's window counts, then lo, zero_lo, zero_span
    tokens_ptr,  # (B, K) int32 / int64 draft tokens
    gathered_ptr,  # (lines,) float32 out: each draft position's line's raw logit at its draft token
    batch,
    K,
    V,
    Vd,
    t_stride_b,
    t_stride_k,
    d_stride_b,
    d_stride_k,
    tok_stride_b,
    tiles_per_part,  # tiles each program reads (follows B: fewer, longer programs at large batch)
    PARTS: tl.constexpr,  # partial slots per line (cdiv(V, TILE)): the row stride of part_*
    HAS_DRAFT: tl.constexpr,
    CHECK: tl.constexpr,  # also read greedy rows' draft lines (check=True validates every used line)
    PHASE: tl.constexpr,  # 0 an unfiltered call; 1 a filtered call's (every line, with its candidates)
    LOGPROBS: tl.constexpr,  # 0 none, 1 processed, 2 raw
    LINE_SLOTS: tl.constexpr,  # candidate slots per line, shared by its parts
    T_LANES: tl.constexpr,  # target tiles are (T_ROWS, T_LANES); T_ROWS * T_LANES == D_ROWS * D_LANES
    T_ROWS: tl.constexpr,
    D_LANES: tl.constexpr,
    D_ROWS: tl.constexpr,
    HISTOGRAM_TOP_K: tl.constexpr,  # a filtered line with top-k above it gets its histogram (the whole-line search's first pass)
    KEY_WINDOW: tl.constexpr,  # such a 16-bit line's parts also count the single raw keys of their top window
    SORT: tl.constexpr,  # the threshold item's candidate slots (cutoffs.py)
    TOP_P_BINS: tl.constexpr,  # 0, or the bins of a bf16 line's top-p window (one part reading it whole, top-p alone)
    TOP_P_BLOCK: tl.constexpr,  # values a step of that count
):
    line = tl.program_id(0)
    part = tl.program_id(1)
    lines_t = batch * (K + 1)
    row, pos, is_draft = line_of(line, lines_t, K)
    requested = tl.load(num_draft_ptr + row)
    num_draft = tl.minimum(tl.maximum(requested, 0), K)
    temperature = tl.load(temperature_ptr + row)
    greedy = temperature == 0
    inv_t = tl.math.div_rn(1.0, tl.where(temperature > 0, temperature, 1.0))
    candidates = line < 0  # False, as a runtime value
    histogram = candidates
    window_p = candidates
    top_p = inv_t
    if PHASE == 1:
        if (line == 0) & (part == 0):
            tl.store(searching_ptr, 0)  # cutoff_kernel, launched next, counts from here
        _, _, _, _, _, top_k, top_p, use_k, use_p, active = filter_of(line, lines_t, K, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, V, Vd)
        candidates = active
        histogram = active & histogrammed(use_k, top_k, HISTOGRAM_TOP_K)
        window_p = active & use_p & (use_k == 0)
    out = line.to(tl.int64) * PARTS + part
    first = part * tiles_per_part
    # The draft token of this position (clamped as the race clamps it), for the gather below.
    token = tl.load(tokens_ptr + row.to(tl.int64) * tok_stride_b + pos, mask=pos < K, other=0).to(tl.int32)
    token = tl.minimum(tl.maximum(token, 0), Vd - 1)
    if is_draft:
        if HAS_DRAFT:
            line_tiles = tl.cdiv(Vd, D_LANES * D_ROWS)
            last = tl.minimum(first + tiles_per_part, line_tiles)
            used = (pos < num_draft) & (first < last)
            if not CHECK:
                used = used & (temperature != 0)  # a greedy row's walk reads no draft line
            if used:
                d_base = draft_ptr + row.to(tl.int64) * d_stride_b + pos.to(tl.int64) * d_stride_k
                # Issued with the tiles' loads; stored when the token lies in this part.
                mine = (token >= first * (D_LANES * D_ROWS)) & (token < last * (D_LANES * D_ROWS))
                at_token = tl.load(d_base + token, mask=mine, other=0.0).to(tl.float32)
                quota = LINE_SLOTS // tl.cdiv(line_tiles, tiles_per_part)
                _part(d_base, first, last, Vd, inv_t, greedy, candidates, histogram, line, part, quota, out, part_m_ptr, part_z_ptr, part_i_ptr,
                      part_rm_ptr, part_rz_ptr, cand_ptr, cand_count_ptr, cand_floor_ptr, hist_ptr, window_ptr,
                      window_p & (first == 0) & (last == line_tiles), top_p, top_p_window_ptr,
                      PHASE == 1, False, False, D_LANES, D_ROWS, PARTS, LINE_SLOTS, KEY_WINDOW, SORT, TOP_P_BINS, TOP_P_BLOCK)
                tl.store(gathered_ptr + line, at_token, mask=mine)
    else:
        line_tiles = tl.cdiv(V, T_LANES * T_ROWS)
        last = tl.minimum(first + tiles_per_part, line_tiles)
        if (pos <= num_draft) & (first < last):
            t_base = target_ptr + row.to(tl.int64) * t_stride_b + pos.to(tl.int64) * t_stride_k
            # The race reads the draft token's logit from here, with the partials, instead of
            # gathering it from the line after its other loads.
            mine = (pos < num_draft) & (token >= first * (T_LANES * T_ROWS)) & (token < last * (T_LANES * T_ROWS))
            at_token = tl.load(t_base + token, mask=mine, other=0.0).to(tl.float32)
            quota = LINE_SLOTS // tl.cdiv(line_tiles, tiles_per_part)
            _part(t_base, first, last, V, inv_t, greedy, candidates, histogram, line, part, quota, out, part_m_ptr, part_z_ptr, part_i_ptr,
                  part_rm_ptr, part_rz_ptr, cand_ptr, cand_count_ptr, cand_floor_ptr, hist_ptr, window_ptr,
                  window_p & (first == 0) & (last == line_tiles), top_p, top_p_window_ptr,
                  PHASE == 1, LOGPROBS != 0, LOGPROBS == 2, T_LANES, T_ROWS, PARTS, LINE_SLOTS, KEY_WINDOW, SORT, TOP_P_BINS, TOP_P_BLOCK)
            tl.store(gathered_ptr + line, at_token, mask=mine)
