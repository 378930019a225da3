"""The draft shape of each step: fixed, or "auto" from the running acceptance rate and the measured
cost of a draft forward (K for chains, the tree for ``tree="auto"``).

Both estimates decay (weight 0.8 per step) so the choice follows the text's drift; the first step's
timing is skipped because it carries one-off start-up costs. A step is modelled as one target forward
(cost 1) plus one draft forward per depth (cost c each); the shape with the most expected tokens per
unit of that time wins, the one with fewer nodes on ties.
"""

from __future__ import annotations

from .shapes import DraftTree, candidate_trees, expected_tokens

#: ``num_draft_tokens="auto"`` chooses K in [1, AUTO_MAX_DRAFT_TOKENS], starting at AUTO_FIRST_DRAFT_TOKENS.
AUTO_MAX_DRAFT_TOKENS = 8
AUTO_FIRST_DRAFT_TOKENS = 4
#: ``tree="auto"`` starts with this tree, until both estimates exist.
AUTO_FIRST_TREE = (2, 1, 1)


def expected_speedup(acceptance: float, cost_ratio: float, num_draft_tokens: int) -> float:
    """Leviathan et al. (2023): expected walltime improvement ``(1 - a^(K+1)) / ((1 - a)(K c + 1))``.

    ``a`` is the per-token acceptance rate, ``c`` the cost of one draft forward over one target forward.
    """
    a = min(max(acceptance, 0.0), 1.0 - 1e-6)
    k = num_draft_tokens
    return (1.0 - a ** (k + 1)) / ((1.0 - a) * (k * cost_ratio + 1.0))


def best_num_draft_tokens(acceptance: float, cost_ratio: float, max_draft_tokens: int = AUTO_MAX_DRAFT_TOKENS) -> int:
    """The K in [1, max_draft_tokens] with the largest :func:`expected_speedup` (smallest K on ties)."""
    return max(range(1, max_draft_tokens + 1), key=lambda k: (expected_speedup(acceptance, cost_ratio, k), -k))


class ShapeChooser:
    """Chooses each step's :class:`DraftTree` among ``candidates`` (or always ``fixed``)."""

    def __init__(self, fixed: DraftTree | None, candidates: list[DraftTree] = (), first: DraftTree | None = None):
        self.fixed = fixed
        self.auto = fixed is None
        self.candidates = list(candidates)
        self.first = first
        self.accepted = self.judged = 0.0
        self.cost_ratio: float | None = None  # seconds of one draft forward / seconds of one target forward
        self.steps = 0

    @classmethod
    def for_chain(cls, num_draft_tokens) -> ShapeChooser:
        """K drafts per step, or "auto"."""
        if num_draft_tokens == "auto":
            chains = [DraftTree.chain(k) for k in range(1, AUTO_MAX_DRAFT_TOKENS + 1)]
            return cls(None, chains, DraftTree.chain(AUTO_FIRST_DRAFT_TOKENS))
        if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be an integer >= 1 or 'auto', got {num_draft_tokens!r}")
        return cls(DraftTree.chain(num_draft_tokens))

    @classmethod
    def for_tree(cls, tree) -> ShapeChooser:
        """A given tree (children per node at each depth, or a DraftTree), or "auto"."""
        if tree == "auto":
            return cls(None, candidate_trees(), DraftTree.from_branching(AUTO_FIRST_TREE))
        if isinstance(tree, DraftTree):
            return cls(tree)
        if isinstance(tree, (list, tuple)) and all(isinstance(w, int) and not isinstance(w, bool) for w in tree):
            return cls(DraftTree.from_branching(tree))
        raise ValueError(f"tree must be None, a sequence of children per node at each depth (e.g. (2, 2, 1)) or 'auto', got {tree!r}")

    @property
    def deepest(self) -> int:
        """The deepest shape this chooser can return."""
        return self.fixed.max_depth if not self.auto else max(shape.max_depth for shape in self.candidates)

    def choose(self) -> DraftTree:
        if not self.auto:
            return self.fixed
        if self.cost_ratio is None:
            return self.first
        a = (self.accepted + 1.0) / (self.judged + 2.0)

        def value(shape: DraftTree) -> float:
            return expected_tokens(shape, a) / (1.0 + self.cost_ratio * shape.max_depth)

        return max(self.candidates, key=lambda shape: (value(shape), -shape.num_nodes))

    def update(self, accepted: float, judged: float, shape: DraftTree, draft_seconds: float, target_seconds: float) -> None:
        """``accepted`` / ``judged``: children entered over contexts with children the walks reached this
        step (for a chain: accepted drafts over drafts judged), or the sum of the judged drafts'
        acceptance probabilities min(1, p/q) over their count (the same mean, lower variance)."""
        self.steps += 1
        self.accepted = 0.8 * self.accepted + accepted
        self.judged = 0.8 * self.judged + judged
        if self.steps == 1 or target_seconds <= 0:
            return
        ratio = draft_seconds / shape.max_depth / target_seconds
        self.cost_ratio = ratio if self.cost_ratio is None else 0.8 * self.cost_ratio + 0.2 * ratio
