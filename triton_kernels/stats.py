"""Line statistics: one launch reads every used target and draft line once.

A "line" is one (row, position) of the target (B, K+1, V) or draft (B, K, Vd) logits; lines
0 .. B(K+1)-1 are the target's, the rest the draft's. Grid (lines, parts): a program reads
``tiles_per_part`` consecutive TILE-value tiles of one line, each as a (ROWS, LANES) block with
LANES consecutive values per row, so every thread holds a few 16-byte vectors of each row and the
reduction over ROWS stays inside the thread. Per-lane accumulators carry the line across tiles
(one rescale per lane and tile); one block reduction at the end combines the lanes, and the part's
partials go to the workspace, where the race kernel combines a line's parts.

Per line kind, each its own loop:
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
def _fold(lane_max, lane_sum, s, tau, FILTERED: tl.constexpr):
    """Fold a (ROWS, LANES) block of processed values into per-lane (max, sum of exp(s - max))."""
    new_max = tl.maximum(lane_max, tl.max(s, axis=0))  # the reduction over ROWS stays in the thread
    ref = tl.where(new_max == float("-inf"), 0.0, new_max)  # an all -inf lane sums to 0, not NaN
    weights = exp(s - ref[None, :])
    if FILTERED:
        weights = tl.where(s < tau, 0.0, weights)  # NaN stays (NaN < tau is false)
    return new_max, lane_sum * exp(lane_max - ref) + tl.sum(weights, axis=0)


@triton.jit
def _combine(lane_max, lane_sum):
    """The block's (max, sum) from per-lane ones: one block reduction each."""
    block_max = tl.max(lane_max, axis=0)
    ref = tl.where(block_max == float("-inf"), 0.0, block_max)
    return block_max, tl.sum(lane_sum * exp(lane_max - ref), axis=0)


@triton.jit
def _load_tile(base, start, width, block, MASKED: tl.constexpr):
    if MASKED:
        idx = start + block
        return tl.load(base + idx, mask=idx < width, other=float("-inf")).to(tl.float32)
    else:
        return tl.load(base + start + block).to(tl.float32)


