"""Tree and block verification kernels (semantics: specdec_ext/reference_tree.py).

A tree or block call first runs the chain's line statistics (stats.py): the per-part partials of
every used target and draft line, and for blocks each draft's logit at its token. Lines are
numbered as stats.py's ``line_of`` reads them with K = N for a tree (the target's B(N+1)
contexts, then the draft's first N contexts per row: context N, the last node's, has no
children). Then two launches:

1. ``tree_walk_kernel``, grid (B,): the walk down the tree (recursive rejection sampling, one
   residual-mass pass over the line after each rejection but the one that ends the walk, whose
   residual the race tests: row state's undo). ``block_walk_kernel``, grid
   (B * (K-1) * chunks,): block verification's joint stop, in work items: each sums one chunk of
   the vocabulary of one position's residual mass S_i = sum_y max(p_i P_i(y) - Q_i(y), 0) (unless
   the row stops at n, or the coin cannot stop the walk at i), and the row's last item to arrive
   searches the stop from n down over the summed chunks. (One program a row summing S_i from n down until a coin stops it
   would read line after line: at B = 64 some row nearly always reads K - 1 of them.) Nothing of
   size V is written: each row leaves its final residual w(y) = max(a p(y) - c q(y) - [y = h], 0)
   [y not in S] as a few scalars (the row state below). With top-k / top-p the walk is
   ``cut_walk_kernel``: the cut-offs launch's work items (cutoffs.py: each line's cut and its
   statistics over the kept values), then the walk items (a tree's one a row), which wait until
   every line's cut is final.
2. ``tree_race_kernel`` / ``block_race_kernel``, grid (B, chunks): the exponential race argmax
   w(y) / E_y over each chunk of the vocabulary; the last program of a row to arrive picks the
   winner, writes the row's outputs and resets the row's counter (a CUDA graph replays as is).

Row state (written by the walks, read by the races), per row:
  state_f (8 float32): a, c, target line (m, z, tau), draft line (m, z, tau)
  state_i (8 int32): context / position of the residual, its draft line's context (-1: q = 0),
  depth, h (-1: none), bad, greedy winner, |S|, undo (-1: none; else a tree walk's last rejection
  left its residual unsummed, and undo holds the c before it as float32 bits: the residual before
  that rejection is c = undo, S less its last id; the race takes it where the last is zero everywhere)
  removed (NP int32): the ids of S.

Random numbers: random.py (coins of sibling rank r: word 0 of (r, P_lo, P_hi, 0); the race: word
y & 3 of (y >> 2, P_lo, P_hi, 1)), P = offset + depth (specdec_ext/_philox.py).
"""

import triton
import triton.language as tl

from .cutoffs import cutoff_exit, cutoff_items, searches_ended
from .race import _combine_argmax, _combine_lines, _prob, chunk_winner, emitted_logprobs, keep_better, lanes_winner, row_parameters
from .random import fast_reciprocal, log2_uniform, position_words, race_uniforms, ranked_coins, reciprocal

# --------------------------------------------------------------------------------------------------
# Shared by the walks and the races


@triton.jit
def _line_summary(part_m_ptr, part_z_ptr, tau_ptr, line, parts_used, sampled, PARTS: tl.constexpr, PP: tl.constexpr, FILTERED: tl.constexpr):
    """(max, normaliser, its reciprocal, cut-off, bad) of one line from its statistics partials."""
    one = tl.arange(0, 1)
    line_max, normaliser, bad = _combine_lines(part_m_ptr, part_z_ptr, line, one, one >= 0, parts_used, PARTS, PP)
    line_max = tl.max(line_max, axis=0)
    normaliser = tl.max(normaliser, axis=0)
    bad = tl.max(bad.to(tl.int32), axis=0) != 0
    tau = float("-inf")
    if FILTERED:
        if sampled:
            tau = tl.load(tau_ptr + line)
    return line_max, normaliser, reciprocal(tl.where(normaliser > 0, normaliser, 1.0)), tau, bad


@triton.jit
def _line_argmax(part_m_ptr, part_i_ptr, line, parts_used, line_max, PARTS: tl.constexpr, PP: tl.constexpr):
    """Lowest index of the raw max of one greedy line."""
    one = tl.arange(0, 1)
    return tl.max(_combine_argmax(part_m_ptr, part_i_ptr, line, one, one >= 0, parts_used, tl.zeros([1], tl.float32) + line_max, PARTS, PP), axis=0)


@triton.jit
def _at(values, positions, j):
    """values[j] of a per-position vector (a sum with one term: -inf, NaN and ints stay exact)."""
    return tl.sum(tl.where(positions == j, values, tl.zeros_like(values)), axis=0)


@triton.jit
def _coin(key, position, rank):
    """The coin of sibling rank ``rank`` at absolute ``position`` (scalars)."""
    one = tl.zeros([1], tl.int64)
    return tl.max(ranked_coins(key, one + position, one + rank), axis=0)


@triton.jit
def _store_state(state_f_ptr, state_i_ptr, row, a, c, t_max, t_norm, t_tau, d_max, d_norm, d_tau, position, draft_position, depth, hot, bad,
                 winner, removed_count, undo):
    f = state_f_ptr + row.to(tl.int64) * 8
    tl.store(f, a)
    tl.store(f + 1, c)
    tl.store(f + 2, t_max)
    tl.store(f + 3, t_norm)
    tl.store(f + 4, t_tau)
    tl.store(f + 5, d_max)
    tl.store(f + 6, d_norm)
    tl.store(f + 7, d_tau)
    i = state_i_ptr + row.to(tl.int64) * 8
    tl.store(i, position)
    tl.store(i + 1, draft_position)
    tl.store(i + 2, depth)
    tl.store(i + 3, hot)
    tl.store(i + 4, bad.to(tl.int32))
    tl.store(i + 5, winner)
    tl.store(i + 6, removed_count)
    tl.store(i + 7, undo)


@triton.jit
def _residual_tile(t_line, d_line, idx, end, draft_end, inv_t, t_max, t_norm, t_rcp, t_tau, d_max, d_norm, d_rcp, d_tau, a, c, hot, use_draft,
                   removed, removed_count, HAS_DRAFT: tl.constexpr, FILTERED: tl.constexpr):
    """(w, q) on the ids ``idx`` (masked past ``end``): w = max(a p - c q - [y = hot], 0) [y not in
    S], S the first ``removed_count`` slots of ``removed``; q = 0 past ``draft_end`` or without
    ``use_draft`` (the draft line is then not read)."""
    s = tl.load(t_line + idx, mask=idx < end, other=float("-inf")).to(tl.float32) * inv_t
    p = _prob(s, t_max, t_norm, t_rcp, t_tau, FILTERED)
    w = a * p - tl.where(idx == hot, 1.0, 0.0)
    q = tl.zeros_like(p)
    if HAS_DRAFT:
        in_draft = tl.where(use_draft, idx < draft_end, idx < 0)  # (a vector & scalar mask trips the interpreter)
        sq = tl.load(d_line + idx, mask=in_draft, other=float("-inf")).to(tl.float32) * inv_t
        q = tl.where(in_draft, _prob(sq, d_max, d_norm, d_rcp, d_tau, FILTERED), 0.0)
        w = w - c * q
    w = tl.maximum(w, 0.0)
    gone = idx < 0  # False
    for r in range(0, removed_count):
        gone = gone | (idx == tl.max(tl.where(tl.arange(0, removed.shape[0]) == r, removed, -1), axis=0))
    return tl.where(gone, 0.0, w), tl.where(gone, 0.0, q)


