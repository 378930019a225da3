"""The whole-line top-k / top-p search, split across programs: histograms of the line, then a
gather of the few values around the cut.

``threshold_line`` (thresholds.py) settles a line's cut from its candidates when it can (or from
the statistics' windows: a bf16 top-p line's from 64 lines up, stats.py). When it cannot (a
large top-k, a flat distribution under top-p) it leaves the line a search state instead
(``state``: a stage, an interval [lo, hi] of order keys, the top-k key, a bracket, a gather's count,
the passes taken; ``state_f``: the line max and the top-p budget). Each search pass reads the line
once: its work items are the line's chunks (``search_item``), taken by any program of
``cutoff_kernel`` (cutoffs.py) once the line's previous pass has finished; the last item of a pass
to arrive (an atomic counter, reset afterwards) plans the next pass and publishes it
(``progress``). The stages:

1. top-k: the values with key in [lo, hi] counted in BINS bins of 2**shift keys (``tl.histogram``,
   in the program), the count of those above hi summed in registers. The cut lies in the highest
   bin whose count from there up reaches k: the interval narrows 256-fold. Only a pass whose top
   bin is one key can end the search; it alone also sums the fixed-point mass above hi (the kept
   set's normaliser, and top-p's budget inside the top-k set). The others decide by counts.
   Once the values at or above lo number at most GATHER, the next pass gathers them (stage 4).
   Under a top-k above HISTOGRAM_TOP_K the statistics launch counted the first pass, in bins of
   2**24 keys from -2**31, as it read the line (stats.py); the threshold item takes that pass's
   decision from the counts (thresholds.py) and the search starts at the second, one read fewer.
2. top-p, first pass: the values in [lo, hi] counted in BINS bins uniform in value (lo is a floor
   no cut lies under, ``top_p_floor``; hi the line max). Each bin's mass, estimated at its middle,
   places the cut to within a bin or two; the widest run of bins around it whose values fit half
   the gather's slots is gathered next (stage 5). When not even the three bins around it fit, the
   nine around it are binned again once (stage 6, the same way), or (no room) stage 3 takes [lo, hi].
3. top-p over key bins with exact masses (each binned value's mass added by an integer atomic
   into the item's slice): the interval narrows 256-fold per pass, the last over single keys.
4. / 5. gather: the values with key in [lo, hi] are written to the line's slots (a slot each,
   from an atomic counter, a lane's values a run of them from one atomic where the compiler keeps
   its column in registers: GATHER for top-k, WINDOW_GATHER for a top-p window, twice as many
   where ranks are by byte histograms) while those above hi are summed (count and mass); the
   last item finds the cut exactly: top-k's as the k-th largest gathered key, a byte at a time
   by histograms where they are shared-memory atomics (scan.py's ``largest_reaching``), else
   from the keys sorted; top-p's inside the top-k set (which the gathered values hold whole), or
   a window's, when it does hold it (the mass above lo reaches the budget, the mass above hi
   does not), by halvings on integer sums of the keys' masses (``_top_p_cut``, no sort), or
   from the sorted keys where those are sorted (Triton 3.6 and 3.7). A window that does not
   hold it, or that held more values than slots, narrows the bracket it was drawn from (stage
   2's interval), and stage 3 finishes the search.
   A top-k gather may also come first, its lo placed from a sample of the line by the threshold
   item (thresholds.py, where tl.histogram is warp ballots, or for a call of 32-bit lines): when
   fewer than k values lie from lo up, or more than GATHER, stage 1 goes on below lo (a 16-bit
   line over its raw keys, stage 7 from the start) or over [lo, the line max]. Fewer than k from
   -inf's key or below are every finite value of a line that has fewer than k: its top-k set.
   A top-p gather may come first too, in a call of 32-bit lines (vLLM's), placed around the cut a
   sample of the line estimates (thresholds.py's _sampled_top_p_gather): one pass when it holds the
   cut; when not, value bins go on over the side that does (stage 2 above it, 6 below it).
7. top-k of a bf16 or fp16 line: stage 1 over the raw keys of its logits' bits (``raw_key``),
   whose order is the scaled values': 256 bins of the high byte, then single keys. Under a top-k
   above HISTOGRAM_TOP_K the statistics launch counted the high bytes as it read the line
   (stats.py) and the threshold item takes the first pass's decision from those counts
   (thresholds.py): the search starts at the single keys, one read of the line fewer; that pass
   only counts when the candidates hold every value above its keys (the threshold item sums
   their mass from them, the integers the pass would add). When the statistics also counted the
   single keys of the line's top window and those hold k values, the threshold item settles the
   cut itself, with no pass (thresholds.py's _raw_top_k_start). The cut is then the scaled value of
   its raw key, unless the raw key below scales to the same value (-0.0 below +0.0, or an
   underflow or overflow merged them): one pass of stage 1 over that single scaled key then
   counts the kept set whole.
8. top-p of a bf16 or fp16 line, after a value-bin pass: a window of 256 single raw keys over the
   bins that can hold the cut (``_cut_bins``: bounds on each bin's mass from the weights at its
   edges) when it covers them (``_raw_window``), else, unless a gather reaches further, over the
   estimated bin and the two either side when it covers those; counted in one bin each while the
   mass above it is summed. Every value of a raw key has the same mass, so the counts give each
   key's mass exactly: the cut is found in the window, however many values it holds (no gather,
   no slots to overflow), or the window misses it and the bracket narrows as after a gather
   (stage 3 then). (No key below the window scales to its first key's value, so the kept set's
   mass is the window's from the cut's value up, and the mass above it.)
   A raw window may also come first, placed from a sample of the line by the threshold item
   (thresholds.py, where tl.histogram is warp ballots): one pass when it holds the cut; when not,
   value bins go on over the side that does (stage 2 above it, 6 below it), as the line would
   have started. There, a call whose lines are all 16-bit counts a window's values by global
   atomics (``_atomic_raw_window``): a ballot histogram would bin every value of the line.

Top-k ends within four passes (the fourth over single keys, or a gather; a 16-bit line's within
three), top-p within eight (a sampled raw window or gather, value bins twice, a gather, then at
most four of stage 3), both within eleven (PASSES). Masses
are exact integers wherever a decision reads them, so the cut is the one key the fixed-point
masses define, however the search went: the tokens are the eager reference's.
A finished search writes the cut with the kept set's statistics (the line max, the kept mass), so
no launch reads the line again for them; items of a line whose search has ended exit at once.
bench.gpu_model.select_search follows these passes in numpy (the GPU model counts them; the tests
check the kernel takes them).
"""

import triton
import triton.language as tl

from .random import bits_scaled, exp, key_to_float, order_key, raw_bits_reaching, raw_key, raw_scaled
from .scan import before_here, from_here, largest_reaching
from .stats import line_of

# Masses are summed in fixed point: exp(s - line max) <= 1 times 2**40, as int64 (exact for every
# weight above 2**-17; a line of 2**23 values cannot overflow). Integer sums do not depend on the
# order of the additions: the atomics, the register sums and the sums over chunks are
# deterministic. As the kept set's normaliser (>= 1: the max's own weight), the truncation of each
# weight to 2**-40 costs at most V * 2**-40 relative (1.2e-7 at V = 131072): a float32 sum's own
# rounding. 2**40 and its inverse are written as literals (see thresholds.py on module constants).
# A mass F compares with a budget as float64(F) * 2**-40 >= budget, wherever it is decided.

# The state of a line: 8 int32 (stage, lo, hi, top-k key, bracket lo, bracket hi, gathered, the passes taken: 4 bits each).


@triton.jit
def fixed_mass(s, row_max):
    """exp(s - row_max) in units of 2**-40, 0 for -inf and NaN."""
    return tl.where(s > float("-inf"), exp(s - row_max) * 1099511627776.0, 0.0).to(tl.int64)


@triton.jit
def fixed_mass_where(s, row_max, keep):
    """fixed_mass(s, row_max) where ``keep`` (finite values: no -inf test), else 0: the exponent is
    -inf where not kept (the same integers; one float select, not two on the 64-bit integer)."""
    return (exp(tl.where(keep, s - row_max, float("-inf"))) * 1099511627776.0).to(tl.int64)


