"""The prepared path: :class:`Verifier` and :class:`Sampler`, bound once, called every step.

A decoding loop or an engine calls verification with the same batch shape, dtype, device and
sampling parameters step after step. A :class:`Verifier` (or :class:`Sampler`) validates those once,
resolves the backend once and keeps the per-row parameter tensors; its call takes only the logits,
the drafts and the keys, checks that they match what it was built for (a few attribute reads) and
runs the backend. The default calls :func:`specdec_ext.verify` and :func:`specdec_ext.sample` run
the same :class:`ChainPlan` (kept per call signature), so both give the same tokens for the same keys.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._dispatch import FORGET, READ_LIMIT, compiled_verify, has_prepare_hook, prepared, raise_if_blanked, resolve, runner, sampler
from ._params import (
    CHAIN,
    LOGIT_DTYPES,
    TOKEN_DTYPES,
    VerifyArgs,
    check_backend,
    check_generator,
    check_method,
    constant_rows,
    is_row_vector,
    logprobs_mode,
    no_drafts,
    parameter_problems,
    raise_for_bad_rows,
    row_counts,
    row_parameters,
    row_problems,
    row_vector,
    validate_sample,
    validate_verify,
)
from ._philox import SAMPLE_STREAM, VERIFY_STREAM, draw_keys, draw_keys_eager
from ._results import VerifyResult

_new = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (a third of the cost)
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling  # (the same function: torch.compile knows it)


class ChainPlan:
    """A chain call (``verify`` of either method, or ``sample``) bound to its batch size, K, device,
    per-row parameters, flags and backend. Calling it runs one validated call::

        plan(target_logits, draft_logits, draft_tokens, num_draft_tokens, generator, seeds, offsets)
            -> (tokens, num_accepted, logprobs | None, accept_probs | None)

    with the tensors already checked against the plan (shapes, dtypes, devices) and
    ``num_draft_tokens`` (B,) int64 or None. Keys come from :func:`~specdec_ext._philox.draw_keys`,
    the check after the kernel from :func:`~specdec_ext._dispatch.raise_if_blanked`.
    """

    def __init__(self, batch: int, num_positions: int, device: torch.device, rows: tuple, *, check: bool, stream: int, logprobs: int,
                 accept_probs: bool, backend: str, method: str, logits_name: str = "target_logits", spec: tuple | None = None):
        check_backend(backend)
        self.batch, self.num_positions, self.device = batch, num_positions, device
        self.temperature, self.top_k, self.top_p, self.filtered = rows
        self.num_draft = None  # (B,) K, made on the first call (not while torch.compile traces a plan made there)
        self.check, self.stream, self.logprobs, self.accept_probs = bool(check), stream, logprobs, accept_probs
        self.backend_asked, self.method, self.logits_name = backend, method, logits_name
        self.backend: str | None = None  # resolved on the first eager call (or by resolve())
        self._run: Callable | None = None  # the run of every call, for a backend without a prepare hook
        # Small CPU results are checked through a Python list (cheaper than a reduction).
        self._check_as_list = self.check and device.type == "cpu" and 0 < batch * (num_positions + 1) <= READ_LIMIT
        self.no_drafts: torch.Tensor | None = None  # (B, 0) draft tokens of a plan with K = 0 (sample), once resolved
        self._runs: dict[tuple[bool, bool], Callable] = {}  # (seeded, offset) -> run(args, base_key)
        self._rows = torch.Size((batch,))
        self._sample: Callable | None = None  # the backend's sample hook (K = 0 plans on the sample stream), once resolved
        # (vocab, dtype, draft vocab or None, draft dtype or None) of the calls, when fixed: a backend's
        # runner (see _dispatch.runner) then takes an eager call in one trip (``fast``, once resolved).
        self._spec = spec
        self.fast: Callable | None = None

    @classmethod
    def of(cls, args: VerifyArgs, backend: str, method: str, logits_name: str = "target_logits") -> ChainPlan:
        """The plan of a validated call (its parameters, flags and shapes)."""
        rows = (args.temperature, args.top_k, args.top_p, args.filtered)
        target, draft = args.target_logits, args.draft_logits
        spec = (target.shape[-1], target.dtype, None if draft is None else draft.shape[-1], None if draft is None else draft.dtype)
        return cls(args.batch, args.num_positions, target.device, rows, check=args.check, stream=args.stream, logprobs=args.logprobs,
                   accept_probs=args.accept_probs, backend=backend, method=method, logits_name=logits_name, spec=spec)

    def resolve(self) -> str:
        """The backend the plan runs on (see :func:`specdec_ext._dispatch.resolve`); raises if it cannot run."""
        if self.backend is None:
            self.backend, self._entry = resolve(self.backend_asked, self.device, "verify" if self.method == "token" else "verify_block")
            self.num_draft = constant_rows(self.num_positions, self.batch, torch.int64, self.device)
            self.no_drafts = no_drafts(self.batch, self.device) if self.num_positions == 0 else None
            if self.stream == SAMPLE_STREAM:
                self._sample = sampler(self.backend, self.temperature, self.top_k, self.top_p)
            if self.method == "token" and self._spec is not None:
                self.fast = runner(self.backend, self, self._spec)
        return self.backend

    def raise_blanked(self, tokens: torch.Tensor, target, draft, drafts, generator, seeds, offsets) -> None:
        """ValueError for a call whose ``tokens`` (B, K+1) a runner blanked with ``check`` (see ``fast``)."""
        args = _new(VerifyArgs, (target, draft, drafts, self.temperature, self.top_k, self.top_p, self.num_draft, generator, self.check, self.filtered,
                                 seeds, offsets, self.stream, self.logprobs, self.accept_probs))
        raise_for_bad_rows(self._problems(args), tokens[:, 0] < 0, self.logits_name)

    def raise_blanked_sample(self, tokens: torch.Tensor, logits, generator, seeds, offsets) -> None:
        """ValueError for a sample call whose (B,) ``tokens`` a runner blanked with ``check``."""
        raise_for_bad_rows(self._problems(self._sample_args(logits, generator, seeds, offsets)), tokens < 0, self.logits_name)

    def check_keys(self, generator, seeds, offsets) -> None:
        """The per-call arguments a plan does not fix: their types, shapes and devices (a (B,) int64
        tensor on the plan's device is taken at a glance; anything else gets the validator's message)."""
        if seeds is not None and not is_row_vector(seeds, self._rows, self.device):
            row_vector(seeds, "seeds", self.batch, self.device)
        if offsets is not None and not is_row_vector(offsets, self._rows, self.device):
            row_vector(offsets, "offsets", self.batch, self.device)
        if generator is not None:
            check_generator(generator)

    def __call__(self, target, draft, tokens, num_draft, generator, seeds, offsets) -> tuple:
        if _is_compiling():
            return self._compiled(target, draft, tokens, num_draft, generator, seeds, offsets)
        return self.eager(target, draft, tokens, num_draft, generator, seeds, offsets)

    def eager(self, target, draft, tokens, num_draft, generator, seeds, offsets) -> tuple:
        """The call outside torch.compile (for a caller that has checked that already)."""
        if self.backend is None:
            self.resolve()
        seeds, base_key = draw_keys_eager(seeds, generator, self.batch, self.device)
        args = _new(VerifyArgs, (target, draft, tokens, self.temperature, self.top_k, self.top_p, self.num_draft if num_draft is None else num_draft,
                                 generator, self.check, self.filtered, seeds, offsets, self.stream, self.logprobs, self.accept_probs))
        run = self._run or self._runs.get((seeds is None, offsets is None)) or self._bind(args)
        out = run(args, base_key)
        if self._check_as_list:
            if min(out[0].tolist())[0] < 0:  # (see raise_if_blanked)
                raise_for_bad_rows(self._problems(args), out[0][:, 0] < 0, self.logits_name)
        elif self.check:
            raise_if_blanked(out[0], self._problems, args, self.logits_name)
        return out

    def sample(self, logits: torch.Tensor, generator, seeds, offsets) -> torch.Tensor:
        """One token per row of (B, V) ``logits``, for a plan with K = 0 on the sample stream: through
        the backend's sample hook where it has one, else as ``verify`` of the (B, 1, V) view."""
        if _is_compiling():
            return self._compiled(logits.unsqueeze(1), None, no_drafts(self.batch, self.device), None, generator, seeds, offsets)[0].squeeze(1)
        if self.backend is None:
            self.resolve()
        run = self._sample
        if run is None:
            return self.eager(logits.unsqueeze(1), None, self.no_drafts, None, generator, seeds, offsets)[0].squeeze(1)
        seeds, base_key = draw_keys_eager(seeds, generator, self.batch, self.device)
        tokens = run(logits, seeds, offsets, base_key)
        if self.check and self.batch and (min(tokens.tolist()) < 0 if self._check_as_list else bool((tokens < 0).any())):
            args = self._sample_args(logits, generator, seeds, offsets)
            raise_for_bad_rows(self._problems(args), tokens < 0, self.logits_name)
        return tokens

    def _sample_args(self, logits, generator, seeds, offsets) -> VerifyArgs:
        return VerifyArgs(logits.unsqueeze(1), None, no_drafts(self.batch, self.device), self.temperature, self.top_k, self.top_p, self.num_draft, generator,
                          self.check, self.filtered, seeds, offsets, self.stream, self.logprobs, self.accept_probs)

    def _bind(self, args: VerifyArgs) -> Callable:
        """The run of this plan for calls keyed like ``args`` (a backend's prepare hook binds its
        launches to whether seeds and offsets are given)."""
        if self.method != "token":
            self._run = self._block
            return self._block
        if not has_prepare_hook(self.backend):
            self._run = prepared(self.backend, args)
            return self._run
        run = self._runs[(args.seeds is None, args.offsets is None)] = prepared(self.backend, args)
        return run

    def _block(self, args: VerifyArgs, base_key: int) -> tuple:
        tokens, num_accepted, logprobs = self._entry(args, base_key)
        return tokens, num_accepted, logprobs, None

    def _problems(self, args: VerifyArgs) -> list:
        return parameter_problems(args) + row_problems(args, logits_name=self.logits_name)

    def _compiled(self, target, draft, tokens, num_draft, generator, seeds, offsets) -> tuple:
        """Inside torch.compile: keys drawn on the device, the registered operator (block verification
        has none: it breaks the graph), the check as an assertion inside the graph."""
        seeds, base_key = draw_keys(seeds, generator, self.batch, self.device)
        if num_draft is None:
            num_draft = self.num_draft if self.num_draft is not None else torch.full((self.batch,), self.num_positions, dtype=torch.int64, device=self.device)
        args = VerifyArgs(target, draft, tokens, self.temperature, self.top_k, self.top_p, num_draft, generator, self.check, self.filtered, seeds,
                          offsets, self.stream, self.logprobs, self.accept_probs)
        if self.method == "token":
            out = compiled_verify(args, base_key)
        else:
            self.resolve()  # (a plan made while tracing is not kept: what it makes belongs to the graph)
            out = self._block(args, base_key)
        if self.check:
            raise_if_blanked(out[0], self._problems, args, self.logits_name)
        return out


