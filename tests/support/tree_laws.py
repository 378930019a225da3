"""Exact laws of tree and block verification over a tiny language, and the checks built on them.

A *language* gives the target's and the draft's processed next-token laws p(. | prefix) and
q(. | prefix) for every prefix up to a depth, over a vocabulary of a few tokens. The laws below are
computed by enumerating every draft tree (or chain) and every accept / reject branch of the literal
algorithm in float64: residuals are normalised vectors r <- norm(max(r - q', 0)), with none of the
closed-form bookkeeping the backends use. A round is exact when, for every emitted prefix y and
token t, P(round emits y then t) = P(round reaches y) * p(t | y).

Each algorithm has deliberately wrong variants (``variant=``) that the same checks must reject.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from scipy import stats

from specdec_ext.reference import process_lines

FALSE_ALARM = 1e-6


@dataclass
class Language:
    vocab: int
    depth: int
    prefixes: list[tuple[int, ...]]
    target_logits: torch.Tensor  # (P, V) float32 raw logits per prefix
    draft_logits: torch.Tensor  # (P, V) float32
    p: torch.Tensor  # (P, V) float64 processed target law
    q: torch.Tensor  # (P, V) float64 processed draft law (zero beyond the draft's vocabulary)
    draft_vocab: int

    def index(self, prefix) -> int:
        """Row of a prefix: prefixes of length L start at sum_{l<L} V^l, in base-V order."""
        start = sum(self.vocab**length for length in range(len(prefix)))
        within = 0
        for token in prefix:
            within = within * self.vocab + int(token)
        return start + within

    def child_index(self, index: torch.Tensor, length: torch.Tensor | int, token: torch.Tensor) -> torch.Tensor:
        """Vectorised: the row of prefix + (token,) from the row ``index`` of a prefix of ``length``."""
        length = torch.as_tensor(length)
        start = (self.vocab**length - 1) // (self.vocab - 1)
        next_start = (self.vocab ** (length + 1) - 1) // (self.vocab - 1)
        return next_start + (index - start) * self.vocab + token


def language(seed: int, vocab: int = 4, depth: int = 3, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             spread: float = 1.5, draft_noise: float = 1.0, draft_vocab: int | None = None, negate: bool = False,
             round_to: torch.dtype | None = None) -> Language:
    """Random target / draft logits per prefix, processed by the reference's own line processing
    (``round_to``: logits rounded to that dtype first, as a bf16 / fp16 model would give them)."""
    g = torch.Generator().manual_seed(seed)
    prefixes = [x for length in range(depth + 1) for x in itertools.product(range(vocab), repeat=length)]
    target_logits = torch.randn(len(prefixes), vocab, generator=g) * spread
    draft_logits = (-target_logits if negate else target_logits) + torch.randn(len(prefixes), vocab, generator=g) * draft_noise
    draft_vocab = draft_vocab or vocab
    draft_logits = draft_logits[:, :draft_vocab].contiguous()
    if round_to is not None:
        target_logits, draft_logits = target_logits.to(round_to).float(), draft_logits.to(round_to).float()

    def law(logits: torch.Tensor) -> torch.Tensor:
        n = logits.shape[0]
        lines = process_lines(logits, torch.full((n,), temperature), torch.full((n,), top_k), torch.full((n,), top_p))
        probs = lines.probs().double()
        probs = probs / probs.sum(dim=1, keepdim=True)
        if probs.shape[1] < vocab:
            probs = torch.cat([probs, probs.new_zeros(n, vocab - probs.shape[1])], dim=1)
        return probs

    return Language(vocab, depth, prefixes, target_logits, draft_logits, law(target_logits), law(draft_logits), draft_vocab)


# ------------------------------------------------------------------------------------------------
# Exact laws


def children_of(parents: list[int]) -> dict[int, list[int]]:
    """{parent node (-1 = root): [child nodes in try order]}."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    return children


