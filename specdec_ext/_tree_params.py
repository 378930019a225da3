"""Argument validation for :func:`specdec_ext.verify_tree`.

A call becomes a :class:`TreeArgs`: per-row tensors on the logits' device, the tree's parents as
int64, and the random keys and offsets of contract v2 (one Philox key and one position offset per
row), so a backend never looks at Python scalars or guesses defaults.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._params import BACKENDS, LOGIT_DTYPES, TOKEN_DTYPES, _check_scalar_params, _first_bad_row, _per_row, _row_vector

#: How the children of one context were drawn from the draft's distribution there.
SIBLING_MODES = ("iid", "without_replacement")


class TreeArgs(NamedTuple):
    """A validated tree verification call. Tensors live on ``target_logits.device``."""

    target_logits: torch.Tensor  # (B, N+1, V): context 0 = the sequence, context i+1 = node i
    draft_logits: torch.Tensor | None  # (B, N+1, Vd), Vd <= V; None = deterministic siblings
    draft_tokens: torch.Tensor  # (B, N) int32 / int64
    parents: torch.Tensor  # (B, N) int64: -1 = the root context, else a node index below the child's
    temperature: torch.Tensor  # (B,) float32; 0 = greedy row
    top_k: torch.Tensor  # (B,) int64; 0 = off
    top_p: torch.Tensor  # (B,) float32; 1 = off
    num_nodes: torch.Tensor  # (B,) int64 in [0, N]: row b uses nodes 0 .. n_b - 1
    siblings: str  # one of SIBLING_MODES
    generator: torch.Generator | None
    check: bool
    seeds: torch.Tensor | None = None  # (B,) int64 per-row Philox keys; None = base_key + row
    offsets: torch.Tensor | None = None  # (B,) int64 absolute position of each row's context 0; None = 0

    @property
    def batch(self) -> int:
        return self.target_logits.shape[0]

    @property
    def num_tree_nodes(self) -> int:  # N
        return self.draft_tokens.shape[1]

    @property
    def vocab(self) -> int:
        return self.target_logits.shape[2]

    @property
    def draft_vocab(self) -> int:
        return self.draft_logits.shape[2] if self.draft_logits is not None else self.vocab


def validate_tree(target_logits, draft_logits, draft_tokens, parents, *, temperature, top_k, top_p, num_nodes, siblings,
                  generator, seeds, offsets, backend, check) -> TreeArgs:
    """Check shapes, dtypes and devices (always) and values (when ``check``); normalise the parameters."""
    if not isinstance(target_logits, torch.Tensor):
        raise ValueError(f"target_logits must be a tensor, got {type(target_logits).__name__}")
    if target_logits.dim() != 3:
        raise ValueError(f"target_logits must be 3-D (batch, N+1 contexts, vocab), got shape {tuple(target_logits.shape)}")
    if target_logits.dtype not in LOGIT_DTYPES:
        raise ValueError(f"target_logits must be float32, bfloat16 or float16, got {target_logits.dtype}")
    batch, contexts, vocab = target_logits.shape
    if contexts < 1 or vocab < 1:
        raise ValueError(f"target_logits needs at least one context and one vocabulary entry, got shape {tuple(target_logits.shape)}")
    device = target_logits.device
    nodes = contexts - 1
    for name, tensor in (("draft_tokens", draft_tokens), ("parents", parents)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(tensor).__name__}")
        if tensor.dtype not in TOKEN_DTYPES:
            raise ValueError(f"{name} must be int32 or int64, got {tensor.dtype}")
        if tensor.shape != (batch, nodes):
            raise ValueError(f"{name} must have shape (batch, N) = ({batch}, {nodes}) to match target_logits (batch, N+1, vocab), got {tuple(tensor.shape)}")
        if tensor.device != device:
            raise ValueError(f"{name} is on {tensor.device} but target_logits is on {device}")
    if draft_logits is not None:
        if not isinstance(draft_logits, torch.Tensor):
            raise ValueError(f"draft_logits must be a tensor or None, got {type(draft_logits).__name__}")
        if draft_logits.dim() != 3 or draft_logits.shape[:2] != (batch, contexts):
            raise ValueError(f"draft_logits must have shape (batch, N+1, draft_vocab) with (batch, N+1) = ({batch}, {contexts}), got {tuple(draft_logits.shape)}")
        if draft_logits.dtype not in LOGIT_DTYPES:
            raise ValueError(f"draft_logits must be float32, bfloat16 or float16, got {draft_logits.dtype}")
        if not 1 <= draft_logits.shape[2] <= vocab:
            raise ValueError(f"draft_logits vocabulary ({draft_logits.shape[2]}) must be between 1 and the target's ({vocab})")
        if draft_logits.device != device:
            raise ValueError(f"draft_logits is on {draft_logits.device} but target_logits is on {device}")
    if siblings not in SIBLING_MODES:
        raise ValueError(f"siblings must be one of {SIBLING_MODES}, got {siblings!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    seeds = _row_vector(seeds, "seeds", batch, device)
    offsets = _row_vector(offsets, "offsets", batch, device)

    _check_scalar_params(temperature, top_k, top_p)
    temperature_t, temperature_is_tensor = _per_row(temperature, "temperature", batch, device, torch.float32, 1.0)
    top_k_t, top_k_is_tensor = _per_row(top_k, "top_k", batch, device, torch.int64, 0)
    top_p_t, top_p_is_tensor = _per_row(top_p, "top_p", batch, device, torch.float32, 1.0)
    if num_nodes is None:
        num_nodes_t = torch.full((batch,), nodes, dtype=torch.int64, device=device)
    else:
        if isinstance(num_nodes, (list, tuple)):
            num_nodes = torch.tensor(num_nodes, dtype=torch.int64)
        if not isinstance(num_nodes, torch.Tensor) or num_nodes.is_floating_point() or num_nodes.dtype == torch.bool:
            raise ValueError("num_nodes must be None or a (batch,) integer tensor")
        num_nodes_t, _ = _per_row(num_nodes, "num_nodes", batch, device, torch.int64, nodes)
    args = TreeArgs(target_logits, draft_logits, draft_tokens, parents.long(), temperature_t, top_k_t, top_p_t, num_nodes_t,
                    siblings, generator, check, seeds, offsets)
    if check:
        if temperature_is_tensor:
            _raise_first("temperature", ~(temperature_t >= 0) | torch.isinf(temperature_t), temperature_t, "must be finite and >= 0 (0 = greedy)")
        if top_k_is_tensor:
            _raise_first("top_k", top_k_t < 0, top_k_t, "must be >= 0 (0 = off)")
        if top_p_is_tensor:
            _raise_first("top_p", ~((top_p_t > 0) & (top_p_t <= 1)), top_p_t, "must lie in (0, 1]")
        _raise_first("num_nodes", (num_nodes_t < 0) | (num_nodes_t > nodes), num_nodes_t, f"must lie in [0, N={nodes}]")
        if seeds is not None:
            _raise_first("seeds", seeds < 0, seeds, "must be >= 0")
        if offsets is not None:
            _raise_first("offsets", offsets < 0, offsets, "must be >= 0")
        raise_for_bad_tree(args)
    return args


def _raise_first(name: str, bad: torch.Tensor, values: torch.Tensor, what: str) -> None:
    row = _first_bad_row(bad)
    if row is not None:
        raise ValueError(f"{name} {what}; row {row} has {values[row].item()}")


def bad_parents(args: TreeArgs) -> torch.Tensor:
    """(B, N) bool: used nodes whose parent is neither -1 nor a node index below their own.

    Parents below their child make every tree acyclic and give a topological order for free.
    """
    node = torch.arange(args.num_tree_nodes, device=args.parents.device)
    used = node[None, :] < args.num_nodes[:, None]
    return used & ((args.parents < -1) | (args.parents >= node[None, :]))


def raise_for_bad_tree(args: TreeArgs) -> None:
    """ValueError naming ``parents`` or ``draft_tokens`` with the first bad row and node."""
    bad = bad_parents(args)
    row = _first_bad_row(bad.any(1))
    if row is not None:
        node = int(bad[row].nonzero()[0, 0])
        parent = int(args.parents[row, node])
        raise ValueError(f"parents: row {row} node {node} has parent {parent}; a parent must be -1 (the root) or a node index "
                         f"below its child's (which also rules out cycles), in [-1, {node})")
    node = torch.arange(args.num_tree_nodes, device=args.parents.device)
    used = node[None, :] < args.num_nodes[:, None]
    tokens = args.draft_tokens
    out_of_range = used & ((tokens < 0) | (tokens >= args.draft_vocab))
    row = _first_bad_row(out_of_range.any(1))
    if row is not None:
        raise ValueError(f"draft_tokens: row {row} holds an id outside [0, {args.draft_vocab})")
