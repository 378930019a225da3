"""Fused tree and block verification kernels (semantics: specdec_ext/reference_tree.py).

Nothing of size (B, N, V) is written. Per logits line (a row at one context) the kernels keep a few
statistics; a residual is the closed form w(y) = max(a p(y) - c q(y) - [y = h], 0) [y not in S] of
per-row scalars (a, c, h, S), re-evaluated when it is needed.

1. ``chunk_stats_kernel``  grid (lines, chunks): per vocabulary chunk, the raw maximum (and its
   first index), a NaN / +inf flag, sum exp(s - max s) over the chunk (unfiltered lines) and the raw
   sum exp(raw - max raw) (raw log-probabilities).
2. ``line_stats_kernel``   grid (lines,): m = max s, the top-k / top-p cut-off tau (bisection over
   the int32 order keys of float32: count and mass passes over the line, no sort) and z.
3. ``tree_walk_kernel`` / ``block_walk_kernel``  grid (B,): the walk down the tree (recursive
   rejection sampling, a residual-mass pass over the line after each rejection) or block
   verification's joint stop; each writes the residual of its final context.
4. ``race_kernel``         grid (B, chunks): the exponential race argmax w(y) / E_y of that residual,
   one race per row split over vocabulary chunks.
5. ``tree_finalize_kernel`` / ``block_finalize_kernel``  grid (B,): the winner, tokens, paths, logprobs.

Random numbers: Philox4x32-10 (tl.philox), counter (rank, P_lo, P_hi, 0) word 0 for the coins and
(y >> 2, P_lo, P_hi, 1) word y & 3 for the race, P = offset + depth (specdec_ext/_philox.py).
"""

import triton
import triton.language as tl


