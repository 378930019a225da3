"""Top-k / top-p cut-offs of each logits line from its candidates, without a pass over the line.

The kept set of top-k then top-p is always ``{s >= tau}`` for one value ``tau`` present in the line.
``tau`` is an order key of float32 (random.py's ``order_key``: an int32 whose order is the float
order): top-k's is the k-th largest value (ties counted), top-p's the smallest value whose
strictly-greater mass inside the top-k set is below ``top_p`` times that set's mass.

``line_stats_kernel`` (stats.py, PHASE 1) leaves each part of a filtered line its candidates: every
value of the part above the part's floor. ``threshold_line`` (the first work items of
``cutoff_kernel``, cutoffs.py) takes the line floor T = the largest part floor: the candidates
above T are then every value of the line above T, in any order. It sorts them (at most SORT; when
more lie above T, the level-two floor T2 >= T is used), so the count and the mass before each
value are the reference's sorted ones, as far as the candidates reach. When the cut provably lies
among them (top-k: at least k values; top-p alone: their mass reaches the budget) the cut and the
line's normaliser over the kept set come from the sorted candidates, and the line is never read
again. Otherwise (a large k, a flat distribution under top-p) the line gets a search state and the
whole-line search (select.py) finds the cut in the same launch, with the kept set's statistics,
unless the statistics' windows settle it: a 16-bit top-k's top windows (``_raw_top_k_start``), a
bf16 top-p's top-p window (``_top_p_window_cut``). Where there are no windows (tl.histogram is warp
ballots, or a call of 32-bit lines), a sample of the line places a top-k line's first gather
(``_sampled_top_k_lo``), a 16-bit top-p line's first raw window (``_sampled_top_p_window``) or a
32-bit top-p line's first gather (``_sampled_top_p_gather``). The windows are tried before the
candidates are sorted, so a line they settle sorts none. Either way the result is the same exact key.
"""

import triton
import triton.language as tl

from .random import exp, key_to_float, order_key, raw_scaled
from .scan import before_here, from_here, largest_reaching
from .select import fixed_mass, pick, reaches, top_p_floor, top_p_inside, top_p_stage, unfixed
from .stats import filter_of, histogrammed

# -2**31, the smallest order key, is written as a literal: a module-level constant is a plain int to
# the interpreter but must be a tl.constexpr object to the compiler, and no one spelling suits both.


@triton.jit
def _line_candidates(line, parts, cand_ptr, cand_count_ptr, PARTS: tl.constexpr, LINE_SLOTS: tl.constexpr):
    """(values, keys) of a line's candidates in its LINE_SLOTS slots, each part's quota of them
    (the scaled values, and their order keys, -2**31 in the slots no candidate fills: a value
    counts only where its key says so). The parts' slots are loaded with their counts, not after
    them (no load waits for a count: one dependent round trip fewer); the slots past a part's
    count hold an earlier call's values, or the workspace's zeros, and their keys are masked here."""
    line64 = line.to(tl.int64)
    quota = LINE_SLOTS // parts
    slots = tl.arange(0, LINE_SLOTS)
    slot_part = slots // quota
    used = tl.load(cand_count_ptr + line64 * PARTS + slot_part, mask=slot_part < parts, other=0)
    loaded = tl.load(cand_ptr + line64 * LINE_SLOTS + slots, mask=slot_part < parts, other=0.0)
    valid = (slot_part < parts) & (slots - slot_part * quota < used)
    return loaded, tl.where(valid, order_key(loaded), -2147483648)


@triton.jit
def _sorted_candidates(
    line, parts, cand_ptr, cand_count_ptr, cand_floor_ptr, sort_ptr, top_k, unsorted_below_k, row_max, unsorted_below_budget,
    PARTS: tl.constexpr, PP: tl.constexpr, LINE_SLOTS: tl.constexpr, SORT: tl.constexpr,
):
    """(keys, count, floor, sorted) of one line: the order keys of the ``count`` candidates above
    ``floor`` sorted in descending order in SORT slots (key -2**31 after them), ``count`` -1 when
    even the level-two floor leaves more than SORT. The candidates go through ``sort_ptr`` (the
    line's SORT slots of workspace) to be packed before the sort. Unsorted (``sorted`` False,
    keys all -2**31), as their search needs none of them (a sampled start's, see threshold_line):
    with ``unsorted_below_k``, fewer than ``top_k`` candidates (a top-k line they cannot settle);
    with ``unsorted_below_budget`` (a line cut by top-p alone: its budget, else 0), candidates
    whose mass falls short of it, or more than SORT (its sample takes their mass alone:
    ``_candidates_mass``)."""
    line64 = line.to(tl.int64)
    part = tl.arange(0, PP)
    present = part < parts
    floors = tl.load(cand_floor_ptr + (line64 * PARTS + part) * 2, mask=present, other=-2147483648)
    floors2 = tl.load(cand_floor_ptr + (line64 * PARTS + part) * 2 + 1, mask=present, other=-2147483648)
    floor = tl.max(floors, axis=0)
    floor2 = tl.max(floors2, axis=0)
    values, keys = _line_candidates(line, parts, cand_ptr, cand_count_ptr, PARTS, LINE_SLOTS)
    above = keys > floor
    count = tl.sum(above.to(tl.int32), axis=0)
    if count > SORT:
        floor = floor2
        above = keys > floor
        count = tl.sum(above.to(tl.int32), axis=0)
    fits = count <= SORT
    count = tl.where(fits, count, -1)
    packed = tl.arange(0, SORT)
    ordered = tl.full((SORT,), -2147483648, tl.int32)
    # (False: a budget is never negative; a test the compiler folds where the budget is 0, so a
    # call with no such line keeps its sort on every path)
    short = unsorted_below_budget < 0.0
    if unsorted_below_budget > 0.0:
        # Their mass, a float32 sum in any order, lies within SORT * 2**-24 of the sorted sum that
        # _line_threshold tests against the budget (the exponentials of the same values): short of
        # the budget with a margin of 2**-12, no line that test would settle is left unsorted.
        mass = tl.sum(tl.where(above, exp(values - row_max), 0.0), axis=0)
        short = (fits == 0) | (mass.to(tl.float64) * (1.0 + 2.0 ** -12) < unsorted_below_budget.to(tl.float64))
    sorts = ((unsorted_below_k == 0) | (count >= top_k)) & (short == 0)
    if sorts:
        place = before_here(above.to(tl.int32))
        tl.store(sort_ptr + line64 * SORT + place, keys, mask=above & (place < SORT))
        tl.debug_barrier()  # every thread's stores precede the loads below
        ordered = tl.sort(tl.load(sort_ptr + line64 * SORT + packed, mask=packed < count, other=-2147483648), descending=True)
    return ordered, count, floor.to(tl.int64), sorts


@triton.jit
def _candidates_mass(line, parts, cand_ptr, cand_count_ptr, floor, count, row_max, PARTS: tl.constexpr, LINE_SLOTS: tl.constexpr):
    """The fixed-point mass (``fixed_mass``) of a line's ``count`` candidates above ``floor``, 0
    when they are more than the sort takes (``count`` -1): an integer sum, the same in any order,
    sorted or not."""
    values, keys = _line_candidates(line, parts, cand_ptr, cand_count_ptr, PARTS, LINE_SLOTS)
    return tl.where(count >= 0, tl.sum(tl.where(keys > floor, fixed_mass(values, row_max), 0), axis=0), 0)