@triton.jit
def _residual_mass(t_line, d_line, start, end, draft_end, inv_t, t_max, t_norm, t_tau, d_max, d_norm, d_tau, a, c, hot, removed, removed_count,
                   HAS_DRAFT: tl.constexpr, FILTERED: tl.constexpr, DRAFT_MASS: tl.constexpr, BLOCK: tl.constexpr):
    """(sum_y max(a P(y) - c Q(y) - [y = hot], 0), sum_y Q(y) with DRAFT_MASS) over the ids
    [start, end) but the first ``removed_count`` of ``removed`` (Q = 0 past ``draft_end``; without
    HAS_DRAFT, Q is one-hot at ``hot``), lines of finite statistics: a block walk's S_i, a tree
    walk's residual masses Z and M. A mass a coin or a test is compared with, as a whole: its terms
    are not the race's weights, so each is exp2 of one fused multiply-add of the race's own exponent,
    exp(s - m) / z = exp2((s - m) log2 e - log2 z) (a few ulps from the race's division; its sum's
    order moves it as much). The exponent s - m is the race's: a line of one kept id (top-k 1, or a
    top-p its max alone reaches) has z = 1 and weight exactly 1 in both, so a residual the race finds
    zero everywhere sums to exactly 0 here (exp2 of x log2 e - m log2 e would be 1 +- an ulp, and a
    walk would take such a residual for a positive one). Each lane sums its own terms, one block
    reduction at the end."""
    t_shift = tl.log2(t_norm)
    d_shift = tl.log2(d_norm)
    lanes = tl.zeros((BLOCK,), tl.float32)
    draft_lanes = tl.zeros((BLOCK,), tl.float32)
    for tile in range(start, end, BLOCK):
        idx = tile + tl.arange(0, BLOCK)
        s = tl.load(t_line + idx, mask=idx < end, other=float("-inf")).to(tl.float32) * inv_t
        p = tl.exp2(tl.fma(s - t_max, 1.4426950408889634, -t_shift))
        if FILTERED:
            p = tl.where(s >= t_tau, p, 0.0)
        w = a * p - tl.where(idx == hot, 1.0, 0.0)
        q = tl.zeros_like(p)
        if HAS_DRAFT:
            sy = tl.load(d_line + idx, mask=idx < draft_end, other=float("-inf")).to(tl.float32) * inv_t
            q = tl.exp2(tl.fma(sy - d_max, 1.4426950408889634, -d_shift))
            if FILTERED:
                q = tl.where(sy >= d_tau, q, 0.0)
            w = w - c * q
        w = tl.maximum(w, 0.0)
        gone = idx < 0  # False
        for r in range(0, removed_count):
            gone = gone | (idx == tl.max(tl.where(tl.arange(0, removed.shape[0]) == r, removed, -1), axis=0))
        lanes += tl.where(gone, 0.0, w)
        if DRAFT_MASS:
            draft_lanes += tl.where(gone, 0.0, q)
    return tl.sum(lanes, axis=0), tl.sum(draft_lanes, axis=0)


# --------------------------------------------------------------------------------------------------
# Walks


@triton.jit
def _tree_walk_row(
    row, target_ptr, draft_ptr, tokens_ptr, parents_ptr, temperature_ptr, top_k_ptr, top_p_ptr, num_nodes_ptr, seeds_ptr, offsets_ptr, tau_ptr,
    part_m_ptr, part_z_ptr, part_i_ptr, state_f_ptr, state_i_ptr, removed_ptr, path_ptr, base_key, batch, N, V, Vd, t_stride_b, t_stride_n,
    d_stride_b, d_stride_n, tok_stride_b, parent_stride_b, t_parts, d_parts,
    PARTS: tl.constexpr, PP: tl.constexpr, NP: tl.constexpr, HAS_DRAFT: tl.constexpr, WITHOUT_REPLACEMENT: tl.constexpr, HAS_SEEDS: tl.constexpr,
    HAS_OFFSETS: tl.constexpr, CHECK: tl.constexpr, FILTERED: tl.constexpr, BLOCK: tl.constexpr,
):
    """The walk of one row (arguments as tree_walk_kernel's)."""
    row64 = row.to(tl.int64)
    temperature, inv_t, used, key, offset, invalid = row_parameters(temperature_ptr, top_k_ptr, top_p_ptr, num_nodes_ptr, seeds_ptr, offsets_ptr,
                                                                    base_key, row, N, HAS_SEEDS, HAS_OFFSETS)
    greedy = temperature == 0
    sampled = temperature != 0
    requested = tl.load(num_nodes_ptr + row)
    tree_bad = (requested < 0) | (requested > N)
    nodes = tl.arange(0, NP)
    in_use = nodes < used
    parents = tl.load(parents_ptr + row64 * parent_stride_b + nodes, mask=in_use, other=-2).to(tl.int32)  # -2: no context's child
    tokens = tl.load(tokens_ptr + row64 * tok_stride_b + nodes, mask=in_use, other=0).to(tl.int64)
    # A parent is -1 or a node below its child: the tree is acyclic and listed parents first.
    tree_bad = tree_bad | (tl.max((in_use & ((parents < -1) | (parents >= nodes))).to(tl.int32), axis=0) != 0)
    invalid = invalid | tree_bad | (tl.max((in_use & ((tokens < 0) | (tokens >= Vd))).to(tl.int32), axis=0) != 0)
    tokens = tl.minimum(tl.maximum(tokens, 0), Vd - 1).to(tl.int32)
    lines_t = batch * (N + 1)
    t_first = row * (N + 1)
    d_first = lines_t + row * N
    if CHECK:  # every line the row could use
        for ctx in range(0, N + 1):
            if ctx <= used:
                _, _, _, _, t_bad = _line_summary(part_m_ptr, part_z_ptr, tau_ptr, t_first + ctx, t_parts, sampled, PARTS, PP, FILTERED)
                invalid = invalid | t_bad
                if HAS_DRAFT:
                    if tl.max((in_use & (parents == ctx - 1)).to(tl.int32), axis=0) != 0:
                        _, _, _, _, d_bad = _line_summary(part_m_ptr, part_z_ptr, tau_ptr, d_first + ctx, d_parts, sampled, PARTS, PP, FILTERED)
                        invalid = invalid | d_bad

    ctx = row * 0  # the current context (int32 scalars)
    depth = row * 0
    c = 0.0
    removed = tl.full((NP,), -1, tl.int32)
    removed_count = row * 0
    path = tl.full((NP,), -1, tl.int32)
    t_max, t_norm, t_tau = 0.0, 1.0, float("-inf")
    d_max, d_norm, d_tau = 0.0, 1.0, float("-inf")
    argmax = row * 0
    undo = row * 0 - 1
    walking = invalid == 0
    for _ in range(0, N + 1):
        if walking:
            t_max, t_norm, t_rcp, t_tau, t_bad = _line_summary(part_m_ptr, part_z_ptr, tau_ptr, t_first + ctx, t_parts, sampled, PARTS, PP, FILTERED)
            invalid = invalid | t_bad
            children = in_use & (parents == ctx - 1)
            d_max, d_norm, d_rcp, d_tau = 0.0, 1.0, 1.0, float("-inf")
            if HAS_DRAFT:
                if (tl.max(children.to(tl.int32), axis=0) != 0) & sampled:
                    d_max, d_norm, d_rcp, d_tau, d_bad = _line_summary(part_m_ptr, part_z_ptr, tau_ptr, d_first + ctx, d_parts, sampled, PARTS, PP,
                                                                       FILTERED)
                    invalid = invalid | d_bad
            if greedy:
                argmax = _line_argmax(part_m_ptr, part_i_ptr, t_first + ctx, t_parts, t_max, PARTS, PP)
            t_line = target_ptr + row64 * t_stride_b + ctx.to(tl.int64) * t_stride_n
            d_line = draft_ptr + row64 * d_stride_b + ctx.to(tl.int64) * d_stride_n
            # The residual at this context: w = max(p - c q, 0) [y not in S], Z = mass, M = draft_mass.
            c = 0.0
            mass = 1.0
            draft_mass = 1.0
            removed = tl.full((NP,), -1, tl.int32)
            removed_count = row * 0
            entered = row * 0 - 1
            rank = row * 0
            last_child = tl.max(tl.where(children, nodes, -1), axis=0)
            for j in range(0, N):
                if (_at(children.to(tl.int32), nodes, j) != 0) & (entered < 0) & (invalid == 0):
                    x = _at(tokens, nodes, j)
                    if greedy:
                        entered = tl.where(x == argmax, j, entered)
                    else:
                        x_removed = tl.max(((removed == x) & (nodes < removed_count)).to(tl.int32), axis=0) != 0
                        p_x = _prob(tl.load(t_line + x).to(tl.float32) * inv_t, t_max, t_norm, t_rcp, t_tau, FILTERED)
                        if HAS_DRAFT:
                            q_x = _prob(tl.load(d_line + x).to(tl.float32) * inv_t, d_max, d_norm, d_rcp, d_tau, FILTERED)
                            w_x = tl.maximum(p_x - c * q_x, 0.0)
                            proposal = q_x
                            if WITHOUT_REPLACEMENT:
                                w_x = tl.where(x_removed, 0.0, w_x)
                                proposal = tl.where(x_removed, 0.0, q_x)
                        else:
                            w_x = tl.where(x_removed, 0.0, p_x)
                            proposal = 1.0
                        u = _coin(key, offset + depth, rank)
                        if u * proposal * mass < w_x * draft_mass:
                            entered = j
                        else:
                            # The next residual (c, S) and its masses; kept only if it is not zero everywhere.
                            new_c = c
                            if HAS_DRAFT:
                                new_c = c + mass / draft_mass
                            new_removed = removed
                            new_count = removed_count
                            if WITHOUT_REPLACEMENT or not HAS_DRAFT:
                                new_removed = tl.where(nodes == removed_count, x, removed)
                                new_count = removed_count + 1
                            if j < last_child:  # a later sibling's test reads the new residual's masses
                                new_mass, kept_draft_mass = _residual_mass(t_line, d_line, 0, V, Vd, inv_t, t_max, t_norm, t_tau, d_max, d_norm, d_tau, 1.0, new_c, -1,
                                                                           new_removed, new_count, HAS_DRAFT, FILTERED, WITHOUT_REPLACEMENT, BLOCK)
                                new_draft_mass = draft_mass
                                if WITHOUT_REPLACEMENT:
                                    new_draft_mass = kept_draft_mass
                                if new_mass > 0.0:
                                    c = new_c
                                    mass = new_mass
                                    draft_mass = new_draft_mass
                                    removed = new_removed
                                    removed_count = new_count
                            else:
                                # The walk ends at this rejection and nothing reads the new residual's
                                # masses but the test that it is not zero everywhere: the race makes
                                # it (its weights are these), and races the residual before (undo)
                                # where it is. One pass over the line less per row.
                                undo = tl.where(row >= 0, c, 0.0).to(tl.int32, bitcast=True)
                                c = new_c
                                removed = new_removed
                                removed_count = new_count
                    rank += 1
            walking = (entered >= 0) & (invalid == 0)
            if walking:
                path = tl.where(nodes == depth, entered, path)
                ctx = entered + 1
                depth += 1
    use_draft = (c > 0.0) & HAS_DRAFT
    _store_state(state_f_ptr, state_i_ptr, row, 1.0, c, t_max, t_norm, t_tau, d_max, d_norm, d_tau, ctx, tl.where(use_draft, ctx, -1), depth, -1,
                 invalid, argmax, removed_count, undo)
    tl.store(removed_ptr + row64 * NP + nodes, removed)
    tl.store(path_ptr + row64 * NP + nodes, path)


