"""Eager reference of tree verification and of block verification: the specification of record.

Vectorised over rows (the walk down a tree is a loop over sibling tests, each one step for every row
at once). Like :mod:`specdec_ext.reference` it materialises processed probabilities; the fused
backends evaluate the same float32 formulas from per-line statistics instead.

Tree verification (multi-step speculative sampling, Miao et al. 2023; without replacement as in
Jeon et al. 2024). Context 0 is the current sequence, context i+1 is node i; the children of a context
were drawn from the draft's distribution q there. Walking from the root, the children of the current
context are tried in node order with the target's law p at that context as the first residual r:

* the child x drawn from proposal q' is accepted with probability min(1, r(x) / q'(x)) and entered;
* on rejection r <- norm(max(r - q', 0)) and the next child is tried;
* when every child is rejected, or at a leaf, one token is drawn from r (p at a leaf).

q' is q for i.i.d. siblings, q without the earlier siblings (renormalised) when they were drawn
without replacement, and the point mass at x for deterministic siblings (``draft_logits=None``).
Every residual met this way has the closed form

    w(y) = max(p(y) - c * q(y), 0) * [y not in S]          r = w / Z,  Z = sum_y w(y)

with one scalar c and the set S of rejected siblings (S stays empty for i.i.d. siblings, where the
formula already gives 0 at every rejected child; q is 0 for deterministic siblings). Starting from
c = 0, Z = 1, S = {} (so w = p), rejecting x drawn from q' with remaining draft mass M updates

    c <- c + Z / M,   S <- S + {x},   M <- sum_{y not in S} q(y),   Z <- sum_y w(y)

(M = 1 and S unused for i.i.d. siblings). So a row needs a handful of scalars per context, never a
copy of the vocabulary, and the acceptance test of x is ``u * q'(x) * Z < w(x) * M`` with q'(x) = q(x)
(i.i.d.), q(x) [x not in S] (without replacement) or 1 (deterministic). For the first child (c = 0,
Z = M = 1) this is exactly the chain's ``u * q(x) < p(x)``, and after its rejection w = max(p - q, 0):
``verify`` of a chain and ``verify_tree`` of the same chain agree. If a rejection leaves w zero
everywhere (p equals q up to rounding), the residual stays as it was (the chain's "race on p").
Greedy rows (temperature 0) enter the first child equal to the raw argmax and emit the argmax.

Block verification (Sun et al., ICLR 2025) judges a chain of K drafts jointly. With p_0 = 1,
p_i = min(1, p_{i-1} p(x_i) / q(x_i)) (q(x_i) = 0: 1 if p_{i-1} p(x_i) > 0, else 0), and at the lines
i = 1 .. n_b - 1 the mass S_i = sum_y max(p_i P_i(y) - Q_i(y), 0), the walk stops at the LAST i whose
coin passes ``eta_i * (S_i + (1 - p_i)) < S_i`` (at i = n_b: ``eta_i < p_{n_b}``), or at 0 when none
does. It keeps x_1..x_tau and draws the next token from max(p_tau P_tau - Q_tau, 0) (P_{n_b} itself
at tau = n_b; p_0 = 1 makes tau = 0 the token-wise residual; all-zero: P_tau). Greedy rows verify
token by token. The expected number of accepted drafts is never below token-wise verification.

Random numbers (contract v2, section 3): the coin of the child of sibling rank r at a context of depth
d is word 0 of Philox counter (r, P_lo, P_hi, 0) with P = offset + d; block verification's eta_i is
the chain coin of draft i (rank 0, P = offset + i - 1); the final draw at depth / position j is an
exponential race argmax_y w(y) / E_y with E_y from counter (y >> 2, P_lo, P_hi, 1), word y & 3.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._params import LOGPROBS_NONE, TreeArgs, VerifyArgs, bad_parents, invalid_rows, inverse_temperature
from ._philox import VERIFY_STREAM, coin_uniforms, key_per_row, race_uniforms
from .reference import ProcessedLines, _emitted_logprobs, _lines, _subset, process_lines


def race_exponentials(keys: torch.Tensor, position: torch.Tensor, vocab: int) -> torch.Tensor:
    """(R, vocab) float32 exponentials E_y = -log(u_y) of the verify stream, rows keyed (R,) at positions (R,)."""
    return -torch.log(race_uniforms(keys, position, vocab, VERIFY_STREAM))


# --------------------------------------------------------------------------------------------------
# Tree layout


@dataclass
class TreeLayout:
    """The shape of every row's tree, from ``parents`` and ``num_nodes``."""

    bad: torch.Tensor  # (B,) bool: a parent out of range or not below its child, or num_nodes outside [0, N]
    used: torch.Tensor  # (B, N) bool: nodes the row verifies (none in a bad row)
    rank: torch.Tensor  # (B, N) int64: place among the siblings, in node order
    children: torch.Tensor  # (B, N+1, C) int64: node of the child of rank r at context c, -1 beyond the last
    has_children: torch.Tensor  # (B, N+1) bool