def deterministic_tokens(lang: Language, parents: list[int]) -> tuple[int, ...]:
    """Deterministic siblings: the children of a context are the draft's most probable tokens there (ties: lower id)."""
    children = children_of(parents)
    tokens = [0] * len(parents)
    prefix_of = {-1: ()}
    for node, parent in enumerate(parents):
        rank = children[parent].index(node)
        q = lang.q[lang.index(prefix_of[parent])].tolist()
        order = sorted(range(lang.vocab), key=lambda t: (-q[t], t))
        tokens[node] = order[rank]
        prefix_of[node] = prefix_of[parent] + (tokens[node],)
    return tuple(tokens)


def _tables(lang: Language) -> tuple[list[list[float]], list[list[float]]]:
    """p and q as nested Python lists: the enumerations below do millions of scalar operations."""
    return lang.p.tolist(), lang.q.tolist()


def draft_trees(lang: Language, parents: list[int], mode: str):
    """Yield (tokens, probability) for every draft tree of this shape.

    mode: "iid" (children drawn independently from q), "without_replacement", or "deterministic".
    """
    if mode == "deterministic":
        yield deterministic_tokens(lang, parents), 1.0
        return
    children = children_of(parents)
    _, q_table = _tables(lang)

    def extend(node: int, tokens: tuple[int, ...], prefix_of: dict, weight: float):
        if node == len(parents):
            yield tokens, weight
            return
        parent = parents[node]
        q = list(q_table[lang.index(prefix_of[parent])])
        if mode == "without_replacement":
            for sibling in children[parent]:
                if sibling < node:
                    q[tokens[sibling]] = 0.0
            mass = sum(q)
            if mass <= 0:
                return
            q = [v / mass for v in q]
        for token in range(lang.vocab):
            if q[token] > 0:
                yield from extend(node + 1, tokens + (token,), {**prefix_of, node: prefix_of[parent] + (token,)}, weight * q[token])

    yield from extend(0, (), {-1: ()}, 1.0)


def _acceptance(r: list[float], proposal: list[float], token: int) -> float:
    if proposal[token] > 0:
        return min(1.0, r[token] / proposal[token])
    return 1.0 if r[token] > 0 else 0.0


def _normalised_residual(r: list[float], proposal: list[float]) -> list[float] | None:
    residual = [max(a - b, 0.0) for a, b in zip(r, proposal, strict=True)]
    mass = sum(residual)
    return [v / mass for v in residual] if mass > 0 else None


def walk_law(lang: Language, parents: list[int], tokens: tuple[int, ...], mode: str, variant: str = "exact", weight: float = 1.0, law=None,
             tables=None) -> dict:
    """Law of what one verification of this tree emits, by the literal recursion.

    variant "exact"; "reuse_r": every sibling is tested against p and the final draw uses max(p - q, 0)
    (the residual is not carried from one sibling to the next); "no_removal": siblings drawn without
    replacement are verified as if i.i.d. (their proposal q is not renormalised).
    """
    law = {} if law is None else law
    children = children_of(parents)
    p_table, q_table = tables or _tables(lang)

    def visit(node: int, prefix: tuple[int, ...], reach: float):
        p = p_table[lang.index(prefix)]
        q = q_table[lang.index(prefix)]
        r = p
        removed: list[int] = []
        stay = reach
        for child in children.get(node, []):
            x = tokens[child]
            if mode == "deterministic":
                proposal = [0.0] * lang.vocab
                proposal[x] = 1.0
            elif mode == "without_replacement" and variant != "no_removal":
                proposal = [0.0 if y in removed else v for y, v in enumerate(q)]
                mass = sum(proposal)
                proposal = [v / mass for v in proposal] if mass > 0 else proposal
            else:
                proposal = q
            accept = _acceptance(p if variant == "reuse_r" else r, proposal, x)
            visit(child, prefix + (x,), stay * accept)
            stay *= 1.0 - accept
            residual = _normalised_residual(r, proposal)
            if variant != "reuse_r" and residual is not None:
                r = residual
            removed.append(x)
        if variant == "reuse_r" and children.get(node):
            r = (_normalised_residual(p, q) if mode != "deterministic" else None) or p
        for t in range(lang.vocab):
            if r[t] > 0:
                key = prefix + (t,)
                law[key] = law.get(key, 0.0) + stay * r[t]

    visit(-1, (), weight)
    return law