# The plans of the default calls, one per call signature (see specdec_ext.api).
PLANS: dict[tuple, ChainPlan] = {}
PLAN_LIMIT = 256
FORGET.append(PLANS.clear)


def _device(device) -> torch.device:
    """A device as tensors report it (``"cuda"`` is the current CUDA device, with its index)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _size(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _dtype(value, name: str) -> torch.dtype:
    if value not in LOGIT_DTYPES:
        raise ValueError(f"{name} must be torch.float32, torch.bfloat16 or torch.float16, got {value!r}")
    return value


def _describe(shape, dtype, device) -> str:
    return f"shape {tuple(shape)} {dtype} on {device}"


class Verifier:
    """Verification bound once to a batch shape, dtype, device and sampling parameters.

    ``Verifier(B, K, V, ...)(target_logits, draft_logits, draft_tokens, seeds=..., offsets=...)``
    returns what ``specdec_ext.verify(target_logits, draft_logits, draft_tokens, ...)`` returns for
    the same arguments, the same tokens for the same keys, at a fraction of the host cost: the
    parameters are validated, the backend resolved and the per-row tensors built here, once; a call
    checks only that its tensors are the ones this verifier was built for.

    Args:
        batch_size: B, the rows of every call.
        num_speculative_tokens: K, the draft positions of every call (target logits have K + 1).
        vocab_size: V, the target's vocabulary.
        draft_vocab_size: Vd <= V, the draft logits' vocabulary (default V).
        one_hot_drafts: True when the calls pass ``draft_logits=None`` (deterministic drafts: q is one-hot).
        dtype: the target logits' dtype (float32, bfloat16 or float16); ``draft_dtype`` the draft's (default ``dtype``).
        device: where the logits live ("cuda" means the current CUDA device).
        temperature, top_k, top_p: as for :func:`specdec_ext.verify`: numbers or (B,) tensors (read at
            every call; with ``check`` their values are checked here, once).
        method: "token" or "block" (see :func:`specdec_ext.verify`).
        return_logprobs, return_accept_probs: the optional outputs, as for :func:`specdec_ext.verify`.
        backend: "auto" | "triton" | "cpp" | "eager", resolved here (ValueError if it cannot run the calls).
        check: as for :func:`specdec_ext.verify`; with ``check=False`` a call makes no host sync (on CUDA
            with a backend that makes none, Triton: capturable in a CUDA graph) and bad rows are blanked.

    Call: ``verifier(target_logits, draft_logits, draft_tokens, *, num_draft_tokens=None, generator=None,
    seeds=None, offsets=None) -> VerifyResult``, the tensors of shapes (B, K+1, V), (B, K, Vd) (or None
    with ``one_hot_drafts``) and (B, K) int32 / int64 on ``device``; keys and ragged lengths as for
    :func:`specdec_ext.verify`. Inside ``torch.compile(fullgraph=True)`` a token-wise verifier runs the
    registered operator without a graph break.

    Example:
        >>> import torch, specdec_ext
        >>> verifier = specdec_ext.Verifier(2, 3, 100, temperature=0.8, top_p=0.9, backend="eager")
        >>> g = torch.Generator().manual_seed(0)
        >>> target, draft = torch.randn(2, 4, 100, generator=g), torch.randn(2, 3, 100, generator=g)
        >>> drafts = torch.randint(0, 100, (2, 3), generator=g)
        >>> seeds, offsets = torch.tensor([11, 12]), torch.tensor([0, 40])
        >>> out = verifier(target, draft, drafts, seeds=seeds, offsets=offsets)
        >>> same = specdec_ext.verify(target, draft, drafts, temperature=0.8, top_p=0.9, seeds=seeds, offsets=offsets, backend="eager")
        >>> torch.equal(out.tokens, same.tokens), out.tokens.shape
        (True, torch.Size([2, 4]))
    """

    def __init__(self, batch_size: int, num_speculative_tokens: int, vocab_size: int, *, draft_vocab_size: int | None = None,
                 one_hot_drafts: bool = False, dtype: torch.dtype = torch.float32, draft_dtype: torch.dtype | None = None,
                 device: torch.device | str = "cpu", temperature: float | torch.Tensor = 1.0, top_k: int | torch.Tensor | None = None,
                 top_p: float | torch.Tensor | None = None, method: str = "token", return_logprobs: bool | str = False,
                 return_accept_probs: bool = False, backend: str = "auto", check: bool = True):
        batch = _size(batch_size, "batch_size", 0)
        positions = _size(num_speculative_tokens, "num_speculative_tokens", 0)
        vocab = _size(vocab_size, "vocab_size", 1)
        draft_vocab = vocab if draft_vocab_size is None else _size(draft_vocab_size, "draft_vocab_size", 1)
        if draft_vocab > vocab:
            raise ValueError(f"draft_vocab_size ({draft_vocab}) must be at most vocab_size ({vocab})")
        device = _device(device)
        dtype = _dtype(dtype, "dtype")
        draft_dtype = dtype if draft_dtype is None else _dtype(draft_dtype, "draft_dtype")
        if not isinstance(return_accept_probs, bool):
            raise ValueError(f"return_accept_probs must be a bool, got {type(return_accept_probs).__name__}")
        check_method(method, return_accept_probs)
        rows = row_parameters(temperature, top_k, top_p, batch, device, check)
        self._plan = ChainPlan(batch, positions, device, rows, check=check, stream=VERIFY_STREAM, logprobs=logprobs_mode(return_logprobs),
                               accept_probs=return_accept_probs, backend=backend, method=method,
                               spec=(vocab, dtype, None if one_hot_drafts else draft_vocab, None if one_hot_drafts else draft_dtype))
        self.backend = self._plan.resolve()
        self._target = (torch.Size((batch, positions + 1, vocab)), dtype, device)
        self._draft = None if one_hot_drafts else (torch.Size((batch, positions, draft_vocab)), draft_dtype, device)
        self._tokens = (torch.Size((batch, positions)), device)
        self._parameters = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "return_logprobs": return_logprobs,
                            "return_accept_probs": return_accept_probs}

    def __call__(self, target_logits: torch.Tensor, draft_logits: torch.Tensor | None, draft_tokens: torch.Tensor, *,
                 num_draft_tokens: torch.Tensor | None = None, generator: torch.Generator | None = None, seeds: torch.Tensor | None = None,
                 offsets: torch.Tensor | None = None) -> VerifyResult:
        plan = self._plan
        fast = plan.fast
        if fast is not None and num_draft_tokens is None and not _is_compiling():
            # One trip through the backend's runner: the checks below, the key and the kernels (None: a call it does not take).
            out = fast(target_logits, draft_logits, draft_tokens, seeds, offsets, generator)
            if out is not None:
                if type(out) is VerifyResult:  # (the Triton runner's)
                    return out
                if len(out) == 4:
                    return _new(VerifyResult, out)
                plan.raise_blanked(out[0], target_logits, draft_logits, draft_tokens, generator, seeds, offsets)
        compiling = _is_compiling()
        try:
            matches = ((target_logits.shape, target_logits.dtype, target_logits.device) == self._target
                       and (draft_tokens.shape, draft_tokens.device) == self._tokens and draft_tokens.dtype in TOKEN_DTYPES
                       and (draft_logits is None if self._draft is None else (draft_logits.shape, draft_logits.dtype, draft_logits.device) == self._draft))
        except AttributeError:  # not a tensor
            matches = False
        if not matches:
            self._refuse(target_logits, draft_logits, draft_tokens)
        if num_draft_tokens is not None:
            num_draft_tokens = row_counts(num_draft_tokens, "num_draft_tokens", plan.batch, plan.num_positions, plan.device, plan.check, CHAIN)
        if seeds is not None or offsets is not None or generator is not None:
            plan.check_keys(generator, seeds, offsets)
        if compiling:
            return VerifyResult(*plan._compiled(target_logits, draft_logits, draft_tokens, num_draft_tokens, generator, seeds, offsets))
        return _new(VerifyResult, plan.eager(target_logits, draft_logits, draft_tokens, num_draft_tokens, generator, seeds, offsets))

    def _refuse(self, target_logits, draft_logits, draft_tokens) -> None:
        """ValueError for a call whose tensors are not the ones this verifier was built for: the
        general message when they would not do for any verification, else what was expected."""
        validate_verify(target_logits, draft_logits, draft_tokens, temperature=1.0, top_k=None, top_p=None, num_draft_tokens=None, generator=None,
                        check=False)
        if (target_logits.shape, target_logits.dtype, target_logits.device) != self._target:
            raise ValueError(f"target_logits: this Verifier takes {_describe(*self._target)}, got {_describe(target_logits.shape, target_logits.dtype, target_logits.device)}")
        if self._draft is None:
            raise ValueError("draft_logits: this Verifier was built with one_hot_drafts=True (draft_logits=None), got a tensor")
        if draft_logits is None:
            raise ValueError("draft_logits: this Verifier takes draft logits (built with one_hot_drafts=False), got None")
        raise ValueError(f"draft_logits: this Verifier takes {_describe(*self._draft)}, got {_describe(draft_logits.shape, draft_logits.dtype, draft_logits.device)}")

    def __repr__(self) -> str:
        (shape, dtype, device) = self._target
        settings = ", ".join(f"{name}={value!r}" for name, value in self._parameters.items())
        return (f"Verifier(batch_size={shape[0]}, num_speculative_tokens={shape[1] - 1}, vocab_size={shape[2]}, dtype={dtype}, device={device}, "
                f"method={self._plan.method!r}, backend={self.backend!r}, check={self._plan.check}, {settings})")


class Sampler:
    """Drawing one token per row, bound once to a batch shape, dtype, device and sampling parameters.

    ``Sampler(B, V, ...)(logits, seeds=..., offsets=...)`` returns what
    ``specdec_ext.sample(logits, ...)`` returns for the same arguments (the same tokens for the same
    keys, on the sample stream), validating the parameters and resolving the backend once. Drafts
    drawn with a sampler and verified with a :class:`Verifier` under the same seeds and offsets never
    share a random number.

    Args:
        batch_size: B; vocab_size: V; dtype: float32, bfloat16 or float16; device: as for :class:`Verifier`.
        temperature, top_k, top_p: numbers or (B,) tensors, as for :func:`specdec_ext.sample`.
        backend, check: as for :class:`Verifier`.

    Call: ``sampler(logits, *, generator=None, seeds=None, offsets=None) -> (B,) int64`` for (B, V) logits.

    Example:
        >>> import torch, specdec_ext
        >>> sampler = specdec_ext.Sampler(2, 3, temperature=0.0)
        >>> sampler(torch.tensor([[0.0, 1.0, 2.0], [5.0, 0.0, 0.0]])).tolist()
        [2, 0]
        >>> sampler = specdec_ext.Sampler(2, 50, top_k=10)
        >>> logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(0))
        >>> seeds = torch.tensor([5, 6])
        >>> torch.equal(sampler(logits, seeds=seeds), specdec_ext.sample(logits, top_k=10, seeds=seeds))
        True
    """

    def __init__(self, batch_size: int, vocab_size: int, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 temperature: float | torch.Tensor = 1.0, top_k: int | torch.Tensor | None = None, top_p: float | torch.Tensor | None = None,
                 backend: str = "auto", check: bool = True):
        batch = _size(batch_size, "batch_size", 0)
        vocab = _size(vocab_size, "vocab_size", 1)
        device = _device(device)
        dtype = _dtype(dtype, "dtype")
        rows = row_parameters(temperature, top_k, top_p, batch, device, check)
        self._plan = ChainPlan(batch, 0, device, rows, check=check, stream=SAMPLE_STREAM, logprobs=0, accept_probs=False, backend=backend,
                               method="token", logits_name="logits", spec=(vocab, dtype, None, None))
        self.backend = self._plan.resolve()
        self._logits = (torch.Size((batch, vocab)), dtype, device)
        self._parameters = {"temperature": temperature, "top_k": top_k, "top_p": top_p}

    def __call__(self, logits: torch.Tensor, *, generator: torch.Generator | None = None, seeds: torch.Tensor | None = None,
                 offsets: torch.Tensor | None = None) -> torch.Tensor:
        plan = self._plan
        fast = plan.fast
        if fast is not None and not _is_compiling():
            tokens = fast(logits, None, None, seeds, offsets, generator)
            if tokens is not None:
                if type(tokens) is _Tensor:
                    return tokens
                plan.raise_blanked_sample(tokens[0], logits, generator, seeds, offsets)
        try:
            matches = (logits.shape, logits.dtype, logits.device) == self._logits
        except AttributeError:
            matches = False
        if not matches:
            validate_sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None, check=False)
            raise ValueError(f"logits: this Sampler takes {_describe(*self._logits)}, got {_describe(logits.shape, logits.dtype, logits.device)}")
        if seeds is not None or offsets is not None or generator is not None:
            plan.check_keys(generator, seeds, offsets)
        return plan.sample(logits, generator, seeds, offsets)

    def __repr__(self) -> str:
        (shape, dtype, device) = self._logits
        settings = ", ".join(f"{name}={value!r}" for name, value in self._parameters.items())
        return f"Sampler(batch_size={shape[0]}, vocab_size={shape[1]}, dtype={dtype}, device={device}, backend={self.backend!r}, check={self._plan.check}, {settings})"


__all__ = ["ChainPlan", "PLANS", "Sampler", "Verifier"]