def tree_layout(args: TreeArgs) -> TreeLayout:
    batch, nodes = args.batch, args.num_tree_nodes
    device = args.parents.device
    node = torch.arange(nodes, device=device)
    bad = bad_parents(args).any(1) | (args.num_nodes < 0) | (args.num_nodes > nodes)
    used = (node[None, :] < args.num_nodes[:, None]) & ~bad[:, None]
    parent = torch.where(used, args.parents, -1)
    earlier = node[None, :] < node[:, None]  # (child i, sibling j): j < i
    same_parent = (parent[:, :, None] == parent[:, None, :]) & used[:, :, None] & used[:, None, :] & earlier[None]
    rank = same_parent.sum(2)
    width = int(rank.max()) + 1 if rank.numel() else 1
    children = torch.full((batch, nodes + 1, width), -1, dtype=torch.int64, device=device)
    rows = torch.arange(batch, device=device)[:, None].expand(batch, nodes)
    flat = (rows * (nodes + 1) + parent + 1) * width + rank
    children.view(-1).scatter_(0, flat[used], node[None, :].expand(batch, nodes)[used])
    has_children = children[:, :, 0] >= 0
    return TreeLayout(bad, used, rank, children, has_children)


# --------------------------------------------------------------------------------------------------
# Tree verification


def residual_weights(p: torch.Tensor, q: torch.Tensor | None, scale: torch.Tensor, removed: torch.Tensor | None) -> torch.Tensor:
    """w = max(p - c q, 0) [y not in S] for (R, V) p, q (None: deterministic siblings), c (R,), S (R, V) or None."""
    weights = p if q is None else (p - scale[:, None] * q).clamp(min=0)
    return weights if removed is None else torch.where(removed, torch.zeros_like(weights), weights)


def _padded_probs(lines: ProcessedLines | None, index: torch.Tensor, vocab: int) -> torch.Tensor | None:
    """(R, V) draft probabilities of the lines at ``index``; ids beyond the draft's vocabulary have q = 0."""
    if lines is None:
        return None
    probs = _subset(lines, index).probs()
    if probs.shape[1] == vocab:
        return probs
    padded = torch.zeros(probs.shape[0], vocab, dtype=probs.dtype, device=probs.device)
    padded[:, : probs.shape[1]] = probs
    return padded


def _tree_lines(args: TreeArgs, logits: torch.Tensor) -> ProcessedLines:
    batch, contexts, vocab = logits.shape
    repeat = lambda x: x.repeat_interleave(contexts)  # noqa: E731
    return process_lines(logits.reshape(batch * contexts, vocab), repeat(args.temperature), repeat(args.top_k), repeat(args.top_p))