def tree_law(lang: Language, parents: list[int], mode: str, variant: str = "exact") -> dict:
    """{emitted tuple: probability} of one round: draft a tree of this shape, then verify it."""
    law: dict = {}
    tables = _tables(lang)
    for tokens, weight in draft_trees(lang, parents, mode):
        walk_law(lang, parents, tokens, mode, variant, weight, law, tables)
    return law


def block_law(lang: Language, length: int, variant: str = "exact") -> dict:
    """Law of block verification of a chain of ``length`` drafts (Sun et al.), by enumeration.

    variant "token_residual": after stopping at tau < length, draw from max(P - Q, 0) instead of
    max(p_tau P - Q, 0); "target_redraw": draw from P itself there.
    """
    law: dict = {}
    p_table, q_table = _tables(lang)
    for drafts in itertools.product(range(lang.vocab), repeat=length):
        weight = 1.0
        for i, x in enumerate(drafts):
            weight *= q_table[lang.index(drafts[:i])][x]
        if weight == 0:
            continue
        carried = [1.0]  # p_0 .. p_length
        stop = [0.0]  # h_0 unused
        for i in range(1, length + 1):
            prefix = drafts[: i - 1]
            p_x, q_x = p_table[lang.index(prefix)][drafts[i - 1]], q_table[lang.index(prefix)][drafts[i - 1]]
            joint = carried[-1] * p_x
            carried.append(min(1.0, joint / q_x) if q_x > 0 else (1.0 if joint > 0 else 0.0))
            if i < length:
                here = lang.index(drafts[:i])
                mass = sum(max(carried[i] * a - b, 0.0) for a, b in zip(p_table[here], q_table[here], strict=True))
                stop.append(mass / (mass + 1.0 - carried[i]) if mass > 0 else 0.0)
            else:
                stop.append(carried[i])
        for tau in range(length + 1):
            chance = 1.0 if tau == 0 else stop[tau]
            for j in range(tau + 1, length + 1):
                chance *= 1.0 - stop[j]
            if chance == 0:
                continue
            prefix = drafts[:tau]
            big_p = p_table[lang.index(prefix)]
            if tau == length or variant == "target_redraw":
                residual = big_p
            else:
                factor = 1.0 if variant == "token_residual" else carried[tau]
                residual = _normalised_residual([factor * v for v in big_p], q_table[lang.index(prefix)]) or big_p
            for t in range(lang.vocab):
                if residual[t] > 0:
                    key = prefix + (t,)
                    law[key] = law.get(key, 0.0) + weight * chance * residual[t]
    return law


def one_hot_language(lang: Language) -> Language:
    """The same target, and a deterministic draft: q(. | prefix) is the point mass at the draft's mode."""
    one_hot = torch.nn.functional.one_hot(lang.q.argmax(1), lang.vocab).double()
    return Language(lang.vocab, lang.depth, lang.prefixes, lang.target_logits, lang.draft_logits, lang.p, one_hot, lang.draft_vocab)


