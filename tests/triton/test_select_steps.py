"""The whole-line search's per-value tests and weights (triton_kernels/select.py), interpreted on CPU:
the shortcuts a pass's step takes give what the plain definitions give, on -inf, ties with the
interval's ends and values far below them; likewise the top-p window's bins (stats.py) and the
integer threshold its threshold item compares masses with (thresholds.py). (The passes and the
windows themselves: test_triton_identity.py.)"""

from __future__ import annotations

import collections

import pytest
import torch

import specdec_ext
from specdec_ext import _triton_backend

pytestmark = pytest.mark.skipif("triton" not in specdec_ext.available_backends("cpu"), reason="triton is not installed")

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
select = _triton_backend.kernels().select
stats = _triton_backend.kernels().stats
thresholds = _triton_backend.kernels().thresholds
random = _triton_backend.kernels().random

N = 64


@triton.jit
def _weights(s_ptr, keep_ptr, out_ptr, row_max, N: tl.constexpr):
    idx = tl.arange(0, N)
    s = tl.load(s_ptr + idx)
    keep = tl.load(keep_ptr + idx) != 0
    tl.store(out_ptr + idx, select.fixed_mass_where(s, row_max, keep))
    tl.store(out_ptr + N + idx, tl.where(keep, select.fixed_mass(s, row_max), 0))


@triton.jit
def _tests(x_ptr, out_ptr, t0, t1, N: tl.constexpr, SCATTERED: tl.constexpr):
    idx = tl.arange(0, N)
    _, _, inside, above = select._tile(x_ptr, 0, N, 1.0, 0, 0, N, False, t0, t1, True, True, SCATTERED=SCATTERED)
    _, _, plain_inside, plain_above = select._tile(x_ptr, 0, N, 1.0, 0, 0, N, False, t0, t1, True, False, SCATTERED=SCATTERED)
    tl.store(out_ptr + idx, inside.to(tl.int32))
    tl.store(out_ptr + N + idx, above.to(tl.int32))
    tl.store(out_ptr + 2 * N + idx, plain_inside.to(tl.int32))
    tl.store(out_ptr + 3 * N + idx, plain_above.to(tl.int32))


@triton.jit
def _key_tests(x_ptr, out_ptr, inv_t, lo, hi, N: tl.constexpr, SCATTERED: tl.constexpr):
    idx = tl.arange(0, N)
    _, key, inside, above = select._tile(x_ptr, 0, N, inv_t, lo, hi, N, True, SCATTERED=SCATTERED)
    _, _, any_inside, any_above = select._tile(x_ptr, 0, N, inv_t, lo, hi, N, True, 0.0, 0.0, False, False, False, SCATTERED)
    tl.store(out_ptr + idx, key)
    tl.store(out_ptr + N + idx, inside.to(tl.int32))
    tl.store(out_ptr + 2 * N + idx, above.to(tl.int32))
    tl.store(out_ptr + 3 * N + idx, any_inside.to(tl.int32))
    tl.store(out_ptr + 4 * N + idx, any_above.to(tl.int32))


def _values() -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    s = 6 * torch.randn(N, generator=g)
    s[:4] = torch.tensor([float("-inf"), 0.0, -0.0, -200.0])  # -inf, both zeros, a weight that flushes to 0
    return s


def test_the_mass_above_zeroed_in_its_exponent_is_fixed_mass_where_kept():
    """select.fixed_mass_where (the exponent -inf where a value is not kept) gives fixed_mass's
    integers where kept and 0 elsewhere: every finite value kept, then every other one."""
    s = _values()
    row_max = float(s.max())
    for keep in (torch.isfinite(s), torch.arange(N) % 2 == 0):
        keep = keep & torch.isfinite(s)  # (a kept value is finite: a value above an interval)
        out = torch.zeros(2 * N, dtype=torch.int64)
        _weights[(1,)](s, keep.to(torch.int32), out, row_max, N=N)
        assert torch.equal(out[:N], out[N:])
        assert int(out[:N][keep].count_nonzero()) > N // 4  # (not all zeros)
    out = torch.zeros(2 * N, dtype=torch.int64)
    _weights[(1,)](s, torch.zeros(N, dtype=torch.int32), out, row_max, N=N)
    assert int(out.abs().sum()) == 0