def tree_keys(args: TreeArgs, base_key: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) int64 key and offset of every row of a tree call (keys: seeds, else base_key + row; offsets default 0)."""
    device = args.target_logits.device
    keys = key_per_row(args.seeds, base_key, args.batch, device)
    offsets = args.offsets if args.offsets is not None else torch.zeros(args.batch, dtype=torch.int64, device=device)
    return keys, offsets


def verify_tree_eager(args: TreeArgs, base_key: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eager tree verification.

    Returns (tokens (B, N+1) int64, num_accepted (B,) int64, accepted_nodes (B, N) int64): as wide as
    the deepest path N nodes allow, whatever the rows entered, so the width follows from the call's
    shapes alone (a device backend sizes its outputs before its walk has run). -1 pads beyond each
    row's path, and a bad row is all -1 with num_accepted 0.
    """
    batch, nodes, vocab = args.batch, args.num_tree_nodes, args.vocab
    device = args.target_logits.device
    layout = tree_layout(args)
    keys, offsets = tree_keys(args, base_key)
    contexts = nodes + 1
    rows = torch.arange(batch, device=device)
    greedy = args.temperature == 0
    deterministic = args.draft_logits is None
    without_replacement = args.siblings == "without_replacement" and not deterministic
    target = _tree_lines(args, args.target_logits)  # line b * (N+1) + context
    draft = None if deterministic else _tree_lines(args, args.draft_logits)
    tokens = args.draft_tokens.long().clamp(0, args.draft_vocab - 1)  # out-of-range ids blank the row below

    # Walk state, one entry per row.
    context = torch.zeros(batch, dtype=torch.int64, device=device)
    depth = torch.zeros_like(context)
    rank = torch.zeros_like(context)
    scale = torch.zeros(batch, dtype=torch.float32, device=device)  # c
    mass = torch.ones_like(scale)  # Z
    draft_mass = torch.ones_like(scale)  # M
    removed = torch.zeros(batch, vocab, dtype=torch.bool, device=device) if (deterministic or without_replacement) else None
    walking = ~layout.bad
    path = torch.full((batch, nodes), -1, dtype=torch.int64, device=device)
    read_target = torch.zeros(batch, contexts, dtype=torch.bool, device=device)
    read_draft = torch.zeros_like(read_target)
    width = layout.children.shape[2]

    for _ in range(nodes + 1):  # each row tests at most N children, then stops
        read_target[rows, context] |= walking
        child = layout.children[rows, context, rank.clamp(max=width - 1)]
        child = torch.where(rank < width, child, -1)
        walking = walking & (child >= 0)
        if not bool(walking.any()):
            break
        child = child.clamp(min=0)
        line = rows * contexts + context
        x = tokens[rows, child]
        if not deterministic:
            read_draft[rows, context] |= walking & ~greedy
        p = _subset(target, line).probs()
        q = _padded_probs(draft, line, vocab)
        # p(x) and q(x) from the line statistics, exactly as the chain evaluates them.
        p_x = _subset(target, line).probs_at(x)
        q_x = None if deterministic else _subset(draft, line).probs_at(x)
        x_removed = removed.gather(1, x[:, None])[:, 0] if removed is not None else None
        w_x = residual_weights(p_x[:, None], None if q_x is None else q_x[:, None], scale, None if x_removed is None else x_removed[:, None])[:, 0]
        if deterministic:
            proposal_x = torch.ones_like(w_x)
        elif without_replacement:
            proposal_x = torch.where(x_removed, 0.0, q_x)
        else:
            proposal_x = q_x
        u = coin_uniforms(keys, offsets + depth, rank)
        accept = torch.where(greedy, x == target.argmax[line], u * proposal_x * mass < w_x * draft_mass)
        enter = walking & accept
        reject = walking & ~accept

        # Rejection: the next residual, unless it would be zero everywhere.
        new_scale, new_removed, new_draft_mass = scale, removed, draft_mass
        if not deterministic:
            new_scale = scale + mass / draft_mass
        if removed is not None:
            new_removed = removed.clone()
            new_removed[rows, x] = True
        if without_replacement:
            new_draft_mass = torch.where(new_removed, 0.0, q).sum(1)
        new_mass = residual_weights(p, q, new_scale, new_removed).sum(1)
        update = reject & ~greedy & (new_mass > 0)
        scale = torch.where(update, new_scale, scale)
        mass = torch.where(update, new_mass, mass)
        draft_mass = torch.where(update, new_draft_mass, draft_mass)
        if removed is not None:
            removed = torch.where(update[:, None], new_removed, removed)
        rank = torch.where(reject, rank + 1, rank)

        # Acceptance: enter the child with a fresh residual (its context's p).
        path[enter, depth[enter]] = child[enter]
        context = torch.where(enter, child + 1, context)
        depth = torch.where(enter, depth + 1, depth)
        rank = torch.where(enter, 0, rank)
        scale = torch.where(enter, 0.0, scale)
        mass = torch.where(enter, 1.0, mass)
        draft_mass = torch.where(enter, 1.0, draft_mass)
        if removed is not None:
            removed = removed & ~enter[:, None]

    # The final draw at the context where each walk stopped.
    line = rows * contexts + context
    p = _subset(target, line).probs()
    w = residual_weights(p, _padded_probs(draft, line, vocab), scale, removed)
    exponentials = race_exponentials(keys, offsets + depth, vocab)
    race = w / exponentials
    winner = torch.where(race.amax(dim=1) > 0, race.argmax(dim=1), (p / exponentials).argmax(dim=1))
    winner = torch.where(greedy, target.argmax[line], winner)

    num_accepted = depth
    out = torch.full((batch, nodes + 1), -1, dtype=torch.int64, device=device)
    on_path = path >= 0
    out[:, :nodes] = torch.where(on_path, tokens.gather(1, path.clamp(min=0)), -1)
    out.scatter_(1, num_accepted[:, None], winner[:, None])
    bad = layout.bad | invalid_tree_rows(args, layout, None if args.check else (read_target, read_draft))
    out = torch.where(bad[:, None], -1, out)
    path = torch.where(bad[:, None], -1, path)
    num_accepted = torch.where(bad, 0, num_accepted)
    return out, num_accepted, path


