"""Exact verification of draft trees: :func:`verify_tree`.

A tree generalises the chain of :func:`specdec_ext.verify`: every context may have several drafted
children, drawn i.i.d. from the draft's distribution there, without replacement, or deterministically
(the top-k trees of EAGLE / Medusa-style drafters). Verification walks from the root by recursive
rejection sampling, so the emitted tokens follow the target's processed law exactly. The algorithm
and its random stream are specified in :mod:`specdec_ext.reference_tree`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _tree_params
from ._params import VerifyArgs, _first_bad_row, raise_for_bad_rows
from ._philox import draw_keys
from .reference_tree import tree_layout, tree_row_problems, verify_block_eager, verify_tree_eager

VERIFY_METHODS = ("token", "block")


class TreeResult(NamedTuple):
    """Outcome of :func:`verify_tree`.

    tokens: (B, D+1) int64, D the deepest node of the batch's trees. Row b holds the tokens of the
        ``num_accepted[b]`` nodes it entered (root to leaf), then the corrected or bonus token, then -1.
    num_accepted: (B,) int64; every row emits ``num_accepted + 1`` tokens.
    accepted_nodes: (B, D) int64, the node index entered at each depth (-1 beyond): the KV-cache
        entries to keep.
    """

    tokens: torch.Tensor
    num_accepted: torch.Tensor
    accepted_nodes: torch.Tensor


def verify_tree(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    parents: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    num_nodes: torch.Tensor | None = None,
    siblings: str = "iid",
    generator: torch.Generator | None = None,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    backend: str = "auto",
    check: bool = True,
) -> TreeResult:
    """Verify a tree of draft tokens per row from raw logits; the output follows the target's law exactly.

    Args:
        target_logits: (B, N+1, V) raw target logits. Context 0 is the current sequence, context i+1
            is node i (the sequence followed by the path from the root to node i).
        draft_logits: (B, N+1, Vd), Vd <= V, the draft's raw logits at the same contexts (the children
            of a context were drawn from the processed law of its line), or None for deterministic
            siblings (each child's proposal is a point mass; a rejected child is removed from the residual).
        draft_tokens: (B, N) int32 / int64 node tokens in [0, Vd).
        parents: (B, N) int32 / int64: node i's parent node, or -1 for a child of the root; a parent's
            index is below its child's (so trees are acyclic and listed parents first). Siblings are
            tried in node order.
        temperature, top_k, top_p: as for :func:`specdec_ext.verify`, applied to both models' lines.
        num_nodes: optional (B,) ints in [0, N]: row b uses nodes 0 .. n_b - 1 (ragged trees).
        siblings: "iid" (children drawn independently from q) or "without_replacement" (each child
            drawn from q without the earlier siblings). Ignored for deterministic siblings.
        generator: draws one Philox base key per call (row b uses base_key + b) unless ``seeds`` is given.
        seeds: optional (B,) int64 per-row Philox keys (>= 0) on the logits' device.
        offsets: optional (B,) int64 absolute position of each row's context 0 (default 0): coins and
            draws at depth d use position offset + d, so a caller that advances offsets by the tokens
            emitted never reuses randomness that decided a token.
        backend: "auto" | "triton" | "cpp" | "eager".
        check: True raises ValueError for a bad tree (a parent out of range or not below its child),
            ids out of range, bad parameters and NaN / +inf / empty lines at any context a row could
            use. False raises nothing and blanks such a row (tokens -1, num_accepted 0); bad values in
            lines the walk does not read do not blank it.

    Returns:
        TreeResult(tokens (B, D+1), num_accepted (B,), accepted_nodes (B, D)).

    Example:
        >>> import torch, specdec_ext
        >>> target = torch.randn(1, 4, 10)  # root + 3 nodes, V = 10
        >>> draft = torch.randn(1, 4, 10)
        >>> tokens = torch.tensor([[3, 7, 1]])  # two children of the root, one grandchild under node 0
        >>> parents = torch.tensor([[-1, -1, 0]])
        >>> out = specdec_ext.verify_tree(target, draft, tokens, parents, backend="eager")
        >>> out.tokens.shape, out.accepted_nodes.shape
        (torch.Size([1, 3]), torch.Size([1, 2]))
    """
    args = _tree_params.validate_tree(
        target_logits, draft_logits, draft_tokens, parents, temperature=temperature, top_k=top_k, top_p=top_p, num_nodes=num_nodes,
        siblings=siblings, generator=generator, seeds=seeds, offsets=offsets, backend=backend, check=check,
    )
    chosen = resolve_tree_backend(backend, target_logits.device)
    seeds, base_key = draw_keys(args.seeds, args.generator, args.batch, target_logits.device)
    args = args._replace(seeds=seeds)
    if chosen == "eager":
        tokens, num_accepted, accepted_nodes = verify_tree_eager(args, base_key)
    else:
        tokens, num_accepted, accepted_nodes = _fused_tree(chosen, args, base_key)
    if check and tokens.shape[0] and bool((tokens[:, 0] < 0).any()):
        _raise_for_bad_lines(args, tokens[:, 0] < 0)
    return TreeResult(tokens, num_accepted, accepted_nodes)


def verify_block(args: VerifyArgs, method: str, backend: str):
    """``verify(..., method="block")`` of a validated call: a :class:`~specdec_ext.api.VerifyResult`."""
    from .api import VerifyResult, _draw_keys

    if method not in VERIFY_METHODS:
        raise ValueError(f"method must be one of {VERIFY_METHODS}, got {method!r}")
    if args.accept_probs:
        raise ValueError("return_accept_probs is defined for token-wise verification only (method='token'): block verification "
                         "decides on the whole block, not on per-draft ratios")
    chosen = resolve_tree_backend(backend, args.target_logits.device)
    args, base_key = _draw_keys(args)
    if chosen == "eager":
        tokens, num_accepted, logprobs = verify_block_eager(args, base_key)
    else:
        tokens, num_accepted, logprobs = _fused_block(chosen, args, base_key)
    if args.check and tokens.shape[0] and bool((tokens[:, 0] < 0).any()):
        raise_for_bad_rows(args, tokens[:, 0] < 0)
    return VerifyResult(tokens, num_accepted, logprobs, None)


def resolve_tree_backend(backend: str, device: torch.device) -> str:
    """The backend a tree or block call runs on: "auto" takes the fused kernel of the device where one
    is built (Triton on CUDA, C++ on CPU), else the eager reference."""
    from ._params import BACKENDS

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    device = torch.device(device)
    if backend == "auto":
        preferred = "triton" if device.type == "cuda" else "cpp"
        return preferred if _fused_available(preferred, device) else "eager"
    if backend == "eager" or _fused_available(backend, device):
        return backend
    raise ValueError(f"backend={backend!r} has no tree / block verification kernel on {device} in this build; "
                     f"available: {available_tree_backends(device)}")


def _fused_available(backend: str, device: torch.device) -> bool:
    if backend == "cpp":
        from . import _cpp_tree

        return device.type == "cpu" and _cpp_tree.is_available()
    if backend == "triton":
        from . import _triton_tree

        return _triton_tree.usable(device)
    return False


def available_tree_backends(device: torch.device | str = "cpu", fast_only: bool = False) -> list[str]:
    """Backends with tree and block verification on ``device`` (``fast_only`` leaves out the Triton
    interpreter on CPU, which is for small identity tests)."""
    device = torch.device(device)
    found = [b for b in ("triton", "cpp") if _fused_available(b, device)]
    if fast_only and device.type == "cpu":
        found = [b for b in found if b != "triton"]
    return found + ["eager"]


def _fused_tree(backend: str, args, base_key: int):
    if backend == "cpp":
        from . import _cpp_tree

        return _cpp_tree.verify_tree(args, base_key)
    if backend == "triton":
        from . import _triton_tree

        return _triton_tree.verify_tree(args, base_key)
    raise ValueError(f"backend {backend!r} has no tree verification kernel")


def _fused_block(backend: str, args, base_key: int):
    if backend == "cpp":
        from . import _cpp_tree

        return _cpp_tree.verify_block(args, base_key)
    if backend == "triton":
        from . import _triton_tree

        return _triton_tree.verify_block(args, base_key)
    raise ValueError(f"backend {backend!r} has no block verification kernel")


def _raise_for_bad_lines(args, blanked: torch.Tensor) -> None:
    layout = tree_layout(args)
    for name, bad, what in tree_row_problems(args, layout, None):
        row = _first_bad_row(bad)
        if row is not None:
            raise ValueError(f"{name}: row {row} {what}")
    row = _first_bad_row(blanked)
    raise ValueError(f"target_logits: row {row} could not be verified (non-finite values after temperature and filtering)")