@triton.jit(do_not_specialize=["base_key", "batch", "t_parts", "d_parts"])
def tree_walk_kernel(
    target_ptr,  # (B, N+1, V) raw target logits, last dim contiguous
    draft_ptr,  # (B, N+1, Vd) raw draft logits (unused without HAS_DRAFT)
    tokens_ptr,  # (B, N) int32 / int64 node tokens
    parents_ptr,  # (B, N) int64: each node's parent node, -1 = the root context
    temperature_ptr,  # (B,) float32, 0 = greedy
    top_k_ptr,  # (B,) int64 (validity only; the cut-off is in tau)
    top_p_ptr,  # (B,) float32 (validity only)
    num_nodes_ptr,  # (B,) int64 nodes used per row
    seeds_ptr,  # (B,) int64 per-row keys (HAS_SEEDS)
    offsets_ptr,  # (B,) int64 absolute position of context 0 (HAS_OFFSETS)
    tau_ptr,  # (lines,) float32 cut-offs (FILTERED)
    part_m_ptr,  # (lines, PARTS) float32 line statistics partials (stats.py)
    part_z_ptr,  # (lines, PARTS) float32
    part_i_ptr,  # (lines, PARTS) int32 greedy lines' argmax
    state_f_ptr,  # (B, 8) float32 out: row state (module docstring)
    state_i_ptr,  # (B, 8) int32 out
    removed_ptr,  # (B, NP) int32 out: the residual's removed ids
    path_ptr,  # (B, NP) int32 out: the nodes entered, -1 beyond
    base_key: tl.int64,  # row b's key is base_key + b without HAS_SEEDS
    batch, N, V, Vd,  # sizes
    t_stride_b, t_stride_n, d_stride_b, d_stride_n, tok_stride_b, parent_stride_b,  # strides, in elements
    t_parts, d_parts,  # statistics partials of a target (draft) line
    PARTS: tl.constexpr,  # statistics partial slots per line
    PP: tl.constexpr,  # next power of two of PARTS
    NP: tl.constexpr,  # next power of two of max(N, 1): node vectors
    HAS_DRAFT: tl.constexpr,
    WITHOUT_REPLACEMENT: tl.constexpr,  # siblings drawn without replacement (with draft logits)
    HAS_SEEDS: tl.constexpr,
    HAS_OFFSETS: tl.constexpr,
    CHECK: tl.constexpr,  # blank for a bad value in any used line, not only the lines the walk reads
    BLOCK: tl.constexpr,  # ids per step of a residual-mass pass
):
    """An unfiltered call's walk, one program per row (a filtered one walks in cut_walk_kernel)."""
    _tree_walk_row(
        tl.program_id(0), target_ptr, draft_ptr, tokens_ptr, parents_ptr, temperature_ptr, top_k_ptr, top_p_ptr, num_nodes_ptr, seeds_ptr, offsets_ptr,
        tau_ptr, part_m_ptr, part_z_ptr, part_i_ptr, state_f_ptr, state_i_ptr, removed_ptr, path_ptr, base_key, batch, N, V, Vd, t_stride_b, t_stride_n,
        d_stride_b, d_stride_n, tok_stride_b, parent_stride_b, t_parts, d_parts, PARTS, PP, NP, HAS_DRAFT, WITHOUT_REPLACEMENT, HAS_SEEDS, HAS_OFFSETS,
        CHECK, False, BLOCK,
    )


