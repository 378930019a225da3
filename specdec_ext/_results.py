"""What the entry points return: :class:`VerifyResult` and :class:`TreeResult`."""

from __future__ import annotations

from typing import NamedTuple

import torch


class VerifyResult(NamedTuple):
    """The result of :func:`specdec_ext.verify` and of a :class:`specdec_ext.Verifier` call.

    Attributes:
        tokens (torch.Tensor): the emitted tokens, ``int64`` of shape ``(batch_size, K + 1)``, K the
            number of draft positions. Row b holds its ``num_accepted[b]`` accepted drafts, then one
            token drawn by the verification: the corrected token (from the residual ``max(p - q, 0)``)
            after a rejection, or the bonus token (from ``p`` at position ``n_b``) when every draft
            the row verified was accepted. Every position after that holds **-1** (padding). A row
            with ``check=False`` and a bad value (see ``verify``'s ``check``) is -1 throughout.
        num_accepted (torch.Tensor): ``int64`` of shape ``(batch_size,)``, the accepted drafts of each
            row; a valid row emits ``num_accepted + 1`` tokens (a blanked row emits none and holds 0).
        logprobs (torch.Tensor | None): ``float32`` of shape ``(batch_size, K + 1)``, the log-probability
            of each emitted token ("processed": under the distribution it was drawn from; "raw":
            under the log-softmax of the raw target logits), NaN where ``tokens`` is -1; None unless
            ``return_logprobs`` was asked for.
        accept_probs (torch.Tensor | None): ``float32`` of shape ``(batch_size, K)``,
            ``min(1, p(x_k) / q(x_k))`` of every draft the verification examined (positions up to the
            first rejection, below ``n_b``), NaN elsewhere; None unless ``return_accept_probs``
            (token-wise verification only).

    Randomness: row b is keyed by ``seeds[b]`` when ``seeds`` is given, else by ``base + b`` with one
    62-bit ``base`` drawn per call from ``generator`` (torch's default CPU generator when None).
    Position k of row b uses the Philox4x32-10 counters of the absolute position ``offsets[b] + k``
    (offset 0 by default). The same keys and offsets give the same tokens on every backend, and a
    seeded row's tokens never depend on the other rows of the batch.

    Example:
        >>> import torch, specdec_ext
        >>> target = torch.tensor([[[0.0, 9.0, 0.0], [0.0, 0.0, 9.0], [9.0, 0.0, 0.0]]])  # B=1, K=2, V=3
        >>> drafts = torch.tensor([[1, 0]])  # the target's argmax at position 0, then a token that is not its argmax
        >>> out = specdec_ext.verify(target, None, drafts, temperature=0.0)  # greedy: accept while draft == argmax
        >>> out.tokens.tolist(), out.num_accepted.tolist()  # draft 1 kept, draft 0 replaced by the argmax 2, -1 padding
        ([[1, 2, -1]], [1])
    """

    tokens: torch.Tensor
    num_accepted: torch.Tensor
    logprobs: torch.Tensor | None = None
    accept_probs: torch.Tensor | None = None


class TreeResult(NamedTuple):
    """The result of :func:`specdec_ext.verify_tree`.

    Attributes:
        tokens (torch.Tensor): ``int64`` of shape ``(batch_size, N + 1)``, N the number of nodes
            (``parents.shape[1]``): room for the longest path any tree of N nodes has, so the shape
            follows from the call's shapes alone, on every backend (a device call never waits to
            learn how deep its rows went). Row b holds the tokens of the ``num_accepted[b]`` nodes it
            entered, root to leaf, then the corrected or bonus token drawn at the context where the
            walk stopped, then **-1** padding. A blanked row (``check=False`` and a bad value or a bad
            tree) is -1 throughout.
        num_accepted (torch.Tensor): ``int64`` of shape ``(batch_size,)``, the depth each row reached;
            a valid row emits ``num_accepted + 1`` tokens (a blanked row emits none and holds 0).
        accepted_nodes (torch.Tensor): ``int64`` of shape ``(batch_size, N)``, the node index entered at
            each depth (-1 beyond ``num_accepted``): the KV-cache entries a caller keeps.

    Randomness: as for :class:`VerifyResult`, per row (``seeds[b]``, else ``base + b`` from one draw of
    ``generator`` per call); coins and draws at depth d use the absolute position ``offsets[b] + d``,
    and the coin of the sibling of rank r its own counter, so a chain (each node the child of the
    one before) verifies exactly as :func:`specdec_ext.verify` does with the same keys.

    Example:
        >>> import torch, specdec_ext
        >>> # contexts: the root, then nodes 0, 1, 2 (V = 3); greedy rows follow the argmax of each context
        >>> target = torch.tensor([[[0.0, 9.0, 0.0], [0.0, 0.0, 9.0], [0.0, 0.0, 9.0], [9.0, 0.0, 0.0]]])
        >>> tokens = torch.tensor([[0, 1, 2]])  # two children of the root (tokens 0 and 1), node 2 (token 2) under node 1
        >>> parents = torch.tensor([[-1, -1, 1]])
        >>> out = specdec_ext.verify_tree(target, None, tokens, parents, temperature=0.0)
        >>> out.tokens.tolist(), out.num_accepted.tolist(), out.accepted_nodes.tolist()  # nodes 1 and 2, then the argmax at node 2
        ([[1, 2, 0, -1]], [2], [[1, 2, -1]])
    """

    tokens: torch.Tensor
    num_accepted: torch.Tensor
    accepted_nodes: torch.Tensor