@triton.jit
def _line_mass(line, parts, part_m_ptr, part_z_ptr, PARTS: tl.constexpr, PP: tl.constexpr):
    """(max, mass relative to the max, bad) of a line from its statistics partials; bad: a NaN or
    +inf value, or no finite one."""
    part = tl.arange(0, PP)
    present = part < parts
    part_max = tl.load(part_m_ptr + line.to(tl.int64) * PARTS + part, mask=present, other=float("-inf"))
    part_sum = tl.load(part_z_ptr + line.to(tl.int64) * PARTS + part, mask=present, other=0.0)
    row_max = tl.max(part_max, axis=0)
    bad = (tl.max(((part_sum != part_sum) | (part_max == float("inf"))).to(tl.int32), axis=0) != 0) | (row_max == float("-inf"))
    line_mass = tl.sum(tl.where(part_max > float("-inf"), part_sum * exp(part_max - row_max), 0.0), axis=0)
    return row_max, line_mass, bad


@triton.jit
def _line_threshold(
    line, width, top_k, top_p, use_k, use_p, parts, part_m_ptr, part_z_ptr, cand_ptr, cand_count_ptr, cand_floor_ptr, sort_ptr, unsorted_below_k,
    unsorted_below_p, PARTS: tl.constexpr, PP: tl.constexpr, LINE_SLOTS: tl.constexpr, SORT: tl.constexpr,
):
    """(tau, resolved, m, z, stage, max_key, carried, lo, and the sorted candidates: keys, count,
    floor) of one active line (see the module docstring). When the cut lies among the sorted
    candidates (resolved) every kept value is one, so z = sum over the kept set of exp(s - m) comes
    from them; z is NaN for a line with NaN / +inf values or an empty one (the race blanks such a
    row). Otherwise stage (1: top-k, 2: top-p), carried (the top-p budget) and lo (the key the
    search starts from) start the whole-line search (select.py). A line its candidates cannot
    settle keeps them unsorted (_sorted_candidates): a top-k line with ``unsorted_below_k``, a
    line cut by top-p alone with ``unsorted_below_p``."""
    row_max, line_mass, bad = _line_mass(line, parts, part_m_ptr, part_z_ptr, PARTS, PP)
    max_key = order_key(row_max).to(tl.int64)

    p_budget = tl.where(unsorted_below_p & use_p & (use_k == 0), top_p * line_mass, 0.0)
    keys, count, floor, candidates_sorted = _sorted_candidates(line, parts, cand_ptr, cand_count_ptr, cand_floor_ptr, sort_ptr, top_k,
                                                           unsorted_below_k & use_k, row_max, p_budget, PARTS, PP, LINE_SLOTS, SORT)
    index = tl.arange(0, SORT)
    weights = tl.where(index < count, exp(key_to_float(keys) - row_max), 0.0)

    # top-k: the k-th largest value, when at least k candidates lie above the floor.
    k_key = tl.full((), -2147483648, tl.int64)
    stage = (top_k < 0).to(tl.int32)  # 0, as a runtime value like the ones assigned below
    resolved = top_k < 0  # False, likewise
    if use_k:
        resolved = count >= top_k
        if resolved:
            k_key = pick(keys, top_k - 1, SORT, -2147483648).to(tl.int64)
        else:
            stage = stage * 0 + 1
    carried = line_mass * 0.0  # no budget: top-k decides on counts

    # top-p: the smallest value whose strictly-greater mass (inside top-k) is below top_p * mass:
    # the last sorted candidate whose mass before it is below the budget.
    tau_key = k_key
    lo = tl.full((), -2147483648, tl.int64)  # every key is at or above it
    if use_p & (stage == 0):
        inside = tl.where(keys >= k_key, weights, 0.0)
        kept_mass = tl.where(use_k, tl.sum(inside, axis=0), line_mass)
        budget = top_p * kept_mass
        before = before_here(inside)
        # The cut is among the candidates when their whole mass reaches the budget (the first value
        # below the floor has that mass before it); a settled top-k set is all candidates.
        resolved = (count >= 0) & candidates_sorted & (use_k | (tl.sum(inside, axis=0) >= budget))
        if resolved:
            keep = tl.maximum(tl.sum(((before < budget) & (index < count)).to(tl.int32), axis=0), 1)
            tau_key = tl.maximum(pick(keys, keep - 1, SORT, -2147483648).to(tl.int64), k_key)
        else:
            stage = stage * 0 + 2  # over the whole line, from the floor no cut lies under
            carried = budget
            lo = top_p_floor(row_max, line_mass, budget, width)
    stage = tl.where(bad, 0, stage)  # a line with NaN / +inf values or none finite: no search (the race blanks its row)
    tau = tl.where(tau_key == -2147483648, float("-inf"), key_to_float(tau_key.to(tl.int32)))
    normaliser = tl.sum(tl.where(keys >= tau_key, weights, 0.0), axis=0)
    return tau, resolved & (bad == 0), row_max, tl.where(bad, float("nan"), normaliser), stage, max_key, carried, lo, keys, count, floor


@triton.jit
def _raw_value(key, inv_t, is_draft, TDTYPE: tl.constexpr, DDTYPE: tl.constexpr):
    """The scaled value of raw key ``key`` in a 16-bit line: of the draft's dtype when ``is_draft``,
    else of the target's."""
    value = inv_t * 0.0
    if TDTYPE.primitive_bitwidth == 16:
        value = raw_scaled(key, inv_t, TDTYPE)
    if DDTYPE.primitive_bitwidth == 16:
        value = tl.where(is_draft, raw_scaled(key, inv_t, DDTYPE), value)
    return value


@triton.jit
def _mass_above_window(keys, count, floor, hi, inv_t, row_max, is_draft, TDTYPE: tl.constexpr, DDTYPE: tl.constexpr, SORT: tl.constexpr):
    """The fixed-point mass of a 16-bit line's values with raw key above ``hi``, from its sorted
    candidates (the ``count`` keys above ``floor``), or -1 when they may not hold every such value.
    They do when the lowest value above hi, raw key hi + 1's, lies above the floor (every value
    above it is a candidate) and strictly above hi's own (a candidate's value then tells whether
    its raw key is above hi). The weights are the integers the search's pass would sum
    (select.py's fixed_mass of the same scaled values), so the sum is the same, in any order."""
    top = hi >= 32767
    low_above = _raw_value(tl.minimum(hi + 1, 32767), inv_t, is_draft, TDTYPE, DDTYPE)
    first_key = order_key(low_above).to(tl.int64)
    index = tl.arange(0, SORT)
    mass = tl.sum(tl.where((index < count) & (keys.to(tl.int64) >= first_key), fixed_mass(key_to_float(keys), row_max), 0), axis=0)
    covered = (count >= 0) & (_raw_value(hi, inv_t, is_draft, TDTYPE, DDTYPE) < low_above) & (first_key > floor)
    return tl.where(top, 0, tl.where(covered, mass, -1))


