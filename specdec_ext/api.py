"""The public entry points: :func:`verify` (token-wise and block), :func:`sample`, :func:`verify_tree`
and :func:`available_backends`.

Every call is validated by :mod:`specdec_ext._params`, runs on the backend the one rule of
:mod:`specdec_ext._dispatch` picks, and takes its keys from :func:`specdec_ext._philox.draw_keys`.
A chain call whose parameters are Python numbers keeps its validated plan (a
:class:`~specdec_ext.prepared.ChainPlan`) per call signature, so a repeated call, e.g. in a decoding
loop, pays a dictionary lookup instead of its validation; :class:`specdec_ext.Verifier` and
:class:`specdec_ext.Sampler` hold such a plan explicitly.
"""

from __future__ import annotations

import torch

from . import _cpp_backend, _dispatch
from ._dispatch import raise_if_blanked, resolve
from ._params import (
    CHAIN,
    TreeArgs,
    VerifyArgs,
    building_a_graph,
    check_method,
    parameter_problems,
    raise_for_bad_parents,
    row_counts,
    validate_sample,
    validate_tree,
    validate_verify,
)
from ._philox import draw_keys
from ._results import TreeResult, VerifyResult
from .prepared import PLAN_LIMIT, PLANS, ChainPlan
from .reference_tree import tree_layout, tree_row_problems

_Tensor = torch.Tensor
_NUMBERS = (float, int, type(None))  # bool is no parameter value: such calls take the validating path, which refuses it
_INTEGERS = (int, type(None))
_new = tuple.__new__


def available_backends(device: torch.device | str = "cpu", entry: str = "verify", *, interpreted: bool = True) -> list[str]:
    """Backends that can run ``entry`` on ``device``, fastest first.

    ``entry``: "verify" (token-wise :func:`verify` and :func:`sample`), "verify_block"
    (``verify(..., method="block")``) or "verify_tree" (:func:`verify_tree`). ``"triton"`` needs CUDA
    (or, on CPU, ``TRITON_INTERPRET=1``: slow, for tests; ``interpreted=False`` leaves it out);
    ``"cpp"`` needs the compiled extension (CPU); ``"eager"`` runs everywhere.
    """
    if entry not in _dispatch.ENTRY_POINTS:
        raise ValueError(f"entry must be one of {_dispatch.ENTRY_POINTS}, got {entry!r}")
    return _dispatch.available(device, entry, interpreted)


_recent: tuple = (None, None)  # (key, plan) of the last plan looked up: a loop repeats its call signature


def _lookup(key: tuple) -> ChainPlan | None:
    """The plan of a call signature: the last one looked up when it is the same signature (one
    comparison, no hashing), else the one kept for it, else None."""
    global _recent
    recent = _recent
    if recent[0] == key:
        return recent[1]
    try:
        plan = PLANS.get(key)
    except TypeError:
        return None
    if plan is not None:
        _recent = (key, plan)
    return plan


def _hashable(key: tuple) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def _forget_recent() -> None:
    global _recent
    _recent = (None, None)


_dispatch.FORGET.append(_forget_recent)


def _remember(key, plan: ChainPlan, device: torch.device) -> None:
    """Keep the plan of a cacheable call once its backend is resolved (not one made while a graph
    is built: its tensors belong to the graph)."""
    if key is not None and not building_a_graph(device):
        plan.resolve()
        if len(PLANS) >= PLAN_LIMIT:
            PLANS.clear()
        PLANS[key] = plan


