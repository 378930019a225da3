"""Line statistics: one launch reads every used target and draft line once.

A "line" is one (row, position) of the target (B, K+1, V) or draft (B, K, Vd) logits; lines
0 .. B(K+1)-1 are the target's, the rest the draft's. Grid (lines, tiles): a program reads one
TILE-value tile of one line as a (ROWS, LANES) block, LANES consecutive values per row, so every
thread holds a few 16-byte vectors of each row and the reduction over ROWS stays inside the thread
(per-lane accumulators). One block reduction per tile then combines the lanes, and the tile's
partials go to the workspace; the race kernel combines a line's tiles.

Per tile and line kind:
* sampled line: m = max of s = raw * inv_t, z = sum of exp(s - m) (over s >= tau when FILTERED);
  NaN or +inf anywhere makes z NaN (and m +inf), so "bad" needs no per-value test;
* greedy line: the raw max and its lowest index, m = NaN when a NaN was seen; with logprobs also z
  of the raw line (greedy rows report the model's log-softmax);
* RAW_STATS (logprobs "raw"): the max and sum-exp of the raw line next to the processed ones.
Lines a call never reads (beyond n_b, draft lines of greedy rows unless CHECK) are skipped.
"""

import triton
import triton.language as tl

from .random import exp


@triton.jit
def line_of(line, lines_t, K):
    """(row, position, is_draft) of a line index."""
    is_draft = line >= lines_t
    local = tl.where(is_draft, line - lines_t, line)
    length = tl.where(is_draft, K, K + 1)
    return local // length, local % length, is_draft


@triton.jit
def _lane_softmax(s, tau, FILTERED: tl.constexpr):
    """Per-lane (max, sum of exp(s - max)) of a (ROWS, LANES) block, then their block combination."""
    lane_max = tl.max(s, axis=0)  # within each thread
    lane_ref = tl.where(lane_max == float("-inf"), 0.0, lane_max)  # an all -inf lane sums to 0, not NaN
    weights = exp(s - lane_ref[None, :])
    if FILTERED:
        weights = tl.where(s < tau, 0.0, weights)  # NaN stays (NaN < tau is false)
    lane_sum = tl.sum(weights, axis=0)
    tile_max = tl.max(lane_max, axis=0)
    tile_ref = tl.where(tile_max == float("-inf"), 0.0, tile_max)
    tile_sum = tl.sum(lane_sum * exp(lane_ref - tile_ref), axis=0)
    return tile_max, tile_sum


@triton.jit
def _tile(
    base, start, width, inv_t, tau, greedy, out, part_m_ptr, part_z_ptr, part_i_ptr, part_rm_ptr, part_rz_ptr,
    FILTERED: tl.constexpr, GREEDY_SUMS: tl.constexpr, RAW_STATS: tl.constexpr, LANES: tl.constexpr, ROWS: tl.constexpr,
):
    rows = tl.arange(0, ROWS)
    lanes = tl.arange(0, LANES)
    idx = start + rows[:, None] * LANES + lanes[None, :]
    raw = tl.load(base + idx, mask=idx < width, other=float("-inf")).to(tl.float32)
    if greedy:
        lane_best = tl.max(raw, axis=0)
        lane_row = tl.min(tl.where(raw == lane_best[None, :], rows[:, None], ROWS), axis=0)
        lane_nan = tl.max((raw != raw).to(tl.int32), axis=0)
        best = tl.max(lane_best, axis=0)
        arg = tl.min(tl.where(lane_best == best, start + lane_row * LANES + lanes, 2147483647), axis=0)
        seen_nan = tl.max(lane_nan, axis=0) != 0
        tl.store(part_i_ptr + out, arg)
        if GREEDY_SUMS:
            tile_max, tile_sum = _lane_softmax(raw, tau, False)
        else:
            tile_max = best
            tile_sum = 1.0
        tl.store(part_m_ptr + out, tl.where(seen_nan, float("nan"), tile_max))
        tl.store(part_z_ptr + out, tile_sum)
    else:
        tile_max, tile_sum = _lane_softmax(raw * inv_t, tau, FILTERED)
        tl.store(part_m_ptr + out, tile_max)
        tl.store(part_z_ptr + out, tile_sum)
        if RAW_STATS:
            raw_max, raw_sum = _lane_softmax(raw, tau, False)
            tl.store(part_rm_ptr + out, raw_max)
            tl.store(part_rz_ptr + out, raw_sum)