@triton.jit
def _line_window(line, parts, window_ptr, PARTS: tl.constexpr, PP: tl.constexpr):
    """(counts, first key, usable) of a 16-bit line's top window (stats.py): the counts of raw keys
    first .. first + 254 in slots 0 .. 254, summed over the line's parts. Part p counted the keys
    a_p - 254 .. a_p (its top key a_p, stored after them) and had none above a_p, so it counted
    every key from a_p - 254 up; the line's window ends at the largest a_p, from which every part
    counted. Not usable when a part had a value above its window (its top key stored as -2**31)."""
    part = tl.arange(0, PP)
    present = part < parts
    own = (line.to(tl.int64) * PARTS + part) * 256
    tops = tl.load(window_ptr + own + 255, mask=present, other=-32768)
    usable = tl.max((present & (tops == -2147483648)).to(tl.int32), axis=0) == 0
    top = tl.max(tl.where(present, tops, -32768), axis=0)
    slots = tl.arange(0, 256)
    index = (top - tops)[:, None] + slots[None, :]  # part p's slot of key top - 254 + j
    # (usable as a vector: the interpreter's masks must not mix a scalar bool in)
    read = present & ((tl.zeros((PP,), tl.int32) + usable.to(tl.int32)) != 0)
    counts = tl.sum(tl.load(window_ptr + own[:, None] + index, mask=read[:, None] & (index <= 254), other=0), axis=0)
    return counts, top - 254, usable


@triton.jit
def _raw_top_k_start(
    best, top_k, top_p, use_p, inv_t, row_max, max_key, is_draft, window, first, usable, keys, count, floor, tau, normaliser, carried,
    TDTYPE: tl.constexpr, DDTYPE: tl.constexpr, SORT: tl.constexpr, KEY_WINDOW: tl.constexpr,
):
    """Where a 16-bit line's top-k goes after its statistics' counts (``best``, the highest byte of
    its raw keys whose count from there up reaches k): (stage, lo, hi, path, known mass, top-k key,
    resolved, tau, normaliser, budget). With KEY_WINDOW, ``window``, ``first`` and ``usable`` are
    its parts' top windows (``_line_window``); ``keys``, ``count`` and ``floor`` its sorted
    candidates (count -1: none sorted, as for a line whose window holds k values).

    * With KEY_WINDOW, when its top window holds k values (their counts exact per key): the cut
      is the scaled value of the highest key whose count from there up reaches k, the kept set
      every key of the window whose value reaches it, each of mass its count times its weight
      (select.py's fixed-point weights, the search's own integers). The line is then settled
      (resolved), or top-p inside that set starts (select.py's stage 7 ending), or, when the key
      below the window scales to the cut's value too (those values kept, but not counted here),
      one pass over that scaled key finds the set (stage 1).
    * Otherwise the counts take the search's first pass: stage 7 over the single raw keys of the
      cut's byte, whose mass above the candidates may give (``_mass_above_window``).
    * The counts are not used when a part had a value above its window (its scaled max
      underflowed): the search then starts from the line.

    With KEY_WINDOW the statistics test no value: -inf (an fp16's in byte 3, with a ragged
    tile's padding) and logits that 1 / temperature scales to -inf are counted at their own keys,
    below every value the search counts. A byte only they push over k holds fewer than k values
    the search counts from there up, and its pass over single keys ends with no finite cut, as
    the reference's; in the window they weigh nothing, and a cut at their value (fewer than k
    others) keeps every value, the window's mass being the line's."""
    bins = tl.arange(0, 256)
    settles = top_k < 0  # False, as a runtime value
    path = top_k.to(tl.int32) * 0 + 7  # recorded as the first pass would record itself (a pass that only counted)
    if KEY_WINDOW:
        values = _raw_value(tl.minimum(tl.maximum(first + bins, -32768), 32767), inv_t, is_draft, TDTYPE, DDTYPE)
        window_from = from_here(window)
        settles = usable & (pick(window_from, 0, 256, 0) >= top_k)
    lo = best.to(tl.int64) * 256 - 32768
    hi = lo + 255
    stage = path * 0 + 7
    known_mass = _mass_above_window(keys, count, floor, hi, inv_t, row_max, is_draft, TDTYPE, DDTYPE, SORT)
    k_key = tl.full((), -2147483648, tl.int64)
    resolved = settles & (top_k < 0)  # False, as a runtime value
    if KEY_WINDOW:
        if settles:
            at = tl.max(tl.where(window_from >= top_k, bins, 0), axis=0)
            cut_value = _raw_value(first + at, inv_t, is_draft, TDTYPE, DDTYPE)
            kept = values >= cut_value
            kept_mass = tl.sum(tl.where(kept, window.to(tl.int64) * fixed_mass(values, row_max), 0), axis=0)
            k_key = order_key(cut_value).to(tl.int64)
            path = path * 0  # no pass: the counts are the line's
            known_mass = known_mass * 0 - 1
            lo = k_key
            hi = k_key
            stage = stage * 0 + 1
            if (first <= -32768) | (_raw_value(tl.maximum(first - 1, -32768), inv_t, is_draft, TDTYPE, DDTYPE) < cut_value):
                stage = stage * 0
                resolved = stage == 0
                tau = cut_value
                normaliser = unfixed(kept_mass).to(tl.float32)
                if use_p:
                    carried, lo, hi, stage = top_p_inside(k_key, kept_mass, tl.sum(tl.where(kept, window, 0), axis=0), row_max, top_p, max_key)
                    resolved = stage == 0
        elif usable == 0:
            stage = stage * 0 + 1
            lo = lo * 0 - 2147483648
            hi = max_key
            path = path * 0
            known_mass = known_mass * 0 - 1
    return stage, lo, hi, path, known_mass, k_key, resolved, tau, normaliser, carried


@triton.jit
def _reaching(budget):
    """The smallest fixed-point mass F that reaches ``budget`` (select.py's reaches: float64(F) *
    2**-40 >= budget), so that a mass reaches it exactly when F >= it: an integer comparison. The
    budget times 2**40 is a float64 of 24 significant bits: its ceiling is representable; below it,
    only a mass above 2**53 can round up to reach it, by at most 8 units (a mass is below 2**57)."""
    least = tl.math.ceil(budget.to(tl.float64) * 1099511627776.0).to(tl.int64)
    for _ in tl.static_range(8):  # (each step down by one unit while the mass below still reaches)
        least = tl.where(reaches(least - 1, budget), least - 1, least)
    return least


@triton.jit
def _window_step(row, first, lo, zero_bin, zero_span, row_max, inv_t, DTYPE: tl.constexpr, BINS: tl.constexpr, STEP: tl.constexpr):
    """Top-p window bins first .. first + STEP - 1 (``row``: the line's counts): (the bins, their
    keys (the merged bin's lowest), their scaled values, their fixed-point masses: each bin's count
    times its key's weight; the last bin, of the values outside the window, none)."""
    bins = first + tl.arange(0, STEP)
    keys = lo + bins + tl.where(bins > zero_bin, zero_span, 0)
    values = raw_scaled(tl.minimum(keys, 32767), inv_t, DTYPE)
    counts = tl.load(row + bins, mask=bins < BINS - 1, other=0)
    return bins, keys, values, counts.to(tl.int64) * fixed_mass(values, row_max)