def verify(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    num_draft_tokens: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    return_logprobs: bool | str = False,
    return_accept_probs: bool = False,
    backend: str = "auto",
    check: bool = True,
    method: str = "token",
) -> VerifyResult:
    """Verify a block of K draft tokens per row by modified rejection sampling, from raw logits.

    The emitted tokens follow the target's processed distribution exactly (temperature, then top-k,
    then top-p, as transformers' warpers apply them), whatever the draft proposed, provided the drafts
    were drawn from the processed draft distribution with the same parameters.

    Args:
        target_logits: (B, K+1, V) float32 / bfloat16 / float16 raw target logits at the K draft
            positions and the bonus position. Never modified.
        draft_logits: (B, K, Vd), Vd <= V, raw draft logits the drafts were sampled from (target
            entries beyond Vd have q = 0), or None for deterministic drafts (q is one-hot).
        draft_tokens: (B, K) int32 / int64 draft ids in [0, Vd).
        temperature: float or (B,) tensor, >= 0; 0 makes the row greedy (accept while the draft
            equals the target's argmax, then emit the argmax; lowest index on ties).
        top_k: int or (B,) tensor; None / 0 = off. Keeps every token whose logit >= the k-th largest.
        top_p: float or (B,) tensor in (0, 1]; None / 1 = off. Keeps the smallest most-probable set
            whose mass reaches top_p (ties at the cut kept together; at least one token).
        num_draft_tokens: optional (B,) ints in [0, K]: row b verifies its first n_b drafts only and
            draws its bonus token at position n_b (ragged batches).
        generator: torch.Generator, or None for torch's default CPU generator. Unless ``seeds`` is
            given, one 62-bit key base is drawn from it per call and row b is keyed by base + b.
            All randomness comes from Philox4x32-10 (see ``seeds``), identical on every backend.
        seeds: optional (B,) int64 tensor (>= 0) on the logits' device: per-request Philox keys.
            A seeded row's tokens depend only on its own logits, seed and offset, never on the
            other rows of the batch, its position in it or the batch size.
        offsets: optional (B,) int64 tensor (>= 0) on the logits' device: the absolute position of
            each row's draft position 0, e.g. the number of tokens the request has generated so
            far. Counters use ``offset + k``; advancing the offset by the tokens a row emitted
            never reuses a random number that decided a token. Default 0.
        return_logprobs: False, "processed" (log p of each emitted token under the processed
            target distribution, what it was drawn from) or "raw" (under the log-softmax of the raw
            target logits). Greedy rows report the raw log-softmax either way.
        return_accept_probs: also return ``min(1, p/q)`` of every examined draft (the expected
            acceptance: a lower-variance estimate than counts, e.g. for adaptive draft lengths).
        backend: "auto" | "triton" | "cpp" | "eager". auto: triton for CUDA tensors, cpp for CPU
            tensors, where built for the method, else eager (with one RuntimeWarning saying why).
        check: validate values (NaN / +inf logits, empty rows, out-of-range ids, parameter ranges)
            in every line up to each row's n_b and raise ValueError naming the argument and the
            first bad row. ``check=False`` raises nothing and makes no host sync (CUDA-graph
            capturable): a row with a bad value in a line its verification reads (target and draft
            lines up to its first rejection; greedy rows read no draft line), an out-of-range draft
            id or a bad parameter gets num_accepted 0 and tokens all -1, never an out-of-range id.
            Lines after the first rejection cannot change the tokens and are not read at all.
        method: "token" (token-wise verification, above) or "block": block verification (Sun et al.,
            ICLR 2025) judges the drafts jointly, accepts at least as many in expectation and is just
            as exact (see :mod:`specdec_ext.reference_tree`; greedy rows verify token by token).

    Returns:
        :class:`VerifyResult` (tokens (B, K+1) int64 padded with -1, num_accepted (B,) int64, logprobs
        (B, K+1) float32 or None, accept_probs (B, K) float32 or None).

    A loop that calls this with the same shapes and parameters every step can build a
    :class:`specdec_ext.Verifier` once instead (the same tokens for the same keys, less host time).

    Example:
        >>> import torch, specdec_ext
        >>> g = torch.Generator().manual_seed(0)
        >>> target = torch.randn(2, 4, 100, generator=g)  # B=2, K=3, V=100
        >>> draft = torch.randn(2, 3, 100, generator=g)
        >>> drafts = torch.multinomial(draft.softmax(-1).reshape(6, 100), 1, generator=g).reshape(2, 3)
        >>> out = specdec_ext.verify(target, draft, drafts, generator=g, backend="eager")
        >>> out.tokens.shape, out.num_accepted.shape
        (torch.Size([2, 4]), torch.Size([2]))

        Per-request keys and offsets (a serving loop):

        >>> seeds = torch.tensor([11, 12])             # one seed per request
        >>> offsets = torch.tensor([0, 40])            # tokens each request has generated so far
        >>> out = specdec_ext.verify(target, draft, drafts, seeds=seeds, offsets=offsets,
        ...                          return_logprobs="processed", return_accept_probs=True, backend="eager")
        >>> out.logprobs.shape, out.accept_probs.shape
        (torch.Size([2, 4]), torch.Size([2, 3]))
    """
    key = None
    if (type(target_logits) is _Tensor and type(draft_tokens) is _Tensor and (draft_logits is None or type(draft_logits) is _Tensor)
            and type(temperature) in _NUMBERS and type(top_k) in _INTEGERS and type(top_p) in _NUMBERS and type(return_accept_probs) is bool
            and not torch.compiler.is_compiling()):
        # The call signature: everything the validation of a call with number parameters looked at
        # (and the C++ extension the backend was resolved with: tests hide it).
        key = ("verify", _cpp_backend._C, target_logits.shape, target_logits.dtype, target_logits.device,
               None if draft_logits is None else (draft_logits.shape, draft_logits.dtype, draft_logits.device),
               draft_tokens.shape, draft_tokens.dtype, draft_tokens.device, temperature, top_k, top_p, return_logprobs, return_accept_probs, backend,
               check, method)
        plan = _lookup(key)
        if plan is None and not _hashable(key):
            key = None  # an unhashable argument: the validation names it
        if plan is not None:
            fast = plan.fast
            if fast is not None and num_draft_tokens is None:  # one trip through the backend's runner (None: a call it does not take)
                out = fast(target_logits, draft_logits, draft_tokens, seeds, offsets, generator)
                if out is not None:
                    if len(out) == 4:
                        return _new(VerifyResult, out)
                    plan.raise_blanked(out[0], target_logits, draft_logits, draft_tokens, generator, seeds, offsets)
            if num_draft_tokens is not None:
                num_draft_tokens = row_counts(num_draft_tokens, "num_draft_tokens", plan.batch, plan.num_positions, plan.device, plan.check, CHAIN)
            if seeds is not None or offsets is not None or generator is not None:
                plan.check_keys(generator, seeds, offsets)
            return _new(VerifyResult, plan.eager(target_logits, draft_logits, draft_tokens, num_draft_tokens, generator, seeds, offsets))
    args = validate_verify(
        target_logits, draft_logits, draft_tokens, temperature=temperature, top_k=top_k, top_p=top_p, num_draft_tokens=num_draft_tokens,
        generator=generator, check=check, seeds=seeds, offsets=offsets, return_logprobs=return_logprobs, return_accept_probs=return_accept_probs,
    )
    check_method(method, return_accept_probs)
    plan = ChainPlan.of(args, backend, method)
    _remember(key, plan, args.target_logits.device)
    out = plan(args.target_logits, args.draft_logits, args.draft_tokens, args.num_draft_tokens, args.generator, args.seeds, args.offsets)
    return VerifyResult(*out)


