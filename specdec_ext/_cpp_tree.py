"""The C++ CPU kernels of tree and block verification (csrc/tree.cpp), when they are built.

``specdec_ext._C_tree`` is a module of its own, built next to ``specdec_ext._C`` by setup.py; where
it is missing, :func:`specdec_ext.verify_tree` and ``verify(..., method="block")`` use the eager
reference on CPU.
"""

from __future__ import annotations

import torch  # libtorch must be loaded before the extension that links against it

from ._params import TreeArgs, VerifyArgs
from ._philox import key_per_row
from .reference_tree import tree_keys

_C_tree = None
try:
    from . import _C_tree  # type: ignore[attr-defined, no-redef]
except (ImportError, OSError):
    _C_tree = None


def is_available() -> bool:
    return _C_tree is not None


def verify_tree(args: TreeArgs, base_key: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens (B, D+1), num_accepted (B,), accepted_nodes (B, D)) of a validated tree call."""
    keys, offsets = tree_keys(args, base_key)
    return _C_tree.tree_verify(
        args.target_logits, args.draft_logits, args.draft_tokens, args.parents, args.temperature, args.top_k, args.top_p, args.num_nodes,
        keys, offsets, args.siblings == "without_replacement", args.check,
    )


def verify_block(args: VerifyArgs, base_key: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(tokens (B, K+1), num_accepted (B,), logprobs (B, K+1) or None) of a validated block call."""
    device = args.target_logits.device
    keys = key_per_row(args.seeds, base_key, args.batch, device)
    offsets = args.offsets if args.offsets is not None else torch.zeros(args.batch, dtype=torch.int64, device=device)
    tokens, num_accepted, logprobs = _C_tree.block_verify(
        args.target_logits, args.draft_logits, args.draft_tokens, args.temperature, args.top_k, args.top_p, args.num_draft_tokens, keys, offsets,
        args.check, args.logprobs,
    )
    return tokens, num_accepted, logprobs if args.logprobs else None
