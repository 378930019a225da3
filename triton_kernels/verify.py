"""Fused verification kernels: line statistics, acceptance + exponential race, finalize.

A "line" is one (row, position) of the target (B, K+1, V) or draft (B, K, Vd) logits. Nothing of
size (B, K, V) is ever written: per line we keep partial (max, sum-exp, argmax, bad) statistics per
vocabulary chunk, which every later step combines on the fly. The vocabulary is split into chunks
so that even batch 1 spreads over many programs; each program loops over masked tiles of its chunk.

0. (with top-k / top-p) ``candidates_kernel`` and ``threshold_kernel`` (thresholds.py): each
   line's cut-off tau, read by the kernels below.
1. ``line_stats_kernel``   grid (lines, chunks): temperature, cut-off, max and sum-exp partials.
2. ``race_kernel``         grid (B, chunks): acceptance walk (cheap, repeated by every chunk
                           program of the row), then the exponential race of the residual (after
                           a rejection) or of p (bonus) over the chunk.
3. ``finalize_kernel``     grid (B,): pick the race winner and write tokens / num_accepted.
"""

import triton
import triton.language as tl

from .random import open_uniform

# Philox streams (specdec_ext/_philox.py): 0 = acceptance coins, 1 = the race's exponentials. They
# are written as literals at the call sites: a module-level constant is a plain int to the
# interpreter but must be a tl.constexpr object to the compiler, and no one spelling suits both.


@triton.jit
def _running_argmax(values, start, best_val, best_idx):
    """Fold one tile into a running (max, lowest index of the max) pair."""
    tile_val = tl.max(values, axis=0)
    tile_idx = start + tl.argmax(values, axis=0, tie_break_left=True)
    better = tile_val > best_val  # strict: the earlier tile keeps ties (lowest index)
    return tl.where(better, tile_val, best_val), tl.where(better, tile_idx, best_idx)


@triton.jit
def line_stats_kernel(
    logits_ptr,  # (B, L, Vl) raw logits, any float dtype, last dim contiguous
    tau_ptr,  # (B * L,) float32 cut-offs (keep s >= tau); read only when FILTERED
    temperature_ptr,  # (B,) float32, 0 = greedy
    num_draft_ptr,  # (B,) int64
    part_max_ptr,  # (B * L, NUM_CHUNKS) float32 out: max of scaled logits
    part_sum_ptr,  # (B * L, NUM_CHUNKS) float32 out: sum over kept of exp(s - part_max)
    part_argval_ptr,  # (B * L, NUM_CHUNKS) float32 out: max raw logit (greedy argmax)
    part_arg_ptr,  # (B * L, NUM_CHUNKS) int32 out: its lowest index
    part_bad_ptr,  # (B * L, NUM_CHUNKS) int32 out: NaN or +inf seen (after scaling)
    L,
    Vl,
    stride_b,
    stride_l,
    chunk_size,
    num_chunks,
    USED_SHIFT: tl.constexpr,  # line l of row b is used iff l + USED_SHIFT <= n_b
    FILTERED: tl.constexpr,  # some row uses top-k / top-p (else every tau is -inf and never stored)
    BLOCK: tl.constexpr,
):
    line = tl.program_id(0)
    chunk = tl.program_id(1)
    row = line // L
    pos = line % L
    if pos + USED_SHIFT <= tl.load(num_draft_ptr + row):
        temperature = tl.load(temperature_ptr + row)
        greedy = temperature == 0
        scale = tl.where(greedy, 1.0, temperature)
        tau = tl.where(greedy, float("-inf"), _load_tau(tau_ptr, line, FILTERED))
        base = logits_ptr + row.to(tl.int64) * stride_b + pos.to(tl.int64) * stride_l
        chunk_start = chunk * chunk_size
        chunk_end = tl.minimum(chunk_start + chunk_size, Vl)
        offsets = tl.arange(0, BLOCK)
        run_max = float("-inf")
        run_sum = 0.0
        best_val = float("-inf")
        best_idx = chunk_start
        bad = 0
        for start in range(chunk_start, chunk_end, BLOCK):
            idx = start + offsets
            mask = idx < chunk_end
            raw = tl.load(base + idx, mask=mask, other=float("-inf")).to(tl.float32)
            s = raw / scale
            bad = bad | tl.max(((s != s) | (s == float("inf"))) & mask, axis=0).to(tl.int32)
            new_max = tl.maximum(run_max, tl.max(s, axis=0))
            kept = mask & (s >= tau) & (s > float("-inf"))
            tile_sum = tl.sum(tl.where(kept, tl.exp(s - new_max), 0.0), axis=0)
            rescale = tl.where(run_max == float("-inf"), 0.0, tl.exp(run_max - new_max))
            run_sum = run_sum * rescale + tile_sum
            run_max = new_max
            best_val, best_idx = _running_argmax(raw, start, best_val, best_idx)
        out = line.to(tl.int64) * num_chunks + chunk
        tl.store(part_max_ptr + out, run_max)
        tl.store(part_sum_ptr + out, run_sum)
        tl.store(part_argval_ptr + out, best_val)
        tl.store(part_arg_ptr + out, best_idx)
        tl.store(part_bad_ptr + out, bad)