@triton.jit
def _top_p_window_cut(line, budget, row_max, inv_t, top_p_window_ptr, DTYPE: tl.constexpr, BINS: tl.constexpr, STEP: tl.constexpr):
    """(settled, tau, kept mass) of a bf16 line cut by top-p alone from its statistics' top-p
    window (stats.py's ``top_p_window``: each bin one raw key, or the keys near 0 that weigh the
    same). Every value of a raw key has the same mass, so each bin's mass is its count times its
    weight (select.py's fixed-point weights, the search's own integers) and the mass from each key
    up is exact: the cut is the value of the highest key whose mass from there up reaches the
    budget, as the search's. The steps of STEP bins are summed from the top until the mass reaches
    it; that step alone is then scanned. Settled only when the statistics counted the window (lo not
    -2**31), it holds the cut in a bin of one key (not the merged keys' bin), no value lies above
    it, the merged keys' s - max are one float, and no key below the cut's step scales to the
    cut's value (the kept set is then the window's from there up, and the mass above it)."""
    row = top_p_window_ptr + line.to(tl.int64) * (BINS + 4)
    lo = tl.load(row + BINS)
    zero_lo = tl.load(row + BINS + 1)
    zero_span = tl.load(row + BINS + 2)
    zero_bin = zero_lo - lo
    top = lo + (BINS - 2) + zero_span
    counted = lo != -2147483648
    least = tl.full((), 0, tl.int64)
    found = lo * 0 - 1  # the first bin of the step holding the cut, -1 until found
    above = tl.full((), 0, tl.int64)  # the mass of the bins above the current step
    if counted:
        least = _reaching(budget)
        for step in range(0, BINS // STEP):
            if found < 0:
                first = (BINS // STEP - 1 - step) * STEP
                _, _, _, mass = _window_step(row, first, lo, zero_bin, zero_span, row_max, inv_t, DTYPE, BINS, STEP)
                total = tl.sum(mass, axis=0)
                if above + total >= least:
                    found = first
                else:
                    above += total
    # That step's scan, the highest bin whose mass from there up reaches the budget: a loop of one
    # trip at most (none when no step holds the cut), which only a window that holds it runs.
    best = found
    cut_value = row_max * 0.0
    kept_mass = above
    apart = counted
    for first in range(tl.maximum(found, 0), found + 1, STEP):
        bins, keys, values, mass = _window_step(row, first, lo, zero_bin, zero_span, row_max, inv_t, DTYPE, BINS, STEP)
        best = tl.max(tl.where(from_here(mass) + above >= least, bins, -1), axis=0)
        cut_value = tl.max(tl.where(bins == best, values, float("-inf")), axis=0)
        kept_mass = above + tl.sum(tl.where(values >= cut_value, mass, 0), axis=0)
        # The key below the step's lowest (in the window or below it) lies below the cut's value.
        lowest = tl.min(keys, axis=0)
        apart = (lowest <= -32768) | (raw_scaled(tl.maximum(lowest - 1, -32768), inv_t, DTYPE) < cut_value)
    same_weight = (raw_scaled(zero_lo, inv_t, DTYPE) - row_max) == (raw_scaled(zero_lo + zero_span, inv_t, DTYPE) - row_max)
    none_above = (top >= 32767) | (raw_scaled(tl.minimum(top + 1, 32767), inv_t, DTYPE) > row_max)
    # (a cut in the merged keys' bin is the least of them present, which the counts do not tell)
    single = (best != zero_bin) | (zero_span == 0)
    settled = counted & (found >= 0) & (best >= 0) & single & same_weight & none_above & apart
    return settled, cut_value, kept_mass


@triton.jit
def _top_p_window_start(line, is_draft, budget, row_max, inv_t, top_p_window_ptr, TDTYPE: tl.constexpr, DDTYPE: tl.constexpr, BINS: tl.constexpr,
                        STEP: tl.constexpr):
    """``_top_p_window_cut`` of a target or draft line, in its own dtype (False for a line that is not bf16)."""
    settled = is_draft & (budget < 0.0)  # False, as a runtime value
    cut_value = row_max * 0.0
    kept_mass = tl.full((), 0, tl.int64)
    if TDTYPE == tl.bfloat16:
        if is_draft == 0:
            settled, cut_value, kept_mass = _top_p_window_cut(line, budget, row_max, inv_t, top_p_window_ptr, TDTYPE, BINS, STEP)
    if DDTYPE == tl.bfloat16:
        if is_draft:
            settled, cut_value, kept_mass = _top_p_window_cut(line, budget, row_max, inv_t, top_p_window_ptr, DDTYPE, BINS, STEP)
    return settled, cut_value, kept_mass


@triton.jit
def _isqrt(x):
    """floor(sqrt(x)) of a non-negative int64 below 2**24 (a float square root, then exact integer steps)."""
    r = tl.sqrt(x.to(tl.float32)).to(tl.int64)
    r = tl.where(r * r > x, r - 1, r)
    return tl.where((r + 1) * (r + 1) <= x, r + 1, r)


@triton.jit
def _sample(base, width, inv_t, RUNS: tl.constexpr, RUN: tl.constexpr):
    """A line's sample, scaled: RUNS runs of RUN consecutive ids, evenly spaced, (width - RUN) //
    (RUNS - 1) apart (the whole line when it is no longer; -inf past its end), as (RUNS, RUN)."""
    spread = width > RUNS * RUN
    step = tl.where(spread, (width - RUN) // (RUNS - 1), RUN)  # (int32: ids of the line)
    ids = (tl.arange(0, RUNS) * step)[:, None] + tl.arange(0, RUN)[None, :]
    return tl.load(base + ids, mask=ids < width, other=float("-inf")).to(tl.float32) * inv_t


@triton.jit
def _sample_weights(s, row_max, line_mass, budget, known, floor):
    """(weight, below, ref, total, rest, need) of a top-p line's sample ``s`` (scaled values): the sampled
    values at or below the candidates' ``floor`` (``below``: the others are candidates, whose mass
    ``known`` is exact) weigh, in units of 2**-17 of the floor value's weight (``ref``: the largest a
    sampled value may have; the max's when there is no floor), int32: 4096 of them sum below
    2**30, exactly in any order, with a compare, a select and an add a value and step (the estimate
    needs no finer); -inf and the others weigh 0. An estimate of the mass from a point up,
    known + (line_mass - known) * (the sample's weight from there up) / (its total weight), reaches
    ``budget`` when that weight times ``rest`` reaches ``need`` (float64, fixed point: the same
    decisions in any order of the sums)."""
    finite = (floor > -2139095041) & (floor < 2139095040)  # (between -inf's key and +inf's: a floor value)
    ref = tl.where(finite, key_to_float(tl.where(finite, floor, 0).to(tl.int32)), row_max)
    ref = tl.where(ref < row_max, ref, row_max)
    below = (order_key(s).to(tl.int64) <= floor) & (s > float("-inf"))
    weight = tl.where(below, (exp(tl.minimum(s, ref) - ref) * 131072.0).to(tl.int32), 0)
    total = tl.sum(tl.sum(weight, axis=0), axis=0)
    rest = line_mass.to(tl.float64) * 1099511627776.0 - known.to(tl.float64)
    need = (budget.to(tl.float64) * 1099511627776.0 - known.to(tl.float64)) * total.to(tl.float64)
    return weight, below, ref, total, rest, need


@triton.jit
def _sampled_top_k_lo(base, width, inv_t, top_k, GATHER: tl.constexpr, RUNS: tl.constexpr, RUN: tl.constexpr, DIGITS: tl.constexpr):
    """(lo, usable): a top-k gather's lo placed from a sample of the line, RUNS runs of RUN
    consecutive ids evenly spaced, (width - RUN) // (RUNS - 1) apart (the whole line when it is no
    longer). lo is the sample's r-th largest order key floored to its 16 high bits, r the values
    isqrt(top_k * GATHER) (the geometric middle of [top_k, GATHER]) would be in the sample (top_k
    when the sample is the line); usable when the sample has r finite values. Only a guess: the
    gather's exact count decides (select.py's stage 4), so no cut depends on it. DIGITS: found by
    two byte histograms (where tl.histogram is shared-memory atomics), else by 16 halvings."""
    spread = width > RUNS * RUN
    s = _sample(base, width, inv_t, RUNS, RUN)
    high = tl.where(s > float("-inf"), order_key(s) >> 16, -32769)  # the keys' 16 high bits (-inf: below them all)
    rank = tl.where(spread, (_isqrt(top_k * GATHER) * (RUNS * RUN) + width - 1) // width, top_k).to(tl.int32)
    # The largest prefix p with at least rank sampled keys from p * 2**16 up (-2**15 when none has).
    if DIGITS:
        low = _largest_bucket_reaching(high, rank, RUNS * RUN)
    else:
        low = rank * 0 - 32768
        top = rank * 0 + 32767
        for _ in range(16):  # (halvings of [-2**15, 2**15))
            middle = (low + top + 1) >> 1
            reached = tl.sum(tl.sum((high >= middle).to(tl.int32), axis=0), axis=0) >= rank
            low = tl.where(reached, middle, low)
            top = tl.where(reached, top, middle - 1)
    # (no finite value's key lies in bucket -2**15, which holds NaNs' keys: the prefix rises above it
    # exactly when r finite values were sampled)
    return low.to(tl.int64) << 16, low > -32768


@triton.jit
def _largest_bucket_reaching(high, rank, N: tl.constexpr):
    """The largest bucket p in [-2**15, 2**15) with at least ``rank`` of a sample's buckets ``high``
    (N of them, as (runs, run); -32769: none) from p up, -2**15 when fewer are present: scan.py's
    largest_reaching over two bytes."""
    return largest_reaching(tl.maximum(tl.reshape(high, (N,)), -32768), rank, 2)  # (none: the lowest bucket)


@triton.jit
def _sampled_top_p_window(base, width, inv_t, row_max, line_mass, budget, known, floor, DTYPE: tl.constexpr, RUNS: tl.constexpr,
                          RUN: tl.constexpr):
    """(first, usable): a 16-bit top-p line's raw window (select.py's stage 8: 256 single raw keys
    from ``first``) centred on the cut a sample of the line estimates (the runs of
    ``_sampled_top_k_lo``). Above the candidates' ``floor`` the mass is ``known`` (fixed point:
    every value there is a candidate); of the rest, ``line_mass`` (the statistics') less that,
    the share at or above a raw key r is the sample's: the weights of its values at or below the
    floor from r's weight up, over all of them (integer weights: exact sums, compared in float64,
    the same decisions in any summation order). The cut's estimate is the largest r whose
    estimated mass from there up reaches ``budget`` (16 halvings). usable: the sample has values
    below the floor, and no raw key below the window scales to its first key's value (as
    _raw_window requires). Only a guess: the window's exact masses decide whether it holds the
    cut, and a window that does not narrows the bracket (select.py)."""
    INF_KEY: tl.constexpr = 32640 if DTYPE == tl.bfloat16 else 31744  # +inf's raw key (-inf's: -INF_KEY - 1)
    s = _sample(base, width, inv_t, RUNS, RUN)
    weight, below, ref, total, rest, need = _sample_weights(s, row_max, line_mass, budget, known, floor)
    low = width * 0 - INF_KEY - 1
    top = low * 0 + INF_KEY
    for _ in range(16):  # the largest raw key in [low, top] whose estimated mass from there up reaches the budget
        middle = (low + top + 1) >> 1
        value = raw_scaled(middle, inv_t, DTYPE)
        at = (exp(tl.minimum(value, ref) - ref) * 131072.0).to(tl.int32)  # (none above the floor's: 2**17)
        at = tl.where(value > row_max, 2147483647, at)  # (above the line max: no value, no mass)
        reached = tl.sum(tl.sum(tl.where(weight >= at, weight, 0), axis=0), axis=0).to(tl.float64) * rest >= need
        low = tl.where(reached, middle, low)
        top = tl.where(reached, top, middle - 1)
    first = tl.minimum(tl.maximum(low - 127, -INF_KEY - 1), INF_KEY - 255)
    apart = (first <= -INF_KEY - 1) | (raw_scaled(tl.maximum(first - 1, -INF_KEY - 1), inv_t, DTYPE) < raw_scaled(first, inv_t, DTYPE))
    return first.to(tl.int64), (total > 0) & apart


@triton.jit
def _sampled_top_p_gather(base, width, inv_t, row_max, line_mass, budget, known, floor, bracket_lo, max_key, GATHER: tl.constexpr,
                          RUNS: tl.constexpr, RUN: tl.constexpr, DIGITS: tl.constexpr):
    """(lo, hi, usable): a 32-bit top-p line's first gather (select.py's stage 5 over the order keys
    [lo, hi]) placed around the cut a sample of the line estimates (the runs of
    ``_sampled_top_k_lo``), in buckets of 2**16 keys (the keys' 16 high bits, a bf16's precision).
    The estimate is ``_sampled_top_p_window``'s, over the buckets: the largest bucket whose
    estimated mass from there up reaches ``budget``. The window then takes the cut's bucket and,
    either side, the buckets whose values the sample estimates at most half of the rest of 3/4 of
    GATHER (a sampled value stands for width / (sampled values) of the line's): about 3/4 of the
    slots in all. Its bounds stay within [``bracket_lo``, the floor, ``max_key``]. usable: the
    sample has values below the floor, and the cut's bucket alone is estimated at most 3/8 of the
    slots. Only a guess: the gather's exact count and masses decide whether it holds the cut, and
    one that does not narrows the bracket (select.py). DIGITS: the window's bounds found by byte
    histograms (where tl.histogram is shared-memory atomics), else by 16 halvings each."""
    s = _sample(base, width, inv_t, RUNS, RUN)
    weight, below, ref, total, rest, need = _sample_weights(s, row_max, line_mass, budget, known, floor)
    high = tl.where(below, order_key(s) >> 16, -32769)  # (a value above the floor, or -inf: below every bucket)
    low = width * 0 - 32768
    top = low * 0 + 32767
    for _ in range(16):  # the largest bucket whose estimated mass from there up reaches the budget
        middle = (low + top + 1) >> 1
        reached = tl.sum(tl.sum(tl.where(high >= middle, weight, 0), axis=0), axis=0).to(tl.float64) * rest >= need
        low = tl.where(reached, middle, low)
        top = tl.where(reached, top, middle - 1)
    cut = low
    # The line's values a bucket range holds, estimated: sampled counts times width / sampled.
    per_sampled = width.to(tl.float64) / tl.minimum(width, RUNS * RUN).to(tl.float64)
    at_cut = tl.sum(tl.sum((high >= cut).to(tl.int32), axis=0), axis=0)
    past_cut = tl.sum(tl.sum((high > cut).to(tl.int32), axis=0), axis=0)
    # Each side takes half of 3/4 of the slots less the cut's bucket, which may itself hold more (a
    # line of bf16 values upcast: one value a bucket, often repeated): such a line is not sampled.
    in_bucket = (at_cut - past_cut).to(tl.float64) * per_sampled
    quota = (GATHER * 0.75 - in_bucket) * 0.5
    if DIGITS:
        # The same bounds from the most estimated values a side may take: d values fit when
        # d * per_sampled <= quota, the most such d (-1 when none) from a division and one step
        # either way (the products rounded as the halvings' are).
        most = tl.floor(quota / per_sampled).to(tl.int64)
        most = tl.where((most + 1).to(tl.float64) * per_sampled <= quota, most + 1, most)
        most = tl.where(most.to(tl.float64) * per_sampled <= quota, most, most - 1)
        most = tl.maximum(most, -1)
        present = tl.sum(tl.sum((high >= -32768).to(tl.int32), axis=0), axis=0)
        # first: one above the largest bucket with more than at_cut + most sampled from it up.
        beyond = (at_cut + most + 1).to(tl.int32)
        first_top = tl.where(present >= beyond, _largest_bucket_reaching(high, beyond, RUNS * RUN) + 1, -32768)
        first_top = tl.minimum(first_top, cut)
        # past: the largest bucket with at least past_cut - most sampled from it up.
        needed = (past_cut - most).to(tl.int32)
        past = tl.where(needed <= 0, 32768, tl.maximum(_largest_bucket_reaching(high, tl.maximum(needed, 1), RUNS * RUN), cut + 1))
    else:
        first = cut * 0 - 32768  # the lowest bucket with at most quota estimated values from it to the cut's
        first_top = cut
        past = cut + 1  # the highest bucket with at most quota estimated values above the cut's bucket and below it
        past_top = cut * 0 + 32768
        for _ in range(16):
            middle = (first + first_top) >> 1
            fits = (tl.sum(tl.sum((high >= middle).to(tl.int32), axis=0), axis=0) - at_cut).to(tl.float64) * per_sampled <= quota
            first_top = tl.where(fits, middle, first_top)
            first = tl.where(fits, first, middle + 1)
            middle = (past + past_top + 1) >> 1
            fits = (past_cut - tl.sum(tl.sum((high >= middle).to(tl.int32), axis=0), axis=0)).to(tl.float64) * per_sampled <= quota
            past = tl.where(fits, middle, past)
            past_top = tl.where(fits, past_top, middle - 1)
    lo = tl.maximum(first_top.to(tl.int64) << 16, bracket_lo)
    hi = tl.minimum((past.to(tl.int64) << 16) - 1, max_key)
    return lo, hi, (total > 0) & (lo <= hi) & (in_bucket <= GATHER * 0.375)


@triton.jit
def _sampled_top_p_start(base, width, inv_t, row_max, line_mass, budget, known, floor, bracket_lo, max_key, DTYPE: tl.constexpr, GATHER: tl.constexpr,
                         RUNS: tl.constexpr, RUN: tl.constexpr, DIGITS: tl.constexpr):
    """(lo, hi, usable) of a top-p line's first pass placed from a sample: a 16-bit line's raw
    window (``_sampled_top_p_window``: 256 raw keys from lo), a 32-bit line's gather
    (``_sampled_top_p_gather``: order keys)."""
    if DTYPE.primitive_bitwidth == 16:
        lo, usable = _sampled_top_p_window(base, width, inv_t, row_max, line_mass, budget, known, floor, DTYPE, RUNS, RUN)
        hi = lo + 255
    else:
        lo, hi, usable = _sampled_top_p_gather(base, width, inv_t, row_max, line_mass, budget, known, floor, bracket_lo, max_key, GATHER, RUNS, RUN,
                                               DIGITS)
    return lo, hi, usable


@triton.jit
def threshold_line(
    line, target_ptr, draft_ptr, tau_ptr, part_m_ptr, part_z_ptr, state_ptr, state_f_ptr, progress_ptr, searching_ptr, search_list_ptr,
    temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, cand_ptr, cand_count_ptr, cand_floor_ptr, sort_ptr, hist_ptr, window_ptr,
    top_p_window_ptr, batch, K, V, Vd, t_stride_b, t_stride_k, d_stride_b, d_stride_k, t_parts, d_parts,
    HAS_DRAFT: tl.constexpr, PARTS: tl.constexpr, PP: tl.constexpr, LINE_SLOTS: tl.constexpr, SORT: tl.constexpr, HISTOGRAM_TOP_K: tl.constexpr,
    GATHER: tl.constexpr, WINDOW_GATHER: tl.constexpr, KEY_WINDOW: tl.constexpr, TOP_P_BINS: tl.constexpr, TOP_P_STEP: tl.constexpr, SAMPLE_RUNS: tl.constexpr,
    SAMPLE_RUN: tl.constexpr, DIGIT_SELECT: tl.constexpr,
):
    """The cut-off of one line from its candidates (cutoffs.py's first work items): tau and, when
    the candidates settle it, the line's statistics; otherwise a search state, the line appended
    to the whole-line search list (which writes its statistics when the search ends). The outputs
    are described at cutoff_kernel's arguments. A line whose statistics counted its keys
    (``histogrammed``: TDTYPE, DDTYPE are the target's and the draft's logits' dtypes) takes the
    counts, leaving zeros: a top-k search then starts as its first pass would leave it, and the
    line is read once less. A 16-bit line's second pass, over single raw keys, then only counts
    when the candidates hold every value above its keys: their mass, which that pass would sum,
    comes from them (``_mass_above_window``, in the state's words 4 and 5; -1 otherwise). With
    KEY_WINDOW its parts' top windows may settle the cut with no pass and no sort (``_raw_top_k_start``).
    With SAMPLE_RUNS (where ``tl.histogram`` is warp ballots, Triton 3.6 and 3.7, and for a call
    whose lines are all 32-bit, which no key window counts), a top-k line its candidates leave,
    whose k no statistics counted and fits half the gather's slots, starts its search with a gather
    placed from a sample of the line (``_sampled_top_k_lo``): one pass when the gather holds the
    cut, no histogram. Such a line leaves its candidates unsorted (they cannot settle it, and the
    search needs none of them): the sort is about a third of its item's instructions. A 16-bit
    line cut by top-p alone that its candidates leave starts with a raw window placed from a
    sample (``_sampled_top_p_window``), a 32-bit one in a call of 32-bit lines with a gather
    (``_sampled_top_p_gather``): one pass, with no value bins, when it holds the cut. Its
    candidates too stay unsorted when their mass, an integer sum in any order, falls short of the
    budget (the sample needs only that mass). Target and
    draft lines of one dtype run one copy of each sample's code (from either's row): a second
    copy's loop-invariant values, kept on the stack, doubled the launch's prologue. DIGIT_SELECT
    (where tl.histogram is shared-memory atomics): a sample's counted ranks by byte histograms,
    not 16 halvings (the same bounds)."""
    TDTYPE: tl.constexpr = target_ptr.dtype.element_ty
    DDTYPE: tl.constexpr = draft_ptr.dtype.element_ty
    T16: tl.constexpr = TDTYPE.primitive_bitwidth == 16
    D16: tl.constexpr = DDTYPE.primitive_bitwidth == 16
    row, pos, is_draft, width, inv_t, top_k, top_p, use_k, use_p, active = filter_of(
        line, batch * (K + 1), K, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, V, Vd
    )
    parts = tl.where(is_draft, d_parts, t_parts)
    tau = float("-inf")
    resolved = active & (tau > 0.0)  # False, as a runtime value
    row_max = float("-inf")
    normaliser = 0.0
    stage = resolved.to(tl.int32)  # 0: no whole-line search
    max_key = tl.full((), -2147483648, tl.int64)
    carried = 0.0
    lo = tl.full((), -2147483648, tl.int64)
    hi = max_key
    path = stage * 0  # no pass yet
    known_mass = tl.full((), -1, tl.int64)  # not known
    start_k_key = tl.full((), -2147483648, tl.int64)  # the top-k key (none yet)
    bracket_lo = tl.full((), -2147483648, tl.int64)  # a sampled raw window's bracket: [bracket_lo, the line max]
    state = state_ptr + line.to(tl.int64) * 8
    if active:
        # A line its statistics' windows may settle tries them first: the candidates are then
        # sorted only for a line they do not settle (either gives the same exact cut). The two
        # kinds take apart branches, each with its own sort, so that a line of one runs nothing
        # of the other.
        windowed = resolved  # False, as a runtime value
        sampled_route = resolved  # False: a line a sample may start (the top-k route, below)
        sampled_p = resolved  # False: a line cut by top-p alone that a sample would start (below)
        window = tl.zeros((256,), tl.int32)
        first = line * 0
        usable = line < 0  # (no window read)
        keys = tl.full((SORT,), -2147483648, tl.int32)  # (no candidates sorted)
        count = line * 0 - 1
        floor = tl.full((), -2147483648, tl.int64)
        top_p_route = resolved
        if TOP_P_BINS > 0:
            top_p_route = (parts == 1) & (use_k == 0) & use_p
        if top_p_route:
            # A bf16 line cut by top-p alone whose statistics counted its top-p window (stats.py):
            # its cut needs only the line's partials and the counts.
            if TOP_P_BINS > 0:
                row_max, line_mass, bad = _line_mass(line, parts, part_m_ptr, part_z_ptr, PARTS, PP)
                if bad == 0:
                    windowed, cut_value, kept_mass = _top_p_window_start(line, is_draft, top_p * line_mass, row_max, inv_t, top_p_window_ptr,
                                                                         TDTYPE, DDTYPE, TOP_P_BINS, TOP_P_STEP)
                    if windowed:
                        resolved = windowed
                        tau = key_to_float(order_key(cut_value))
                        normaliser = unfixed(kept_mass).to(tl.float32)
            if windowed == 0:
                tau, resolved, row_max, normaliser, stage, max_key, carried, lo, keys, count, floor = _line_threshold(
                    line, width, top_k, top_p, use_k, use_p, parts, part_m_ptr, part_z_ptr, cand_ptr, cand_count_ptr, cand_floor_ptr, sort_ptr,
                    sampled_route, sampled_p, PARTS, PP, LINE_SLOTS, SORT,
                )
                hi = max_key
        else:
            # A 16-bit line under a large top-k whose parts' top windows (stats.py) hold k values:
            # its cut comes from them (``_raw_top_k_start``).
            if KEY_WINDOW:
                if histogrammed(use_k, top_k, HISTOGRAM_TOP_K) & tl.where(is_draft, D16, T16):
                    window, first, usable = _line_window(line, parts, window_ptr, PARTS, PP)
                    if usable & (tl.sum(window, axis=0) >= top_k):
                        row_max, line_mass, bad = _line_mass(line, parts, part_m_ptr, part_z_ptr, PARTS, PP)
                        if bad == 0:
                            windowed = usable
                            stage = stage * 0 + 1
                            max_key = order_key(row_max).to(tl.int64)
            # A top-k line that a sample would start (below) needs no sorted candidates when they
            # cannot settle it: the sort is skipped.
            if SAMPLE_RUNS > 0:
                sampled_route = use_k & (histogrammed(use_k, top_k, HISTOGRAM_TOP_K) == 0) & (2 * top_k <= GATHER)
                # (likewise a top-p line's candidates, when their mass is short of the budget: they
                # cannot settle it, and its sample needs only their mass)
                sampled_p = use_p & (use_k == 0) & tl.where(is_draft, D16 | (T16 == D16), T16 | (T16 == D16))
            if windowed == 0:
                tau, resolved, row_max, normaliser, stage, max_key, carried, lo, keys, count, floor = _line_threshold(
                    line, width, top_k, top_p, use_k, use_p, parts, part_m_ptr, part_z_ptr, cand_ptr, cand_count_ptr, cand_floor_ptr, sort_ptr,
                    sampled_route, sampled_p, PARTS, PP, LINE_SLOTS, SORT,
                )
            hi = max_key
            if SAMPLE_RUNS > 0:
                # The line's row: a target's, or a draft's (where the two have one dtype, either's:
                # one copy of each sample's code, not one for each).
                t_base = target_ptr + row.to(tl.int64) * t_stride_b + pos.to(tl.int64) * t_stride_k
                d_base = draft_ptr + row.to(tl.int64) * d_stride_b + pos.to(tl.int64) * d_stride_k
                line_base = t_base
                if HAS_DRAFT & (TDTYPE == DDTYPE):
                    line_base = tl.where(is_draft, d_base, t_base)
                if (stage == 1) & sampled_route:
                    sample_lo = lo
                    usable = stage < 0  # False, as a runtime value
                    if TDTYPE == DDTYPE:
                        sample_lo, usable = _sampled_top_k_lo(line_base, width, inv_t, top_k, GATHER, SAMPLE_RUNS, SAMPLE_RUN, DIGIT_SELECT)
                    elif is_draft:
                        if HAS_DRAFT:
                            sample_lo, usable = _sampled_top_k_lo(d_base, width, inv_t, top_k, GATHER, SAMPLE_RUNS, SAMPLE_RUN, DIGIT_SELECT)
                    else:
                        sample_lo, usable = _sampled_top_k_lo(t_base, width, inv_t, top_k, GATHER, SAMPLE_RUNS, SAMPLE_RUN, DIGIT_SELECT)
                    if usable:
                        # A top-k gather of every key from the sample's lo up (select.py's stage 4): its
                        # exact count tells whether it holds the cut, and where to go on when not.
                        stage = stage * 0 + 4
                        lo = sample_lo
                        tl.store(state + 6, 0)  # the gather's slot counter
                # A line cut by top-p alone that its candidates leave: its first pass placed from a
                # sample of the line (half the top-k sample's runs, 16 at most: its weights stay in
                # registers beside the item's state). In a call of 16-bit lines a 16-bit line's
                # raw window (select.py's stage 8, no ballot histogram), in a call of 32-bit lines
                # (vLLM's) a gather (stage 5), either one pass when it holds the cut; the bracket
                # [lo, the line max] that value bins would take is kept for one that does not. (A
                # kind samples when it is 16-bit, or when no line of the call is: T16 == D16.)
                TOP_P_RUNS: tl.constexpr = 16 if SAMPLE_RUNS >= 32 else (SAMPLE_RUNS // 2 if SAMPLE_RUNS >= 4 else SAMPLE_RUNS)
                if (stage == 2) & tl.where(is_draft, D16 | (T16 == D16), T16 | (T16 == D16)):
                    row_max, line_mass, bad = _line_mass(line, parts, part_m_ptr, part_z_ptr, PARTS, PP)
                    # (the candidates' mass, 0 when more than the sort takes: the sample alone; read
                    # again, from L2: unsorted, they are no longer at hand)
                    known = _candidates_mass(line, parts, cand_ptr, cand_count_ptr, floor, count, row_max, PARTS, LINE_SLOTS)
                    sample_floor = tl.where(count >= 0, floor, 2147483647)
                    start_lo = lo
                    start_hi = hi
                    usable = stage < 0  # False, as a runtime value
                    if TDTYPE == DDTYPE:
                        start_lo, start_hi, usable = _sampled_top_p_start(line_base, width, inv_t, row_max, line_mass, carried, known, sample_floor, lo,
                                                                          max_key, TDTYPE, WINDOW_GATHER, TOP_P_RUNS, SAMPLE_RUN, DIGIT_SELECT)
                    elif is_draft:
                        if HAS_DRAFT & D16:
                            start_lo, start_hi, usable = _sampled_top_p_start(d_base, width, inv_t, row_max, line_mass, carried, known, sample_floor, lo,
                                                                              max_key, DDTYPE, WINDOW_GATHER, TOP_P_RUNS, SAMPLE_RUN, DIGIT_SELECT)
                    else:
                        if T16:
                            start_lo, start_hi, usable = _sampled_top_p_start(t_base, width, inv_t, row_max, line_mass, carried, known, sample_floor, lo,
                                                                              max_key, TDTYPE, WINDOW_GATHER, TOP_P_RUNS, SAMPLE_RUN, DIGIT_SELECT)
                    if usable:
                        bracket_lo = lo
                        stage = tl.where(tl.where(is_draft, D16, T16), 8, 5)
                        lo = start_lo
                        hi = start_hi
                        tl.store(state + 6, 0)  # (a gather's slot counter)
            if histogrammed(use_k, top_k, HISTOGRAM_TOP_K):
                bins = tl.arange(0, 256)
                counts = tl.load(hist_ptr + line.to(tl.int64) * 256 + bins, cache_modifier=".cg")
                tl.store(hist_ptr + line.to(tl.int64) * 256 + bins, tl.zeros((256,), tl.int32))  # for the next call (and graph replay)
                if stage == 1:
                    # The search's first top-k pass (select.py), from the statistics' counts: the cut
                    # lies in the highest bin whose count from there up reaches k (bin 0 qualifies),
                    # and the next pass takes that bin's keys. A 16-bit line's bins are its raw keys'
                    # high byte (stage 7 from [-32768, 32767]), a float32 line's 2**24 order keys from
                    # -2**31 (stage 1 over [-2**31, the line max]; a gather next when the values from
                    # the bin up fit).
                    count_from = from_here(counts)
                    best = tl.max(tl.where(count_from >= top_k, bins, 0), axis=0)
                    path = path + 7  # recorded as that pass would record itself (a pass that only counted)
                    if tl.where(is_draft, D16, T16):
                        stage, lo, hi, path, known_mass, start_k_key, resolved, tau, normaliser, carried = _raw_top_k_start(
                            best, top_k, top_p, use_p, inv_t, row_max, max_key, is_draft, window, first, usable, keys, count, floor, tau,
                            normaliser, carried, TDTYPE, DDTYPE, SORT, KEY_WINDOW,
                        )
                    else:
                        lo = (best.to(tl.int64) << 24) - 2147483648
                        hi = tl.minimum(lo + 16777215, max_key)
                        if pick(count_from, best, 256, 0) <= GATHER:
                            stage = stage * 0 + 4
                            hi = max_key
                            tl.store(state + 6, 0)  # the gather's slot counter
    tl.store(tau_ptr + line, tau)
    # Top-p over the whole line: value bins then a gather, or exact key bins (select.py).
    top_p_start = top_p_stage(lo, max_key)
    stage = tl.where(stage == 2, tl.where(top_p_start == 0, 3, top_p_start), stage)
    tl.store(state, stage)
    if stage != 0:
        # The order of the list does not matter: each line's search is the same whichever
        # programs take its chunks.
        tl.store(search_list_ptr + tl.atomic_add(searching_ptr, 1, sem="relaxed"), line)
        tl.store(state + 1, lo.to(tl.int32))  # lo: at or below the cut
        tl.store(state + 2, hi.to(tl.int32))  # hi: the line max (a raw key's after the counts)
        tl.store(state + 3, start_k_key.to(tl.int32))  # the top-k key (none yet, unless the window settled it)
        # The mass above a raw window (top-p's bracket later; a sampled start's from the start).
        tl.store(state + 4, tl.where((stage == 8) | (stage == 5), bracket_lo, known_mass).to(tl.int32))
        tl.store(state + 5, tl.where((stage == 8) | (stage == 5), max_key, known_mass >> 32).to(tl.int32))
        tl.store(state + 7, path)  # the passes taken (4 bits each)
        tl.store(state_f_ptr + line.to(tl.int64) * 2, row_max)
        tl.store(state_f_ptr + line.to(tl.int64) * 2 + 1, carried)
        tl.store(progress_ptr + line, 0)  # no search pass finished yet
    if resolved:
        slot = line.to(tl.int64) * PARTS + tl.arange(0, PP)
        first = tl.arange(0, PP) == 0
        tl.store(part_m_ptr + slot, tl.where(first, row_max, float("-inf")), mask=tl.arange(0, PP) < parts)
        tl.store(part_z_ptr + slot, tl.where(first, normaliser, 0.0), mask=tl.arange(0, PP) < parts)