@triton.jit
def _greedy_tiles(base, first, last, width, rows, lanes, block, lane_best, lane_index, lane_nan, lane_max, lane_sum, tau,
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
            lane_max, lane_sum = _fold(lane_max, lane_sum, raw, tau, False)
    return lane_best, lane_index, lane_nan, lane_max, lane_sum


@triton.jit
def _sampled_tiles(base, first, last, width, block, inv_t, tau, lane_max, lane_sum, raw_max, raw_sum,
                   FILTERED: tl.constexpr, RAW_STATS: tl.constexpr, MASKED: tl.constexpr, LANES: tl.constexpr, ROWS: tl.constexpr):
    for tile in range(first, last):
        raw = _load_tile(base, tile * (ROWS * LANES), width, block, MASKED)
        lane_max, lane_sum = _fold(lane_max, lane_sum, raw * inv_t, tau, FILTERED)
        if RAW_STATS:
            raw_max, raw_sum = _fold(raw_max, raw_sum, raw, tau, False)
    return lane_max, lane_sum, raw_max, raw_sum


@triton.jit
def _part(
    base, first, last, width, inv_t, tau, greedy, out, part_m_ptr, part_z_ptr, part_i_ptr, part_rm_ptr, part_rz_ptr,
    FILTERED: tl.constexpr, GREEDY_SUMS: tl.constexpr, RAW_STATS: tl.constexpr, LANES: tl.constexpr, ROWS: tl.constexpr,
):
    """Statistics of tiles [first, last) of one line into partial slot ``out``: whole tiles
    unmasked, the line's ragged last tile masked."""
    rows = tl.arange(0, ROWS)
    lanes = tl.arange(0, LANES)
    block = rows[:, None] * LANES + lanes[None, :]
    whole = tl.maximum(tl.minimum(last, width // (ROWS * LANES)), first)
    lane_max = tl.full((LANES,), float("-inf"), tl.float32)
    lane_sum = tl.zeros((LANES,), tl.float32)
    if greedy:
        lane_best = tl.full((LANES,), float("-inf"), tl.float32)
        lane_index = tl.zeros((LANES,), tl.int32)
        lane_nan = tl.zeros((LANES,), tl.int32)
        lane_best, lane_index, lane_nan, lane_max, lane_sum = _greedy_tiles(
            base, first, whole, width, rows, lanes, block, lane_best, lane_index, lane_nan, lane_max, lane_sum, tau, GREEDY_SUMS, False, LANES, ROWS)
        lane_best, lane_index, lane_nan, lane_max, lane_sum = _greedy_tiles(
            base, whole, last, width, rows, lanes, block, lane_best, lane_index, lane_nan, lane_max, lane_sum, tau, GREEDY_SUMS, True, LANES, ROWS)
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
        raw_max = tl.full((LANES,), float("-inf"), tl.float32)
        raw_sum = tl.zeros((LANES,), tl.float32)
        lane_max, lane_sum, raw_max, raw_sum = _sampled_tiles(
            base, first, whole, width, block, inv_t, tau, lane_max, lane_sum, raw_max, raw_sum, FILTERED, RAW_STATS, False, LANES, ROWS)
        lane_max, lane_sum, raw_max, raw_sum = _sampled_tiles(
            base, whole, last, width, block, inv_t, tau, lane_max, lane_sum, raw_max, raw_sum, FILTERED, RAW_STATS, True, LANES, ROWS)
        part_max, part_sum = _combine(lane_max, lane_sum)
        tl.store(part_m_ptr + out, part_max)
        tl.store(part_z_ptr + out, part_sum)
        if RAW_STATS:
            part_max, part_sum = _combine(raw_max, raw_sum)
            tl.store(part_rm_ptr + out, part_max)
            tl.store(part_rz_ptr + out, part_sum)


@triton.jit(do_not_specialize=["batch", "tiles_per_part"])
def line_stats_kernel(
    target_ptr,  # (B, K+1, V) raw target logits, last dim contiguous
    draft_ptr,  # (B, K, Vd) raw draft logits (unused without HAS_DRAFT)
    temperature_ptr,  # (B,) float32, 0 = greedy
    num_draft_ptr,  # (B,) int64 drafts to verify per row
    tau_ptr,  # (lines,) float32 cut-offs, keep s >= tau (read only when FILTERED)
    resolved_ptr,  # (lines,) int32: 1 where cutoff_kernel already wrote the line's partials (read only when FILTERED)
    part_m_ptr,  # (lines, PARTS) float32 out: max of the processed part (raw for greedy lines; NaN = NaN seen)
    part_z_ptr,  # (lines, PARTS) float32 out: sum of exp(s - max) over the kept part
    part_i_ptr,  # (lines, PARTS) int32 out: greedy lines, lowest index of the raw max
    part_rm_ptr,  # (lines, PARTS) float32 out: RAW_STATS, max of the raw part
    part_rz_ptr,  # (lines, PARTS) float32 out: RAW_STATS, sum of exp(raw - raw max)
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
    FILTERED: tl.constexpr,
    LOGPROBS: tl.constexpr,  # 0 none, 1 processed, 2 raw
    T_LANES: tl.constexpr,  # target tiles are (T_ROWS, T_LANES); T_ROWS * T_LANES == D_ROWS * D_LANES
    T_ROWS: tl.constexpr,
    D_LANES: tl.constexpr,
    D_ROWS: tl.constexpr,
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
    if FILTERED:
        tau = tl.where(greedy, float("-inf"), tl.load(tau_ptr + line))
        done = tl.load(resolved_ptr + line) != 0  # cut found among the candidates: statistics written, no second read
    else:
        tau = float("-inf")
        done = line < 0
    out = line.to(tl.int64) * PARTS + part
    first = part * tiles_per_part
    # The draft token of this position (clamped as the race clamps it), for the gather below.
    token = tl.load(tokens_ptr + row.to(tl.int64) * tok_stride_b + pos, mask=pos < K, other=0).to(tl.int32)
    token = tl.minimum(tl.maximum(token, 0), Vd - 1)
    if is_draft:
        if HAS_DRAFT:
            last = tl.minimum(first + tiles_per_part, tl.cdiv(Vd, D_LANES * D_ROWS))
            used = (pos < num_draft) & (first < last)
            if not CHECK:
                used = used & (temperature != 0)  # a greedy row's walk reads no draft line
            if used:
                d_base = draft_ptr + row.to(tl.int64) * d_stride_b + pos.to(tl.int64) * d_stride_k
                # Issued with the tiles' loads; stored when the token lies in this part.
                mine = (token >= first * (D_LANES * D_ROWS)) & (token < last * (D_LANES * D_ROWS))
                at_token = tl.load(d_base + token, mask=mine, other=0.0).to(tl.float32)
                if done == 0:
                    _part(d_base, first, last, Vd, inv_t, tau, greedy, out, part_m_ptr, part_z_ptr, part_i_ptr, part_rm_ptr, part_rz_ptr,
                          FILTERED, False, False, D_LANES, D_ROWS)
                tl.store(gathered_ptr + line, at_token, mask=mine)
    else:
        last = tl.minimum(first + tiles_per_part, tl.cdiv(V, T_LANES * T_ROWS))
        if (pos <= num_draft) & (first < last):
            t_base = target_ptr + row.to(tl.int64) * t_stride_b + pos.to(tl.int64) * t_stride_k
            # The race reads the draft token's logit from here, with the partials, instead of
            # gathering it from the line after its other loads.
            mine = (pos < num_draft) & (token >= first * (T_LANES * T_ROWS)) & (token < last * (T_LANES * T_ROWS))
            at_token = tl.load(t_base + token, mask=mine, other=0.0).to(tl.float32)
            if done == 0:
                _part(t_base, first, last, V, inv_t, tau, greedy, out, part_m_ptr, part_z_ptr, part_i_ptr, part_rm_ptr, part_rz_ptr,
                      FILTERED, LOGPROBS != 0, LOGPROBS == 2, T_LANES, T_ROWS)
            tl.store(gathered_ptr + line, at_token, mask=mine)