@triton.jit
def unfixed(mass):
    """A fixed-point mass in units of the max's weight, as float64."""
    return mass.to(tl.float64) * 9.094947017729282e-13


@triton.jit
def reaches(mass, budget):
    """Whether a fixed-point mass reaches a budget (float32, in units of the max's weight)."""
    return unfixed(mass) >= budget.to(tl.float64)


@triton.jit
def top_p_floor(row_max, mass, budget, n):
    """An order key at or below the top-p cut of a set of at most n values of mass ``mass`` (in
    units of its max's weight, >= 1) under ``budget``, or -2**31 when no floor is known. The cut
    leaves more than mass - budget at or below it, at most exp(cut - max) per value, so
    cut > max + ln((mass - budget) / n). The margins: 1e-4 of the mass (the statistics' float sums
    against the search's fixed-point ones, both within 1e-6), 0.01 plus 2**-20 of |max| on the
    value (approximate log and exp, three roundings)."""
    spare = mass - budget - 1e-4 * mass
    t = row_max + tl.log(tl.maximum(spare, 1e-30) / n.to(tl.float32)) - 0.01 - tl.abs(row_max) * 9.5367431640625e-07
    return tl.where((spare > 0.0) & (t > float("-inf")), order_key(t).to(tl.int64), -2147483648)


@triton.jit
def top_p_inside(k_key, kept_mass, kept_count, row_max, top_p, top):
    """Top-p inside a settled top-k set (fixed-point mass ``kept_mass``, ``kept_count`` values from
    ``k_key`` up): (budget, lo, hi, stage): top_p times the set's mass, searched over [k_key, the
    line max ``top``] from above the floor no cut lies under."""
    top_k_mass = unfixed(kept_mass).to(tl.float32)
    budget = top_p * top_k_mass
    lo = tl.maximum(k_key, top_p_floor(row_max, top_k_mass, budget, kept_count))
    return budget, lo, top, top_p_stage(lo, top)


@triton.jit
def top_p_stage(lo, hi):
    """The stage a top-p search over [lo, hi] starts in: 2 (value bins, then a gather) over a
    finite floor and a wide interval, 3 (exact key bins) otherwise, 0 when [lo, hi] is one key."""
    return tl.where(lo >= hi, 0, tl.where((lo > -2139095041) & (hi - lo >= 65536), 2, 3))