@triton.jit
def _block_row(
    row, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, seeds_ptr, offsets_ptr, tau_ptr, part_m_ptr, part_z_ptr, gathered_ptr,
    base_key, batch, K, Vd, tok_stride_b, t_parts, d_parts,
    PARTS: tl.constexpr, PP: tl.constexpr, KP: tl.constexpr, HAS_DRAFT: tl.constexpr, HAS_SEEDS: tl.constexpr, HAS_OFFSETS: tl.constexpr,
    FILTERED: tl.constexpr,
):
    """What every work item of a block row reads (a few loads): the row's parameters, its lines'
    statistics, per position: the draft token, the lines' bad values, and the weight
    p_i = min(1, p_{i-1} p(x_i) / q(x_i)) (that of a sampled row; per-position vectors of KP)."""
    positions = tl.arange(0, KP)
    temperature, inv_t, n, key, offset, invalid = row_parameters(temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, seeds_ptr, offsets_ptr,
                                                                 base_key, row, K, HAS_SEEDS, HAS_OFFSETS)
    row64 = row.to(tl.int64)
    sampled_v = tl.where(temperature != 0, positions >= 0, positions < 0)  # per-position copy of a row flag
    t_first = row * (K + 1)
    d_first = batch * (K + 1) + row * K
    t_lines = positions <= K
    d_lines = positions < K
    drafted = positions < n
    t_max, t_norm, t_bad = _combine_lines(part_m_ptr, part_z_ptr, t_first, positions, t_lines, t_parts, PARTS, PP)
    t_rcp = reciprocal(tl.where(t_norm > 0, t_norm, 1.0))
    t_tau = tl.full((KP,), float("-inf"), tl.float32)
    if FILTERED:
        t_tau = tl.where(sampled_v, tl.load(tau_ptr + t_first + positions, mask=t_lines, other=float("-inf")), float("-inf"))
    tokens = tl.load(tokens_ptr + row64 * tok_stride_b + positions, mask=d_lines, other=0).to(tl.int64)
    invalid = invalid | (tl.max((drafted & ((tokens < 0) | (tokens >= Vd))).to(tl.int32), axis=0) != 0)
    tokens = tl.minimum(tl.maximum(tokens, 0), Vd - 1).to(tl.int32)
    p_x = _prob(tl.load(gathered_ptr + t_first + positions, mask=d_lines, other=0.0) * inv_t, t_max, t_norm, t_rcp, t_tau, FILTERED)
    d_max = t_max
    d_norm = t_norm
    d_rcp = t_rcp
    d_tau = t_tau
    q_x = tl.full((KP,), 1.0, tl.float32)
    read_bad = t_bad & (positions <= n)  # a sampled row reads every line up to n (the stop is searched from n down)
    if HAS_DRAFT:
        d_max, d_norm, d_bad = _combine_lines(part_m_ptr, part_z_ptr, d_first, positions, d_lines, d_parts, PARTS, PP)
        d_rcp = reciprocal(tl.where(d_norm > 0, d_norm, 1.0))
        if FILTERED:
            d_tau = tl.where(sampled_v, tl.load(tau_ptr + d_first + positions, mask=d_lines, other=float("-inf")), float("-inf"))
        q_x = _prob(tl.load(gathered_ptr + d_first + positions, mask=d_lines, other=0.0) * inv_t, d_max, d_norm, d_rcp, d_tau, FILTERED)
        read_bad = read_bad | (drafted & d_bad)
    carried = tl.where(positions == 0, 1.0, 0.0)
    previous = 1.0
    for i in range(1, K + 1):
        if i <= n:
            joint = previous * _at(p_x, positions, i - 1)
            q_i = _at(q_x, positions, i - 1)
            ratio = tl.where(q_i > 0.0, tl.math.div_rn(joint, tl.where(q_i > 0.0, q_i, 1.0)), tl.where(joint > 0.0, 1.0, 0.0))
            previous = tl.minimum(ratio, 1.0)
            carried = tl.where(positions == i, previous, carried)
    return temperature, inv_t, n, key, offset, invalid, t_first, t_lines, tokens, t_bad, t_max, t_norm, t_tau, d_max, d_norm, d_tau, read_bad, carried


@triton.jit
def _may_stop(weight, eta):
    """Whether the coin eta may stop a block walk at a position below n with weight p_i: it stops
    when eta (S + 1 - p_i) < S, and S = sum_y max(p_i P(y) - Q(y), 0) <= p_i, so never when
    p_i <= eta. The 1 % margin covers S's float sums (over p_i by less): such a position's S is
    then not summed at all, and its test is false in the reference's floats too."""
    return weight > 0.99 * eta


@triton.jit
def _block_walk_items(K, walk_chunks):
    """A block row's walk items: walk_chunks per position i < K, one at least."""
    return tl.maximum((K - 1) * walk_chunks, 1)


@triton.jit
def _block_walk_item(
    item, target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, seeds_ptr, offsets_ptr, tau_ptr, part_m_ptr,
    part_z_ptr, part_i_ptr, gathered_ptr, state_f_ptr, state_i_ptr, walk_part_ptr, walk_counter_ptr, walk_chunks, base_key, batch, K, V, Vd,
    t_stride_b, t_stride_k, d_stride_b, d_stride_k, tok_stride_b, t_parts, d_parts,
    PARTS: tl.constexpr, PP: tl.constexpr, KP: tl.constexpr, HAS_DRAFT: tl.constexpr, HAS_SEEDS: tl.constexpr, HAS_OFFSETS: tl.constexpr,
    CHECK: tl.constexpr, FILTERED: tl.constexpr, BLOCK: tl.constexpr,
):
    """One work item of block verification's walk: a chunk of the residual mass S_i of one row at
    one position i < K (module docstring), then its arrival; the row's last item to arrive walks."""
    items = _block_walk_items(K, walk_chunks)
    row = item // items
    j = item % items
    at = 1 + j // walk_chunks
    chunk = j % walk_chunks
    row64 = row.to(tl.int64)
    positions = tl.arange(0, KP)
    temperature, inv_t, n, key, offset, invalid, t_first, t_lines, tokens, t_bad, t_max, t_norm, t_tau, d_max, d_norm, d_tau, read_bad, carried = _block_row(
        row, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, seeds_ptr, offsets_ptr, tau_ptr, part_m_ptr, part_z_ptr, gathered_ptr,
        base_key, batch, K, Vd, tok_stride_b, t_parts, d_parts, PARTS, PP, KP, HAS_DRAFT, HAS_SEEDS, HAS_OFFSETS, FILTERED)
    weight = _at(carried, positions, at)
    # S_at's chunk: a sampled valid row's that does not stop at n (its coin there needs no mass: the
    # walk ends before any position below), at a position below n where the coin may stop the walk.
    summed = (temperature != 0) & (invalid == 0) & (tl.max(read_bad.to(tl.int32), axis=0) == 0) & (at < n)  # (at < n <= K: the row's single item at K <= 1 sums nothing)
    summed = summed & (_coin(key, offset + n - 1, 0) >= _at(carried, positions, n)) & _may_stop(weight, _coin(key, offset + at - 1, 0))
    partial = 0.0
    if summed:
        per_chunk = tl.cdiv(tl.cdiv(V, BLOCK), walk_chunks) * BLOCK
        start = chunk * per_chunk
        hot = -1
        if not HAS_DRAFT:
            hot = _at(tokens, positions, at)
        partial = _residual_mass(target_ptr + row64 * t_stride_b + at.to(tl.int64) * t_stride_k,
                                 draft_ptr + row64 * d_stride_b + at.to(tl.int64) * d_stride_k, start, tl.minimum(start + per_chunk, V), Vd, inv_t,
                                 _at(t_max, positions, at), _at(t_norm, positions, at), _at(t_tau, positions, at), _at(d_max, positions, at),
                                 _at(d_norm, positions, at), _at(d_tau, positions, at), weight, 1.0, hot, tokens, 0, HAS_DRAFT, FILTERED, False, BLOCK)[0]
    tl.store(walk_part_ptr + row64 * items + j, partial)
    tl.debug_barrier()  # every thread's store precedes the release below
    if tl.atomic_add(walk_counter_ptr + row, 1, sem="acq_rel", scope="gpu") == items - 1:
        tl.store(walk_counter_ptr + row, 0)  # ready for the race (and the next call)
        _block_walk_row(row, temperature, n, key, offset, invalid, t_first, t_lines, tokens, t_bad, t_max, t_norm, t_tau, d_max, d_norm, d_tau,
                        read_bad, carried, part_m_ptr, part_i_ptr, state_f_ptr, state_i_ptr, walk_part_ptr + row64 * items, walk_chunks, K, t_parts,
                        PARTS, PP, KP, HAS_DRAFT, CHECK)