def sample(
    logits: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    backend: str = "auto",
    check: bool = True,
) -> torch.Tensor:
    """Draw one token per row from (B, V) raw logits with the same processing as :func:`verify`.

    Temperature 0 gives the argmax. It is the bonus draw of ``verify`` with K = 0, raced on its own
    Philox stream: drafts drawn with ``sample`` and verified with ``verify`` under the same
    ``seeds`` and ``offsets`` never share a random number. ``seeds`` / ``offsets`` are as in
    :func:`verify` (row b draws at position ``offsets[b]``). The same keys give the same tokens on
    every backend. Returns (B,) int64 (-1 for an invalid row when ``check=False``). A loop can
    build a :class:`specdec_ext.Sampler` once instead.

    Example:
        >>> import torch, specdec_ext
        >>> logits = torch.tensor([[0.0, 1.0, 2.0], [5.0, 0.0, 0.0]])
        >>> specdec_ext.sample(logits, temperature=0.0, backend="eager").tolist()
        [2, 0]
    """
    key = None
    if (type(logits) is _Tensor and type(temperature) in _NUMBERS and type(top_k) in _INTEGERS and type(top_p) in _NUMBERS
            and not torch.compiler.is_compiling()):
        key = ("sample", _cpp_backend._C, logits.shape, logits.dtype, logits.device, temperature, top_k, top_p, backend, check)
        plan = _lookup(key)
        if plan is None and not _hashable(key):
            key = None
        if plan is not None:
            fast = plan.fast
            if fast is not None:
                tokens = fast(logits, None, None, seeds, offsets, generator)
                if tokens is not None:
                    if type(tokens) is _Tensor:
                        return tokens
                    plan.raise_blanked_sample(tokens[0], logits, generator, seeds, offsets)
            if seeds is not None or offsets is not None or generator is not None:
                plan.check_keys(generator, seeds, offsets)
            return plan.sample(logits, generator, seeds, offsets)
    args = _sample_args(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator, check=check, seeds=seeds, offsets=offsets)
    plan = ChainPlan.of(args, backend, "token", logits_name="logits")
    _remember(key, plan, args.target_logits.device)
    return plan.sample(logits, args.generator, args.seeds, args.offsets)