def max_violation(lang: Language, law: dict) -> float:
    """max over emitted prefixes y and tokens t of |P(y then t) - P(reach y) p(t | y)|."""
    reach: dict = {}
    for sequence, prob in law.items():
        for k in range(len(sequence)):
            reach[sequence[:k]] = reach.get(sequence[:k], 0.0) + prob
    emitted: dict = {}
    for sequence, prob in law.items():
        for k in range(1, len(sequence) + 1):
            emitted[sequence[:k]] = emitted.get(sequence[:k], 0.0) + prob
    worst = 0.0
    p_table, _ = _tables(lang)
    for prefix, reached in reach.items():
        p = p_table[lang.index(prefix)]
        for t in range(lang.vocab):
            worst = max(worst, abs(emitted.get(prefix + (t,), 0.0) - reached * p[t]))
    return worst


def expected_accepted(law: dict) -> float:
    return sum(prob * (len(sequence) - 1) for sequence, prob in law.items())


# ------------------------------------------------------------------------------------------------
# Drafting trees for the samplers (vectorised over rows)


def draft_tree_batch(lang: Language, parents: list[int], mode: str, rows: int, generator: torch.Generator):
    """Draw ``rows`` trees of one shape; returns (tokens (R, N), target_logits (R, N+1, V), draft_logits (R, N+1, Vd)).

    Context 0 is the empty prefix and context i+1 the prefix ending at node i, as verify_tree expects.
    """
    nodes = len(parents)
    children = children_of(parents)
    tokens = torch.zeros(rows, nodes, dtype=torch.int64)
    context_index = torch.zeros(rows, nodes + 1, dtype=torch.int64)  # language row of each context
    context_length = [0] * (nodes + 1)
    if mode == "deterministic":
        fixed = deterministic_tokens(lang, parents)
        tokens[:] = torch.tensor(fixed)
    for node, parent in enumerate(parents):
        parent_context = parent + 1
        q = lang.q[context_index[:, parent_context]].clone()  # (R, V)
        if mode == "without_replacement":
            for sibling in children[parent]:
                if sibling < node:
                    q.scatter_(1, tokens[:, sibling : sibling + 1], 0.0)
        if mode != "deterministic":
            tokens[:, node] = torch.multinomial(q, 1, generator=generator)[:, 0]
        context_index[:, node + 1] = lang.child_index(context_index[:, parent_context], context_length[parent_context], tokens[:, node])
        context_length[node + 1] = context_length[parent_context] + 1
    return tokens, lang.target_logits[context_index], lang.draft_logits[context_index]