@triton.jit
def _tile_values(base, first, width, TILE: tl.constexpr, SCATTERED: tl.constexpr, LANES: tl.constexpr = 0):
    """The logits of ids first .. first + TILE - 1 (-inf from ``width``). SCATTERED, a tile whose
    values go to atomics of their own (a mass histogram's masses; a gather's or a raw window's
    where the lines are not aligned): loaded one value a lane, as those atomics hold them, so that
    no value changes lanes. Two things make the compiler choose that layout: the ids form a
    (TILE, 1) column (it gives every access of one shape in a kernel the widest vector
    among them, and the kernel's 1-D loads of TILE keys take four a lane), and the tile starts at
    ``first | (width >> 31)``, first at run time (a width is positive) but of an alignment it
    cannot prove. A warp still reads 32 consecutive values, from one base with constant offsets.
    Loaded in vectors as a 1-D tile, the values would go to the atomics' layout through shared
    memory: 6 barriers a tile (tests/support/triton_compile_check.py's ``converted_scatters``).
    LANES (a gather's lane runs, a raw window's vectors): the tile as TILE // LANES rows of LANES
    ids; SCATTERED, the same way, each lane a column; else from ``first`` as it is, each lane a
    row (a 16-byte vector where LANES values fill one and the lines are aligned: search_item's
    VECTOR_LINES)."""
    if LANES > 0:
        start = (first | (width >> 31)) if SCATTERED else first
        ids = (tl.arange(0, TILE // LANES)[:, None] * LANES + tl.arange(0, LANES)[None, :]).to(tl.int64)
        x = tl.load(base + start + ids, mask=ids < width - start, other=float("-inf"))
    elif SCATTERED:
        start = first | (width >> 31)
        ids = tl.arange(0, TILE)[:, None].to(tl.int64)
        x = tl.reshape(tl.load(base + start + ids, mask=ids < width - start, other=float("-inf")), (TILE,))
    else:
        ids = first + tl.arange(0, TILE)
        x = tl.load(base + ids, mask=ids < width, other=float("-inf"))
    return x


@triton.jit
def _tile(base, first, width, inv_t, lo32, hi32, TILE: tl.constexpr, RAW: tl.constexpr = False, t0=0.0, t1=0.0, VALUE: tl.constexpr = False,
          TOP: tl.constexpr = False, FINITE: tl.constexpr = True, SCATTERED: tl.constexpr = False):
    """A tile's scaled values (of TILE ids from ``first``: ``_tile_values``), their order keys
    (with RAW the keys of the 16-bit logits' bits), which finite ones have a key in [lo, hi] and
    which above hi (keys in 32 bits: key - lo wraps to the right unsigned offset, hi - lo <
    2**32). With VALUE (value bins, whose lo is a finite floor) the same tests on the values, lo's
    and hi's (t0, t1): the key's order is theirs, -0.0 and +0.0 alike, and a finite floor leaves
    -inf out; no key (zeros). TOP: hi is the line max, which no value lies above (VALUE: no test
    against it). FINITE=False (keys): no finite test, a value -inf once scaled is inside or above
    by its key (a top-p raw window, where it weighs 0)."""
    x = _tile_values(base, first, width, TILE, SCATTERED)
    s = x.to(tl.float32) * inv_t
    if VALUE:
        key = tl.zeros((TILE,), tl.int32)
        if TOP:
            inside = s >= t0
            above = s > float("inf")  # none
        else:
            inside = (s >= t0) & (s <= t1)
            above = s > t1
    else:
        if RAW:
            key = raw_key(x, x.dtype == tl.bfloat16)
        else:
            key = order_key(s)
        reached = key >= lo32
        if FINITE:
            reached = reached & (s > float("-inf"))
        inside = reached & (key <= hi32)
        above = reached & (key > hi32)
    return s, key, inside, above


@triton.jit
def _histogram(base, first, span, width, inv_t, row_max, lo, hi, shift, t0, scale, mass_ptr, TILE: tl.constexpr,
               BINS: tl.constexpr, MASSES: tl.constexpr, VALUE_BINS: tl.constexpr, ABOVE: tl.constexpr, RAW: tl.constexpr = False):
    """The item's finite values (``span`` from ``first``) with key in [lo, hi] counted in BINS bins: of 2**shift keys from
    lo, or with VALUE_BINS of 1 / scale in value from t0; with MASSES their fixed-point masses also
    added by atomics into the item's zeroed slice. Returns (the counts, the count and the
    fixed-point mass of the keys above hi). ABOVE: 0, hi is the line max (none above); 1, the
    count only (the mass returned is 0: a pass that reads none); 2, both; 3, the mass only, of a
    top-p pass over raw keys (stage 8), whose decisions read no count: values -inf once scaled are
    counted at their keys, whose weight is 0, and the count above hi is 0. (MASSES sums the mass.)
    RAW: keys of the 16-bit logits' bits (stages 7 and 8)."""
    shift32 = shift.to(tl.uint32)
    counts = tl.zeros((BINS,), tl.int32)
    # The keys above hi, summed per lane: one reduction after the loop, not one per tile.
    above_count = tl.zeros((TILE,), tl.int32)
    above_mass = tl.zeros((TILE,), tl.int64)
    t_hi = key_to_float(hi.to(tl.int32))  # (value bins: t0 is lo's value)
    for start in range(0, span, TILE):
        s, key, inside, above = _tile(base, first + start, width, inv_t, lo.to(tl.int32), hi.to(tl.int32), TILE, RAW, t0, t_hi, VALUE_BINS,
                                      ABOVE == 0, ABOVE != 3, MASSES)
        if VALUE_BINS:
            bins = tl.minimum(tl.maximum(((s - t0) * scale).to(tl.int32), 0), BINS - 1)
        else:
            bins = ((key - lo.to(tl.int32)).to(tl.uint32, bitcast=True) >> shift32).to(tl.int32)
        bins = tl.where(inside, bins, 0)
        counts += tl.histogram(bins, BINS, mask=inside)
        if (ABOVE == 1) | (ABOVE == 2):
            above_count += above.to(tl.int32)
        if MASSES:
            mass = fixed_mass(s, row_max)
            above_mass += tl.where(above, mass, 0)
            tl.atomic_add(mass_ptr + bins, mass, mask=inside, sem="relaxed")
        elif ABOVE > 1:
            above_mass += fixed_mass_where(s, row_max, above)  # (a value above hi is finite)
    return counts, tl.sum(above_count, axis=0), tl.sum(above_mass, axis=0)


@triton.jit
def _atomic_raw_window(base, first, span, width, inv_t, row_max, lo, count_ptr, TILE: tl.constexpr, VECTORS: tl.constexpr):
    """A raw window's pass (stage 8: the 256 single raw keys from ``lo`` of a 16-bit line) where
    tl.histogram is warp ballots (SAMPLE_RUNS), which would bin every value of the line: each value
    inside adds its count by a global atomic into the item's zeroed slice ``count_ptr`` (a few of
    the line's values), those above sum their fixed-point mass in registers. Returns that mass
    (values -inf once scaled weigh 0 wherever their keys fall). Each value stays in the lane that
    loaded it: a lane's 16-byte vector where the lines allow such loads (VECTORS), else one value
    (``_tile_values``)."""
    COLUMNS: tl.constexpr = 128 // base.dtype.element_ty.primitive_bitwidth if VECTORS else 1  # values in a lane's 16-byte load
    above_mass = tl.zeros((TILE // COLUMNS, COLUMNS), tl.int64)
    for start in range(0, span, TILE):
        x = _tile_values(base, first + start, width, TILE, COLUMNS == 1, COLUMNS)
        offset = raw_key(x, x.dtype == tl.bfloat16) - lo.to(tl.int32)  # (a bf16's from its float32 bits, which the mass needs too)
        tl.atomic_add(count_ptr + offset, 1, mask=offset.to(tl.uint32, bitcast=True) < 256, sem="relaxed")
        above_mass += fixed_mass_where(x.to(tl.float32) * inv_t, row_max, offset > 255)
    return tl.sum(tl.sum(above_mass, axis=1), axis=0)


@triton.jit
def _key_histogram(base, first, span, width, inv_t, row_max, lo, hi, shift, raw, TILE: tl.constexpr, BINS: tl.constexpr, ABOVE: tl.constexpr,
                   RAW16: tl.constexpr):
    """A top-k pass's key bins (``_histogram``, no masses): of a 16-bit line's raw keys where
    ``raw`` (stage 7; RAW16: the line is bf16 or fp16), else of the scaled values' keys."""
    if RAW16:
        if raw:
            counts, above_count, above_mass = _histogram(base, first, span, width, inv_t, row_max, lo, hi, shift, 0.0, 0.0, base, TILE, BINS, False,
                                                         False, ABOVE, True)
        else:
            counts, above_count, above_mass = _histogram(base, first, span, width, inv_t, row_max, lo, hi, shift, 0.0, 0.0, base, TILE, BINS, False,
                                                         False, ABOVE)
    else:
        counts, above_count, above_mass = _histogram(base, first, span, width, inv_t, row_max, lo, hi, shift, 0.0, 0.0, base, TILE, BINS, False,
                                                     False, ABOVE)
    return counts, above_count, above_mass


@triton.jit
def _gather(base, first, span, width, inv_t, row_max, lo, hi, gathered_ptr, keys_ptr, TILE: tl.constexpr, GATHER: tl.constexpr,
            ABOVE: tl.constexpr, RAW: tl.constexpr = False, LANE_SLOTS: tl.constexpr = True, VECTORS: tl.constexpr = True):
    """The item's finite values (``span`` from ``first``) with key in [lo, hi] written to the line's
    GATHER key slots (a slot each from the line's counter; those past GATHER only counted); returns
    the fixed-point mass of the keys above hi (with ABOVE; without, hi is the line max: none). RAW
    (a 16-bit line's top-k gather, hi the line max): ``lo`` is the lowest raw key of the set
    (``_raw_floor``); a value's bits are tested by one unsigned range (``raw_bits_reaching``) and
    written as they are (``_resolve`` scales the few gathered).
    A lane takes its values' slots with one atomic on the line's counter (the sum of its values
    inside), a run from the slot it returns, so that no value changes lanes between the loads, the
    atomic and the stores. LANE_SLOTS (Triton 3.8 and later, DIGIT_SELECT's versions): a tile is
    TILE // 256 rows of 256 ids, each lane holding a column of it (``_tile_values``). Triton 3.6
    and 3.7 would move those columns through shared memory (6 barriers a tile), and 3.9 would move
    a vector's: there a lane holds the values of its 16-byte load (rows of COLUMNS ids), its run
    along the row, where the lines allow such loads (VECTORS: search_item's VECTOR_LINES), else
    one value (a run of one: an atomic a value inside)."""
    if LANE_SLOTS:
        COLUMNS: tl.constexpr = 256 if TILE >= 256 else TILE  # (a power of two, as TILE)
        RUN_AXIS: tl.constexpr = 0
        RUNS: tl.constexpr = COLUMNS
        SCATTERED: tl.constexpr = True  # (each lane a column)
    else:
        COLUMNS: tl.constexpr = 128 // base.dtype.element_ty.primitive_bitwidth if VECTORS else 1  # values in a lane's 16-byte load
        RUN_AXIS: tl.constexpr = 1
        RUNS: tl.constexpr = TILE // COLUMNS
        SCATTERED: tl.constexpr = COLUMNS == 1  # (a column of one value a lane)
    counter = gathered_ptr + tl.zeros((RUNS,), tl.int32)
    above_mass = tl.zeros((TILE // COLUMNS, COLUMNS), tl.int64)
    # A searched line's values are finite or -inf (statistics with NaN or +inf end its search),
    # and -inf's key, -2139095041, lies below both bounds: no test of the values for -inf.
    lo_finite = tl.maximum(lo, -2139095040).to(tl.int32)
    hi_finite = tl.maximum(hi, -2139095041).to(tl.int32)
    bits_from, bits_span = raw_bits_reaching(lo.to(tl.int32))
    for start in range(0, span, TILE):
        x = _tile_values(base, first + start, width, TILE, SCATTERED, COLUMNS)
        if RAW:  # (bf16 or fp16)
            key = x.to(tl.uint16, bitcast=True).to(tl.int32)  # (its bits)
            inside = (key - bits_from).to(tl.uint32, bitcast=True) <= bits_span
        else:
            s = x.to(tl.float32) * inv_t
            key = order_key(s)
            inside = (key >= lo_finite) & (key <= hi.to(tl.int32))
            if ABOVE:
                above_mass += fixed_mass_where(s, row_max, key > hi_finite)
        ones = inside.to(tl.int32)
        taken = tl.sum(ones, axis=RUN_AXIS)  # (in the lane's registers)
        lane_first = tl.atomic_add(counter, taken, mask=taken > 0, sem="relaxed")
        slot = tl.expand_dims(lane_first, RUN_AXIS) + tl.cumsum(ones, axis=RUN_AXIS) - 1  # (where inside)
        tl.store(keys_ptr + slot, key, mask=inside & (slot < GATHER))
    return tl.sum(tl.sum(above_mass, axis=1), axis=0)


@triton.jit
def _raw_floor(lo, inv_t, DTYPE: tl.constexpr):
    """The lowest raw key of a 16-bit line whose scaled value is finite with an order key >= lo
    (32768: none). Scaling keeps the raw keys' order (it only merges), so the values from that raw
    key up are exactly those a gather from lo takes."""
    low = lo.to(tl.int32) * 0 - 32768
    top = low + 65536
    while low < top:  # (17 halvings; a loop, not unrolled: only a gather's items run it)
        middle = (low + top) >> 1
        s = raw_scaled(middle, inv_t, DTYPE)
        reached = (s > float("-inf")) & (order_key(s) >= lo)
        top = tl.where(reached, middle, top)
        low = tl.where(reached, low, middle + 1)
    return low


@triton.jit
def _shift(lo, hi):
    """BINS = 256 bins of 2**shift keys cover [lo, hi]: shift = max(bit length of hi - lo, 8) - 8."""
    bits = tl.arange(0, 32).to(tl.int64)
    return tl.sum((((hi - lo) >> (bits + 8)) > 0).to(tl.int64), axis=0)


@triton.jit
def _top_k_may_end(lo, hi, shift):
    """Whether a top-k pass over [lo, hi] in bins of 2**shift keys can end the search: only when
    its top bin is one key (shift 0, or hi - lo a multiple of 2**shift), whose pass must then
    sum the exact mass above hi (the kept set's normaliser). Any other pass's decision reads counts."""
    return ((hi - lo) & ((tl.full((), 1, tl.int64) << shift) - 1)) == 0


@triton.jit
def pick(values, index, n: tl.constexpr, other):
    """values[index] of a vector of n slots (other when index is outside)."""
    return tl.max(tl.where(tl.arange(0, n) == index, values, other), axis=0)


@triton.jit
def _narrow(counts, masses, lo, hi, shift, row_max, stage, budget, top_k, inv_t, BINS: tl.constexpr, RAW16: tl.constexpr, DTYPE: tl.constexpr):
    """The bin of [lo, hi] holding the cut, and F(x) at each bin's first key (counts; fixed-point
    masses where exact: stage 3's, the keys above hi, a bin of one key). Both searches look for
    the largest key x with F(x) >= target, lo qualifying: top-k with F = count(key >= x) and
    target k; top-p with F = mass(key >= x) and target the budget. Slot BINS holds the keys above hi.
    (Stages 7 and 8's keys are a 16-bit line's raw keys: RAW16, of DTYPE.)"""
    slots = tl.arange(0, 2 * BINS)
    is_above = slots == BINS
    first = lo + (slots.to(tl.int64) << shift)
    w_first = fixed_mass(key_to_float(first.to(tl.int32)), row_max)
    if RAW16:
        raw_first = tl.minimum(tl.maximum(first, -32768), 32767)  # (slots past the window: any key)
        w_first = tl.where((stage == 7) | (stage == 8), fixed_mass(raw_scaled(raw_first, inv_t, DTYPE), row_max), w_first)
    bin_mass = tl.where((stage == 3) | is_above, masses, counts.to(tl.int64) * w_first)
    count_from = from_here(counts)
    mass_from = from_here(bin_mass)
    in_window = slots < ((hi - lo) >> shift) + 1
    ok = tl.where((stage == 1) | (stage == 7), count_from >= top_k, reaches(mass_from, budget)) & in_window
    best = tl.max(tl.where(ok, slots, 0), axis=0)  # bin 0 (lo) qualifies by assumption
    return best, count_from, mass_from


@triton.jit
def _window(first_bin, last_bin, lo, hi, t0, scale, BINS: tl.constexpr):
    """The keys of value bins [first_bin, last_bin] within [lo, hi] (the outer bins reach lo and hi)."""
    window_lo = tl.where(first_bin > 0, order_key(t0 + first_bin.to(tl.float32) / scale).to(tl.int64), lo)
    window_hi = tl.where(last_bin < BINS - 1, order_key(t0 + (last_bin + 1).to(tl.float32) / scale).to(tl.int64), hi)
    window_lo = tl.minimum(tl.maximum(window_lo, lo), hi)
    return window_lo, tl.maximum(tl.minimum(window_hi, hi), window_lo)


@triton.jit
def _cut_bins(counts, above_mass, t0, scale, row_max, budget, BINS: tl.constexpr):
    """After a value-bin pass: the lowest and the highest bin that can hold the cut. A bin's values
    lie between its edges, so its mass lies between its count times the weights at them (fixed
    point, as each value's own); the cut's bin, the highest whose mass from there up (with the
    exact mass above hi) reaches the budget, is at least the highest whose lower bound reaches it
    and at most the highest whose upper bound does. (Within the rounding of the binning and of
    exp near an edge: a window takes a bin more either side, and checks itself exactly.) The
    counts come in 2 * BINS slots, the value bins first."""
    slots = tl.arange(0, 2 * BINS)
    in_bins = slots < BINS
    low = tl.where(in_bins, counts.to(tl.int64) * fixed_mass(t0 + tl.math.div_rn(slots.to(tl.float32), scale), row_max), 0)
    high = tl.where(in_bins, counts.to(tl.int64) * fixed_mass(t0 + tl.math.div_rn((slots + 1).to(tl.float32), scale), row_max), 0)
    low_from = from_here(low) + above_mass
    high_from = from_here(high) + above_mass
    first = tl.max(tl.where(reaches(low_from, budget) & in_bins, slots, 0), axis=0)
    last = tl.max(tl.where(reaches(high_from, budget) & in_bins, slots, 0), axis=0)
    return first, last


@triton.jit
def _logit_key(s, inv_t, DTYPE: tl.constexpr):
    """The raw key of the 16-bit logit nearest scaled value ``s`` (a bf16's rounded down)."""
    logit = tl.math.div_rn(s, inv_t)
    if DTYPE == tl.bfloat16:
        return raw_key(logit, True)  # (the high half of its float32 bits)
    else:
        return raw_key(logit.to(tl.float16), False)


@triton.jit
def _raw_window(first_bin, last_bin, t0, scale, inv_t, row_max, k_key, DTYPE: tl.constexpr, BINS: tl.constexpr):
    """A 16-bit line's window of 256 single raw keys (stage 8) over value bins [first_bin, last_bin]
    (bins of 1 / scale from t0) and one bin more either side, centred on them: its first raw key,
    and whether its values do cover them (up to the line max), with none below the top-k key
    ``k_key`` (whose set the masses are of; else the window starts at the bins' low edge) and none
    sharing its first key's value with a key below it. Divisions rounded as IEEE, as the GPU
    model's."""
    INF_KEY: tl.constexpr = 32640 if DTYPE == tl.bfloat16 else 31744  # +inf's raw key (-inf's: -INF_KEY - 1)
    low_edge = tl.where(first_bin >= 1, t0 + tl.math.div_rn((first_bin - 1).to(tl.float32), scale), t0)
    high_edge = tl.where(last_bin + 2 < BINS, t0 + tl.math.div_rn((last_bin + 2).to(tl.float32), scale), row_max)
    key_low = _logit_key(low_edge, inv_t, DTYPE) - 1
    key_high = _logit_key(tl.minimum(high_edge, row_max), inv_t, DTYPE) + 1
    first = tl.minimum(tl.maximum(((key_low + key_high) >> 1) - 127, -32768), 32767 - 255)
    low = raw_scaled(tl.maximum(first, -INF_KEY - 1), inv_t, DTYPE)
    if order_key(low) < k_key:
        first = tl.minimum(tl.maximum(key_low, -32768), 32767 - 255)
        low = raw_scaled(tl.maximum(first, -INF_KEY - 1), inv_t, DTYPE)
    high = raw_scaled(tl.minimum(first + 255, INF_KEY), inv_t, DTYPE)
    # No raw key below the window scales to its first key's value (-0.0 below +0.0, an underflow):
    # each value of the window then has all its raw keys in it or above it.
    below = raw_scaled(tl.maximum(first - 1, -INF_KEY - 1), inv_t, DTYPE)
    apart = (first <= -INF_KEY - 1) | (below < low)
    covers = (low <= low_edge) & (high >= tl.minimum(high_edge, row_max)) & (order_key(low).to(tl.int64) >= k_key) & apart
    return first.to(tl.int64), covers


@triton.jit
def _plan(counts, above_mass, t0, scale, row_max, budget, BINS: tl.constexpr, GATHER: tl.constexpr):
    """After a value-bin pass: (the bin estimated to hold the cut, the widest radius of bins
    around it whose values fit GATHER // 2 slots, -1 when not even that bin's do). A bin's mass is
    estimated as its count times the weight at its middle (the mass above hi is exact); the cut's
    bin is the highest whose estimated mass from there up reaches the budget, give or take a few.
    Half the slots leave room for the window's edges, which keys set, not bins. (The counts come
    in 2 * BINS slots, the value bins first.)"""
    slots = tl.arange(0, 2 * BINS)
    middle = t0 + (slots.to(tl.float32) + 0.5) / scale
    estimate = tl.where(slots < BINS, counts.to(tl.float64) * fixed_mass(middle, row_max).to(tl.float64), 0.0)
    estimate_from = from_here(estimate) + above_mass.to(tl.float64)
    cut_bin = tl.max(tl.where((estimate_from * 9.094947017729282e-13 >= budget.to(tl.float64)) & (slots < BINS), slots, 0), axis=0)
    # The values within each distance of the cut's bin: both sides' bins at that distance, summed up.
    down = cut_bin - slots
    up = cut_bin + slots
    at_distance = tl.where(down >= 0, tl.gather(counts, tl.maximum(down, 0), axis=0), 0)
    at_distance += tl.where((slots > 0) & (up < BINS), tl.gather(counts, tl.minimum(up, BINS - 1), axis=0), 0)
    within = tl.cumsum(at_distance, axis=0)
    radius = tl.max(tl.where((within <= GATHER // 2) & (slots < BINS), slots, -1), axis=0)
    return cut_bin, radius


@triton.jit
def _top_p_cut(keys, weights, present, above_mass, budget):
    """Top-p's cut among gathered keys (``present``, any order, with their fixed-point weights),
    with no sort: (cut, kept mass, found). The cut is the key the keys sorted in descending order
    give (``_sorted_top_p_cut``): the last whose mass before it (``above_mass`` and every earlier
    key's weight) is below ``budget``, the first key when none is. That is the smallest present
    key whose mass strictly above it falls short of the budget (a tie's first copy has exactly
    that mass before it), so halvings of [the lowest present key, the highest + 1] on integer
    sums find it exactly. found: the keys reach the budget and the first is below it (a window
    that holds the cut)."""
    lo = tl.min(tl.where(present, keys, 2147483647), axis=0).to(tl.int64)
    top = tl.max(tl.where(present, keys, -2147483648), axis=0)
    hi = top.to(tl.int64) + 1  # (the mass above it: above_mass alone; +inf's key + 1 fits 32 bits)
    while lo < hi:  # (the bit length of the keys' span: about 20 halvings for a window of buckets)
        middle = (lo + hi) >> 1
        short = ~reaches(above_mass + tl.sum(tl.where(keys > middle.to(tl.int32), weights, 0), axis=0), budget)
        hi = tl.where(short, middle, hi)
        lo = tl.where(short, lo, middle + 1)
    cut = tl.min(tl.where(present & (keys >= lo), keys, top), axis=0)  # (none from lo up: the first key)
    found = (tl.max(present.to(tl.int32), axis=0) > 0) & (~reaches(above_mass, budget)) & reaches(above_mass + tl.sum(weights, axis=0), budget)
    return cut, above_mass + tl.sum(tl.where(keys >= cut, weights, 0), axis=0), found


@triton.jit
def _sorted_top_p_cut(keys, weights, present, above_mass, budget, SLOTS: tl.constexpr):
    """``_top_p_cut`` from keys sorted in descending order (the present ones first), by a scan of
    the mass before each: where ranks are by sorts (no DIGITS: Triton 3.6 and 3.7), whose
    register allocator spills the cut-offs kernel around a loop of halvings in a search item."""
    before = above_mass + before_here(weights)
    keep = tl.sum(((~reaches(before, budget)) & present).to(tl.int32), axis=0)
    cut = pick(keys, tl.maximum(keep, 1) - 1, SLOTS, -2147483648)
    found = (keep > 0) & reaches(above_mass + tl.sum(weights, axis=0), budget)
    return cut, above_mass + tl.sum(tl.where(keys >= cut, weights, 0), axis=0), found


@triton.jit
def _resolve(keys_ptr, n, above_mass, row_max, stage, top_k, top_p, use_p, budget, inv_t, GATHER: tl.constexpr, WINDOW: tl.constexpr,
             RAW16: tl.constexpr, DTYPE: tl.constexpr, DIGITS: tl.constexpr):
    """The cut from a gather's keys (n of them): (cut, kept mass, found). Stage 4 gathered every
    key >= lo (at most GATHER, nothing above): top-k's cut is its k-th largest, then top-p's inside
    the top-k set (a 16-bit line's keys as raw keys, RAW16: scaled here, the few gathered rather
    than every value of the line); the empty slots' keys, -2**31, count as the last ones (a line of
    fewer than k values keeps them all). Stage 5 gathered a window (at most WINDOW) with
    ``above_mass`` above it: found when the window holds the cut (the mass above it below the
    budget, with the window's reaching it). Where ranks are by byte histograms (DIGITS): top-k's
    by them (scan.py's largest_reaching), top-p's by halvings (``_top_p_cut``), no sort; else
    (Triton 3.6 and 3.7, WINDOW = GATHER) both from one sort of the keys, which either stage shares
    (two would spill a tree's or block's cut-offs kernel there)."""
    if DIGITS:
        # (each branch its own names: its vectors have its own number of slots)
        if stage == 4:
            held = tl.arange(0, GATHER) < n
            top_keys = tl.load(keys_ptr + tl.arange(0, GATHER), mask=held, other=-2147483648, cache_modifier=".cg")
            if RAW16:
                top_keys = tl.where(held, order_key(bits_scaled(top_keys, inv_t, DTYPE)), top_keys)
            k_key = largest_reaching(top_keys, top_k, 4)
            kept = tl.where(top_keys >= k_key, fixed_mass(key_to_float(top_keys), row_max), 0)  # (0 for the empty slots: NaN keys)
            kept_mass = above_mass + tl.sum(kept, axis=0)
            cut = k_key
            if use_p:
                # The set's budget from its mass, as the reference's; a cut below k's keeps the top-k set.
                p_cut, p_mass, p_found = _top_p_cut(top_keys, kept, held, above_mass, top_p * unfixed(tl.sum(kept, axis=0)).to(tl.float32))
                cut = tl.maximum(p_cut, k_key)
                kept_mass = above_mass + tl.sum(tl.where(top_keys >= cut, kept, 0), axis=0)
            found = n >= 0  # True: the top-k set is whole
        else:
            in_window = tl.arange(0, WINDOW) < n
            window_keys = tl.load(keys_ptr + tl.arange(0, WINDOW), mask=in_window, other=-2147483648, cache_modifier=".cg")
            cut, kept_mass, found = _top_p_cut(window_keys, fixed_mass(key_to_float(window_keys), row_max), in_window, above_mass, budget)
    else:
        slot = tl.arange(0, GATHER)
        keys = tl.load(keys_ptr + slot, mask=slot < n, other=-2147483648, cache_modifier=".cg")
        if RAW16:
            if stage == 4:
                keys = tl.where(slot < n, order_key(bits_scaled(keys, inv_t, DTYPE)), keys)
        keys = tl.sort(keys, descending=True)
        weights = fixed_mass(key_to_float(keys), row_max)  # (0 for the empty slots: NaN keys)
        k_key = tl.full((), -2147483648, tl.int32)
        if stage == 4:
            k_key = pick(keys, top_k - 1, GATHER, -2147483648)
            weights = tl.where(keys >= k_key, weights, 0)
            budget = top_p * unfixed(tl.sum(weights, axis=0)).to(tl.float32)
        cut, kept_mass, found = _sorted_top_p_cut(keys, weights, slot < n, above_mass, budget, GATHER)
        if stage == 4:
            cut = tl.where(use_p, tl.maximum(cut, k_key), k_key)
            found = n >= 0  # True: the top-k set is whole
            kept_mass = above_mass + tl.sum(tl.where(keys >= cut, weights, 0), axis=0)
    return cut.to(tl.int64), kept_mass, found


@triton.jit
def _end(line64, lo, kept_mass, row_max, tau_ptr, part_m_ptr, part_z_ptr, parts, PARTS: tl.constexpr, PP: tl.constexpr):
    """A finished search: the cut (keys at or below -inf's keep every value: -inf) and the
    statistics over the kept values in the first partial slot (as the candidates leave a line
    they settle)."""
    tl.store(tau_ptr + line64, tl.where(lo <= -2139095041, float("-inf"), key_to_float(lo.to(tl.int32))))
    part = tl.arange(0, PP)
    kept = unfixed(kept_mass).to(tl.float32)
    tl.store(part_m_ptr + line64 * PARTS + part, tl.where(part == 0, row_max, float("-inf")), mask=part < parts)
    tl.store(part_z_ptr + line64 * PARTS + part, tl.where(part == 0, kept, 0.0), mask=part < parts)


@triton.jit
def _after_missed_window(stage, lo, hi, up_to_max, state):
    """The stage after a top-p window (a gather, or a raw window) that did not hold the cut, over
    the side [lo, hi] that does: ``stage`` (exact key bins), unless the window was the line's first
    pass, which a sample placed (thresholds.py; no pass recorded yet): value bins then, as the line
    would have started, over [lo, the line max] (``up_to_max``: stage 2) or with the mass above hi
    summed (stage 6), else exact key bins."""
    if tl.load(state + 7, cache_modifier=".cg") == 0:
        stage = tl.where(top_p_stage(lo, hi) == 2, tl.where(up_to_max, 2, 6), 3)
    return stage


@triton.jit
def _select_pass(
    base, line, chunk, span, width, parts, inv_t, top_k, top_p, use_p, stage, tau_ptr, part_m_ptr, part_z_ptr, state_ptr, state_f_ptr,
    part_count_ptr, part_mass_ptr, counter_ptr, progress_ptr, ended_ptr, search_pass, NUM_CHUNKS: tl.constexpr, TILE: tl.constexpr,
    BINS: tl.constexpr, PASSES: tl.constexpr, PARTS: tl.constexpr, PP: tl.constexpr, GATHER: tl.constexpr, WINDOW_GATHER: tl.constexpr,
    ATOMIC_WINDOW: tl.constexpr,
    DIGIT_SELECT: tl.constexpr,
    VECTOR_LINES: tl.constexpr,
):
    """One item of a search pass (``span`` values of the line from chunk * span: a chunk, or a run of
    chunks, see cutoffs.py), and the next pass's plan by the last of them (see the module docstring)."""
    line64 = line.to(tl.int64)
    state = state_ptr + line64 * 8
    # The state was written in this launch by another program: read from L2 (".cg"), past L1.
    lo = tl.load(state + 1, cache_modifier=".cg").to(tl.int64)
    hi = tl.load(state + 2, cache_modifier=".cg").to(tl.int64)
    row_max = tl.load(state_f_ptr + line64 * 2, cache_modifier=".cg")
    DTYPE: tl.constexpr = base.dtype.element_ty
    RAW16: tl.constexpr = DTYPE.primitive_bitwidth == 16
    if RAW16:
        # A 16-bit line's top-k runs over the raw keys of its logits' bits (stage 7): their order is
        # the scaled values' (x -> x / T only merges -0.0 with +0.0, and values where it overflows
        # or underflows), and
        # 65536 keys take two passes of 256 bins, the second over single keys. Its first pass
        # comes as the scaled keys' first (stage 1 from -2**31, which no later pass has).
        raw_start = (stage == 1) & (lo == -2147483648)
        stage = tl.where(raw_start, 7, stage)
        lo = tl.where(raw_start, -32768, lo)
        hi = tl.where(raw_start, 32767, hi)
        # The mass above a stage-7 interval when the threshold item summed it from the candidates
        # (thresholds.py; words 4 and 5, -1 when not): the pass over its single keys then only counts.
        known_mass = (tl.load(state + 5, cache_modifier=".cg").to(tl.int64) << 32) | (tl.load(state + 4, cache_modifier=".cg").to(tl.int64) & 0xFFFFFFFF)
        known = (stage == 7) & (known_mass >= 0)
    else:
        known_mass = lo * 0 - 1
        known = stage < 0  # False, as a runtime value
    shift = _shift(lo, hi)
    t0 = key_to_float(lo.to(tl.int32))
    scale = BINS / (key_to_float(hi.to(tl.int32)) - t0)  # value bins over [lo, hi] (stages 2 and 6)
    slots = tl.arange(0, 2 * BINS)
    own = (line64 * NUM_CHUNKS + chunk) * (BINS + 1)
    # A gather's slots: the line's histogram counts, which a gather pass does not use.
    keys_ptr = part_count_ptr + line64 * NUM_CHUNKS * (BINS + 1)
    # A raw window where tl.histogram is warp ballots (ATOMIC_WINDOW), which would bin every value
    # of the line: the window's few values counted by global atomics into the item's zeroed slice.
    atomic_window = stage < 0  # False, as a runtime value
    above_mass = lo * 0
    if ATOMIC_WINDOW:  # (every line of the call is 16-bit)
        atomic_window = stage == 8
    if atomic_window:
        if ATOMIC_WINDOW:
            tl.store(part_count_ptr + own + slots, tl.zeros((2 * BINS,), tl.int32), mask=slots < BINS)
            tl.debug_barrier()  # the zeros precede every thread's atomics
            above_mass = _atomic_raw_window(base, chunk * span, span, width, inv_t, row_max, lo, part_count_ptr + own, TILE, VECTOR_LINES)
            tl.store(part_count_ptr + own + BINS, 0)
    elif stage == 4:  # a top-k gather: hi is the line max
        if RAW16:
            # (DIGIT_SELECT: tl.histogram takes shared-memory atomics, Triton 3.8 on by default)
            above_mass = _gather(base, chunk * span, span, width, inv_t, row_max, _raw_floor(lo, inv_t, DTYPE), hi, state + 6, keys_ptr, TILE, GATHER,
                                 False, True, DIGIT_SELECT, VECTOR_LINES)
        else:
            above_mass = _gather(base, chunk * span, span, width, inv_t, row_max, lo, hi, state + 6, keys_ptr, TILE, GATHER, False, False, DIGIT_SELECT,
                                 VECTOR_LINES)
    elif stage == 5:
        above_mass = _gather(base, chunk * span, span, width, inv_t, row_max, lo, hi, state + 6, keys_ptr, TILE, WINDOW_GATHER, True, False, DIGIT_SELECT,
                             VECTOR_LINES)
    else:
        if stage == 3:
            tl.store(part_mass_ptr + own + slots, tl.zeros((2 * BINS,), tl.int64), mask=slots < BINS)
            tl.debug_barrier()  # the zeros precede every thread's atomics
            counts, above_count, above_mass = _histogram(base, chunk * span, span, width, inv_t, row_max, lo, hi, shift, t0, scale, part_mass_ptr + own,
                                                         TILE, BINS, True, False, 2)
        elif stage == 2:  # over [floor, line max]
            counts, above_count, above_mass = _histogram(base, chunk * span, span, width, inv_t, row_max, lo, hi, shift, t0, scale, part_mass_ptr + own,
                                                         TILE, BINS, False, True, 0)
        elif stage == 6:
            counts, above_count, above_mass = _histogram(base, chunk * span, span, width, inv_t, row_max, lo, hi, shift, t0, scale, part_mass_ptr + own,
                                                         TILE, BINS, False, True, 2)
        elif _top_k_may_end(lo, hi, shift) & (known == 0):  # top-k (stage 1, or 7 over raw keys) that can end the search, or a raw window (8)
            if RAW16:
                if stage == 8:
                    counts, above_count, above_mass = _histogram(base, chunk * span, span, width, inv_t, row_max, lo, hi, shift, 0.0, 0.0, base, TILE,
                                                                 BINS, False, False, 3, True)
                else:
                    counts, above_count, above_mass = _key_histogram(base, chunk * span, span, width, inv_t, row_max, lo, hi, shift, stage == 7,
                                                                     TILE, BINS, 2, RAW16)
            else:
                counts, above_count, above_mass = _key_histogram(base, chunk * span, span, width, inv_t, row_max, lo, hi, shift, stage == 7, TILE, BINS, 2,
                                                                 RAW16)
        else:  # top-k key bins that cannot end the search, or whose mass above is known: the counts decide, no mass is read
            counts, above_count, above_mass = _key_histogram(base, chunk * span, span, width, inv_t, row_max, lo, hi, shift, stage == 7, TILE, BINS, 1,
                                                             RAW16)
        tl.store(part_count_ptr + own + tl.arange(0, BINS), counts)
        tl.store(part_count_ptr + own + BINS, above_count)
    tl.store(part_mass_ptr + own + BINS, above_mass)
    tl.debug_barrier()  # every thread's stores and atomics precede the release below
    ticket = tl.atomic_add(counter_ptr + line, 1, sem="acq_rel", scope="gpu")
    arrivals = tl.cdiv(width, span)
    if ticket == arrivals - 1:
        # The last program of the line: the chunks' histograms (integer sums: any order is exact).
        # Four chunks per step keep the registers low (the counts and masses of 2 * BINS slots).
        # (The stage as a vector: the interpreter's masks must not mix a scalar bool in.)
        stages = tl.full((2 * BINS,), 0, tl.int32) + stage
        with_counts = (slots <= BINS) & (stages != 4) & (stages != 5)
        with_masses = (slots == BINS) | ((slots < BINS) & (stages == 3))
        line_counts = tl.zeros((2 * BINS,), tl.int32)
        line_masses = tl.zeros((2 * BINS,), tl.int64)
        for first in range(0, arrivals, 4):
            chunks = first + tl.arange(0, 4)
            every = (line64 * NUM_CHUNKS + chunks[:, None]) * (BINS + 1) + slots[None, :]
            present = chunks[:, None] < arrivals
            line_counts += tl.sum(tl.load(part_count_ptr + every, mask=present & with_counts[None, :], other=0, cache_modifier=".cg"), axis=0)
            line_masses += tl.sum(tl.load(part_mass_ptr + every, mask=present & with_masses[None, :], other=0, cache_modifier=".cg"), axis=0)
        line_masses = tl.where((slots == BINS) & known, known_mass, line_masses)
        # The pass as the line's path records it: its stage, 7 for top-k key bins that only counted.
        # (Stage 7's passes as stage 1's: the line's dtype tells them apart; stage 8 as 8.)
        recorded = tl.where((stage == 1) | (stage == 7), tl.where(_top_k_may_end(lo, hi, shift), 1, 7), stage)
        budget = tl.load(state_f_ptr + line64 * 2 + 1, cache_modifier=".cg")
        k_key = tl.load(state + 3, cache_modifier=".cg").to(tl.int64)
        bracket_lo = tl.load(state + 4, cache_modifier=".cg").to(tl.int64)
        bracket_hi = tl.load(state + 5, cache_modifier=".cg").to(tl.int64)
        above_mass = tl.max(tl.where(slots == BINS, line_masses, 0), axis=0)
        next_stage = stage * 0  # the search ends unless a stage below says otherwise
        kept_mass = above_mass
        if (stage == 4) | (stage == 5):
            gathered = tl.load(state + 6, cache_modifier=".cg")
            slots_held = tl.where(stage == 4, GATHER, WINDOW_GATHER)
            cut, kept_mass, found = _resolve(keys_ptr, tl.minimum(gathered, slots_held), above_mass, row_max, stage, top_k, top_p, use_p, budget, inv_t,
                                             GATHER, WINDOW_GATHER, RAW16, DTYPE, DIGIT_SELECT)
            overflow = gathered > slots_held
            window_lo = lo
            window_hi = hi
            lo = cut
            if stage == 4:
                # (fewer than k values from a lo at or below -inf's key: the line has fewer than k
                # finite values, every one gathered; the top-k set is the line, top-p cuts inside it)
                if overflow | ((gathered < top_k) & (window_lo > -2139095041)):
                    # A gather placed from a sample (thresholds.py) that does not hold the cut:
                    # fewer than k values from its lo up (the cut lies below), or more than the
                    # slots. Key bins go on over the side that holds it (a 16-bit line's short
                    # side over its raw keys, from the start: stage 1 from -2**31).
                    lo = tl.where(overflow, window_lo, -2147483648)
                    hi = tl.where(overflow, window_hi, window_lo - 1)
                    next_stage = next_stage + 1
            elif overflow | (found == 0):
                # The window does not hold the cut, or held more values than slots: the bracket it
                # was drawn from narrows to the side that holds the cut (above the window when the
                # mass above it reaches the budget), and exact key bins finish the search.
                above = reaches(above_mass, budget) & (overflow == 0)
                lo = tl.where(above, window_hi + 1, bracket_lo)
                hi = tl.where(above | overflow, bracket_hi, window_lo - 1)
                next_stage = _after_missed_window(next_stage + 3, lo, hi, above | overflow, state)
        elif stage == 2 or stage == 6:
            # Value bins: gather the widest window of bins around the cut's estimated bin that
            # fits; when not even its neighbours fit, bin the nine bins around it again (once, when
            # they span enough keys), or gather that bin alone, or (not even it fits) finish with
            # exact key bins over the proven bracket (the first value-bin pass's interval).
            cut_bin, radius = _plan(line_counts, above_mass, t0, scale, row_max, budget, BINS, WINDOW_GATHER)
            if stage == 2:
                bracket_lo = lo
                bracket_hi = hi
            around_lo, around_hi = _window(tl.maximum(cut_bin - 4, 0), tl.minimum(cut_bin + 4, BINS - 1), lo, hi, t0, scale, BINS)
            # A 16-bit line: 256 single raw keys over the bins that can hold the cut when they cover
            # them; else, unless a gather reaches further around the estimated bin (two bins or
            # more either side), over that bin and two either side when they cover those.
            raw_first = lo * 0
            covers = cut_bin < 0
            if RAW16:
                first_bin, last_bin = _cut_bins(line_counts, above_mass, t0, scale, row_max, budget, BINS)
                raw_first, covers = _raw_window(first_bin, last_bin, t0, scale, inv_t, row_max, k_key, DTYPE, BINS)
                if (covers == 0) & (radius < 2):
                    raw_first, covers = _raw_window(cut_bin - 1, cut_bin + 1, t0, scale, inv_t, row_max, k_key, DTYPE, BINS)
            if covers:
                lo = raw_first
                hi = raw_first + 255
                next_stage = next_stage + 8
            elif (radius < 1) & (stage == 2) & (around_hi - around_lo >= 65536):
                lo = around_lo
                hi = around_hi
                next_stage = next_stage + 6
            elif radius >= 0:
                lo, hi = _window(tl.maximum(cut_bin - radius, 0), tl.minimum(cut_bin + radius, BINS - 1), lo, hi, t0, scale, BINS)
                next_stage = next_stage + 5
            else:
                lo = bracket_lo
                hi = bracket_hi
                next_stage = next_stage + 3
        elif stage == 8:
            # A raw window (RAW16 only): each key's mass is its count times its value's weight, so
            # the mass from each key up is exact. The window holds the cut when the mass above it
            # does not reach the budget and the mass from its first key up does; else the bracket
            # narrows to the side that holds the cut, in scaled keys, for exact key bins (stage 3).
            best, count_from, mass_from = _narrow(line_counts, line_masses, lo, hi, shift, row_max, stage, budget, top_k, inv_t, BINS, RAW16, DTYPE)
            above = reaches(above_mass, budget)
            whole = reaches(tl.max(tl.where(slots == 0, mass_from, 0), axis=0), budget)
            if RAW16:
                window_lo = lo
                cut_value = raw_scaled(lo + best, inv_t, DTYPE)
                values = raw_scaled(tl.minimum(lo + slots, 32767), inv_t, DTYPE)
                # The kept set: every key of the window whose value reaches the cut's (raw keys the
                # scaling merged into one value: the mass from the lowest of them up, which
                # _raw_window keeps in the window), and all above it.
                kept_mass = tl.max(tl.where((slots < BINS) & (values >= cut_value), mass_from, 0), axis=0)
                lo = order_key(cut_value).to(tl.int64)
                hi = lo
                if above | (whole == 0):
                    # (values above the window are finite: its last key + 1 is one below +inf's at most)
                    past = order_key(raw_scaled(tl.minimum(window_lo + 256, 32767), inv_t, DTYPE)).to(tl.int64)
                    lo = tl.where(above, past, bracket_lo)
                    hi = tl.where(above, bracket_hi, tl.maximum(order_key(raw_scaled(window_lo, inv_t, DTYPE)).to(tl.int64), bracket_lo))
                    next_stage = _after_missed_window(next_stage * 0 + 3, lo, hi, above, state)
        else:
            best, count_from, mass_from = _narrow(line_counts, line_masses, lo, hi, shift, row_max, stage, budget, top_k, inv_t, BINS, RAW16, DTYPE)
            new_lo = lo + (best.to(tl.int64) << shift)
            hi = tl.minimum(hi, new_lo + (tl.full((), 1, tl.int64) << shift) - 1)
            lo = new_lo
            # Once [lo, hi] is one key, every bin from lo up holds one key or is stage 3's: the mass
            # of the keys >= lo is exact, the kept set's normaliser.
            kept_mass = tl.max(tl.where(slots == best, mass_from, 0), axis=0)
            done = lo >= hi
            next_stage = tl.where(done, 0, stage)
            if (stage == 1) | (stage == 7):
                top = order_key(row_max).to(tl.int64)
                if done:
                    strict = done
                    if RAW16:
                        if stage == 7:
                            # The cut as a scaled value's key. Its raw key's values are the kept
                            # set's lowest unless the raw key below scales to the same value (-0.0
                            # below +0.0, or values an underflow or overflow merged): then one pass
                            # over that single scaled key finds the set's count and mass exactly
                            # (stage 1 from there).
                            cut_value = raw_scaled(lo, inv_t, DTYPE)
                            strict = (lo == -32768) | (raw_scaled(tl.maximum(lo - 1, -32768), inv_t, DTYPE) < cut_value)
                            lo = order_key(cut_value).to(tl.int64)
                            hi = lo
                            next_stage = tl.where(strict, next_stage, 1)
                    k_key = lo
                    if use_p & strict:
                        kept_count = tl.max(tl.where(slots == best, count_from, 0), axis=0)
                        budget, lo, hi, next_stage = top_p_inside(lo, kept_mass, kept_count, row_max, top_p, top)
                elif (stage == 1) & (tl.max(tl.where(slots == best, count_from, 0), axis=0) <= GATHER):
                    # Few enough values at or above lo: the next pass gathers them all.
                    hi = top
                    next_stage = next_stage * 0 + 4
        if (next_stage == 4) | (next_stage == 5):
            tl.store(state + 6, 0)  # the gather's slot counter
        path = tl.load(state + 7, cache_modifier=".cg")  # the line's first seven passes, 4 bits each (tests read them)
        tl.store(state + 7, tl.where(path < 1 << 24, path * 16 + recorded, path))
        tl.store(state, next_stage)
        tl.store(state + 1, lo.to(tl.int32))
        tl.store(state + 2, hi.to(tl.int32))
        tl.store(state + 3, k_key.to(tl.int32))
        tl.store(state + 4, bracket_lo.to(tl.int32))
        tl.store(state + 5, bracket_hi.to(tl.int32))
        tl.store(state_f_ptr + line64 * 2 + 1, budget)
        if next_stage == 0:
            _end(line64, lo, kept_mass, row_max, tau_ptr, part_m_ptr, part_z_ptr, parts, PARTS, PP)
        tl.store(counter_ptr + line, 0)  # ready for the next pass, launch and graph replay
        tl.debug_barrier()  # every store above precedes the release
        # The line's next pass may start; a finished line lets every later item of it through.
        tl.atomic_xchg(progress_ptr + line, tl.where(next_stage == 0, PASSES, search_pass + 1), sem="release", scope="gpu")
        if next_stage == 0:
            tl.atomic_add(ended_ptr, 1, sem="release", scope="gpu")  # what a walk item waits for (cutoffs.py)


@triton.jit
def search_item(
    target_ptr, draft_ptr, tau_ptr, part_m_ptr, part_z_ptr, temperature_ptr, top_k_ptr, top_p_ptr, state_ptr, state_f_ptr, part_count_ptr,
    part_mass_ptr, counter_ptr, progress_ptr, ended_ptr, line, chunk, merge, search_pass, batch, K, V, Vd, t_stride_b, t_stride_k, d_stride_b, d_stride_k,
    t_parts, d_parts, NUM_CHUNKS: tl.constexpr, HAS_DRAFT: tl.constexpr, CHUNK: tl.constexpr, TILE: tl.constexpr, BINS: tl.constexpr,
    PASSES: tl.constexpr, PARTS: tl.constexpr, PP: tl.constexpr, GATHER: tl.constexpr, WINDOW_GATHER: tl.constexpr, SAMPLE_RUNS: tl.constexpr,
    DIGIT_SELECT: tl.constexpr,
    VECTOR_LINES: tl.constexpr,
    WINDOW_ATOMICS: tl.constexpr = True,
):
    """Pass ``search_pass`` over the ``chunk``-th run of ``merge`` chunks of one listed line, once the
    line's previous pass is published (every earlier pass's items hold earlier tickets: the wait
    always ends). SAMPLE_RUNS (where tl.histogram is warp ballots): a raw window counts by global
    atomics, in a call whose lines are all 16-bit (a mixed call's two searches would spill), with
    WINDOW_ATOMICS (a tree or block walk's kernel passes False: its walk's code would spill).
    DIGIT_SELECT: a top-k gather's cut by byte histograms and a top-p cut by halvings (where
    tl.histogram is shared-memory atomics; a top-p window then takes WINDOW_GATHER slots, twice
    GATHER), else both from the keys sorted. VECTOR_LINES: every line's loads can take 16 bytes a
    lane (a gather's tiles then hold a lane's vector, where DIGIT_SELECT does not hold a column)."""
    T16: tl.constexpr = target_ptr.dtype.element_ty.primitive_bitwidth == 16
    D16: tl.constexpr = draft_ptr.dtype.element_ty.primitive_bitwidth == 16  # (without drafts: the target again)
    ATOMIC_WINDOW: tl.constexpr = (SAMPLE_RUNS > 0) & T16 & D16 & WINDOW_ATOMICS
    if search_pass > 0:
        finished = tl.atomic_add(progress_ptr + line, 0, sem="acquire", scope="gpu")
        while finished < search_pass:
            finished = tl.atomic_add(progress_ptr + line, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()  # every thread reads the state after the acquire
    stage = tl.load(state_ptr + line.to(tl.int64) * 8, cache_modifier=".cg")  # 0 once the line's search has ended
    if stage != 0:
        row, pos, is_draft = line_of(line, batch * (K + 1), K)
        temperature = tl.load(temperature_ptr + row)
        inv_t = tl.math.div_rn(1.0, tl.where(temperature > 0, temperature, 1.0))
        top_k = tl.load(top_k_ptr + row)
        top_p = tl.load(top_p_ptr + row)
        use_p = top_p < 1.0
        span = CHUNK * merge
        if is_draft:
            if HAS_DRAFT:
                if chunk * span < Vd:
                    d_base = draft_ptr + row.to(tl.int64) * d_stride_b + pos.to(tl.int64) * d_stride_k
                    _select_pass(d_base, line, chunk, span, Vd, d_parts, inv_t, top_k, top_p, use_p, stage, tau_ptr, part_m_ptr, part_z_ptr,
                                 state_ptr, state_f_ptr, part_count_ptr, part_mass_ptr, counter_ptr, progress_ptr, ended_ptr, search_pass, NUM_CHUNKS,
                                 TILE, BINS, PASSES, PARTS, PP, GATHER, WINDOW_GATHER, ATOMIC_WINDOW, DIGIT_SELECT, VECTOR_LINES)
        else:
            if chunk * span < V:
                t_base = target_ptr + row.to(tl.int64) * t_stride_b + pos.to(tl.int64) * t_stride_k
                _select_pass(t_base, line, chunk, span, V, t_parts, inv_t, top_k, top_p, use_p, stage, tau_ptr, part_m_ptr, part_z_ptr, state_ptr,
                             state_f_ptr, part_count_ptr, part_mass_ptr, counter_ptr, progress_ptr, ended_ptr, search_pass, NUM_CHUNKS, TILE, BINS,
                             PASSES, PARTS, PP, GATHER, WINDOW_GATHER, ATOMIC_WINDOW, DIGIT_SELECT, VECTOR_LINES)