@pytest.mark.parametrize("scattered", [False, True])
def test_a_value_interval_that_ends_at_the_line_max_tests_no_value_against_it(scattered):
    """_tile(TOP=True), the first top-p pass's step over [floor, line max], marks the same values
    inside as the two-sided test, with values equal to the floor and to the max among them and
    -inf left out; none is above. The same loaded one value a lane (SCATTERED: a mass histogram's
    tile)."""
    s = _values()
    t1 = float(s.max())
    t0 = float(s[torch.isfinite(s)].sort().values[10])  # a floor some values lie under, and one on
    out = torch.zeros(4 * N, dtype=torch.int32)
    _tests[(1,)](s, out, t0, t1, N=N, SCATTERED=scattered)
    inside, above, plain_inside, plain_above = out.view(4, N)
    assert torch.equal(inside, plain_inside)
    assert int(plain_above.sum()) == 0 and int(above.sum()) == 0
    assert torch.equal(inside.bool(), (s >= t0) & (s <= t1))
    assert bool(inside[s.argmax()]) and bool(inside[s == t0].all()) and not bool(inside[0])


@pytest.mark.parametrize("scattered", [False, True])
def test_a_raw_key_interval_marks_finite_values_inside_and_above_and_a_top_p_window_all(scattered):
    """_tile over raw keys (stages 7 and 8): inside is lo <= key <= hi and above key > hi, for the
    values finite once scaled; with FINITE=False (a top-p window, where such a value weighs 0) for
    every value by its key. -inf, and a logit 1 / temperature scales to -inf, sit at their keys.
    Loaded one value a lane (SCATTERED: a gather's or a mass histogram's tile) alike."""
    s = _values()
    s[4] = -3e38  # -inf once scaled by 1 / temperature = 8
    x = s.to(torch.bfloat16)
    out = torch.zeros(5 * N, dtype=torch.int32)
    inv_t = 8.0
    _key_tests[(1,)](x, out, inv_t, -32768, 32767, N=N, SCATTERED=scattered)
    keys = out[:N].sort().values  # (interval ends on values' own keys: ties with lo and hi)
    for lo, hi in ((-32768, 32767), (int(keys[N // 3]), int(keys[2 * N // 3])), (-32768, int(keys[N // 2])), (5, 4)):
        _key_tests[(1,)](x, out, inv_t, lo, hi, N=N, SCATTERED=scattered)
        key, inside, above, any_inside, any_above = out.view(5, N)
        finite = (x.float() * inv_t) > float("-inf")
        assert not bool(finite[0]) and not bool(finite[4])
        assert torch.equal(inside.bool(), finite & (key >= lo) & (key <= hi))
        assert torch.equal(above.bool(), finite & (key > hi))
        assert torch.equal(any_inside.bool(), (key >= lo) & (key <= hi))
        assert torch.equal(any_above.bool(), key > hi)
    assert int(any_inside.sum()) == 0 and int(inside.sum()) == 0  # (the last interval is empty)


@triton.jit
def _bits_reaching(x_ptr, out_ptr, lo, inv_t, N: tl.constexpr, DTYPE: tl.constexpr):
    idx = tl.arange(0, N)
    x = tl.load(x_ptr + idx)
    bits = x.to(tl.uint16, bitcast=True).to(tl.int32)
    first, span = random.raw_bits_reaching(lo)
    tl.store(out_ptr + idx, random.raw_key(x, False, True))
    tl.store(out_ptr + N + idx, ((bits - first).to(tl.uint32, bitcast=True) <= span).to(tl.int32))
    tl.store(out_ptr + 2 * N + idx, random.order_key(random.bits_scaled(bits, inv_t, DTYPE)))
    tl.store(out_ptr + 3 * N + idx, random.order_key(random.raw_scaled(random.raw_key(x, False, True), inv_t, DTYPE)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_floats_bits_reach_lo_exactly_when_its_raw_key_does(dtype):
    """random.raw_bits_reaching, the one unsigned range test a 16-bit top-k gather makes of each
    value's bits (select.py's _gather), over all 65536 bit patterns: inside exactly where the raw
    key is at least lo, for lo at both ends of the keys, past them (32768: none), around 0 (-0.0's
    key is -1) and between; and the gathered bits scale to the keys the raw keys do."""
    n = 65536
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    out = torch.zeros(4 * n, dtype=torch.int32)
    for lo in (-32768, -32767, -16512, -2, -1, 0, 1, 16256, 32639, 32767, 32768):
        _bits_reaching[(1,)](x, out, lo, 0.7, N=n, DTYPE=tl.bfloat16 if dtype == torch.bfloat16 else tl.float16)
        key, inside, scaled, expected = out.view(4, n)
        assert sorted(key.tolist()) == list(range(-32768, 32768))  # (a bijection of the bits)
        assert torch.equal(inside.bool(), key >= lo), (lo, int((inside.bool() != (key >= lo)).sum()))
        assert torch.equal(scaled, expected)


@triton.jit
def _gathered(x_ptr, keys_ptr, counter_ptr, out_ptr, width, inv_t, row_max, lo, hi, SPAN: tl.constexpr, TILE: tl.constexpr, GATHER: tl.constexpr,
              RAW: tl.constexpr, LANE_SLOTS: tl.constexpr, VECTORS: tl.constexpr):
    tl.store(out_ptr, select._gather(x_ptr, 0, SPAN, width, inv_t, row_max, lo.to(tl.int64), hi.to(tl.int64), counter_ptr, keys_ptr, TILE, GATHER,
                                     not RAW, RAW, LANE_SLOTS, VECTORS))
    ids = tl.arange(0, SPAN)
    x = tl.load(x_ptr + ids, mask=ids < width, other=float("-inf"))
    s = x.to(tl.float32) * inv_t
    tl.store(out_ptr + 1 + ids, select.fixed_mass(s, row_max))  # (each value's weight)
    tl.store(out_ptr + 1 + SPAN + ids, random.order_key(s).to(tl.int64))


@pytest.mark.parametrize("slots", ["lanes", "vectors", "values"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_gather_takes_each_value_inside_once_in_every_lane_layout(dtype, slots):
    """select._gather's lane runs: a lane's column (LANE_SLOTS), a lane's 16-byte vector (VECTORS)
    or a value a lane each take their slots from one atomic on the counter. Over a ragged span
    (-inf past the width, some -inf inside it) the slots hold each value inside once (a float32
    line's order keys in [lo, hi], with the fixed-point mass above hi; a bf16 line's raw bits from
    lo's raw key up), the counter counts them all, and a gather that overflows its slots fills
    every one with values inside."""
    width, span, tile = 1900, 2048, 1024  # (a lane's column: 4 values a tile)
    g = torch.Generator().manual_seed(5)
    x = (4 * torch.randn(width, generator=g)).to(dtype)
    x[::97] = float("-inf")
    inv_t, row_max = 1 / 0.9, float(x.float().max() / 0.9)
    raw = dtype == torch.bfloat16
    out = torch.zeros(1 + 2 * span, dtype=torch.int64)
    for share, gather in ((0.15, 256), (0.7, 2048), (0.5, 256)):  # (lo above 0, below it; the third overflows)
        counter = torch.zeros(1, dtype=torch.int32)
        slots_out = torch.full((gather,), -1, dtype=torch.int32)
        if raw:
            bits = x.view(torch.int16).to(torch.int32)
            keys = torch.where(bits >= 0, bits, bits ^ 0x7FFF)  # (raw keys)
            lo, hi = int(keys.sort().values[int(width * (1 - share))]), 32767  # (lo a value's own key)
        else:
            _gathered[(1,)](x, slots_out, counter, out, width, inv_t, row_max, 0, 0, SPAN=span, TILE=tile, GATHER=gather, RAW=False,
                            LANE_SLOTS=True, VECTORS=True)
            keys = out[1 + span:1 + span + width].to(torch.int32)  # (the scaled values' order keys)
            finite_keys = keys[x != float("-inf")]
            ordered = finite_keys.sort().values  # (lo and hi values' own keys)
            lo, hi = int(ordered[int(len(ordered) * (1 - share))]), int(ordered[int(len(ordered) * 0.98)])
            counter.zero_()
            slots_out.fill_(-1)
        _gathered[(1,)](x, slots_out, counter, out, width, inv_t, row_max, lo, hi, SPAN=span, TILE=tile, GATHER=gather, RAW=raw,
                        LANE_SLOTS=slots == "lanes", VECTORS=slots == "vectors")
        if raw:
            inside = keys >= lo
            expected = sorted((x.view(torch.int16)[inside].to(torch.int32) & 0xFFFF).tolist())
        else:
            inside = (keys >= lo) & (keys <= hi) & (x != float("-inf"))
            expected = sorted(keys[inside].tolist())
            weights = out[1:1 + width]
            assert int(out[0]) == int(weights[(keys > hi) & (x != float("-inf"))].sum())
        assert int(counter) == int(inside.sum())
        got = sorted(slots_out[:min(gather, int(counter))].tolist())
        if int(counter) <= gather:
            assert got == expected
        else:  # (every slot holds a distinct value inside)
            assert -1 not in got and not (collections.Counter(got) - collections.Counter(expected))


@triton.jit
def _raw_window_counts(x_ptr, count_ptr, out_ptr, width, inv_t, row_max, lo, SPAN: tl.constexpr, TILE: tl.constexpr, VECTORS: tl.constexpr):
    tl.store(out_ptr, select._atomic_raw_window(x_ptr, 0, SPAN, width, inv_t, row_max, lo, count_ptr, TILE, VECTORS))
    ids = tl.arange(0, SPAN)
    x = tl.load(x_ptr + ids, mask=ids < width, other=float("-inf"))
    tl.store(out_ptr + 1 + ids, select.fixed_mass(x.to(tl.float32) * inv_t, row_max))  # (each value's weight)


@pytest.mark.parametrize("vectors", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_atomic_raw_window_counts_each_key_and_sums_the_mass_above(dtype, vectors):
    """select._atomic_raw_window (Triton 3.6 and 3.7's 16-bit top-p window), its values a lane's
    16-byte vector (``vectors``) or one a lane: over a ragged span with -inf inside it, slot j
    counts the values whose raw key is lo + j, and the mass returned is the fixed-point weights'
    sum of the values above the window (a window at the top, one in the middle, one below every
    finite value)."""
    width, span, tile = 1900, 2048, 1024
    x = (torch.randn(width, generator=torch.Generator().manual_seed(8)) * 2).to(dtype)
    x[::89] = float("-inf")
    bits = x.view(torch.int16).to(torch.int32)
    keys = torch.where(bits >= 0, bits, bits ^ 0x7FFF)  # (raw keys)
    inv_t, row_max = 1 / 0.9, float(x.float().max() / 0.9)
    out = torch.zeros(1 + span, dtype=torch.int64)
    finite = keys[x != float("-inf")].sort().values
    # (a window whose last key is a value's, one whose first is, one below every finite value)
    for lo in (int(finite[-50]) - 255, int(finite[width // 2]), int(finite[0]) - 300):
        counts = torch.zeros(256, dtype=torch.int32)
        _raw_window_counts[(1,)](x, counts, out, width, inv_t, row_max, lo, SPAN=span, TILE=tile, VECTORS=vectors)
        inside = (keys >= lo) & (keys < lo + 256)
        assert torch.equal(counts, torch.bincount(keys[inside] - lo, minlength=256).to(torch.int32)), lo
        assert int(out[0]) == int(out[1:1 + width][keys >= lo + 256].sum()), lo
        assert int(inside.sum()) > 0 or lo < int(finite.min())


@triton.jit
def _reaching(mass_ptr, out_ptr, budget_ptr, N: tl.constexpr):
    idx = tl.arange(0, N)
    mass = tl.load(mass_ptr + idx)
    budget = tl.load(budget_ptr)  # (float32, as the threshold item's)
    tl.store(out_ptr + idx, (mass >= thresholds._reaching(budget)).to(tl.int32))
    tl.store(out_ptr + N + idx, select.reaches(mass, budget).to(tl.int32))


@pytest.mark.parametrize("budget", [0.9, 1.0, 12345.678, 65536.0, 100000.1])
def test_a_mass_reaches_a_budget_exactly_when_it_reaches_its_integer_threshold(budget):
    """thresholds._reaching: the least fixed-point mass that reaches a budget (float64(F) * 2**-40
    >= budget), so that an integer comparison decides as select.reaches does, masses around the
    budget's own included. Above 8192 times the max's weight (F > 2**53) float64 rounds F, by up
    to 8 units: the masses within 20 of the budget, and a spread, check both sides."""
    exact = int(torch.tensor(budget, dtype=torch.float32).double() * 2**40)
    mass = torch.tensor([exact + d for d in range(-20, 21)] + [exact * 2, exact // 2, exact - 2**20, exact + 2**20] + [0] * (N - 45), dtype=torch.int64)
    out = torch.zeros(2 * N, dtype=torch.int32)
    _reaching[(1,)](mass, out, torch.tensor([budget], dtype=torch.float32), N=N)
    assert torch.equal(out[:N], out[N:]), budget
    assert 0 < int(out[:41].sum()) < 41


@triton.jit
def _window_bins(key_ptr, out_ptr, lo, zero_lo, zero_span, N: tl.constexpr, BINS: tl.constexpr):
    idx = tl.arange(0, N)
    tl.store(out_ptr + idx, stats.top_p_window_bin(tl.load(key_ptr + idx), lo, zero_lo, zero_span, BINS))


@pytest.mark.parametrize("lo,zero_lo,zero_span", [(-500, -40, 79), (-30, -30, 10), (-200, 100, 0), (-32768, -5, 9)])
def test_top_p_window_bins_are_single_keys_but_the_merged_ones(lo, zero_lo, zero_span):
    """stats.top_p_window_bin: each raw key from lo up its own bin, the keys zero_lo ..
    zero_lo + zero_span one bin, and every key below lo or past the window in the last bin (the
    three-instruction form against the plain definition), over every raw key."""
    bins = 256
    keys = torch.arange(-32768, 32768, dtype=torch.int32)
    out = torch.zeros_like(keys)
    _window_bins[(1,)](keys, out, lo, zero_lo, zero_span, N=keys.numel(), BINS=bins)
    plain = keys - lo - (keys - zero_lo).clamp(0, zero_span)
    want = torch.where((keys >= lo) & (plain < bins - 1), plain, bins - 1)
    assert torch.equal(out, want)
    assert int((out == (zero_lo - lo if zero_lo >= lo else 0)).sum()) == (zero_span + 1 if zero_lo - lo < bins - 1 else 0) or zero_lo < lo


@triton.jit
def _largest_reaching(keys_ptr, out_ptr, n, lowest, ranks_ptr, R: tl.constexpr, N: tl.constexpr, DIGITS: tl.constexpr):
    idx = tl.arange(0, N)
    keys = tl.load(keys_ptr + idx, mask=idx < n, other=lowest)
    for r in tl.static_range(R):
        tl.store(out_ptr + r, select.largest_reaching(keys, tl.load(ranks_ptr + r), DIGITS))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("digits, n", [(2, 64), (2, 40), (4, 64), (4, 17)])
def test_the_largest_key_reaching_a_rank_is_a_sorted_copys_slot(digits, n, dtype):
    """select.largest_reaching (byte histograms, no sort) against a sorted copy, on int32 and
    int64 keys: ties, keys sharing their high bytes, the lowest and the largest key, negative and
    positive keys, empty slots (the lowest, past n), and ranks past the keys present (the
    lowest)."""
    g = torch.Generator().manual_seed(digits * 100 + n)
    half = 2 ** (8 * digits - 1)
    keys = torch.randint(-half, half, (N,), generator=g, dtype=torch.int64)
    keys[:9] = torch.tensor([-half, half - 1, half - 1, 5, 5, 5, 256, 257, -1])
    shared = min(int(keys[9]) // 2 ** (8 * digits - 16) * 2 ** (8 * digits - 16), half - 300)  # (one high part, several low bytes)
    keys[9:20] = shared + torch.randint(0, 300, (11,), generator=g)
    keys = keys.to(dtype)
    ranks = torch.tensor([1, 2, 3, 4, 7, n // 2, n - 1, n, n + 1, N + 3], dtype=torch.int32)
    out = torch.empty(len(ranks), dtype=dtype)
    _largest_reaching[(1,)](keys, out, n, -half, ranks, len(ranks), N, digits)
    ordered = keys[:n].sort(descending=True).values
    expected = [int(ordered[r - 1]) if r <= n else -half for r in ranks.tolist()]
    assert out.tolist() == expected


@triton.jit
def _top_p_cuts(keys_ptr, out_ptr, n, row_max, above_mass, budgets_ptr, R: tl.constexpr, N: tl.constexpr):
    idx = tl.arange(0, N)
    present = idx < n
    keys = tl.load(keys_ptr + idx, mask=present, other=-2147483648)
    weights = select.fixed_mass(select.key_to_float(keys), row_max)
    tl.store(out_ptr + idx, weights)  # (the weights, for the check's own sums)
    ordered = tl.sort(keys, descending=True)
    ordered_weights = select.fixed_mass(select.key_to_float(ordered), row_max)
    for r in tl.static_range(R):
        budget = tl.load(budgets_ptr + r)
        cut, kept, found = select._top_p_cut(keys, weights, present, above_mass, budget)
        tl.store(out_ptr + N + 6 * r, cut.to(tl.int64))
        tl.store(out_ptr + N + 6 * r + 1, kept)
        tl.store(out_ptr + N + 6 * r + 2, found.to(tl.int64))
        cut, kept, found = select._sorted_top_p_cut(ordered, ordered_weights, idx < n, above_mass, budget, N)
        tl.store(out_ptr + N + 6 * r + 3, cut.to(tl.int64))
        tl.store(out_ptr + N + 6 * r + 4, kept)
        tl.store(out_ptr + N + 6 * r + 5, found.to(tl.int64))


def _scanned_top_p_cut(keys, weights, above, budget):
    """The cut from the keys sorted in descending order, by the definition: the last key whose
    mass before it is short of the budget (the first key when none is)."""
    reaches = lambda mass: mass * 9.094947017729282e-13 >= budget  # noqa: E731  (float64, as select.reaches)
    order = sorted(range(len(keys)), key=lambda i: -keys[i])
    before, keep = above, 0
    for i in order:
        if reaches(before):
            break
        keep += 1
        before += weights[i]
    cut = keys[order[max(keep, 1) - 1]] if keys else -(2**31)
    found = keep > 0 and reaches(above + sum(weights))
    return cut, above + sum(w for k, w in zip(keys, weights, strict=True) if k >= cut), found


@pytest.mark.parametrize("n, above", [(64, 0), (40, 0), (64, 3 << 40), (1, 0), (0, 0)])
def test_a_top_p_cut_by_halvings_is_the_sorted_keys_cut(n, above):
    """select._top_p_cut (halvings of the keys' span on integer sums, the keys in any order) and
    select._sorted_top_p_cut (a scan of the keys sorted) against the definition: the same cut,
    kept mass and found, on ties (a run of one key), keys of equal weight apart, empty slots and
    budgets at the edges: below the top key's weight, at each prefix of the masses, between them,
    at the whole mass and past it, and at or below the mass above the window (no key kept)."""
    from bench.gpu_model import _order_key

    g = torch.Generator().manual_seed(n + above % 97)
    values = torch.cat([torch.full((6,), 0.5), torch.full((3,), -1.25), torch.randn(N - 9, generator=g)])[torch.randperm(N, generator=g)]
    keys = torch.tensor([_order_key(v) for v in values.tolist()], dtype=torch.int32)
    row_max = float(values[:n].max()) if n else 0.0
    out = torch.zeros(N + 6, dtype=torch.int64)
    _top_p_cuts[(1,)](keys, out, n, row_max, above, torch.zeros(1, dtype=torch.float32), 1, N)
    weights = out[:N].tolist()[:n]
    present = keys[:n].tolist()
    unit = 9.094947017729282e-13
    prefixes = [above + sum(sorted(weights, reverse=True)[:j]) for j in range(n + 1)]
    budgets = [0.0, above * unit, above * unit * 0.999, 1e-3, 1e9] + [m * unit for m in prefixes] + [(m + 1) * unit for m in prefixes[:-1]]
    budgets = torch.tensor(budgets, dtype=torch.float32)
    out = torch.zeros(N + 6 * len(budgets), dtype=torch.int64)
    _top_p_cuts[(1,)](keys, out, n, row_max, above, budgets, len(budgets), N)
    for r, budget in enumerate(budgets.tolist()):
        want = _scanned_top_p_cut(present, weights, above, budget)
        got = out[N + 6 * r : N + 6 * r + 6].tolist()
        assert (got[0], got[1], bool(got[2])) == want, (budget, got, want)
        assert (got[3], got[4], bool(got[5])) == want, (budget, got, want)