@triton.jit
def _block_walk_row(
    row, temperature, n, key, offset, invalid, t_first, t_lines, tokens, t_bad, t_max, t_norm, t_tau, d_max, d_norm, d_tau, read_bad, carried,
    part_m_ptr, part_i_ptr, state_f_ptr, state_i_ptr, sums_ptr, walk_chunks, K, t_parts,
    PARTS: tl.constexpr, PP: tl.constexpr, KP: tl.constexpr, HAS_DRAFT: tl.constexpr, CHECK: tl.constexpr,
):
    """Block verification's walk of one row, once its items have summed S_i in ``sums_ptr``
    (walk_chunks partial sums per position i = 1 .. K-1): the stop searched from n down."""
    positions = tl.arange(0, KP)
    greedy = temperature == 0
    drafted = positions < n
    tau = row * 0
    a = 1.0
    argmax = tl.zeros((KP,), tl.int32)
    if greedy:  # token by token: the first draft that is not the argmax stops the walk
        argmax = _combine_argmax(part_m_ptr, part_i_ptr, t_first, positions, t_lines, t_parts, t_max, PARTS, PP)
        tau = tl.min(tl.where(drafted & (tokens == argmax), KP, positions), axis=0)
        if not CHECK:
            read_bad = t_bad & (positions <= tau)
    invalid = invalid | (tl.max(read_bad.to(tl.int32), axis=0) != 0)
    if (greedy == 0) & (invalid == 0):
        # The last i whose coin passes, searched from n down (0 when none does).
        found = invalid
        for step in range(0, K):
            at = n - step
            if (at >= 1) & (found == 0):
                eta = _coin(key, offset + at - 1, 0)
                weight = _at(carried, positions, at)
                stop = eta < weight
                if at < n:
                    # S_at = sum_y max(p_at P(y) - Q(y), 0): Q the draft line, or one-hot at x_{at+1}.
                    stop = at < 0  # False, unless the coin may stop it
                    if _may_stop(weight, eta):
                        inner = 0.0
                        for chunk in range(0, walk_chunks):
                            inner += tl.load(sums_ptr + (at - 1) * walk_chunks + chunk, cache_modifier=".cg")
                        stop = eta * (inner + (1.0 - weight)) < inner
                tau = tl.where(stop, at, tau)
                found = stop
        a = tl.where(tau < n, _at(carried, positions, tau), 1.0)
    # The final residual: max(a P_tau - Q_tau, 0) after a stop before n (one-hot Q without draft
    # logits), P_n itself at tau = n.
    residual = (tau < n) & (greedy == 0)
    draft_position = -1
    c = 0.0
    hot = -1
    if HAS_DRAFT:
        draft_position = tl.where(residual, tau, -1)
        c = tl.where(residual, 1.0, 0.0)
    else:
        hot = tl.where(residual, _at(tokens, positions, tau), -1)
    _store_state(state_f_ptr, state_i_ptr, row, tl.where(residual, a, 1.0), c, _at(t_max, positions, tau), _at(t_norm, positions, tau),
                 _at(t_tau, positions, tau), _at(d_max, positions, tau), _at(d_norm, positions, tau), _at(d_tau, positions, tau),
                 tau, draft_position, tau, hot, invalid, _at(argmax, positions, tau), 0, -1)


@triton.jit(do_not_specialize=["base_key", "batch", "t_parts", "d_parts", "walk_chunks"])
def block_walk_kernel(
    target_ptr,  # (B, K+1, V) raw target logits, last dim contiguous
    draft_ptr,  # (B, K, Vd) raw draft logits (unused without HAS_DRAFT)
    tokens_ptr,  # (B, K) int32 / int64 draft tokens
    temperature_ptr,  # (B,) float32, 0 = greedy
    top_k_ptr,  # (B,) int64 (validity only)
    top_p_ptr,  # (B,) float32 (validity only)
    num_draft_ptr,  # (B,) int64
    seeds_ptr,  # (B,) int64 (HAS_SEEDS)
    offsets_ptr,  # (B,) int64 absolute position of draft position 0 (HAS_OFFSETS)
    tau_ptr,  # (lines,) float32 cut-offs (FILTERED)
    part_m_ptr,  # (lines, PARTS) float32 line statistics partials
    part_z_ptr,  # (lines, PARTS) float32
    part_i_ptr,  # (lines, PARTS) int32
    gathered_ptr,  # (lines,) float32: each position's raw logit at its draft token (stats.py)
    state_f_ptr,  # (B, 8) float32 out: row state (module docstring)
    state_i_ptr,  # (B, 8) int32 out
    walk_part_ptr,  # (B, max((K-1) * walk_chunks, 1)) float32 workspace: the items' partial sums of S_i
    walk_counter_ptr,  # (B,) int32, 0 between launches: the row's items that arrived
    walk_chunks,  # items per position i < K: chunks of the vocabulary
    base_key: tl.int64,  # row b's key is base_key + b without HAS_SEEDS
    batch, K, V, Vd,  # sizes
    t_stride_b, t_stride_k, d_stride_b, d_stride_k, tok_stride_b,  # strides, in elements
    t_parts, d_parts,  # statistics partials of a target (draft) line
    PARTS: tl.constexpr,
    PP: tl.constexpr,
    KP: tl.constexpr,  # next power of two of K + 1
    HAS_DRAFT: tl.constexpr,  # draft logits (else one-hot drafts)
    HAS_SEEDS: tl.constexpr,  # per-row keys
    HAS_OFFSETS: tl.constexpr,  # per-row positions
    CHECK: tl.constexpr,  # blank for a bad value in any used line (greedy rows' draft lines too)
    BLOCK: tl.constexpr,  # ids per step of a residual-mass chunk
):
    """An unfiltered call's walk, one work item per program: grid (B * max((K-1) * walk_chunks, 1),)
    (a filtered one walks in cut_walk_kernel)."""
    _block_walk_item(
        tl.program_id(0), target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, seeds_ptr, offsets_ptr, tau_ptr,
        part_m_ptr, part_z_ptr, part_i_ptr, gathered_ptr, state_f_ptr, state_i_ptr, walk_part_ptr, walk_counter_ptr, walk_chunks, base_key, batch, K,
        V, Vd, t_stride_b, t_stride_k, d_stride_b, d_stride_k, tok_stride_b, t_parts, d_parts, PARTS, PP, KP, HAS_DRAFT, HAS_SEEDS, HAS_OFFSETS,
        CHECK, False, BLOCK,
    )


# --------------------------------------------------------------------------------------------------
# Filtered walks: the cut-offs launch's work items, then the walk of each row, in one launch


