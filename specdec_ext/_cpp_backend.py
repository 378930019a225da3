"""The C++ CPU kernel (csrc/), when it is built.

``specdec_ext._C`` is compiled against the installed torch by ``pip install --no-build-isolation -e .``
(setup.py). It is optional: when it is missing or does not load (no compiler at install time, a torch
upgraded or downgraded since the build), :func:`is_available` is False, :func:`unavailable_reason`
says why and how to rebuild, and ``backend="auto"`` falls back to the eager reference with one
warning. Loading it registers ``torch.ops.specdec.verify`` / ``torch.ops.specdec.sample`` with their
CPU kernels; :mod:`specdec_ext.ops` (imported by the backend table, :mod:`specdec_ext._dispatch`)
adds the fake (meta) kernels: after ``import specdec_ext`` the ops trace under FakeTensorMode and
torch.compile.

The same extension verifies trees (:func:`verify_tree`) and blocks (:func:`verify_block`) on the
chain's kernels; every entry point takes a validated argument tuple and the call's ``base_key``
(row b's key is ``args.seeds[b]`` when given, else ``base_key + b``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch  # libtorch must be loaded before the extension that links against it

from . import _philox

if TYPE_CHECKING:
    from ._params import TreeArgs, VerifyArgs

REBUILD = "rebuild it against the installed torch with `pip install --no-build-isolation -e .` (or `make setup`)"

_C = None
_IMPORT_ERROR: str | None = None


def build_mismatch(built: str, running: str) -> str | None:
    """Why an extension built against torch ``built`` must not run beside torch ``running`` (None if it may).

    A C++ extension is compiled against one torch's headers and ABI: beside another version it may
    fail to load, or load and misbehave. Local version labels (``+cpu``) count.
    """
    if built == "unknown" or built == running:
        return None
    return f"specdec_ext._C was built against torch {built} but torch {running} is installed; {REBUILD}"


try:
    from . import _C  # type: ignore[attr-defined, no-redef]
except ImportError as exc:
    if getattr(exc, "name", None) == f"{__package__}._C":
        _IMPORT_ERROR = f"specdec_ext._C is not built (needs a C++ compiler and torch at install time); {REBUILD}"
    else:  # built, but does not load: usually a torch upgraded or downgraded since the build
        _IMPORT_ERROR = f"specdec_ext._C does not load ({exc}); {REBUILD}"
except OSError as exc:
    _IMPORT_ERROR = f"specdec_ext._C does not load ({exc}); {REBUILD}"
else:
    _IMPORT_ERROR = build_mismatch(_C.torch_version_at_build(), torch.__version__)
    if _IMPORT_ERROR is not None:
        _C = None
    elif hasattr(_C, "draw_base_key"):
        _philox.FAST_DRAW = _C.draw_base_key


def is_available() -> bool:
    return _C is not None


def unavailable_reason() -> str:
    return "" if _C is not None else (_IMPORT_ERROR or "the C++ extension is unavailable")


def _extension():
    """The loaded extension, or a RuntimeError saying why there is none."""
    if _C is None:
        raise RuntimeError(f"specdec_ext: the C++ backend is unavailable: {unavailable_reason()}")
    return _C


def verify(args: VerifyArgs, base_key: int):
    """Fused verification of a validated call; returns (tokens (B, K+1) int64, num_accepted (B,)
    int64, logprobs (B, K+1) float32 or None, accept_probs (B, K) float32 or None)."""
    tokens, num_accepted, logprobs, accept_probs = _extension().verify(
        args.target_logits, args.draft_logits, args.draft_tokens, args.temperature, args.top_k, args.top_p, args.num_draft_tokens,
        args.seeds, args.offsets, base_key, args.stream, args.check, args.logprobs, args.accept_probs,
    )
    return tokens, num_accepted, (logprobs if args.logprobs else None), (accept_probs if args.accept_probs else None)


def sampler(temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
    """``sample`` bound to (B,) per-row parameters (the backend table's sample hook): ``run(logits,
    seeds, offsets, base_key) -> (B,) int64`` for (B, V) logits, the kernel's verification with
    K = 0 on the sample stream, without the (B, 1, V) view and (B,) selection a Python caller of
    :func:`verify` pays for."""
    draw = _extension().sample

    def run(logits: torch.Tensor, seeds: torch.Tensor | None, offsets: torch.Tensor | None, base_key: int) -> torch.Tensor:
        return draw(logits, temperature, top_k, top_p, seeds, offsets, base_key)

    return run


def runner(plan, vocab: int, dtype: torch.dtype, draft_vocab: int | None, draft_dtype: torch.dtype | None):
    """The plan's calls in one trip to C++ (the backend table's runner hook): ``run(target_logits,
    draft_logits, draft_tokens, seeds, offsets, generator)`` (sample: ``run(logits, None, None,
    seeds, offsets, generator)``) checks its arguments against the plan and (vocab, dtype, draft
    vocab (None: one-hot drafts), draft dtype), draws the key as :func:`specdec_ext._philox.draw_keys`
    does and runs the kernel. It returns verify's 4-tuple (sample: the (B,) tokens); a tuple with
    one more item (sample: a 1-tuple) when ``check`` found a blanked row; None, having drawn
    nothing, for a call it does not take (the Python path then runs it). None without the extension.
    ``plan``: a :class:`specdec_ext.prepared.ChainPlan` of token-wise verification or sample."""
    if _C is None or not hasattr(_C, "ChainRunner"):
        return None
    sample = plan.stream == _philox.SAMPLE_STREAM and plan.num_positions == 0
    return _C.ChainRunner(plan.temperature, plan.top_k, plan.top_p, plan.batch, plan.num_positions, vocab, dtype, -1 if draft_vocab is None else draft_vocab,
                          dtype if draft_dtype is None else draft_dtype, plan.stream, plan.check, plan.logprobs, plan.accept_probs, sample)


def launch_outputs(target: torch.Tensor, draft: torch.Tensor | None, draft_tokens: torch.Tensor | None, sample: bool, logprobs: bool,
                   accept_probs: bool):
    """A prepared Triton call's host work up to its launches in one trip to C++ (see
    :func:`specdec_ext._triton_backend.plan_runner`), bound to the tensors of its first call (sample:
    ``draft`` and ``draft_tokens`` None): ``outputs(target, draft, draft_tokens, seeds, offsets)``
    checks a call's tensors against them (sizes, dtype, device; the first call's strides, or
    contiguity where it was contiguous), its seeds and offsets (None or contiguous (B,) int64 on
    the device), and allocates the outputs: a sample's (B,) tokens, or verify's (tokens,
    num_accepted, logprobs or None, accept_probs or None); None, having allocated nothing, for a
    call it does not take. None without the extension (the Python checks then run)."""
    if _C is None or not hasattr(_C, "LaunchOutputs"):
        return None
    return _C.LaunchOutputs(target, draft, draft_tokens, sample, logprobs, accept_probs)


def verify_block(args: VerifyArgs, base_key: int):
    """Block verification of a validated call; returns (tokens (B, K+1) int64, num_accepted (B,)
    int64, logprobs (B, K+1) float32 or None)."""
    tokens, num_accepted, logprobs = _extension().block_verify(
        args.target_logits, args.draft_logits, args.draft_tokens, args.temperature, args.top_k, args.top_p, args.num_draft_tokens,
        args.seeds, args.offsets, base_key, args.check, args.logprobs,
    )
    return tokens, num_accepted, (logprobs if args.logprobs else None)


def verify_tree(args: TreeArgs, base_key: int):
    """Tree verification of a validated call; returns (tokens (B, N+1) int64, num_accepted (B,)
    int64, accepted_nodes (B, N) int64), -1 beyond each row's path."""
    return _extension().tree_verify(
        args.target_logits, args.draft_logits, args.draft_tokens, args.parents, args.temperature, args.top_k, args.top_p, args.num_nodes,
        args.seeds, args.offsets, base_key, args.siblings == "without_replacement", args.check,
    )


def isa() -> str:
    """The instruction-set variant the kernel runs ("avx512", "avx2", "neon" or "base"), or "" when unavailable."""
    return _C.isa() if _C is not None else ""
