"""The backend table and the one rule that picks the backend of a call, for every entry point.

Every backend serves the same three entry points on validated arguments (see COMMON contracts and
:mod:`specdec_ext._params`)::

    verify(args: VerifyArgs, base_key)        -> (tokens, num_accepted, logprobs | None, accept_probs | None)
    verify_block(args: VerifyArgs, base_key)  -> (tokens, num_accepted, logprobs | None)
    verify_tree(args: TreeArgs, base_key)     -> (tokens, num_accepted, accepted_nodes)

``sample`` is ``verify`` with K = 0 on the sample stream. A backend may also offer hooks that bind
a call once: for ``verify``, ``prepare(args) -> run(args, base_key)``, bound to the shapes, strides,
dtypes and flags of ``args`` (the Triton launcher binds its launches there); for ``sample``,
``sampler(temperature, top_k, top_p) -> run(logits (B, V), seeds, offsets, base_key) -> (B,)``
(the C++ kernel reshapes in C++); for a plan's eager calls, ``runner(plan, spec)`` -> a callable
that checks a call's tensors, draws its key and runs the kernel in one trip (the C++ kernel: see
:func:`specdec_ext._cpp_backend.runner`; the Triton launches: :func:`specdec_ext._triton_backend.plan_runner`).
Without a hook the entry point itself runs every call.

Resolution, the same for every entry point: ``"auto"`` takes the fused kernel of the device (Triton
for CUDA tensors, C++ for CPU tensors) when it is built for that entry point, else the eager
reference, with one RuntimeWarning per device type and entry point that says why; a named backend
that cannot run the call raises ValueError listing those that can. Importing this module registers
``torch.ops.specdec.verify`` / ``sample`` (:mod:`specdec_ext.ops`), which compiled graphs call.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from types import ModuleType

import torch

# The modules of the table are imported here (none of them imports this one: the import graph test
# sees every edge); their functions are looked up when a call is resolved (late binding).
from . import _cpp_backend, _triton_backend, _triton_tree, ops, reference, reference_tree
from ._params import BACKENDS, COMPILED_CHECK_HINT, check_backend, raise_for_bad_rows

ENTRY_POINTS = ("verify", "verify_block", "verify_tree")
_CALLS = {"verify": "verification", "verify_block": "block verification", "verify_tree": "tree verification"}

# name -> entry point -> (module, function); the eager reference is the specification of record.
TABLE: dict[str, dict[str, tuple[ModuleType, str]]] = {
    "eager": {"verify": (reference, "verify_eager"), "verify_block": (reference_tree, "verify_block_eager"), "verify_tree": (reference_tree, "verify_tree_eager")},
    "cpp": {"verify": (_cpp_backend, "verify"), "verify_block": (_cpp_backend, "verify_block"), "verify_tree": (_cpp_backend, "verify_tree")},
    "triton": {"verify": (_triton_backend, "verify"), "verify_block": (_triton_tree, "verify_block"), "verify_tree": (_triton_tree, "verify_tree")},
}
PREPARE: dict[str, tuple[ModuleType, str]] = {"triton": (_triton_backend, "runner")}  # optional hooks of `verify`
SAMPLE: dict[str, tuple[ModuleType, str]] = {"cpp": (_cpp_backend, "sampler")}  # optional hooks of `sample`
# optional: a plan's eager calls in one trip (C++: checks, key and kernel; Triton: bound launches)
RUNNER: dict[str, tuple[ModuleType, str]] = {"cpp": (_cpp_backend, "runner"), "triton": (_triton_backend, "plan_runner")}
_PREFERRED = {"cuda": "triton", "cpu": "cpp"}  # "auto": the fused kernel of each device type


def _function(module: ModuleType, name: str) -> Callable:
    return getattr(module, name)


def _interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def unavailable(name: str, entry: str, device: torch.device) -> str | None:
    """Why backend ``name`` cannot run ``entry`` on ``device`` (None: it can)."""
    if name == "eager":
        return None
    if name == "cpp":
        if device.type != "cpu":
            return "the C++ kernel takes CPU tensors"
        return None if _cpp_backend.is_available() else _cpp_backend.unavailable_reason()
    if name == "triton":
        if not (device.type == "cuda" or (device.type == "cpu" and _interpreter_on())):
            return "Triton needs CUDA tensors (or TRITON_INTERPRET=1 on CPU)"
        return None if (_triton_backend if entry == "verify" else _triton_tree).is_available() else "triton is not installed or its kernels do not load"
    raise ValueError(f"unknown backend {name!r}")


def available(device: torch.device | str = "cpu", entry: str = "verify", interpreted: bool = True) -> list[str]:
    """Backends that can run ``entry`` on ``device``, fastest first (``interpreted=False`` leaves out
    the Triton interpreter on CPU, which is for small identity tests)."""
    device = torch.device(device)
    order = ["triton", "cpp", "eager"] if device.type == "cuda" else ["cpp"] + (["triton"] if interpreted else []) + ["eager"]
    return [name for name in order if unavailable(name, entry, device) is None]


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside this package, for a warning raised by the caller
    of this function: the warning names the user's line, whichever entry point led here."""
    frame, level = sys._getframe(2), 2  # frame 2 is what stacklevel=2 names: the caller of the function that warns
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_WARNED: set[tuple[str, str]] = set()
_RESOLVED: dict[tuple, tuple[str, Callable]] = {}