@triton.jit(do_not_specialize=["batch"])
def line_stats_kernel(
    target_ptr,  # (B, K+1, V) raw target logits, last dim contiguous
    draft_ptr,  # (B, K, Vd) raw draft logits (unused without HAS_DRAFT)
    temperature_ptr,  # (B,) float32, 0 = greedy
    num_draft_ptr,  # (B,) int64 drafts to verify per row
    tau_ptr,  # (lines,) float32 cut-offs, keep s >= tau (read only when FILTERED)
    part_m_ptr,  # (lines, TILES) float32 out: max of the processed tile (raw for greedy lines; NaN = NaN seen)
    part_z_ptr,  # (lines, TILES) float32 out: sum of exp(s - max) over the kept tile
    part_i_ptr,  # (lines, TILES) int32 out: greedy lines, lowest index of the raw max
    part_rm_ptr,  # (lines, TILES) float32 out: RAW_STATS, max of the raw tile
    part_rz_ptr,  # (lines, TILES) float32 out: RAW_STATS, sum of exp(raw - raw max)
    batch,
    K,
    V,
    Vd,
    t_stride_b,
    t_stride_k,
    d_stride_b,
    d_stride_k,
    TILES: tl.constexpr,  # partials per line: cdiv(V, T_LANES * T_ROWS)
    HAS_DRAFT: tl.constexpr,
    CHECK: tl.constexpr,  # also read greedy rows' draft lines (check=True validates every used line)
    FILTERED: tl.constexpr,
    LOGPROBS: tl.constexpr,  # 0 none, 1 processed, 2 raw
    T_LANES: tl.constexpr,
    T_ROWS: tl.constexpr,
    D_LANES: tl.constexpr,
    D_ROWS: tl.constexpr,
):
    line = tl.program_id(0)
    tile = tl.program_id(1)
    lines_t = batch * (K + 1)
    row, pos, is_draft = line_of(line, lines_t, K)
    requested = tl.load(num_draft_ptr + row)
    num_draft = tl.minimum(tl.maximum(requested, 0), K)
    temperature = tl.load(temperature_ptr + row)
    greedy = temperature == 0
    inv_t = tl.math.div_rn(1.0, tl.where(temperature > 0, temperature, 1.0))
    if FILTERED:
        tau = tl.where(greedy, float("-inf"), tl.load(tau_ptr + line))
    else:
        tau = float("-inf")
    out = line.to(tl.int64) * TILES + tile
    if is_draft:
        if HAS_DRAFT:
            start = tile * (D_LANES * D_ROWS)
            used = (pos < num_draft) & (start < Vd)
            if not CHECK:
                used = used & (temperature != 0)  # a greedy row's walk reads no draft line
            if used:
                base = draft_ptr + row.to(tl.int64) * d_stride_b + pos.to(tl.int64) * d_stride_k
                _tile(base, start, Vd, inv_t, tau, greedy, out, part_m_ptr, part_z_ptr, part_i_ptr, part_rm_ptr, part_rz_ptr,
                      FILTERED, False, False, D_LANES, D_ROWS)
    else:
        start = tile * (T_LANES * T_ROWS)
        if pos <= num_draft:
            base = target_ptr + row.to(tl.int64) * t_stride_b + pos.to(tl.int64) * t_stride_k
            _tile(base, start, V, inv_t, tau, greedy, out, part_m_ptr, part_z_ptr, part_i_ptr, part_rm_ptr, part_rz_ptr,
                  FILTERED, LOGPROBS != 0, LOGPROBS == 2, T_LANES, T_ROWS)
