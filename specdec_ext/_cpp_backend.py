"""The C++ CPU kernel (csrc/), when it is built.

``specdec_ext._C`` is compiled by ``pip install --no-build-isolation -e .`` (setup.py). It is
optional: when it is missing or does not load (no compiler at install time, a torch upgrade since the
build), :func:`is_available` is False, :func:`unavailable_reason` says why, and ``backend="auto"``
falls back to the eager reference. Loading it also registers ``torch.ops.specdec.verify`` /
``torch.ops.specdec.sample`` with their CPU kernels (see :mod:`specdec_ext.ops`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch  # libtorch must be loaded before the extension that links against it

if TYPE_CHECKING:
    from ._params import VerifyArgs

_C = None
_IMPORT_ERROR: str | None = None
try:
    from . import _C  # type: ignore[attr-defined, no-redef]
except ImportError as exc:
    if getattr(exc, "name", None) == f"{__package__}._C":
        _IMPORT_ERROR = "specdec_ext._C is not built; build it with `pip install --no-build-isolation -e .` (needs a C++ compiler)"
    else:  # built, but does not load: usually a torch upgraded or downgraded since the build
        _IMPORT_ERROR = f"specdec_ext._C does not load: {exc}; rebuild it with `pip install --no-build-isolation -e .`"
except OSError as exc:
    _IMPORT_ERROR = f"specdec_ext._C does not load: {exc}; rebuild it with `pip install --no-build-isolation -e .`"


def is_available() -> bool:
    return _C is not None


def unavailable_reason() -> str:
    return "" if _C is not None else (_IMPORT_ERROR or "the C++ extension is unavailable")


def verify(args: VerifyArgs, seed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused verification of a validated call; returns (tokens (B, K+1) int64, num_accepted (B,) int64)."""
    if _C is None:
        raise RuntimeError(f"specdec_ext: the C++ backend is unavailable: {unavailable_reason()}")
    return _C.verify(args.target_logits, args.draft_logits, args.draft_tokens, args.temperature, args.top_k, args.top_p, args.num_draft_tokens, seed, args.check)


def isa() -> str:
    """The instruction-set variant the kernel runs ("avx512", "avx2" or "base"), or "" when unavailable."""
    return _C.isa() if _C is not None else ""