@triton.jit(do_not_specialize=["base_key", "batch", "t_parts", "d_parts", "walk_chunks"])
def cut_walk_kernel(
    target_ptr,  # (B, K+1, V) raw target logits, last dim contiguous (a tree: K = N)
    draft_ptr,  # (B, K(+1), Vd) raw draft logits (unused without HAS_DRAFT)
    tau_ptr,  # (lines,) float32 out: the cut-offs (cutoffs.py)
    part_m_ptr,  # (lines, PARTS) float32 line statistics partials: out for every cut line (cutoffs.py)
    part_z_ptr,  # (lines, PARTS) float32
    search_ptr,  # (lines, 4) int32 workspace: the whole-line search's state (select.py)
    search_f_ptr,  # (lines, 2) float32 workspace
    progress_ptr,  # (lines,) int32 workspace
    part_count_ptr,  # (lines, NUM_CHUNKS, BINS + 1) int32 workspace
    part_mass_ptr,  # (lines, NUM_CHUNKS, BINS + 1) int64 workspace
    counter_ptr,  # (lines,) int32, 0 between launches
    control_ptr,  # (4,) int32, 0 between launches: the tickets (cutoffs.py)
    searching_ptr,  # (1,) int32: lines listed for the whole-line search
    search_list_ptr,  # (lines,) int32 workspace
    temperature_ptr,  # (B,) float32, 0 = greedy
    top_k_ptr,  # (B,) int64, 0 = off
    top_p_ptr,  # (B,) float32, 1 = off
    num_draft_ptr,  # (B,) int64: drafts to verify (a tree: nodes used) per row
    cand_ptr,  # (lines, LINE_SLOTS) float32: the statistics launch's candidates
    cand_count_ptr,  # (lines, PARTS) int32
    cand_floor_ptr,  # (lines, PARTS, 2) int32
    sort_ptr,  # (lines, SORT) int32 workspace
    hist_ptr,  # (lines, 256) int32: the statistics' first-pass key counts (cutoffs.py), left 0
    window_ptr,  # (lines, PARTS, 256) int32: KEY_WINDOW, their top windows' (cutoffs.py)
    top_p_window_ptr,  # (lines, TOP_P_BINS + 4) int32: TOP_P_BINS, bf16 top-p lines' windows (cutoffs.py)
    batch, K, V, Vd,  # sizes
    t_stride_b, t_stride_k, d_stride_b, d_stride_k,  # strides, in elements
    t_parts, d_parts,  # statistics partials of a target (draft) line
    tokens_ptr,  # (B, K) int32 / int64 draft (node) tokens
    parents_ptr,  # (B, N) int64 a tree's parents (TREE; unused for a block)
    seeds_ptr,  # (B,) int64 per-row keys (HAS_SEEDS)
    offsets_ptr,  # (B,) int64 absolute position of context / draft position 0 (HAS_OFFSETS)
    part_i_ptr,  # (lines, PARTS) int32 greedy lines' argmax
    gathered_ptr,  # (lines,) float32: a block's draft logits at their tokens (stats.py; unused for a tree)
    row_f_ptr,  # (B, 8) float32 out: row state (module docstring)
    row_i_ptr,  # (B, 8) int32 out
    removed_ptr,  # (B, NP) int32 out: a tree residual's removed ids (TREE)
    path_ptr,  # (B, NP) int32 out: the nodes a tree walk entered (TREE)
    walk_part_ptr,  # (B, max((K-1) * walk_chunks, 1)) float32 workspace: a block walk's partial sums of S_i (not TREE)
    walk_counter_ptr,  # (B,) int32, 0 between launches: a block row's walk items that arrived (not TREE)
    walk_chunks,  # a block walk's items per position i < K (not TREE)
    base_key: tl.int64,  # row b's key is base_key + b without HAS_SEEDS
    tok_stride_b, parent_stride_b,  # strides, in elements
    HAS_DRAFT: tl.constexpr,
    PARTS: tl.constexpr,  # statistics partial slots per line
    PP: tl.constexpr,  # next power of two of PARTS
    LINE_SLOTS: tl.constexpr,  # the cut-offs' geometry (cutoff_kernel)
    SORT: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr,
    TILE: tl.constexpr,
    BINS: tl.constexpr,
    PASSES: tl.constexpr,
    GATHER: tl.constexpr,
    WINDOW_GATHER: tl.constexpr,
    HISTOGRAM_TOP_K: tl.constexpr,
    KEY_WINDOW: tl.constexpr,
    TOP_P_BINS: tl.constexpr,
    TOP_P_STEP: tl.constexpr,
    SAMPLE_RUNS: tl.constexpr,
    SAMPLE_RUN: tl.constexpr,
    DIGIT_SELECT: tl.constexpr,
    VECTOR_LINES: tl.constexpr,
    TREE: tl.constexpr,  # a tree walk (tree_walk_kernel's), else block verification's (block_walk_kernel's)
    NP: tl.constexpr,  # TREE: next power of two of max(N, 1)
    KP: tl.constexpr,  # a block: next power of two of K + 1
    WITHOUT_REPLACEMENT: tl.constexpr,  # TREE: siblings drawn without replacement (with draft logits)
    HAS_SEEDS: tl.constexpr,
    HAS_OFFSETS: tl.constexpr,
    CHECK: tl.constexpr,  # blank for a bad value in any used line
    BLOCK: tl.constexpr,  # ids per step of a residual-mass pass
):
    """A filtered tree or block call's cut-offs (cutoff_kernel's items), then its walk."""
    ticket, walks = cutoff_items(
        target_ptr, draft_ptr, tau_ptr, part_m_ptr, part_z_ptr, search_ptr, search_f_ptr, progress_ptr, part_count_ptr, part_mass_ptr, counter_ptr,
        control_ptr, searching_ptr, search_list_ptr, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, cand_ptr, cand_count_ptr, cand_floor_ptr,
        sort_ptr, hist_ptr, window_ptr, top_p_window_ptr, batch, K, V, Vd, t_stride_b, t_stride_k, d_stride_b, d_stride_k, t_parts, d_parts,
        HAS_DRAFT, PARTS, PP, LINE_SLOTS, SORT, NUM_CHUNKS, CHUNK, TILE, BINS, PASSES, GATHER, WINDOW_GATHER, HISTOGRAM_TOP_K, KEY_WINDOW, TOP_P_BINS,
        TOP_P_STEP, SAMPLE_RUNS, SAMPLE_RUN, DIGIT_SELECT, VECTOR_LINES, False,  # (no atomic raw windows: with the walk's code they would spill)
    )
    # The walk items, after every search item: one per row for a tree, a block row's own
    # (_block_walk_item); a row's lines are final once every search has ended.
    if TREE:
        items = batch
    else:
        items = batch * _block_walk_items(K, walk_chunks)
    if ticket < walks + items:
        searches_ended(control_ptr, searching_ptr)
    while ticket < walks + items:
        if TREE:
            _tree_walk_row(
                ticket - walks, target_ptr, draft_ptr, tokens_ptr, parents_ptr, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, seeds_ptr,
                offsets_ptr, tau_ptr, part_m_ptr, part_z_ptr, part_i_ptr, row_f_ptr, row_i_ptr, removed_ptr, path_ptr, base_key, batch, K, V, Vd,
                t_stride_b, t_stride_k, d_stride_b, d_stride_k, tok_stride_b, parent_stride_b, t_parts, d_parts, PARTS, PP, NP, HAS_DRAFT,
                WITHOUT_REPLACEMENT, HAS_SEEDS, HAS_OFFSETS, CHECK, True, BLOCK,
            )
        else:
            _block_walk_item(
                ticket - walks, target_ptr, draft_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, num_draft_ptr, seeds_ptr, offsets_ptr,
                tau_ptr, part_m_ptr, part_z_ptr, part_i_ptr, gathered_ptr, row_f_ptr, row_i_ptr, walk_part_ptr, walk_counter_ptr, walk_chunks,
                base_key, batch, K, V, Vd, t_stride_b, t_stride_k, d_stride_b, d_stride_k, tok_stride_b, t_parts, d_parts, PARTS, PP, KP, HAS_DRAFT,
                HAS_SEEDS, HAS_OFFSETS, CHECK, True, BLOCK,
            )
        ticket = tl.atomic_add(control_ptr, 1, sem="relaxed", scope="gpu")
    cutoff_exit(control_ptr)


# --------------------------------------------------------------------------------------------------
# Races


