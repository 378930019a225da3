"""Draft shapes: how many children each node of a step's draft gets, depth by depth.

A chain of K drafts is the tree with branching (1, ..., 1), so the loop, its statistics and the
adaptive choice treat chains and trees alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Candidate trees for ``tree="auto"``: branching factors per depth, at most AUTO_MAX_NODES nodes.
AUTO_MAX_NODES = 8


@dataclass(frozen=True)
class DraftTree:
    """A tree shape: ``branching[d]`` children for every node at depth d (the root is depth 0).

    Nodes are numbered level by level (breadth first), children of one parent consecutively, so the
    nodes up to any depth are a prefix of the node list (a ragged row uses ``num_nodes`` of them).
    """

    branching: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]  # depth of each node, 1 for the root's children
    levels: tuple[tuple[int, int], ...]  # [start, end) node range of each depth 1..D

    @classmethod
    def from_branching(cls, branching) -> DraftTree:
        branching = tuple(int(w) for w in branching)
        if not branching or any(w < 1 for w in branching):
            raise ValueError(f"tree must give at least one depth and >= 1 child per node at each depth, got {branching!r}")
        parents, depths, levels = [], [], []
        previous = [-1]
        for depth, width in enumerate(branching, start=1):
            start = len(parents)
            for parent in previous:
                parents.extend([parent] * width)
                depths.extend([depth] * width)
            levels.append((start, len(parents)))
            previous = list(range(start, len(parents)))
        return cls(branching, tuple(parents), tuple(depths), tuple(levels))

    @classmethod
    def chain(cls, length: int) -> DraftTree:
        """K drafts one after the other."""
        return cls.from_branching((1,) * length)

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return len(self.branching)

    @property
    def is_chain(self) -> bool:
        return all(width == 1 for width in self.branching)

    def nodes_within(self, depth: int) -> int:
        """How many nodes lie at depth <= ``depth`` (a prefix of the node list)."""
        return self.levels[min(depth, self.max_depth) - 1][1] if depth >= 1 else 0

    def truncated(self, depth: int) -> DraftTree:
        """The first ``depth`` levels (at least one): rows near their last token cannot use deeper ones."""
        depth = max(depth, 1)
        return self if depth >= self.max_depth else DraftTree.from_branching(self.branching[:depth])

    def ancestors(self) -> torch.Tensor:
        """(N, N) bool: [i, j] when node j is node i or one of its ancestors."""
        n = self.num_nodes
        table = torch.eye(n, dtype=torch.bool)
        for node, parent in enumerate(self.parents):
            if parent >= 0:
                table[node] |= table[parent]
        return table


def candidate_trees(max_nodes: int = AUTO_MAX_NODES) -> list[DraftTree]:
    """Every branching (w_1, ..., w_D) with w_1 >= w_2 >= ... >= 1 and at most ``max_nodes`` nodes."""
    found = []

    def extend(prefix: tuple[int, ...], nodes: int, width_at_depth: int):
        if prefix:
            found.append(DraftTree.from_branching(prefix))
        top = prefix[-1] if prefix else max_nodes
        for w in range(1, top + 1):
            more = width_at_depth * w
            if nodes + more <= max_nodes:
                extend(prefix + (w,), nodes + more, more)

    extend((), 0, 1)
    return found


def expected_tokens(tree: DraftTree, child_acceptance: float) -> float:
    """Tokens one step emits in expectation if each child is entered with probability ``a``
    independently of its siblings (a planning model, not the exact law): a node with w children is
    left through one of them with probability 1 - (1 - a)^w, plus the one corrected / bonus token.
    For a chain of K this is Leviathan et al.'s (1 - a^(K+1)) / (1 - a)."""
    a = min(max(child_acceptance, 0.0), 1.0)
    reach, total = 1.0, 1.0
    for width in tree.branching:
        reach *= 1.0 - (1.0 - a) ** width
        total += reach
    return total
