"""Public entry points: :func:`verify`, :func:`sample` and :func:`available_backends`."""

from __future__ import annotations

import os
import warnings
from typing import NamedTuple

import torch

from . import _cpp_backend, _params
from ._philox import SAMPLE_STREAM, draw_keys
from .reference import verify_eager


class VerifyResult(NamedTuple):
    """Outcome of :func:`verify`.

    tokens: (B, K+1) int64. Row b holds its ``num_accepted[b]`` accepted drafts, then the corrected
        (after a rejection) or bonus token, then -1 padding.
    num_accepted: (B,) int64, the number of accepted drafts; every row emits ``num_accepted + 1`` tokens.
    logprobs: (B, K+1) float32 log-probability of each emitted token (NaN where tokens is -1), with
        ``return_logprobs``; else None.
    accept_probs: (B, K) float32 ``min(1, p(x_k) / q(x_k))`` of each draft the verification examined
        (positions up to the first rejection, below num_draft_tokens; NaN elsewhere), with
        ``return_accept_probs``; else None.
    """

    tokens: torch.Tensor
    num_accepted: torch.Tensor
    logprobs: torch.Tensor | None = None
    accept_probs: torch.Tensor | None = None


def _triton_usable(device: torch.device) -> bool:
    from . import _triton_backend

    if not _triton_backend.is_available():
        return False
    return device.type == "cuda" or (device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")


def _cpp_usable(device: torch.device) -> bool:
    return device.type == "cpu" and _cpp_backend.is_available()


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """Backends that can run on ``device``, fastest first.

    ``"triton"`` needs CUDA (or, on CPU, ``TRITON_INTERPRET=1``: slow, for tests); ``"cpp"`` needs
    the compiled extension (CPU); ``"eager"`` runs everywhere.
    """
    device = torch.device(device)
    found = []
    if device.type == "cuda" and _triton_usable(device):
        found.append("triton")
    if _cpp_usable(device):
        found.append("cpp")
    if device.type == "cpu" and _triton_usable(device):
        found.append("triton")
    found.append("eager")
    return found


_warned_fallback = False


def _resolve_backend(backend: str, device: torch.device) -> str:
    global _warned_fallback
    if backend in ("auto", "cpp") and device.type == "cpu" and _cpp_backend.is_available():
        return "cpp"  # the common CPU call, first
    if backend not in _params.BACKENDS:
        raise ValueError(f"backend must be one of {_params.BACKENDS}, got {backend!r}")
    if backend == "auto":
        if device.type == "cuda" and _triton_usable(device):
            return "triton"
        if _cpp_usable(device):
            return "cpp"
        # (Not while torch.compile traces: a warning there breaks the graph; eager calls still warn.)
        if device.type == "cpu" and not _warned_fallback and not torch.compiler.is_compiling():
            _warned_fallback = True
            warnings.warn(f"specdec_ext: the C++ CPU kernel is unavailable ({_cpp_backend.unavailable_reason()}); using the slower eager backend", RuntimeWarning, stacklevel=3)
        return "eager"
    if backend == "triton" and not _triton_usable(device):
        raise ValueError(f"backend='triton' is not available on {device} (CUDA tensors, or TRITON_INTERPRET=1 on CPU, and an installed triton are needed); available: {available_backends(device)}")
    if backend == "cpp" and not _cpp_usable(device):
        raise ValueError(f"backend='cpp' is not available on {device}; available: {available_backends(device)}")
    return backend


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
            tensors where the extension is built, else eager.
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
        VerifyResult(tokens (B, K+1) int64 padded with -1, num_accepted (B,) int64, logprobs
        (B, K+1) float32 or None, accept_probs (B, K) float32 or None).

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
    args = _params.validate_verify(
        target_logits, draft_logits, draft_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        num_draft_tokens=num_draft_tokens, generator=generator, check=check, seeds=seeds, offsets=offsets,
        return_logprobs=return_logprobs, return_accept_probs=return_accept_probs,
    )
    if method != "token":
        from .tree import verify_block

        return verify_block(args, method, backend)
    return _run(args, backend)


def _draw_keys(args: _params.VerifyArgs) -> tuple[_params.VerifyArgs, int]:
    """The per-call randomness: (args with per-row ``seeds`` set where they must live on the device, base_key)."""
    if args.seeds is not None:
        return args, 0
    seeds, base_key = draw_keys(None, args.generator, args.batch, args.target_logits.device)
    return (args if seeds is None else args._replace(seeds=seeds)), base_key


def _run(args: _params.VerifyArgs, backend: str) -> VerifyResult:
    chosen = _resolve_backend(backend, args.target_logits.device)
    args, base_key = _draw_keys(args)
    if torch.compiler.is_compiling():
        # Under torch.compile one registered op (fake kernel for tracing; C++ / eager on CPU, Triton
        # on CUDA) keeps the graph whole; eager calls skip the dispatcher (see specdec_ext/ops.py).
        from . import ops

        tokens, num_accepted, logprobs, accept_probs = ops.verify(args, base_key)
    elif chosen == "triton":
        from . import _triton_backend

        tokens, num_accepted, logprobs, accept_probs = _triton_backend.verify(args, base_key)
    elif chosen == "cpp":
        tokens, num_accepted, logprobs, accept_probs = _cpp_backend.verify(args, base_key)
    else:
        tokens, num_accepted, logprobs, accept_probs = verify_eager(args, base_key)
    if args.check and tokens.shape[0]:
        compiling = torch.compiler.is_compiling()
        if compiling and tokens.is_cpu:
            # Reading the result would break the graph: the check becomes an assertion inside it.
            torch._assert_async(
                (tokens[:, 0] >= 0).all(),
                "specdec_ext: check=True found a row it could not verify (NaN / +inf or empty logits, a temperature so small that "
                f"the scaled logits are not finite, an out-of-range draft id, a negative seed or offset); {_params.COMPILED_CHECK_HINT}",
            )
        else:
            # Every valid row emits at least one token: a blanked row means bad values (one host sync;
            # on CPU, through NumPy, which reads the column for a fraction of torch's dispatch cost;
            # a list is cheaper still than a reduction for a small batch).
            if tokens.is_cpu:
                first = tokens.numpy()[:, 0]
                any_blanked = (min(first.tolist()) if first.shape[0] <= 32 else first.min()) < 0
            else:
                any_blanked = bool((tokens[:, 0] < 0).any())
            if any_blanked:
                _params.raise_for_bad_rows(args, tokens[:, 0] < 0)
    return VerifyResult(tokens, num_accepted, logprobs, accept_probs)


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
    every backend. Returns (B,) int64 (-1 for an invalid row when ``check=False``).

    Example:
        >>> import torch, specdec_ext
        >>> logits = torch.tensor([[0.0, 1.0, 2.0], [5.0, 0.0, 0.0]])
        >>> specdec_ext.sample(logits, temperature=0.0, backend="eager").tolist()
        [2, 0]
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a 2-D (batch, vocab) tensor, got {shape}")
    try:
        args = _sample_args(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator, check=check, seeds=seeds, offsets=offsets)
        result = _run(args, backend)
    except ValueError as error:  # name the caller's argument, not verify's
        raise ValueError(str(error).replace("target_logits", "logits")) from None
    return result.tokens[:, 0]


def _sample_args(logits: torch.Tensor, *, temperature, top_k, top_p, generator, check, seeds=None, offsets=None) -> _params.VerifyArgs:
    """sample()'s validated call: verify's arguments for (B, V) logits with K = 0 on the sample stream."""
    no_drafts = torch.empty((logits.shape[0], 0), dtype=torch.int64, device=logits.device)
    return _params.validate_verify(
        logits[:, None, :], None, no_drafts, temperature=temperature, top_k=top_k, top_p=top_p, num_draft_tokens=None,
        generator=generator, check=check, seeds=seeds, offsets=offsets, stream=SAMPLE_STREAM,
    )