@triton.jit
def _combine_line(part_max_ptr, part_sum_ptr, part_bad_ptr, line, num_chunks, CHUNKS_POW2: tl.constexpr):
    """(max, normaliser, bad) of one line from its per-chunk partials; bad includes an empty line."""
    chunks = tl.arange(0, CHUNKS_POW2)
    mask = chunks < num_chunks
    offs = line.to(tl.int64) * num_chunks + chunks
    part_max = tl.load(part_max_ptr + offs, mask=mask, other=float("-inf"))
    part_sum = tl.load(part_sum_ptr + offs, mask=mask, other=0.0)
    line_max = tl.max(part_max, axis=0)
    weights = tl.where(part_max == float("-inf"), 0.0, tl.exp(part_max - line_max))
    normaliser = tl.sum(part_sum * weights, axis=0)
    bad = tl.max(tl.load(part_bad_ptr + offs, mask=mask, other=0), axis=0) != 0
    bad = bad | (line_max == float("-inf")) | (line_max != line_max)
    return line_max, normaliser, bad


@triton.jit
def _combine_argmax(part_argval_ptr, part_arg_ptr, line, num_chunks, CHUNKS_POW2: tl.constexpr):
    """Lowest index of the largest raw logit of one line, from per-chunk partials."""
    chunks = tl.arange(0, CHUNKS_POW2)
    mask = chunks < num_chunks
    offs = line.to(tl.int64) * num_chunks + chunks
    vals = tl.load(part_argval_ptr + offs, mask=mask, other=float("-inf"))
    idxs = tl.load(part_arg_ptr + offs, mask=mask, other=2147483647)
    best = tl.max(vals, axis=0)
    return tl.min(tl.where(mask & (vals == best), idxs, 2147483647), axis=0)


@triton.jit
def _load_tau(tau_ptr, line, FILTERED: tl.constexpr):
    """The cut-off of a line; -inf without filters, where the host skips filling the buffer."""
    if FILTERED:
        return tl.load(tau_ptr + line)
    else:
        return float("-inf")


@triton.jit
def _prob(value, line_max, normaliser, tau):
    """Processed probability of scaled logit ``value`` on a line with the given statistics."""
    return tl.where((value >= tau) & (value > float("-inf")), tl.exp(value - line_max) / normaliser, 0.0)