def resolve(backend: str, device: torch.device, entry: str) -> tuple[str, Callable]:
    """(backend name, entry-point function) of a call on ``device`` (see the module docstring).

    Cached per (backend, device, entry point) and whether the C++ extension is loaded (tests hide it).
    """
    key = (backend, device, entry, _cpp_backend._C is not None)
    found = _RESOLVED.get(key)
    if found is not None:
        return found
    check_backend(backend)
    if backend == "auto":
        preferred = _PREFERRED.get(device.type)
        reason = unavailable(preferred, entry, device) if preferred else f"no fused kernel takes {device.type} tensors"
        name = preferred if reason is None else "eager"
        if reason is not None and (device.type, entry) not in _WARNED:
            if torch.compiler.is_compiling():  # a warning would break the graph: the first eager call warns
                return name, _function(*TABLE[name][entry])
            _WARNED.add((device.type, entry))
            warnings.warn(f"specdec_ext: no fused {_CALLS[entry]} kernel for {device.type} tensors ({reason}); using the slower eager backend",
                          RuntimeWarning, stacklevel=_callers_level())
    else:
        reason = unavailable(backend, entry, device)
        if reason is not None:
            raise ValueError(f"backend={backend!r} cannot run {_CALLS[entry]} on {device} ({reason}); available: {available(device, entry)}")
        name = backend
    found = name, _function(*TABLE[name][entry])
    if len(_RESOLVED) > 256:
        _RESOLVED.clear()
    _RESOLVED[key] = found
    return found


def has_prepare_hook(name: str) -> bool:
    return name in PREPARE


def prepared(name: str, args) -> Callable:
    """``run(args, base_key)`` of backend ``name``'s ``verify`` bound to the call signature of ``args``."""
    hook = PREPARE.get(name)
    return _function(*hook)(args) if hook is not None else _function(*TABLE[name]["verify"])


def sampler(name: str, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> Callable | None:
    """Backend ``name``'s sample hook bound to (B,) per-row parameters, or None if it has none."""
    hook = SAMPLE.get(name)
    return _function(*hook)(temperature, top_k, top_p) if hook is not None else None


def runner(name: str, plan, spec: tuple) -> Callable | None:
    """Backend ``name``'s runner of a token-wise or sample plan (see :func:`specdec_ext._cpp_backend.runner`
    and :func:`specdec_ext._triton_backend.plan_runner`; ``spec``: (vocab, dtype, draft vocab or None,
    draft dtype or None)), or None if it has none."""
    hook = RUNNER.get(name)
    return _function(*hook)(plan, *spec) if hook is not None else None


def compiled_verify(args, base_key: int):
    """``verify`` inside torch.compile: the registered operator (a fake kernel for tracing; C++ or
    eager on CPU, Triton on CUDA) keeps the graph whole."""
    return ops.verify(args, base_key)


READ_LIMIT = 256  # token tensors up to this size are read as a Python list (cheaper than a reduction)


def raise_if_blanked(tokens: torch.Tensor, problems: Callable, args, logits_name: str = "target_logits") -> None:
    """``check=True`` after a kernel: every valid row emits a token at position 0, so a -1 there
    means the kernel blanked the row for a bad value; raise ValueError naming the argument and
    the first bad row (``problems(args)``: the (argument, mask, what) candidates, in order).

    One host read of the result (on CPU a list for small results). Inside torch.compile on CPU the
    check is an assertion inside the graph instead (reading it would break the graph).
    """
    if not tokens.shape[0]:
        return
    if torch.compiler.is_compiling() and tokens.is_cpu:
        torch._assert_async(
            (tokens[:, 0] >= 0).all(),
            "specdec_ext: check=True found a row it could not verify (NaN / +inf or empty logits, a temperature so small that "
            f"the scaled logits are not finite, an out-of-range draft id, a bad tree, a negative seed or offset); {COMPILED_CHECK_HINT}",
        )
        return
    if tokens.is_cpu:
        # min over the rows as lists compares their first tokens first: below 0 iff a row is blanked.
        blanked = min(tokens.tolist())[0] < 0 if tokens.numel() <= READ_LIMIT else bool(tokens[:, 0].min() < 0)
    else:
        blanked = bool((tokens[:, 0] < 0).any())
    if blanked:
        raise_for_bad_rows(problems(args), tokens[:, 0] < 0, logits_name)


def forget() -> None:
    """Drop every cached resolution and fallback warning (tests that hide or restore a backend)."""
    _RESOLVED.clear()
    _WARNED.clear()
    for clear in FORGET:
        clear()


FORGET: list[Callable[[], None]] = []  # other caches built on resolutions (the call plans) register their clear() here

__all__ = ["BACKENDS", "ENTRY_POINTS", "PREPARE", "RUNNER", "SAMPLE", "TABLE", "available", "compiled_verify", "forget", "has_prepare_hook", "prepared", "raise_if_blanked", "resolve",
           "runner", "sampler", "unavailable"]