def _sample_args(logits: torch.Tensor, *, temperature, top_k, top_p, generator, check, seeds=None, offsets=None) -> VerifyArgs:
    """sample()'s validated call (:func:`specdec_ext._params.validate_sample`). generate.py's direct
    draft draw still reads its per-row parameters from here; a :class:`specdec_ext.Sampler` replaces both."""
    return validate_sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator, check=check, seeds=seeds, offsets=offsets)


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

    A tree generalises the chain of :func:`verify`: every context may have several drafted children,
    drawn i.i.d. from the draft's distribution there, without replacement, or deterministically (the
    top-k trees of EAGLE / Medusa-style drafters). Verification walks from the root by recursive
    rejection sampling (specified with its random stream in :mod:`specdec_ext.reference_tree`).

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
        temperature, top_k, top_p: as for :func:`verify`, applied to both models' lines.
        num_nodes: optional (B,) ints in [0, N]: row b uses nodes 0 .. n_b - 1 (ragged trees).
        siblings: "iid" (children drawn independently from q) or "without_replacement" (each child
            drawn from q without the earlier siblings). Ignored for deterministic siblings.
        generator: draws one Philox base key per call (row b uses base_key + b) unless ``seeds`` is given.
        seeds: optional (B,) int64 per-row Philox keys (>= 0) on the logits' device.
        offsets: optional (B,) int64 absolute position of each row's context 0 (default 0): coins and
            draws at depth d use position offset + d, so a caller that advances offsets by the tokens
            emitted never reuses randomness that decided a token.
        backend: "auto" | "triton" | "cpp" | "eager", chosen by the same rule as :func:`verify`'s.
        check: True raises ValueError for a bad tree (a parent out of range or not below its child),
            ids out of range, bad parameters, negative seeds or offsets and NaN / +inf / empty lines at
            any context a row could use. False raises nothing and blanks such a row (tokens -1,
            num_accepted 0); bad values in lines the walk does not read do not blank it.

    Returns:
        :class:`TreeResult` (tokens (B, N+1), num_accepted (B,), accepted_nodes (B, N); -1 beyond each
        row's path: the widths follow from the shapes, never from the rows' walks).

    Example:
        >>> import torch, specdec_ext
        >>> target = torch.randn(1, 4, 10)  # root + 3 nodes, V = 10
        >>> draft = torch.randn(1, 4, 10)
        >>> tokens = torch.tensor([[3, 7, 1]])  # two children of the root, one grandchild under node 0
        >>> parents = torch.tensor([[-1, -1, 0]])
        >>> out = specdec_ext.verify_tree(target, draft, tokens, parents, backend="eager")
        >>> out.tokens.shape, out.accepted_nodes.shape  # N + 1 and N wide, whatever depth the walk reached
        (torch.Size([1, 4]), torch.Size([1, 3]))
    """
    args = validate_tree(
        target_logits, draft_logits, draft_tokens, parents, temperature=temperature, top_k=top_k, top_p=top_p, num_nodes=num_nodes,
        siblings=siblings, generator=generator, seeds=seeds, offsets=offsets, check=check,
    )
    device = args.target_logits.device
    _, run = resolve(backend, device, "verify_tree")
    seeds, base_key = draw_keys(args.seeds, args.generator, args.batch, device)
    args = args._replace(seeds=seeds)
    tokens, num_accepted, accepted_nodes = run(args, base_key)
    if check:
        raise_if_blanked(tokens, _tree_problems, args)
    return TreeResult(tokens, num_accepted, accepted_nodes)


def _tree_problems(args: TreeArgs):
    """What a blanked tree row had wrong, in order: parameters and keys, the tree, then ids and lines."""
    yield from parameter_problems(args)
    raise_for_bad_parents(args)
    yield from tree_row_problems(args, tree_layout(args), None)


__all__ = ["TreeResult", "VerifyResult", "available_backends", "sample", "verify", "verify_tree"]