def sample_law(law: dict, rows: int, generator: torch.Generator, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``rows`` emitted sequences from an exact law: (tokens (R, width) -1 padded, num_accepted (R,))."""
    sequences = list(law)
    probs = torch.tensor([law[s] for s in sequences], dtype=torch.float64)
    picks = torch.multinomial(probs / probs.sum(), rows, replacement=True, generator=generator)
    table = torch.full((len(sequences), width), -1, dtype=torch.int64)
    for i, sequence in enumerate(sequences):
        table[i, : len(sequence)] = torch.tensor(sequence)
    lengths = torch.tensor([len(s) - 1 for s in sequences])
    return table[picks], lengths[picks]


# ------------------------------------------------------------------------------------------------
# Chi-square checks of sampled rounds


def _pooled_statistic(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int, int]:
    """(chi-square statistic, degrees of freedom, draws of impossible tokens) of one group.

    Bins expecting fewer than 5 draws are pooled; a pool still under 5 joins the smallest other bin,
    so every bin expects at least 5 (rare prefixes reached a few times contribute no degree of freedom
    rather than a heavy tail).
    """
    counts, probs = counts.double(), probs.double()
    total = counts.sum()
    impossible = int(counts[probs <= 0].sum())
    expected = probs * total
    small = expected < 5
    obs, exp = counts[~small], expected[~small]
    pooled_obs, pooled_exp = counts[small].sum(), expected[small].sum()
    if pooled_exp >= 5 or obs.numel() == 0:
        obs, exp = torch.cat([obs, pooled_obs.reshape(1)]), torch.cat([exp, pooled_exp.reshape(1)])
    elif pooled_exp > 0:
        smallest = int(exp.argmin())
        obs, exp = obs.clone(), exp.clone()
        obs[smallest] += pooled_obs
        exp[smallest] += pooled_exp
    keep = exp >= 5
    obs, exp = obs[keep], exp[keep]
    if obs.numel() < 2:
        return 0.0, 0, impossible
    return float(((obs - exp) ** 2 / exp).sum()), obs.numel() - 1, impossible


def _codes(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """One integer per row for a (R, L) block of tokens in [-1, vocab): base vocab + 1, -1 as 0."""
    weights = (vocab + 1) ** torch.arange(tokens.shape[1], dtype=torch.int64)
    return ((tokens + 1) * weights).sum(1)


def depth_laws_fail(lang: Language, tokens: torch.Tensor, num_accepted: torch.Tensor, max_depth: int) -> tuple[bool, list[str]]:
    """Per-depth chi-square: among rows that reached depth k with prefix y, the token emitted at k must
    follow p(. | y); the statistics of all prefixes at one depth add up to one test (threshold: a correct
    sampler exceeds it with probability 1e-6)."""
    failed, report = False, []
    for k in range(max_depth + 1):
        reached = num_accepted >= k
        if not bool(reached.any()):
            continue
        prefixes, emitted = tokens[reached, :k], tokens[reached, k]
        assert bool(((emitted >= 0) & (emitted < lang.vocab)).all()), "a reached depth holds no valid token"
        assert bool(((prefixes >= 0) & (prefixes < lang.vocab)).all()), "an accepted prefix holds an invalid token"
        codes, group = torch.unique(_codes(prefixes, lang.vocab), return_inverse=True)
        counts = torch.zeros(len(codes), lang.vocab, dtype=torch.int64)
        counts.index_put_((group, emitted), torch.ones_like(emitted), accumulate=True)
        first_row = torch.full((len(codes),), len(group), dtype=torch.int64).scatter_reduce(0, group, torch.arange(len(group)), "amin")
        statistic, df, impossible = 0.0, 0, 0
        for g, row in enumerate(first_row.tolist()):
            s, d, bad = _pooled_statistic(counts[g], lang.p[lang.index(tuple(prefixes[row].tolist()))])
            statistic, df, impossible = statistic + s, df + d, impossible + bad
        limit = float(stats.chi2.isf(FALSE_ALARM, df)) if df else float("inf")
        fails = impossible > 0 or statistic > limit
        failed |= fails
        report.append(f"depth {k}: chi2={statistic:.1f} limit={limit:.1f} df={df} impossible={impossible} n={int(reached.sum())}")
    return failed, report


def sequence_law_fails(law: dict, tokens: torch.Tensor, num_accepted: torch.Tensor, vocab: int) -> tuple[bool, str]:
    """Chi-square of whole emitted sequences against an exact law (one test, threshold 1e-6)."""
    width = tokens.shape[1]
    sequences = list(law)
    table = torch.full((len(sequences), width), -1, dtype=torch.int64)
    for i, sequence in enumerate(sequences):
        table[i, : len(sequence)] = torch.tensor(sequence)
    known = _codes(table, vocab)
    order = known.argsort()
    columns = torch.arange(width)
    observed = _codes(torch.where(columns[None, :] <= num_accepted[:, None], tokens, -1), vocab)
    slot = torch.searchsorted(known[order], observed).clamp(max=len(sequences) - 1)
    matched = known[order][slot] == observed
    counts = torch.bincount(torch.where(matched, order[slot], len(sequences)), minlength=len(sequences) + 1).double()
    probs = torch.tensor([law[s] for s in sequences] + [0.0], dtype=torch.float64)
    statistic, df, impossible = _pooled_statistic(counts, probs)
    limit = float(stats.chi2.isf(FALSE_ALARM, df))
    return impossible > 0 or statistic > limit, f"chi2={statistic:.1f} limit={limit:.1f} df={df} impossible={impossible}"