@triton.jit
def _residual_race(
    key, t_line, d_line, start, end, draft_end, p_lo, p_hi, inv_t, t_max, t_norm, t_rcp, t_tau, d_max, d_norm, d_rcp, d_tau, a, c, hot, use_draft,
    removed, removed_count, HAS_DRAFT: tl.constexpr, FILTERED: tl.constexpr, INTERPRET: tl.constexpr, BLOCK: tl.constexpr,
):
    """(best key, lowest id with it) of the race argmax w(y) / E_y over the ids [start, end), start a
    multiple of BLOCK: per-lane running maxima, one block reduction at the end."""
    lane_best = tl.full((BLOCK,), -1.0, tl.float32)
    lane_tile = tl.zeros((BLOCK,), tl.int32)
    tile = 0
    for tile_start in range(start, end, BLOCK):
        tile_start = tl.multiple_of(tile_start, BLOCK)
        idx = tile_start + tl.arange(0, BLOCK)
        w, _ = _residual_tile(t_line, d_line, idx, end, draft_end, inv_t, t_max, t_norm, t_rcp, t_tau, d_max, d_norm, d_rcp, d_tau, a, c, hot, use_draft,
                              removed, removed_count, HAS_DRAFT, FILTERED)
        # w / E with E = -ln(2) log2(u): the positive factor ln(2) does not move the argmax.
        race_key = w * -fast_reciprocal(log2_uniform(race_uniforms(key, tile_start, p_lo, p_hi, 1, BLOCK), INTERPRET), INTERPRET)
        race_key = tl.where(idx < end, race_key, -1.0)
        lane_best, lane_tile = keep_better(race_key, lane_best, lane_tile, tile)
        tile += 1
    return lanes_winner(lane_best, lane_tile, start, BLOCK)