@triton.jit
def _uniform(word):
    return ((word >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07


@triton.jit
def _coin(key, position, rank):
    """Acceptance coin of sibling rank ``rank`` at absolute position ``position`` (scalars)."""
    wide = tl.zeros([1], dtype=tl.int64)
    c0 = (wide + rank).to(tl.uint32)
    c1 = ((wide + position) & 0xFFFFFFFF).to(tl.uint32)
    c2 = ((wide + position) >> 32).to(tl.uint32)
    c3 = c0 * 0
    w0, _, _, _ = tl.philox(key, c0, c1, c2, c3)
    return tl.sum(_uniform(w0), axis=0)


@triton.jit
def _race_exponentials(key, position, ids):
    """E_y = -log(u_y) for the ids of a tile: word y & 3 of counter (y >> 2, P_lo, P_hi, 1)."""
    c0 = (ids >> 2).to(tl.uint32)
    c1 = c0 * 0 + (position & 0xFFFFFFFF).to(tl.uint32)
    c2 = c0 * 0 + (position >> 32).to(tl.uint32)
    c3 = c0 * 0 + 1
    w0, w1, w2, w3 = tl.philox(key, c0, c1, c2, c3)
    lane = ids & 3
    word = tl.where(lane == 0, w0, tl.where(lane == 1, w1, tl.where(lane == 2, w2, w3)))
    return -tl.log(_uniform(word))


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
def chunk_stats_kernel(
    logits_ptr,  # (B, L, Vl) raw logits, any float dtype, last dim contiguous
    inv_t_ptr,  # (B,) float32 1 / T (1 for greedy rows)
    raw_max_ptr,  # (lines, CHUNKS) float32 out
    raw_arg_ptr,  # (lines, CHUNKS) int64 out: first index of the raw maximum
    raw_sum_ptr,  # (lines, CHUNKS) float32 out: sum exp(raw - chunk raw max)
    bad_ptr,  # (lines, CHUNKS) int32 out: NaN or +inf seen
    s_sum_ptr,  # (lines, CHUNKS) float32 out: sum exp(s - chunk max s), s = raw * inv_t
    L,
    Vl,
    stride_b,
    stride_l,
    chunk_size,
    num_chunks,
    BLOCK: tl.constexpr,
):
    line = tl.program_id(0)
    chunk = tl.program_id(1)
    row = line // L
    pos = line % L
    inv_t = tl.load(inv_t_ptr + row)
    base = logits_ptr + row.to(tl.int64) * stride_b + pos.to(tl.int64) * stride_l
    start_c = chunk * chunk_size
    end_c = tl.minimum(start_c + chunk_size, Vl)
    offs = tl.arange(0, BLOCK)
    run_max = float("-inf")
    run_arg = start_c.to(tl.int64)
    run_raw_sum = 0.0
    run_s_sum = 0.0
    bad = 0
    for start in range(start_c, end_c, BLOCK):
        idx = start + offs
        mask = idx < end_c
        raw = tl.load(base + idx, mask=mask, other=float("-inf")).to(tl.float32)
        bad = bad | tl.max(((raw != raw) | (raw == float("inf"))) & mask, axis=0).to(tl.int32)
        raw = tl.where(raw != raw, float("-inf"), raw)
        tile_max = tl.max(raw, axis=0)
        tile_arg = start + tl.argmax(raw, axis=0, tie_break_left=True)
        new_max = tl.maximum(run_max, tile_max)
        finite = new_max > float("-inf")
        rescale = tl.where(run_max > float("-inf"), tl.exp(run_max - new_max), 0.0)
        raw_terms = tl.where(mask & (raw > float("-inf")), tl.exp(raw - new_max), 0.0)
        run_raw_sum = tl.where(finite, run_raw_sum * rescale + tl.sum(raw_terms, axis=0), 0.0)
        s = raw * inv_t
        s_max_new = new_max * inv_t
        s_rescale = tl.where(run_max > float("-inf"), tl.exp(run_max * inv_t - s_max_new), 0.0)
        s_terms = tl.where(mask & (s > float("-inf")), tl.exp(s - s_max_new), 0.0)
        run_s_sum = tl.where(finite, run_s_sum * s_rescale + tl.sum(s_terms, axis=0), 0.0)
        run_arg = tl.where(tile_max > run_max, tile_arg.to(tl.int64), run_arg)
        run_max = new_max
    out = line.to(tl.int64) * num_chunks + chunk
    tl.store(raw_max_ptr + out, run_max)
    tl.store(raw_arg_ptr + out, run_arg)
    tl.store(raw_sum_ptr + out, run_raw_sum)
    tl.store(bad_ptr + out, bad)
    tl.store(s_sum_ptr + out, run_s_sum)


@triton.jit
def _counts_at_least(base, Vl, inv_t, keys, BLOCK: tl.constexpr):
    """(S,) counts of values with order key >= each of ``keys`` (S,), in one pass over the line."""
    offs = tl.arange(0, BLOCK)
    counts = keys * 0
    for start in range(0, Vl, BLOCK):
        idx = start + offs
        s = tl.load(base + idx, mask=idx < Vl, other=float("-inf")).to(tl.float32) * inv_t
        hit = (order_key(s)[:, None] >= keys[None, :]) & (idx < Vl)[:, None]
        counts += tl.sum(hit.to(tl.int64), axis=0)
    return counts


@triton.jit
def _masses_above(base, Vl, inv_t, m, keys, floor, BLOCK: tl.constexpr):
    """(S,) sums of exp(s - m) over the values with order key > each of ``keys`` and s >= ``floor``."""
    offs = tl.arange(0, BLOCK)
    masses = (keys * 0).to(tl.float32)
    for start in range(0, Vl, BLOCK):
        idx = start + offs
        s = tl.load(base + idx, mask=idx < Vl, other=float("-inf")).to(tl.float32) * inv_t
        weight = tl.where((idx < Vl) & (s >= floor) & (s > float("-inf")), tl.exp(s - m), 0.0)
        take = order_key(s)[:, None] > keys[None, :]
        masses += tl.sum(tl.where(take, weight[:, None], 0.0), axis=0)
    return masses


@triton.jit
def _mass_above(base, Vl, inv_t, m, key, floor, BLOCK: tl.constexpr):
    """sum exp(s - m) over the values with order key > ``key`` and s >= ``floor``."""
    offs = tl.arange(0, BLOCK)
    mass = 0.0
    for start in range(0, Vl, BLOCK):
        idx = start + offs
        s = tl.load(base + idx, mask=idx < Vl, other=float("-inf")).to(tl.float32) * inv_t
        take = (idx < Vl) & (order_key(s) > key) & (s >= floor) & (s > float("-inf"))
        mass += tl.sum(tl.where(take, tl.exp(s - m), 0.0), axis=0)
    return mass


@triton.jit
def _probes(lo, hi, SECTIONS: tl.constexpr):
    """SECTIONS keys strictly between lo and hi (int64), evenly spread; those not below hi are masked
    out by the caller (they equal hi)."""
    j = tl.arange(0, SECTIONS).to(tl.int64) + 1
    step = tl.maximum((hi - lo) // (SECTIONS + 1), 1)
    return tl.minimum(lo + j * step, hi)


@triton.jit
def line_stats_kernel(
    logits_ptr,  # (B, L, Vl) raw logits
    inv_t_ptr,  # (B,) float32
    greedy_ptr,  # (B,) int32: 1 for a greedy row (no filter, no normaliser needed)
    top_k_ptr,  # (B,) int64, 0 = off
    top_p_ptr,  # (B,) float32, 1 = off
    raw_max_ptr,
    raw_arg_ptr,
    raw_sum_ptr,
    bad_ptr,
    s_sum_ptr,  # (lines, CHUNKS) partials of chunk_stats_kernel
    m_ptr,  # (lines,) float32 out: max s
    z_ptr,  # (lines,) float32 out: sum over kept of exp(s - m)
    tau_ptr,  # (lines,) float32 out: keep s >= tau
    arg_ptr,  # (lines,) int64 out: first index of the raw maximum
    raw_logz_ptr,  # (lines,) float32 out: raw max + log sum exp(raw - raw max)
    line_bad_ptr,  # (lines,) int32 out: NaN / +inf / empty line / scaled max not finite (sampled rows)
    L,
    Vl,
    stride_b,
    stride_l,
    num_chunks,
    CHUNKS_POW2: tl.constexpr,
    FILTERED: tl.constexpr,
    BLOCK: tl.constexpr,
    SECTIONS: tl.constexpr,  # keys tested per pass of the cut-off search (a power of two)
):
    line = tl.program_id(0)
    row = line // L
    pos = line % L
    inv_t = tl.load(inv_t_ptr + row)
    greedy = tl.load(greedy_ptr + row) != 0
    chunks = tl.arange(0, CHUNKS_POW2)
    cmask = chunks < num_chunks
    offs = line.to(tl.int64) * num_chunks + chunks
    part_max = tl.load(raw_max_ptr + offs, mask=cmask, other=float("-inf"))
    part_arg = tl.load(raw_arg_ptr + offs, mask=cmask, other=0)
    part_raw = tl.load(raw_sum_ptr + offs, mask=cmask, other=0.0)
    part_s = tl.load(s_sum_ptr + offs, mask=cmask, other=0.0)
    raw_max = tl.max(part_max, axis=0)
    arg = tl.min(tl.where(cmask & (part_max == raw_max), part_arg, 9223372036854775807), axis=0)
    has = raw_max > float("-inf")
    raw_weights = tl.where(cmask & (part_max > float("-inf")), tl.exp(part_max - raw_max), 0.0)
    raw_z = tl.sum(part_raw * raw_weights, axis=0)
    bad = (tl.max(tl.load(bad_ptr + offs, mask=cmask, other=0), axis=0) != 0) | ~has
    m = raw_max * inv_t
    bad = bad | ((m != m) | (m == float("inf")) | (m == float("-inf"))) & ~greedy
    s_weights = tl.where(cmask & (part_max > float("-inf")), tl.exp(part_max * inv_t - m), 0.0)
    z = tl.sum(part_s * s_weights, axis=0)
    tau = float("-inf")
    if FILTERED:
        top_k = tl.load(top_k_ptr + row)
        top_p = tl.load(top_p_ptr + row)
        use_k = (top_k > 0) & (top_k < Vl) & ~greedy & ~bad
        use_p = (top_p < 1.0) & ~greedy & ~bad
        base = logits_ptr + row.to(tl.int64) * stride_b + pos.to(tl.int64) * stride_l
        if use_k:
            # The k-th largest value: the largest key t with count(key(s) >= t) >= k. A multisection
            # search: each pass over the line tests SECTIONS keys at once (enough(lo), not enough(hi)).
            hi = order_key(m).to(tl.int64) + 1
            lo = hi * 0 - 2147483648
            for _ in range(12):
                if hi - lo > 1:
                    probes = _probes(lo, hi, SECTIONS)
                    enough = (_counts_at_least(base, Vl, inv_t, probes, BLOCK) >= top_k) & (probes < hi)
                    lo = tl.maximum(lo, tl.max(tl.where(enough, probes, lo), axis=0))
                    hi = tl.minimum(hi, tl.min(tl.where(~enough & (probes < hi), probes, hi), axis=0))
            tau = key_to_float(lo.to(tl.int32))
        if use_p:
            # The smallest value whose strictly greater mass (inside the top-k set) is below top_p times that set's mass.
            floor_key = order_key(tau).to(tl.int64)
            budget = top_p * (_mass_above(base, Vl, inv_t, m, (floor_key - 1).to(tl.int32), tau, BLOCK))
            below_floor = _mass_above(base, Vl, inv_t, m, floor_key.to(tl.int32), tau, BLOCK) < budget
            if not below_floor:
                # The smallest key t with mass(key(s) > t) < budget (not ok(lo), ok(hi)), by multisection.
                lo = floor_key
                hi = order_key(m).to(tl.int64)
                for _ in range(12):
                    if hi - lo > 1:
                        probes = _probes(lo, hi, SECTIONS)
                        inside = probes < hi
                        ok = (_masses_above(base, Vl, inv_t, m, probes, tau, BLOCK) < budget) & inside
                        hi = tl.minimum(hi, tl.min(tl.where(ok, probes, hi), axis=0))
                        lo = tl.maximum(lo, tl.max(tl.where(~ok & inside, probes, lo), axis=0))
                tau = key_to_float(hi.to(tl.int32))
        if use_k | use_p:
            z = _mass_above(base, Vl, inv_t, m, (order_key(tau).to(tl.int64) - 1).to(tl.int32), tau, BLOCK)
    tl.store(m_ptr + line, m)
    tl.store(z_ptr + line, z)
    tl.store(tau_ptr + line, tau)
    tl.store(arg_ptr + line, arg)
    tl.store(raw_logz_ptr + line, raw_max + tl.log(raw_z))
    tl.store(line_bad_ptr + line, bad.to(tl.int32))


@triton.jit
def _prob_at(base, x, inv_t, m, z, tau):
    s = tl.load(base + x).to(tl.float32) * inv_t
    return tl.where(s >= tau, tl.exp(s - m) / z, 0.0)


@triton.jit
def _residual_tile(t_base, d_base, idx, V, Vd, inv_t, p_m, p_z, p_tau, q_m, q_z, q_tau, a, c, hot, removed, HAS_DRAFT: tl.constexpr):
    """(w, p) on a tile of ids: w = max(a p - c q - [y = hot], 0) [y not removed]."""
    s = tl.load(t_base + idx, mask=idx < V, other=float("-inf")).to(tl.float32) * inv_t
    p = tl.where((s >= p_tau) & (idx < V), tl.exp(s - p_m) / p_z, 0.0)
    q = 0.0 * p
    if HAS_DRAFT:
        sq = tl.load(d_base + idx, mask=idx < Vd, other=float("-inf")).to(tl.float32) * inv_t
        q = tl.where((sq >= q_tau) & (idx < Vd), tl.exp(sq - q_m) / q_z, 0.0)
    w = tl.maximum(a * p - c * q - tl.where(idx == hot, 1.0, 0.0), 0.0)
    gone = tl.sum((idx[:, None] == removed[None, :]).to(tl.int32), axis=1) > 0
    return tl.where(gone, 0.0, w), p, q


@triton.jit
def tree_walk_kernel(
    target_ptr,  # (B, N+1, V) raw logits
    draft_ptr,  # (B, N+1, Vd) raw logits (unused without HAS_DRAFT)
    tokens_ptr,  # (B, N) int64 node tokens
    children_ptr,  # (B, N+1, W) int64: node of the child of rank r at context c, -1 beyond the last
    num_nodes_ptr,  # (B,) int64
    pre_bad_ptr,  # (B,) int32: bad parameters, keys, offsets, tree or node ids (found on the host side)
    inv_t_ptr,  # (B,) float32
    greedy_ptr,  # (B,) int32
    keys_ptr,  # (B,) int64 Philox keys
    offsets_ptr,  # (B,) int64
    t_m_ptr, t_z_ptr, t_tau_ptr, t_arg_ptr, t_bad_ptr,  # (B * (N+1),) target line statistics
    d_m_ptr, d_z_ptr, d_tau_ptr, d_bad_ptr,  # (B * (N+1),) draft line statistics
    state_line_ptr,  # (B,) int64 out: final context
    state_depth_ptr,  # (B,) int64 out: entered nodes
    state_c_ptr,  # (B,) float32 out: c of the final residual
    state_removed_ptr,  # (B, W_POW2) int64 out: removed ids (-1 = none)
    state_bad_ptr,  # (B,) int32 out
    path_ptr,  # (B, D) int64 out: entered nodes (-1 beyond)
    N,
    V,
    Vd,
    W,
    D,
    t_stride_b, t_stride_l, d_stride_b, d_stride_l,
    HAS_DRAFT: tl.constexpr,
    WITHOUT_REPLACEMENT: tl.constexpr,
    CHECK: tl.constexpr,
    W_POW2: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    contexts = N + 1
    line0 = row.to(tl.int64) * contexts
    used = tl.load(num_nodes_ptr + row)
    bad = tl.load(pre_bad_ptr + row) != 0
    greedy = tl.load(greedy_ptr + row) != 0
    inv_t = tl.load(inv_t_ptr + row)
    key = tl.load(keys_ptr + row)
    offset = tl.load(offsets_ptr + row)
    t_row = target_ptr + row.to(tl.int64) * t_stride_b
    d_row = draft_ptr + row.to(tl.int64) * d_stride_b
    slots = tl.arange(0, W_POW2)
    if CHECK:  # every line the row could use
        for ctx in range(0, contexts):
            if ctx <= used:
                bad = bad | (tl.load(t_bad_ptr + line0 + ctx) != 0)
                if HAS_DRAFT:
                    has_children = tl.load(children_ptr + (line0 + ctx) * W) >= 0
                    bad = bad | (has_children & (tl.load(d_bad_ptr + line0 + ctx) != 0))
    ctx = offset * 0  # int64 scalars
    depth = offset * 0
    c = 0.0
    removed = tl.full([W_POW2], -1, tl.int64)
    n_removed = 0
    walking = ~bad
    for _ in range(0, contexts):
        if walking:
            line = line0 + ctx
            bad = bad | (tl.load(t_bad_ptr + line) != 0)
            p_m = tl.load(t_m_ptr + line)
            p_z = tl.load(t_z_ptr + line)
            p_tau = tl.load(t_tau_ptr + line)
            argmax = tl.load(t_arg_ptr + line)
            first_child = tl.load(children_ptr + line * W)
            q_m = 0.0
            q_z = 1.0
            q_tau = 0.0
            if HAS_DRAFT:
                if (first_child >= 0) & ~greedy:
                    bad = bad | (tl.load(d_bad_ptr + line) != 0)
                    q_m = tl.load(d_m_ptr + line)
                    q_z = tl.load(d_z_ptr + line)
                    q_tau = tl.load(d_tau_ptr + line)
            t_base = t_row + ctx.to(tl.int64) * t_stride_l
            d_base = d_row + ctx.to(tl.int64) * d_stride_l
            c = 0.0
            mass = 1.0
            draft_mass = 1.0
            removed = tl.full([W_POW2], -1, tl.int64)
            n_removed = 0
            entered = offset * 0 - 1
            for rank in range(0, W):
                child = tl.load(children_ptr + line * W + rank)
                if (child >= 0) & (entered < 0) & ~bad:
                    x = tl.load(tokens_ptr + row.to(tl.int64) * N + child)
                    if greedy:
                        entered = tl.where(x == argmax, child, entered)
                    else:
                        x_removed = tl.sum(((removed == x) & (slots < n_removed)).to(tl.int32), axis=0) > 0
                        p_x = _prob_at(t_base, x, inv_t, p_m, p_z, p_tau)
                        if HAS_DRAFT:
                            q_x = _prob_at(d_base, x, inv_t, q_m, q_z, q_tau)
                            w_x = tl.maximum(p_x - c * q_x, 0.0)
                            if WITHOUT_REPLACEMENT:
                                w_x = tl.where(x_removed, 0.0, w_x)
                                proposal = tl.where(x_removed, 0.0, q_x)
                            else:
                                proposal = q_x
                        else:
                            w_x = tl.where(x_removed, 0.0, p_x)
                            proposal = 1.0
                        u = _coin(key, offset + depth, rank)
                        if u * proposal * mass < w_x * draft_mass:
                            entered = child
                        else:
                            # The next residual (c, S), and its mass; kept only if it is not zero everywhere.
                            new_c = c
                            if HAS_DRAFT:
                                new_c = c + mass / draft_mass
                            new_removed = removed
                            new_n = n_removed
                            if WITHOUT_REPLACEMENT or not HAS_DRAFT:
                                new_removed = tl.where(slots == n_removed, x, removed)
                                new_n = n_removed + 1
                            offs = tl.arange(0, BLOCK)
                            new_mass = 0.0
                            new_draft_mass = draft_mass
                            if WITHOUT_REPLACEMENT:
                                new_draft_mass = 0.0
                            for start in range(0, V, BLOCK):
                                idx = start + offs
                                live = tl.where(slots < new_n, new_removed, -1)
                                w, p, q = _residual_tile(t_base, d_base, idx, V, Vd, inv_t, p_m, p_z, p_tau, q_m, q_z, q_tau, 1.0, new_c, -1, live,
                                                         HAS_DRAFT)
                                new_mass += tl.sum(w, axis=0)
                                if WITHOUT_REPLACEMENT:
                                    gone = tl.sum((idx[:, None] == live[None, :]).to(tl.int32), axis=1) > 0
                                    new_draft_mass += tl.sum(tl.where(gone, 0.0, q), axis=0)
                            if new_mass > 0.0:
                                c = new_c
                                mass = new_mass
                                draft_mass = new_draft_mass
                                removed = new_removed
                                n_removed = new_n
            walking = (entered >= 0) & ~bad
            if walking:
                tl.store(path_ptr + row.to(tl.int64) * D + depth, entered)
                ctx = entered + 1
                depth += 1
    tl.store(state_line_ptr + row, line0 + ctx)
    tl.store(state_depth_ptr + row, depth)
    tl.store(state_c_ptr + row, c)
    tl.store(state_removed_ptr + row.to(tl.int64) * W_POW2 + slots, tl.where(slots < n_removed, removed, -1))
    tl.store(state_bad_ptr + row, bad.to(tl.int32))


@triton.jit
def race_kernel(
    target_ptr,  # (B, L, V) raw logits
    draft_ptr,  # (B, Ld, Vd) raw logits (unused without HAS_DRAFT)
    inv_t_ptr,  # (B,) float32
    keys_ptr,
    offsets_ptr,  # (B,) int64
    t_m_ptr, t_z_ptr, t_tau_ptr,  # target line statistics
    d_m_ptr, d_z_ptr, d_tau_ptr,  # draft line statistics
    state_line_ptr,  # (B,) int64: target line (row * L + context)
    state_draft_ptr,  # (B,) int64: draft line, -1 = none (q = 0)
    state_depth_ptr,  # (B,) int64: the race's position is offset + depth
    state_a_ptr,  # (B,) float32
    state_c_ptr,  # (B,) float32
    state_hot_ptr,  # (B,) int64: id of a point-mass proposal to subtract, -1 = none
    state_removed_ptr,  # (B, W_POW2) int64
    race_val_ptr, race_idx_ptr, bonus_val_ptr, bonus_idx_ptr,  # (B, CHUNKS) out
    L,
    Ld,
    V,
    Vd,
    t_stride_b, t_stride_l, d_stride_b, d_stride_l,
    chunk_size,
    num_chunks,
    HAS_DRAFT: tl.constexpr,
    W_POW2: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    inv_t = tl.load(inv_t_ptr + row)
    key = tl.load(keys_ptr + row)
    line = tl.load(state_line_ptr + row)
    position = tl.load(offsets_ptr + row) + tl.load(state_depth_ptr + row)
    a = tl.load(state_a_ptr + row)
    c = tl.load(state_c_ptr + row)
    hot = tl.load(state_hot_ptr + row)
    removed = tl.load(state_removed_ptr + row.to(tl.int64) * W_POW2 + tl.arange(0, W_POW2))
    p_m = tl.load(t_m_ptr + line)
    p_z = tl.load(t_z_ptr + line)
    p_tau = tl.load(t_tau_ptr + line)
    t_base = target_ptr + row.to(tl.int64) * t_stride_b + (line - row.to(tl.int64) * L) * t_stride_l
    d_line = tl.load(state_draft_ptr + row)
    q_m = 0.0
    q_z = 1.0
    q_tau = float("inf")  # no draft line: q = 0
    d_base = draft_ptr
    if HAS_DRAFT:
        if d_line >= 0:
            q_m = tl.load(d_m_ptr + d_line)
            q_z = tl.load(d_z_ptr + d_line)
            q_tau = tl.load(d_tau_ptr + d_line)
            d_base = draft_ptr + row.to(tl.int64) * d_stride_b + (d_line - row.to(tl.int64) * Ld) * d_stride_l
    start_c = chunk * chunk_size
    end_c = tl.minimum(start_c + chunk_size, V)
    offs = tl.arange(0, BLOCK)
    best = 0.0
    best_idx = -1
    best_p = -1.0
    best_p_idx = 0
    for start in range(start_c, end_c, BLOCK):
        idx = start + offs
        mask = idx < end_c
        w, p, _ = _residual_tile(t_base, d_base, idx, V, Vd, inv_t, p_m, p_z, p_tau, q_m, q_z, q_tau, a, c, hot, removed, HAS_DRAFT)
        e = _race_exponentials(key, position, idx.to(tl.int64))
        value = tl.where(mask, w / e, 0.0)
        tile_best = tl.max(value, axis=0)
        tile_idx = start + tl.argmax(value, axis=0, tie_break_left=True)
        take = tile_best > best
        best_idx = tl.where(take, tile_idx, best_idx)
        best = tl.where(take, tile_best, best)
        by_p = tl.where(mask, p / e, -1.0)
        tile_p = tl.max(by_p, axis=0)
        tile_p_idx = start + tl.argmax(by_p, axis=0, tie_break_left=True)
        take_p = tile_p > best_p
        best_p_idx = tl.where(take_p, tile_p_idx, best_p_idx)
        best_p = tl.where(take_p, tile_p, best_p)
    out = row.to(tl.int64) * num_chunks + chunk
    tl.store(race_val_ptr + out, best)
    tl.store(race_idx_ptr + out, best_idx.to(tl.int64))
    tl.store(bonus_val_ptr + out, best_p)
    tl.store(bonus_idx_ptr + out, best_p_idx.to(tl.int64))


@triton.jit
def _winner(race_val_ptr, race_idx_ptr, bonus_val_ptr, bonus_idx_ptr, row, num_chunks, CHUNKS_POW2: tl.constexpr):
    chunks = tl.arange(0, CHUNKS_POW2)
    cmask = chunks < num_chunks
    offs = row.to(tl.int64) * num_chunks + chunks
    values = tl.load(race_val_ptr + offs, mask=cmask, other=0.0)
    idxs = tl.load(race_idx_ptr + offs, mask=cmask, other=-1)
    best = tl.max(values, axis=0)
    first = tl.min(tl.where(cmask & (values == best) & (values > 0.0), chunks, CHUNKS_POW2), axis=0)
    winner = tl.sum(tl.where(chunks == first, idxs, 0), axis=0)
    p_values = tl.load(bonus_val_ptr + offs, mask=cmask, other=-1.0)
    p_idxs = tl.load(bonus_idx_ptr + offs, mask=cmask, other=0)
    p_best = tl.max(p_values, axis=0)
    p_first = tl.min(tl.where(cmask & (p_values == p_best), chunks, CHUNKS_POW2), axis=0)
    p_winner = tl.sum(tl.where(chunks == p_first, p_idxs, 0), axis=0)
    return tl.where(best > 0.0, winner, p_winner)


@triton.jit
def tree_finalize_kernel(
    tokens_ptr,  # (B, N) int64
    greedy_ptr,  # (B,) int32
    t_arg_ptr,  # (B * (N+1),) int64
    state_line_ptr, state_depth_ptr, state_bad_ptr,
    path_ptr,  # (B, D) int64
    race_val_ptr, race_idx_ptr, bonus_val_ptr, bonus_idx_ptr,
    out_tokens_ptr,  # (B, D+1) int64 out
    out_accepted_ptr,  # (B,) int64 out
    N,
    D,
    num_chunks,
    CHUNKS_POW2: tl.constexpr,
    D1_POW2: tl.constexpr,
):
    row = tl.program_id(0)
    bad = tl.load(state_bad_ptr + row) != 0
    depth = tl.load(state_depth_ptr + row)
    winner = _winner(race_val_ptr, race_idx_ptr, bonus_val_ptr, bonus_idx_ptr, row, num_chunks, CHUNKS_POW2)
    winner = tl.where(tl.load(greedy_ptr + row) != 0, tl.load(t_arg_ptr + tl.load(state_line_ptr + row)), winner)
    cols = tl.arange(0, D1_POW2)
    nodes = tl.load(path_ptr + row.to(tl.int64) * D + cols, mask=(cols < depth) & (cols < D), other=0)
    node_tokens = tl.load(tokens_ptr + row.to(tl.int64) * N + nodes, mask=(cols < depth) & (cols < D), other=-1)
    out = tl.where(cols < depth, node_tokens, tl.where(cols == depth, winner, -1))
    out = tl.where(bad, -1, out)
    tl.store(out_tokens_ptr + row.to(tl.int64) * (D + 1) + cols, out, mask=cols < D + 1)
    tl.store(out_accepted_ptr + row, tl.where(bad, 0, depth))
    paths = tl.load(path_ptr + row.to(tl.int64) * D + cols, mask=cols < D, other=-1)
    tl.store(path_ptr + row.to(tl.int64) * D + cols, tl.where(bad | (cols >= depth), -1, paths), mask=cols < D)


@triton.jit
def block_walk_kernel(
    target_ptr,  # (B, K+1, V) raw logits
    draft_ptr,  # (B, K, Vd) raw logits (unused without HAS_DRAFT)
    tokens_ptr,  # (B, K) int64 drafts
    num_draft_ptr,  # (B,) int64
    pre_bad_ptr,  # (B,) int32
    inv_t_ptr,  # (B,) float32
    greedy_ptr,  # (B,) int32
    keys_ptr,
    offsets_ptr,  # (B,) int64
    t_m_ptr, t_z_ptr, t_tau_ptr, t_arg_ptr, t_bad_ptr,  # (B * (K+1),)
    d_m_ptr, d_z_ptr, d_tau_ptr, d_bad_ptr,  # (B * K,)
    state_line_ptr, state_draft_ptr, state_depth_ptr, state_a_ptr, state_c_ptr, state_hot_ptr, state_bad_ptr,  # (B,) out
    K,
    V,
    Vd,
    t_stride_b, t_stride_l, d_stride_b, d_stride_l,
    HAS_DRAFT: tl.constexpr,
    CHECK: tl.constexpr,
    K1_POW2: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    t_line0 = row.to(tl.int64) * (K + 1)
    d_line0 = row.to(tl.int64) * K
    n = tl.load(num_draft_ptr + row)
    bad = tl.load(pre_bad_ptr + row) != 0
    n = tl.minimum(tl.maximum(n, 0), K)
    greedy = tl.load(greedy_ptr + row) != 0
    inv_t = tl.load(inv_t_ptr + row)
    key = tl.load(keys_ptr + row)
    offset = tl.load(offsets_ptr + row)
    t_row = target_ptr + row.to(tl.int64) * t_stride_b
    d_row = draft_ptr + row.to(tl.int64) * d_stride_b
    for i in range(0, K + 1):  # sampled rows (and check=True) read every line up to n
        need = (i <= n) & ~greedy
        if CHECK:
            need = i <= n
        if need:
            bad = bad | (tl.load(t_bad_ptr + t_line0 + i) != 0)
            if HAS_DRAFT:
                if i < n:
                    bad = bad | (tl.load(d_bad_ptr + d_line0 + i) != 0)
    tau = n * 0  # int64
    a = 1.0
    if greedy:
        going = ~bad
        for i in range(0, K + 1):
            if going:
                bad = bad | (tl.load(t_bad_ptr + t_line0 + i) != 0)
                token = tl.load(tokens_ptr + row.to(tl.int64) * K + i, mask=i < K, other=-1)
                match = (i < n) & (token == tl.load(t_arg_ptr + t_line0 + i))
                going = match & ~bad
                tau = tl.where(match, n * 0 + i + 1, tau)
    else:
        # p_i = min(1, p_{i-1} p(x_i) / q(x_i)); kept in a register vector indexed by i.
        cols = tl.arange(0, K1_POW2)
        carried = tl.where(cols == 0, 1.0, 0.0)
        previous = 1.0
        for i in range(1, K + 1):
            if i <= n:
                x = tl.load(tokens_ptr + row.to(tl.int64) * K + i - 1)
                p_x = _prob_at(t_row + (i - 1) * t_stride_l, x, inv_t, tl.load(t_m_ptr + t_line0 + i - 1), tl.load(t_z_ptr + t_line0 + i - 1),
                               tl.load(t_tau_ptr + t_line0 + i - 1))
                q_x = 1.0
                if HAS_DRAFT:
                    q_x = _prob_at(d_row + (i - 1) * d_stride_l, x, inv_t, tl.load(d_m_ptr + d_line0 + i - 1), tl.load(d_z_ptr + d_line0 + i - 1),
                                   tl.load(d_tau_ptr + d_line0 + i - 1))
                joint = previous * p_x
                ratio = tl.where(q_x > 0.0, joint / q_x, tl.where(joint > 0.0, 1.0, 0.0))
                previous = tl.minimum(ratio, 1.0)
                carried = tl.where(cols == i, previous, carried)
        # The last i whose coin passes (searched from n down).
        found = bad
        for step in range(0, K):
            at = n - step
            if (at >= 1) & ~found:
                eta = _coin(key, offset + at - 1, 0)
                weight = tl.sum(tl.where(cols == at, carried, 0.0), axis=0)
                stop = eta < weight
                if at < n:
                    offs = tl.arange(0, BLOCK)
                    p_m = tl.load(t_m_ptr + t_line0 + at)
                    p_z = tl.load(t_z_ptr + t_line0 + at)
                    p_tau = tl.load(t_tau_ptr + t_line0 + at)
                    q_m = 0.0
                    q_z = 1.0
                    q_tau = 0.0
                    hot = n * 0 - 1
                    if HAS_DRAFT:
                        q_m = tl.load(d_m_ptr + d_line0 + at)
                        q_z = tl.load(d_z_ptr + d_line0 + at)
                        q_tau = tl.load(d_tau_ptr + d_line0 + at)
                    else:
                        hot = tl.load(tokens_ptr + row.to(tl.int64) * K + at)
                    no_removed = tl.full([2], -1, tl.int64)
                    inner = 0.0
                    for start in range(0, V, BLOCK):
                        idx = start + offs
                        w, _, _ = _residual_tile(t_row + at * t_stride_l, d_row + at * d_stride_l, idx, V, Vd, inv_t, p_m, p_z, p_tau, q_m, q_z, q_tau,
                                                 weight, 1.0, hot, no_removed, HAS_DRAFT)
                        inner += tl.sum(w, axis=0)
                    stop = eta * (inner + (1.0 - weight)) < inner
                tau = tl.where(stop, at, tau)
                found = stop
        a = tl.where(tau < n, tl.sum(tl.where(cols == tau, carried, 0.0), axis=0), 1.0)
    residual = (tau < n) & ~greedy
    tl.store(state_line_ptr + row, t_line0 + tau)
    tl.store(state_depth_ptr + row, tau)
    tl.store(state_a_ptr + row, tl.where(residual, a, 1.0))
    if HAS_DRAFT:
        tl.store(state_draft_ptr + row, tl.where(residual, d_line0 + tau, -1))
        tl.store(state_c_ptr + row, tl.where(residual, 1.0, 0.0))
        tl.store(state_hot_ptr + row, n * 0 - 1)
    else:
        tl.store(state_draft_ptr + row, n * 0 - 1)
        tl.store(state_c_ptr + row, 0.0)
        hot_id = tl.load(tokens_ptr + row.to(tl.int64) * K + tl.minimum(tau, K - 1), mask=residual, other=-1)
        tl.store(state_hot_ptr + row, tl.where(residual, hot_id, -1))
    tl.store(state_bad_ptr + row, bad.to(tl.int32))


@triton.jit
def block_finalize_kernel(
    target_ptr,  # (B, K+1, V) raw logits
    tokens_ptr,  # (B, K) int64
    greedy_ptr,  # (B,) int32
    inv_t_ptr,  # (B,) float32
    t_m_ptr, t_z_ptr, t_tau_ptr, t_arg_ptr, t_logz_ptr,  # (B * (K+1),)
    state_line_ptr, state_depth_ptr, state_bad_ptr,
    race_val_ptr, race_idx_ptr, bonus_val_ptr, bonus_idx_ptr,
    out_tokens_ptr,  # (B, K+1) int64 out
    out_accepted_ptr,  # (B,) int64 out
    out_logprobs_ptr,  # (B, K+1) float32 out (when LOGPROBS)
    K,
    t_stride_b, t_stride_l,
    num_chunks,
    CHUNKS_POW2: tl.constexpr,
    K1_POW2: tl.constexpr,
    LOGPROBS: tl.constexpr,  # 0 none, 1 processed, 2 raw
):
    row = tl.program_id(0)
    bad = tl.load(state_bad_ptr + row) != 0
    tau = tl.load(state_depth_ptr + row)
    greedy = tl.load(greedy_ptr + row) != 0
    winner = _winner(race_val_ptr, race_idx_ptr, bonus_val_ptr, bonus_idx_ptr, row, num_chunks, CHUNKS_POW2)
    winner = tl.where(greedy, tl.load(t_arg_ptr + tl.load(state_line_ptr + row)), winner)
    cols = tl.arange(0, K1_POW2)
    drafts = tl.load(tokens_ptr + row.to(tl.int64) * K + cols, mask=cols < tl.minimum(tau, K), other=-1)
    out = tl.where(cols < tau, drafts, tl.where(cols == tau, winner, -1))
    out = tl.where(bad, -1, out)
    tl.store(out_tokens_ptr + row.to(tl.int64) * (K + 1) + cols, out, mask=cols < K + 1)
    tl.store(out_accepted_ptr + row, tl.where(bad, 0, tau))
    if LOGPROBS != 0:
        lines = row.to(tl.int64) * (K + 1) + cols
        valid = (cols < K + 1) & (out >= 0)
        raw = tl.load(target_ptr + row.to(tl.int64) * t_stride_b + cols.to(tl.int64) * t_stride_l + tl.maximum(out, 0), mask=valid, other=0.0).to(tl.float32)
        raw_lp = raw - tl.load(t_logz_ptr + lines, mask=valid, other=0.0)
        inv_t = tl.load(inv_t_ptr + row)
        s = raw * inv_t
        m = tl.load(t_m_ptr + lines, mask=valid, other=0.0)
        z = tl.load(t_z_ptr + lines, mask=valid, other=1.0)
        cut = tl.load(t_tau_ptr + lines, mask=valid, other=float("-inf"))
        processed = tl.where(s >= cut, (s - m) - tl.log(z), float("-inf"))
        value = raw_lp
        if LOGPROBS == 1:
            value = tl.where(greedy, raw_lp, processed)
        tl.store(out_logprobs_ptr + row.to(tl.int64) * (K + 1) + cols, tl.where(valid, value, float("nan")), mask=cols < K + 1)