def line_problems(args, logits: torch.Tensor, used: torch.Tensor, name: str) -> list[tuple[str, torch.Tensor, str]]:
    """(argument, (B,) bad-row mask, description) for the (B, L) lines ``used`` of (B, L, V) logits.

    One max per line finds NaN (max is NaN), +inf and an empty line (max is -inf); scaling that max
    by 1 / T finds a temperature so small that the processed logits are not finite.
    """
    line_max = logits.amax(dim=2).float()
    inv_t = inverse_temperature(args.temperature)[:, None]
    sampled = (args.temperature > 0)[:, None]
    nan_or_inf = (torch.isnan(line_max) | torch.isposinf(line_max)) & used
    empty = torch.isneginf(line_max) & used
    overflow = torch.isfinite(line_max) & ~torch.isfinite(line_max * inv_t) & sampled & used
    return [
        (name, nan_or_inf.any(1), "contains NaN or +inf"),
        (name, empty.any(1), "has a context whose processed distribution is empty (every logit is -inf)"),
        ("temperature", overflow.any(1), f"is so small that {name} / temperature is not finite (use temperature 0 for greedy decoding)"),
    ]


def tree_row_problems(args: TreeArgs, layout: TreeLayout, read: tuple[torch.Tensor, torch.Tensor] | None) -> list[tuple[str, torch.Tensor, str]]:
    """Every value problem of each row. ``read`` = (target, draft) (B, N+1) masks of the lines the walk
    read (``check=False``); None validates every line a row could use (``check=True``): the target line
    of each context up to n_b and the draft line of each context with children."""
    nodes = args.num_tree_nodes
    device = args.target_logits.device
    context = torch.arange(nodes + 1, device=device)
    if read is None:
        target_used = (context[None, :] <= args.num_nodes[:, None]) & ~layout.bad[:, None]
        draft_used = layout.has_children
    else:
        target_used, draft_used = read
    problems = line_problems(args, args.target_logits, target_used, "target_logits")
    if args.draft_logits is not None:
        problems += line_problems(args, args.draft_logits, draft_used, "draft_logits")
    tokens = args.draft_tokens
    out_of_range = ((tokens < 0) | (tokens >= args.draft_vocab)) & layout.used
    problems.append(("draft_tokens", out_of_range.any(1), f"holds an id outside [0, {args.draft_vocab})"))
    return problems


def invalid_tree_rows(args: TreeArgs, layout: TreeLayout, read) -> torch.Tensor:
    """(B,) bool: bad parameters, keys, offsets or values in the lines that count (see tree_row_problems)."""
    bad = ~(args.temperature >= 0) | torch.isinf(args.temperature) | (args.top_k < 0)
    bad |= ~((args.top_p > 0) & (args.top_p <= 1))
    if args.seeds is not None:
        bad |= args.seeds < 0
    if args.offsets is not None:
        bad |= args.offsets < 0
    for _, mask, _ in tree_row_problems(args, layout, read):
        bad |= mask
    return bad


# --------------------------------------------------------------------------------------------------
# Block verification of a chain


