"""Acceptance walk, exponential race and finalisation in one launch.

Grid (B, chunks): the launcher picks chunks so that B * chunks fills the GPU (at least four
programs per multiprocessor) whatever B is. Every program of a row

1. combines the row's line statistics (a (positions, tiles) block of partials, all positions at
   once), evaluates p and q of every draft, the acceptance coins, and so the first rejection j
   (the walk is a handful of vector operations, repeated by each program of the row);
2. races its vocabulary chunk at position j: argmax r(y) / E_y with r = max(p - q, 0) after a
   rejection, r = p for the bonus draw (q is not even loaded then), per-lane running maxima and
   one block reduction at the end;
3. publishes its chunk's winner and takes a ticket from the row's arrival counter. The last
   program to arrive picks the row's winner (lowest index among equal keys), writes tokens,
   num_accepted, logprobs and accept_probs, and resets the counter to 0 for the next call (so a
   CUDA graph can replay the launch).

If every residual of a rejected row is zero (p equals q up to rounding) the race runs on p
instead; that race, needed only in this rounding corner, is run by the finalising program.
"""

import triton
import triton.language as tl

from .random import acceptance_coins, divide, exp, fast_reciprocal, log2_uniform, position_words, race_uniforms, reciprocal


@triton.jit
def _combine_lines(part_m_ptr, part_z_ptr, first_line, positions, used, parts_used, PARTS: tl.constexpr, PP: tl.constexpr):
    """(max, normaliser, bad) of the lines ``first_line + positions`` from their per-part partials.

    bad: NaN or +inf seen, an empty line (max -inf) or a non-finite scaled max. ``used`` only says
    which lines exist: the loads never wait for a row's n_b (lines past it hold stale values, and
    every use of the result is masked by the line's own use)."""
    parts = tl.arange(0, PP)
    offs = (first_line + positions).to(tl.int64)[:, None] * PARTS + parts[None, :]
    # Whole rows of partials (the workspace is padded past the last line's PP slots), so each
    # thread reads 16-byte vectors; the slots past the line's parts are masked after the load.
    part_m = tl.load(part_m_ptr + offs, mask=used[:, None], other=float("-inf"))
    part_z = tl.load(part_z_ptr + offs, mask=used[:, None], other=0.0)
    valid = parts[None, :] < parts_used
    part_m = tl.where(valid, part_m, float("-inf"))
    part_z = tl.where(valid, part_z, 0.0)
    line_max = tl.max(part_m, axis=1)
    seen = tl.max(((part_m != part_m) | (part_z != part_z) | (part_m == float("inf"))).to(tl.int32), axis=1) != 0
    ref = tl.where((line_max == float("-inf")) | (line_max == float("inf")), 0.0, line_max)
    weights = tl.where(part_m == float("-inf"), 0.0, exp(part_m - ref[:, None]))
    normaliser = tl.sum(part_z * weights, axis=1)
    bad = seen | (line_max == float("-inf")) | (line_max == float("inf")) | (normaliser != normaliser)
    return line_max, normaliser, bad


@triton.jit
def _combine_argmax(part_m_ptr, part_i_ptr, first_line, positions, used, parts_used, line_max, PARTS: tl.constexpr, PP: tl.constexpr):
    """Lowest index of the raw max of each line (greedy lines store the raw max in part_m)."""
    parts = tl.arange(0, PP)
    offs = (first_line + positions).to(tl.int64)[:, None] * PARTS + parts[None, :]
    part_m = tl.load(part_m_ptr + offs, mask=used[:, None], other=float("-inf"))
    part_i = tl.load(part_i_ptr + offs, mask=used[:, None], other=2147483647)
    mask = used[:, None] & (parts[None, :] < parts_used)
    return tl.min(tl.where(mask & (part_m == line_max[:, None]), part_i, 2147483647), axis=1)