@triton.jit
def _race_and_arrive(
    target_ptr, draft_ptr, temperature_ptr, seeds_ptr, offsets_ptr, state_f_ptr, state_i_ptr, removed_ptr, race_val_ptr, race_idx_ptr, counter_ptr,
    base_key, V, Vd, t_stride_b, t_stride_l, d_stride_b, d_stride_l, tiles_per_chunk, num_chunks,
    RP: tl.constexpr, HAS_DRAFT: tl.constexpr, HAS_SEEDS: tl.constexpr, HAS_OFFSETS: tl.constexpr, FILTERED: tl.constexpr, INTERPRET: tl.constexpr,
    FINAL_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
):
    """The race of this program's chunk of the row's residual, then its ticket: (last, winner,
    state ints (position, depth, bad, greedy winner)). ``last``: this program arrived last, and
    ``winner`` is the row's (lowest id among equal keys; the race on p if the residual is zero)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    row64 = row.to(tl.int64)
    temperature = tl.load(temperature_ptr + row)
    inv_t = tl.math.div_rn(1.0, tl.where(temperature > 0, temperature, 1.0))
    if HAS_SEEDS:
        key = tl.load(seeds_ptr + row)
    else:
        key = base_key + row64
    offset = row64 * 0
    if HAS_OFFSETS:
        offset = tl.load(offsets_ptr + row)
    f = state_f_ptr + row64 * 8
    a = tl.load(f)
    c = tl.load(f + 1)
    t_max = tl.load(f + 2)
    t_norm = tl.load(f + 3)
    t_tau = tl.load(f + 4)
    d_max = tl.load(f + 5)
    d_norm = tl.load(f + 6)
    d_tau = tl.load(f + 7)
    i = state_i_ptr + row64 * 8
    position = tl.load(i)
    draft_position = tl.load(i + 1)
    depth = tl.load(i + 2)
    hot = tl.load(i + 3)
    bad = tl.load(i + 4) != 0
    removed_count = tl.load(i + 6)
    removed = tl.load(removed_ptr + row64 * RP + tl.arange(0, RP), mask=tl.arange(0, RP) < removed_count, other=-1)
    t_rcp = reciprocal(tl.where(t_norm > 0, t_norm, 1.0))
    d_rcp = reciprocal(tl.where(d_norm > 0, d_norm, 1.0))
    use_draft = draft_position >= 0
    p_lo, p_hi = position_words(offset + depth)
    t_line = target_ptr + row64 * t_stride_b + position.to(tl.int64) * t_stride_l
    d_line = draft_ptr + row64 * d_stride_b + tl.maximum(draft_position, 0).to(tl.int64) * d_stride_l
    start = chunk * tiles_per_chunk * BLOCK
    end = tl.minimum(start + tiles_per_chunk * BLOCK, V)
    races = (temperature != 0) & (bad == 0)
    best = -1.0
    best_index = start
    if races:
        best, best_index = _residual_race(key, t_line, d_line, start, end, tl.minimum(end, Vd), p_lo, p_hi, inv_t, t_max, t_norm, t_rcp, t_tau, d_max,
                                          d_norm, d_rcp, d_tau, a, c, hot, use_draft, removed, removed_count, HAS_DRAFT, FILTERED, INTERPRET, BLOCK)
    slot = row64 * num_chunks + chunk
    tl.store(race_val_ptr + slot, best)
    tl.store(race_idx_ptr + slot, best_index)
    tl.debug_barrier()  # every thread's stores precede the release below
    ticket = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
    last = ticket == num_chunks - 1
    winner = row * 0
    if last:
        winner_key, winner = chunk_winner(race_val_ptr, race_idx_ptr, row64, num_chunks, FINAL_BLOCK)
        if races & (winner_key <= 0.0):
            # Every residual weight is zero. After a tree walk's last rejection (undo), the walk keeps
            # the residual before it (whose mass it found positive); otherwise (p equals q up to
            # rounding) race p over the whole line.
            undo = tl.load(i + 7)
            c_before = tl.where(undo >= 0, undo.to(tl.float32, bitcast=True), 0.0)
            removed_before = tl.where(undo >= 0, tl.maximum(removed_count - 1, 0), 0)
            before_key, winner = _residual_race(key, t_line, d_line, 0, V, Vd, p_lo, p_hi, inv_t, t_max, t_norm, t_rcp, t_tau, d_max, d_norm, d_rcp,
                                                d_tau, 1.0, c_before, -1, use_draft & (c_before > 0.0), removed, removed_before, HAS_DRAFT, FILTERED,
                                                INTERPRET, BLOCK)
            if before_key <= 0.0:
                # The residual before is zero as well: the walk's mass of it (exp2 terms, not the race's
                # weights) was positive by a rounding. Race p, the reference's draw for a residual zero
                # everywhere, rather than return an id of weight zero.
                _, winner = _residual_race(key, t_line, d_line, 0, V, Vd, p_lo, p_hi, inv_t, t_max, t_norm, t_rcp, t_tau, d_max, d_norm, d_rcp, d_tau,
                                           1.0, 0.0, -1, use_draft & (c_before < 0.0), removed, 0, HAS_DRAFT, FILTERED, INTERPRET, BLOCK)  # (no draft)
        winner = tl.where(temperature == 0, tl.load(i + 5), winner)
        tl.store(counter_ptr + row, 0)  # ready for the next call (and the next graph replay)
    return last, winner, position, depth, bad | (winner < 0) | (winner >= V)


@triton.jit(do_not_specialize=["base_key", "tiles_per_chunk", "num_chunks"])
def tree_race_kernel(
    target_ptr,  # (B, N+1, V) raw target logits
    draft_ptr,  # (B, N+1, Vd) raw draft logits (unused without HAS_DRAFT)
    tokens_ptr,  # (B, N) int32 / int64 node tokens
    temperature_ptr,  # (B,) float32
    seeds_ptr,  # (B,) int64 (HAS_SEEDS)
    offsets_ptr,  # (B,) int64 (HAS_OFFSETS)
    state_f_ptr,  # (B, 8) float32 row state (tree_walk_kernel)
    state_i_ptr,  # (B, 8) int32
    removed_ptr,  # (B, NP) int32
    path_ptr,  # (B, NP) int32 the nodes entered
    race_val_ptr,  # (B, >= num_chunks) float32 workspace: each chunk's best key
    race_idx_ptr,  # (B, >= num_chunks) int32 workspace: its id
    counter_ptr,  # (B,) int32 workspace, 0 between calls: programs of the row that arrived
    out_tokens_ptr,  # (B, N+1) int64 out
    out_accepted_ptr,  # (B,) int64 out
    out_nodes_ptr,  # (B, N) int64 out: accepted_nodes
    base_key: tl.int64,  # row b's key is base_key + b without HAS_SEEDS
    N, V, Vd,  # sizes
    t_stride_b, t_stride_n, d_stride_b, d_stride_n, tok_stride_b,  # strides, in elements
    tiles_per_chunk, num_chunks,  # race tiles (BLOCK ids) per chunk, programs per row
    NP: tl.constexpr,  # next power of two of max(N, 1)
    D1P: tl.constexpr,  # next power of two of N + 1
    HAS_DRAFT: tl.constexpr,
    HAS_SEEDS: tl.constexpr,
    HAS_OFFSETS: tl.constexpr,
    FILTERED: tl.constexpr,
    INTERPRET: tl.constexpr,
    BLOCK: tl.constexpr,  # ids per race tile
    FINAL_BLOCK: tl.constexpr,  # chunk results read per step when finalising
):
    last, winner, _, depth, bad = _race_and_arrive(
        target_ptr, draft_ptr, temperature_ptr, seeds_ptr, offsets_ptr, state_f_ptr, state_i_ptr, removed_ptr, race_val_ptr, race_idx_ptr, counter_ptr,
        base_key, V, Vd, t_stride_b, t_stride_n, d_stride_b, d_stride_n, tiles_per_chunk, num_chunks, NP, HAS_DRAFT, HAS_SEEDS, HAS_OFFSETS, FILTERED,
        INTERPRET, FINAL_BLOCK, BLOCK)
    if last:
        row64 = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, D1P)
        path = tl.load(path_ptr + row64 * NP + cols, mask=cols < NP, other=-1)
        on_path = tl.where(bad, cols < 0, cols < depth)  # (a vector & scalar mask trips the interpreter)
        node_tokens = tl.load(tokens_ptr + row64 * tok_stride_b + tl.maximum(path, 0), mask=on_path, other=-1).to(tl.int64)
        emitted = tl.where(on_path, node_tokens, tl.where(tl.where(bad, cols < 0, cols == depth), winner, -1))
        tl.store(out_tokens_ptr + row64 * (N + 1) + cols, emitted, mask=cols <= N)
        tl.store(out_accepted_ptr + tl.program_id(0), tl.where(bad, 0, depth).to(tl.int64))
        tl.store(out_nodes_ptr + row64 * N + cols, tl.where(on_path, path, -1).to(tl.int64), mask=cols < N)


@triton.jit(do_not_specialize=["base_key", "batch", "t_parts", "tiles_per_chunk", "num_chunks"])
def block_race_kernel(
    target_ptr,  # (B, K+1, V) raw target logits
    draft_ptr,  # (B, K, Vd) raw draft logits (unused without HAS_DRAFT)
    tokens_ptr,  # (B, K) int32 / int64 draft tokens
    temperature_ptr,  # (B,) float32
    seeds_ptr,  # (B,) int64 (HAS_SEEDS)
    offsets_ptr,  # (B,) int64 (HAS_OFFSETS)
    tau_ptr,  # (lines,) float32 cut-offs (FILTERED and LOGPROBS)
    part_m_ptr,  # (lines, PARTS) float32 line statistics partials (LOGPROBS)
    part_z_ptr,
    part_rm_ptr,  # (lines, PARTS) float32 raw statistics (LOGPROBS == 2)
    part_rz_ptr,
    gathered_ptr,  # (lines,) float32 raw logit at each position's draft token (LOGPROBS)
    state_f_ptr,  # (B, 8) float32 row state (block_walk_kernel)
    state_i_ptr,  # (B, 8) int32
    race_val_ptr,  # (B, >= num_chunks) float32 workspace
    race_idx_ptr,  # (B, >= num_chunks) int32 workspace
    counter_ptr,  # (B,) int32 workspace, 0 between calls
    out_tokens_ptr,  # (B, K+1) int64 out
    out_accepted_ptr,  # (B,) int64 out
    out_logprobs_ptr,  # (B, K+1) float32 out (LOGPROBS != 0)
    base_key: tl.int64,  # row b's key is base_key + b without HAS_SEEDS
    batch, K, V, Vd,  # sizes
    t_stride_b, t_stride_k, d_stride_b, d_stride_k, tok_stride_b,  # strides, in elements
    t_parts,  # statistics partials of a target line
    tiles_per_chunk, num_chunks,  # race tiles (BLOCK ids) per chunk, programs per row
    PARTS: tl.constexpr,
    PP: tl.constexpr,
    KP: tl.constexpr,  # next power of two of K + 1
    HAS_DRAFT: tl.constexpr,
    HAS_SEEDS: tl.constexpr,
    HAS_OFFSETS: tl.constexpr,
    FILTERED: tl.constexpr,
    LOGPROBS: tl.constexpr,  # 0 none, 1 processed, 2 raw
    INTERPRET: tl.constexpr,
    BLOCK: tl.constexpr,
    FINAL_BLOCK: tl.constexpr,
):
    # A block's residual removes no id: the walk state's |S| is 0 and the removed ids are never read.
    last, winner, position, tau, bad = _race_and_arrive(
        target_ptr, draft_ptr, temperature_ptr, seeds_ptr, offsets_ptr, state_f_ptr, state_i_ptr, state_i_ptr, race_val_ptr, race_idx_ptr, counter_ptr,
        base_key, V, Vd, t_stride_b, t_stride_k, d_stride_b, d_stride_k, tiles_per_chunk, num_chunks, 2, HAS_DRAFT, HAS_SEEDS, HAS_OFFSETS, FILTERED,
        INTERPRET, FINAL_BLOCK, BLOCK)
    if last:
        row = tl.program_id(0)
        row64 = row.to(tl.int64)
        positions = tl.arange(0, KP)
        drafts = tl.load(tokens_ptr + row64 * tok_stride_b + positions, mask=positions < tl.minimum(tau, K), other=-1).to(tl.int64)
        emitted = tl.where(positions < tau, drafts, tl.where(positions == tau, winner, -1))
        emitted = tl.where(bad, -1, emitted)
        tl.store(out_tokens_ptr + row64 * (K + 1) + positions, emitted, mask=positions <= K)
        tl.store(out_accepted_ptr + row, tl.where(bad, 0, tau).to(tl.int64))
        if LOGPROBS != 0:
            temperature = tl.load(temperature_ptr + row)
            t_first = row * (K + 1)
            t_lines = positions <= K
            t_max, t_norm, _ = _combine_lines(part_m_ptr, part_z_ptr, t_first, positions, t_lines, t_parts, PARTS, PP)
            t_tau = tl.full((KP,), float("-inf"), tl.float32)
            if FILTERED:
                t_tau = tl.where(temperature != 0, tl.load(tau_ptr + t_first + positions, mask=t_lines, other=float("-inf")), float("-inf"))
            raw_x = tl.load(gathered_ptr + t_first + positions, mask=positions < K, other=0.0)
            t_line = target_ptr + row64 * t_stride_b + position.to(tl.int64) * t_stride_k
            values = emitted_logprobs(t_line, winner, V, positions, tau, raw_x, tl.math.div_rn(1.0, tl.where(temperature > 0, temperature, 1.0)), t_max,
                                      t_norm, t_tau, temperature == 0, part_rm_ptr, part_rz_ptr, t_first, t_lines, t_parts, LOGPROBS, PARTS, PP)
            tl.store(out_logprobs_ptr + row64 * (K + 1) + positions, tl.where(emitted >= 0, values, float("nan")), mask=positions <= K)