def block_weights(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """(B, K) p_i = min(1, p_{i-1} p(x_i) / q(x_i)) for i = 1..K, from (B, K) p(x_i) and q(x_i)."""
    weights = torch.empty_like(p_x)
    previous = torch.ones_like(p_x[:, 0]) if p_x.shape[1] else None
    for i in range(p_x.shape[1]):
        joint = previous * p_x[:, i]
        ratio = torch.where(q_x[:, i] > 0, joint / q_x[:, i], torch.where(joint > 0, 1.0, 0.0))
        previous = torch.clamp(ratio, max=1.0)
        weights[:, i] = previous
    return weights


def verify_block_eager(args: VerifyArgs, base_key: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Eager block verification of chains; returns (tokens (B, K+1) int64, num_accepted (B,) int64,
    logprobs (B, K+1) float32 or None), keys and offsets as for :func:`specdec_ext.verify`."""
    batch, num_positions, vocab = args.batch, args.num_positions, args.vocab
    device = args.target_logits.device
    keys = key_per_row(args.seeds, base_key, batch, device)
    offsets = args.offsets if args.offsets is not None else torch.zeros(batch, dtype=torch.int64, device=device)
    rows = torch.arange(batch, device=device)
    positions = torch.arange(num_positions + 1, device=device)
    greedy = args.temperature == 0
    n = args.num_draft_tokens.clamp(0, num_positions)
    target = _lines(args, args.target_logits)  # line b * (K+1) + k
    draft = _lines(args, args.draft_logits) if args.draft_logits is not None and num_positions else None  # line b * K + k
    tokens = args.draft_tokens.long().clamp(0, args.draft_vocab - 1)

    tau = torch.zeros(batch, dtype=torch.int64, device=device)
    weights = torch.ones(batch, 1, device=device)
    if num_positions:
        target_line = rows[:, None] * (num_positions + 1) + positions[None, :num_positions]
        p_x = _probs_at(target, target_line, tokens)
        q_x = _probs_at(draft, rows[:, None] * num_positions + positions[None, :num_positions], tokens) if draft is not None else torch.ones_like(p_x)
        weights = torch.cat([torch.ones_like(p_x[:, :1]), block_weights(p_x, q_x)], dim=1)  # (B, K+1): p_0 .. p_K
        # S_i at the lines i = 1..K-1 (a draft line exists there).
        inner = torch.zeros(batch, num_positions + 1, device=device)
        if num_positions > 1:
            big_p = target.probs().reshape(batch, num_positions + 1, vocab)[:, 1:num_positions]
            big_q = _draft_probs(args, draft, tokens, batch, num_positions, vocab)[:, 1:]
            inner[:, 1:num_positions] = (weights[:, 1:num_positions, None] * big_p - big_q).clamp(min=0).sum(2)
        eta = coin_uniforms(keys, offsets[:, None] + positions[None, :num_positions])  # eta_i at column i - 1
        index = positions[None, 1:]  # i = 1..K
        stop_inside = eta * (inner[:, 1:] + (1.0 - weights[:, 1:])) < inner[:, 1:]
        stop_last = eta < weights[:, 1:]
        stop = torch.where(index == n[:, None], stop_last, stop_inside) & (index <= n[:, None])
        tau = (stop.long() * index).amax(dim=1)
        # Greedy rows verify token by token: accept while the draft is the argmax.
        match = tokens == target.argmax[target_line]
        match &= positions[None, :num_positions] < n[:, None]
        tau = torch.where(greedy, match.long().cumprod(1).sum(1), tau)

    line = rows * (num_positions + 1) + tau
    p = _subset(target, line).probs()
    residual = p
    if num_positions:
        if draft is not None:
            q = torch.zeros_like(p)
            q[:, : args.draft_vocab] = _subset(draft, rows * num_positions + tau.clamp(max=num_positions - 1)).probs()
        else:
            q = torch.zeros_like(p).scatter_(1, tokens.gather(1, tau.clamp(max=num_positions - 1)[:, None]), 1.0)
        scaled = weights.gather(1, tau[:, None])
        residual = torch.where((tau < n)[:, None], (scaled * p - q).clamp(min=0), p)
    exponentials = race_exponentials(keys, offsets + tau, vocab)
    race = residual / exponentials
    winner = torch.where(race.amax(dim=1) > 0, race.argmax(dim=1), (p / exponentials).argmax(dim=1))
    winner = torch.where(greedy, target.argmax[line], winner)

    out = torch.full((batch, num_positions + 1), -1, dtype=torch.int64, device=device)
    out[:, :num_positions] = torch.where(positions[None, :num_positions] < tau[:, None], tokens, -1)
    out.scatter_(1, tau[:, None], winner[:, None])
    # Sampled rows read every line up to n_b; greedy rows stop at their first mismatch.
    reached = None if args.check else torch.where(greedy, tau, n)
    bad = invalid_rows(args, reached=reached)
    out = torch.where(bad[:, None], -1, out)
    logprobs = _emitted_logprobs(args, target, out) if args.logprobs != LOGPROBS_NONE else None
    return out, torch.where(bad, 0, tau), logprobs


def _probs_at(lines: ProcessedLines, line: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(B, K) processed probability of tokens[b, k] on line[b, k]."""
    flat = line.reshape(-1)
    return _subset(lines, flat).probs_at(tokens.reshape(-1)).reshape(tokens.shape)


def _draft_probs(args: VerifyArgs, draft: ProcessedLines | None, tokens: torch.Tensor, batch: int, num_positions: int, vocab: int) -> torch.Tensor:
    """(B, K, V) draft law at each draft line: q padded to V, or the point mass at the draft (one-hot drafts)."""
    if draft is None:
        return torch.nn.functional.one_hot(tokens, vocab).float()
    q = torch.zeros(batch, num_positions, vocab, device=tokens.device)
    q[:, :, : args.draft_vocab] = draft.probs().reshape(batch, num_positions, -1)
    return q