@triton.jit
def row_parameters(temperature_ptr, top_k_ptr, top_p_ptr, count_ptr, seeds_ptr, offsets_ptr, base_key, row, limit,
                   HAS_SEEDS: tl.constexpr, HAS_OFFSETS: tl.constexpr):
    """(temperature, inv_t, count clamped to [0, limit] as int32, key, offset, invalid) of a row (the
    count: a chain's or block's n_b, a tree's nodes); invalid for any parameter, count, key or
    offset out of range (check=True has raised before)."""
    row64 = row.to(tl.int64)
    temperature = tl.load(temperature_ptr + row)
    inv_t = tl.math.div_rn(1.0, tl.where(temperature > 0, temperature, 1.0))
    requested = tl.load(count_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    temperature_ok = (temperature >= 0) & (temperature != float("inf"))  # False for NaN
    top_p_ok = (top_p > 0) & (top_p <= 1)
    invalid = (temperature_ok == 0) | (top_k < 0) | (top_p_ok == 0) | (requested < 0) | (requested > limit)
    if HAS_SEEDS:
        key = tl.load(seeds_ptr + row)
        invalid = invalid | (key < 0)
    else:
        key = base_key + row64
    if HAS_OFFSETS:
        offset = tl.load(offsets_ptr + row)
        invalid = invalid | (offset < 0)
    else:
        offset = row64 * 0
    return temperature, inv_t, tl.minimum(tl.maximum(requested, 0), limit).to(tl.int32), key, offset, invalid


@triton.jit
def keep_better(race_key, lane_best, lane_tile, tile):
    """Per-lane running maxima of race keys and the tile of each (strict: an earlier tile keeps a
    tie, the lower id)."""
    better = race_key > lane_best
    return tl.where(better, race_key, lane_best), tl.where(better, tile, lane_tile)


@triton.jit
def lanes_winner(lane_best, lane_tile, start, BLOCK: tl.constexpr):
    """(best key, lowest id with it) of per-lane running maxima over BLOCK-id tiles from ``start``."""
    best = tl.max(lane_best, axis=0)
    lane_index = start + lane_tile * BLOCK + tl.arange(0, BLOCK)
    return best, tl.min(tl.where(lane_best == best, lane_index, 2147483647), axis=0)


@triton.jit
def chunk_winner(race_val_ptr, race_idx_ptr, row64, num_chunks, FINAL_BLOCK: tl.constexpr):
    """(best key, its id) over the row's chunk results: the lowest id among equal keys (chunks are
    in id order). Read with .cg: the other programs' results are in L2, not in this SM's L1."""
    winner_key = -1.0
    winner = 0
    for first in range(0, num_chunks, FINAL_BLOCK):
        chunks = first + tl.arange(0, FINAL_BLOCK)
        cmask = chunks < num_chunks
        vals = tl.load(race_val_ptr + row64 * num_chunks + chunks, mask=cmask, other=-1.0, cache_modifier=".cg")
        idxs = tl.load(race_idx_ptr + row64 * num_chunks + chunks, mask=cmask, other=2147483647, cache_modifier=".cg")
        block_best = tl.max(vals, axis=0)
        block_winner = tl.min(tl.where(cmask & (vals == block_best), idxs, 2147483647), axis=0)
        better = block_best > winner_key  # an earlier block keeps a tie
        winner = tl.where(better, block_winner, winner)
        winner_key = tl.where(better, block_best, winner_key)
    return winner_key, winner


@triton.jit
def emitted_logprobs(t_line, winner, V, positions, j, raw_x, inv_t, t_max, t_norm, t_tau, greedy, part_rm_ptr, part_rz_ptr, t_first, t_lines,
                     t_parts, LOGPROBS: tl.constexpr, PARTS: tl.constexpr, PP: tl.constexpr):
    """Log-probabilities of the emitted tokens of a row: the drafts' raw logits ``raw_x`` before
    position j, the winner's at j (its line ``t_line``); processed (LOGPROBS 1) or raw (2)."""
    raw_w = tl.load(t_line + tl.minimum(tl.maximum(winner, 0), V - 1)).to(tl.float32)
    raw_e = tl.where(positions == j, raw_w, raw_x)
    s_e = raw_e * inv_t
    processed = tl.where(s_e >= t_tau, (s_e - t_max) - tl.log(t_norm), float("-inf"))
    if LOGPROBS == 2:
        r_max, r_norm, _ = _combine_lines(part_rm_ptr, part_rz_ptr, t_first, positions, t_lines, t_parts, PARTS, PP)
        raw_lp = (raw_e - r_max) - tl.log(r_norm)
        # Greedy lines hold their raw statistics in part_m / part_z (inv_t = 1 there).
        return tl.where(greedy, processed, raw_lp)
    else:
        return processed


@triton.jit
def _pick(values, positions, j, other):
    """values[j] of a per-position vector."""
    return tl.max(tl.where(positions == j, values, other), axis=0)


@triton.jit
def _prob(s, line_max, normaliser, normaliser_rcp, tau, FILTERED: tl.constexpr):
    """Processed probability exp(s - m) / z of scaled logits s (0 where cut off; s = -inf gives 0)."""
    p = divide(exp(s - line_max), normaliser, normaliser_rcp)
    if FILTERED:
        p = tl.where(s >= tau, p, 0.0)
    return p


@triton.jit
def _race_tile(
    key, t_line, d_line, tile_start, end, draft_end, p_lo, p_hi, inv_t,
    t_max, t_norm, t_rcp, t_tau, d_max, d_norm, d_rcp, d_tau, rejected_token,
    RESIDUAL: tl.constexpr, HAS_DRAFT: tl.constexpr, MASKED: tl.constexpr, FILTERED: tl.constexpr, STREAM: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Race keys r(y) * (1 / E_y) of the ids tile_start + [0, BLOCK) (-1 past ``end`` when MASKED)."""
    idx = tile_start + tl.arange(0, BLOCK)
    if MASKED:
        s = tl.load(t_line + idx, mask=idx < end, other=float("-inf")).to(tl.float32) * inv_t
    else:
        s = tl.load(t_line + idx).to(tl.float32) * inv_t
    r = _prob(s, t_max, t_norm, t_rcp, t_tau, FILTERED)
    if RESIDUAL:
        if HAS_DRAFT:
            if MASKED:
                d = tl.load(d_line + idx, mask=idx < draft_end, other=float("-inf")).to(tl.float32) * inv_t
            else:
                d = tl.load(d_line + idx).to(tl.float32) * inv_t
            q = _prob(d, d_max, d_norm, d_rcp, d_tau, FILTERED)
        else:
            q = tl.where(idx == rejected_token, 1.0, 0.0)
        r = tl.maximum(r - q, 0.0)
    # r / E with E = -ln(2) log2(u): the positive factor ln(2) does not move the argmax.
    race_key = r * -fast_reciprocal(log2_uniform(race_uniforms(key, tile_start, p_lo, p_hi, STREAM, BLOCK), INTERPRET), INTERPRET)
    if MASKED:
        race_key = tl.where(idx < end, race_key, -1.0)
    return race_key


@triton.jit
def _race_range(
    key, t_line, d_line, start, end, draft_end, p_lo, p_hi, inv_t,
    t_max, t_norm, t_rcp, t_tau, d_max, d_norm, d_rcp, d_tau, rejected_token,
    RESIDUAL: tl.constexpr, HAS_DRAFT: tl.constexpr, FILTERED: tl.constexpr, STREAM: tl.constexpr, INTERPRET: tl.constexpr, BLOCK: tl.constexpr,
):
    """(best key, lowest index with it) of the race over the ids [start, end), start a multiple of BLOCK.

    The keys are r(y) / E_y up to the positive factor of the reciprocal's rounding: argmax r / E.
    RESIDUAL: r = max(p - q, 0) (q from the draft line, or one-hot at ``rejected_token``); else r = p.
    Whole tiles run unmasked (ids below ``draft_end`` = min(end, Vd) are then all in the draft's
    vocabulary when full_end <= draft_end); the last, partial tile masks."""
    lane_best = tl.full((BLOCK,), -1.0, tl.float32)
    lane_tile = tl.zeros((BLOCK,), tl.int32)
    full_end = start + (tl.minimum(end, draft_end) - start) // BLOCK * BLOCK
    full_end = tl.maximum(full_end, start)
    tile = 0
    for tile_start in range(start, full_end, BLOCK):
        tile_start = tl.multiple_of(tile_start, BLOCK)
        race_key = _race_tile(key, t_line, d_line, tile_start, end, draft_end, p_lo, p_hi, inv_t, t_max, t_norm, t_rcp, t_tau,
                              d_max, d_norm, d_rcp, d_tau, rejected_token, RESIDUAL, HAS_DRAFT, False, FILTERED, STREAM, INTERPRET, BLOCK)
        lane_best, lane_tile = keep_better(race_key, lane_best, lane_tile, tile)
        tile += 1
    for tile_start in range(full_end, end, BLOCK):
        tile_start = tl.multiple_of(tile_start, BLOCK)
        race_key = _race_tile(key, t_line, d_line, tile_start, end, draft_end, p_lo, p_hi, inv_t, t_max, t_norm, t_rcp, t_tau,
                              d_max, d_norm, d_rcp, d_tau, rejected_token, RESIDUAL, HAS_DRAFT, True, FILTERED, STREAM, INTERPRET, BLOCK)
        lane_best, lane_tile = keep_better(race_key, lane_best, lane_tile, tile)
        tile += 1
    return lanes_winner(lane_best, lane_tile, start, BLOCK)


@triton.jit(do_not_specialize=["batch", "base_key", "t_parts", "d_parts", "tiles_per_chunk", "num_chunks"])
def race_kernel(
    target_ptr,  # (B, K+1, V) raw target logits, last dim contiguous
    draft_ptr,  # (B, K, Vd) raw draft logits (unused without HAS_DRAFT)
    tokens_ptr,  # (B, K) int32 / int64 draft tokens
    temperature_ptr,  # (B,) float32, 0 = greedy
    top_k_ptr,  # (B,) int64 (validity only; the cut-off is in tau)
    top_p_ptr,  # (B,) float32 (validity only)
    num_draft_ptr,  # (B,) int64
    seeds_ptr,  # (B,) int64 per-row keys (read only with HAS_SEEDS)
    offsets_ptr,  # (B,) int64 absolute position of draft position 0 (read only with HAS_OFFSETS)
    tau_ptr,  # (lines,) float32 cut-offs (read only when FILTERED)
    part_m_ptr,  # (lines, PARTS) float32 line statistics partials (line_stats_kernel)
    part_z_ptr,
    part_i_ptr,  # (lines, PARTS) int32
    part_rm_ptr,  # (lines, PARTS) float32 (LOGPROBS == 2)
    part_rz_ptr,
    gathered_ptr,  # (lines,) float32: the raw logit at each position's draft token (line_stats_kernel)
    race_val_ptr,  # (B, >= num_chunks) float32 workspace: each chunk's best key
    race_idx_ptr,  # (B, >= num_chunks) int32 workspace: its index
    counter_ptr,  # (B,) int32 workspace, 0 between calls: programs of the row that arrived
    out_tokens_ptr,  # (B, K+1) int64 out
    out_accepted_ptr,  # (B,) int64 out
    out_logprobs_ptr,  # (B, K+1) float32 out (LOGPROBS != 0)
    out_accept_ptr,  # (B, K) float32 out (ACCEPT_PROBS)
    base_key: tl.int64,  # row b's key is base_key + b without HAS_SEEDS
    batch,
    K,
    V,
    Vd,
    t_stride_b,
    t_stride_k,
    d_stride_b,
    d_stride_k,
    tok_stride_b,
    t_parts,  # statistics partials of a target line (line_stats_kernel's grid)
    d_parts,  # statistics partials of a draft line
    tiles_per_chunk,  # race tiles (BLOCK ids) per chunk
    num_chunks,  # programs per row
    PARTS: tl.constexpr,  # line statistics partial slots per line
    PP: tl.constexpr,  # next power of two of PARTS
    KP: tl.constexpr,  # next power of two of K + 1
    STREAM: tl.constexpr,  # 1 verify, 2 sample
    HAS_DRAFT: tl.constexpr,
    HAS_SEEDS: tl.constexpr,
    HAS_OFFSETS: tl.constexpr,
    CHECK: tl.constexpr,  # blank for a bad value in any used line, not only the lines the walk reads
    FILTERED: tl.constexpr,
    LOGPROBS: tl.constexpr,  # 0 none, 1 processed, 2 raw
    ACCEPT_PROBS: tl.constexpr,
    INTERPRET: tl.constexpr,
    BLOCK: tl.constexpr,  # ids per race tile
    FINAL_BLOCK: tl.constexpr,  # chunk results read per step when finalising
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    row64 = row.to(tl.int64)

    # Row parameters; anything out of range blanks the row (check=True has raised before).
    temperature, inv_t, num_draft, key, offset, invalid = row_parameters(temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, seeds_ptr, offsets_ptr,
                                                                        base_key, row, K, HAS_SEEDS, HAS_OFFSETS)
    greedy = temperature == 0
    stochastic = temperature != 0  # sampled rows (and bad temperatures, which blank the row)
    lines_t = batch * (K + 1)
    t_first = row * (K + 1)
    d_first = lines_t + row * K
    t_row = target_ptr + row64 * t_stride_b
    d_row = draft_ptr + row64 * d_stride_b

    # 1. The walk, all positions at once.
    positions = tl.arange(0, KP)
    # Per-position copies of row flags (vector & scalar booleans trip the interpreter).
    stochastic_v = tl.where(stochastic, positions >= 0, positions < 0)
    drafted = positions < num_draft  # positions with a draft to verify
    t_used = positions <= num_draft
    t_lines = positions <= K
    d_lines = positions < K
    # Everything below until j is loaded at once: no load waits for n_b or the temperature.
    t_max, t_norm, t_bad = _combine_lines(part_m_ptr, part_z_ptr, t_first, positions, t_lines, t_parts, PARTS, PP)
    t_rcp = reciprocal(tl.where(t_norm > 0, t_norm, 1.0))
    if FILTERED:
        t_tau = tl.where(stochastic_v, tl.load(tau_ptr + t_first + positions, mask=t_lines, other=float("-inf")), float("-inf"))
    else:
        t_tau = tl.full((KP,), float("-inf"), tl.float32)
    tokens = tl.load(tokens_ptr + row64 * tok_stride_b + positions, mask=positions < K, other=0).to(tl.int64)
    invalid = invalid | (tl.max((drafted & ((tokens < 0) | (tokens >= Vd))).to(tl.int32), axis=0) != 0)
    tokens = tl.minimum(tl.maximum(tokens, 0), Vd - 1).to(tl.int32)
    raw_x = tl.load(gathered_ptr + t_first + positions, mask=d_lines, other=0.0)
    s_x = raw_x * inv_t
    p_x = _prob(s_x, t_max, t_norm, t_rcp, t_tau, FILTERED)
    if HAS_DRAFT:
        d_used = drafted & stochastic_v
        if CHECK:
            d_used = drafted
        d_max, d_norm, d_bad = _combine_lines(part_m_ptr, part_z_ptr, d_first, positions, d_lines, d_parts, PARTS, PP)
        d_rcp = reciprocal(tl.where(d_norm > 0, d_norm, 1.0))
        if FILTERED:
            d_tau = tl.where(stochastic_v, tl.load(tau_ptr + d_first + positions, mask=d_lines, other=float("-inf")), float("-inf"))
        else:
            d_tau = tl.full((KP,), float("-inf"), tl.float32)
        d_x = tl.load(gathered_ptr + d_first + positions, mask=d_lines, other=0.0) * inv_t
        q_x = _prob(d_x, d_max, d_norm, d_rcp, d_tau, FILTERED)
    else:
        q_x = tl.full((KP,), 1.0, tl.float32)
    coins = acceptance_coins(key, offset + positions)
    if greedy:
        argmax = _combine_argmax(part_m_ptr, part_i_ptr, t_first, positions, t_lines, t_parts, t_max, PARTS, PP)
    else:
        argmax = tl.zeros((KP,), tl.int32)
    accept = drafted & tl.where(greedy, tokens == argmax, coins * q_x < p_x)
    j = tl.min(tl.where(accept, KP, positions), axis=0)  # first position not accepted (<= n_b)
    rejected = j < num_draft
    # Lines whose values count: those the walk reads (every used one with CHECK).
    if CHECK:
        t_read = t_used
    else:
        t_read = t_used & (positions <= j)
    read_bad = t_read & t_bad
    if HAS_DRAFT:
        if CHECK:
            d_read = d_used
        else:
            d_read = d_used & (positions <= j)
        read_bad = read_bad | (d_read & d_bad)
    invalid = invalid | (tl.max(read_bad.to(tl.int32), axis=0) != 0)

    # 2. The race over this program's chunk at position j.
    j_max = _pick(t_max, positions, j, float("-inf"))
    j_norm = _pick(t_norm, positions, j, 0.0)
    j_rcp = _pick(t_rcp, positions, j, 0.0)
    j_tau = _pick(t_tau, positions, j, float("-inf"))
    p_lo, p_hi = position_words(offset + j)
    t_line = t_row + j.to(tl.int64) * t_stride_k
    j_draft = tl.minimum(j, tl.maximum(K - 1, 0))
    d_line = d_row + j_draft.to(tl.int64) * d_stride_k
    rejected_token = _pick(tokens, positions, j, 0)
    if HAS_DRAFT:
        jd_max = _pick(d_max, positions, j, float("-inf"))
        jd_norm = _pick(d_norm, positions, j, 0.0)
        jd_rcp = _pick(d_rcp, positions, j, 0.0)
        jd_tau = _pick(d_tau, positions, j, float("-inf"))
    else:
        jd_max = j_max
        jd_norm = j_norm
        jd_rcp = j_rcp
        jd_tau = j_tau
    start = chunk * tiles_per_chunk * BLOCK
    end = tl.minimum(start + tiles_per_chunk * BLOCK, V)
    draft_end = tl.minimum(end, Vd)  # q = 0 beyond the draft's vocabulary
    if not HAS_DRAFT:
        draft_end = end
    best = -1.0
    best_index = start
    if stochastic & (invalid == 0):
        if rejected:
            best, best_index = _race_range(
                key, t_line, d_line, start, end, draft_end, p_lo, p_hi, inv_t, j_max, j_norm, j_rcp, j_tau, jd_max, jd_norm, jd_rcp, jd_tau,
                rejected_token, True, HAS_DRAFT, FILTERED, STREAM, INTERPRET, BLOCK,
            )
        else:
            best, best_index = _race_range(
                key, t_line, d_line, start, end, end, p_lo, p_hi, inv_t, j_max, j_norm, j_rcp, j_tau, jd_max, jd_norm, jd_rcp, jd_tau,
                rejected_token, False, HAS_DRAFT, FILTERED, STREAM, INTERPRET, BLOCK,
            )
    slot = row64 * num_chunks + chunk
    tl.store(race_val_ptr + slot, best)
    tl.store(race_idx_ptr + slot, best_index)
    tl.debug_barrier()  # every thread's stores precede the release below
    ticket = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")

    # 3. The last program of the row finalises.
    if ticket == num_chunks - 1:
        winner_key, winner = chunk_winner(race_val_ptr, race_idx_ptr, row64, num_chunks, FINAL_BLOCK)
        if rejected & stochastic & (invalid == 0) & (winner_key <= 0.0):
            # Every residual is zero: race p over the whole line.
            _, winner = _race_range(
                key, t_line, d_line, 0, V, V, p_lo, p_hi, inv_t, j_max, j_norm, j_rcp, j_tau, jd_max, jd_norm, jd_rcp, jd_tau,
                rejected_token, False, HAS_DRAFT, FILTERED, STREAM, INTERPRET, BLOCK,
            )
        winner = tl.where(greedy, _pick(argmax, positions, j, 0), winner)
        invalid = invalid | (winner < 0) | (winner >= V)  # never emit an out-of-range id
        emitted = tl.where(positions < j, tokens, tl.where(positions == j, winner, -1))
        emitted = tl.where(invalid, -1, emitted)
        tl.store(out_tokens_ptr + row64 * (K + 1) + positions, emitted.to(tl.int64), mask=positions <= K)
        tl.store(out_accepted_ptr + row, tl.where(invalid, 0, j).to(tl.int64))
        if LOGPROBS != 0:
            values = emitted_logprobs(t_line, winner, V, positions, j, raw_x, inv_t, t_max, t_norm, t_tau, greedy, part_rm_ptr, part_rz_ptr, t_first,
                                      t_lines, t_parts, LOGPROBS, PARTS, PP)
            tl.store(out_logprobs_ptr + row64 * (K + 1) + positions, tl.where(emitted >= 0, values, float("nan")), mask=positions <= K)
        if ACCEPT_PROBS:
            ratio = tl.where(q_x > 0, tl.minimum(tl.math.div_rn(p_x, tl.where(q_x > 0, q_x, 1.0)), 1.0), (p_x > 0).to(tl.float32))
            ratio = tl.where(greedy, (tokens == argmax).to(tl.float32), ratio)
            examined = drafted & (positions <= j) & tl.where(invalid, positions < 0, positions >= 0)
            tl.store(out_accept_ptr + row64 * K + positions, tl.where(examined, ratio, float("nan")), mask=positions < K)
        tl.store(counter_ptr + row, 0)  # ready for the next call (and the next graph replay)