@triton.jit
def race_kernel(
    target_ptr,  # (B, K+1, V) raw target logits
    draft_ptr,  # (B, K, Vd) raw draft logits (unused when not HAS_DRAFT)
    tokens_ptr,  # (B, K) int32 / int64 draft tokens
    seed_ptr,  # (1,) int64 Philox key
    temperature_ptr,  # (B,) float32
    num_draft_ptr,  # (B,) int64
    tau_t_ptr,  # (B * (K+1),) float32 (read only when FILTERED)
    tau_d_ptr,  # (B * K,) float32 (read only when FILTERED)
    t_max_ptr,
    t_sum_ptr,
    t_argval_ptr,
    t_arg_ptr,
    t_bad_ptr,  # target partials (B * (K+1), NUM_CHUNKS)
    d_max_ptr,
    d_sum_ptr,
    d_bad_ptr,  # draft partials (B * K, NUM_CHUNKS)
    race_val_ptr,  # (B, NUM_CHUNKS) float32 out: best r / E in the chunk
    race_idx_ptr,  # (B, NUM_CHUNKS) int32 out
    bonus_val_ptr,  # (B, NUM_CHUNKS) float32 out: best p / E (fallback when r is all zero)
    bonus_idx_ptr,  # (B, NUM_CHUNKS) int32 out
    num_accepted_ptr,  # (B,) int64 out (chunk 0 writes)
    invalid_ptr,  # (B,) int32 out (chunk 0 writes)
    K,
    V,
    Vd,
    t_stride_b,
    t_stride_k,
    d_stride_b,
    d_stride_k,
    tok_stride_b,
    chunk_size,
    num_chunks,
    HAS_DRAFT: tl.constexpr,
    CHECK_ALL_LINES: tl.constexpr,  # blank for a bad value in any line up to n_b, not only the lines the walk reads
    FILTERED: tl.constexpr,
    CHUNKS_POW2: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    seed = tl.load(seed_ptr)
    requested = tl.load(num_draft_ptr + row)
    num_draft = tl.minimum(tl.maximum(requested, 0), K)  # out-of-range counts blank the row below
    temperature = tl.load(temperature_ptr + row)
    greedy = temperature == 0
    scale = tl.where(greedy, 1.0, temperature)
    t_row = target_ptr + row.to(tl.int64) * t_stride_b
    d_row = draft_ptr + row.to(tl.int64) * d_stride_b

    # Acceptance walk. A line the walk reads (positions up to the first rejection; a greedy row reads
    # no draft line) blanks the row when it holds a bad value; with CHECK_ALL_LINES every used line
    # does. Out-of-range draft ids always do.
    alive = 1
    num_accepted = 0
    invalid = 0
    for k in range(0, K):
        used = k < num_draft
        token = tl.load(tokens_ptr + row.to(tl.int64) * tok_stride_b + k).to(tl.int64)
        token_bad = (token < 0) | (token >= Vd)
        token = tl.minimum(tl.maximum(token, 0), Vd - 1)
        t_line = row * (K + 1) + k
        t_maxv, t_norm, t_bad = _combine_line(t_max_ptr, t_sum_ptr, t_bad_ptr, t_line, num_chunks, CHUNKS_POW2)
        s = tl.load(t_row + k * t_stride_k + token).to(tl.float32) / scale
        p = _prob(s, t_maxv, t_norm, _load_tau(tau_t_ptr, t_line, FILTERED))
        line_bad = t_bad
        if HAS_DRAFT:
            d_line = row * K + k
            d_maxv, d_norm, d_bad = _combine_line(d_max_ptr, d_sum_ptr, d_bad_ptr, d_line, num_chunks, CHUNKS_POW2)
            d = tl.load(d_row + k * d_stride_k + token).to(tl.float32) / scale
            q = _prob(d, d_maxv, d_norm, _load_tau(tau_d_ptr, d_line, FILTERED))
            if CHECK_ALL_LINES:
                line_bad = line_bad | d_bad
            else:
                line_bad = line_bad | (d_bad & ~greedy)
        else:
            q = 1.0
        coin = open_uniform(seed, 0, k, row, 0)  # stream 0: acceptance
        target_argmax = _combine_argmax(t_argval_ptr, t_arg_ptr, t_line, num_chunks, CHUNKS_POW2)
        accept = tl.where(greedy, token == target_argmax, coin * q < p)
        if CHECK_ALL_LINES:
            read = used
        else:
            read = used & (alive != 0)
        invalid = invalid | (used & token_bad).to(tl.int32) | (read & line_bad).to(tl.int32)
        alive = alive & (used & accept).to(tl.int32)
        num_accepted += alive
    bonus_line = row * (K + 1) + num_draft
    _, _, bonus_bad = _combine_line(t_max_ptr, t_sum_ptr, t_bad_ptr, bonus_line, num_chunks, CHUNKS_POW2)
    if not CHECK_ALL_LINES:
        bonus_bad = bonus_bad & (num_accepted == num_draft)  # read only when every draft was accepted
    invalid = invalid | bonus_bad.to(tl.int32) | (requested != num_draft).to(tl.int32)
    if chunk == 0:
        tl.store(num_accepted_ptr + row, num_accepted.to(tl.int64))
        tl.store(invalid_ptr + row, invalid)

    # Exponential race over this chunk at position j: argmax r(y) / E_y, E_y = -log(u_y).
    j = num_accepted
    rejected = j < num_draft
    t_line = row * (K + 1) + j
    t_maxv, t_norm, _ = _combine_line(t_max_ptr, t_sum_ptr, t_bad_ptr, t_line, num_chunks, CHUNKS_POW2)
    t_tau = _load_tau(tau_t_ptr, t_line, FILTERED)
    j_draft = tl.minimum(j, K - 1)
    if HAS_DRAFT:
        d_line = row * K + j_draft
        d_maxv, d_norm, _ = _combine_line(d_max_ptr, d_sum_ptr, d_bad_ptr, d_line, num_chunks, CHUNKS_POW2)
        d_tau = _load_tau(tau_d_ptr, d_line, FILTERED)
    rejected_token = tl.load(tokens_ptr + row.to(tl.int64) * tok_stride_b + j_draft, mask=rejected, other=-1).to(tl.int32)
    chunk_start = chunk * chunk_size
    chunk_end = tl.minimum(chunk_start + chunk_size, V)
    offsets = tl.arange(0, BLOCK)
    best_r = -1.0
    best_r_idx = chunk_start
    best_p = -1.0
    best_p_idx = chunk_start
    draft_end = tl.where(rejected, tl.minimum(chunk_end, Vd), 0)  # q = 0 for the bonus and beyond Vd
    if (temperature > 0) & (invalid == 0):
        for start in range(chunk_start, chunk_end, BLOCK):
            idx = start + offsets
            mask = idx < chunk_end
            s = tl.load(t_row + j * t_stride_k + idx, mask=mask, other=float("-inf")).to(tl.float32) / scale
            p = _prob(s, t_maxv, t_norm, t_tau)
            if HAS_DRAFT:
                d_mask = idx < draft_end
                d = tl.load(d_row + j_draft * d_stride_k + idx, mask=d_mask, other=float("-inf")).to(tl.float32) / scale
                q = _prob(d, d_maxv, d_norm, d_tau)
            else:
                q = tl.where(idx == rejected_token, 1.0, 0.0)
            residual = tl.maximum(p - q, 0.0)
            exponential = -tl.log(open_uniform(seed, idx, j, row, 1))  # stream 1: the race
            key_r = tl.where(mask, residual / exponential, -1.0)
            key_p = tl.where(mask, p / exponential, -1.0)
            best_r, best_r_idx = _running_argmax(key_r, start, best_r, best_r_idx)
            best_p, best_p_idx = _running_argmax(key_p, start, best_p, best_p_idx)
    out = row.to(tl.int64) * num_chunks + chunk
    tl.store(race_val_ptr + out, best_r)
    tl.store(race_idx_ptr + out, best_r_idx)
    tl.store(bonus_val_ptr + out, best_p)
    tl.store(bonus_idx_ptr + out, best_p_idx)


@triton.jit
def finalize_kernel(
    tokens_ptr,  # (B, K) draft tokens
    num_draft_ptr,  # (B,) int64
    temperature_ptr,  # (B,) float32
    t_argval_ptr,
    t_arg_ptr,  # target argmax partials (B * (K+1), NUM_CHUNKS)
    race_val_ptr,
    race_idx_ptr,
    bonus_val_ptr,
    bonus_idx_ptr,  # (B, NUM_CHUNKS)
    num_accepted_ptr,  # (B,) int64 in/out
    invalid_ptr,  # (B,) int32
    out_ptr,  # (B, K+1) int64 out
    K,
    V,
    tok_stride_b,
    num_chunks,
    CHUNKS_POW2: tl.constexpr,
    K1_POW2: tl.constexpr,
):
    row = tl.program_id(0)
    num_accepted = tl.load(num_accepted_ptr + row)
    invalid = tl.load(invalid_ptr + row) != 0
    greedy = tl.load(temperature_ptr + row) == 0

    chunks = tl.arange(0, CHUNKS_POW2)
    cmask = chunks < num_chunks
    offs = row.to(tl.int64) * num_chunks + chunks
    race_val = tl.load(race_val_ptr + offs, mask=cmask, other=-1.0)
    race_best = tl.max(race_val, axis=0)
    race_winner = tl.min(tl.where(cmask & (race_val == race_best), tl.load(race_idx_ptr + offs, mask=cmask, other=0), 2147483647), axis=0)
    bonus_val = tl.load(bonus_val_ptr + offs, mask=cmask, other=-1.0)
    bonus_best = tl.max(bonus_val, axis=0)
    bonus_winner = tl.min(tl.where(cmask & (bonus_val == bonus_best), tl.load(bonus_idx_ptr + offs, mask=cmask, other=0), 2147483647), axis=0)
    # A residual that is zero everywhere (p equals q up to rounding) falls back to p.
    winner = tl.where(race_best > 0, race_winner, bonus_winner)
    greedy_winner = _combine_argmax(t_argval_ptr, t_arg_ptr, row * (K + 1) + num_accepted, num_chunks, CHUNKS_POW2)
    winner = tl.where(greedy, greedy_winner, winner).to(tl.int64)
    invalid = invalid | (winner < 0) | (winner >= V)  # never emit an out-of-range id

    positions = tl.arange(0, K1_POW2)
    drafts = tl.load(tokens_ptr + row.to(tl.int64) * tok_stride_b + positions, mask=positions < K, other=-1).to(tl.int64)
    out = tl.where(positions < num_accepted, drafts, tl.where(positions == num_accepted, winner, -1))
    out = tl.where(invalid, -1, out)
    tl.store(out_ptr + row.to(tl.int64) * (K + 1) + positions, out, mask=positions < K + 1)
    tl.store(num_accepted_ptr + row, tl.where(invalid, 0, num_accepted))
